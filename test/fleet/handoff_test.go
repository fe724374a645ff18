package fleet_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// longTokens makes a stream of longTokens × decodeMS = 9 s: the first
// router's drain lasts several of the load's requests.
const longTokens = 300

// openStream sends a streaming completion of n tokens to router and
// returns once its first token came; the stream is read to its end in the
// background, and its result (tokens: the completion tokens its usage
// says) sent on the channel.
func openStream(t *testing.T, hc *http.Client, router string, n int) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	first := make(chan struct{})
	go func() {
		r := result{start: time.Now()}
		defer func() {
			select {
			case <-first:
			default:
				close(first)
			}
			out <- r
		}()
		body := fmt.Sprintf(`{"model":"pdserve-sim","prompt":"a long story","max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, n)
		resp, err := hc.Post(router+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			r.err = err.Error()
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			r.err = resp.Status
			return
		}
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "data: [DONE]":
				done = true
			case strings.HasPrefix(line, `data: {"error"`):
				r.err = line
				return
			case strings.HasPrefix(line, "data: "):
				if r.ttft == 0 {
					r.ttft = time.Since(r.start)
					close(first)
				}
				var ev struct {
					Usage *struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				}
				if json.Unmarshal([]byte(line[len("data: "):]), &ev) == nil && ev.Usage != nil {
					r.tokens = ev.Usage.CompletionTokens
				}
			}
		}
		if !done {
			r.err = fmt.Sprintf("stream ended without [DONE] after %d tokens: %v", r.tokens, sc.Err())
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the long stream sent no token within 30 s")
	}
	return out
}

var replacingLine = regexp.MustCompile(`another process serves`)

// TestRouterRestartRefusesNothing: a router is replaced on its port under
// a steady load while it streams a long answer. A second router started on
// the same port listens once it can serve; the first gets SIGTERM, stops
// listening at once and finishes its stream. No request of the load is
// refused — no 503, no connection refused or reset — from before the second
// router starts until after the first has exited (0), and the long stream
// on the first router ends complete.
func TestRouterRestartRefusesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes")
	}
	t.Parallel()
	ps := newProcs(t)
	p0, d0 := ps.worker("prefill-0", "prefill"), ps.worker("decode-0", "decode")
	ps.start(p0)
	ps.start(d0)
	r1 := ps.router("--prefill", urls(p0), "--decode", urls(d0))
	ps.start(r1)
	hc := &http.Client{Timeout: 60 * time.Second}
	defer hc.CloseIdleConnections()

	long := openStream(t, hc, r1.url(), longTokens)
	l := startLoad(r1.url(), 6)
	waitResults(t, l, time.Time{}, 6)

	// The replacement: same port, same flags.
	r2 := &node{name: "router-2", role: "router", port: r1.port, args: r1.args}
	ps.start(r2)
	if !slices.ContainsFunc(r2.p.Lines(), replacingLine.MatchString) {
		t.Errorf("the second router did not wait to replace the first; its output: %q", r2.p.Lines())
	}
	waitResults(t, l, time.Now(), 6)

	termAt := time.Now()
	drain := ps.stop(r1) // SIGTERM; fails the test unless it exits 0
	select {
	case r := <-long:
		if r.err != "" || r.tokens != longTokens {
			t.Errorf("the long stream on the first router: %d of %d tokens, error %q", r.tokens, longTokens, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long stream did not end within 10 s of the first router's exit")
	}
	waitResults(t, l, time.Now(), 6) // the second router serves alone
	rs := l.end()
	duringDrain := 0
	for _, r := range rs {
		if !r.start.Before(termAt) && r.start.Before(termAt.Add(drain)) {
			duringDrain++
		}
	}
	t.Logf("the first router drained in %s; %d of %d requests were sent during its drain", drain.Round(time.Millisecond), duringDrain, len(rs))
	if fails := failures(rs); len(fails) > 0 {
		t.Fatalf("%d of %d requests failed across the restart: %v", len(fails), len(rs), fails)
	}
	if duringDrain < 8 {
		t.Errorf("%d requests were sent during the first router's drain, want at least 8", duringDrain)
	}
	quiescent(t, hc, r2.url(), p0, d0)
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/planner"
)

// loader sends requests from n clients until stop; every answer must be a
// 200 with maxTokens tokens.
type loader struct {
	mu   sync.Mutex
	wg   sync.WaitGroup
	bad  []string
	sent int
	stop chan struct{}
}

// load starts n clients sending prompts of promptWords words for maxTokens
// tokens each, streamed and not by turns.
func load(url string, n, promptWords, maxTokens int) *loader {
	l := &loader{stop: make(chan struct{})}
	prompt := strings.Repeat("word ", promptWords)
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := 0; ; k++ {
				select {
				case <-l.stop:
					return
				default:
				}
				stream := (i+k)%2 == 0
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":%v}`, fmt.Sprint(i, k, " ", prompt), maxTokens, stream)
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
				var out []byte
				if err == nil {
					out, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				ok := err == nil && resp.StatusCode == http.StatusOK && !strings.Contains(string(out), `"error"`)
				if ok && !stream {
					var c struct {
						Usage struct {
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
					}
					ok = json.Unmarshal(out, &c) == nil && c.Usage.CompletionTokens == maxTokens
				}
				l.mu.Lock()
				l.sent++
				if !ok {
					l.bad = append(l.bad, fmt.Sprintf("%v %s", err, out))
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// answered returns the requests answered so far and the first bad answer.
func (l *loader) answered() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) > 0 {
		return l.sent, l.bad[0]
	}
	return l.sent, ""
}

// finish stops the clients, waits for them, fails t if any answer was bad
// and returns the number sent.
func (l *loader) finish(t *testing.T) int {
	close(l.stop)
	l.wg.Wait()
	if len(l.bad) > 0 {
		t.Errorf("%d of %d requests failed; first: %s", len(l.bad), l.sent, l.bad[0])
	}
	return l.sent
}

// awaitAnswers waits until l has answered n more requests.
func awaitAnswers(t *testing.T, l *loader, n int) {
	t.Helper()
	from, _ := l.answered()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d more answers", n), func() (bool, string) {
		got, bad := l.answered()
		if bad != "" {
			t.Fatalf("a request failed: %s", bad)
		}
		return got >= from+n, fmt.Sprint(got - from)
	})
}

// TestFlipRolesUnderLoad: a worker flipped from decode to prefill and back
// while clients keep sending loses no request, and the new worker serves.
func TestFlipRolesUnderLoad(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 2,
		NewModel: simFactory(sim.Config{DecodePerStep: time.Millisecond, PrefillPerToken: 10 * time.Microsecond}),
		Worker:   cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20}, HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, c.Workers()...)
		_ = c.Shutdown(context.Background())
	})
	// The last ready prefill worker is not flipped.
	if err := c.Flip(context.Background(), lifecycle.RolePrefill, lifecycle.RoleDecode, time.Minute, 30*time.Second); err == nil ||
		!strings.Contains(err.Error(), "last ready prefill worker") {
		t.Fatalf("flipping the last prefill worker: %v", err)
	}
	l := load(c.URL(), 4, 40, 24)
	flip := func(from, to lifecycle.Role) {
		awaitAnswers(t, l, 10)
		if err := c.Flip(context.Background(), from, to, time.Minute, 30*time.Second); err != nil {
			t.Errorf("flip %s → %s: %v", from, to, err)
		}
	}
	flip(lifecycle.RoleDecode, lifecycle.RolePrefill)
	flip(lifecycle.RolePrefill, lifecycle.RoleDecode)
	flip(lifecycle.RoleDecode, lifecycle.RolePrefill)
	awaitAnswers(t, l, 10)
	n := l.finish(t)
	if len(c.Prefill) != 2 || len(c.Decode) != 1 {
		t.Fatalf("after the flips: %d prefill, %d decode workers", len(c.Prefill), len(c.Decode))
	}
	// The workers started by the flips serve: a few more requests reach
	// the newest prefill worker.
	newest := c.Prefill[1]
	waitFor(t, 10*time.Second, "the new prefill worker serves", func() (bool, string) {
		status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "after the flips", "max_tokens": 2})
		if status != http.StatusOK {
			t.Fatalf("after the flips: %d %s", status, body)
		}
		v := counterValue(t, workerGatherer{newest}, "pdserve_requests_finished_total", "outcome", "ok")
		return v > 0, fmt.Sprint(v)
	})
	t.Logf("%d requests across three flips", n)
}

// TestPlannerFlipsTowardPrefill: `pdserve up --planner` on 1P:3D under a
// prefill-bound load (long prompts, short answers) flips decode workers
// to prefill, losing no request, and GET /planner says why.
func TestPlannerFlipsTowardPrefill(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	mc.MaxPrefillTokens = 4096
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 3,
		NewModel: simFactory(sim.Config{DecodePerStep: time.Millisecond, PrefillPerToken: 100 * time.Microsecond}),
		Worker:   cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20}, HealthInterval: 100 * time.Millisecond,
		Planner: &planner.Config{SLOs: planner.SLOs{TTFT: 300 * time.Millisecond, ITL: 50 * time.Millisecond},
			Interval: 250 * time.Millisecond, Window: 2 * time.Second, Dwell: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, c.Workers()...)
		_ = c.Shutdown(context.Background())
	})
	// Six clients with ~1,000-token prompts at 100 µs a token: one prefill
	// worker is busy all the time and TTFTs grow.
	l := load(c.URL(), 6, 150, 16)
	waitFor(t, 60*time.Second, "a flip to prefill", func() (bool, string) {
		resp, err := http.Get(c.URL() + "/planner")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st struct {
			Changes []struct {
				Action         string `json:"action"`
				DesiredPrefill int    `json:"desired_prefill"`
				Error          string `json:"error"`
			} `json:"changes"`
			Last struct {
				Reason string `json:"reason"`
			} `json:"last"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return false, string(b)
		}
		for _, ch := range st.Changes {
			if ch.Action == planner.ActionFlip && ch.DesiredPrefill >= 2 && ch.Error == "" {
				return true, ""
			}
		}
		n, bad := l.answered()
		return false, fmt.Sprintf("%s (%d answered, a bad one: %.200s)", st.Last.Reason, n, bad)
	})
	l.finish(t)
	status := c.Router.Planner().Status()
	if status.Mode != "flip" || status.Actuator != (&cluster.FlipRoles{}).Name() {
		t.Errorf("planner status: mode %s actuator %s", status.Mode, status.Actuator)
	}
	for _, ch := range status.Changes {
		t.Logf("%s: %s (need %.2f prefill: %s; %.2f decode: %s)", ch.Action, ch.Reason, ch.Need.Prefill, ch.Need.PrefillWhy, ch.Need.Decode, ch.Need.DecodeWhy)
	}
	if len(c.Prefill) < 2 {
		t.Fatalf("%d prefill workers after the flip", len(c.Prefill))
	}
	if n := counterValue(t, routerGatherer{c.Router}, "pdserve_planner_actions_total", "result", "ok"); n < 1 {
		t.Errorf("pdserve_planner_actions_total{result=ok} = %v", n)
	}
}

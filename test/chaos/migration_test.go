package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// migSpec is one request of the migration tests: a streamed (or not)
// completion with logprobs, greedy or seeded.
type migSpec struct {
	N           int
	Prompt      string
	MaxTokens   int
	Temperature float64
	TopP        float64
	Seed        int64
	Stream      bool
	// Choices is the request's n (0: not sent, one choice).
	Choices int
}

// body is the request's JSON body; stream overrides s.Stream (the
// reference is asked without streaming).
func (s *migSpec) body(stream bool) []byte {
	b, err := json.Marshal(map[string]any{
		"prompt": s.Prompt, "max_tokens": s.MaxTokens, "temperature": s.Temperature, "top_p": s.TopP, "seed": s.Seed,
		"ignore_eos": true, "return_token_ids": true, "logprobs": 2, "stream": stream, "n": max(1, s.Choices),
	})
	if err != nil {
		panic(err) // plain maps of strings and numbers always encode
	}
	return b
}

// String describes the request for failure messages.
func (s *migSpec) String() string {
	return fmt.Sprintf("request #%d (stream=%v, prompt %d bytes, max_tokens %d, n %d, temperature %v, top_p %v, seed %d)",
		s.N, s.Stream, len(s.Prompt), s.MaxTokens, max(1, s.Choices), s.Temperature, s.TopP, s.Seed)
}

// genMigSpecs draws n requests: prompts of a few fixed lengths (so that
// TTFTs compare within a length), half greedy and half seeded, one in
// eight with two choices, max_tokens in [minTok, maxTok].
func genMigSpecs(rng *rand.Rand, n int, lengths []int, minTok, maxTok int) []*migSpec {
	out := make([]*migSpec, n)
	for i := range out {
		plen := lengths[rng.IntN(len(lengths))]
		var b strings.Builder
		for range plen {
			b.WriteByte(promptLetters[rng.IntN(len(promptLetters))])
		}
		s := &migSpec{N: i, Prompt: b.String(), MaxTokens: minTok + rng.IntN(maxTok-minTok+1), TopP: 1, Seed: rng.Int64N(1 << 40),
			Stream: rng.IntN(8) != 0}
		if rng.IntN(8) == 0 {
			s.Choices = 2
		}
		if rng.IntN(2) == 0 {
			s.Temperature = []float64{0.7, 1, 1.3}[rng.IntN(3)]
			s.TopP = []float64{1, 0.9}[rng.IntN(2)]
		}
		out[i] = s
	}
	return out
}

// migOutput is a completion's one choice as the client assembled it.
type migOutput struct {
	Text     string
	TokenIDs []int32
	Tokens   []string
	Logprobs []float64
	Top      []map[string]float64
	Offsets  []int
	Finish   string
}

// wireMigChoice is a completion choice (or a stream event's).
type wireMigChoice struct {
	Index    int     `json:"index"`
	Text     string  `json:"text"`
	TokenIDs []int32 `json:"token_ids"`
	Logprobs *struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	} `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// add appends a choice (or a stream event's part of it).
func (o *migOutput) add(c wireMigChoice) {
	o.Text += c.Text
	o.TokenIDs = append(o.TokenIDs, c.TokenIDs...)
	if lp := c.Logprobs; lp != nil {
		o.Tokens = append(o.Tokens, lp.Tokens...)
		o.Logprobs = append(o.Logprobs, lp.TokenLogprobs...)
		o.Top = append(o.Top, lp.TopLogprobs...)
		o.Offsets = append(o.Offsets, lp.TextOffset...)
	}
	if c.FinishReason != nil {
		o.Finish = *c.FinishReason
	}
}

// diff describes how o differs from want ("" if it does not).
func (o *migOutput) diff(want *migOutput) string {
	var d []string
	if o.Text != want.Text {
		d = append(d, fmt.Sprintf("text %q, want %q", o.Text, want.Text))
	}
	if !slices.Equal(o.TokenIDs, want.TokenIDs) {
		d = append(d, fmt.Sprintf("token ids %v, want %v", o.TokenIDs, want.TokenIDs))
	}
	if !slices.Equal(o.Tokens, want.Tokens) || !slices.Equal(o.Logprobs, want.Logprobs) || !slices.Equal(o.Offsets, want.Offsets) {
		d = append(d, fmt.Sprintf("logprobs %v (tokens %q, offsets %v), want %v (tokens %q, offsets %v)",
			o.Logprobs, o.Tokens, o.Offsets, want.Logprobs, want.Tokens, want.Offsets))
	}
	if !reflect.DeepEqual(o.Top, want.Top) {
		d = append(d, fmt.Sprintf("top logprobs %v, want %v", o.Top, want.Top))
	}
	if o.Finish != want.Finish {
		d = append(d, fmt.Sprintf("finish %q, want %q", o.Finish, want.Finish))
	}
	return strings.Join(d, "; ")
}

// migResult is how one request of the migration tests went, with the
// arrival time of every event that carried tokens.
type migResult struct {
	Spec *migSpec
	// Err is "" for a complete answer, else what went wrong.
	Err string
	ID  string
	// Out are the choices' outputs, by index.
	Out  []migOutput
	Sent time.Time
	// Events are the arrival times of the events with tokens.
	Events []time.Time
	End    time.Time
}

// rid is the request id the router knows the request by ("cmpl-" + rid is
// the response's id).
func (r *migResult) rid() string { return strings.TrimPrefix(r.ID, "cmpl-") }

// maxGap is the longest time between two events with tokens.
func (r *migResult) maxGap() time.Duration {
	var g time.Duration
	for i := 1; i < len(r.Events); i++ {
		g = max(g, r.Events[i].Sub(r.Events[i-1]))
	}
	return g
}

// doMig sends s to base and assembles the answer; bound is the time
// allowed for it.
func doMig(hc *http.Client, base string, s *migSpec, stream bool, bound time.Duration) (res migResult) {
	res.Spec, res.Sent = s, time.Now()
	res.Out = make([]migOutput, max(1, s.Choices))
	defer func() { res.End = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(s.body(stream)))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer resp.Body.Close()
	type answer struct {
		ID      string          `json:"id"`
		Choices []wireMigChoice `json:"choices"`
		Error   *wireError      `json:"error"`
	}
	if resp.StatusCode != http.StatusOK || !stream {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		var a answer
		switch err := json.Unmarshal(body, &a); {
		case err != nil:
			res.Err = fmt.Sprintf("status %d, bad JSON %q: %v", resp.StatusCode, body, err)
		case resp.StatusCode != http.StatusOK || a.Error != nil || len(a.Choices) != len(res.Out):
			res.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, body)
		default:
			res.ID = a.ID
			for _, c := range a.Choices {
				if c.Index < 0 || c.Index >= len(res.Out) {
					res.Err = fmt.Sprintf("choice %d: %s", c.Index, body)
					return res
				}
				res.Out[c.Index].add(c)
			}
			res.Events = append(res.Events, time.Now())
		}
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			res.Err = fmt.Sprintf("bad stream event %q: %v", data, err)
			return res
		}
		if a.Error != nil {
			res.Err = fmt.Sprintf("error event after %d tokens: %s %s", res.tokens(), a.Error.code(), a.Error.Message)
			continue
		}
		if res.ID == "" {
			res.ID = a.ID
		}
		for _, c := range a.Choices {
			if c.Index < 0 || c.Index >= len(res.Out) {
				res.Err = fmt.Sprintf("stream event of choice %d: %q", c.Index, data)
				return res
			}
			if len(c.TokenIDs) > 0 {
				res.Events = append(res.Events, time.Now())
			}
			res.Out[c.Index].add(c)
		}
	}
	switch {
	case res.Err != "":
	case sc.Err() != nil:
		res.Err = fmt.Sprintf("after %d tokens: %v", res.tokens(), sc.Err())
	case !done:
		res.Err = fmt.Sprintf("event stream ended without [DONE] after %d tokens", res.tokens())
	case slices.ContainsFunc(res.Out, func(o migOutput) bool { return o.Finish == "" }):
		res.Err = "event stream ended with a choice without a finish reason"
	}
	return res
}

// tokens counts the output tokens received, of every choice.
func (r *migResult) tokens() int {
	n := 0
	for _, o := range r.Out {
		n += len(o.TokenIDs)
	}
	return n
}

// checkAgainstReference asks the colocated reference for every request
// (without streaming, with 4 in parallel) and returns a description of
// every result that differs from its answer.
func checkAgainstReference(hc *http.Client, ref string, results []migResult) []string {
	var mu sync.Mutex
	var out []string
	next := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range next {
				r := &results[i]
				want := doMig(hc, ref, r.Spec, false, time.Minute)
				var d string
				switch {
				case want.Err != "":
					d = fmt.Sprintf("%s: the reference answered %s", r.Spec, want.Err)
				default:
					for c := range r.Out {
						if x := r.Out[c].diff(&want.Out[c]); x != "" {
							d += fmt.Sprintf("%s (id %s) choice %d differs from the reference: %s\n", r.Spec, r.ID, c, x)
						}
					}
				}
				if d != "" {
					mu.Lock()
					out = append(out, d)
					mu.Unlock()
				}
			}
		})
	}
	for i := range results {
		if results[i].Err == "" {
			next <- i
		}
	}
	close(next)
	wg.Wait()
	return out
}

// migrationWatch polls the router's /debug/requests and remembers, by rid
// (a choice's continuation under its request's), the most migrations each
// request showed, and one migrated request's
// history (/debug/requests/{rid}).
type migrationWatch struct {
	mu      sync.Mutex
	seen    map[string]int
	history string
	stop    chan struct{}
	wg      sync.WaitGroup
}

// watchMigrations starts polling the router at base every 20 ms.
func watchMigrations(hc *http.Client, base string) *migrationWatch {
	w := &migrationWatch{seen: map[string]int{}, stop: make(chan struct{})}
	w.wg.Go(func() {
		for {
			var live struct {
				Requests []workerapi.RequestInfo `json:"requests"`
			}
			if body, err := getBody(hc, base+"/debug/requests"); err == nil && json.Unmarshal(body, &live) == nil {
				for _, r := range live.Requests {
					if r.Migrations == 0 {
						continue
					}
					// A choice of a request with n > 1 continues as
					// request <rid>-c<index>.
					rid := choiceRID.ReplaceAllString(r.RID, "")
					w.mu.Lock()
					w.seen[rid] = max(w.seen[rid], r.Migrations)
					need := w.history == ""
					w.mu.Unlock()
					if need {
						if body, err := getBody(hc, base+"/debug/requests/"+r.RID); err == nil {
							var ri struct {
								History []struct {
									What string `json:"what"`
								} `json:"history"`
							}
							if json.Unmarshal(body, &ri) == nil && len(ri.History) > 0 {
								var b strings.Builder
								for _, h := range ri.History {
									fmt.Fprintf(&b, "    %s\n", h.What)
								}
								w.mu.Lock()
								w.history = fmt.Sprintf("  rid %s:\n%s", r.RID, b.String())
								w.mu.Unlock()
							}
						}
					}
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond): // polling period
			}
		}
	})
	return w
}

// choiceRID matches the suffix of a choice's continuation's rid.
var choiceRID = regexp.MustCompile(`-c[0-9]+$`)

// close stops polling and returns the migrations seen by rid and one
// migrated request's history.
func (w *migrationWatch) close() (map[string]int, string) {
	close(w.stop)
	w.wg.Wait()
	return w.seen, w.history
}

// routerMigrations scrapes the router's migrations by cause and its
// migration delay histogram (sum in seconds, count).
func routerMigrations(hc *http.Client, base string) (causes map[string]float64, delaySum float64, delayCount uint64, err error) {
	mfs, err := scrape(hc, base)
	if err != nil {
		return nil, 0, 0, err
	}
	causes = map[string]float64{}
	for _, m := range mfs["pdserve_router_migrations_total"].GetMetric() {
		causes[labelsOf(m)["cause"]] += valueOf(m)
	}
	var h *dto.Histogram
	for _, m := range mfs["pdserve_router_migration_delay_seconds"].GetMetric() {
		h = m.GetHistogram()
	}
	return causes, h.GetSampleSum(), h.GetSampleCount(), nil
}

// describeCauses renders migrations by cause, and their total.
func describeCauses(causes map[string]float64) (string, float64) {
	var parts []string
	total := 0.0
	for _, c := range slices.Sorted(maps.Keys(causes)) {
		parts = append(parts, fmt.Sprintf("%s=%v", c, causes[c]))
		total += causes[c]
	}
	return strings.Join(parts, " "), total
}

// percentiles renders p50, p90, p99 and max of ds (ms).
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Sorted(slices.Values(ds))
	at := func(q float64) float64 {
		return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
	}
	return fmt.Sprintf("p50 %.0f ms, p90 %.0f ms, p99 %.0f ms, max %.0f ms (%d)", at(0.5), at(0.9), at(0.99), at(1), len(s))
}

// phase names the part of a run an instant falls in: before the first
// kill, during the kills (until the last restarted worker is back), or
// after.
func phase(at, first, last time.Time) int {
	switch {
	case first.IsZero() || at.Before(first):
		return 0
	case !at.After(last):
		return 1
	}
	return 2
}

var phaseNames = [...]string{"before", "during", "after"}

// TestMigrationUnderKills runs router + 2 prefill + 3 decode worker
// processes under a steady rate of streamed (and some non-streamed)
// requests, greedy and seeded with logprobs, some with n = 2, long enough
// to last a few seconds; in the middle of the run it SIGKILLs a worker (two decode
// workers, then a prefill worker, and again; one with requests on it if
// there is one), restarts it, waits for the router to use it again and
// 0.5–1.5 s more, so that a worker of each role is always up.
// Every request must succeed, with the very output (text, ids, logprobs)
// of a colocated reference process; the router must report migrations;
// every worker must end with no live request and no used page.
func TestMigrationUnderKills(t *testing.T) {
	t.Parallel()
	seed := seedFor(t)
	nReq, _ := sizes(110, 1500, 0)
	const (
		decodeMS = 20
		interval = 100 * time.Millisecond // between requests sent
	)
	start := time.Now()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	// Prefill takes 0.1 ms a prompt token (a 512-token prompt: 51 ms), so
	// that a prefill kill may find prompts in flight.
	// The router checks its workers every 250 ms, so that a restarted
	// worker is back in use soon (the next kill waits for that).
	d := startDeploymentWith(t, 2, 3, decodeMS, []string{"--kv-cache-memory", "64MiB", "--sim-prefill-ms-per-token", "0.1"},
		[]string{"--kv-cache-memory", "64MiB"}, []string{"--health-interval", "250ms"})
	if err := routerReady(hc, d.router.url(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\n(seed %d; reproduce: %s)", fmt.Sprintf(format, args...), seed, reproduce(t, seed))
	}
	lengths := []int{32, 512}
	// 60–160 tokens at 20 ms a step: streams of 1.2–3.2 s.
	specs := genMigSpecs(newRand(seed, 31), nReq, lengths, 60, 160)
	bound := chaosDeadlines.clientBound()
	t.Logf("%d requests, one every %s, client bound %s", nReq, interval, bound)

	// The kills run from a quarter of the sending time to four fifths.
	sending := time.Duration(nReq) * interval
	var (
		cmu              sync.Mutex
		chaosLog         []string
		chaosErrs        []string
		firstKill, ready time.Time
	)
	kills := newCounts()
	logf := func(format string, args ...any) {
		cmu.Lock()
		defer cmu.Unlock()
		chaosLog = append(chaosLog, fmt.Sprintf("[+%7.3fs] ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
	}
	var prefills, decodes []*procWorker
	for _, w := range d.workers {
		if w.role == "prefill" {
			prefills = append(prefills, w)
		} else {
			decodes = append(decodes, w)
		}
	}
	watch := watchMigrations(hc, d.router.url())
	trafficStart := time.Now()
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		rng := newRand(seed, 32)
		killFrom, killUntil := trafficStart.Add(sending/4), trafficStart.Add(sending*4/5)
		select {
		case <-stop:
			return
		case <-time.After(time.Until(killFrom)): // the schedule's start
		}
		for time.Now().Before(killUntil) {
			// Every draw happens whatever the outcome, so the schedule
			// depends only on the seed.
			gap := between(rng, 500*time.Millisecond, 1500*time.Millisecond)
			decode := kills.get("SIGKILL+restart decode") < 2*(kills.get("SIGKILL+restart prefill")+1)
			pick := rng.Uint64()
			down := between(rng, 100*time.Millisecond, 500*time.Millisecond)
			pool := prefills
			if decode {
				pool = decodes
			}
			// A worker with requests on it, if one has any within 1 s.
			var busy []*procWorker
			waitUntil(time.Second, func() (bool, string) {
				busy = busy[:0]
				for _, w := range pool {
					if live, err := liveRequests(hc, w.url()); err == nil && len(live.Requests) > 0 {
						busy = append(busy, w)
					}
				}
				return len(busy) > 0, ""
			})
			if len(busy) == 0 {
				busy = pool
			}
			victim := busy[pick%uint64(len(busy))]
			live, _ := liveRequests(hc, victim.url())
			cmu.Lock()
			if firstKill.IsZero() {
				firstKill = time.Now()
			}
			cmu.Unlock()
			victim.p.kill()
			logf("SIGKILL %s#%d with %d live requests, down %s", victim.name, victim.life, len(live.Requests), down)
			kills.add("SIGKILL+restart "+victim.role, 1)
			time.Sleep(down) // the schedule's downtime
			if err := d.ps.restart(victim); err != nil {
				cmu.Lock()
				chaosErrs = append(chaosErrs, fmt.Sprintf("restart of %s: %v", victim.name, err))
				cmu.Unlock()
				return
			}
			// The router must see it again before the next kill, so that
			// a worker of each role is always up.
			if err := routerReady(hc, d.router.url(), 10*time.Second); err != nil {
				cmu.Lock()
				chaosErrs = append(chaosErrs, err.Error())
				cmu.Unlock()
				return
			}
			cmu.Lock()
			ready = time.Now()
			cmu.Unlock()
			logf("%s#%d is up and used", victim.name, victim.life)
			select {
			case <-stop:
				return
			case <-time.After(gap): // the schedule's pacing
			}
		}
	})

	// Open loop: request i is sent at i × interval, whatever the others do.
	cl := newClient()
	defer cl.close()
	results := make([]migResult, nReq)
	var wg sync.WaitGroup
	for i, s := range specs {
		time.Sleep(time.Until(trafficStart.Add(time.Duration(i) * interval))) // the open loop's pacing
		wg.Go(func() { results[i] = doMig(cl.hc, d.router.url(), s, s.Stream, bound) })
	}
	wg.Wait()
	trafficDone := time.Since(start)
	close(stop)
	bg.Wait()
	migrated, history := watch.close()
	for _, e := range chaosErrs {
		fail("%s", e)
	}

	errs := newCounts()
	for i := range results {
		if r := &results[i]; r.Err != "" {
			errs.add("error", 1)
			fail("%s failed after %s: %s", r.Spec, r.End.Sub(r.Sent).Round(time.Millisecond), r.Err)
		}
	}
	mismatches := checkAgainstReference(cl.hc, d.ref.url(), results)
	for _, m := range mismatches {
		fail("same answer: %s", m)
	}
	for _, l := range d.quiet(hc, bound) {
		fail("no leak: %s", l)
	}
	causes, delaySum, delayCount, err := routerMigrations(hc, d.router.url())
	if err != nil {
		fail("router metrics: %v", err)
	}
	byCause, total := describeCauses(causes)
	legFailures := map[string]float64{}
	if mfs, err := scrape(hc, d.router.url()); err == nil {
		for _, m := range mfs["pdserve_router_leg_failures_total"].GetMetric() {
			if l := labelsOf(m); valueOf(m) > 0 {
				legFailures[l["role"]+" "+l["outcome"]] += valueOf(m)
			}
		}
	}
	byLeg, _ := describeCauses(legFailures)
	if total == 0 {
		fail("pdserve_router_migrations_total is 0 after %s", kills)
	}

	// Latency: TTFT by prompt length of the requests not migrated; the
	// longest gap of each migrated stream.
	ttftByLen := map[int][]time.Duration{}
	var ttft, itl [3][]time.Duration
	var gaps []string
	var gapDs []time.Duration
	gapByLen := map[int][]time.Duration{}
	migratedStreams, migratedN := 0, 0
	cmu.Lock()
	first, last := firstKill, ready
	cmu.Unlock()
	for i := range results {
		r := &results[i]
		if r.Err != "" || len(r.Events) == 0 {
			continue
		}
		m := migrated[r.rid()]
		if m > 0 && r.Spec.Choices > 1 {
			migratedN++
		}
		if !r.Spec.Stream {
			continue
		}
		if m == 0 {
			ttftByLen[len(r.Spec.Prompt)] = append(ttftByLen[len(r.Spec.Prompt)], r.Events[0].Sub(r.Sent))
		}
		ttft[phase(r.Events[0], first, last)] = append(ttft[phase(r.Events[0], first, last)], r.Events[0].Sub(r.Sent))
		for j := 1; j < len(r.Events); j++ {
			p := phase(r.Events[j], first, last)
			itl[p] = append(itl[p], r.Events[j].Sub(r.Events[j-1]))
		}
		if m > 0 {
			migratedStreams++
			gapDs = append(gapDs, r.maxGap())
			gapByLen[len(r.Spec.Prompt)] = append(gapByLen[len(r.Spec.Prompt)], r.maxGap())
		}
	}
	for _, n := range slices.Sorted(maps.Keys(ttftByLen)) {
		gaps = append(gaps, fmt.Sprintf("\n  prompt %d bytes: TTFT (not migrated) %s\n                    largest gap (migrated) %s",
			n, percentiles(ttftByLen[n]), percentiles(gapByLen[n])))
	}
	meanDelay := 0.0
	if delayCount > 0 {
		meanDelay = delaySum / float64(delayCount) * 1000
	}
	var phases strings.Builder
	for p := range 3 {
		fmt.Fprintf(&phases, "  %-6s TTFT %s\n         ITL  %s\n", phaseNames[p], percentiles(ttft[p]), percentiles(itl[p]))
	}
	cmu.Lock()
	t.Logf("chaos log (seed %d):\n%s", seed, strings.Join(chaosLog, "\n"))
	cmu.Unlock()
	t.Logf(`migration summary (seed %d)
%d requests (one every %s) in %s; total %s
kills:
%sclient errors: %d; outputs compared with the reference: %d, mismatches %d
migrations (router): %s (total %v); failed legs by role and outcome: %s; requests seen migrated at the router: %d (%d streamed, %d with n = 2)
migration delay (router, break to next token): %d observed, mean %.0f ms
largest inter-chunk gap of the migrated streams: %s; by prompt length:%s
kill phase: from +%.3fs to +%.3fs
%sone migrated request's history at the router:
%s`,
		seed, nReq, interval, trafficDone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		kills, errs.get("error"), nReq-errs.get("error"), len(mismatches),
		byCause, total, byLeg, len(migrated), migratedStreams, migratedN, delayCount, meanDelay, percentiles(gapDs), strings.Join(gaps, ""),
		first.Sub(start).Seconds(), last.Sub(start).Seconds(), phases.String(), history)
}

// TestDrainTimeoutContinues: a decode worker with --drain-timeout 1s gets
// SIGTERM while streams longer than that run on it; the streams its
// shutdown cuts continue on the other decode worker: every request
// succeeds with the reference's output, and the router counts the
// migrations.
func TestDrainTimeoutContinues(t *testing.T) {
	t.Parallel()
	seed := seedFor(t)
	const decodeMS = 20
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	d := startDeployment(t, 1, 2, decodeMS, []string{"--kv-cache-memory", "64MiB"},
		[]string{"--kv-cache-memory", "64MiB", "--drain-timeout", "1s"})
	if err := routerReady(hc, d.router.url(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\n(seed %d; reproduce: %s)", fmt.Sprintf(format, args...), seed, reproduce(t, seed))
	}
	victim := d.workers[1]
	// 200 tokens at 20 ms a step: 4 s, well beyond the drain timeout.
	specs := genMigSpecs(newRand(seed, 35), 8, []int{32, 200}, 200, 200)
	cl := newClient()
	defer cl.close()
	watch := watchMigrations(hc, d.router.url())
	results := make([]migResult, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Go(func() { results[i] = doMig(cl.hc, d.router.url(), s, s.Stream, time.Minute) })
	}
	// Every stream on the victim is decoding and has output.
	var onVictim []string
	state, ok := waitUntil(10*time.Second, func() (bool, string) {
		live, err := liveRequests(hc, victim.url())
		if err != nil {
			return false, err.Error()
		}
		onVictim = onVictim[:0]
		for _, r := range live.Requests {
			// A request with n > 1 is listed once per choice.
			if r.Stage == "decoding" && r.OutputTokens > 0 && !slices.Contains(onVictim, r.RID) {
				onVictim = append(onVictim, r.RID)
			}
		}
		return len(onVictim) > 0 && !slices.ContainsFunc(live.Requests, func(r lifecycle.RequestInfo) bool {
			return r.Stage != "decoding" || r.OutputTokens == 0
		}), describeRequests(live.Requests)
	})
	if !ok {
		t.Fatalf("no stream decoding on %s:\n%s", victim.name, state)
	}
	if err := victim.p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	termed := time.Now()
	select {
	case <-victim.p.Exited():
	case <-time.After(10 * time.Second):
		fail("%s did not exit within 10 s of SIGTERM (--drain-timeout 1s)\n%s", victim.name, describeProc(victim))
	}
	exited := time.Since(termed)
	wg.Wait()
	migrated, history := watch.close()
	for i := range results {
		if r := &results[i]; r.Err != "" {
			fail("%s failed after %s: %s", r.Spec, r.End.Sub(r.Sent).Round(time.Millisecond), r.Err)
		}
	}
	for _, m := range checkAgainstReference(cl.hc, d.ref.url(), results) {
		fail("same answer: %s", m)
	}
	for _, rid := range onVictim {
		if migrated[rid] == 0 {
			fail("request %s, decoding on %s at SIGTERM, was not seen continued at the router (migrated: %v)", rid, victim.name, migrated)
		}
	}
	causes, delaySum, delayCount, err := routerMigrations(hc, d.router.url())
	if err != nil {
		fail("router metrics: %v", err)
	}
	byCause, total := describeCauses(causes)
	if total < float64(len(onVictim)) {
		fail("pdserve_router_migrations_total is %v (%s), want at least the %d streams on %s", total, byCause, len(onVictim), victim.name)
	}
	// Back to full strength, then nothing is left anywhere.
	if err := d.ps.restart(victim); err != nil {
		t.Fatal(err)
	}
	for _, l := range d.quiet(hc, chaosDeadlines.clientBound()) {
		fail("no leak: %s", l)
	}
	mean := 0.0
	if delayCount > 0 {
		mean = delaySum / float64(delayCount) * 1000
	}
	var gaps []string
	for i := range results {
		if r := &results[i]; migrated[r.rid()] > 0 {
			gaps = append(gaps, fmt.Sprintf("n=%d stream=%v: %s", max(1, r.Spec.Choices), r.Spec.Stream, r.maxGap().Round(time.Millisecond)))
		}
	}
	t.Logf(`drain summary (seed %d): %d streams of 4 s, %d decoding on %s at SIGTERM (--drain-timeout 1s), which exited %s later
migrations (router): %s; migration delay: %d observed, mean %.0f ms
largest inter-chunk gap of each migrated request: %s
one migrated request's history at the router:
%s`,
		seed, len(specs), len(onVictim), victim.name, exited.Round(time.Millisecond), byCause, delayCount, mean, strings.Join(gaps, ", "), history)
}

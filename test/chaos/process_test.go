package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/router"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// routerWorkers GETs a router's /debug/workers.
func routerWorkers(hc *http.Client, base string) ([]router.WorkerStatus, error) {
	body, err := getBody(hc, base+"/debug/workers")
	if err != nil {
		return nil, err
	}
	var d struct {
		Workers []router.WorkerStatus `json:"workers"`
	}
	err = json.Unmarshal(body, &d)
	return d.Workers, err
}

// routerReady waits until the router at base sees every worker healthy.
func routerReady(hc *http.Client, base string, timeout time.Duration) error {
	state, ok := waitUntil(timeout, func() (bool, string) {
		ws, err := routerWorkers(hc, base)
		if err != nil {
			return false, err.Error()
		}
		var bad []string
		for _, w := range ws {
			if !w.Healthy {
				bad = append(bad, fmt.Sprintf("%s (%s): %s", w.URL, w.Role, w.LastError))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
	if !ok {
		return fmt.Errorf("router %s does not see every worker healthy after %s: %s", base, timeout, state)
	}
	return nil
}

// procDeployment is router + prefill and decode worker processes, and a
// colocated reference process.
type procDeployment struct {
	ps      *procSet
	workers []*procWorker
	router  *procWorker
	ref     *procWorker
}

// startDeployment starts nP prefill and nD decode workers with the chaos
// deadlines and extra flags per role, a router in front, and a `pdserve
// serve` reference.
func startDeployment(t *testing.T, nP, nD int, decodeMS float64, prefillArgs, decodeArgs []string) *procDeployment {
	t.Helper()
	return startDeploymentWith(t, nP, nD, decodeMS, prefillArgs, decodeArgs, nil)
}

// startDeploymentWith is startDeployment with extra router flags.
func startDeploymentWith(t *testing.T, nP, nD int, decodeMS float64, prefillArgs, decodeArgs, routerArgs []string) *procDeployment {
	t.Helper()
	ps := newProcSet(t)
	d := &procDeployment{ps: ps}
	common := slices.Concat(simFlags(decodeMS), chaosDeadlines.flags())
	var pURLs, dURLs []string
	for i := range nP {
		w := ps.worker(fmt.Sprintf("prefill-%d", i), "prefill", slices.Concat(common, prefillArgs)...)
		d.workers = append(d.workers, w)
		pURLs = append(pURLs, w.url())
	}
	for i := range nD {
		w := ps.worker(fmt.Sprintf("decode-%d", i), "decode", slices.Concat(common, decodeArgs)...)
		d.workers = append(d.workers, w)
		dURLs = append(dURLs, w.url())
	}
	d.router = ps.worker("router", "router", slices.Concat(simFlags(decodeMS),
		[]string{"--prefill", strings.Join(pURLs, ","), "--decode", strings.Join(dURLs, ",")}, routerArgs)...)
	d.ref = ps.worker("reference", "serve", slices.Concat(simFlags(0), []string{"--kv-cache-memory", "64MiB"})...)
	var wg sync.WaitGroup
	errs := make([]error, len(d.workers)+2)
	for i, w := range append(slices.Clone(d.workers), d.router, d.ref) {
		wg.Go(func() { errs[i] = ps.start(w) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// quiet waits until every worker's /metrics shows no live request and no
// used page and its /debug/requests is empty; it returns a description of
// each worker that does not get there within timeout.
func (d *procDeployment) quiet(hc *http.Client, timeout time.Duration) []string {
	var out []string
	for _, w := range d.workers {
		state, ok := waitUntil(timeout, func() (bool, string) {
			if bad := quietSignals(hc, w.url()); bad != "" {
				return false, bad
			}
			live, err := liveRequests(hc, w.url())
			if err != nil {
				return false, err.Error()
			}
			if len(live.Requests) > 0 {
				return false, fmt.Sprintf("/debug/requests lists %d requests:\n%s", len(live.Requests), describeRequests(live.Requests))
			}
			return true, ""
		})
		if !ok {
			out = append(out, fmt.Sprintf("%s#%d not quiet within %s: %s\n%s", w.name, w.life, timeout, state, describeProc(w)))
		}
	}
	return out
}

// awaitStage polls the workers' /debug/requests (every 5 ms, up to 1 s)
// until a worker of target's role has a request in target's stage, and
// returns it (nil if none did, or for the zero target) with the stages of
// every worker's live requests.
func (d *procDeployment) awaitStage(hc *http.Client, target stageKey, stop <-chan struct{}) (*procWorker, map[*procWorker][]string) {
	deadline := time.Now().Add(time.Second)
	for {
		stages := map[*procWorker][]string{}
		var hit []*procWorker
		for _, w := range d.workers {
			live, err := liveRequests(hc, w.url())
			if err != nil {
				continue
			}
			for _, r := range live.Requests {
				if !slices.Contains(stages[w], r.Stage) {
					stages[w] = append(stages[w], r.Stage)
				}
			}
			if target.Stage != lifecycle.StageNone && w.role == target.Role.String() && slices.Contains(stages[w], target.Stage.String()) {
				hit = append(hit, w)
			}
		}
		if len(hit) > 0 {
			return hit[0], stages
		}
		if target.Stage == lifecycle.StageNone || time.Now().After(deadline) {
			return nil, stages
		}
		select {
		case <-stop:
			return nil, stages
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// diagnose lists every worker's live requests.
func (d *procDeployment) diagnose(hc *http.Client) string {
	var b strings.Builder
	for _, w := range d.workers {
		live, err := liveRequests(hc, w.url())
		if err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", w.name, err)
			continue
		}
		fmt.Fprintf(&b, "  %s: %d live requests\n%s", w.name, len(live.Requests), describeRequests(live.Requests))
	}
	return b.String()
}

// TestChaosProcesses runs router + 2 prefill + 2 decode workers as OS
// processes, sends seeded random traffic with random client behaviour,
// and every 0.5–1.5 s SIGKILLs a random worker and restarts it on the same
// ports. Every client must be answered within the liveness bound; at the
// end every worker's /metrics shows no live request and no used page, its
// /debug/requests is empty, and every output equals the colocated
// reference's (a `pdserve serve` process).
func TestChaosProcesses(t *testing.T) {
	t.Parallel()
	seed := seedFor(t)
	nReq, nClients := sizes(300, 3000, 8)
	start := time.Now()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	d := startDeployment(t, 2, 2, 5, []string{"--kv-cache-memory", "64MiB"},
		[]string{"--kv-cache-memory", "1MiB", "--max-running-requests", fmt.Sprint(decodeMaxRunning)})
	if err := routerReady(hc, d.router.url(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\n(seed %d; reproduce: %s)", fmt.Sprintf(format, args...), seed, reproduce(t, seed))
	}
	bound := chaosDeadlines.clientBound()
	specs := genRequests(newRand(seed, 11), nReq, genOptions{MaxPrompt: 700, MaxTokens: 128, PDisconnect: 0.15, PAbort: 0.15,
		MaxThink: 400 * time.Millisecond})
	t.Logf("%d requests, %d clients, client bound %s", nReq, nClients, bound)

	// The chaos: SIGKILL a random worker, keep it down a moment, restart
	// it on the same ports.
	stop := make(chan struct{})
	kills := newCounts()
	coverage := newCounts()
	var cmu sync.Mutex
	var chaosErrs, chaosLog []string
	logf := func(format string, args ...any) {
		cmu.Lock()
		defer cmu.Unlock()
		chaosLog = append(chaosLog, fmt.Sprintf("[+%7.3fs] ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
	}
	var bg sync.WaitGroup
	bg.Go(func() {
		rng := newRand(seed, 12)
		keys := allStageKeys()
		for {
			// Every draw happens whatever the outcome, so the schedule
			// depends only on the seed.
			gap := between(rng, 500*time.Millisecond, 1500*time.Millisecond)
			var target stageKey
			if rng.Float64() < 0.7 {
				target = keys[rng.IntN(len(keys))]
			}
			pick := rng.Uint64()
			down := between(rng, 0, 500*time.Millisecond)
			select {
			case <-stop:
				return
			case <-time.After(gap): // the schedule's pacing, drawn from the seed
			}
			victim, stages := d.awaitStage(hc, target, stop)
			if victim == nil {
				victim = d.workers[pick%uint64(len(d.workers))]
			} else {
				kills.add("kills that found their target stage", 1)
			}
			for _, st := range stages[victim] {
				coverage.add(victim.role+" "+st, 1)
			}
			logf("SIGKILL %s#%d (target %v; its live requests' stages %v), down %s", victim.name, victim.life, target, stages[victim], down)
			victim.p.kill()
			kills.add("SIGKILL+restart "+victim.role, 1)
			time.Sleep(down) // the schedule's downtime
			if err := d.ps.restart(victim); err != nil {
				cmu.Lock()
				chaosErrs = append(chaosErrs, fmt.Sprintf("restart of %s: %v", victim.name, err))
				cmu.Unlock()
				return
			}
			logf("%s#%d is up", victim.name, victim.life)
		}
	})
	cl := newClient()
	defer cl.close()
	results := runClients(specs, nClients, func(s *reqSpec) result {
		return cl.do(d.router.url(), s, bound, func() string { return d.diagnose(hc) })
	})
	trafficDone := time.Since(start)
	close(stop)
	bg.Wait()
	for _, e := range chaosErrs {
		fail("%s", e)
	}

	labels, maxElapsed := tally(results, bound, fail)

	// Recovery: the router uses every worker again; fault-free requests
	// succeed.
	if err := routerReady(hc, d.router.url(), 30*time.Second); err != nil {
		fail("after the chaos: %v", err)
	}
	probes := genRequests(newRand(seed, 13), 8, genOptions{MaxPrompt: 300, MaxTokens: 32})
	for _, p := range probes {
		p.N += len(specs)
	}
	probeResults := runClients(probes, 4, func(s *reqSpec) result {
		return retryOK(func() result { return cl.do(d.router.url(), s, bound, nil) })
	})
	for _, r := range probeResults {
		if r.Kind != resOK {
			fail("after the chaos, fault-free %s failed %d times, last: %s %s", r.Spec, probeAttempts, r.label(), r.Message)
		}
	}

	ref := newReference(cl, d.ref.url())
	full, prefix, mismatches := sameAnswer(ref, append(slices.Clone(results), probeResults...), 4)
	for _, m := range mismatches {
		fail("same answer: %s", m)
	}

	leaks := d.quiet(hc, bound)
	for _, l := range leaks {
		fail("no leak / honest signals: %s", l)
	}
	if t.Failed() {
		cmu.Lock()
		t.Logf("chaos log (seed %d):\n%s", seed, strings.Join(chaosLog, "\n"))
		cmu.Unlock()
	}
	t.Logf(`process chaos summary (seed %d)
%d requests (%d clients) in %s; total %s
results:
%skills:
%sstages of the victim's live requests when it was killed:
%sclient time to answer: max %s, bound %s
same answer: %d complete outputs and %d partial ones compared, %d mismatches; %d fault-free probes after the chaos
leaks found: %d`,
		seed, nReq, nClients, trafficDone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		labels, kills, coverage, maxElapsed.Round(time.Millisecond), bound, full, prefix, len(mismatches), len(probes), len(leaks))
}

// TestDecodeKilledWhileParked is the named scenario "decode is SIGKILLed
// with requests parked on prefill: prefill frees them within one lease".
// Decode's pool holds one request at a time, so the others wait in
// decode's prealloc while prefill parks their KV; then decode is killed.
// Prefill must free every parked request within heartbeat-interval ×
// heartbeat-misses (plus slack), hold no pages, and answer every leg.
//
// Two variants: through the router (which also aborts prefill's legs when
// decode's fail), and with the legs posted directly to the workers, so
// that prefill has only the KV channel to learn that decode is gone.
func TestDecodeKilledWhileParked(t *testing.T) {
	t.Parallel()
	seed := seedFor(t)
	t.Run("router", func(t *testing.T) { decodeKilledWhileParked(t, seed, true) })
	t.Run("direct legs", func(t *testing.T) { decodeKilledWhileParked(t, seed, false) })
}

// decodeKilledWhileParked runs the scenario, through a router or with the
// legs posted directly to the workers.
func decodeKilledWhileParked(t *testing.T, seed uint64, viaRouter bool) {
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	lag := startLagProbe()
	defer lag.Stop()
	const (
		heartbeat = 200 * time.Millisecond
		misses    = 3
		slack     = 500 * time.Millisecond
		// A request: 100 prompt tokens + 100 output tokens = 13 pages of
		// 16 tokens; decode's pool of 64 KiB has 16 pages, so it holds
		// one request at a time. At 20 ms per decode step one request
		// decodes for 2 s.
		promptLen = 100
		maxTokens = 100
		decodeMS  = 20
		requests  = 4
	)
	// silence is heartbeat-interval × heartbeat-misses: a decode that is
	// gone is noticed within it, well within one lease.
	silence := heartbeat * misses
	// Long queue and hold deadlines, so that nothing but the lost decode
	// ends the parked requests.
	long := []string{"--heartbeat-interval", heartbeat.String(), "--heartbeat-misses", fmt.Sprint(misses),
		"--queue-timeout", "60s", "--kv-hold-timeout", "60s", "--bootstrap-timeout", "60s", "--transfer-timeout", "60s",
		"--max-request-time", "120s"}
	ps := newProcSet(t)
	pre := ps.worker("prefill", "prefill", slices.Concat(simFlags(decodeMS), long, []string{"--kv-cache-memory", "64MiB"})...)
	dec := ps.worker("decode", "decode", slices.Concat(simFlags(decodeMS), long, []string{"--kv-cache-memory", "64KiB"})...)
	ps.mustStart(pre)
	ps.mustStart(dec)
	var rt *procWorker
	if viaRouter {
		// Admission off: the scenario fills decode's pool on purpose.
		rt = ps.worker("router", "router", slices.Concat(simFlags(decodeMS), []string{"--prefill", pre.url(), "--decode", dec.url(),
			"--decode-kv-threshold", "0", "--decode-queue-threshold", "0", "--prefill-queue-threshold", "0"})...)
		ps.mustStart(rt)
		if err := routerReady(hc, rt.url(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	rng := newRand(seed, 21)
	cl := newClient()
	defer cl.close()
	const bound = time.Minute
	// answers[i] describes how request i ended: a client result through
	// the router, or the prefill leg's answer.
	answers := make([]string, requests)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range requests {
		var b strings.Builder
		for range promptLen {
			b.WriteByte(promptLetters[rng.IntN(26)])
		}
		s := &reqSpec{N: i, Prompt: b.String(), MaxTokens: maxTokens, IgnoreEOS: true, Seed: rng.Int64N(1 << 40), TopP: 1,
			Stream: i%2 == 0}
		if viaRouter {
			wg.Go(func() {
				r := cl.do(rt.url(), s, bound, nil)
				answers[i] = r.label()
				if r.Kind == resNoAnswer || r.Kind == resBroken {
					t.Errorf("%s: %s %s (seed %d)", s, r.label(), r.Message, seed)
				}
			})
			continue
		}
		ids := make([]int32, len(s.Prompt))
		for j := range len(s.Prompt) {
			ids[j] = int32(s.Prompt[j])
		}
		leg := workerapi.GenerateBody{RID: fmt.Sprintf("parked-%d", i), Room: kvxfer.NewRoom().String(), Gen: 1, InputIDs: ids,
			MaxTokens: maxTokens, SamplingParams: model.SamplingParams{Temperature: 1, TopP: 1, Seed: uint64(s.Seed)}, IgnoreEOS: true,
			PrefillKVAddr: fmt.Sprintf("127.0.0.1:%d", pre.kvPort)}
		wg.Go(func() { answers[i] = "prefill leg: " + postLeg(cl, pre.url()+workerapi.PathPrefill, leg, bound) })
		wg.Go(func() { postLeg(cl, dec.url()+workerapi.PathDecode, leg, bound) })
	}

	// Requests park on prefill while decode is busy with one of them.
	state, ok := waitUntil(30*time.Second, func() (bool, string) {
		pl, err := liveRequests(hc, pre.url())
		if err != nil {
			return false, err.Error()
		}
		dl, err := liveRequests(hc, dec.url())
		if err != nil {
			return false, err.Error()
		}
		parked, prealloc := 0, 0
		for _, r := range pl.Requests {
			if r.Stage == "parked" {
				parked++
			}
		}
		for _, r := range dl.Requests {
			if r.Stage == "prealloc" {
				prealloc++
			}
		}
		return parked >= 1 && prealloc >= 1, fmt.Sprintf("prefill:\n%sdecode:\n%s", describeRequests(pl.Requests), describeRequests(dl.Requests))
	})
	if !ok {
		t.Fatalf("no request parked on prefill while waiting in decode's prealloc:\n%s\n(seed %d)", state, seed)
	}
	before, _ := liveRequests(hc, pre.url())
	t.Logf("prefill before the kill:\n%s", describeRequests(before.Requests))

	dec.p.kill()
	killed := time.Now()
	state, ok = waitUntil(10*time.Second, func() (bool, string) {
		pl, err := liveRequests(hc, pre.url())
		if err != nil {
			return false, err.Error()
		}
		return len(pl.Requests) == 0, describeRequests(pl.Requests)
	})
	freed := time.Since(killed)
	switch {
	case !ok:
		t.Errorf("prefill still holds requests %s after decode was killed (bound: heartbeat-interval × heartbeat-misses %s + slack %s):\n%s\n%s\n(seed %d)",
			freed.Round(time.Millisecond), silence, slack, state, describeProc(pre), seed)
	case freed > silence+slack+lag.Max():
		t.Errorf("prefill freed its requests %s after decode was killed; bound: heartbeat-interval × heartbeat-misses %s + slack %s + scheduling lag %s (seed %d)",
			freed.Round(time.Millisecond), silence, slack, lag.Max().Round(time.Millisecond), seed)
	}
	if bad := quietSignals(hc, pre.url()); bad != "" {
		t.Errorf("prefill after decode was killed: %s (seed %d)", bad, seed)
	}
	wg.Wait()
	outcomes := ""
	if mfs, err := scrape(hc, pre.url()); err == nil {
		fin := finishedByOutcome(mfs)
		for _, o := range slices.Sorted(maps.Keys(fin)) {
			if fin[o] > 0 {
				outcomes += fmt.Sprintf(" %s=%v", o, fin[o])
			}
		}
	}
	t.Logf("prefill freed every request %s after decode was killed (bound %s + scheduling lag %s); prefill outcomes:%s; answers:\n  %s",
		freed.Round(time.Millisecond), silence+slack, lag.Max().Round(time.Millisecond), outcomes, strings.Join(answers, "\n  "))
}

// postLeg posts a worker leg and describes its answer: the status and the
// error code, or the last line of a stream.
func postLeg(cl *client, url string, leg workerapi.GenerateBody, timeout time.Duration) string {
	body, err := json.Marshal(leg)
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		return "transport error: " + err.Error()
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("%d, then %v", resp.StatusCode, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return fmt.Sprintf("%d %s", resp.StatusCode, lines[len(lines)-1])
}

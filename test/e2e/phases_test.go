package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/fault"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/outcome"
)

// gate holds the frames of some types a worker sends until it is opened,
// so a test can keep a request in one phase as long as it likes.
type gate struct {
	kvxfer.Backend
	types []kvxfer.Type
	mu    sync.Mutex
	open  bool
	held  []heldFrame
}

type heldFrame struct {
	peer kvxfer.PeerID
	msg  kvxfer.Message
}

func (g *gate) Send(p kvxfer.PeerID, m kvxfer.Message) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open && slices.Contains(g.types, m.Type()) {
		g.held = append(g.held, heldFrame{p, m})
		return nil
	}
	return g.Backend.Send(p, m)
}

// Open sends what was held, in order, and lets everything through.
func (g *gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	for _, h := range g.held {
		_ = g.Backend.Send(h.peer, h.msg)
	}
	g.held = nil
}

// Held is the number of frames held so far.
func (g *gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// gated wraps the KV backend of one role's worker in a gate.
func gated(role lifecycle.Role, types ...kvxfer.Type) (*gate, func(lifecycle.Role, int, kvxfer.Backend) kvxfer.Backend) {
	g := &gate{types: types}
	return g, func(r lifecycle.Role, _ int, b kvxfer.Backend) kvxfer.Backend {
		if r == role {
			g.Backend = b
			return g
		}
		return b
	}
}

func stageOf(w *cluster.WorkerServer) map[lifecycle.Stage]int {
	st, _ := w.Worker.Stats(time.Second)
	return st.Stages
}

// TestClientDisconnectAtEachPhase (scenario 8): a client that goes away with
// its request held in each phase — before prefill admits it, during
// prefill, after prefill committed, during the transfer, during decode —
// leaves both workers at baseline promptly, by abort (not by a deadline).
func TestClientDisconnectAtEachPhase(t *testing.T) {
	t.Parallel()
	phases := []struct {
		name      string
		sim       sim.Config
		prompt    int
		gateRole  lifecycle.Role
		gateTypes []kvxfer.Type
		worker    func(c *cluster.Cluster) *cluster.WorkerServer
		stage     lifecycle.Stage
	}{
		{name: "before prefill admits (bootstrap)", prompt: 40, gateRole: lifecycle.RoleDecode,
			gateTypes: []kvxfer.Type{kvxfer.TypeRoomOpen}, worker: prefillOf, stage: lifecycle.StageBootstrap},
		// A 512-token chunk computes for 5 s: the abort cancels the
		// forward instead of waiting for it.
		{name: "during prefill", prompt: 1500, sim: sim.Config{PrefillPerToken: 10 * time.Millisecond},
			worker: prefillOf, stage: lifecycle.StagePrefilling},
		{name: "after prefill committed (parked)", prompt: 40, gateRole: lifecycle.RoleDecode,
			gateTypes: []kvxfer.Type{kvxfer.TypeRoomReady}, worker: prefillOf, stage: lifecycle.StageParked},
		{name: "during transfer", prompt: 40, gateRole: lifecycle.RolePrefill,
			gateTypes: []kvxfer.Type{kvxfer.TypeKVDone}, worker: decodeOf, stage: lifecycle.StageAwaitingKV},
		{name: "during decode", prompt: 40, sim: sim.Config{DecodePerStep: 5 * time.Millisecond},
			worker: decodeOf, stage: lifecycle.StageDecoding},
	}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			mc := testMachine()
			mc.HeartbeatInterval = time.Second // leases (3 s) cannot be what frees the request
			o := pdOptions{sim: ph.sim, machine: &mc}
			var g *gate
			if ph.gateTypes != nil {
				g, o.wrap = gated(ph.gateRole, ph.gateTypes...)
			}
			c := startPD(t, o)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":500,"ignore_eos":true,"stream":true}`, strings.Repeat("d", ph.prompt))
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/completions", strings.NewReader(body))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			w := ph.worker(c)
			waitFor(t, 5*time.Second, "request in "+ph.stage.String(), func() (bool, string) {
				s := stageOf(w)
				return s[ph.stage] == 1, fmt.Sprint(s)
			})
			cancel()
			<-done
			start := time.Now()
			for _, w := range c.Workers() {
				waitFor(t, 2*time.Second, w.Worker.Role().String()+" back to baseline", func() (bool, string) {
					st, _ := w.Worker.Stats(time.Second)
					return st.Live == 0 && st.PagesUsed == 0, fmt.Sprintf("%v pages %d", st.Stages, st.PagesUsed)
				})
			}
			if g != nil {
				g.Open() // late frames now reach a peer that dropped the room
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("baseline took %s after the disconnect", d)
			}
			for _, w := range c.Workers() {
				for _, o := range []string{"timeout_bootstrap", "timeout_queue", "timeout_kv_hold", "timeout_transfer", "lease_expired", "peer_lost"} {
					if n := counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "outcome", o); n != 0 {
						t.Errorf("%s ended %v request(s) by %s, want abort", w.Worker.Role(), n, o)
					}
				}
			}
		})
	}
}

func prefillOf(c *cluster.Cluster) *cluster.WorkerServer { return c.Prefill[0] }
func decodeOf(c *cluster.Cluster) *cluster.WorkerServer  { return c.Decode[0] }

// TestAbortMidSendNoStaleWrite (scenario 5): decode aborts a room while
// prefill is still sending its KV; the late frames arrive after the pages
// went to the next request, and are dropped: that request's output is
// exactly the colocated one.
func TestAbortMidSendNoStaleWrite(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	pageBytes := int64(testGeometry.BytesPerToken() * mc.PageSize)
	prompt := 300 // 19 pages
	// Decode's pool holds one such request (prompt + 20 output tokens), so
	// the second request gets the pages of the first.
	g, wrap := gated(lifecycle.RolePrefill, kvxfer.TypeKVChunk, kvxfer.TypeKVDone)
	c := startPD(t, pdOptions{machine: &mc, memory: 21 * pageBytes, wrap: wrap, router: noAdmission()})
	co := startServe(t, sim.Config{})
	d := c.Decode[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aDone := make(chan int, 1)
	go func() {
		body := fmt.Sprintf(`{"prompt":%q,"max_tokens":20}`, strings.Repeat("a", prompt))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			aDone <- 0
			return
		}
		resp.Body.Close()
		aDone <- resp.StatusCode
	}()
	waitFor(t, 5*time.Second, "A's KV held in flight", func() (bool, string) {
		return g.Held() > 0 && stageOf(d)[lifecycle.StageAwaitingKV] == 1, fmt.Sprint(g.Held(), stageOf(d))
	})
	// Decode aborts A (through its own API, as its client would).
	reqs, _ := d.Worker.Requests(time.Second)
	status, body := postWith(t, c.WorkerClient(), d.URL+"/internal/v1/abort", map[string]any{"rid": reqs[0].RID})
	if status != http.StatusOK {
		t.Fatalf("abort: %d %s", status, body)
	}
	if s := <-aDone; s == http.StatusOK {
		t.Fatalf("aborted request A succeeded")
	}
	// B takes A's pages; then A's KV, held until now, arrives.
	bReq := map[string]any{"prompt": strings.Repeat("b", prompt), "max_tokens": 20, "seed": 9, "return_token_ids": true}
	bDone := make(chan []byte, 1)
	go func() {
		_, out := postJSON(t, c.URL()+"/v1/completions", bReq)
		bDone <- out
	}()
	waitFor(t, 5*time.Second, "B awaiting KV in A's pages", func() (bool, string) {
		return stageOf(d)[lifecycle.StageAwaitingKV] == 1, fmt.Sprint(stageOf(d))
	})
	g.Open()
	got := decodeCompletion(t, <-bDone)
	_, wantBody := postJSON(t, co.URL+"/v1/completions", bReq)
	want := decodeCompletion(t, wantBody)
	if len(got.Choices) == 0 || !slices.Equal(got.Choices[0].TokenIDs, want.Choices[0].TokenIDs) {
		t.Fatalf("B after A's stale KV: %+v, colocated %+v", got, want)
	}
	if n := counterValue(t, workerGatherer{d}, "pdserve_kv_frames_dropped_total", "reason", "unknown_room"); n == 0 {
		t.Fatalf("A's late frames never reached decode; the test proved nothing")
	}
}

// TestAbortStorm (scenario 4): half the requests of a sustained load are
// aborted at random phases; once the storm stops, both workers are back at
// baseline and the next requests succeed as fast as before (the median of
// ten probes within 3× the one before the storm, plus 50 ms).
func TestAbortStorm(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: time.Millisecond, PrefillPerToken: 20 * time.Microsecond}})
	// measure returns the median of n probes' latencies: one probe
	// descheduled on a loaded host must not decide the comparison.
	measure := func(n int) time.Duration {
		ds := make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("probe %d", i), "max_tokens": 8})
			if status != http.StatusOK {
				t.Fatalf("probe: %d %s", status, body)
			}
			ds[i] = time.Since(start)
		}
		slices.Sort(ds)
		return ds[n/2]
	}
	before := measure(10)
	rng := rand.New(rand.NewPCG(4, 4))
	var mu sync.Mutex
	var wg sync.WaitGroup
	aborted, ok := 0, 0
	// The storm lasts until both kinds reached 50 (at least 2 s, at most 20).
	start := time.Now()
	enough := func() bool {
		mu.Lock()
		defer mu.Unlock()
		d := time.Since(start)
		return d > 20*time.Second || (d > 2*time.Second && aborted >= 50 && ok >= 50)
	}
	for w := range 16 {
		seed := rng.Uint64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for !enough() {
				abort := r.IntN(2) == 0
				ctx, cancel := context.WithCancel(context.Background())
				if abort {
					time.AfterFunc(time.Duration(r.IntN(40))*time.Millisecond, cancel)
				}
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":%v}`,
					strings.Repeat("s", 1+r.IntN(400)), 1+r.IntN(60), r.IntN(2) == 0)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/completions", strings.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				mu.Lock()
				if err != nil || resp.StatusCode != http.StatusOK {
					aborted++
				} else {
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if aborted < 20 || ok < 20 {
		t.Fatalf("storm too small to mean anything: %d aborted, %d ok", aborted, ok)
	}
	assertQuiescent(t, c.Workers()...)
	after := measure(10)
	if after > 3*before+50*time.Millisecond {
		t.Fatalf("median probe %s after the storm, %s before", after, before)
	}
	t.Logf("storm: %d aborted, %d completed; median probe %s before, %s after", aborted, ok, before, after)
}

// TestGaugesUnderChurn (scenario 11): after a burst and a mass abort, a
// scrape over HTTP right after quiescence shows every stage gauge at 0.
func TestGaugesUnderChurn(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 2 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	started := make(chan struct{}, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":"burst %d","max_tokens":500,"ignore_eos":true,"stream":true}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			if sc.Scan() {
				started <- struct{}{}
			}
			for sc.Scan() {
			}
		}()
	}
	for range 50 {
		<-started
	}
	cancel() // mass abort
	wg.Wait()
	for _, w := range c.Workers() {
		waitFor(t, 5*time.Second, "quiescent", func() (bool, string) {
			st, _ := w.Worker.Stats(time.Second)
			return st.Live == 0, fmt.Sprint(st.Stages)
		})
		resp, err := http.Get(w.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		gauges := mfs["pdserve_requests"]
		if gauges == nil || len(gauges.GetMetric()) != len(w.Worker.Role().Stages()) {
			t.Fatalf("%s: scraped %v", w.Worker.Role(), gauges)
		}
		for _, m := range gauges.GetMetric() {
			if v := m.GetGauge().GetValue(); v != 0 {
				t.Errorf("%s: pdserve_requests%v = %v right after quiescence", w.Worker.Role(), labels(m), v)
			}
		}
		if used := mfs["pdserve_kv_pages"]; used == nil {
			t.Fatalf("no pdserve_kv_pages")
		}
	}
}

// TestSilentPeerFailsRoomsOnBothSides: when the KV connection goes silent
// (frozen, no bytes either way), both workers fail every room on it within
// heartbeat-interval × heartbeat-misses. The router's one retry may still
// land on the dying connection if it starts before decode noticed the
// silence (decode redials a lost connection at the router's next health
// check, so the path rarely reads unreachable and the pair is not held);
// when decode's report that the path is unreachable reaches the router
// before it retries, there is no pair to retry on and the answer is
// peer_lost at once. Either way the client's answer is bounded, and once
// the connection is gone the next request reconnects clean.
func TestSilentPeerFailsRoomsOnBothSides(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	net := fault.NewNet(fault.NetConfig{}, nil)
	g, wrap := gated(lifecycle.RolePrefill, kvxfer.TypeKVDone)
	var logs logBuffer
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: simFactory(sim.Config{}), WrapBackend: wrap, HealthInterval: 100 * time.Millisecond,
		Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20, KVDial: net.Dial},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		net.ThawAll()
		assertQuiescent(t, c.Workers()...)
		_ = c.Shutdown(context.Background())
	})
	done := make(chan string, 1)
	go func() {
		status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "frozen", "max_tokens": 4})
		done <- fmt.Sprint(status, " ", string(body))
	}()
	waitFor(t, 5*time.Second, "transfer held", func() (bool, string) {
		return stageOf(c.Prefill[0])[lifecycle.StageTransferring] == 1, fmt.Sprint(stageOf(c.Prefill[0]))
	})
	if n := net.FreezeAll(time.Hour); n != 1 {
		t.Fatalf("froze %d connections", n)
	}
	start := time.Now()
	bound := mc.HeartbeatInterval*time.Duration(mc.LeaseMisses) + 500*time.Millisecond
	answer := ""
	defer func() {
		if t.Failed() {
			t.Logf("the request's answer: %s\nlog:\n%s", answer, strings.Join(logs.lines(), "\n"))
			for _, w := range c.Workers() {
				for _, o := range outcome.Worker() {
					if n := counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "outcome", o.String()); n > 0 {
						t.Logf("%s: %s %v", w.Worker.Role(), o, n)
					}
				}
				rs, _ := w.Worker.Requests(time.Second)
				for _, r := range rs {
					ri, _, _ := w.Worker.Request(r.RID, time.Second)
					t.Logf("%s: %+v", w.Worker.Role(), ri)
				}
			}
		}
	}()
	for _, w := range c.Workers() {
		// The side that notices the silence first fails the room
		// (peer_lost); the router then aborts the other leg (aborted_peer),
		// unless that side noticed too.
		waitFor(t, 2*bound, w.Worker.Role().String()+" failed the room", func() (bool, string) {
			var n float64
			for _, o := range []string{"peer_lost", "aborted_peer", "lease_expired"} {
				n += counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "outcome", o)
			}
			return n >= 1, fmt.Sprint(n)
		})
	}
	// The bound is on pdserve's detection, timed by its own log line (the
	// first side's "kv peer lost"), not on this test's polling of two
	// workers' metrics, which a loaded run delays by hundreds of ms; the
	// waits above bound that at twice as much.
	lost := time.Time{}
	for _, l := range logs.lines(`msg="kv peer lost"`) {
		if at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(strings.Fields(l)[0], "time=")); err == nil {
			lost = at
			break
		}
	}
	if lost.IsZero() {
		g.Open()
		t.Fatalf("no side logged the peer lost")
	}
	if d := lost.Sub(start); d > bound {
		g.Open()
		t.Fatalf("the peer was found lost %s after the freeze, bound %s", d, bound)
	}
	g.Open()
	select {
	case s := <-done:
		answer = s
		if !strings.HasPrefix(s, "200 ") && !strings.Contains(s, "peer_lost") {
			t.Fatalf("the request got %s", s)
		}
	case <-time.After(3 * bound):
		t.Fatalf("no answer within %s of the freeze", 3*bound)
	}
	// One retry, unless decode's report that the path is unreachable
	// reached the router first: then the pair is out, no other pair
	// exists, and the answer is the first failure (peer_lost) at once.
	reported := false // before the router failed the request
	for _, l := range logs.lines() {
		if strings.Contains(l, `msg="request failed" role=router`) {
			break
		}
		reported = reported || strings.Contains(l, `msg="KV path reported"`) && strings.Contains(l, "state=unreachable")
	}
	if n := counterValue(t, routerGatherer{c.Router}, "pdserve_router_retries_total", "", ""); n != 1 &&
		!(n == 0 && reported && strings.Contains(answer, "peer_lost")) {
		t.Fatalf("retries %v (path reported unreachable before the answer: %v)", n, reported)
	}
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "after", "max_tokens": 4})
	if status != http.StatusOK {
		t.Fatalf("after the connection died: %d %s", status, body)
	}
}

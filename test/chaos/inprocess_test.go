package chaos

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/fault"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/router"
)

// simGeometry is a small KV shape: 2 layers × 2 KV heads × 16 dims × bf16 =
// 256 bytes per token, 4 KiB per 16-token page.
var simGeometry = kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvcache.BF16}

const simContext = 2048

// chaosSim is the simulated model of the chaos workers: small and with
// latencies, so that every phase lasts long enough to be hit.
var chaosSim = sim.Config{Geometry: simGeometry, ContextLen: simContext,
	PrefillPerToken: 20 * time.Microsecond, DecodePerStep: time.Millisecond}

// Pool sizes of the in-process workers: 128 pages of 4 KiB each, small
// enough that under load requests wait in decode's prealloc while prefill
// parks their KV, and wait in prefill's queue while its pages are parked;
// large enough for the longest request (about 800 tokens, 50 pages).
const (
	prefillMemory = 512 << 10
	decodeMemory  = 512 << 10
)

// minCoverageRequests is the smallest run that must strike every phase
// (requiredPhases); the CI run has 2,000 requests (inProcessRequests).
const minCoverageRequests = 1000

// inProcessRequests is TestChaosInProcess's CI size: 2,000 requests, or
// minCoverageRequests under the race detector, where the suite's time goal
// needs the cut (.ci/run also runs the test whole without it).
func inProcessRequests() int {
	if raceEnabled {
		return minCoverageRequests
	}
	return 2000
}

// chaosHealthInterval is the router's health check interval in the
// in-process deployment: a twentieth of the default (2 s), as its leases
// and heartbeats are scaled.
const chaosHealthInterval = 100 * time.Millisecond

// decodeMaxRunning bounds a decode worker's running batch, so that
// requests also wait in decode's queued stage.
const decodeMaxRunning = 6

// slot is one worker position of the in-process deployment. Its role and
// addresses stay fixed; the server changes with every restart.
type slot struct {
	i      int
	name   string
	role   lifecycle.Role
	addr   string // HTTP host:port
	kvAddr string // prefill: KV channel host:port
	life   int    // restarts so far
	// srv and fb are the running server and its fault Backend; nil while
	// the worker is down. Guarded by inproc.mu.
	srv *cluster.WorkerServer
	fb  *fault.Backend
}

// label names the slot's current incarnation.
func (s *slot) label() string { return fmt.Sprintf("%s#%d", s.name, s.life) }

// burst is a fault config applied to some backends until end.
type burst struct {
	end   time.Time
	scope int
	cfg   fault.Config
}

// inproc is the in-process chaos deployment: router + 2 prefill + 2 decode
// workers whose KV transports inject faults, decode workers dialing
// through one fault.Net, and a colocated reference worker.
type inproc struct {
	t      *testing.T
	seed   uint64
	dl     deadlines
	net    *fault.Net
	netEnd time.Time // end of a random-network window (zero: none)
	router *cluster.RouterServer
	ref    *cluster.WorkerServer
	// spans are the router's spans (every request traced).
	spans *tracetest.InMemoryExporter
	hc    *http.Client // for /metrics and /debug

	mu        sync.Mutex
	slots     []*slot
	allFaults []*fault.Backend // every fault Backend ever made, for Injected
	bursts    []burst

	began      time.Time
	logMu      sync.Mutex
	chaosLog   []string // what the chaos did, when; printed on failure
	maxes      *stageMax
	lag        *lagProbe
	actions    *counts // chaos actions by kind
	coverage   *counts // stages occupied when an action struck
	vmu        sync.Mutex
	violations []string
	seen       map[string]bool // violations reported, by key
}

// faultsFor merges the active bursts that apply to slot s. inproc.mu must
// be held.
func (h *inproc) faultsForLocked(s *slot) fault.Config {
	var cs []fault.Config
	now := time.Now()
	for _, b := range h.bursts {
		if now.After(b.end) {
			continue
		}
		if b.scope == scopeAll || b.scope == s.i || (b.scope == scopePrefill && s.role == lifecycle.RolePrefill) ||
			(b.scope == scopeDecode && s.role == lifecycle.RoleDecode) {
			cs = append(cs, b.cfg)
		}
	}
	return mergeFaults(derive(h.seed, 3, uint64(s.i), uint64(s.life)), cs)
}

// start starts slot s's worker on its addresses (any free port the first
// time).
func (h *inproc) start(s *slot) error {
	m, err := sim.New(chaosSim)
	if err != nil {
		return err
	}
	wo := cluster.WorkerOptions{Addr: s.addr, Model: m, Machine: h.dl.machine(s.role), KVCacheMemory: decodeMemory}
	if s.role == lifecycle.RolePrefill {
		wo.KVCacheMemory, wo.KVListen = prefillMemory, s.kvAddr
	} else {
		wo.KVDial = h.net.Dial
		wo.Machine.MaxRunning = decodeMaxRunning
	}
	h.mu.Lock()
	cfg := h.faultsForLocked(s)
	h.mu.Unlock()
	var fb *fault.Backend
	wo.WrapBackend = func(b kvxfer.Backend) kvxfer.Backend {
		fb = fault.Wrap(b, cfg)
		return fb
	}
	srv, err := cluster.StartWorker(wo)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s.srv, s.fb = srv, fb
	s.addr = strings.TrimPrefix(srv.URL, "http://")
	if s.role == lifecycle.RolePrefill {
		s.kvAddr = srv.Worker.KVAddr()
	}
	h.allFaults = append(h.allFaults, fb)
	fb.SetConfig(h.faultsForLocked(s)) // a burst may have started meanwhile
	return nil
}

// current returns slot s's running server (nil while down).
func (h *inproc) current(s *slot) *cluster.WorkerServer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.srv
}

// live returns the running workers with their slots.
func (h *inproc) live() map[*slot]*cluster.WorkerServer {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[*slot]*cluster.WorkerServer)
	for _, s := range h.slots {
		if s.srv != nil {
			out[s] = s.srv
		}
	}
	return out
}

// logf adds a line to the chaos log.
func (h *inproc) logf(format string, args ...any) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	h.chaosLog = append(h.chaosLog, fmt.Sprintf("[+%7.3fs] ", time.Since(h.began).Seconds())+fmt.Sprintf(format, args...))
}

// violate records an invariant violation once per key.
func (h *inproc) violate(key, msg string) {
	h.vmu.Lock()
	defer h.vmu.Unlock()
	if h.seen[key] {
		return
	}
	h.seen[key] = true
	h.violations = append(h.violations, msg)
}

// applyFaults sets every running backend's config from the active bursts,
// forgetting bursts that ended.
func (h *inproc) applyFaults() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	h.bursts = slices.DeleteFunc(h.bursts, func(b burst) bool { return now.After(b.end) })
	for _, s := range h.slots {
		if s.fb != nil {
			s.fb.SetConfig(h.faultsForLocked(s))
		}
	}
}

// nextWake is the earliest end of a burst or of the random-network window.
func (h *inproc) nextWake() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	wake := h.netEnd
	for _, b := range h.bursts {
		if wake.IsZero() || b.end.Before(wake) {
			wake = b.end
		}
	}
	return wake
}

// pace waits until t (or stop), ending bursts and the random-network
// window on time meanwhile. It reports false if stopped.
func (h *inproc) pace(t time.Time, stop <-chan struct{}) bool {
	for {
		now := time.Now()
		if !h.netEnd.IsZero() && !now.Before(h.netEnd) {
			h.net.SetConfig(fault.NetConfig{Seed: derive(h.seed, 4)})
			h.netEnd = time.Time{}
		}
		h.applyFaults()
		if !now.Before(t) {
			return true
		}
		wake := t
		if w := h.nextWake(); !w.IsZero() && w.Before(wake) {
			wake = w
		}
		timer := time.NewTimer(max(time.Until(wake), time.Millisecond))
		select {
		case <-stop:
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

// snapshot reads every running worker's stats.
func (h *inproc) snapshot() map[*slot]lifecycle.Stats {
	out := make(map[*slot]lifecycle.Stats)
	for s, srv := range h.live() {
		if st, ok := srv.Worker.Stats(queryTimeout); ok {
			out[s] = st
		}
	}
	return out
}

// awaitTarget polls the workers (every 2 ms, up to 1 s) until one has a
// request in stage k; it returns the last snapshot and the slots that have
// one. The zero k returns one snapshot.
func (h *inproc) awaitTarget(k stageKey, stop <-chan struct{}) (map[*slot]lifecycle.Stats, []*slot) {
	deadline := time.Now().Add(time.Second)
	for {
		snap := h.snapshot()
		var hit []*slot
		for s, st := range snap {
			if k.Stage != lifecycle.StageNone && s.role == k.Role && st.Stages[k.Stage] > 0 {
				hit = append(hit, s)
			}
		}
		if k.Stage == lifecycle.StageNone || len(hit) > 0 || time.Now().After(deadline) {
			sort.Slice(hit, func(i, j int) bool { return hit[i].i < hit[j].i })
			return snap, hit
		}
		select {
		case <-stop:
			return snap, nil
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// strike runs one chaos action.
func (h *inproc) strike(a action, stop <-chan struct{}) {
	snap, hit := h.awaitTarget(a.Target, stop)
	occupied := map[stageKey]bool{}
	for _, st := range snap {
		for s, n := range st.Stages {
			if n > 0 {
				occupied[stageKey{st.Role, s}] = true
			}
		}
	}
	for k := range occupied {
		h.coverage.add(fmt.Sprintf("%-24s %s", k, a.Kind), 1)
	}
	target := "no target"
	if a.Target.Stage != lifecycle.StageNone {
		if len(hit) > 0 {
			h.actions.add("targeted strikes that found their stage", 1)
			target = fmt.Sprintf("target %s found on %s", a.Target, hit[0].name)
		} else {
			h.actions.add("targeted strikes whose stage stayed empty for 1 s", 1)
			target = fmt.Sprintf("target %s not found", a.Target)
		}
	}
	var occ []string
	for k := range occupied {
		occ = append(occ, k.String())
	}
	sort.Strings(occ)
	h.logf("%s (%s; occupied: %s)", a.describe(), target, strings.Join(occ, ", "))
	switch a.Kind {
	case actBurst:
		h.mu.Lock()
		h.bursts = append(h.bursts, burst{end: time.Now().Add(a.Dur), scope: a.Scope, cfg: a.Fault})
		h.mu.Unlock()
		h.applyFaults()
		h.actions.add("burst "+a.Label, 1)
	case actNetFreeze:
		n := h.net.FreezeAll(a.Dur)
		h.actions.add("net freeze (all connections)", 1)
		h.actions.add("  connections frozen", n)
	case actNetReset:
		n := h.net.ResetAll()
		h.actions.add("net reset (all connections)", 1)
		h.actions.add("  connections reset", n)
	case actNetRandom:
		cfg := a.Net
		cfg.Seed = derive(h.seed, 4)
		h.net.SetConfig(cfg)
		h.netEnd = time.Now().Add(a.Dur)
		h.actions.add("net random window", 1)
	case actKill:
		cands := hit
		if len(cands) == 0 {
			cands = h.slots
		}
		s := cands[a.Pick%uint64(len(cands))]
		if a.Crash {
			// The peers hear nothing from the dying worker (no ABORT, no
			// FIN) until the freeze ends: they must notice the silence.
			h.net.FreezeAll(a.Freeze)
			h.actions.add("crash+restart "+s.role.String()+" (KV connections frozen first)", 1)
		} else {
			h.actions.add("kill+restart "+s.role.String(), 1)
		}
		h.logf("  %s goes down", s.label())
		h.kill(s, a.Dur)
		h.logf("  %s is up", s.label())
	}
}

// kill stops slot s's worker (its live requests fail with "shutdown"),
// keeps it down for downtime, restarts it on the same addresses and waits
// until the router uses it again.
func (h *inproc) kill(s *slot, downtime time.Duration) {
	h.mu.Lock()
	srv, label := s.srv, s.label()
	s.srv, s.fb = nil, nil
	h.mu.Unlock()
	if srv == nil {
		return
	}
	if st, ok := srv.Worker.Stats(queryTimeout); ok {
		h.maxes.observeStats(st, label)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := srv.Shutdown(ctx)
	cancel()
	if err != nil {
		h.violate("shutdown "+label, fmt.Sprintf("shutdown of %s: %v", label, err))
	}
	time.Sleep(downtime) // the schedule's downtime, drawn from the seed
	h.mu.Lock()
	s.life++
	h.mu.Unlock()
	// The ports were just released; binding them again may take a moment.
	var startErr error
	if state, ok := waitUntil(5*time.Second, func() (bool, string) {
		startErr = h.start(s)
		return startErr == nil, fmt.Sprint(startErr)
	}); !ok {
		h.violate("restart "+s.name, fmt.Sprintf("restart of %s on %s failed: %s", s.name, s.addr, state))
		return
	}
	url := "http://" + s.addr
	if state, ok := waitUntil(10*time.Second, func() (bool, string) {
		for _, w := range h.router.Router.Workers() {
			if w.URL == url {
				return w.Healthy, w.LastError
			}
		}
		return false, "router does not list " + url
	}); !ok {
		h.violate("router "+s.name, fmt.Sprintf("router did not use %s again within 10 s of its restart: %s", s.name, state))
	}
}

// chaos runs the seeded schedule until stop.
func (h *inproc) chaos(gen *scheduleGen, stop <-chan struct{}) {
	for {
		a := gen.next()
		if !h.pace(time.Now().Add(a.Gap), stop) {
			return
		}
		h.strike(a, stop)
	}
}

// monitor checks, every 100 ms until stop, that no request has been in a
// stage longer than its bound on any worker, recording the longest times
// seen; a violation is recorded with the request's history.
func (h *inproc) monitor(stop <-chan struct{}) {
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		for s, srv := range h.live() {
			asked := time.Now()
			st, ok := srv.Worker.Stats(queryTimeout)
			h.mu.Lock()
			label := s.label()
			h.mu.Unlock()
			took, lag := time.Since(asked), h.lag.Max()
			if h.current(s) == srv && (!ok || took > loopAnswerBound+lag) {
				h.violate("loop "+label, fmt.Sprintf("%s: worker loop took %s to answer a query (ok %v), bound %s + scheduling lag %s",
					label, took.Round(time.Millisecond), ok, loopAnswerBound, lag.Round(time.Millisecond)))
			}
			if !ok {
				continue
			}
			h.maxes.observeStats(st, label)
			for stage, age := range st.OldestInStage {
				b := h.dl.stageBound(st.Role, stage)
				if age <= b.Bound+lag {
					continue
				}
				key := fmt.Sprintf("stage %s %s", label, stage)
				diag := ""
				if list, ok := srv.Worker.Requests(queryTimeout); ok {
					var late []lifecycle.RequestInfo
					for _, ri := range list {
						if ri.Stage == stage.String() && ri.InStageSecs > b.Bound.Seconds() {
							if full, found, ok := srv.Worker.Request(ri.RID, queryTimeout); ok && found {
								ri = full
							}
							late = append(late, ri)
						}
					}
					diag = describeRequests(late)
				}
				h.violate(key, fmt.Sprintf("liveness: on %s a request has been in stage %s for %s, bound %s (%s) + scheduling lag %s\n%s",
					label, stage, age.Round(time.Millisecond), b.Bound, b.Why, lag.Round(time.Millisecond), diag))
			}
		}
	}
}

// diagnose describes every live request on every worker, with history.
func (h *inproc) diagnose() string {
	var b strings.Builder
	for s, srv := range h.live() {
		list, ok := srv.Worker.Requests(queryTimeout)
		if !ok {
			fmt.Fprintf(&b, "  %s: loop did not answer\n", s.name)
			continue
		}
		for i, ri := range list {
			if full, found, ok := srv.Worker.Request(ri.RID, queryTimeout); ok && found {
				list[i] = full
			}
		}
		fmt.Fprintf(&b, "  %s: %d live requests\n%s", s.name, len(list), describeRequests(list))
	}
	return b.String()
}

// injected sums fault.Injected over every Backend ever made and the Net.
func (h *inproc) injected() map[string]uint64 {
	h.mu.Lock()
	fbs := slices.Clone(h.allFaults)
	h.mu.Unlock()
	out := map[string]uint64{}
	for _, fb := range fbs {
		for k, v := range fb.Injected() {
			out[k] += v
		}
	}
	for k, v := range h.net.Injected() {
		out["net "+k] += v
	}
	return out
}

// setUp starts the reference worker, the four workers and the router.
func (h *inproc) setUp() {
	t := h.t
	m, err := sim.New(sim.Config{Geometry: simGeometry, ContextLen: simContext})
	if err != nil {
		t.Fatal(err)
	}
	mc := h.dl.machine(lifecycle.RoleColocated)
	mc.PrefixCache = false // the reference answers without a cache
	h.ref, err = cluster.StartWorker(cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.ref.Shutdown(ctx); err != nil {
			t.Errorf("reference shutdown: %v", err)
		}
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if h.router != nil {
			if err := h.router.Shutdown(ctx); err != nil {
				t.Errorf("router shutdown: %v", err)
			}
		}
		for _, srv := range h.live() {
			if err := srv.Shutdown(ctx); err != nil {
				t.Errorf("worker shutdown: %v", err)
			}
		}
	})
	for i, role := range []lifecycle.Role{lifecycle.RolePrefill, lifecycle.RolePrefill, lifecycle.RoleDecode, lifecycle.RoleDecode} {
		s := &slot{i: i, role: role, name: fmt.Sprintf("%s-%d", role, i%2), addr: "127.0.0.1:0"}
		if role == lifecycle.RolePrefill {
			s.kvAddr = "127.0.0.1:0"
		}
		h.slots = append(h.slots, s)
		if err := h.start(s); err != nil {
			t.Fatal(err)
		}
	}
	// No admission: the chaos wants the workers' pools and queues full, so
	// that faults strike every stage; the router would shed that load. The
	// faults open KV path breakers (as they should); their cool-down is
	// scaled to the test's (leases of 400 ms, heartbeats of 100 ms), so that
	// the fleet is whole again within the recovery bound below.
	h.spans = tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ro := cluster.RouterOptions{Addr: "127.0.0.1:0", Info: m.Info(), Tokenizer: m.Tokenizer(), HealthInterval: chaosHealthInterval,
		RouterTuning: cluster.RouterTuning{Admission: &router.Admission{}, BreakerCooldown: 2 * time.Second}, Tracer: tp}
	for _, s := range h.slots {
		if s.role == lifecycle.RolePrefill {
			ro.Prefill = append(ro.Prefill, "http://"+s.addr)
		} else {
			ro.Decode = append(ro.Decode, "http://"+s.addr)
		}
	}
	h.router, err = cluster.StartRouter(ro)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitReady(context.Background(), h.router.Router, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestChaosInProcess runs router + 2 prefill + 2 decode workers in-process
// under seeded random traffic (completions and chat, streaming or not,
// clients that disconnect or abort mid-stream) while a chaos schedule
// injects KV channel faults (drop, duplicate, reorder, corrupt, delay,
// reset, stall), freezes and resets KV connections, and kills and restarts
// workers, each action aimed at a request phase. It then checks liveness,
// no leak, same answer and honest signals (see the package doc). It runs
// alone (not t.Parallel): it keeps the CPU busy, and the tests of
// processes, which mostly wait, run two at a time after it.
func TestChaosInProcess(t *testing.T) {
	seed := seedFor(t)
	nReq, nClients := sizes(inProcessRequests(), 10000, 32)
	start := time.Now()
	h := &inproc{t: t, seed: seed, began: start, dl: chaosDeadlines, hc: &http.Client{Timeout: 10 * time.Second},
		net:   fault.NewNet(fault.NetConfig{Seed: derive(seed, 4)}, nil),
		maxes: newStageMax(), actions: newCounts(), coverage: newCounts(), seen: map[string]bool{}}
	defer h.hc.CloseIdleConnections()
	h.lag = startLagProbe()
	defer h.lag.Stop()
	h.setUp()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\n(seed %d; reproduce: %s)", fmt.Sprintf(format, args...), seed, reproduce(t, seed))
	}

	specs := genRequests(newRand(seed, 1), nReq, genOptions{MaxPrompt: 700, MaxTokens: 64, PDisconnect: 0.15, PAbort: 0.15,
		MaxThink: 20 * time.Millisecond})
	gen := &scheduleGen{rng: newRand(seed, 2), killWeight: 0.2, slots: len(h.slots)}
	bound := h.dl.clientBound()
	t.Logf("%d requests, %d clients, client bound %s = %d × (max-request-time %s + lease %s + grace %s + 2 ticks) + %s",
		nReq, nClients, bound, routerAttempts, h.dl.MaxRequest, h.dl.lease(), peerFailureGrace, clientSlack)

	cl := newClient()
	// After a Retry-After the client pauses as long as a not_ready worker
	// takes to be ready again at the test's health interval (two checks
	// in a row pass, fleet.DefaultSuccessThreshold).
	cl.maxPause = fleet.DefaultSuccessThreshold * chaosHealthInterval
	defer cl.close()
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { h.monitor(stop) })
	bg.Go(func() { h.chaos(gen, stop) })
	results := runClients(specs, nClients, func(s *reqSpec) result {
		return cl.do(h.router.URL, s, bound, h.diagnose)
	})
	trafficDone := time.Since(start)
	close(stop)
	bg.Wait()

	// Faults off; let the system settle.
	h.net.SetConfig(fault.NetConfig{Seed: derive(seed, 4)})
	h.net.ThawAll()
	h.mu.Lock()
	h.bursts = nil
	h.mu.Unlock()
	h.applyFaults()

	// Liveness of every client request.
	labels, maxElapsed := tally(results, bound, fail)

	// The deployment recovers: the router uses every worker again and
	// fault-free requests succeed.
	if err := cluster.WaitReady(context.Background(), h.router.Router, 10*time.Second); err != nil {
		fail("after the chaos: %v", err)
	}
	probes := genRequests(newRand(seed, 5), 16, genOptions{MaxPrompt: 300, MaxTokens: 32})
	for _, p := range probes {
		p.N += len(specs) // distinct reference keys
	}
	probeResults := runClients(probes, 4, func(s *reqSpec) result {
		return retryOK(func() result { return cl.do(h.router.URL, s, bound, h.diagnose) })
	})
	for _, r := range probeResults {
		if r.Kind != resOK {
			fail("after the chaos, fault-free %s failed %d times, last: %s %s", r.Spec, probeAttempts, r.label(), r.Message)
		}
	}

	// Same answer.
	ref := newReference(cl, h.ref.URL)
	full, prefix, mismatches := sameAnswer(ref, append(slices.Clone(results), probeResults...), 8)
	for _, m := range mismatches {
		fail("same answer: %s", m)
	}

	// No leak: every worker drains.
	leaks := 0
	quiet := h.dl.clientBound()
	for s, srv := range h.live() {
		// Pages held with no live request left can never be freed: give
		// up on them after a second instead of waiting out the bound.
		var orphaned time.Time
		state, ok := waitUntil(quiet, func() (bool, string) {
			st, ok := srv.Worker.Stats(queryTimeout)
			if !ok {
				return false, "loop did not answer"
			}
			state := fmt.Sprintf("pages used %d, live %d, pending opens %d, stages %v", st.PagesUsed, st.Live, st.PendingOpens, st.Stages)
			switch {
			case st.Live > 0 || st.PagesUsed == 0:
				orphaned = time.Time{}
			case orphaned.IsZero():
				orphaned = time.Now()
			case time.Since(orphaned) > time.Second:
				return true, state + " (no live request holds them)"
			}
			return st.PagesUsed == 0 && st.Live == 0 && st.PendingOpens == 0, state
		})
		if !ok || !orphaned.IsZero() {
			leaks++
			fail("no leak: %s did not drain (waited up to %s): %s\n%s", s.label(), quiet, state, h.diagnose())
		}
	}
	for s, srv := range h.live() {
		state, ok := waitUntil(h.dl.TombstoneTTL+time.Second+stageSlack, func() (bool, string) {
			st, ok := srv.Worker.Stats(queryTimeout)
			if !ok {
				return false, "loop did not answer"
			}
			return st.Tombstones == 0, fmt.Sprintf("%d tombstones", st.Tombstones)
		})
		if !ok {
			leaks++
			fail("no leak: %s kept tombstones past the TTL (%s): %s", s.label(), h.dl.TombstoneTTL, state)
		}
	}

	// Every failed request's trace names its outcome and the side and
	// stage that failed first, on the router's request span.
	failedSpans, unnamed := 0, 0
	for _, sp := range h.spans.GetSpans() {
		if sp.Name != "router.request" {
			continue
		}
		at := map[string]string{}
		for _, a := range sp.Attributes {
			at[string(a.Key)] = a.Value.Emit()
		}
		if o := at["pdserve.outcome"]; o == "ok" || o == "aborted_client" || o == "" {
			continue
		}
		failedSpans++
		if at["pdserve.cause.role"] == "" || at["pdserve.cause.stage"] == "" || at["pdserve.cause.outcome"] == "" || sp.Status.Code != codes.Error {
			unnamed++
			if unnamed <= 5 {
				fail("trace %s: failed request's span without its first failure: %v (status %v)", sp.SpanContext.TraceID(), at, sp.Status)
			}
		}
	}
	t.Logf("traces: %d failed requests, each naming its first failure's outcome, side and stage", failedSpans)

	// Honest signals, scraped over HTTP.
	for s, srv := range h.live() {
		if bad := quietSignals(h.hc, srv.URL); bad != "" {
			leaks++
			fail("honest signals: %s at quiescence: %s", s.label(), bad)
		}
	}

	// Liveness per stage.
	for s, srv := range h.live() {
		if st, ok := srv.Worker.Stats(queryTimeout); ok {
			h.maxes.observeStats(st, s.label())
		}
	}
	table, over := h.maxes.report(h.dl, h.lag.Max())
	for _, v := range over {
		fail("liveness: %s", v)
	}
	h.vmu.Lock()
	for _, v := range h.violations {
		fail("%s", v)
	}
	h.vmu.Unlock()

	// Every phase was hit by some action (in runs long enough for that to
	// be expected; shorter ones, e.g. with a small -requests, only report).
	for _, k := range requiredPhases() {
		hitBy := 0
		for _, kind := range []actionKind{actBurst, actNetFreeze, actNetReset, actNetRandom, actKill} {
			hitBy += h.coverage.get(fmt.Sprintf("%-24s %s", k, kind))
		}
		switch {
		case hitBy > 0:
		case nReq >= minCoverageRequests:
			fail("coverage: no chaos action struck while a request was in %s", k)
		default:
			t.Logf("coverage: no chaos action struck while a request was in %s (not required under %d requests)", k, minCoverageRequests)
		}
	}

	if t.Failed() {
		h.logMu.Lock()
		t.Logf("chaos log (seed %d):\n%s", seed, strings.Join(h.chaosLog, "\n"))
		h.logMu.Unlock()
	}

	// Summary.
	inj := h.injected()
	var injs []string
	for _, k := range slices.Sorted(maps.Keys(inj)) {
		injs = append(injs, fmt.Sprintf("%s %d", k, inj[k]))
	}
	t.Logf(`chaos summary (seed %d)
%d requests (%d clients) in %s; total %s
results:
%sfaults injected (all backends and the net): %s
chaos actions:
%sstages occupied when an action struck:
%smax time in stage vs bound:
%sclient time to answer: max %s, bound %s
same answer: %d complete outputs and %d partial ones compared, %d mismatches; %d fault-free probes after the chaos
leaks found: %d`,
		seed, nReq, nClients, trafficDone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		labels, strings.Join(injs, ", "), h.actions, h.coverage, table, maxElapsed.Round(time.Millisecond), bound,
		full, prefix, len(mismatches), len(probes), leaks)
}

package metrics

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden exposition files in testdata/")

// golden compares what reg exposes with testdata/name.txt, or rewrites
// the file with -rewrite.
func golden(t *testing.T, reg *prometheus.Registry, name string) {
	t.Helper()
	path := filepath.Join("testdata", name+".txt")
	if *rewrite {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f); err != nil {
		t.Fatal(err)
	}
}

// machineRoles maps each worker API role to the lifecycle role whose stages
// it reports.
var machineRoles = map[workerapi.Role]lifecycle.Role{
	workerapi.RolePrefill:   lifecycle.RolePrefill,
	workerapi.RoleDecode:    lifecycle.RoleDecode,
	workerapi.RoleColocated: lifecycle.RoleColocated,
}

// TestWorkerExposition: a worker of each role exposes every series from the
// start (one per outcome, stage, KV direction and batch kind it can have),
// and its scrape-time gauges as the snapshot says; golden files in
// testdata/worker_<role>.txt (regenerate with -rewrite).
func TestWorkerExposition(t *testing.T) {
	for _, role := range workerapi.Roles() {
		t.Run(role.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			w, stages := exampleWorker(t, reg, role)
			observeExample(w, role, stages)
			golden(t, reg, "worker_"+role.String())
		})
	}
}

// TestWorkerExpositionSGLang: with WithSGLang a worker of each role also
// exposes SGLang's series from the start, each mapped from its pdserve
// stage or outcome; golden files testdata/worker_<role>_sglang.txt.
func TestWorkerExpositionSGLang(t *testing.T) {
	for _, role := range workerapi.Roles() {
		t.Run(role.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			w, stages := exampleWorker(t, reg, role, WithSGLang("pdserve-sim"))
			observeExample(w, role, stages)
			golden(t, reg, "worker_"+role.String()+"_sglang")
		})
	}
}

// exampleWorker registers a worker of role whose snapshot has i requests,
// oldest i s and a deadline of 10·(i+1) s in its i-th stage.
func exampleWorker(t *testing.T, reg *prometheus.Registry, role workerapi.Role, opts ...WorkerOption) (*Worker, []string) {
	t.Helper()
	var stages []string
	for _, s := range machineRoles[role].Stages() {
		stages = append(stages, s.String())
	}
	st := WorkerState{PagesUsed: 10, PagesTotal: 64, PendingOpens: 1, Tombstones: 2, Preemptions: 3, PeerAbortTombstones: 5,
		FramesDropped: map[string]uint64{"stale_gen": 4}, GenThroughput: 125.5,
		KV: KVConns{Dials: 3, Reconnects: 2, Live: 1}}
	if role == workerapi.RolePrefill {
		st.Optimistic = map[string]uint64{"started": 9, "parked": 6, "sent": 5, "fell_back": 2} // 2 in flight
		st.OptimisticKVBytes = map[string]int64{"parked": 1 << 20}
	}
	for i, s := range stages {
		st.Stages = append(st.Stages, StageState{Stage: s, Requests: i, Oldest: time.Duration(i) * time.Second,
			Deadline: time.Duration(10*(i+1)) * time.Second})
	}
	w, err := NewWorker(reg, role, stages, func() (WorkerState, bool) { return st, true }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w, stages
}

// observeExample feeds a worker one of each observation its role makes.
func observeExample(w *Worker, role workerapi.Role, stages []string) {
	w.StageTime(stages[0], 200*time.Millisecond)
	w.Finished(outcome.OK, outcome.Cause{}, 1500*time.Millisecond)
	w.Ended(1500 * time.Millisecond)
	w.Finished(outcome.TimeoutQueue, outcome.Cause{Outcome: outcome.TimeoutQueue, Stage: stages[0]}, time.Minute)
	w.Finished(outcome.AbortedClient, outcome.Cause{Outcome: outcome.AbortedClient}, time.Second)
	w.Ended(time.Second) // aborted after its first token: TTFT and E2E count it alike
	w.FirstToken(30 * time.Millisecond)
	w.FirstToken(250 * time.Millisecond)
	w.InterToken(5*time.Millisecond, 1)
	w.InterToken(30*time.Millisecond, 3) // three tokens in one event: 10 ms each for SGLang
	w.GrammarLookup(false, 3*time.Millisecond)
	w.GrammarLookup(true, 0)
	w.GrammarLookup(true, 0)
	switch role {
	case workerapi.RolePrefill:
		w.KVBytes(KVSent, 4096)
		w.Batch(BatchPrefill)
		w.Finished(outcome.TimeoutBootstrap, outcome.Cause{Outcome: outcome.TimeoutBootstrap, Stage: "bootstrap"}, 10*time.Second)
		w.KVTransfer(20*time.Millisecond, 1<<30) // 50 GiB/s
	case workerapi.RoleDecode:
		w.KVBytes(KVReceived, 4096)
		w.Batch(BatchDecode)
		// the prefill side's transfer timed out: an echo, counted by its root cause
		w.Finished(outcome.AbortedPeer, outcome.Cause{Outcome: outcome.TimeoutTransfer, Role: "prefill", Stage: "transferring"}, 31*time.Second)
	default:
		w.Batch(BatchMixed)
	}
}

// TestWorkerLoopDown: a scrape whose snapshot the loop did not answer shows
// pdserve_worker_loop_up 0 and none of the other scrape-time series.
func TestWorkerLoopDown(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewWorker(reg, workerapi.RoleDecode, nil, func() (WorkerState, bool) { return WorkerState{}, false }); err != nil {
		t.Fatal(err)
	}
	const want = `# HELP pdserve_worker_loop_up 1 if the worker loop answered this scrape, 0 if it did not in time.
# TYPE pdserve_worker_loop_up gauge
pdserve_worker_loop_up{role="decode"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pdserve_worker_loop_up", "pdserve_requests",
		"pdserve_kv_pages", "pdserve_rooms"); err != nil {
		t.Fatal(err)
	}
}

// TestRouterExposition: a PD router exposes every outcome of its answers,
// every (role, outcome) of its legs' failures, every retry cause, every
// shed reason, every worker's selections by its role's policy and the
// client-side histograms (with model_name) from the start, its scrape-time
// gauges as the state says, and counts by value; golden file
// testdata/router.txt.
func TestRouterExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewRouter(reg, RouterConfig{ModelName: "pdserve-sim",
		Roles:    []workerapi.Role{workerapi.RolePrefill, workerapi.RoleDecode},
		Workers:  map[string]workerapi.Role{"http://p0:30000": workerapi.RolePrefill, "http://d0:30001": workerapi.RoleDecode},
		Policies: map[workerapi.Role]string{workerapi.RolePrefill: "least_load", workerapi.RoleDecode: "power_of_two"},
		State: func() RouterState {
			return RouterState{
				Workers:  map[[2]string]int{{"prefill", "ready"}: 1, {"decode", "ready"}: 1, {"decode", "draining"}: 0},
				Inflight: map[string]int{"streaming": 2},
				Oldest:   map[string]time.Duration{"streaming": 1500 * time.Millisecond}, LegTimeout: 15 * time.Minute,
				Legs: []WorkerLegs{{Role: "prefill", URL: "http://p0:30000", Legs: 1},
					{Role: "decode", URL: "http://d0:30001", Legs: 3, Saturated: true}},
				Pairs:    []PairBreaker{{Prefill: "http://p0:30000", Decode: "http://d0:30001", State: 2}},
				Registry: RegistryState{Backend: "etcd", Up: false, LastSync: time.Unix(1700000000, 500000000)},
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	m.Answered(outcome.OK, PathPD)
	m.Answered(outcome.OK, PathPD)
	m.Answered(outcome.OK, PathLocal)
	m.Answered(outcome.FailedTransfer, PathPD)
	m.LegFailed(workerapi.RoleDecode, outcome.FailedTransfer)
	m.LegFailed(workerapi.RoleDecode, outcome.FailedTransfer)
	m.LegFailed(workerapi.RolePrefill, outcome.RejectedInvalid)
	m.Retried(outcome.FailedTransfer)
	m.Shed("decode_kv")
	m.Selected(workerapi.RoleDecode, "power_of_two", "http://d0:30001")
	m.PrefixMatched(workerapi.RolePrefill, 2176, 2048)
	m.PrefixMatched(workerapi.RolePrefill, 100, 0)
	m.WorkerFailed("http://d0:30001")
	m.WorkerSeen("http://d1:30001", workerapi.RoleDecode)
	m.WorkerSeen("http://gone:1", workerapi.RolePrefill)
	m.WorkerGone("http://gone:1")
	// One request: queued 2 ms, first token after 150 ms (prompt of 7
	// tokens), then 1 token after 5 ms and 3 in one chunk 30 ms later, done
	// after 1.2 s.
	m.FirstToken(150*time.Millisecond, 2*time.Millisecond, 7)
	m.Tokens(1, 0, true)
	m.Tokens(1, 5*time.Millisecond, false)
	m.Tokens(3, 30*time.Millisecond, false)
	m.Ended(1200 * time.Millisecond)
	golden(t, reg, "router")
}

// TestRegisterTwice: a second set of collectors on the same registry is an
// error, not a panic.
func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	snap := func() (WorkerState, bool) { return WorkerState{}, true }
	if _, err := NewWorker(reg, workerapi.RolePrefill, nil, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(reg, workerapi.RolePrefill, nil, snap); err == nil {
		t.Fatal("a second worker registered")
	}
	if _, err := NewRouter(reg, RouterConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewRouter(reg, RouterConfig{}); err == nil {
		t.Fatal("a second router registered")
	}
}

// TestFrontendExposition: the front end's answers by endpoint, status
// class and code, the common rejections present from the start; golden
// file testdata/frontend.txt.
func TestFrontendExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := NewFrontend(reg, "router")
	if err != nil {
		t.Fatal(err)
	}
	f.Answer("completions", 200, "")
	f.Answer("completions", 400, "unsupported_parameter")
	f.Answer("chat.completions", 413, "request_too_large")
	f.Answer("completions", 503, "no_worker")
	f.Answer("other", 404, "not_found")
	f.Answer("completions", 499, "")
	golden(t, reg, "frontend")
}

// TestPeerAuth: the refusals exposed are the snapshot's, every reason a
// series.
func TestPeerAuth(t *testing.T) {
	reg := prometheus.NewRegistry()
	snap := map[string]map[string]uint64{ChannelKV: {"bad_proof": 2, "tls": 0}, ChannelWorkerAPI: {"replayed": 1}}
	if err := NewPeerAuth(reg, "prefill", func() map[string]map[string]uint64 { return snap }); err != nil {
		t.Fatal(err)
	}
	want := `# HELP pdserve_peer_auth_failures_total Connections (kv) and requests (worker_api) a worker refused because the peer did not prove it belongs to the fleet, or failed its handshake, by reason.
# TYPE pdserve_peer_auth_failures_total counter
pdserve_peer_auth_failures_total{channel="kv",reason="bad_proof",role="prefill"} 2
pdserve_peer_auth_failures_total{channel="kv",reason="tls",role="prefill"} 0
pdserve_peer_auth_failures_total{channel="worker_api",reason="replayed",role="prefill"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestPlannerExposition: the planner's gauges after one decision and its
// counters after one change; golden file testdata/planner.txt.
func TestPlannerExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := NewPlanner(reg)
	if err != nil {
		t.Fatal(err)
	}
	p.Decided("flip", [2]int{3, 1}, [2]int{2, 2}, [2]float64{2.6, 0.4}, 12.5, 0.93)
	p.Acted("flip", "ok")
	golden(t, reg, "planner")
}

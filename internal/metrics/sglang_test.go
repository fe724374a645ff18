package metrics

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// TestSGLangFailure: every outcome a worker ends a request with, in every
// stage it can end in, counts in at most one of SGLang's PD failure
// counters, and in the one SGLang would use.
func TestSGLangFailure(t *testing.T) {
	cases := []struct {
		o     outcome.Outcome
		cause outcome.Cause
		want  string
	}{
		{outcome.OK, outcome.Cause{}, FailureNone},
		{outcome.TimeoutBootstrap, outcome.Cause{Outcome: outcome.TimeoutBootstrap, Stage: "bootstrap"}, FailureBootstrap},
		{outcome.PeerRefused, outcome.Cause{Outcome: outcome.PeerRefused, Stage: "prealloc"}, FailureBootstrap},
		{outcome.FailedIdentity, outcome.Cause{Outcome: outcome.FailedIdentity, Stage: "bootstrap"}, FailureBootstrap},
		{outcome.PeerLost, outcome.Cause{Outcome: outcome.PeerLost, Stage: "bootstrap"}, FailureBootstrap},
		{outcome.LeaseExpired, outcome.Cause{Outcome: outcome.LeaseExpired, Stage: "prealloc"}, FailureBootstrap},
		{outcome.TimeoutTransfer, outcome.Cause{Outcome: outcome.TimeoutTransfer, Stage: "awaiting_kv"}, FailureTransfer},
		{outcome.FailedTransfer, outcome.Cause{Outcome: outcome.FailedTransfer, Stage: "awaiting_kv"}, FailureTransfer},
		{outcome.TimeoutKVHold, outcome.Cause{Outcome: outcome.TimeoutKVHold, Stage: "parked"}, FailureTransfer},
		{outcome.PeerLost, outcome.Cause{Outcome: outcome.PeerLost, Stage: "transferring"}, FailureTransfer},
		{outcome.LeaseExpired, outcome.Cause{Outcome: outcome.LeaseExpired, Stage: "parked"}, FailureTransfer},
		{outcome.PeerLost, outcome.Cause{Outcome: outcome.PeerLost, Stage: "awaiting_kv"}, FailureTransfer},
		// Lost while waiting for a batch or decoding: neither queue SGLang counts.
		{outcome.PeerLost, outcome.Cause{Outcome: outcome.PeerLost, Stage: "waiting"}, FailureNone},
		{outcome.PeerLost, outcome.Cause{Outcome: outcome.PeerLost, Stage: "decoding"}, FailureNone},
		// An echo counts by its root cause, on the other side.
		{outcome.AbortedPeer, outcome.Cause{Outcome: outcome.TimeoutTransfer, Role: "prefill", Stage: "transferring"}, FailureTransfer},
		{outcome.AbortedPeer, outcome.Cause{Outcome: outcome.TimeoutBootstrap, Role: "prefill", Stage: "bootstrap"}, FailureBootstrap},
		{outcome.AbortedPeer, outcome.Cause{Outcome: outcome.AbortedClient, Role: "router"}, FailureNone},
		{outcome.AbortedClient, outcome.Cause{Outcome: outcome.AbortedClient, Stage: "awaiting_kv"}, FailureNone},
		{outcome.TimeoutQueue, outcome.Cause{Outcome: outcome.TimeoutQueue, Stage: "prealloc"}, FailureNone},
		{outcome.TimeoutRequest, outcome.Cause{Outcome: outcome.TimeoutRequest, Stage: "awaiting_kv"}, FailureNone},
		{outcome.RejectedCapacity, outcome.Cause{Outcome: outcome.RejectedCapacity}, FailureNone},
		{outcome.FailedInternal, outcome.Cause{Outcome: outcome.FailedInternal, Stage: "prefilling"}, FailureNone},
		{outcome.Shutdown, outcome.Cause{Outcome: outcome.Shutdown, Stage: "transferring"}, FailureNone},
		{outcome.Draining, outcome.Cause{Outcome: outcome.Draining}, FailureNone},
		// A cause not known: the outcome alone decides.
		{outcome.TimeoutBootstrap, outcome.Cause{}, FailureBootstrap},
	}
	for _, tc := range cases {
		if got := SGLangFailure(tc.o, tc.cause); got != tc.want {
			t.Errorf("SGLangFailure(%s, %+v) = %q, want %q", tc.o, tc.cause, got, tc.want)
		}
	}
}

// TestSGLangStagesExist: every stage name the SGLang gauges read is a
// stage of some role's machine, so none silently reads 0 forever.
func TestSGLangStagesExist(t *testing.T) {
	var all []string
	for _, r := range []lifecycle.Role{lifecycle.RolePrefill, lifecycle.RoleDecode, lifecycle.RoleColocated} {
		for _, s := range r.Stages() {
			all = append(all, s.String())
		}
	}
	for _, name := range []string{"bootstrap", "parked", "transferring", "prealloc", "awaiting_kv",
		"prefilling", "decoding", "waiting", "queued", "preempted"} {
		if !slices.Contains(all, name) {
			t.Errorf("stage %q read by the SGLang gauges is no lifecycle stage (%v)", name, all)
		}
	}
}

// TestNoNegativeLatency: a duration below zero (a clock that stepped back)
// is observed as zero by every latency histogram, pdserve's and SGLang's,
// and a transfer that took no time is not observed at all (as SGLang).
func TestNoNegativeLatency(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := WorkerState{PagesTotal: 1, Stages: []StageState{{Stage: "prealloc", Oldest: -time.Second, Deadline: -time.Second}},
		GenThroughput: -3}
	w, err := NewWorker(reg, workerapi.RoleDecode, []string{"prealloc"}, func() (WorkerState, bool) { return st, true },
		WithSGLang("m"))
	if err != nil {
		t.Fatal(err)
	}
	w.StageTime("prealloc", -time.Second)
	w.Finished(outcome.OK, outcome.Cause{}, -time.Second)
	w.Ended(-time.Second)
	w.FirstToken(-time.Second)
	w.InterToken(-time.Second, 2)
	w.KVTransfer(-time.Second, 4096)
	w.KVTransfer(0, 4096)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				if h.GetSampleSum() < 0 {
					t.Errorf("%s: sum %v", mf.GetName(), h.GetSampleSum())
				}
				if strings.HasPrefix(mf.GetName(), "sglang:kv_transfer_") {
					if h.GetSampleCount() != 0 {
						t.Errorf("%s: %d observations of a transfer that took no time", mf.GetName(), h.GetSampleCount())
					}
				} else if h.GetSampleCount() > 0 {
					seen++
				}
			}
			if g := m.GetGauge(); g != nil && g.GetValue() < 0 {
				t.Errorf("%s: %v", mf.GetName(), g.GetValue())
			}
		}
	}
	if seen != 7 { // stage, e2e ×2, ttft ×2, itl ×2
		t.Fatalf("%d latency histograms observed, want 7", seen)
	}
}

// TestSGLangOffByDefault: without WithSGLang a worker exposes no sglang:
// series at all.
func TestSGLangOffByDefault(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewWorker(reg, workerapi.RolePrefill, []string{"bootstrap"},
		func() (WorkerState, bool) { return WorkerState{}, true }); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "sglang:") {
			t.Errorf("%s exposed without WithSGLang", mf.GetName())
		}
	}
}

// TestSGLangGaugesFollowSnapshot: the SGLang queue gauges are the stage
// counts of the snapshot read at each scrape, never kept apart from them.
func TestSGLangGaugesFollowSnapshot(t *testing.T) {
	st := WorkerState{PagesTotal: 8, Stages: []StageState{{Stage: "bootstrap"}, {Stage: "parked"}, {Stage: "transferring"}}}
	reg := prometheus.NewRegistry()
	if _, err := NewWorker(reg, workerapi.RolePrefill, nil, func() (WorkerState, bool) { return st, true },
		WithSGLang("m")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{3, 0, 5} {
		st.Stages[0].Requests, st.Stages[1].Requests, st.Stages[2].Requests = n, n, 1
		st.PagesUsed = n
		want := strings.NewReplacer("N", itoa(n), "I", itoa(n+1), "U", ftoa(float64(n)/8)).Replace(`
# HELP sglang:num_prefill_bootstrap_queue_reqs The number of requests in the prefill bootstrap queue.
# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge
sglang:num_prefill_bootstrap_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} N
# HELP sglang:num_prefill_inflight_queue_reqs The number of requests in the prefill inflight queue.
# TYPE sglang:num_prefill_inflight_queue_reqs gauge
sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} I
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} U
`)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sglang:num_prefill_bootstrap_queue_reqs",
			"sglang:num_prefill_inflight_queue_reqs", "sglang:token_usage"); err != nil {
			t.Fatalf("%d requests: %v", n, err)
		}
	}
}

// TestRate: the sliding-window rate counts what was added in the last
// RateWindow, over the time it has seen, and falls to zero when idle.
func TestRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var r Rate
	if got := r.PerSecond(t0); got != 0 {
		t.Fatalf("before any time passed: %v", got)
	}
	r.Add(t0, 100)
	if got := r.PerSecond(t0.Add(time.Millisecond)); got != 100 {
		t.Fatalf("100 in the first millisecond: %v/s, want 100 (over at least one slot, 1 s)", got)
	}
	if got := r.PerSecond(t0.Add(2 * time.Second)); got != 50 {
		t.Fatalf("100 in the first 2 s: %v/s, want 50", got)
	}
	for i := 1; i <= 200; i++ { // one every 100 ms for 20 s: 10/s
		r.Add(t0.Add(time.Duration(i)*100*time.Millisecond), 1)
	}
	if got := r.PerSecond(t0.Add(20*time.Second + 50*time.Millisecond)); got < 9.9 || got > 10.1 {
		t.Fatalf("10/s for 20 s: %v/s", got)
	}
	if got := r.PerSecond(t0.Add(40 * time.Second)); got != 0 {
		t.Fatalf("idle for 20 s: %v/s, want 0", got)
	}
	// A clock that steps back counts as the last time seen: no negative rate.
	r.Add(t0.Add(41*time.Second), 30)
	if got := r.PerSecond(t0.Add(30 * time.Second)); got < 0 {
		t.Fatalf("after the clock stepped back: %v/s", got)
	}
	at := t0.Add(42 * time.Second)
	before := r.PerSecond(at)
	r.Add(at, -5)
	if got := r.PerSecond(at); got != before || got <= 0 {
		t.Fatalf("a negative add changed the rate from %v/s to %v/s", before, got)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

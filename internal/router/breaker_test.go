package router

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// pairState is the breaker state of (p, d) as /debug/pairs lists it.
func pairState(t *testing.T, r *Router, p, d *fakeWorker) PairStatus {
	t.Helper()
	for _, ps := range r.Pairs() {
		if ps.Prefill == p.url() && ps.Decode == d.url() {
			return ps
		}
	}
	t.Fatalf("no pair %s → %s", p.host, d.host)
	return PairStatus{}
}

// gaugeValue reads a gauge series from the router's registry.
func gaugeValue(t *testing.T, tr *testRouter, name string, labels ...string) float64 {
	t.Helper()
	return series(t, tr.reg, name, labels...).GetGauge().GetValue()
}

// TestPairBreaker: consecutive KV path failures of one (prefill, decode)
// pair (each retried on the other prefill worker, so no client sees them)
// open its breaker: the pair is skipped, though both workers are healthy
// and stay ready. After the cool-down the pair is half-open and takes one
// request, the probe, and no other while it runs; the probe's success
// closes it. A failed probe opens it again.
func TestPairBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 1, 0, withPolicy(PolicyRoundRobin))
		defer tr.r.Close()
		p0, d := tr.prefill[0], tr.decode[0]
		var broken atomic.Bool
		broken.Store(true)
		d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			if broken.Load() && b.PrefillKVAddr == "prefill0:7000" {
				w.fail(workerapi.OutcomeError(outcome.FailedTransfer, "KV checksum mismatch", outcome.Cause{}))
				return
			}
			okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
		})
		p0.setLeg(untilAborted)
		for i := range 6 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("r%d", i)); a.err != nil {
				t.Fatalf("request %d: %+v", i, a.err)
			}
		}
		ps := pairState(t, tr.r, p0, d)
		if ps.State != BreakerOpen || !strings.Contains(ps.Reason, "failed_transfer") {
			t.Fatalf("pair p0 → d after 3 failures: %+v, want open", ps)
		}
		if tr.r.Fleet().Workers("prefill")[0].State() != fleet.StateNotReady {
			// p0's only path is open: held out of pairing, in a load tick.
			advance(150 * time.Millisecond)
		}
		if st := tr.r.Fleet().Workers("prefill")[0].Status(); st.State != fleet.StateNotReady ||
			!strings.HasPrefix(st.Held, heldPrefix) || !strings.Contains(st.Held, "failed_transfer") {
			t.Fatalf("prefill0 with every path open: %+v, want not_ready, held with the reason", st)
		}
		if v := gaugeValue(t, tr, "pdserve_router_pair_breaker_state", "prefill", p0.url(), "decode", d.url()); v != 2 {
			t.Errorf("breaker gauge %v, want 2 (open)", v)
		}
		p0Legs := len(must(p0.received()))
		for i := range 4 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("s%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if n := len(must(p0.received())); n != p0Legs {
			t.Fatalf("the open pair got %d more legs", n-p0Legs)
		}
		// Cool-down over: half-open, p0 released, one probe at a time.
		advance(DefaultBreakerCooldown)
		if ps := pairState(t, tr.r, p0, d); ps.State != BreakerHalfOpen {
			t.Fatalf("after the cool-down: %+v, want half_open", ps)
		}
		if st := tr.r.Fleet().Workers("prefill")[0].State(); st != fleet.StateReady {
			t.Fatalf("prefill0 after the cool-down: %s, want ready", st)
		}
		broken.Store(false)
		release := make(chan struct{})
		p0.setLeg(func(ctx context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
			select {
			case <-release:
				w.prefillOK(b)
			case <-ctx.Done():
			}
		})
		d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			if b.PrefillKVAddr == "prefill0:7000" {
				select { // the KV arrives once prefill0 is released
				case <-release:
				case <-ctx.Done():
					return
				}
			}
			okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
		})
		probe := make(chan answer, 1)
		for i := 0; len(must(p0.received())) == p0Legs; i++ {
			if i == 4 {
				t.Fatal("no request probed the half-open pair")
			}
			go func() { probe <- generate(t.Context(), tr.r, fmt.Sprintf("probe%d", i)) }()
			synctest.Wait()
			if len(must(p0.received())) == p0Legs {
				if a := <-probe; a.err != nil {
					t.Fatal(a.err)
				}
			}
		}
		for i := range 4 { // while the probe runs, nothing else takes the pair
			if a := generate(t.Context(), tr.r, fmt.Sprintf("during%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if n := len(must(p0.received())); n != p0Legs+1 {
			t.Fatalf("the half-open pair took %d requests, want the probe only", n-p0Legs)
		}
		close(release)
		if a := <-probe; a.err != nil {
			t.Fatalf("probe: %+v", a.err)
		}
		if ps := pairState(t, tr.r, p0, d); ps.State != BreakerClosed {
			t.Fatalf("after the probe's success: %+v, want closed", ps)
		}
		// Broken again: three failures open it; after the cool-down a failed
		// probe opens it again at once.
		broken.Store(true)
		d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			if broken.Load() && b.PrefillKVAddr == "prefill0:7000" {
				w.fail(workerapi.OutcomeError(outcome.PeerLost, "KV connection lost", outcome.Cause{}))
				return
			}
			okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
		})
		p0.setLeg(untilAborted)
		for i := 0; pairState(t, tr.r, p0, d).State != BreakerOpen; i++ {
			if i == 10 {
				t.Fatal("the pair did not open again")
			}
			if a := generate(t.Context(), tr.r, fmt.Sprintf("b%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		advance(DefaultBreakerCooldown + 150*time.Millisecond) // and a load tick releases prefill0
		for i := 0; pairState(t, tr.r, p0, d).State == BreakerHalfOpen; i++ {
			if i == 10 {
				t.Fatalf("no probe: %+v, prefill0 %+v", pairState(t, tr.r, p0, d), tr.r.Fleet().Workers("prefill")[0].Status())
			}
			if a := generate(t.Context(), tr.r, fmt.Sprintf("c%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if ps := pairState(t, tr.r, p0, d); ps.State != BreakerOpen || !strings.Contains(ps.Reason, "peer_lost") {
			t.Fatalf("after a failed probe: %+v, want open", ps)
		}
	})
}

// TestRefusedDecodeNeverPaired: a decode worker whose health answer reports
// its KV path to the only prefill worker refused (another --kv-auth) is
// not ready from its first check, with the refusal as the reason, and never
// gets a leg; the pair is open. The router named the prefill's KV address
// in the check. Once the decode worker reports the path up, it serves.
func TestRefusedDecodeNeverPaired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refused atomic.Bool
		refused.Store(true)
		var query atomic.Value
		query.Store("")
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		bad := &fakeWorker{role: workerapi.RoleDecode, host: "decode9", leg: okLeg(workerapi.RoleDecode)}
		bad.setReport(func(r *http.Request) workerapi.Health {
			q := r.URL.Query().Get(workerapi.HealthQueryKVPeers)
			query.Store(q)
			h := workerapi.Health{Status: workerapi.HealthOK, Role: workerapi.RoleDecode}
			if q == "" {
				return h
			}
			state := workerapi.KVPathUp
			if refused.Load() {
				state = workerapi.KVPathRefused
			}
			h.KVPaths = []workerapi.KVPath{{Addr: "prefill0:7000", State: state, Refusal: "auth",
				Reason: "auth token mismatch"}}
			return h
		})
		tr.net.add(bad.host, bad)
		if _, err := tr.r.Fleet().Registry().(*registry.Static).Add("decode", bad.url()); err != nil {
			t.Fatal(err)
		}
		advance(10 * time.Millisecond) // the new worker is checked at once
		w := workerNamed(t, tr.r, bad.url())
		if st := w.Status(); st.State != fleet.StateNotReady || !strings.Contains(st.LastError, "auth token mismatch") {
			t.Fatalf("decode with the wrong --kv-auth after its first check: %+v", st)
		}
		if q := query.Load(); q != "prefill0:7000" {
			t.Errorf("kv_peers %q, want the prefill's KV address", q)
		}
		if ps := pairState(t, tr.r, tr.prefill[0], bad); ps.State != BreakerOpen || !strings.Contains(ps.Reason, "auth token mismatch") {
			t.Errorf("pair: %+v", ps)
		}
		for i := range 6 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("r%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
			advance(time.Second)
		}
		if n := len(must(bad.received())); n != 0 {
			t.Fatalf("the refused decode worker got %d legs", n)
		}
		// Fixed (restarted with the right secret): up, closed, ready.
		refused.Store(false)
		advance(5 * time.Second)
		if st := w.State(); st != fleet.StateReady {
			t.Fatalf("decode reporting its path up: %s (%s)", st, w.Status().LastError)
		}
		if ps := pairState(t, tr.r, tr.prefill[0], bad); ps.State != BreakerClosed {
			t.Errorf("pair after the report: %+v", ps)
		}
		for i := range 6 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("ok%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if n := len(must(bad.received())); n == 0 {
			t.Fatal("the fixed decode worker got no leg")
		}
	})
}

// TestUnreachablePathsHoldWorker: a decode worker that reports every KV
// path unreachable (its network to the prefill workers is down) is held
// out of pairing, not_ready with the reason, its legs in flight going on;
// when it reports a path up again it is released at once.
func TestUnreachablePathsHoldWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 2, 0, nil)
		defer tr.r.Close()
		var cut atomic.Bool
		cut.Store(true)
		d0 := tr.decode[0]
		d0.setReport(func(r *http.Request) workerapi.Health {
			h := workerapi.Health{Status: workerapi.HealthOK, Role: workerapi.RoleDecode}
			for _, a := range strings.Split(r.URL.Query().Get(workerapi.HealthQueryKVPeers), ",") {
				if a == "" {
					continue
				}
				p := workerapi.KVPath{Addr: a, State: workerapi.KVPathUp}
				if cut.Load() {
					p.State, p.Reason = workerapi.KVPathUnreachable, "kv connect "+a+": connection timed out"
				}
				h.KVPaths = append(h.KVPaths, p)
			}
			return h
		})
		inflight := make(chan answer, 1)
		d0.setLeg(after(30*time.Second, okLeg(workerapi.RoleDecode)))
		go func() { inflight <- generate(t.Context(), tr.r, "inflight") }() // round robin: lands on d1 or d0
		synctest.Wait()
		tr.r.CheckNow()
		advance(150 * time.Millisecond)
		w := workerNamed(t, tr.r, d0.url())
		st := w.Status()
		if st.State != fleet.StateNotReady || !strings.HasPrefix(st.Held, heldPrefix) || !strings.Contains(st.Held, "connection timed out") {
			t.Fatalf("decode0 with every path unreachable: %+v", st)
		}
		select {
		case <-w.Down():
			t.Fatal("holding the worker failed its legs in flight")
		default:
		}
		code, body := routerHealth(t, tr.r)
		if code != http.StatusOK || !strings.Contains(fmt.Sprint(body), "connection timed out") {
			t.Errorf("router /health %d %v: want ok, naming the held worker's reason", code, body)
		}
		for i := range 4 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("r%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		cut.Store(false)
		tr.r.CheckNow()
		advance(150 * time.Millisecond)
		if st := w.State(); st != fleet.StateReady {
			t.Fatalf("decode0 reporting its paths up: %s", st)
		}
		if a := <-inflight; a.err != nil {
			t.Fatalf("the request in flight: %+v", a.err)
		}
	})
}

// workerNamed returns the router's worker at url.
func workerNamed(t *testing.T, r *Router, url string) *fleet.Worker {
	t.Helper()
	for _, w := range r.Fleet().Workers("") {
		if w.URL() == url {
			return w
		}
	}
	t.Fatalf("no worker %s", url)
	return nil
}

// TestEveryPairOpenPanics: when every pair is open by its own failures (a
// network blip on the only pair), the router does not hold its last workers
// nor refuse every request: it uses the open pair anyway (panic mode), and
// a success closes it.
func TestEveryPairOpenPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		var broken atomic.Bool
		broken.Store(true)
		tr.prefill[0].setLeg(untilAborted)
		tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			if broken.Load() {
				w.fail(workerapi.OutcomeError(outcome.FailedTransfer, "KV checksum mismatch", outcome.Cause{}))
				return
			}
			okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
		})
		for i := 0; pairState(t, tr.r, tr.prefill[0], tr.decode[0]).State != BreakerOpen; i++ {
			if i == 5 {
				t.Fatal("the pair did not open")
			}
			if a := generate(t.Context(), tr.r, fmt.Sprintf("f%d", i)); a.err == nil || a.err.Code != "failed_transfer" {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		advance(150 * time.Millisecond)
		for _, w := range tr.r.Fleet().Workers("") {
			if st := w.Status(); st.State != fleet.StateReady {
				t.Fatalf("%s: %+v, want the last workers of their roles kept ready", st.URL, st)
			}
		}
		broken.Store(false)
		tr.prefill[0].setLeg(okLeg(workerapi.RolePrefill))
		if a := generate(t.Context(), tr.r, "panic"); a.err != nil {
			t.Fatalf("with every pair open: %+v, want the open pair tried", a.err)
		}
		if ps := pairState(t, tr.r, tr.prefill[0], tr.decode[0]); ps.State != BreakerClosed {
			t.Fatalf("after a success in panic mode: %+v", ps)
		}
	})
}

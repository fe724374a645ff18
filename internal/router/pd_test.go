package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// testRouter is a router over fake workers on a fake network. Build it
// inside a synctest bubble.
type testRouter struct {
	r                          *Router
	net                        *fakeNet
	reg                        *prometheus.Registry
	prefill, decode, colocated []*fakeWorker
}

// newTestRouter starts a router over np prefill and nd decode workers (or,
// with nc > 0, nc colocated workers), every leg succeeding until a test
// scripts it otherwise. edit may change the config.
func newTestRouter(t testing.TB, np, nd, nc int, edit func(*Config)) *testRouter {
	t.Helper()
	net := &fakeNet{}
	tr := &testRouter{net: net, reg: prometheus.NewRegistry()}
	cfg := Config{ModelName: "m", ContextLen: 64, Client: &http.Client{Transport: net}, Registerer: tr.reg}
	add := func(n int, role workerapi.Role, list *[]*fakeWorker, urls *[]string) {
		for i := range n {
			w := &fakeWorker{role: role, host: role.String() + string(rune('0'+i)), leg: okLeg(role)}
			net.add(w.host, w)
			*list = append(*list, w)
			*urls = append(*urls, w.url())
		}
	}
	add(np, workerapi.RolePrefill, &tr.prefill, &cfg.Prefill)
	add(nd, workerapi.RoleDecode, &tr.decode, &cfg.Decode)
	add(nc, workerapi.RoleColocated, &tr.colocated, &cfg.Colocated)
	if edit != nil {
		edit(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	if ok, why := r.Serving(); !ok {
		r.Close()
		t.Fatalf("router not serving: %s", why)
	}
	tr.r = r
	return tr
}

// answer is what a client of the router got.
type answer struct {
	tokens []int32
	finish string
	err    *openai.Error
	after  time.Duration // from Generate to the answer, on the bubble's clock
}

// generate sends one request and reads it to its end.
func generate(ctx context.Context, r *Router, rid string) answer {
	return generateReq(ctx, r, &openai.GenerateRequest{RID: rid, InputIDs: []int32{1, 2, 3}, MaxTokens: 3,
		Sampling: model.SamplingParams{TopP: 1, Seed: 7}})
}

// generateReq sends g and reads it to its end.
func generateReq(ctx context.Context, r *Router, g *openai.GenerateRequest) answer {
	start := time.Now()
	var a answer
	defer func() { a.after = time.Since(start) }()
	st, err := r.Generate(ctx, g)
	if err != nil {
		a.err = openai.ToError(err)
		a.after = time.Since(start)
		return a
	}
	defer st.Close()
	for {
		c, err := st.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				a.err = openai.ToError(err)
			}
			a.after = time.Since(start)
			return a
		}
		for _, tok := range c.Tokens {
			a.tokens = append(a.tokens, tok.ID)
		}
		if c.FinishReason != "" {
			a.finish = c.FinishReason
			a.after = time.Since(start)
			return a
		}
	}
}

var okTokens = []int32{10, 11, 12}

// failWith answers a leg with e before any output.
func failWith(e *workerapi.Error) legFunc {
	return func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
		w.fail(e)
	}
}

// after delays a leg by d (the worker's latency; the bubble's clock).
func after(d time.Duration, then legFunc) legFunc {
	return func(ctx context.Context, b workerapi.GenerateBody, aborted <-chan workerapi.AbortBody, w *legWriter) {
		select {
		case <-time.After(d):
			then(ctx, b, aborted, w)
		case <-ctx.Done():
		}
	}
}

// gens lists the gens of legs, in order (the legs of one attempt race
// each other, and a retry's with the old attempt's).
func gens(legs []workerapi.GenerateBody) []uint32 {
	var out []uint32
	for _, l := range legs {
		out = append(out, l.Gen)
	}
	slices.Sort(out)
	return out
}

// TestRetryDecisionByOutcome: for every outcome a decode leg can fail with
// on its own (before any token), the router retries on a new attempt
// exactly when the outcome is Retryable — on the other decode worker, never
// the one that failed —, probes both workers first exactly when it is
// Suspect, otherwise answers with the outcome's status and code; it aborts
// the prefill leg at once, telling it decode's cause, and answers without
// waiting.
func TestRetryDecisionByOutcome(t *testing.T) {
	for _, o := range outcome.Worker() {
		if o == outcome.OK || o.PeerCaused() {
			continue
		}
		t.Run(o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 2, 0, nil)
				defer tr.r.Close()
				cause := outcome.Cause{Outcome: o, Role: "decode", Stage: "awaiting_kv", Detail: "injected"}
				tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
				for _, d := range tr.decode {
					d.setLeg(byGen(failWith(workerapi.OutcomeError(o, "injected", cause)), okLeg(workerapi.RoleDecode)))
				}
				_, _, pHealth := tr.prefill[0].received()
				_, _, dHealth := tr.decode[0].received()
				_, _, dHealthB := tr.decode[1].received()
				dHealth += dHealthB

				a := generate(t.Context(), tr.r, "rid")
				synctest.Wait() // the aborts sent in the background have landed
				if a.after != 0 {
					t.Errorf("answered after %s, want at once", a.after)
				}
				pLegs, pAborts, pHealth2 := tr.prefill[0].received()
				d0Legs, _, dHealth2 := tr.decode[0].received()
				d1Legs, _, dHealth2b := tr.decode[1].received()
				dHealth2 += dHealth2b
				if o.Retryable() {
					if a.err != nil || !cmp.Equal(a.tokens, okTokens) || a.finish != "length" {
						t.Fatalf("retryable %s: got %+v, want the retry's tokens", o, a)
					}
					if got := gens(pLegs); !cmp.Equal(got, []uint32{1, 2}) {
						t.Errorf("prefill legs of gens %v, want [1 2]", got)
					}
					if g0, g1 := gens(d0Legs), gens(d1Legs); len(g0) != 1 || len(g1) != 1 {
						t.Errorf("decode legs of gens %v and %v: the retry went back to the decode worker that failed", g0, g1)
					}
					if n := counter(t, tr.reg, "pdserve_router_retries_total", "cause", o.String()); n != 1 {
						t.Errorf("retries %v", n)
					}
					if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok"); n != 1 {
						t.Errorf("requests ok %v", n)
					}
				} else {
					want := &openai.Error{Status: o.Status(), Type: workerapi.OutcomeError(o, "", cause).Type,
						Message: o.String() + ": injected", Code: o.String()}
					if diff := cmp.Diff(want, a.err); diff != "" {
						t.Fatalf("answer (-want +got):\n%s", diff)
					}
					if got := gens(pLegs); !cmp.Equal(got, []uint32{1}) {
						t.Errorf("prefill legs of gens %v, want [1] (no retry)", got)
					}
					if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", o.String()); n != 1 {
						t.Errorf("requests %s: %v", o, n)
					}
				}
				if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", "decode", "outcome", o.String()); n != 1 {
					t.Errorf("leg failures decode/%s: %v", o, n)
				}
				probes := 0
				if o.Suspect() {
					probes = 1
				}
				if pHealth2-pHealth != probes || dHealth2-dHealth != probes {
					t.Errorf("health probes prefill %d decode %d, want %d each", pHealth2-pHealth, dHealth2-dHealth, probes)
				}
				if len(pAborts) == 0 {
					t.Fatal("prefill was not aborted")
				}
				ab := pAborts[0]
				if ab.RID != "rid" || ab.Gen != 1 || ab.Reason != workerapi.AbortPeer || ab.Cause != cause {
					t.Errorf("prefill's abort %+v, want rid gen 1, reason peer, decode's cause %+v", ab, cause)
				}
			})
		})
	}
}

// TestKnownRootCauseAnswersAtOnce: decode ends because prefill failed and
// says so (aborted_peer with prefill's cause): the client gets prefill's
// status, code and message at once, though prefill's own answer never
// comes, and the failure is counted on prefill.
func TestKnownRootCauseAnswersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		cause := outcome.Cause{Outcome: outcome.RejectedInvalid, Role: "prefill", Stage: "waiting", Detail: "prompt too long"}
		tr.prefill[0].setLeg(hang)
		tr.decode[0].setLeg(failWith(workerapi.OutcomeError(outcome.AbortedPeer, "peer aborted: "+cause.String(), cause)))
		a := generate(t.Context(), tr.r, "rid")
		want := &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest,
			Message: "rejected_invalid: prompt too long", Code: "rejected_invalid"}
		if diff := cmp.Diff(want, a.err); diff != "" {
			t.Fatalf("answer (-want +got):\n%s", diff)
		}
		if a.after != 0 {
			t.Fatalf("answered after %s: the cause was known, no grace is needed", a.after)
		}
		if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", "prefill", "outcome", "rejected_invalid"); n != 1 {
			t.Errorf("leg failures prefill/rejected_invalid %v", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "rejected_invalid"); n != 1 {
			t.Errorf("requests rejected_invalid %v", n)
		}
	})
}

// TestKnownRootCauseRetriedAtOnce: prefill ends because decode found the KV
// corrupted (aborted_peer with decode's failed_transfer): the request is
// retried at once, without waiting for decode's own line, and without a
// probe (a corrupted transfer is no sign of a frozen worker).
func TestKnownRootCauseRetriedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		cause := outcome.Cause{Outcome: outcome.FailedTransfer, Role: "decode", Stage: "awaiting_kv", Detail: "checksum mismatch"}
		tr.prefill[0].setLeg(byGen(failWith(workerapi.OutcomeError(outcome.AbortedPeer, "peer aborted", cause)),
			okLeg(workerapi.RolePrefill)))
		tr.decode[0].setLeg(byGen(hang, after(time.Millisecond, okLeg(workerapi.RoleDecode))))
		_, _, h0 := tr.decode[0].received()
		a := generate(t.Context(), tr.r, "rid")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("got %+v, want the retry's tokens", a)
		}
		if a.after != time.Millisecond {
			t.Fatalf("answered after %s, want the retry's 1ms only", a.after)
		}
		legs, _, h1 := tr.decode[0].received()
		if got := gens(legs); !cmp.Equal(got, []uint32{1, 2}) {
			t.Errorf("decode legs of gens %v", got)
		}
		if h1 != h0 {
			t.Errorf("%d probes, want none", h1-h0)
		}
		if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", "decode", "outcome", "failed_transfer"); n != 1 {
			t.Errorf("leg failures decode/failed_transfer %v", n)
		}
	})
}

// TestUnknownCauseWaitsForTheOtherLeg: an echo that names no cause waits,
// up to PeerFailureGrace, for the other leg's own answer, and answers with
// that as soon as it comes; if it does not come, the echo is the answer
// when the grace is over.
func TestUnknownCauseWaitsForTheOtherLeg(t *testing.T) {
	echo := workerapi.OutcomeError(outcome.AbortedPeer, "peer aborted: unknown_room", outcome.Cause{Detail: "unknown_room"})
	prefill400 := workerapi.OutcomeError(outcome.RejectedInvalid, "prompt too long",
		outcome.Cause{Outcome: outcome.RejectedInvalid, Role: "prefill", Detail: "prompt too long"})
	decode502 := workerapi.OutcomeError(outcome.TimeoutTransfer, "no KV for 30s",
		outcome.Cause{Outcome: outcome.TimeoutTransfer, Role: "decode", Detail: "no KV for 30s"})
	cases := []struct {
		name             string
		prefill, decode  legFunc
		wantAfter        time.Duration
		wantCode         string
		wantStatus       int
		wantFailedOnRole string
	}{
		{"decode echoes, prefill explains", after(300*time.Millisecond, failWith(prefill400)), failWith(echo),
			300 * time.Millisecond, "rejected_invalid", 400, "prefill"},
		{"decode echoes, prefill silent", hang, failWith(echo), 700 * time.Millisecond, "aborted_peer", 502, "decode"},
		{"prefill echoes, decode explains", failWith(echo), after(200*time.Millisecond, failWith(decode502)),
			200 * time.Millisecond, "timeout_transfer", 504, "decode"},
		{"prefill echoes, decode silent", failWith(echo), hang, 700 * time.Millisecond, "aborted_peer", 502, "prefill"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 1, 0, func(cfg *Config) { cfg.PeerFailureGrace = 700 * time.Millisecond })
				defer tr.r.Close()
				tr.prefill[0].setLeg(c.prefill)
				tr.decode[0].setLeg(c.decode)
				a := generate(t.Context(), tr.r, "rid")
				if a.err == nil || a.err.Code != c.wantCode || a.err.Status != c.wantStatus {
					t.Fatalf("got %+v, want %d %s", a, c.wantStatus, c.wantCode)
				}
				if a.after != c.wantAfter {
					t.Fatalf("answered after %s, want %s", a.after, c.wantAfter)
				}
				if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", c.wantFailedOnRole, "outcome", c.wantCode); n != 1 {
					t.Errorf("leg failures %s/%s %v", c.wantFailedOnRole, c.wantCode, n)
				}
			})
		})
	}
}

// TestProbeKeepsFrozenWorkerOut: after a lost peer the router probes both
// workers of the pair before retrying; a prefill worker that does not
// answer its probe within ProbeTimeout is marked down, so the retry does
// not send it a new leg: with no other prefill worker the client gets the
// original failure, after exactly the probe's timeout.
func TestProbeKeepsFrozenWorkerOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		frozen := func(ctx context.Context) int { <-ctx.Done(); return http.StatusServiceUnavailable }
		lost := workerapi.OutcomeError(outcome.PeerLost, "KV connection reset",
			outcome.Cause{Outcome: outcome.PeerLost, Role: "decode", Stage: "awaiting_kv", Detail: "KV connection reset"})
		tr.prefill[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			tr.prefill[0].setHealth(frozen) // the worker freezes with this leg
			hang(ctx, b, ab, w)
		})
		// Decode fails 1ms in, once prefill has the leg (and froze).
		tr.decode[0].setLeg(after(time.Millisecond, failWith(lost)))
		a := generate(t.Context(), tr.r, "rid")
		if a.err == nil || a.err.Code != "peer_lost" || a.err.Status != http.StatusBadGateway {
			t.Fatalf("got %+v, want the 502 peer_lost", a)
		}
		if a.after != time.Millisecond+ProbeTimeout {
			t.Fatalf("answered after %s, want 1ms + the probe timeout %s", a.after, ProbeTimeout)
		}
		if legs, _, _ := tr.prefill[0].received(); !cmp.Equal(gens(legs), []uint32{1}) {
			t.Fatalf("prefill legs of gens %v: the retry went to the frozen worker", gens(legs))
		}
		ws := tr.r.Workers()
		if ws[0].Role == "decode" {
			ws[0], ws[1] = ws[1], ws[0]
		}
		if ws[0].Healthy || !strings.HasPrefix(ws[0].LastError, "probe: ") || !strings.Contains(ws[0].LastError, "no answer within 1s") {
			t.Fatalf("prefill worker %+v, want it down after its probe", ws[0])
		}
		if !ws[1].Healthy {
			t.Fatalf("decode worker %+v, want it healthy (it answered its probe)", ws[1])
		}
		if ok, _ := tr.r.Serving(); ok {
			t.Fatal("serving with the only prefill worker down")
		}
	})
}

// TestProbePassesRetrySamePair: when both workers answer the probe, the
// retry goes out at once, on the same pair.
func TestProbePassesRetrySamePair(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
		tr.decode[0].setLeg(byGen(failWith(workerapi.NewError(outcome.LeaseExpired, "lease expired", outcome.Cause{})),
			okLeg(workerapi.RoleDecode)))
		a := generate(t.Context(), tr.r, "rid")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) || a.after != 0 {
			t.Fatalf("got %+v, want the retry's tokens at once", a)
		}
	})
}

// TestStreamBrokenRetried: a decode worker that breaks off its stream (the
// router's own worker_stream_broken) is probed and the request retried;
// an unreachable decode worker (worker_unreachable) is left out of pairing
// and the retry goes to the other one.
func TestStreamBrokenRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		broken := func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
			w.line(workerapi.StreamLine{}) // status 200, an empty line, then EOF without a finish
		}
		for _, d := range tr.decode {
			d.setLeg(byGen(broken, okLeg(workerapi.RoleDecode)))
		}
		tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
		a := generate(t.Context(), tr.r, "rid")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("got %+v", a)
		}
		if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", "decode", "outcome", "worker_stream_broken"); n != 1 {
			t.Errorf("leg failures decode/worker_stream_broken %v", n)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
		// The decode worker the first attempt goes to (round robin starts
		// at the second) vanishes.
		gone := tr.decode[1]
		tr.net.mu.Lock()
		delete(tr.net.hosts, gone.host)
		tr.net.mu.Unlock()
		a := generate(t.Context(), tr.r, "rid")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("got %+v", a)
		}
		if legs, _, _ := tr.decode[0].received(); !cmp.Equal(gens(legs), []uint32{2}) {
			t.Fatalf("the other decode worker got gens %v, want [2]", gens(legs))
		}
		if n := counter(t, tr.reg, "pdserve_router_worker_failures_total", "worker", gone.url()); n != 1 {
			t.Errorf("worker failures of %s: %v", gone.url(), n)
		}
	})
}

// TestNoRetryAfterFirstToken: once a token reached the client, a retryable
// failure is not retried from the start: without continuations
// (--max-migrations 0) it is the answer (the tokens came first).
func TestNoRetryAfterFirstToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(c *Config) { c.MaxMigrations = -1 })
		defer tr.r.Close()
		tr.decode[0].setLeg(func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
			w.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
			w.fail(workerapi.NewError(outcome.PeerLost, "peer lost", outcome.Cause{}))
		})
		a := generate(t.Context(), tr.r, "rid")
		if a.err == nil || a.err.Code != "peer_lost" || !cmp.Equal(a.tokens, []int32{10}) {
			t.Fatalf("got %+v, want token 10 then peer_lost", a)
		}
		if n := counter(t, tr.reg, "pdserve_router_retries_total", "cause", "peer_lost"); n != 0 {
			t.Fatalf("retried %v times", n)
		}
	})
}

// TestHealthCheckFailsLegInFlight: a decode worker that stops passing
// health checks while it holds a leg (its stream silent) fails that leg
// when it is found not ready, FailureThreshold (3) checks later, with
// worker_unreachable; with no other decode worker the client gets that
// answer. Once it passes SuccessThreshold (2) checks, the router serves
// again.
func TestHealthCheckFailsLegInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(cfg *Config) { cfg.HealthInterval = 2 * time.Second })
		defer tr.r.Close()
		tr.prefill[0].setLeg(untilAborted)
		tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			tr.decode[0].setHealth(func(context.Context) int { return http.StatusServiceUnavailable })
			hang(ctx, b, ab, w)
		})
		a := generate(t.Context(), tr.r, "rid")
		if a.err == nil || a.err.Code != "worker_unreachable" || a.err.Status != http.StatusBadGateway {
			t.Fatalf("got %+v", a)
		}
		if a.after != 3*2*time.Second {
			t.Fatalf("answered after %s, want the third failed health check at 6s", a.after)
		}
		if ok, _ := tr.r.Serving(); ok {
			t.Fatal("serving with the decode worker down")
		}
		tr.decode[0].setHealth(nil)
		tr.decode[0].setLeg(okLeg(workerapi.RoleDecode))
		tr.prefill[0].setLeg(okLeg(workerapi.RolePrefill))
		advance(2 * time.Second) // one health interval
		if ok, _ := tr.r.Serving(); ok {
			t.Fatal("serving after one passing check (two are needed)")
		}
		advance(2 * time.Second)
		if ok, why := tr.r.Serving(); !ok {
			t.Fatalf("not serving after the worker recovered: %s", why)
		}
		if a := generate(t.Context(), tr.r, "rid2"); a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("after recovery: %+v", a)
		}
	})
}

// TestPlainModeFailures: in plain mode a colocated worker's failure is the
// answer (no retry), counted on the colocated role; a worker found down
// fails its request with worker_unreachable.
func TestPlainModeFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 0, 0, 1, nil)
		defer tr.r.Close()
		w := tr.colocated[0]
		w.setLeg(failWith(workerapi.OutcomeError(outcome.RejectedCapacity, "too long for the pool", outcome.Cause{})))
		a := generate(t.Context(), tr.r, "rid")
		if a.err == nil || a.err.Status != http.StatusBadRequest || a.err.Code != "rejected_capacity" {
			t.Fatalf("got %+v", a)
		}
		if n := counter(t, tr.reg, "pdserve_router_leg_failures_total", "role", "colocated", "outcome", "rejected_capacity"); n != 1 {
			t.Errorf("leg failures %v", n)
		}
		w.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, lw *legWriter) {
			w.setHealth(func(context.Context) int { return http.StatusServiceUnavailable })
			hang(ctx, b, ab, lw)
		})
		a = generate(t.Context(), tr.r, "rid2")
		if a.err == nil || a.err.Code != "worker_unreachable" || a.after != 3*2*time.Second {
			t.Fatalf("got %+v, want worker_unreachable at the third failed health check", a)
		}
		if legs, _, _ := w.received(); len(legs) != 2 {
			t.Fatalf("%d legs, want 2 (no retry)", len(legs))
		}
	})
}

// TestRequestsOnInjectedClock: /debug/requests ages and the leg deadline
// left are read from the router's clock.
func TestRequestsOnInjectedClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		tr := newTestRouter(t, 1, 1, 0, func(cfg *Config) { cfg.Clock = fc })
		defer tr.r.Close()
		release := make(chan struct{})
		tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			w.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
			select {
			case <-release:
				okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
			case <-ctx.Done():
			}
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan answer)
		go func() { done <- generate(ctx, tr.r, "rid") }()
		synctest.Wait()
		fc.Step(5 * time.Second)
		synctest.Wait()
		list := tr.r.Requests()
		if len(list) != 1 {
			t.Fatalf("requests %+v", list)
		}
		ri := list[0]
		if ri.RID != "rid" || ri.Stage != stageStreaming || ri.AgeSeconds != 5 || ri.InStageSecs != 5 ||
			ri.DeadlineLeft != (DefaultLegTimeout-5*time.Second).Seconds() || ri.OutputTokens != 1 {
			t.Fatalf("request %+v, want streaming, 5s old, %s left", ri, DefaultLegTimeout-5*time.Second)
		}
		close(release)
		if a := <-done; a.err != nil || !cmp.Equal(a.tokens, []int32{10, 10, 11, 12}) {
			t.Fatalf("got %+v", a)
		}
		if list := tr.r.Requests(); len(list) != 0 {
			t.Fatalf("requests after the end: %+v", list)
		}
	})
}

// TestLeavingWorkerOutOfPairingAtOnce: a decode worker that answers
// shutdown (or draining) is out of new pairs at once, before its next
// health check says so: the request is retried on the other worker, and
// later requests never go to it.
func TestLeavingWorkerOutOfPairingAtOnce(t *testing.T) {
	for _, o := range []outcome.Outcome{outcome.Shutdown, outcome.Draining} {
		t.Run(o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 2, 0, nil)
				defer tr.r.Close()
				tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
				leaving := workerapi.OutcomeError(o, "the worker is going away", outcome.Cause{})
				for _, d := range tr.decode {
					d.setLeg(failWith(leaving))
				}
				// The first attempt goes to decode1 (round robin starts at
				// the second); only decode0 will serve.
				tr.decode[0].setLeg(okLeg(workerapi.RoleDecode))
				for i := range 4 {
					if a := generate(t.Context(), tr.r, fmt.Sprintf("rid%d", i)); a.err != nil || !cmp.Equal(a.tokens, okTokens) {
						t.Fatalf("request %d: %+v", i, a)
					}
				}
				if legs, _, _ := tr.decode[1].received(); len(legs) != 1 {
					t.Fatalf("the leaving worker got %d legs, want only the first", len(legs))
				}
				if st := tr.r.Fleet().Workers("decode")[1].State(); st.String() != "draining" {
					t.Fatalf("leaving worker is %s, want draining", st)
				}
			})
		})
	}
}

// TestRouterDrain: a draining router answers new requests 503 draining with
// Retry-After and /health 503, lets the request in flight finish, and Drain
// returns once it has been answered.
func TestRouterDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		tr.decode[0].setLeg(after(3*time.Second, okLeg(workerapi.RoleDecode)))
		first := make(chan answer, 1)
		go func() { first <- generate(t.Context(), tr.r, "inflight") }()
		synctest.Wait()
		drained := make(chan error, 1)
		go func() { drained <- tr.r.Drain(t.Context()) }()
		synctest.Wait()
		a := generate(t.Context(), tr.r, "late")
		if a.err == nil || a.err.Status != http.StatusServiceUnavailable || a.err.Code != "draining" || a.err.RetryAfter <= 0 {
			t.Fatalf("new request while draining: %+v", a.err)
		}
		rec := httptest.NewRecorder()
		tr.r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "draining") || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("/health while draining: %d %s", rec.Code, rec.Body)
		}
		select {
		case err := <-drained:
			t.Fatalf("Drain returned %v with a request in flight", err)
		default:
		}
		if a := <-first; a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("request in flight during the drain: %+v", a)
		}
		synctest.Wait()
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
	})
}

// TestRequestHistoryAtTheRouter: /debug/requests/{rid} at the router shows a
// live request's attempts, the failed leg and the retry, with its pair; an
// unknown rid is a JSON 404.
func TestRequestHistoryAtTheRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		tr.prefill[0].setLeg(byGen(untilAborted, hang))
		tr.decode[0].setLeg(byGen(failWith(workerapi.NewError(outcome.PeerLost, "kv peer silent", outcome.Cause{})), hang))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan answer, 1)
		go func() { done <- generate(ctx, tr.r, "rid7") }()
		synctest.Wait()
		ri, ok := tr.r.Request("rid7")
		if !ok {
			t.Fatal("request not found")
		}
		var whats []string
		for _, h := range ri.History {
			whats = append(whats, h.What)
		}
		joined := strings.Join(whats, " | ")
		for _, want := range []string{"legs sent (gen 1): http://prefill0 → http://decode0", "decode leg failed (gen 1): kv peer silent",
			"retried on a new pair (gen 2)"} {
			if !strings.Contains(joined, want) {
				t.Errorf("history %q lacks %q", joined, want)
			}
		}
		if ri.Retries != 1 || ri.Gen != 2 || ri.Stage != "legs" {
			t.Errorf("request %+v", ri)
		}
		rec := httptest.NewRecorder()
		tr.r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/requests/nope", nil))
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("unknown rid: %d %s", rec.Code, rec.Body)
		}
		cancel()
		<-done
	})
}

// TestIncompatibleDecodeNeverFailsARequest: with one prefill worker, two
// decode workers of its page size and one of another page size, every
// pick finds a compatible pair: no request fails, and the incompatible
// decode worker (the emptiest, so the first choice of every policy)
// receives no leg.
func TestIncompatibleDecodeNeverFailsARequest(t *testing.T) {
	for _, pol := range PolicyNames() {
		t.Run(pol, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 3, 0, func(cfg *Config) {
					withPolicy(pol)(cfg)
					other := testFingerprint
					other.PageSize = 32
					fakeOf(cfg, "decode2").setFingerprint(other)
				})
				defer tr.r.Close()
				for i := range 60 {
					if a := generate(t.Context(), tr.r, fmt.Sprintf("rid%d", i)); a.err != nil || !cmp.Equal(a.tokens, okTokens) {
						t.Fatalf("request %d: %+v", i, a)
					}
				}
				if n := legCounts(tr.decode); n[2] != 0 || n[0] == 0 || n[1] == 0 {
					t.Fatalf("decode legs %v: want both compatible workers used, none on the page-size-32 one", n)
				}
			})
		})
	}
}

// TestFrozenDecodeOutOfPairsAfterOneFailedCheck: a decode worker that
// stops answering (SIGSTOP) gets no new pair once one health check failed,
// long before the three failures that make it not_ready: every request
// after that goes to the other decode worker and none fails.
func TestFrozenDecodeOutOfPairsAfterOneFailedCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, func(cfg *Config) {
			cfg.HealthInterval, cfg.CheckTimeout = 2*time.Second, time.Second
		})
		defer tr.r.Close()
		tr.decode[1].setHealth(func(ctx context.Context) int { <-ctx.Done(); return http.StatusServiceUnavailable })
		advance(2*time.Second + time.Second) // the next check, and its timeout
		w := workerNamed(t, tr.r, tr.decode[1].url())
		if st := w.Status(); st.State.String() != "ready" || st.Healthy {
			t.Fatalf("frozen decode after one failed check: %+v, want ready and not healthy", st)
		}
		before := legCounts(tr.decode)
		for i := range 20 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("rid%d", i)); a.err != nil || !cmp.Equal(a.tokens, okTokens) {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		if after := legCounts(tr.decode); after[1] != before[1] || after[0] != before[0]+20 {
			t.Fatalf("decode legs %v -> %v: the frozen worker got new pairs", before, after)
		}
	})
}

// TestEveryDecodeMissedOneCheck: when every decode worker missed one health
// check at once (a loaded host slows them all), they are still ready and the
// router's last resort: requests are served on them, not refused with a 503
// that calls them ready; once one passes a check again, only it gets pairs.
func TestEveryDecodeMissedOneCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, func(cfg *Config) {
			cfg.HealthInterval, cfg.CheckTimeout = 2*time.Second, time.Second
		})
		defer tr.r.Close()
		slow := func(ctx context.Context) int { <-ctx.Done(); return http.StatusServiceUnavailable }
		for _, d := range tr.decode {
			d.setHealth(slow)
		}
		advance(2*time.Second + time.Second) // the next check, and its timeout
		for _, d := range tr.decode {
			if st := workerNamed(t, tr.r, d.url()).Status(); st.State.String() != "ready" || st.Healthy {
				t.Fatalf("decode after one failed check: %+v, want ready and not healthy", st)
			}
		}
		before := legCounts(tr.decode)
		for i := range 20 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("rid%d", i)); a.err != nil || !cmp.Equal(a.tokens, okTokens) {
				t.Fatalf("request %d with every decode worker one check down: %+v", i, a)
			}
		}
		if after := legCounts(tr.decode); after[0]+after[1] != before[0]+before[1]+20 {
			t.Fatalf("decode legs %v -> %v, want 20 more", before, after)
		}
		tr.decode[0].setHealth(nil) // answers again
		advance(2 * time.Second)
		if st := workerNamed(t, tr.r, tr.decode[0].url()).Status(); !st.Healthy {
			t.Fatalf("decode 0 after a passed check: %+v", st)
		}
		before = legCounts(tr.decode)
		for i := range 10 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("again%d", i)); a.err != nil {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		if after := legCounts(tr.decode); after[1] != before[1] || after[0] != before[0]+10 {
			t.Fatalf("decode legs %v -> %v: with a usable worker back, the failing one got pairs", before, after)
		}
	})
}

// TestBootstrapTimeoutProbedAndRetried: a prefill leg that fails with
// timeout_bootstrap (its decode never opened the room: frozen) makes the
// router probe the pair; the frozen decode fails its probe and the retry
// goes to the other decode worker: the client gets its tokens.
func TestBootstrapTimeoutProbedAndRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, withPolicy(PolicyRoundRobin))
		defer tr.r.Close()
		boot := workerapi.OutcomeError(outcome.TimeoutBootstrap, "decode never opened the room",
			outcome.Cause{Outcome: outcome.TimeoutBootstrap, Role: "prefill", Stage: "bootstrap"})
		frozen := func(ctx context.Context) int { <-ctx.Done(); return http.StatusServiceUnavailable }
		var first *fakeWorker
		for _, d := range tr.decode {
			d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
				if b.Gen > 1 {
					okLeg(workerapi.RoleDecode)(ctx, b, ab, w)
					return
				}
				d.setHealth(frozen)
				hang(ctx, b, ab, w)
			})
		}
		tr.prefill[0].setLeg(byGen(after(time.Second, failWith(boot)), okLeg(workerapi.RolePrefill)))
		a := generate(t.Context(), tr.r, "rid")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("got %+v, want the retry's tokens", a)
		}
		for _, d := range tr.decode {
			if legs, _, _ := d.received(); len(legs) > 0 && legs[0].Gen == 1 {
				first = d
			}
		}
		if legs, _, _ := first.received(); len(legs) != 1 {
			t.Fatalf("the frozen decode got %d legs, want only the first attempt's", len(legs))
		}
		if st := workerNamed(t, tr.r, first.url()).Status(); st.Healthy {
			t.Fatalf("frozen decode %+v, want it out after its probe", st)
		}
	})
}

// TestDecodeLegHandedOver: once prefill has answered, the decode leg is
// read on the client's goroutine from its next line on (handed over by the
// goroutine that read it until then). The tokens arrive in order and the
// leg is uncounted at the end; the client leaving after the hand-over ends
// the read at once and aborts decode; a stop string's abort reaches decode
// before its leg is hung up, though the client's context ends right after
// the Stop (as it does once the answer is written).
func TestDecodeLegHandedOver(t *testing.T) {
	for _, end := range []string{"finish", "client_gone", "stop"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 1, 0, nil)
				defer tr.r.Close()
				prefilled := make(chan struct{})
				tr.prefill[0].setLeg(func(_ context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
					w.prefillOK(b)
					close(prefilled)
				})
				hungUpFirst := make(chan bool, 1)
				tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
					tok := func(id int32, finish string) {
						w.line(workerapi.StreamLine{TokenIDs: []int32{id}, Logprobs: []float32{-1}, FinishReason: finish})
						w.rw.(http.Flusher).Flush()
					}
					tok(10, "")
					<-prefilled
					synctest.Wait() // the router has taken prefill's answer
					tok(11, "")
					if end != "finish" {
						hungUpFirst <- !abortedFirst(ctx, ab)
						return
					}
					synctest.Wait()
					tok(12, "length")
				})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				st, err := tr.r.Generate(ctx, &openai.GenerateRequest{RID: "rid", InputIDs: []int32{1, 2, 3}, MaxTokens: 3,
					Sampling: model.SamplingParams{TopP: 1}})
				if err != nil {
					t.Fatal(err)
				}
				var got []int32
				for len(got) < 2 {
					c, err := st.Recv()
					if err != nil {
						t.Fatalf("after %v: %v", got, err)
					}
					for _, tk := range c.Tokens {
						got = append(got, tk.ID)
					}
				}
				if ps := st.(*measured).Stream.(*pdStream); ps.a.leg == nil {
					t.Fatal("the decode leg was not handed over after prefill answered")
				}
				switch end {
				case "finish":
					c, err := st.Recv()
					if err != nil || c.FinishReason != "length" {
						t.Fatalf("last chunk %+v, %v", c, err)
					}
					got = append(got, c.Tokens[0].ID)
					if !cmp.Equal(got, []int32{10, 11, 12}) {
						t.Errorf("tokens %v", got)
					}
					st.Close()
				case "client_gone":
					cancel()
					if _, err := st.Recv(); !errors.Is(err, context.Canceled) {
						t.Fatalf("after the client left: %v", err)
					}
					st.Close()
				case "stop":
					st.Stop()
					cancel() // the client's context ends with the answer, before Close
					synctest.Wait()
					st.Close()
				}
				synctest.Wait()
				if end == "stop" {
					if <-hungUpFirst {
						t.Error("the decode leg was hung up before the stop abort reached it")
					}
				} else if end == "client_gone" {
					<-hungUpFirst
				}
				if n := tr.r.Fleet().Workers("decode")[0].Legs(); n != 0 {
					t.Errorf("%d decode legs still counted", n)
				}
				if end != "finish" {
					_, aborts, _ := tr.decode[0].received()
					want := workerapi.AbortClient
					if end == "stop" {
						want = workerapi.AbortStop
					}
					if len(aborts) != 1 || aborts[0].Reason != want {
						t.Errorf("decode aborts %+v, want one %v", aborts, want)
					}
				}
			})
		})
	}
}

// TestMinTokensOnlyToWorkersThatHonourIt: during a rolling upgrade an older
// worker would ignore min_tokens, so a request with it goes only to workers
// that list the feature; when none does, it is a 503 naming why, while a
// request without min_tokens is still served by the older workers.
func TestMinTokensOnlyToWorkersThatHonourIt(t *testing.T) {
	send := func(r *Router, rid string, minTokens int) answer {
		return generateReq(context.Background(), r, &openai.GenerateRequest{RID: rid, InputIDs: []int32{1, 2, 3},
			MaxTokens: 3, MinTokens: minTokens, Sampling: model.SamplingParams{TopP: 1, Seed: 7}})
	}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 2, 0, func(cfg *Config) {
			fakeOf(cfg, "decode1").setOld()
			fakeOf(cfg, "prefill0").setOld()
		})
		defer tr.r.Close()
		for i := range 6 {
			if a := send(tr.r, fmt.Sprintf("r%d", i), 3); a.err != nil || a.finish == "" {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		synctest.Wait() // the last prefill leg may still be on its way when decode has answered
		for _, w := range []*fakeWorker{tr.decode[1], tr.prefill[0]} {
			if legs, _, _ := w.received(); len(legs) != 0 {
				t.Fatalf("%s (no min_tokens feature) got %d legs", w.host, len(legs))
			}
		}
		for _, w := range []*fakeWorker{tr.decode[0], tr.prefill[1]} {
			legs, _, _ := w.received()
			if len(legs) != 6 || legs[0].MinTokens != 3 {
				t.Fatalf("%s got %d legs (first %+v), want 6 with min_tokens 3", w.host, len(legs), legs)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(cfg *Config) { fakeOf(cfg, "decode0").setOld() })
		defer tr.r.Close()
		a := send(tr.r, "m", 2)
		if a.err == nil || a.err.Status != http.StatusServiceUnavailable || !strings.Contains(a.err.Message, "without min_tokens") ||
			strings.Contains(a.err.Message, "http") {
			t.Fatalf("min_tokens with only an older decode worker: %+v, want a 503 saying why", a.err)
		}
		if a := send(tr.r, "plain", 0); a.err != nil || a.finish == "" {
			t.Fatalf("a request without min_tokens: %+v", a)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 0, 0, 2, func(cfg *Config) { fakeOf(cfg, "colocated0").setOld() })
		defer tr.r.Close()
		for i := range 4 {
			if a := send(tr.r, fmt.Sprintf("c%d", i), 3); a.err != nil || a.finish == "" {
				t.Fatalf("colocated request %d: %+v", i, a)
			}
		}
		if legs, _, _ := tr.colocated[0].received(); len(legs) != 0 {
			t.Fatalf("the older colocated worker got %d legs", len(legs))
		}
	})
}

// TestConstraintOnBothLegs: a request's constraint reaches both PD legs'
// bodies unchanged (prefill draws the first token under it, decode the
// rest) and a colocated leg's; a worker that does not list the constraint
// feature (an older pdserve, which would ignore it) never serves one.
func TestConstraintOnBothLegs(t *testing.T) {
	spec := grammar.Spec{Kind: grammar.KindJSONSchema, Source: `{"type":"object","properties":{"a":{"type":"string"}}}`, FlexibleWhitespace: true}
	send := func(r *Router, rid string) answer {
		return generateReq(context.Background(), r, &openai.GenerateRequest{RID: rid, InputIDs: []int32{1, 2, 3},
			MaxTokens: 3, Constraint: spec, Sampling: model.SamplingParams{TopP: 1, Seed: 7}})
	}
	check := func(t *testing.T, w *fakeWorker) {
		t.Helper()
		legs, _, _ := w.received()
		if len(legs) != 1 || legs[0].Constraint == nil || *legs[0].Constraint != spec {
			t.Fatalf("%s got %+v, want one leg with the constraint", w.host, legs)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		if a := send(tr.r, "pd"); a.err != nil || a.finish == "" {
			t.Fatalf("%+v", a)
		}
		synctest.Wait()
		check(t, tr.prefill[0])
		check(t, tr.decode[0])
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 0, 0, 1, nil)
		defer tr.r.Close()
		if a := send(tr.r, "co"); a.err != nil || a.finish == "" {
			t.Fatalf("%+v", a)
		}
		check(t, tr.colocated[0])
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(cfg *Config) { fakeOf(cfg, "prefill0").setOld() })
		defer tr.r.Close()
		a := send(tr.r, "old")
		if a.err == nil || a.err.Status != http.StatusServiceUnavailable || !strings.Contains(a.err.Message, "without constraint") {
			t.Fatalf("a constraint with only an older prefill worker: %+v, want a 503 saying why", a.err)
		}
		if legs, _, _ := tr.prefill[0].received(); len(legs) != 0 {
			t.Fatalf("the older prefill worker got %d legs", len(legs))
		}
	})
}

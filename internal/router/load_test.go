package router

import (
	"context"
	"encoding/json"
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

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// advance moves the bubble's clock by d and lets everything it woke settle.
// Inside a synctest bubble time.Sleep waits for nothing real: the fake
// clock jumps once every goroutine of the bubble is blocked.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// withPolicy sets both roles' policy.
func withPolicy(name string) func(*Config) {
	return func(c *Config) { c.PrefillPolicy, c.DecodePolicy = name, name }
}

// legCounts is the number of legs each worker received.
func legCounts(ws []*fakeWorker) []int {
	out := make([]int, len(ws))
	for i, w := range ws {
		legs, _, _ := w.received()
		out[i] = len(legs)
	}
	return out
}

// generateN sends one request with a prompt of n tokens and reads it to
// its end; a stream that ends without a finish reason is an error.
func generateN(ctx context.Context, r *Router, rid string, n int) answer {
	a := generateReq(ctx, r, &openai.GenerateRequest{RID: rid, InputIDs: make([]int32, n), MaxTokens: 3,
		Sampling: model.SamplingParams{TopP: 1}})
	if a.err == nil && a.finish == "" {
		a.err = openai.ToError(io.EOF)
	}
	return a
}

// TestPoliciesByReportedLoad: with three decode workers reporting KV use
// 0.8, 0.5 and 0.1, least_load sends every request to the emptiest,
// power_of_two never to the fullest and more to the emptiest than to the
// middle one, round_robin to each in turn.
func TestPoliciesByReportedLoad(t *testing.T) {
	for _, pol := range PolicyNames() {
		t.Run(pol, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 3, 0, withPolicy(pol))
				defer tr.r.Close()
				for i, used := range []int{800, 500, 100} {
					tr.decode[i].reportLoad(workerapi.Load{PagesUsed: used})
				}
				advance(150 * time.Millisecond) // one load poll
				const n = 60
				for i := range n {
					if a := generate(t.Context(), tr.r, fmt.Sprintf("r%d", i)); a.err != nil {
						t.Fatalf("request %d: %+v", i, a.err)
					}
				}
				got := legCounts(tr.decode)
				switch pol {
				case PolicyLeastLoad:
					if !cmp.Equal(got, []int{0, 0, n}) {
						t.Fatalf("least_load legs per decode %v, want all on the emptiest", got)
					}
				case PolicyPowerOfTwo:
					if got[0] != 0 || got[2] <= got[1] || got[1] == 0 {
						t.Fatalf("power_of_two legs per decode %v, want none on the fullest, most on the emptiest", got)
					}
				case PolicyRoundRobin:
					if !cmp.Equal(got, []int{n / 3, n / 3, n / 3}) {
						t.Fatalf("round_robin legs per decode %v, want an even split", got)
					}
				}
				if c := counter(t, tr.reg, "pdserve_router_selections_total", "role", "decode", "policy", pol,
					"worker", tr.decode[2].url()); int(c) != got[2] {
					t.Errorf("selections of decode2: %v, legs %d", c, got[2])
				}
			})
		})
	}
}

// TestLeastLoadPrefillByOutstandingTokens: with no report, least_load sends
// a prefill leg to the worker with the fewest prompt tokens the router has
// in flight on it: after a long prompt on one and a short one on the
// other, the next goes to the short one's (round robin would go back).
func TestLeastLoadPrefillByOutstandingTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 1, 0, nil)
		defer tr.r.Close()
		release := make(chan struct{})
		for _, p := range tr.prefill {
			p.setLeg(func(ctx context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
				select {
				case <-release:
					w.prefillOK(b)
				case <-ctx.Done():
				}
			})
		}
		tr.decode[0].setLeg(hang)
		done := make(chan answer, 3)
		for i, n := range []int{1000, 10, 10} {
			go func() { done <- generateN(t.Context(), tr.r, fmt.Sprintf("r%d", i), n) }()
			synctest.Wait()
		}
		var first, second, third workerapi.GenerateBody
		for _, p := range tr.prefill {
			legs, _, _ := p.received()
			for _, l := range legs {
				switch l.RID {
				case "r0":
					first = l
				case "r1":
					second = l
				case "r2":
					third = l
				}
			}
		}
		who := func(b workerapi.GenerateBody) int {
			for i, p := range tr.prefill {
				legs, _, _ := p.received()
				if slices.ContainsFunc(legs, func(l workerapi.GenerateBody) bool { return l.RID == b.RID }) {
					return i
				}
			}
			return -1
		}
		if who(first) == who(second) || who(third) != who(second) {
			t.Fatalf("prefill of the 1000-token prompt %d, then 10 tokens %d, then 10 tokens %d: want the third beside the second",
				who(first), who(second), who(third))
		}
		tr.r.Close()
		close(release)
		for range 3 {
			<-done
		}
	})
}

// TestSlowStartWithEveryPolicy: whatever the policy, a decode worker that
// joins a serving fleet gets a small share of new requests at first and
// its full share once its slow start is over.
func TestSlowStartWithEveryPolicy(t *testing.T) {
	for _, pol := range PolicyNames() {
		t.Run(pol, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 1, 0, func(c *Config) {
					withPolicy(pol)(c)
					c.SlowStart = 10 * time.Second
				})
				defer tr.r.Close()
				joiner := &fakeWorker{role: workerapi.RoleDecode, host: "decode9", leg: okLeg(workerapi.RoleDecode)}
				tr.net.add(joiner.host, joiner)
				if _, err := tr.r.Fleet().Registry().(*registry.Static).Add("decode", joiner.url()); err != nil {
					t.Fatal(err)
				}
				for w := tr.r.Fleet().Workers("decode"); len(w) < 2 || w[1].State() != fleet.StateReady; w = tr.r.Fleet().Workers("decode") {
					advance(time.Second)
				}
				share := func() float64 {
					before := len(must(joiner.received()))
					const n = 200
					for i := range n {
						if a := generate(t.Context(), tr.r, fmt.Sprintf("r%d", i)); a.err != nil {
							t.Fatal(a.err)
						}
					}
					return float64(len(must(joiner.received()))-before) / n
				}
				early := share()
				advance(10 * time.Second)
				late := share()
				if early > 0.25 || late < 0.35 || late <= early {
					t.Fatalf("joiner's share %.2f at first, %.2f after its slow start; want ≤ 0.25, then ≥ 0.35", early, late)
				}
			})
		})
	}
}

func must(legs []workerapi.GenerateBody, _ []workerapi.AbortBody, _ int) []workerapi.GenerateBody {
	return legs
}

// TestRetryRulesWithEveryPolicy: whatever the policy, the retry of a
// request whose decode refused the KV handshake never goes back to that
// decode worker (exclude), and the retry after a corrupted transfer goes to
// other workers than the failed pair's (avoid).
func TestRetryRulesWithEveryPolicy(t *testing.T) {
	for _, pol := range PolicyNames() {
		t.Run(pol, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 2, 2, 0, func(c *Config) {
					withPolicy(pol)(c)
					c.BreakerFailures = 100 // the pair breakers are not under test here
				})
				defer tr.r.Close()
				for _, p := range tr.prefill {
					p.setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
				}
				for _, d := range tr.decode {
					d.setLeg(byGen(failWith(workerapi.OutcomeError(outcome.PeerRefused, "auth token mismatch", outcome.Cause{})),
						okLeg(workerapi.RoleDecode)))
				}
				for i := range 4 {
					if a := generate(t.Context(), tr.r, fmt.Sprintf("x%d", i)); a.err != nil {
						t.Fatalf("request %d: %+v", i, a.err)
					}
				}
				for _, d := range tr.decode {
					legs, _, _ := d.received()
					byRID := map[string][]uint32{}
					for _, l := range legs {
						rid := strings.Split(l.RID, "-g")[0]
						byRID[rid] = append(byRID[rid], l.Gen)
					}
					for rid, gs := range byRID {
						if len(gs) > 1 {
							t.Errorf("%s went back to %s for its retry (gens %v)", rid, d.host, gs)
						}
					}
				}
				// A corrupted transfer: the retry avoids both workers.
				corrupt := workerapi.OutcomeError(outcome.FailedTransfer, "checksum mismatch", outcome.Cause{})
				for _, d := range tr.decode {
					d.setLeg(byGen(failWith(corrupt), okLeg(workerapi.RoleDecode)))
				}
				for i := range 4 {
					rid := fmt.Sprintf("y%d", i)
					if a := generate(t.Context(), tr.r, rid); a.err != nil {
						t.Fatalf("request %s: %+v", rid, a.err)
					}
					// (A prefill leg the router cancels at once may never
					// reach its worker: only the decode side sees both.)
					for role, ws := range map[string][]*fakeWorker{"prefill": tr.prefill, "decode": tr.decode} {
						hosts := map[string]int{}
						n := 0
						for _, w := range ws {
							legs, _, _ := w.received()
							for _, l := range legs {
								if strings.Split(l.RID, "-g")[0] == rid {
									hosts[w.host]++
									n++
								}
							}
						}
						if len(hosts) != n || (role == "decode" && n != 2) {
							t.Errorf("%s: %s attempts on %v, want the retry on the other worker", rid, role, hosts)
						}
					}
				}
			})
		})
	}
}

// routerHealth returns the router's /health answer.
func routerHealth(t *testing.T, r *Router) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
	var body map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	return rec.Code, body
}

// isShed checks that a is the router's 429 for reason.
func isShed(t *testing.T, a answer, reason string) {
	t.Helper()
	if a.err == nil || a.err.Status != http.StatusTooManyRequests || a.err.Code != "overloaded" ||
		a.err.RetryAfter != time.Second || !strings.Contains(a.err.Message, "shed: "+reason) {
		t.Fatalf("got %+v, want 429 overloaded with Retry-After 1s, shed for %s", a.err, reason)
	}
}

// TestAdmissionHysteresis: a decode worker that reports a queue of 4 (or
// KV use 0.92), or a prefill worker with a queue of 4, takes no new
// request: with no other worker of its role, the client gets 429
// overloaded with Retry-After at once, and the worker is not contacted. It
// takes requests again only below the recovery threshold (queue < 2, KV
// use < 0.85), not just below the threshold; a report older than the
// staleness cutoff no longer counts.
func TestAdmissionHysteresis(t *testing.T) {
	for _, c := range []struct {
		reason         string
		decode         bool
		high, mid, low workerapi.Load
	}{
		{"decode_queue", true, workerapi.Load{Queued: 4}, workerapi.Load{Queued: 3}, workerapi.Load{Queued: 1}},
		{"decode_kv", true, workerapi.Load{PagesUsed: 920}, workerapi.Load{PagesUsed: 860}, workerapi.Load{PagesUsed: 800}},
		{"prefill_queue", false, workerapi.Load{Queued: 4}, workerapi.Load{Queued: 2}, workerapi.Load{Queued: 1}},
	} {
		t.Run(c.reason, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 1, 0, nil)
				defer tr.r.Close()
				w := tr.prefill[0]
				if c.decode {
					w = tr.decode[0]
				}
				legsOf := func() int { legs, _, _ := w.received(); return len(legs) }
				report := func(l workerapi.Load) {
					w.reportLoad(l)
					advance(150 * time.Millisecond)
				}
				report(c.mid)
				if a := generate(t.Context(), tr.r, "below"); a.err != nil {
					t.Fatalf("below the threshold: %+v", a.err)
				}
				report(c.high)
				before := legsOf()
				isShed(t, generate(t.Context(), tr.r, "high"), c.reason)
				if legsOf() != before {
					t.Fatal("a shed request reached the worker")
				}
				report(c.mid)
				isShed(t, generate(t.Context(), tr.r, "mid"), c.reason) // hysteresis: not recovered yet
				report(c.low)
				if a := generate(t.Context(), tr.r, "low"); a.err != nil {
					t.Fatalf("recovered: %+v", a.err)
				}
				if n := counter(t, tr.reg, "pdserve_router_shed_total", "reason", c.reason); n != 2 {
					t.Errorf("shed %s: %v, want 2", c.reason, n)
				}
				if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "overloaded"); n != 2 {
					t.Errorf("requests overloaded: %v, want 2", n)
				}
				// Saturated again, then the worker stops reporting: after
				// the staleness cutoff only the router's own count is left.
				report(c.high)
				isShed(t, generate(t.Context(), tr.r, "again"), c.reason)
				w.setReport(nil)
				advance(DefaultLoadStaleness + 200*time.Millisecond)
				if a := generate(t.Context(), tr.r, "stale"); a.err != nil {
					t.Fatalf("with a stale report: %+v", a.err)
				}
				if code, _ := routerHealth(t, tr.r); code != http.StatusOK {
					t.Errorf("router /health %d: shedding load is no reason to be unready", code)
				}
			})
		})
	}
}

// TestAdmitBeforeTheBody: when every decode worker (or every colocated
// worker) is saturated, or the router holds --max-inflight-requests, the
// front door answers 429 before it reads the body: a request whose body
// would be a 400 gets the 429 (with Retry-After and the time to it as
// Server-Timing), counted as shed once; the same body with room is a 400.
func TestAdmitBeforeTheBody(t *testing.T) {
	for _, c := range []struct {
		name, reason string
		np, nd, nc   int
		edit         func(*Config)
		saturate     func(tr *testRouter)
	}{
		{"decode_queue", "decode_queue", 1, 1, 0, nil, func(tr *testRouter) { tr.decode[0].reportLoad(workerapi.Load{Queued: 4}) }},
		{"colocated", "decode_queue", 0, 0, 1, nil, func(tr *testRouter) { tr.colocated[0].reportLoad(workerapi.Load{Queued: 4}) }},
		{"max_inflight", "max_inflight", 1, 1, 0, func(c *Config) {
			a := DefaultAdmission()
			a.MaxInflight = 1
			c.Admission = &a
		}, func(tr *testRouter) { tr.r.inflight.Add(1) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, c.np, c.nd, c.nc, c.edit)
				defer tr.r.Close()
				h := tr.r.Handler()
				post := func() *httptest.ResponseRecorder {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(`{"prompt": [1, 2,`)))
					return rec
				}
				if rec := post(); rec.Code != http.StatusBadRequest {
					t.Fatalf("with room: %d %s, want the body's 400", rec.Code, rec.Body)
				}
				c.saturate(tr)
				advance(150 * time.Millisecond)
				rec := post()
				if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"code":"overloaded"`) ||
					!strings.Contains(rec.Body.String(), "shed: "+c.reason) || rec.Header().Get("Retry-After") != "1" {
					t.Fatalf("saturated: %d %v %s, want 429 overloaded (shed: %s) with Retry-After 1", rec.Code, rec.Header(), rec.Body, c.reason)
				}
				var ms float64
				if st := rec.Header().Get("Server-Timing"); !strings.HasPrefix(st, openai.ServerTimingShed+";dur=") {
					t.Errorf("Server-Timing %q, want %s;dur=<ms>", st, openai.ServerTimingShed)
				} else if _, err := fmt.Sscanf(st, openai.ServerTimingShed+";dur=%g", &ms); err != nil || ms < 0 {
					t.Errorf("Server-Timing %q: %v", st, err)
				}
				if n := counter(t, tr.reg, "pdserve_router_shed_total", "reason", c.reason); n != 1 {
					t.Errorf("shed %s: %v, want 1", c.reason, n)
				}
			})
		})
	}
}

// TestMaxInflightRequests: beyond --max-inflight-requests the router
// answers 429 at once; when one ends, the next is served.
func TestMaxInflightRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(c *Config) {
			a := DefaultAdmission()
			a.MaxInflight = 1
			c.Admission = &a
		})
		defer tr.r.Close()
		tr.decode[0].setLeg(after(time.Second, okLeg(workerapi.RoleDecode)))
		first := make(chan answer, 1)
		go func() { first <- generate(t.Context(), tr.r, "first") }()
		synctest.Wait()
		isShed(t, generate(t.Context(), tr.r, "second"), "max_inflight")
		if a := <-first; a.err != nil {
			t.Fatal(a.err)
		}
		if a := generate(t.Context(), tr.r, "third"); a.err != nil {
			t.Fatalf("after the first ended: %+v", a.err)
		}
	})
}

// TestWorkerOverloadRetriedElsewhere: a decode worker that answers 429
// overloaded (its --max-queued-requests) has the request retried on another
// worker at once, and gets no new request until it reports room; when every
// worker is overloaded the client gets the 429 with Retry-After.
func TestWorkerOverloadRetriedElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, withPolicy(PolicyRoundRobin))
		defer tr.r.Close()
		full := failWith(workerapi.OutcomeError(outcome.Overloaded, "its queue is full", outcome.Cause{}))
		tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
		tr.decode[1].setLeg(full) // round robin starts with decode1
		a := generate(t.Context(), tr.r, "r1")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("retried elsewhere: %+v", a)
		}
		if n := counter(t, tr.reg, "pdserve_router_retries_total", "cause", "overloaded"); n != 1 {
			t.Errorf("retries for overloaded %v", n)
		}
		for i := range 3 {
			if a := generate(t.Context(), tr.r, fmt.Sprintf("n%d", i)); a.err != nil {
				t.Fatal(a.err)
			}
		}
		if got := legCounts(tr.decode); got[1] != 1 {
			t.Fatalf("the overloaded worker got %d legs, want only the one it refused", got[1])
		}
		// Both overloaded: the client gets the 429.
		tr.decode[0].setLeg(full)
		advance(DefaultLoadStaleness + 100*time.Millisecond) // decode1's mark expires (no report)
		tr.prefill[0].setLeg(untilAborted)
		a = generate(t.Context(), tr.r, "r2")
		if a.err == nil || a.err.Status != http.StatusTooManyRequests || a.err.Code != "overloaded" || a.err.RetryAfter != time.Second {
			t.Fatalf("every worker overloaded: %+v", a.err)
		}
		if n := counter(t, tr.reg, "pdserve_router_shed_total", "reason", "worker_overloaded"); n != 1 {
			t.Errorf("shed worker_overloaded %v", n)
		}
		// Both marked: the next is shed by the router itself.
		isShed(t, generate(t.Context(), tr.r, "r3"), "worker_overloaded")
	})
}

// histSum reads a histogram's sample count and sum.
func histSum(t *testing.T, reg prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0, 0
}

// TestClientMetrics: the router observes what the client sees, on its
// clock: TTFT, the gaps between tokens (a chunk of n tokens n gaps), the
// end to end time (also for a request that failed after its first token,
// so that the E2E count follows TTFT's), the time before its legs were
// sent, and the tokens.
func TestClientMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		// The legs pace their tokens on the bubble's fake clock.
		tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
			time.Sleep(50 * time.Millisecond)
			w.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
			time.Sleep(20 * time.Millisecond)
			w.line(workerapi.StreamLine{TokenIDs: []int32{11, 12}, Logprobs: []float32{-1, -1}, FinishReason: "length"})
		})
		if a := generate(t.Context(), tr.r, "ok"); a.err != nil {
			t.Fatal(a.err)
		}
		tr.decode[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
			time.Sleep(30 * time.Millisecond)
			w.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
			time.Sleep(10 * time.Millisecond)
			w.fail(workerapi.NewError(outcome.FailedInternal, "model failed", outcome.Cause{}))
		})
		if a := generate(t.Context(), tr.r, "fails"); a.err == nil {
			t.Fatal("the second request succeeded")
		}
		const eps = 1e-9
		for _, c := range []struct {
			name  string
			count uint64
			sum   float64
		}{
			{"pdserve_router_time_to_first_token_seconds", 2, 0.05 + 0.03},
			{"pdserve_router_inter_token_latency_seconds", 2, 0.02},
			{"pdserve_router_e2e_request_latency_seconds", 2, 0.07 + 0.04},
			{"pdserve_router_request_queue_time_seconds", 2, 0},
		} {
			n, sum := histSum(t, tr.reg, c.name)
			if n != c.count || sum < c.sum-eps || sum > c.sum+eps {
				t.Errorf("%s: %d observations summing to %v, want %d and %v", c.name, n, sum, c.count, c.sum)
			}
		}
		if n := counter(t, tr.reg, "pdserve_router_prompt_tokens_total"); n != 6 {
			t.Errorf("prompt tokens %v, want 6", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_generation_tokens_total"); n != 4 {
			t.Errorf("generation tokens %v, want 4", n)
		}
	})
}

// TestShedReasonsAreTheMetrics: every shed reason has its series.
func TestShedReasonsAreTheMetrics(t *testing.T) {
	var names []string
	for s := ShedMaxInflight; s < numShedReasons; s++ {
		names = append(names, s.String())
	}
	if !cmp.Equal(names, metrics.ShedReasons) {
		t.Fatalf("router shed reasons %v, metrics %v", names, metrics.ShedReasons)
	}
}

// TestFleetFailureRetriedUnshed: a request whose decode leg fails because
// its worker shuts down (a drain ran out, a role flip) is retried even when
// every prefill worker has become saturated since it was admitted: the
// fleet's failure is not the client's 429. A new request is shed then.
func TestFleetFailureRetriedUnshed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, withPolicy(PolicyRoundRobin))
		defer tr.r.Close()
		tr.prefill[0].setLeg(byGen(untilAborted, okLeg(workerapi.RolePrefill)))
		// Round robin starts with decode1: it sees the prefill worker
		// saturate, then shuts down.
		tr.decode[1].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			tr.prefill[0].reportLoad(workerapi.Load{Queued: 4})
			advance(150 * time.Millisecond) // the router polls the load
			w.fail(workerapi.OutcomeError(outcome.Shutdown, "worker is shutting down", outcome.Cause{}))
		})
		a := generate(t.Context(), tr.r, "r1")
		if a.err != nil || !cmp.Equal(a.tokens, okTokens) {
			t.Fatalf("retried: %+v", a)
		}
		if n := counter(t, tr.reg, "pdserve_router_retries_total", "cause", "shutdown"); n != 1 {
			t.Errorf("retries for shutdown %v, want 1", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_shed_total", "reason", "prefill_queue"); n != 0 {
			t.Errorf("shed %v before any new request", n)
		}
		isShed(t, generate(t.Context(), tr.r, "new"), "prefill_queue")
	})
}

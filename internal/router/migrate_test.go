package router

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/openai/openaitest"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// stepToken is the scripted model of these tests: output step s is token
// 100+s, on every worker, as the real sampler's draw is a function of the
// step.
func stepToken(s int) int32 { return int32(100 + s) }

// scripted serves a decode or colocated leg with the scripted model from
// output step ContinuedTokens on, one token a line, up to its max_tokens;
// with breakAfter ≥ 0 it breaks off its stream (EOF, no last line) after
// that many tokens.
func scripted(breakAfter int) legFunc {
	return func(_ context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
		for i := range b.MaxTokens {
			if i == breakAfter {
				if i == 0 {
					w.line(workerapi.StreamLine{}) // status 200, then EOF
				}
				return
			}
			l := workerapi.StreamLine{TokenIDs: []int32{stepToken(b.ContinuedTokens + i)}, Logprobs: []float32{-float32(b.ContinuedTokens + i)}}
			if i == b.MaxTokens-1 {
				l.FinishReason, l.OutputTokens = "length", b.MaxTokens
			}
			w.line(l)
		}
	}
}

// uninterrupted is the scripted model's output of n tokens.
func uninterrupted(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = stepToken(i)
	}
	return out
}

// migrationRequest is the request of these tests: 6 output tokens, at
// least 4, a 10 s timeout.
func migrationRequest(rid string) *openai.GenerateRequest {
	return &openai.GenerateRequest{RID: rid, InputIDs: []int32{1, 2, 3}, MaxTokens: 6, MinTokens: 4, Timeout: 10 * time.Second,
		Sampling: model.SamplingParams{TopP: 1, Temperature: 1, Seed: 7}}
}

// TestContinuedAfterDecodeBreaks: a decode worker that breaks off its
// stream after 2 tokens reached the client: the request is continued on
// the other decode worker with the prompt and those 2 tokens as input,
// continued_tokens 2 and what is left of max_tokens, min_tokens and the
// timeout; the client gets the uninterrupted output, one migration is
// counted with its delay, and the request's history says so.
func TestContinuedAfterDecodeBreaks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		// As a real decode leg waits for its KV, each decode leg here
		// starts once the prefill leg of its gen arrived.
		prefilled := map[uint32]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
		tr.prefill[0].setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
			close(prefilled[b.Gen])
			okLeg(workerapi.RolePrefill)(ctx, b, ab, w)
		})
		afterPrefill := func(leg legFunc) legFunc {
			return func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
				select {
				case <-prefilled[b.Gen]:
					leg(ctx, b, ab, w)
				case <-ctx.Done():
				}
			}
		}
		for _, d := range tr.decode {
			d.setLeg(byGen(afterPrefill(scripted(2)), afterPrefill(scripted(-1))))
		}
		a := generateReq(t.Context(), tr.r, migrationRequest("rid"))
		if a.err != nil || a.finish != "length" || !cmp.Equal(a.tokens, uninterrupted(6)) {
			t.Fatalf("got %+v, want the uninterrupted %v", a, uninterrupted(6))
		}
		var first, cont []workerapi.GenerateBody
		for _, d := range tr.decode {
			legs, _, _ := d.received()
			for _, l := range legs {
				if l.Gen == 1 {
					first = append(first, l)
				} else {
					cont = append(cont, l)
				}
			}
			if len(legs) > 1 {
				t.Errorf("%s got %d legs: the continuation went back to the worker that broke", d.host, len(legs))
			}
		}
		if len(first) != 1 || len(cont) != 1 {
			t.Fatalf("decode legs: %d first, %d continuations", len(first), len(cont))
		}
		c := cont[0]
		if want := []int32{1, 2, 3, 100, 101}; !cmp.Equal(c.InputIDs, want) || c.ContinuedTokens != 2 || c.MaxTokens != 4 ||
			c.MinTokens != 2 || c.Gen != 2 || c.RID != "rid-g2" || c.Room != first[0].Room {
			t.Errorf("continuation leg: input %v continued %d max %d min %d gen %d rid %q room %q", c.InputIDs, c.ContinuedTokens,
				c.MaxTokens, c.MinTokens, c.Gen, c.RID, c.Room)
		}
		if c.TimeoutMS <= 0 || c.TimeoutMS > 10_000 {
			t.Errorf("continuation timeout %d ms, want what is left of 10 s", c.TimeoutMS)
		}
		if c.SamplingParams.Seed != 7 || c.SamplingParams.Temperature != 1 {
			t.Errorf("continuation sampling %+v", c.SamplingParams)
		}
		plegs, _, _ := tr.prefill[0].received()
		if n := len(plegs); n != 2 || plegs[1].Gen != 2 || !cmp.Equal(plegs[1].InputIDs, c.InputIDs) || plegs[1].ContinuedTokens != 2 {
			t.Errorf("prefill legs %+v: the continuation's prefill must carry the same body", plegs)
		}
		if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 1 {
			t.Errorf("migrations %v, want 1", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_retries_total", "cause", "worker_stream_broken"); n != 0 {
			t.Errorf("retries %v: a continuation is no retry", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok"); n != 1 {
			t.Errorf("requests ok %v", n)
		}
		if h := series(t, tr.reg, "pdserve_router_migration_delay_seconds").GetHistogram(); h.GetSampleCount() != 1 {
			t.Errorf("migration delay observations %d, want 1", h.GetSampleCount())
		}
	})
}

// TestContinuedInPlainMode: a colocated worker that breaks off after 3
// tokens, or is found down by its health checks after 3, has its request
// continued on the other colocated worker.
func TestContinuedInPlainMode(t *testing.T) {
	for _, how := range []string{"broken", "found down"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 0, 0, 2, nil)
				defer tr.r.Close()
				for _, w := range tr.colocated {
					first := scripted(3)
					if how == "found down" {
						first = func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, lw *legWriter) {
							for i := range 3 {
								lw.line(workerapi.StreamLine{TokenIDs: []int32{stepToken(i)}, Logprobs: []float32{0}})
							}
							w.setHealth(func(context.Context) int { return http.StatusServiceUnavailable })
							<-ctx.Done()
						}
					}
					w.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, lw *legWriter) {
						if b.ContinuedTokens == 0 {
							first(ctx, b, ab, lw)
							return
						}
						scripted(-1)(ctx, b, ab, lw)
					})
				}
				a := generateReq(t.Context(), tr.r, migrationRequest("rid"))
				if a.err != nil || a.finish != "length" || !cmp.Equal(a.tokens, uninterrupted(6)) {
					t.Fatalf("got %+v, want the uninterrupted %v", a, uninterrupted(6))
				}
				var conts []workerapi.GenerateBody
				for _, w := range tr.colocated {
					legs, _, _ := w.received()
					for _, l := range legs {
						if l.ContinuedTokens > 0 {
							conts = append(conts, l)
						}
					}
				}
				if len(conts) != 1 || !cmp.Equal(conts[0].InputIDs, []int32{1, 2, 3, 100, 101, 102}) || conts[0].MaxTokens != 3 ||
					conts[0].MinTokens != 1 || conts[0].RID != "rid-g2" {
					t.Fatalf("continuations %+v", conts)
				}
				cause := "worker_stream_broken"
				if how == "found down" {
					cause = "worker_unreachable"
				}
				if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", cause); n != 1 {
					t.Errorf("migrations{%s} %v", cause, n)
				}
			})
		})
	}
}

// TestContinuationBounds: --max-migrations bounds the continuations (and 0
// turns them off); a failure of the request (not of its worker) is not
// continued; a second failure with the same cause before any
// new token, the worker still answering, ends the request.
func TestContinuationBounds(t *testing.T) {
	run := func(t *testing.T, maxMig int, leg legFunc, g *openai.GenerateRequest) (answer, *testRouter) {
		tr := newTestRouter(t, 1, 3, 0, func(c *Config) { c.MaxMigrations = maxMig })
		t.Cleanup(func() { tr.r.Close() })
		for _, d := range tr.decode {
			d.setLeg(leg)
		}
		return generateReq(t.Context(), tr.r, g), tr
	}
	breakEach := func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
		scripted(1)(ctx, b, ab, w) // one token, then EOF
	}
	t.Run("max", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, tr := run(t, 2, breakEach, migrationRequest("rid"))
			if a.err == nil || a.err.Code != "worker_stream_broken" || !cmp.Equal(a.tokens, uninterrupted(3)) {
				t.Fatalf("got %+v, want 3 tokens (two continuations), then worker_stream_broken", a)
			}
			if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 2 {
				t.Errorf("migrations %v, want 2", n)
			}
		})
	})
	t.Run("off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, _ := run(t, -1, breakEach, migrationRequest("rid"))
			if a.err == nil || a.err.Code != "worker_stream_broken" || !cmp.Equal(a.tokens, uninterrupted(1)) {
				t.Fatalf("got %+v, want 1 token then worker_stream_broken", a)
			}
		})
	})
	t.Run("request failure", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, tr := run(t, 0, func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
				w.line(workerapi.StreamLine{TokenIDs: []int32{100}, Logprobs: []float32{0}})
				w.fail(workerapi.NewError(outcome.TimeoutRequest, "the request ran out of time", outcome.Cause{}))
			}, migrationRequest("rid"))
			if a.err == nil || a.err.Code != "timeout_request" {
				t.Fatalf("got %+v, want timeout_request", a)
			}
			if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 0 {
				t.Errorf("migrations %v", n)
			}
		})
	})
	t.Run("same failure twice", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, tr := run(t, 0, byGen(scripted(2), scripted(0)), migrationRequest("rid"))
			if a.err == nil || a.err.Code != "worker_stream_broken" || !cmp.Equal(a.tokens, uninterrupted(2)) {
				t.Fatalf("got %+v, want 2 tokens then worker_stream_broken", a)
			}
			if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 1 {
				t.Errorf("migrations %v, want 1", n)
			}
		})
	})
}

// TestCompleteOutputFinishedAtTheRouter: a leg that breaks after its last
// token (max_tokens reached, or EOS) but before its last line is finished
// by the router, with no new leg.
func TestCompleteOutputFinishedAtTheRouter(t *testing.T) {
	for _, c := range []struct {
		name   string
		tokens []int32
		finish string
	}{{"length", uninterrupted(6), "length"}, {"eos", []int32{100, 101, 2}, "stop"}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 2, 0, func(cfg *Config) { cfg.EOS = []int32{2} })
				defer tr.r.Close()
				for _, d := range tr.decode {
					d.setLeg(func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
						for _, tok := range c.tokens {
							w.line(workerapi.StreamLine{TokenIDs: []int32{tok}, Logprobs: []float32{0}})
						}
					})
				}
				g := migrationRequest("rid")
				g.MinTokens = 0
				a := generateReq(t.Context(), tr.r, g)
				if a.err != nil || a.finish != c.finish || !cmp.Equal(a.tokens, c.tokens) {
					t.Fatalf("got %+v, want %v and %q", a, c.tokens, c.finish)
				}
				n := 0
				for _, d := range tr.decode {
					legs, _, _ := d.received()
					n += len(legs)
				}
				if n != 1 {
					t.Fatalf("%d decode legs, want 1", n)
				}
			})
		})
	}
}

// TestContinuationOnlyToWorkersThatCan: a continuation goes only to a pair
// whose workers list the "continue" feature; requests that need no feature
// still use an older worker for their first legs.
func TestContinuationOnlyToWorkersThatCan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 3, 0, func(c *Config) { c.DecodePolicy = PolicyRoundRobin })
		defer tr.r.Close()
		for _, d := range tr.decode {
			d.setLeg(byGen(scripted(2), scripted(-1)))
		}
		tr.decode[0].setOld()
		advance(3 * time.Second) // the next health check reads its info
		for i := range 6 {
			g := &openai.GenerateRequest{RID: fmt.Sprintf("r%d", i), InputIDs: []int32{1, 2, 3}, MaxTokens: 6,
				Sampling: model.SamplingParams{TopP: 1, Seed: 7}}
			if a := generateReq(t.Context(), tr.r, g); a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		legs, _, _ := tr.decode[0].received()
		if len(legs) == 0 {
			t.Fatal("the older worker got no leg at all")
		}
		if slices.ContainsFunc(legs, func(b workerapi.GenerateBody) bool { return b.ContinuedTokens > 0 }) {
			t.Fatal("a continuation went to a worker without the continue feature")
		}
	})
}

// TestContinuationInHistory: /debug/requests/{rid} shows the migration
// while the continuation runs.
func TestContinuationInHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		release := make(chan struct{})
		for _, d := range tr.decode {
			d.setLeg(byGen(scripted(2), func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
				<-release
				scripted(-1)(ctx, b, ab, w)
			}))
		}
		done := make(chan answer, 1)
		go func() { done <- generateReq(t.Context(), tr.r, migrationRequest("rid")) }()
		synctest.Wait()
		info, ok := tr.r.Request("rid")
		if !ok {
			t.Fatal("request not tracked")
		}
		found := slices.ContainsFunc(info.History, func(h workerapi.HistoryEntry) bool {
			return strings.Contains(h.What, "continued on a new pair after 2 output tokens (migration 1)")
		})
		if !found || info.Gen != 2 || info.Migrations != 1 {
			t.Errorf("history %+v (gen %d), want the continuation", info.History, info.Gen)
		}
		// The continuation waits in stage legs: the router's oldest age
		// of that stage grows with it.
		advance(2 * time.Second)
		if g := series(t, tr.reg, "pdserve_router_oldest_request_age_seconds", "stage", "legs").GetGauge().GetValue(); g < 2 {
			t.Errorf("oldest request in legs %v s, want ≥ 2", g)
		}
		if g := series(t, tr.reg, "pdserve_router_leg_timeout_seconds").GetGauge().GetValue(); g != DefaultLegTimeout.Seconds() {
			t.Errorf("leg timeout gauge %v", g)
		}
		close(release)
		if a := <-done; a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
			t.Fatalf("got %+v", a)
		}
	})
}

// seededToken is the scripted model of choices: output step s of a
// sequence drawn with seed is a token that depends on both.
func seededToken(seed uint64, s int) int32 { return int32(seed%1000) + int32(s) }

// choicesLeg serves a leg with n choices as the worker draws them (choice
// i with model.ForkSeed(seed, i)), from output step ContinuedTokens on;
// with breakAfter ≥ 0 it breaks off after that many tokens of each choice.
func choicesLeg(breakAfter int) legFunc {
	return func(_ context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
		n := max(b.N, 1)
		for s := range b.MaxTokens {
			if s == breakAfter {
				return
			}
			for i := range n {
				l := workerapi.StreamLine{Index: i, TokenIDs: []int32{seededToken(model.ForkSeed(b.Seed, i), b.ContinuedTokens+s)},
					Logprobs: []float32{-1}}
				if s == b.MaxTokens-1 {
					l.FinishReason, l.More = "length", i < n-1
				}
				w.line(l)
			}
		}
	}
}

// TestChoicesContinuedOneByOne: a request with n = 3 whose decode (or
// colocated) worker breaks off after 2 tokens of each choice is continued
// choice by choice, each with its fork's seed and its own output so far;
// the client gets every choice's uninterrupted output.
func TestChoicesContinuedOneByOne(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				np, nd, nc := 1, 2, 0
				if plain {
					np, nd, nc = 0, 0, 2
				}
				tr := newTestRouter(t, np, nd, nc, nil)
				defer tr.r.Close()
				ws := append(tr.decode, tr.colocated...)
				for _, w := range ws {
					w.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, lw *legWriter) {
						if b.N == 3 {
							choicesLeg(2)(ctx, b, ab, lw)
							return
						}
						choicesLeg(-1)(ctx, b, ab, lw)
					})
				}
				g := migrationRequest("rid")
				g.N = 3
				a, err := openaitest.Run(t.Context(), tr.r, *g)
				if err != nil {
					t.Fatalf("got %v", err)
				}
				for i := range 3 {
					want := make([]int32, g.MaxTokens)
					for s := range want {
						want[s] = seededToken(model.ForkSeed(7, i), s)
					}
					if got := a.IDs(i); !cmp.Equal(got, want) || a.Finish[i] != "length" {
						t.Errorf("choice %d: %v (%s), want %v", i, got, a.Finish[i], want)
					}
				}
				var conts []workerapi.GenerateBody
				for _, w := range ws {
					legs, _, _ := w.received()
					for _, l := range legs {
						if l.N != 3 {
							conts = append(conts, l)
						}
					}
				}
				if len(conts) != 3 {
					t.Fatalf("%d continuation legs, want one a choice", len(conts))
				}
				for _, c := range conts {
					if c.ContinuedTokens != 2 || c.MaxTokens != 4 || c.MinTokens != 2 || !strings.HasPrefix(c.RID, "rid-c") {
						t.Errorf("continuation %+v", c)
					}
				}
				if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 1 {
					t.Errorf("migrations %v, want 1", n)
				}
				if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok"); n != 1 {
					t.Errorf("requests ok %v, want 1 (the choices' continuations are not requests)", n)
				}
			})
		})
	}
}

// TestContinuedOnRestartedWorker: a worker that failed a request (its
// drain timed out) is out of that request's continuations only while it
// runs the same process: once it restarted, the request's next
// continuation may go back to it (in a rolling restart it is often the
// only one back when the next worker drains).
func TestContinuedOnRestartedWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		for i, d := range tr.decode {
			d.setInstance(fmt.Sprintf("d%d-a", i))
		}
		advance(3 * time.Second) // the next health check reads the instances
		restarted := make(chan struct{})
		shutdownAfter := func(n int, wait <-chan struct{}) legFunc {
			return func(_ context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
				for i := range n {
					w.line(workerapi.StreamLine{TokenIDs: []int32{stepToken(b.ContinuedTokens + i)}, Logprobs: []float32{-float32(b.ContinuedTokens + i)}})
				}
				if wait != nil {
					<-wait
				}
				w.fail(workerapi.NewError(outcome.Shutdown, "worker is shutting down", outcome.Cause{}))
			}
		}
		for _, d := range tr.decode {
			d.setLeg(byGen(shutdownAfter(2, nil), shutdownAfter(2, restarted), scripted(-1)))
		}
		done := make(chan answer, 1)
		go func() { done <- generateReq(t.Context(), tr.r, migrationRequest("rid")) }()
		synctest.Wait() // gen 1 failed on one worker; gen 2 holds on the other
		var first *fakeWorker
		for _, d := range tr.decode {
			if legs, _, _ := d.received(); len(legs) == 1 && legs[0].Gen == 1 {
				first = d
			}
		}
		if first == nil {
			t.Fatal("no worker served gen 1 alone")
		}
		first.setInstance("restarted")
		advance(5 * time.Second) // two passing checks of the new process
		close(restarted)
		a := <-done
		if a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
			t.Fatalf("got %+v, want the uninterrupted output continued on the restarted worker", a)
		}
		legs, _, _ := first.received()
		if len(legs) != 2 || legs[1].Gen != 3 || legs[1].ContinuedTokens != 4 {
			t.Fatalf("the restarted worker got %+v, want gen 3 continuing 4 tokens", legs)
		}
	})
}

// TestContinuationWaitsForAWorker: when no other worker of the role is
// ready (the only decode worker broke off, and restarts), the continuation
// waits for one up to MigrationWait instead of failing the request; with
// no wait it fails at once. A buffered (non-streamed) request's delay is
// not observed: its legs send tokens only once a second.
func TestContinuationWaitsForAWorker(t *testing.T) {
	for _, wait := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTestRouter(t, 1, 1, 0, func(c *Config) { c.MigrationWait = wait })
				defer tr.r.Close()
				d := tr.decode[0]
				d.setInstance("a")
				advance(3 * time.Second)
				d.setLeg(byGen(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
					d.setInstance("b") // it breaks off and comes back as a new process
					scripted(2)(ctx, b, ab, w)
				}, scripted(-1)))
				g := migrationRequest("rid")
				g.Buffered = true
				a := generateReq(t.Context(), tr.r, g)
				if wait < 0 {
					if a.err == nil || a.err.Code != "worker_stream_broken" {
						t.Fatalf("got %+v, want worker_stream_broken at once", a)
					}
					return
				}
				if a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
					t.Fatalf("got %+v, want the uninterrupted output once the worker is back", a)
				}
				if a.after < 2*time.Second || a.after > DefaultMigrationWait {
					t.Errorf("answered after %s: want the wait for the restarted worker's passing checks", a.after)
				}
				if h := series(t, tr.reg, "pdserve_router_migration_delay_seconds").GetHistogram(); h.GetSampleCount() != 0 {
					t.Errorf("a buffered request's delay observed %d times", h.GetSampleCount())
				}
			})
		})
	}
}

// TestChoiceCompleteBeforeTheBreak: of a request with n = 2, choice 0 had
// all its tokens out (its finish line lost with the leg) and choice 1 two:
// the router finishes choice 0 itself and continues choice 1 alone.
func TestChoiceCompleteBeforeTheBreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, nil)
		defer tr.r.Close()
		for _, d := range tr.decode {
			d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
				if b.N != 2 {
					choicesLeg(-1)(ctx, b, ab, w)
					return
				}
				for s := range b.MaxTokens {
					w.line(workerapi.StreamLine{TokenIDs: []int32{seededToken(model.ForkSeed(b.Seed, 0), s)}, Logprobs: []float32{-1}})
					if s < 2 {
						w.line(workerapi.StreamLine{Index: 1, TokenIDs: []int32{seededToken(model.ForkSeed(b.Seed, 1), s)}, Logprobs: []float32{-1}})
					}
				}
			})
		}
		g := migrationRequest("rid")
		g.N, g.MinTokens = 2, 0
		a, err := openaitest.Run(t.Context(), tr.r, *g)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			want := make([]int32, g.MaxTokens)
			for s := range want {
				want[s] = seededToken(model.ForkSeed(7, i), s)
			}
			if got := a.IDs(i); !cmp.Equal(got, want) || a.Finish[i] != "length" {
				t.Errorf("choice %d: %v (%s), want %v", i, got, a.Finish[i], want)
			}
		}
		var conts []string
		for _, d := range tr.decode {
			legs, _, _ := d.received()
			for _, l := range legs {
				if l.N != 2 {
					conts = append(conts, l.RID)
				}
			}
		}
		if !cmp.Equal(conts, []string{"rid-c1"}) {
			t.Fatalf("continuations %v, want choice 1's alone", conts)
		}
	})
}

// TestContinuationKeepsItsKVDType: in a fleet that mixes KV dtypes (f16 and
// f32 pairs), a request whose decode worker breaks off is continued only on
// a pair of the dtype its output so far was computed with — another rounds
// K and V otherwise, and the output would not be the uninterrupted one —
// and, when no such pair is left, it fails naming the dtypes instead of
// moving to the other.
func TestContinuationKeepsItsKVDType(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 4, 0, func(c *Config) { c.MigrationWait = time.Second; c.DecodePolicy = PolicyRoundRobin })
		defer tr.r.Close()
		dtype := map[string]string{}
		set := func(w *fakeWorker, dt string) {
			fp := testFingerprint
			fp.DType = dt
			w.setFingerprint(fp)
			dtype[w.url()] = dt
		}
		set(tr.prefill[0], "f16")
		set(tr.prefill[1], "f32")
		for i, d := range tr.decode {
			set(d, []string{"f16", "f32"}[i%2])
			d.setLeg(byGen(scripted(2), scripted(-1)))
		}
		advance(3 * time.Second) // the next health check reads the fingerprints
		for i := range 4 {
			if a := generateReq(t.Context(), tr.r, migrationRequest(fmt.Sprintf("r%d", i))); a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
				t.Fatalf("request %d: %+v", i, a)
			}
		}
		first, cont := map[string]string{}, map[string]string{} // rid → dtype of its decode leg
		for _, w := range append(slices.Clone(tr.decode), tr.prefill...) {
			legs, _, _ := w.received()
			for _, l := range legs {
				rid := strings.TrimSuffix(l.RID, "-g2")
				if l.Gen == 1 {
					first[rid] = dtype[w.url()]
				} else if prev, ok := cont[rid]; ok && prev != dtype[w.url()] {
					t.Errorf("%s: its continuation's legs on %s and %s workers", rid, prev, dtype[w.url()])
				} else {
					cont[rid] = dtype[w.url()]
				}
			}
		}
		if len(first) != 4 || len(cont) != 4 {
			t.Fatalf("first legs %v, continuations %v", first, cont)
		}
		for rid, dt := range first {
			if cont[rid] != dt {
				t.Errorf("%s: computed with %s KV, continued with %s", rid, dt, cont[rid])
			}
		}
		// One f16 decode worker is left, and it breaks: a request it took
		// has no f16 pair to go on with, and is not moved to an f32 one.
		set(tr.decode[2], "bf16") // pairs with no prefill worker
		tr.decode[0].setLeg(scripted(2))
		advance(3 * time.Second)
		sawF16 := false
		for i := range 4 {
			rid := fmt.Sprintf("late%d", i)
			a := generateReq(t.Context(), tr.r, migrationRequest(rid))
			var legs []string
			for _, w := range append(slices.Clone(tr.decode), tr.prefill...) {
				got, _, _ := w.received()
				for _, l := range got {
					if strings.TrimSuffix(l.RID, "-g2") == rid {
						legs = append(legs, fmt.Sprintf("gen %d on %s", l.Gen, dtype[w.url()]))
					}
				}
			}
			started := ""
			for _, l := range tr.decode[0].legsOf(rid) {
				if l.Gen == 1 {
					started = "f16"
				}
			}
			if started != "f16" {
				if a.err != nil || !cmp.Equal(a.tokens, uninterrupted(6)) {
					t.Errorf("%s on an f32 pair: %+v", rid, a)
				}
				continue
			}
			sawF16 = true
			if a.err == nil || slices.ContainsFunc(legs, func(l string) bool { return strings.HasSuffix(l, "f32") }) {
				t.Errorf("%s, started on the only f16 decode worker, which broke: %+v, legs %v; want an error and no f32 leg", rid, a, legs)
			}
		}
		if !sawF16 {
			t.Error("no request was placed on the f16 decode worker")
		}
	})
}

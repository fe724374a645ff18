package lifecycle

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/outcome"
)

// TestOptimisticTightPool is the tight-pool case of optimistic prefill,
// where SGLang's optimistic prefill deadlocked (prefill's pool full of
// optimistic KV waiting for decode, while decode waits on prefill for
// other requests): prefill's pool holds 3 to 6 prompts, decode's 3 to 6,
// 40 requests arrive faster than they are served, and decode opens half of
// the rooms 3 to 5 s late (a busy decode) and the others at once. Whatever
// the cap (max-parked 1: none), every request completes, none by a
// deadline, the unbound KV stays within the cap (checkLegal, after every
// step), and no request whose room is open waits on prefill for the pages
// that KV holds: prefill's waiting stage stays short, where taking no
// pages from unbound KV would leave requests waiting seconds for rooms
// that decode opens late.
func TestOptimisticTightPool(t *testing.T) {
	for _, maxParked := range []float64{0.25, 0.5, 1} {
		t.Run(fmt.Sprintf("max-parked=%v", maxParked), func(t *testing.T) {
			cfgP, cfgD := testConfig(RolePrefill), testConfig(RoleDecode)
			cfgP.OptimisticAttempts, cfgP.OptimisticMaxParked = 2, maxParked
			w := newWorld(t)
			P, D := w.addNode(cfgP, 20, 0), w.addNode(cfgD, 18, 0)
			w.connect()
			rng := rand.New(rand.NewPCG(7, 7))
			type leg struct {
				at time.Time
				to *node
				q  Request
			}
			var legs []leg
			const n = 40
			for i := range n {
				q := request(i, 12+rng.IntN(12), 1+rng.IntN(4)) // 3 to 6 pages
				at := w.now.Add(time.Duration(i) * 20 * time.Millisecond)
				qd := q
				qd.Peer = w.peerOf(D)
				late := time.Duration(rng.IntN(50)) * time.Millisecond
				if i%2 == 0 {
					late = time.Duration(3000+rng.IntN(2000)) * time.Millisecond
				}
				legs = append(legs, leg{at, P, q}, leg{at.Add(late), D, qd})
			}
			start := w.now
			for step := 0; len(P.finals) < n || len(D.finals) < n; step++ {
				if step > 200_000 {
					t.Fatalf("stuck: prefill finished %d, decode %d of %d; prefill %v; decode %v",
						len(P.finals), len(D.finals), n, P.m.Requests(w.now), D.m.Requests(w.now))
				}
				w.now = w.now.Add(5 * time.Millisecond)
				rest := legs[:0]
				for _, l := range legs {
					if w.now.Before(l.at) {
						rest = append(rest, l)
						continue
					}
					w.arrive(l.to, l.q)
				}
				legs = rest
				for _, x := range []*node{P, D} {
					if len(x.inbox) > 0 {
						w.deliver(x, len(x.inbox))
					}
					if len(x.io) > 0 {
						w.runIO(x, len(x.io))
					}
					if x.batch != nil {
						w.batchDone(x, nil) // a forward takes one 5 ms step
					}
					w.schedule(x)
				}
				if w.now.Sub(start)%(100*time.Millisecond) == 0 {
					w.tick()
				}
			}
			for _, x := range []*node{P, D} {
				for rid, f := range x.finals {
					if f.Outcome != outcome.OK {
						t.Fatalf("%s %s ended %s: %s", x.name, rid, f.Outcome, f.Err)
					}
				}
				if st := x.m.Stats(w.now); st.PagesUsed != 0 || st.Live != 0 {
					t.Fatalf("%s holds %d pages, %d live", x.name, st.PagesUsed, st.Live)
				}
			}
			if d := P.m.Stats(w.now).MaxInStage[StageWaiting]; d > 500*time.Millisecond {
				t.Fatalf("a request whose room was open waited %s on prefill", d)
			}
			c := P.m.Stats(w.now).Counters.Optimistic
			if c[OptimisticStarted] == 0 || c[OptimisticSent] == 0 {
				t.Fatalf("no optimistic prefill was sent: %v", c)
			}
			if ended := c[OptimisticSent] + c[OptimisticFellBack]; ended != c[OptimisticStarted] || c[OptimisticExpired]+c[OptimisticAborted] != 0 {
				t.Fatalf("optimistic prefills: %v", c)
			}
			t.Logf("optimistic prefill: %v (started, parked, sent, expired, aborted, fell back); %s", c, w.now.Sub(start))
		})
	}
}

// TestOptimisticOff: with attempts 0 (the default) nothing is computed
// before its ROOM_OPEN.
func TestOptimisticOff(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 8, 1)
	h.step(Arrive{Req: q})
	h.step(Schedule{})
	if h.batch != nil || h.m.reqs[q.RID].stage != StageBootstrap {
		t.Fatalf("computed before ROOM_OPEN with optimistic prefill off:\n%s", describe(h.got))
	}
}

// TestOptimisticFallsBackForBoundRequest: a request whose room is bound
// takes the pages of unbound KV, even KV still being computed, rather than
// wait for it; the unbound request goes back to bootstrap and is computed
// again once its room opens.
func TestOptimisticFallsBackForBoundRequest(t *testing.T) {
	cfg := testConfig(RolePrefill)
	cfg.OptimisticAttempts, cfg.OptimisticMaxParked = 4, 1
	h := newHarness(t, cfg, 8)
	a := request(1, 24, 1) // 6 pages, 2 forwards of 16 tokens
	h.step(Arrive{Req: a})
	h.step(Schedule{})
	h.done(next1)
	if r := h.m.reqs[a.RID]; r.stage != StagePrefilling || !r.opt.unbound || r.computed != 16 {
		t.Fatalf("a: %s unbound=%v computed=%d", r.stage, r.opt.unbound, r.computed)
	}
	b := request(2, 12, 1) // 3 pages: only 2 are free
	h.step(Arrive{Req: b})
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(b)})
	h.step(Schedule{})
	if r := h.m.reqs[a.RID]; r.stage != StageBootstrap || len(r.pages) != 0 {
		t.Fatalf("a kept its KV in %s", r.stage)
	}
	if r := h.m.reqs[b.RID]; r.stage != StagePrefilling || h.batch == nil {
		t.Fatalf("b waits in %s", r.stage)
	}
	c := h.m.Stats(h.now).Counters.Optimistic
	if c[OptimisticStarted] != 1 || c[OptimisticFellBack] != 1 {
		t.Fatalf("counters %v", c)
	}
	// a never starts optimistically again; its room opens and it is computed.
	h.done(next1)
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(a)})
	if r := h.m.reqs[a.RID]; r.stage != StageWaiting {
		t.Fatalf("a in %s after ROOM_OPEN", r.stage)
	}
	if c := h.m.Stats(h.now).Counters.Optimistic; c[OptimisticStarted] != 1 {
		t.Fatalf("a started optimistically again: %v", c)
	}
}

// TestForceFraction: the test hook's pick is a function of the request id
// alone, and picks about the fraction asked for.
func TestForceFraction(t *testing.T) {
	for _, f := range []float64{0, 0.3, 1} {
		pick, again := ForceFraction(f), ForceFraction(f)
		n := 0
		for i := range 10000 {
			rid := fmt.Sprintf("cmpl-%d", i)
			if pick(rid) != again(rid) {
				t.Fatalf("%s picked differently", rid)
			}
			if pick(rid) {
				n++
			}
		}
		if got := float64(n) / 10000; got < f-0.02 || got > f+0.02 {
			t.Fatalf("fraction %v picked %v", f, got)
		}
	}
}

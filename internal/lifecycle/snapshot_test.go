package lifecycle

import (
	"bytes"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
)

// snapshotRun drives a prefill and a decode machine through two requests,
// a lost frame and its timeout, and calls at(m, now) before every step of
// either machine.
func snapshotRun(t *testing.T, at func(n *node, now time.Time)) {
	w := newWorld(t)
	P := w.addNode(mcConfig(RolePrefill, true), 4, 0)
	D := w.addNode(mcConfig(RoleDecode, true), 6, 0)
	w.connect()
	step := func() {
		for _, n := range []*node{P, D} {
			at(n, w.now)
		}
	}
	for i, q := range mcRequests(2, false) {
		q.Sampling = model.SamplingParams{TopP: 1}
		step()
		w.arrive(P, q)
		step()
		w.arrive(D, q)
		if i == 1 {
			step()
			w.drop(P, 0) // r2's ROOM_OPEN: prefill's bootstrap deadline ends it
		}
	}
	for range 40 {
		step()
		switch {
		case len(P.inbox) > 0:
			w.deliver(P, 1)
		case len(D.inbox) > 0:
			w.deliver(D, 1)
		case len(P.io) > 0:
			w.runIO(P, 1)
		case len(D.io) > 0:
			w.runIO(D, 1)
		case P.batch != nil:
			w.batchDone(P, nil)
		case D.batch != nil:
			w.batchDone(D, nil)
		default:
			w.schedule(P)
			w.schedule(D)
			if P.batch == nil && D.batch == nil {
				w.now = w.now.Add(500 * time.Millisecond)
				w.tick()
			}
		}
	}
	if len(D.finals) != 2 || len(P.finals) != 2 {
		t.Fatalf("the run did not end both requests: prefill %d, decode %d", len(P.finals), len(D.finals))
	}
}

// TestCloneIsIndependent: a clone taken at any point answers the rest of
// the run exactly as the machine it was taken from (same effects, same
// state), and stepping the original never changes the clone.
func TestCloneIsIndependent(t *testing.T) {
	type pending struct {
		n     *node
		c     *Machine
		now   time.Time
		enc   []byte
		steps int
	}
	var clones []pending
	count := 0
	snapshotRun(t, func(n *node, now time.Time) {
		count++
		for _, p := range clones {
			if p.n == n {
				if got := p.c.AppendState(nil, p.now); !bytes.Equal(got, p.enc) {
					t.Fatalf("%s: stepping the machine changed a clone taken %d steps before", n.name, count-p.steps)
				}
			}
		}
		if count%3 == 0 {
			c := n.m.Clone()
			if a, b := c.AppendState(nil, now), n.m.AppendState(nil, now); !bytes.Equal(a, b) {
				t.Fatalf("%s: a clone encodes differently from its machine", n.name)
			}
			clones = append(clones, pending{n: n, c: c, now: now, enc: c.AppendState(nil, now), steps: count})
		}
	})
	if len(clones) < 10 {
		t.Fatalf("only %d clones taken", len(clones))
	}
}

// TestNextTimer: at every point of a run, a Tick just before NextTimer
// changes nothing but the clock, and a Tick at it changes the machine.
func TestNextTimer(t *testing.T) {
	checked := 0
	snapshotRun(t, func(n *node, now time.Time) {
		next, ok := n.m.NextTimer()
		if !ok {
			t.Fatalf("%s: no timer, yet a PD worker renews its rooms", n.name)
		}
		if next.Before(now) {
			next = now // overdue: the next Tick acts
		}
		before := next.Add(-time.Nanosecond)
		if before.After(now) {
			a, b := n.m.Clone(), n.m.Clone()
			a.Step(before, IODone{}) // moves the clock only
			b.Step(before, Tick{})
			if effs := b.Ready(); len(effs) > 0 || !bytes.Equal(a.AppendState(nil, before), b.AppendState(nil, before)) {
				t.Fatalf("%s: a Tick %s before NextTimer (%s from now) changed the machine (%d effects)",
					n.name, time.Nanosecond, next.Sub(now), len(effs))
			}
			a.Ready()
		}
		a, b := n.m.Clone(), n.m.Clone()
		a.Step(next, IODone{})
		b.Step(next, Tick{})
		a.Ready()
		if effs := b.Ready(); len(effs) == 0 && bytes.Equal(a.AppendState(nil, next), b.AppendState(nil, next)) {
			t.Fatalf("%s: a Tick at NextTimer (%s from now) changed nothing", n.name, next.Sub(now))
		}
		checked++
	})
	t.Logf("checked at %d points", checked)
}

// TestAppendStateIgnoresTheClock: a machine's encoding is relative to the
// clock it is given, so two runs that differ only by when they started
// encode alike.
func TestAppendStateIgnoresTheClock(t *testing.T) {
	enc := func(start time.Time) []byte {
		h := newHarness(t, testConfig(RoleDecode), 8)
		h.now = start
		q := request(1, 5, 2)
		h.step(PeerUp{Peer: q.Peer})
		h.step(Arrive{Req: q})
		h.advance(300 * time.Millisecond)
		h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.RoomRenew{Rooms: []kvxfer.RoomGen{{Room: q.Room, Gen: 1}}}})
		return h.m.AppendState(nil, h.now)
	}
	a, b := enc(time.Unix(1_000_000, 0)), enc(time.Unix(2_000_000, 0))
	if !bytes.Equal(a, b) {
		t.Fatalf("the same run started at another time encodes differently")
	}
}

// TestAppendStateTellsOptimisticParkTimesApart: binding an optimistic
// request reads when it parked (its kv-hold deadline runs from there), so
// two machines whose request parked at different times must encode
// differently — they end it at different times after ROOM_OPEN.
func TestAppendStateTellsOptimisticParkTimesApart(t *testing.T) {
	q := request(1, 8, 1)
	start := time.Unix(1_000_000, 0)
	mk := func(parkAfter time.Duration) *harness {
		cfg := testConfig(RolePrefill)
		cfg.OptimisticAttempts, cfg.OptimisticMaxParked = 4, 1
		cfg.LeaseMisses = 200
		h := newHarness(t, cfg, 8)
		h.step(Arrive{Req: q})
		h.step(Schedule{})
		h.now = h.now.Add(parkAfter)
		h.done(next1)
		h.now = start.Add(3 * time.Second)
		h.step(Tick{})
		return h
	}
	a, b := mk(time.Second), mk(2*time.Second)
	if bytes.Equal(a.m.AppendState(nil, a.now), b.m.AppendState(nil, b.now)) {
		t.Fatalf("requests parked at +1s and +2s encode alike")
	}
	for _, h := range []*harness{a, b} {
		h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
		h.now = start.Add(31 * time.Second)
		h.step(Tick{})
	}
	_, endedA := a.finalOf(q.RID)
	_, endedB := b.finalOf(q.RID)
	if endedA == endedB {
		t.Fatalf("both ended (%v) at +31s: the park time no longer decides the deadline, and this test no longer shows why it is encoded", endedA)
	}
}

package lifecycle

import (
	"cmp"
	"encoding/binary"
	"maps"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// This file gives a machine what an explicit-state model checker needs
// (modelcheck_test.go): an independent copy (Clone), a canonical encoding
// of its state to hash (AppendState), and the time of its next timer
// (NextTimer), so a checker can let time jump from one deadline to the
// next instead of ticking through every millisecond.

// Clone returns an independent deep copy of m: the same requests in the
// same stages, the same pages (its kvcache.Cache is cloned, allocator and
// prefix cache included), rooms, pending ROOM_OPENs, tombstones, timers
// and counters. Stepping one never changes the other. Effects not yet
// taken by Ready are copied too. Config.ForceOptimistic, a function, is
// shared. Clone is for tests that explore a machine's states; a worker
// never needs one.
func (m *Machine) Clone() *Machine {
	c := *m
	c.cache = m.cache.Clone()
	c.pageHash = slices.Clone(m.pageHash)
	copies := make(map[*req]*req, len(m.queue))
	var cp func(r *req) *req
	cp = func(r *req) *req {
		if r == nil {
			return nil
		}
		if d, ok := copies[r]; ok {
			return d
		}
		d := new(req)
		*d = *r
		copies[r] = d
		d.ban = slices.Clone(r.ban)
		d.pages = slices.Clone(r.pages)
		d.outputs = slices.Clone(r.outputs)
		d.chain = slices.Clone(r.chain)
		d.forkPages = slices.Clone(r.forkPages)
		d.scores = slices.Clone(r.scores)
		d.mask = slices.Clone(r.mask)
		d.contOut = slices.Clone(r.contOut)
		d.recv = slices.Clone(r.recv)
		d.history = slices.Clone(r.history)
		if r.matcher != nil {
			d.matcher = r.matcher.Clone()
		}
		if r.group != nil {
			g := &group{live: r.group.live, outputs: r.group.outputs, members: make([]*req, len(r.group.members))}
			d.group = g
			for i, o := range r.group.members {
				if o == r {
					g.members[i] = d
				}
			}
			for i, o := range r.group.members {
				if o != r {
					om := cp(o)
					g.members[i] = om
					om.group = g
				}
			}
		}
		return d
	}
	c.reqs = make(map[string]*req, len(m.reqs))
	for k, r := range m.reqs {
		c.reqs[k] = cp(r)
	}
	c.rooms = make(map[kvxfer.Room]*req, len(m.rooms))
	for k, r := range m.rooms {
		c.rooms[k] = cp(r)
	}
	c.queue = make([]*req, len(m.queue))
	for i, r := range m.queue {
		c.queue[i] = cp(r)
	}
	c.pending = make(map[kvxfer.Room]*pendingOpen, len(m.pending))
	for k, p := range m.pending {
		d := *p
		c.pending[k] = &d
	}
	c.tombs = maps.Clone(m.tombs)
	c.tombOrder = slices.Clone(m.tombOrder)
	if m.batch != nil {
		c.batch = make([]batchEntry, len(m.batch))
		for i, e := range m.batch {
			e.r = cp(e.r)
			c.batch[i] = e
		}
	}
	c.draining = make(map[*req]struct{}, len(m.draining))
	for r := range m.draining {
		c.draining[cp(r)] = struct{}{}
	}
	c.jobs = make(map[uint64]*req, len(m.jobs))
	for j, r := range m.jobs {
		c.jobs[j] = cp(r)
	}
	c.peersUp = maps.Clone(m.peersUp)
	c.lostPeers = maps.Clone(m.lostPeers)
	c.effects = slices.Clone(m.effects)
	c.counters.FramesDropped = maps.Clone(m.counters.FramesDropped)
	return &c
}

// NextTimer returns the earliest time after which a Tick can change m:
// a stage deadline, a request's time limit or lease, a pending ROOM_OPEN's
// expiry, a tombstone or lost peer to forget, or the next renewal. ok is
// false when nothing is timed (no live request, nothing remembered, and a
// colocated worker, which renews nothing). A Tick at the returned time
// changes m; a Tick between now and then changes nothing but the clock.
func (m *Machine) NextTimer() (at time.Time, ok bool) {
	add := func(t time.Time) {
		if !t.IsZero() && (!ok || t.Before(at)) {
			at, ok = t, true
		}
	}
	for _, r := range m.sortedLive() {
		add(r.deadline)
		add(r.hardDeadline)
		if m.leased(r) && m.mut != mutNoLease {
			add(r.lastRenew.Add(m.cfg.Lease() + 1)) // tick fires once the silence exceeds the lease
		}
	}
	for _, p := range m.pending {
		if m.heldFor(p) == nil {
			add(p.at.Add(m.cfg.BootstrapTimeout))
		}
	}
	for _, lp := range m.lostPeers {
		add(lp.at.Add(m.cfg.TombstoneTTL + 1))
	}
	if len(m.tombOrder) > 0 {
		add(m.tombs[m.tombOrder[0]].until)
	}
	if m.cfg.Role != RoleColocated {
		add(m.lastRenewal.Add(m.cfg.HeartbeatInterval))
	}
	return at, ok
}

// AppendState appends to b a canonical encoding of everything that decides
// what m does with future events, with every time taken relative to now
// (the caller's clock, at or after the last event's): two machines with
// equal encodings at their own clocks answer every sequence of events at
// the same offsets with the same effects. Sequence numbers (jobs, pending
// ROOM_OPENs, admissions) are encoded relative to the machine's counters
// for the same reason, maps in a sorted order, requests in arrival order.
//
// Left out, because no decision reads them: counters, stage times and
// per-stage maxima, history, the text of failure details (a cause is
// encoded by outcome, role and stage), the prefix hash chain each request
// caches (a function of its tokens), and the request bodies beyond their
// identity (rid, room, gen and choice; a router never reuses a rid for
// another body within a gen). A stage's start is encoded only where a
// decision reads it (an optimistic request's binding), and a grammar
// matcher's state through the outputs it was advanced over. Not encoded:
// the top logprobs and forks' tokens of KV_DONE's tail, which only pass
// through to the client. A checker that hashes this encoding thus
// merges states that differ only in those, which is what makes the state
// space finite as the clock runs.
func (m *Machine) AppendState(b []byte, now time.Time) []byte {
	e := stateEnc{b: b, now: now}
	e.time(m.now)
	e.b = m.cache.AppendState(e.b)
	for _, h := range m.pageHash {
		e.b = append(e.b, h[:]...)
	}
	e.u(uint64(len(m.queue)))
	for _, r := range m.queue {
		e.req(m, r)
	}
	// A request that ended and waits for its pages (draining, jobs) is
	// named by rid and choice: it left reqs, so gens cannot collide there.
	e.u(uint64(len(m.draining)))
	if len(m.draining) > 0 {
		for _, r := range sortedReqs(slices.Collect(maps.Keys(m.draining))) {
			e.id(r)
			e.u(uint64(len(r.pages))) // freed when its forward and page I/O end
			for _, p := range r.pages {
				e.u(uint64(p))
			}
			e.u(uint64(len(r.forkPages)))
		}
	}
	e.u(uint64(len(m.jobs)))
	if len(m.jobs) > 0 {
		for _, j := range slices.Sorted(maps.Keys(m.jobs)) {
			e.u(m.jobSeq - j)
			e.id(m.jobs[j])
		}
	}
	e.u(uint64(len(m.batch)))
	for _, be := range m.batch {
		e.id(be.r)
		e.u(uint64(be.gen))
		e.u(uint64(be.tokens))
	}
	e.bool(m.batch != nil)
	e.bool(m.batchCancelled)
	e.u(uint64(len(m.pending)))
	for _, p := range m.pendingInOrder() { // no allocation when there is none
		e.u(m.pendingSeq - p.seq)
		e.roomGen(p.open.RoomGen)
		e.str(p.open.RID)
		e.u(uint64(p.open.NTokens))
		e.u(p.open.PromptHash)
		e.u(uint64(p.peer))
		e.time(p.at)
		e.bool(p.ready)
		e.u(uint64(p.readyNT))
		e.u(uint64(p.readyCached))
	}
	e.u(uint64(len(m.tombOrder)))
	for _, k := range m.tombOrder {
		t, ok := m.tombs[k]
		e.bool(ok)
		e.b = append(e.b, k.room[:]...)
		e.str(k.rid)
		e.u(uint64(t.gen))
		e.u(uint64(t.outcome))
		e.cause(t.cause)
		e.time(t.until)
	}
	e.u(uint64(len(m.peersUp)))
	if len(m.peersUp) > 0 {
		for _, p := range slices.Sorted(maps.Keys(m.peersUp)) {
			e.u(uint64(p))
			e.bool(m.peersUp[p])
		}
	}
	e.u(uint64(len(m.lostPeers)))
	if len(m.lostPeers) > 0 {
		for _, p := range slices.Sorted(maps.Keys(m.lostPeers)) {
			e.u(uint64(p))
			e.time(m.lostPeers[p].at)
			e.u(uint64(m.lostPeers[p].outcome))
		}
	}
	e.time(m.lastRenewal)
	e.bool(m.shutdown)
	e.bool(m.leaving)
	e.u(uint64(len(m.effects)))
	return e.b
}

// sortedReqs orders requests by rid, then choice.
func sortedReqs(rs []*req) []*req {
	slices.SortFunc(rs, func(a, b *req) int {
		return cmp.Or(cmp.Compare(a.RID, b.RID), cmp.Compare(a.choice, b.choice))
	})
	return rs
}

// stateEnc writes AppendState's encoding: varints, and times as signed
// offsets from now (the zero time as its own marker).
type stateEnc struct {
	b   []byte
	now time.Time
}

func (e *stateEnc) u(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *stateEnc) i(v int64)  { e.b = binary.AppendVarint(e.b, v) }

func (e *stateEnc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *stateEnc) str(s string) {
	e.u(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *stateEnc) time(t time.Time) {
	if t.IsZero() {
		e.b = append(e.b, 0)
		return
	}
	e.b = append(e.b, 1)
	e.i(int64(t.Sub(e.now)))
}

func (e *stateEnc) roomGen(rg kvxfer.RoomGen) {
	e.b = append(e.b, rg.Room[:]...)
	e.u(uint64(rg.Gen))
}

func (e *stateEnc) cause(c outcome.Cause) {
	e.u(uint64(c.Outcome))
	e.str(c.Role)
	e.str(c.Stage)
}

func (e *stateEnc) id(r *req) {
	e.str(r.RID)
	e.u(uint64(r.choice))
}

func (e *stateEnc) ints(v []int32) {
	e.u(uint64(len(v)))
	for _, x := range v {
		e.i(int64(x))
	}
}

func (e *stateEnc) req(m *Machine, r *req) {
	e.id(r)
	e.roomGen(r.roomGen())
	e.u(uint64(r.Peer))
	e.u(uint64(r.stage))
	e.time(r.deadline)
	e.u(uint64(r.cause))
	if r.opt.unbound || r.opt.pending {
		e.time(r.stageSince) // binding an optimistic request reads it (bindOptimistic)
	}
	if r.choices() > 1 {
		e.i(int64(r.budget)) // a fork takes its stage's deadline span (fork)
	}
	e.time(r.hardDeadline)
	e.time(r.bootDeadline)
	e.u(uint64(len(r.pages)))
	for _, p := range r.pages {
		e.u(uint64(p))
	}
	e.u(uint64(r.computed))
	e.ints(r.outputs)
	e.bool(r.inBatch)
	e.u(uint64(r.pins))
	e.u(m.admitSeq - r.admitted)
	e.u(uint64(r.preemptions))
	e.u(uint64(r.cachedTokens))
	// link
	e.bool(r.opened)
	e.bool(r.peerUp)
	e.time(r.lastRenew)
	e.bool(r.peerEnded)
	e.cause(r.peerCause)
	// prefillSide
	e.bool(r.ready)
	e.u(uint64(r.sentPages))
	e.u(uint64(r.peerCached))
	e.u(uint64(r.chunks))
	e.i(int64(r.first.Token))
	e.u(uint64(len(r.first.Forks)))
	for _, f := range r.first.Forks {
		e.i(int64(f.Token))
	}
	e.bool(r.opt.unbound)
	e.u(uint64(r.opt.attempts))
	e.bool(r.opt.over)
	e.bool(r.opt.pending)
	// decodeSide
	e.u(uint64(len(r.recv)))
	for _, v := range r.recv {
		e.bool(v)
	}
	e.u(uint64(r.recvCount))
	e.u(uint64(r.cachedPages))
	e.bool(r.xferStarted)
	e.bool(r.verifying)
	e.b = append(e.b, r.done.Binding[:]...)
	e.u(uint64(r.done.Checksum))
	e.i(int64(r.done.FirstToken))
	e.u(uint64(r.done.NChunks))
	e.u(uint64(r.done.CachedTokens))
	e.bool(r.ackSent)
	// choices
	if g := r.group; g != nil {
		e.u(uint64(len(g.members)))
		e.u(uint64(g.live))
		e.u(uint64(g.outputs))
	} else {
		e.u(0)
	}
	e.u(uint64(len(r.forkPages)))
	for _, p := range r.forkPages {
		e.u(uint64(p))
	}
	e.u(uint64(len(r.scores)))
	e.bool(r.matcher != nil)
	e.ints(r.contOut)
}

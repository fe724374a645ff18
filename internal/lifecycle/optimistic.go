package lifecycle

import (
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Optimistic prefill (prefill role, Config.OptimisticAttempts > 0), after
// SGLang's --optimistic-prefill-attempts: a request still in bootstrap (its
// ROOM_OPEN has not come) may be computed, so that its KV is ready when
// decode opens the room late (decode busy, or slow to admit its leg).
//
//   - Its KV is unbound: the request's own, sent nowhere and shared with
//     nothing (the rule a prefix cache must keep: nothing computed for a
//     room is published before ROOM_OPEN binds it). It is bounded by the
//     bootstrap deadline it would have had anyway, and when complete it
//     parks (stage parked) under the KV-hold deadline too.
//   - When ROOM_OPEN comes it binds the room: a parked request is sent at
//     once if ROOM_READY came too (as for any parked one), a request still
//     computing goes on as a bound one.
//   - Attempts count the optimistic forward passes a request is in; a
//     prompt not complete within them drops its KV and waits for its
//     ROOM_OPEN as without optimism (fell back), as does one whose KV a
//     bound request needs.
//   - Unbound KV is capped at OptimisticMaxParked of the pool; at the cap
//     new requests wait for their ROOM_OPEN as without optimism.
//
// Why no cross-stage capacity deadlock can form (SGLang's #31473: prefill
// full of parked optimistic KV whose only exit is the bootstrap timeout,
// while decode's pages wait on prefill for other requests): a bound
// request never waits for pages that unbound KV holds. The scheduler serves
// bound requests first (computing, then admitting); an unbound request is
// admitted only when no bound one waits, and a bound request that finds no
// pages takes them from unbound requests (newest first: between forwards
// none is in a batch and none has page I/O, since nothing of it is sent).
// So every wait of a bound request is one the machine without optimism
// has too, and decode never waits for an unbound room at all (it does not
// know it yet). The cap bounds the work thrown away and keeps most of the
// pool for bound requests without dropping anything.
//
// Every request that starts optimistically is counted once more when its
// optimistic KV's story ends: sent (KV_DONE went out), expired (a deadline
// ended it first), aborted (any other end first) or fell back; parked
// counts the ones that completed before their ROOM_OPEN.

// optimisticOn reports whether this machine prefills optimistically.
func (m *Machine) optimisticOn() bool {
	return m.cfg.Role == RolePrefill && m.cfg.OptimisticAttempts > 0
}

// optimisticCap is the most pages unbound requests may hold together.
func (m *Machine) optimisticCap() int {
	return int(m.cfg.OptimisticMaxParked * float64(m.cache.Total()))
}

// unboundPages returns the pages held by unbound requests that are
// computing and that are parked.
func (m *Machine) unboundPages() (computing, parked int) {
	for _, r := range m.queue {
		if r.stage == StageDone || !r.opt.unbound {
			continue
		}
		if r.stage == StageParked {
			parked += len(r.pages)
		} else {
			computing += len(r.pages)
		}
	}
	return computing, parked
}

// mayStartOptimistic reports whether bootstrap request r may be computed
// before its ROOM_OPEN.
func (m *Machine) mayStartOptimistic(r *req) bool {
	return r.stage == StageBootstrap && !r.opt.over && r.opt.attempts < m.cfg.OptimisticAttempts &&
		m.now.Before(r.bootDeadline)
}

// setUnboundStage moves unbound request r to stage s with the stage's own
// deadline d (0: none) capped by its bootstrap deadline.
func (m *Machine) setUnboundStage(r *req, s Stage, d time.Duration, cause outcome.Outcome) {
	boot := r.bootDeadline.Sub(m.now)
	if d <= 0 || boot <= d {
		d, cause = max(boot, time.Nanosecond), outcome.TimeoutBootstrap // past: the next Tick ends it
	}
	m.setStage(r, s, d, cause)
}

// startOptimistic admits bootstrap request r with its pages allocated: it
// is computed unbound.
func (m *Machine) startOptimistic(r *req) {
	r.opt.unbound, r.opt.pending = true, true
	m.counters.Optimistic[OptimisticStarted]++
	m.setUnboundStage(r, StagePrefilling, 0, outcome.None)
	m.record(r, "%d pages allocated: optimistic prefill before ROOM_OPEN", len(r.pages))
}

// optimisticDone handles unbound request r after a forward it was in:
// it parks when its prompt is complete, falls back when its attempts are
// used up, and otherwise goes on computing.
func (m *Machine) optimisticDone(r *req, done bool, out model.SeqOutput) {
	switch {
	case done:
		r.first = out
		m.counters.Optimistic[OptimisticParked]++
		m.record(r, "optimistic KV complete after %d passes: parked until ROOM_OPEN", r.opt.attempts)
		m.setUnboundStage(r, StageParked, m.cfg.KVHoldTimeout, outcome.TimeoutKVHold)
		m.releaseHeldOpen(r)
	case r.opt.attempts >= m.cfg.OptimisticAttempts:
		m.fallBack(r, fmt.Sprintf("prompt not complete within %d optimistic passes", m.cfg.OptimisticAttempts))
	}
}

// fallBack drops the KV of unbound request r (nothing of it was sent) and
// sends it back to bootstrap: it waits for its ROOM_OPEN as without
// optimism, and is computed again after it.
func (m *Machine) fallBack(r *req, why string) {
	m.free(r.pages)
	r.pages = nil
	r.computed = 0
	r.first = model.SeqOutput{}
	r.opt.unbound, r.opt.over = false, true
	m.resolveOptimistic(r, OptimisticFellBack)
	m.record(r, "optimistic KV dropped (%s): waits for ROOM_OPEN", why)
	m.setStage(r, StageBootstrap, max(r.bootDeadline.Sub(m.now), time.Nanosecond), outcome.TimeoutBootstrap)
	m.releaseHeldOpen(r)
}

// newestUnbound is the most recently admitted unbound request: its pages
// may go to a bound request (between forwards none is in a batch, and an
// unbound request has no page I/O).
func (m *Machine) newestUnbound() *req {
	var v *req
	for _, r := range m.queue {
		if r.stage != StageDone && r.opt.unbound && r.pins == 0 && !r.inBatch && (v == nil || r.admitted > v.admitted) {
			v = r
		}
	}
	return v
}

// bindOptimistic binds the room of unbound request r, whose ROOM_OPEN has
// come (and checked out): it goes on computing, or stays parked (for
// ROOM_READY, under the KV-hold deadline from when it parked), as a bound
// request.
func (m *Machine) bindOptimistic(r *req) {
	r.opt.unbound = false
	m.publishPrefill(r, 0, r.computed/m.cfg.PageSize) // its KV may be shared from now on
	m.record(r, "ROOM_OPEN binds the optimistic KV (%d of %d tokens computed)", r.computed, len(r.InputIDs))
	if r.stage == StageParked {
		r.deadline, r.cause, r.budget = r.stageSince.Add(m.cfg.KVHoldTimeout), outcome.TimeoutKVHold, m.cfg.KVHoldTimeout
		return
	}
	r.deadline, r.cause, r.budget = time.Time{}, outcome.None, 0
}

// holdsOpen reports whether the test hook (Config.ForceOptimistic) holds
// back r's ROOM_OPEN until its optimistic prefill ends: r is picked, and is
// being computed unbound or may still start optimistically (a parked one
// has ended its optimistic prefill: its ROOM_OPEN binds at once).
func (m *Machine) holdsOpen(r *req) bool {
	if !m.optimisticOn() || m.cfg.ForceOptimistic == nil || !m.cfg.ForceOptimistic(r.RID) {
		return false
	}
	return (r.opt.unbound && r.stage == StagePrefilling) ||
		(m.mayStartOptimistic(r) && m.admitPages(r.Request) <= m.optimisticCap())
}

// releaseHeldOpen applies the ROOM_OPEN (and ROOM_READY) held back for r
// by the test hook, now that its optimistic prefill ended.
func (m *Machine) releaseHeldOpen(r *req) {
	p, ok := m.pending[r.Room]
	if !ok || p.open.Gen != r.Gen || r.stage == StageDone {
		return
	}
	delete(m.pending, r.Room)
	m.roomOpened(r, p.peer, p.open)
	if r.stage != StageDone && p.ready {
		m.roomReady(r, p.readyNT, p.readyCached)
	}
}

// releaseBlockedHolds applies the ROOM_OPENs the test hook holds for
// bootstrap requests that cannot start optimistically now: a bound request
// waits, or their pages exceed what the cap (left of it: left pages) or
// the pool has free. They go on as without optimism rather than wait for a
// turn; a request that only lacked forward budget keeps its hold.
func (m *Machine) releaseBlockedHolds(left int) {
	if m.cfg.ForceOptimistic == nil || len(m.pending) == 0 {
		return
	}
	for _, r := range m.queue {
		if r.stage != StageBootstrap {
			continue
		}
		if p, ok := m.pending[r.Room]; !ok || p.open.Gen != r.Gen {
			continue
		}
		if need := m.admitPages(r.Request); m.stageCount[StageWaiting] > 0 || need > left || need > m.cache.FreeCount() {
			m.releaseHeldOpen(r)
		}
	}
}

// heldFor returns the live request whose ROOM_OPEN pending open p is held
// back for (the test hook), or nil.
func (m *Machine) heldFor(p *pendingOpen) *req {
	if r, ok := m.rooms[p.open.Room]; ok && r.Gen == p.open.Gen {
		return r
	}
	return nil
}

// resolveOptimistic counts how r's optimistic KV ended, once.
func (m *Machine) resolveOptimistic(r *req, how OptimisticOutcome) {
	if !r.opt.pending {
		return
	}
	r.opt.pending = false
	m.counters.Optimistic[how]++
}

// OptimisticOutcome indexes Counters.Optimistic.
type OptimisticOutcome uint8

// Optimistic prefill counts: started, then parked (complete before its
// ROOM_OPEN), and how the optimistic KV ended: sent, expired, aborted or
// fell back. Each started request ends in exactly one of the last four.
const (
	OptimisticStarted OptimisticOutcome = iota
	OptimisticParked
	OptimisticSent
	OptimisticExpired
	OptimisticAborted
	OptimisticFellBack
	numOptimisticOutcomes
)

var optimisticNames = [numOptimisticOutcomes]string{"started", "parked", "sent", "expired", "aborted", "fell_back"}

func (o OptimisticOutcome) String() string {
	if o < numOptimisticOutcomes {
		return optimisticNames[o]
	}
	return fmt.Sprintf("optimistic(%d)", uint8(o))
}

// OptimisticOutcomes lists every optimistic prefill count, in order.
func OptimisticOutcomes() []OptimisticOutcome {
	out := make([]OptimisticOutcome, numOptimisticOutcomes)
	for i := range out {
		out[i] = OptimisticOutcome(i)
	}
	return out
}

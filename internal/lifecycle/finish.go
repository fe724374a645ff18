package lifecycle

import (
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// shared reports whether the peer still holds state for r's room, so an end
// on this side must be told to it.
func (m *Machine) shared(r *req) bool {
	switch m.cfg.Role {
	case RolePrefill:
		return r.opened
	case RoleDecode:
		return r.opened && !r.ackSent
	}
	return false
}

// finish ends r: the one way out of every stage, for every outcome (done,
// deadline, lease, abort, peer loss, bad KV, failed forward, shutdown,
// superseded by a retry). It frees r's pages (after the running forward and
// r's page I/O if they still use them), tells the peer unless the peer
// caused the end or is gone, leaves a tombstone for a failed room, and
// emits one Finalize. It is the only code that moves a request to
// StageDone, removes it from reqs and rooms, or emits Finalize for an
// admitted request (rejectEarly answers the ones never admitted), and it
// does nothing for a request already done, so no end is counted twice.
//
// For a request with N > 1 choices (a group), a successful end (o OK) ends
// choice r alone, and the request with the last choice; any other end, of
// any choice, ends every choice and the request at once.
func (m *Machine) finish(r *req, o outcome.Outcome, reason, finishReason string) {
	g := r.group
	if g == nil {
		if r.stage == StageDone {
			return
		}
		cause := m.endCause(r, o, reason)
		m.tellPeer(r, o, cause)
		m.endSeq(r, o, reason)
		m.endRequest(r, o, reason, finishReason, cause)
		return
	}
	head := g.members[0]
	if g.live == 0 {
		return // the request has ended
	}
	if o == outcome.OK {
		if r.stage == StageDone {
			return
		}
		m.endSeq(r, o, reason)
		g.live--
		g.outputs += len(r.outputs)
		m.emit(Emit{RID: r.RID, Choice: r.choice, Finish: finishReason})
		if g.live == 0 {
			m.endRequest(head, o, reason, finishReason, outcome.Cause{})
		}
		return
	}
	// A failure of one choice fails the request: every choice ends with it.
	cause := m.endCause(r, o, reason)
	m.tellPeer(head, o, cause)
	for _, c := range g.members {
		if c.stage != StageDone {
			m.endSeq(c, o, reason)
			g.outputs += len(c.outputs)
		}
	}
	g.live = 0
	m.endRequest(head, o, reason, finishReason, cause)
}

// endCause is the first failure behind live sequence r ending with o (zero
// for OK).
func (m *Machine) endCause(r *req, o outcome.Outcome, reason string) outcome.Cause {
	if o == outcome.OK {
		return outcome.Cause{}
	}
	if r.group != nil && r.choice > 0 && o == outcome.AbortedPeer {
		return m.rootCause(r.group.members[0], o, reason) // the peer's cause is the head's
	}
	return m.rootCause(r, o, reason)
}

// tellPeer tells the KV peer of request r (its head) that it ended with
// failure o, unless the peer caused it or is gone, and settles what a
// prefill request owes its ROOM_OPEN and its optimistic prefill.
func (m *Machine) tellPeer(r *req, o outcome.Outcome, cause outcome.Cause) {
	if o != outcome.OK && m.shared(r) && !connGone(o) && !r.peerEnded {
		m.emit(Send{Peer: r.Peer, Msg: kvxfer.Abort{RoomGen: r.roomGen(), Cause: cause}})
	}
	if m.cfg.Role == RolePrefill {
		if p, ok := m.pending[r.Room]; ok && p.open.Gen == r.Gen {
			// Its ROOM_OPEN was held back (the optimistic test hook): decode
			// holds the room and must hear the end.
			delete(m.pending, r.Room)
			if o != outcome.OK && !connGone(o) && !r.peerEnded {
				m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: r.roomGen(), Cause: cause}})
			}
		}
		if o.Class() == outcome.ClassTimeout {
			m.resolveOptimistic(r, OptimisticExpired)
		} else {
			m.resolveOptimistic(r, OptimisticAborted)
		}
	}
}

// endSeq ends one sequence: r leaves its stage for StageDone and lets go of
// its pages (once neither the running forward nor page I/O uses them).
func (m *Machine) endSeq(r *req, o outcome.Outcome, reason string) {
	m.publishAtEnd(r)
	m.setStage(r, StageDone, 0, outcome.None)
	m.stageCount[StageDone]--
	m.doneInQueue++
	if r.inBatch {
		m.maybeCancelBatch()
	}
	if r.inBatch || r.pins > 0 {
		m.draining[r] = struct{}{} // its pages are freed by release
	} else {
		m.release(r)
	}
	if r.choice > 0 {
		m.record(r, "choice %d ends %s %s", r.choice, o, reason)
	}
}

// endRequest ends request r (the request itself, or the head of a group
// every sequence of which has ended): the room is forgotten and, for a
// failure, tombstoned, and the one Finalize emitted.
func (m *Machine) endRequest(r *req, o outcome.Outcome, reason, finishReason string, cause outcome.Cause) {
	if cur, ok := m.reqs[r.RID]; ok && cur == r {
		delete(m.reqs, r.RID)
	}
	if cur, ok := m.rooms[r.Room]; ok && cur == r {
		delete(m.rooms, r.Room)
	}
	switch {
	case m.cfg.Role == RoleColocated || r.Room.IsZero():
	case o != outcome.OK:
		m.addTomb(tombKey{room: r.Room}, r.Gen, o, cause)
	case r.Gen > 1:
		// A retry that succeeded: a leg of an attempt before it that is
		// still on its way (the router aborts it, but its abort may come
		// second) is refused at arrival instead of holding the room
		// again until its bootstrap deadline. Found by the model checker
		// (testdata/stale_leg_after_retry.txt).
		m.addTomb(tombKey{room: r.Room}, r.Gen-1, outcome.RejectedInvalid, m.cause(outcome.RejectedInvalid, StageNone,
			fmt.Sprintf("room %s completed at gen %d: gen %d and older are stale", r.Room, r.Gen, r.Gen-1)))
	}
	m.record(r, "end %s %s", o, reason)
	st := make(map[Stage]time.Duration)
	for s, d := range r.stageTime {
		if d > 0 {
			st[Stage(s)] = d
		}
	}
	outputs := len(r.outputs)
	if r.group != nil {
		outputs = r.group.outputs
	}
	f := Finalize{RID: r.RID, RoomGen: r.roomGen(), Outcome: o, PromptTokens: len(r.InputIDs),
		OutputTokens: outputs, CachedTokens: r.cachedTokens, StageTime: st, Age: m.now.Sub(r.arrived)}
	if m.cfg.Role == RoleDecode && !r.Room.IsZero() {
		f.CachedTokens = int(min(r.done.CachedTokens, uint32(len(r.InputIDs))))
	}
	if o == outcome.OK {
		f.FinishReason = finishReason
		if m.cfg.Role == RolePrefill {
			f.FirstToken = r.first
			f.OutputTokens = 0
			f.SentPages = r.sentPages - r.peerCached
		}
		f.PromptLogprobs = r.scores
	} else {
		f.Err, f.Cause = reason, cause
	}
	m.emit(f)
}

// release frees the pages of an ended request once neither the forward nor
// page I/O uses them.
func (m *Machine) release(r *req) {
	if r.stage != StageDone || r.inBatch || r.pins > 0 && m.mut != mutFreeWhilePinned {
		return
	}
	delete(m.draining, r)
	if len(r.pages) > 0 {
		m.free(r.pages)
		r.pages = nil
	}
	if len(r.forkPages) > 0 {
		m.free(r.forkPages)
		r.forkPages = nil
	}
}

// pin registers a page I/O effect of r and returns its job id.
func (m *Machine) pin(r *req) uint64 {
	m.jobSeq++
	r.pins++
	m.jobs[m.jobSeq] = r
	return m.jobSeq
}

// ioDone unpins the request of a finished page I/O effect.
func (m *Machine) ioDone(job uint64) {
	r, ok := m.jobs[job]
	if !ok {
		return
	}
	delete(m.jobs, job)
	r.pins--
	m.release(r)
}

// free drops the holder's reference to each of pages: a page no one else
// holds is freed, or kept as cached if it is indexed.
func (m *Machine) free(pages []kvcache.PageID) {
	if err := m.cache.Release(pages); err != nil {
		// A double release would hand one page to two requests; the
		// machine's bookkeeping makes it impossible, so this is a bug worth
		// a crash.
		panic(fmt.Sprintf("lifecycle: %v", err))
	}
	if m.pageHash != nil {
		for _, p := range pages {
			if _, idx := m.cache.Indexed(p); !idx && m.cache.Refs(p) == 0 {
				m.pageHash[p] = kvxfer.PageHash{}
			}
		}
	}
}

// rejectEarly answers a request that was never admitted.
func (m *Machine) rejectEarly(q Request, o outcome.Outcome, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.rejectEarlyCause(q, o, msg, m.cause(o, StageNone, msg))
}

// rejectEarlyCause answers a request that was never admitted, with the
// first failure that ended it before it came.
func (m *Machine) rejectEarlyCause(q Request, o outcome.Outcome, msg string, cause outcome.Cause) {
	m.emit(Finalize{RID: q.RID, RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}, Outcome: o,
		Err: msg, Cause: cause, PromptTokens: len(q.InputIDs)})
}

// cause is this side's failure o in stage s, as a Cause.
func (m *Machine) cause(o outcome.Outcome, s Stage, detail string) outcome.Cause {
	c := outcome.Cause{Outcome: o, Role: m.cfg.Role.String(), Detail: detail}
	if s != StageNone && s != StageDone {
		c.Stage = s.String()
	}
	return c
}

// rootCause is the first failure behind r ending with o: the peer's, if it
// ended r and named one, otherwise this side's.
func (m *Machine) rootCause(r *req, o outcome.Outcome, reason string) outcome.Cause {
	if o == outcome.AbortedPeer && r.peerCause.Known() {
		return r.peerCause
	}
	return m.cause(o, r.stage, reason)
}

func (m *Machine) abort(a AbortRequest) {
	var r *req
	if a.RID != "" {
		r = m.reqs[a.RID]
	}
	if r == nil && !a.Room.IsZero() {
		r = m.rooms[a.Room]
	}
	var o outcome.Outcome
	var reason string
	switch a.Reason {
	case AbortStop:
		o, reason = outcome.OK, "stop"
	case AbortPeerLeg:
		o, reason = outcome.AbortedPeer, "the other leg failed"
	default:
		o, reason = outcome.AbortedClient, "aborted by client"
	}
	if a.Detail != "" {
		reason += ": " + a.Detail
	}
	if r == nil || (a.Gen != 0 && r.Gen != a.Gen) {
		if a.Reason == AbortStop {
			return
		}
		cause := m.cause(o, StageNone, reason)
		if o == outcome.AbortedPeer && a.Cause.Known() {
			cause = a.Cause
		}
		if a.RID != "" && m.mut != mutNoAbortTombstone {
			m.addTomb(tombKey{rid: a.RID}, a.Gen, o, cause)
		}
		if !a.Room.IsZero() {
			m.addTomb(tombKey{room: a.Room}, a.Gen, o, cause)
			if m.cfg.Role == RolePrefill {
				m.dropPendingWithAbort(a.Room, a.Gen, cause)
			}
		}
		return
	}
	if o == outcome.OK {
		if g := r.group; g != nil {
			// A stop ends one choice, or every choice still running.
			for _, c := range g.members {
				if !a.OneChoice || c.choice == a.Choice {
					m.finish(c, o, "", "stop")
				}
			}
			return
		}
		if a.OneChoice && a.Choice != r.choice {
			return // a choice the request does not have (yet): nothing to stop
		}
		m.finish(r, o, "", "stop")
		return
	}
	if o == outcome.AbortedPeer && a.Cause.Known() {
		r.peerCause = a.Cause
	}
	m.finish(r, o, reason, "")
}

func (m *Machine) doDrain() {
	if m.leaving || m.shutdown {
		return
	}
	m.leaving = true
	m.abortPending(m.cause(outcome.Draining, StageNone, "prefill worker is draining"))
}

// Draining reports whether the machine refuses new requests to drain.
func (m *Machine) Draining() bool { return m.leaving }

// Drained reports whether a draining machine holds nothing any more: no
// live request and no pending ROOM_OPEN (pages are released with their
// requests, or when the running forward ends).
func (m *Machine) Drained() bool {
	return m.leaving && len(m.reqs) == 0 && len(m.pending) == 0 && m.batch == nil
}

func (m *Machine) doShutdown() {
	m.shutdown = true
	for _, r := range m.sortedLive() {
		m.finish(r, outcome.Shutdown, "worker is shutting down", "")
	}
	m.abortPending(m.cause(outcome.Shutdown, StageNone, "prefill worker is shutting down"))
}

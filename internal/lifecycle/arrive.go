package lifecycle

import (
	"fmt"
	"slices"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// validate checks a request against the config; it returns the outcome and
// message of the first problem, or outcome.None.
func (m *Machine) validate(q Request) (outcome.Outcome, string) {
	n := len(q.InputIDs)
	switch {
	case q.RID == "":
		return outcome.RejectedInvalid, "request id is empty"
	case n == 0:
		return outcome.RejectedInvalid, "prompt is empty"
	case q.MaxTokens < 0 || (q.MaxTokens == 0 && !m.mayBePromptOnly(q)):
		return outcome.RejectedInvalid, fmt.Sprintf("max_tokens must be at least 1, got %d (0, the prompt alone, only on a colocated worker or a prefill worker without a room)", q.MaxTokens)
	case q.N < 0 || q.N > model.MaxForks:
		return outcome.RejectedInvalid, fmt.Sprintf("n must be in [1, %d], got %d", model.MaxForks, q.N)
	case q.N > 1 && q.MaxTokens == 0:
		return outcome.RejectedInvalid, fmt.Sprintf("n is %d but max_tokens is 0: there is nothing to choose between", q.N)
	case q.PromptTop < 0 || q.PromptTop > model.MaxLogprobs:
		return outcome.RejectedInvalid, fmt.Sprintf("prompt logprobs must be in [0, %d], got %d", model.MaxLogprobs, q.PromptTop)
	case q.ScorePrompt && m.cfg.Role == RoleDecode && !q.Room.IsZero():
		return outcome.RejectedInvalid, "a decode worker does not compute the prompt of a room: prompt logprobs come from prefill"
	case q.MinTokens < 0 || q.MinTokens > q.MaxTokens:
		return outcome.RejectedInvalid, fmt.Sprintf("min_tokens must be in [0, max_tokens = %d], got %d", q.MaxTokens, q.MinTokens)
	case n >= m.cfg.ContextLen:
		return outcome.RejectedInvalid, fmt.Sprintf("prompt has %d tokens; this worker's context length is %d", n, m.cfg.ContextLen)
	case q.MaxTokens > m.cfg.ContextLen-n:
		return outcome.RejectedInvalid, fmt.Sprintf("prompt (%d tokens) + max_tokens (%d) exceeds the context length %d", n, q.MaxTokens, m.cfg.ContextLen)
	case m.cfg.Role == RolePrefill && q.Room.IsZero() && !q.promptOnly():
		return outcome.RejectedInvalid, "room is missing"
	case m.cfg.Role == RolePrefill && q.promptOnly() && !q.Room.IsZero():
		return outcome.RejectedInvalid, "a prompt-only request (max_tokens 0) has no decode and so no room"
	case q.Continued < 0 || q.Continued >= n:
		return outcome.RejectedInvalid, fmt.Sprintf("continued_tokens must be in [0, %d) (the input's tokens, at least one of them prompt), got %d", n, q.Continued)
	case q.Continued > 0 && q.N > 1:
		return outcome.RejectedInvalid, fmt.Sprintf("a continuation (continued_tokens %d) has one choice, n is %d", q.Continued, q.N)
	case q.Continued > 0 && q.ScorePrompt:
		return outcome.RejectedInvalid, "a continuation (continued_tokens) does not score its prompt: prompt_logprobs must be unset"
	case q.Continued > 0 && q.promptOnly():
		return outcome.RejectedInvalid, "a continuation (continued_tokens) has tokens left to generate: max_tokens must be at least 1"
	}
	var badID int32 = -1
	q.Sampling.TokenIDs(func(id int32) bool {
		if int(id) >= m.cfg.VocabSize {
			badID = id
			return false
		}
		return true
	})
	if badID >= 0 {
		return outcome.RejectedInvalid, fmt.Sprintf("sampling names token %d, outside the vocabulary [0, %d)", badID, m.cfg.VocabSize)
	}
	for i, id := range q.InputIDs {
		if id < 0 || int(id) >= m.cfg.VocabSize {
			return outcome.RejectedInvalid, fmt.Sprintf("input token %d at position %d is outside the vocabulary [0, %d)", id, i, m.cfg.VocabSize)
		}
	}
	if err := q.Sampling.Validate(); err != nil {
		return outcome.RejectedInvalid, err.Error()
	}
	eosEnds := !q.IgnoreEOS || q.Constraint != nil
	for i, id := range q.InputIDs[n-q.Continued:] {
		if (eosEnds && slices.Contains(m.cfg.EOS, id)) || slices.Contains(q.StopTokenIDs, id) {
			return outcome.RejectedInvalid, fmt.Sprintf("continued token %d (output step %d) ends the request: there is nothing to continue", id, i)
		}
	}
	switch c := q.Constraint; {
	case (c == nil) != (q.ConstraintDigest == ""):
		return outcome.RejectedInvalid, "a constraint needs its digest, and a digest its constraint"
	case c != nil && c.Vocab().Size() != m.cfg.VocabSize:
		return outcome.RejectedInvalid, fmt.Sprintf("the constraint is bound to a vocabulary of %d tokens; this worker's has %d", c.Vocab().Size(), m.cfg.VocabSize)
	}
	if need := m.maxPages(q); need > m.cache.Total() {
		return outcome.RejectedCapacity, fmt.Sprintf("request needs %d KV pages; this worker's pool has %d", need, m.cache.Total())
	}
	return outcome.None, ""
}

// continuedMatcher returns a matcher of q's constraint advanced over its
// continued tokens, or nil and why one of them is outside the grammar (or
// the constraint outgrew the engine's bounds on the way).
func continuedMatcher(q Request) (*grammar.Matcher, string) {
	mt := q.Constraint.NewMatcher()
	for i, id := range q.InputIDs[len(q.InputIDs)-q.Continued:] {
		ok := mt.Accept(id)
		if err := mt.Err(); err != nil {
			return nil, err.Error()
		}
		if !ok {
			return nil, fmt.Sprintf("continued token %d (output step %d) is outside the request's grammar", id, i)
		}
	}
	return mt, ""
}

// mayBePromptOnly reports whether this worker can serve q with MaxTokens
// 0 (the prompt alone): a colocated one, or a prefill one for a request
// without a room (no decode follows).
func (m *Machine) mayBePromptOnly(q Request) bool {
	return m.cfg.Role == RoleColocated || (m.cfg.Role == RolePrefill && q.Room.IsZero())
}

// maxPages is the most pages a request can hold on this worker: its prompt
// on prefill; prompt + output on decode and colocated, for each of its
// choices, which share the prompt's full pages.
func (m *Machine) maxPages(q Request) int {
	n := len(q.InputIDs)
	if m.cfg.Role == RolePrefill {
		return m.pagesFor(n)
	}
	full := n / m.cfg.PageSize
	return full + q.choices()*(m.pagesFor(n+q.MaxTokens)-full)
}

// pagesFor is the number of pages that hold n tokens.
func (m *Machine) pagesFor(n int) int { return (n + m.cfg.PageSize - 1) / m.cfg.PageSize }

// admitPages is what a request needs to start: its prompt on prefill; on
// decode and colocated also the position of its first output token. Later
// pages are allocated as decoding reaches them (see grow).
//
// A request with N > 1 that has not forked yet also takes one page for
// each of its other choices (forkPages): the copy of the prompt's last,
// partial page, or the page of its first output token.
func (m *Machine) admitPages(q Request) int {
	if m.cfg.Role == RolePrefill || q.promptOnly() {
		return m.pagesFor(len(q.InputIDs))
	}
	return m.pagesFor(len(q.InputIDs)+1) + q.choices() - 1
}

// reserve is how many pages admission leaves free for running requests to
// grow into: 1% of the pool, at least one (vLLM's watermark).
func (m *Machine) reserve() int { return max(1, m.cache.Total()/100) }

// admitAlloc gives a new request its first n pages, keeping the reserve
// free unless nothing else runs. With the prefix cache, the longest cached
// prefix of toks (at most limit pages) comes first, shared, and only the
// rest is allocated; it returns how many pages came from the cache (0 when
// it fails, and then r holds nothing).
func (m *Machine) admitAlloc(r *req, n int, toks []int32, limit int) (int, bool) {
	busy := m.stageCount[StageDecoding] + m.stageCount[StageQueued] + m.stageCount[StagePrefilling] + m.stageCount[StageAwaitingKV]
	keep := 0
	if busy > 0 {
		keep = m.reserve()
	}
	if m.cache.FreeCount()-keep < n-max(0, min(limit, n)) {
		return 0, false // not even if every page it may share were cached
	}
	hit := m.matchPrefix(r, toks, min(limit, n))
	need := n - len(hit)
	ids, ok := []kvcache.PageID(nil), !(busy > 0 && m.cache.FreeCount()-need < m.reserve())
	if ok {
		ids, ok = m.allocPages(need)
	}
	if !ok {
		if len(hit) > 0 {
			m.free(hit)
		}
		return 0, false
	}
	m.countQuery(toks, len(hit))
	r.pages = append(hit, ids...)
	if k := m.forksToReserve(r); k > 0 {
		// The last k pages wait for the request's other choices.
		n := len(r.pages) - k
		r.forkPages = r.pages[n:]
		r.pages = r.pages[:n:n]
	}
	m.admitSeq++
	r.admitted = m.admitSeq
	return len(hit), true
}

func (m *Machine) promptPages(r *req) int {
	return (len(r.InputIDs) + m.cfg.PageSize - 1) / m.cfg.PageSize
}

// queued is the number of requests that wait to start (Role.Queued).
func (m *Machine) queued() int {
	n := 0
	for _, s := range m.cfg.Role.Queued() {
		n += m.stageCount[s]
	}
	return n
}

func (m *Machine) arrive(q Request) {
	if m.shutdown {
		m.rejectEarly(q, outcome.Shutdown, "worker is shutting down")
		return
	}
	if m.leaving {
		cause := m.cause(outcome.Draining, StageNone, "the worker finishes what it holds and takes no new request")
		m.rejectEarlyCause(q, outcome.Draining, cause.Detail, cause)
		if m.cfg.Role == RolePrefill {
			m.dropPendingWithAbort(q.Room, q.Gen, cause)
		}
		return
	}
	if _, dup := m.reqs[q.RID]; dup {
		m.rejectEarly(q, outcome.RejectedInvalid, "request id %q is already in use", q.RID)
		return
	}
	if t, ok := m.tombFor(q.RID, q.Room, q.Gen); ok {
		m.counters.TombstoneHits++
		m.rejectEarlyCause(q, t.outcome, "its request or room ended before it arrived: "+t.cause.Detail, t.cause)
		m.dropPendingWithAbort(q.Room, q.Gen, t.cause)
		return
	}
	o, msg := m.validate(q)
	var matcher *grammar.Matcher
	if o == outcome.None && q.Constraint != nil {
		matcher, msg = continuedMatcher(q)
		if matcher == nil {
			o = outcome.RejectedInvalid
		}
	}
	if o != outcome.None {
		cause := m.cause(o, StageNone, msg)
		m.rejectEarlyCause(q, o, msg, cause)
		if m.cfg.Role == RolePrefill {
			m.dropPendingWithAbort(q.Room, q.Gen, cause)
		}
		if m.cfg.Role != RoleColocated && !q.Room.IsZero() {
			m.addTomb(tombKey{room: q.Room}, q.Gen, outcome.AbortedPeer, cause)
		}
		return
	}
	if n := m.queued(); m.cfg.MaxQueued > 0 && n >= m.cfg.MaxQueued {
		msg := fmt.Sprintf("worker is overloaded: its queue is full (%d waiting to start, --max-queued-requests %d)", n, m.cfg.MaxQueued)
		cause := m.cause(outcome.Overloaded, StageNone, msg)
		m.rejectEarlyCause(q, outcome.Overloaded, msg, cause)
		if m.cfg.Role == RolePrefill {
			m.dropPendingWithAbort(q.Room, q.Gen, cause)
		}
		if m.cfg.Role != RoleColocated && !q.Room.IsZero() {
			m.addTomb(tombKey{room: q.Room}, q.Gen, outcome.AbortedPeer, cause)
		}
		return
	}
	if old, ok := m.rooms[q.Room]; ok && m.cfg.Role != RoleColocated {
		if q.Gen <= old.Gen && m.mut != mutStaleGenSupersedes {
			m.rejectEarly(q, outcome.RejectedInvalid, "room %s is in use by request %q (gen %d)", q.Room, old.RID, old.Gen)
			return
		}
		if m.mut == mutLeakSuperseded {
			old.pages = nil
		}
		m.finish(old, outcome.AbortedPeer, fmt.Sprintf("superseded by retry gen %d", q.Gen), "")
	}
	if lp, lost := m.lostPeers[q.Peer]; lost && m.cfg.Role == RoleDecode && !q.Room.IsZero() {
		if lp.outcome == outcome.PeerRefused {
			m.rejectEarly(q, lp.outcome, "KV connection to %s was refused before the request arrived: %s", q.PeerAddr, lp.reason)
			m.addTomb(tombKey{room: q.Room}, q.Gen, lp.outcome, m.cause(lp.outcome, StageNone, lp.reason))
			return
		}
		m.rejectEarly(q, outcome.PeerLost, "KV connection to %s was lost before the request arrived", q.PeerAddr)
		m.addTomb(tombKey{room: q.Room}, q.Gen, outcome.PeerLost,
			m.cause(outcome.PeerLost, StageNone, "decode lost its KV connection"))
		return
	}
	r := &req{Request: q, arrived: m.now, stageSince: m.now}
	if q.MinTokens > 0 {
		r.ban = append(slices.Clone(m.cfg.EOS), q.StopTokenIDs...)
	}
	if q.Constraint != nil {
		r.matcher = matcher
		r.mask = make([]uint64, q.Constraint.Vocab().MaskWords())
	}
	if q.Continued > 0 && q.Sampling.NeedsHistory() {
		r.contOut = make([]int32, 0, q.Continued+q.MaxTokens)
		r.contOut = append(r.contOut, q.InputIDs[len(q.InputIDs)-q.Continued:]...)
	}
	limit := m.cfg.MaxRequestTime
	if q.Timeout > 0 && q.Timeout < limit {
		limit = q.Timeout
	}
	r.hardDeadline = m.now.Add(limit)
	if m.cfg.Role == RolePrefill {
		r.bootDeadline = m.now.Add(m.cfg.BootstrapTimeout)
	}
	m.reqs[q.RID] = r
	if m.cfg.Role != RoleColocated && !q.Room.IsZero() {
		m.rooms[q.Room] = r
	}
	if q.ScorePrompt {
		r.scores = make([]model.PositionLogprobs, len(q.InputIDs))
	}
	var cont string
	if q.Continued > 0 {
		cont = fmt.Sprintf(", continues %d output tokens", q.Continued)
	}
	if q.Constraint != nil {
		m.record(r, "arrive: %d prompt tokens, max_tokens %d, constraint %.12s%s", len(q.InputIDs), q.MaxTokens, q.ConstraintDigest, cont)
	} else {
		m.record(r, "arrive: %d prompt tokens, max_tokens %d%s", len(q.InputIDs), q.MaxTokens, cont)
	}
	switch m.cfg.Role {
	case RolePrefill:
		m.queue = append(m.queue, r)
		if q.Room.IsZero() { // the prompt alone: no decode, no room
			m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
			break
		}
		boot := m.cfg.BootstrapTimeout
		if m.mut == mutNoBootstrapDeadline {
			boot = 0
		}
		m.setStage(r, StageBootstrap, boot, outcome.TimeoutBootstrap)
		if p, ok := m.pending[q.Room]; ok && p.open.Gen == q.Gen && !m.holdsOpen(r) {
			delete(m.pending, q.Room)
			m.roomOpened(r, p.peer, p.open)
			if r.stage != StageDone && p.ready {
				m.roomReady(r, p.readyNT, p.readyCached)
			}
		}
	case RoleDecode:
		if q.Room.IsZero() {
			// A local request (no room, no prefill worker): it computes
			// its prompt here, as on a colocated worker.
			m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
			m.queue = append(m.queue, r)
			break
		}
		m.setStage(r, StagePrealloc, m.cfg.QueueTimeout, outcome.TimeoutQueue)
		r.peerUp = m.peersUp[q.Peer]
		r.lastRenew = m.now
		r.opened = true
		m.emit(Send{Peer: q.Peer, Msg: kvxfer.RoomOpen{RoomGen: r.roomGen(), RID: q.RID,
			NTokens: uint32(len(q.InputIDs)), PromptHash: PromptHash(q.InputIDs)}})
		m.record(r, "ROOM_OPEN sent to peer %d (%s)", q.Peer, q.PeerAddr)
		m.queue = append(m.queue, r)
	case RoleColocated:
		m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
		m.queue = append(m.queue, r)
	}
}

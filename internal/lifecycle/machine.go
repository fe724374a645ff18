package lifecycle

import (
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// req is one live request.
type req struct {
	Request
	stage      Stage
	arrived    time.Time
	stageSince time.Time
	// deadline is the current stage's deadline and cause the outcome when it
	// passes; hardDeadline caps the whole request.
	deadline     time.Time
	cause        outcome.Outcome
	hardDeadline time.Time
	pages        []kvcache.PageID
	// computed is the number of prompt tokens whose KV is in pages
	// (prefill, colocated).
	computed int
	// outputs are the tokens generated so far (decode, colocated; prefill
	// keeps its one sampled token in first).
	outputs []int32
	first   model.SeqOutput
	// inBatch is set while the running forward writes this request's pages;
	// pins counts page I/O effects (SendKV, SendKVDone, WriteKV, VerifyKV)
	// not yet answered by IODone. An ended request's pages are freed only
	// when both are clear.
	inBatch bool
	pins    int
	// admitted orders requests by when they last got pages (newest is
	// preempted first); preemptions counts how often it lost them.
	admitted    uint64
	preemptions int

	// KV channel state.
	opened    bool // prefill: ROOM_OPEN seen; decode: ROOM_OPEN sent
	ready     bool // prefill: ROOM_READY seen
	peerUp    bool // decode: the connection's handshake is done
	ackSent   bool // decode: KV_ACK sent, prefill has let go of the room
	peerEnded bool // the peer ended the room (its ABORT), so it is not told back
	// peerCause is the other side's first failure, when the peer's ABORT or
	// the router's abort named one: an AbortedPeer end carries it.
	peerCause outcome.Cause
	sentPages int // prefill: prompt pages sent
	chunks    uint32
	lastRenew time.Time
	// decode receive state
	recv        []bool
	recvCount   int
	xferStarted bool
	verifying   bool
	done        kvxfer.KVDone

	stageTime [numStages]time.Duration
	history   []HistoryEntry
	hpos      int
}

// HistoryEntry is one lifecycle event of a request, for /debug/requests/{rid}.
type HistoryEntry struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

type pendingOpen struct {
	open    kvxfer.RoomOpen
	peer    kvxfer.PeerID
	at      time.Time
	ready   bool
	readyNT uint32
}

// tombstone remembers how a room or request ended on this side (outcome)
// and its first failure (cause), so that late arrivals fail at once with
// the root cause.
type tombstone struct {
	gen     uint32
	outcome outcome.Outcome
	cause   outcome.Cause
	until   time.Time
}

type tombKey struct {
	room kvxfer.Room
	rid  string
}

// Machine is the state machine of one worker. See the package doc.
type Machine struct {
	cfg   Config
	alloc *kvcache.Allocator
	now   time.Time

	reqs  map[string]*req
	rooms map[kvxfer.Room]*req
	// queue holds requests in arrival order; scheduling scans it and drops
	// entries that left.
	queue []*req
	// doneInQueue counts finished requests still in queue.
	doneInQueue int

	pending    map[kvxfer.Room]*pendingOpen
	tombs      map[tombKey]tombstone
	tombOrder  []tombKey
	stageCount [numStages]int
	// maxStage is the longest time a request spent in each stage, recorded
	// when it left the stage.
	maxStage [numStages]time.Duration

	batch []batchEntry // requests of the running forward
	// batchCancelled: CancelBatch was emitted for the running forward.
	batchCancelled bool
	admitSeq       uint64 // last admitted sequence number
	// draining holds ended requests whose pages wait for the running
	// forward or their page I/O to finish.
	draining map[*req]struct{}
	// jobs maps the id of each page I/O effect in flight to its request.
	jobs   map[uint64]*req
	jobSeq uint64

	peersUp map[kvxfer.PeerID]bool
	// lostPeers remembers dead connections (PeerIDs are never reused), so a
	// request that arrives naming one fails at once.
	lostPeers   map[kvxfer.PeerID]time.Time
	lastRenewal time.Time
	shutdown    bool

	effects  []Effect
	counters Counters
}

// New returns a machine. It returns an error for an invalid config.
func New(cfg Config, alloc *kvcache.Allocator) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Machine{
		cfg:       cfg,
		alloc:     alloc,
		reqs:      make(map[string]*req),
		rooms:     make(map[kvxfer.Room]*req),
		pending:   make(map[kvxfer.Room]*pendingOpen),
		tombs:     make(map[tombKey]tombstone),
		peersUp:   make(map[kvxfer.PeerID]bool),
		draining:  make(map[*req]struct{}),
		jobs:      make(map[uint64]*req),
		lostPeers: make(map[kvxfer.PeerID]time.Time),
		counters: Counters{
			FramesDropped: make(map[string]uint64),
		},
	}, nil
}

// Config returns the machine's configuration.
func (m *Machine) Config() Config { return m.cfg }

// Ready returns the effects produced since the last call, in order, and
// forgets them. The shell executes them before the next Step.
func (m *Machine) Ready() []Effect {
	e := m.effects
	m.effects = nil
	return e
}

// Busy reports whether a forward is running (a RunBatch not yet answered).
func (m *Machine) Busy() bool { return m.batch != nil }

// Step applies one event at time now. now must not go backwards; an earlier
// time is treated as the last one seen.
func (m *Machine) Step(now time.Time, ev Event) {
	if now.After(m.now) {
		m.now = now
	}
	switch e := ev.(type) {
	case Arrive:
		m.arrive(e.Req)
	case AbortRequest:
		m.abort(e)
	case Tick:
		m.tick()
	case Schedule:
		m.admit()
		m.schedule()
	case BatchDone:
		m.batchDone(e)
	case PeerMessage:
		m.message(e.Peer, e.Msg)
	case PeerUp:
		m.peerUp(e.Peer)
	case PeerLost:
		m.peerLost(e.Peer, e.Err)
	case KVVerified:
		m.kvVerified(e)
	case IODone:
		m.ioDone(e.Job)
	case Shutdown:
		m.doShutdown()
	default:
		panic(fmt.Sprintf("lifecycle: unknown event %T", ev))
	}
	if m.cfg.Role == RoleDecode {
		m.admit()
	}
}

func (m *Machine) emit(e Effect) { m.effects = append(m.effects, e) }

func (m *Machine) record(r *req, format string, args ...any) {
	if m.cfg.History <= 0 {
		return
	}
	h := HistoryEntry{At: m.now, What: fmt.Sprintf(format, args...)}
	if len(r.history) < m.cfg.History {
		r.history = append(r.history, h)
		return
	}
	r.history[r.hpos] = h
	r.hpos = (r.hpos + 1) % len(r.history)
}

// setStage moves r to stage s with deadline d (zero: only the hard cap).
func (m *Machine) setStage(r *req, s Stage, d time.Duration, cause outcome.Outcome) {
	if r.stage != StageNone {
		m.stageCount[r.stage]--
		d := m.now.Sub(r.stageSince)
		r.stageTime[r.stage] += d
		m.maxStage[r.stage] = max(m.maxStage[r.stage], d)
	}
	r.stage = s
	r.stageSince = m.now
	m.stageCount[s]++
	r.deadline, r.cause = time.Time{}, outcome.None
	if d > 0 {
		r.deadline, r.cause = m.now.Add(d), cause
	}
	m.record(r, "stage %s", s)
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

// validate checks a request against the config; it returns the outcome and
// message of the first problem, or outcome.None.
func (m *Machine) validate(q Request) (outcome.Outcome, string) {
	n := len(q.InputIDs)
	switch {
	case q.RID == "":
		return outcome.RejectedInvalid, "request id is empty"
	case n == 0:
		return outcome.RejectedInvalid, "prompt is empty"
	case q.MaxTokens < 1:
		return outcome.RejectedInvalid, fmt.Sprintf("max_tokens must be at least 1, got %d", q.MaxTokens)
	case n >= m.cfg.ContextLen:
		return outcome.RejectedInvalid, fmt.Sprintf("prompt has %d tokens; this worker's context length is %d", n, m.cfg.ContextLen)
	case q.MaxTokens > m.cfg.ContextLen-n:
		return outcome.RejectedInvalid, fmt.Sprintf("prompt (%d tokens) + max_tokens (%d) exceeds the context length %d", n, q.MaxTokens, m.cfg.ContextLen)
	case m.cfg.Role != RoleColocated && q.Room.IsZero():
		return outcome.RejectedInvalid, "room is missing"
	}
	for i, id := range q.InputIDs {
		if id < 0 || int(id) >= m.cfg.VocabSize {
			return outcome.RejectedInvalid, fmt.Sprintf("input token %d at position %d is outside the vocabulary [0, %d)", id, i, m.cfg.VocabSize)
		}
	}
	if err := q.Sampling.Validate(); err != nil {
		return outcome.RejectedInvalid, err.Error()
	}
	if need := m.maxPages(q); need > m.alloc.Total() {
		return outcome.RejectedCapacity, fmt.Sprintf("request needs %d KV pages; this worker's pool has %d", need, m.alloc.Total())
	}
	return outcome.None, ""
}

// maxPages is the most pages a request can hold on this worker: its prompt
// on prefill; prompt + output on decode and colocated.
func (m *Machine) maxPages(q Request) int {
	n := len(q.InputIDs)
	if m.cfg.Role != RolePrefill {
		n += q.MaxTokens
	}
	return m.pagesFor(n)
}

// pagesFor is the number of pages that hold n tokens.
func (m *Machine) pagesFor(n int) int { return (n + m.cfg.PageSize - 1) / m.cfg.PageSize }

// admitPages is what a request needs to start: its prompt on prefill; on
// decode and colocated also the position of its first output token. Later
// pages are allocated as decoding reaches them (see grow).
func (m *Machine) admitPages(q Request) int {
	if m.cfg.Role == RolePrefill {
		return m.pagesFor(len(q.InputIDs))
	}
	return m.pagesFor(len(q.InputIDs) + 1)
}

// reserve is how many pages admission leaves free for running requests to
// grow into: 1% of the pool, at least one (vLLM's watermark).
func (m *Machine) reserve() int { return max(1, m.alloc.Total()/100) }

// admitAlloc allocates a new request's first pages, keeping the reserve
// free unless nothing else runs.
func (m *Machine) admitAlloc(r *req, n int) bool {
	busy := m.stageCount[StageDecoding] + m.stageCount[StageQueued] + m.stageCount[StagePrefilling] + m.stageCount[StageAwaitingKV]
	if busy > 0 && m.alloc.FreeCount()-n < m.reserve() {
		return false
	}
	ids, ok := m.alloc.Alloc(n)
	if !ok {
		return false
	}
	r.pages = ids
	m.admitSeq++
	r.admitted = m.admitSeq
	return true
}

func (m *Machine) promptPages(r *req) int {
	return (len(r.InputIDs) + m.cfg.PageSize - 1) / m.cfg.PageSize
}

// PromptHash is the FNV-1a hash of a prompt's token ids (little-endian
// int32s), carried in ROOM_OPEN so prefill can check both legs carry the
// same prompt.
func PromptHash(ids []int32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range ids {
		b[0], b[1], b[2], b[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		h.Write(b[:])
	}
	return h.Sum64()
}

func (m *Machine) arrive(q Request) {
	if m.shutdown {
		m.rejectEarly(q, outcome.Shutdown, "worker is shutting down")
		return
	}
	if _, dup := m.reqs[q.RID]; dup {
		m.rejectEarly(q, outcome.RejectedInvalid, "request id %q is already in use", q.RID)
		return
	}
	if t, ok := m.tombFor(q.RID, q.Room, q.Gen); ok {
		m.counters.TombstoneHits++
		m.rejectEarlyCause(q, t.outcome, "request was aborted before it arrived: "+t.cause.Detail, t.cause)
		m.dropPendingWithAbort(q.Room, q.Gen, t.cause)
		return
	}
	if o, msg := m.validate(q); o != outcome.None {
		cause := m.cause(o, StageNone, msg)
		m.rejectEarlyCause(q, o, msg, cause)
		if m.cfg.Role == RolePrefill {
			m.dropPendingWithAbort(q.Room, q.Gen, cause)
		}
		if m.cfg.Role != RoleColocated {
			m.addTomb(tombKey{room: q.Room}, q.Gen, outcome.AbortedPeer, cause)
		}
		return
	}
	if old, ok := m.rooms[q.Room]; ok && m.cfg.Role != RoleColocated {
		if q.Gen <= old.Gen {
			m.rejectEarly(q, outcome.RejectedInvalid, "room %s is in use by request %q (gen %d)", q.Room, old.RID, old.Gen)
			return
		}
		m.finish(old, outcome.AbortedPeer, fmt.Sprintf("superseded by retry gen %d", q.Gen), "")
	}
	if _, lost := m.lostPeers[q.Peer]; lost && m.cfg.Role == RoleDecode {
		m.rejectEarly(q, outcome.PeerLost, "KV connection to %s was lost before the request arrived", q.PeerAddr)
		m.addTomb(tombKey{room: q.Room}, q.Gen, outcome.PeerLost,
			m.cause(outcome.PeerLost, StageNone, "decode lost its KV connection"))
		return
	}
	r := &req{Request: q, arrived: m.now, stageSince: m.now}
	limit := m.cfg.MaxRequestTime
	if q.Timeout > 0 && q.Timeout < limit {
		limit = q.Timeout
	}
	r.hardDeadline = m.now.Add(limit)
	m.reqs[q.RID] = r
	if m.cfg.Role != RoleColocated {
		m.rooms[q.Room] = r
	}
	m.record(r, "arrive: %d prompt tokens, max_tokens %d", len(q.InputIDs), q.MaxTokens)
	switch m.cfg.Role {
	case RolePrefill:
		m.setStage(r, StageBootstrap, m.cfg.BootstrapTimeout, outcome.TimeoutBootstrap)
		m.queue = append(m.queue, r)
		if p, ok := m.pending[q.Room]; ok && p.open.Gen == q.Gen {
			delete(m.pending, q.Room)
			m.roomOpened(r, p.peer, p.open)
			if r.stage != StageDone && p.ready {
				m.roomReady(r, p.readyNT)
			}
		}
	case RoleDecode:
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

func (r *req) roomGen() kvxfer.RoomGen { return kvxfer.RoomGen{Room: r.Room, Gen: r.Gen} }

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

// finish ends r: the one way out of every stage. It frees r's pages (after
// the running forward if r is in it), tells the peer unless the peer caused
// the end, leaves a tombstone for a failed room, and emits one Finalize.
func (m *Machine) finish(r *req, o outcome.Outcome, reason, finishReason string) {
	if r.stage == StageDone {
		return
	}
	var cause outcome.Cause
	if o != outcome.OK {
		cause = m.rootCause(r, o, reason)
	}
	if o != outcome.OK && m.shared(r) && o != outcome.PeerLost && !r.peerEnded {
		m.emit(Send{Peer: r.Peer, Msg: kvxfer.Abort{RoomGen: r.roomGen(), Cause: cause}})
	}
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
	delete(m.reqs, r.RID)
	if cur, ok := m.rooms[r.Room]; ok && cur == r {
		delete(m.rooms, r.Room)
	}
	if o != outcome.OK && m.cfg.Role != RoleColocated {
		m.addTomb(tombKey{room: r.Room}, r.Gen, o, cause)
	}
	m.record(r, "end %s %s", o, reason)
	st := make(map[Stage]time.Duration)
	for s, d := range r.stageTime {
		if d > 0 {
			st[Stage(s)] = d
		}
	}
	f := Finalize{RID: r.RID, RoomGen: r.roomGen(), Outcome: o, PromptTokens: len(r.InputIDs),
		OutputTokens: len(r.outputs), StageTime: st, Age: m.now.Sub(r.arrived)}
	if o == outcome.OK {
		f.FinishReason = finishReason
		if m.cfg.Role == RolePrefill {
			f.FirstToken = r.first
			f.OutputTokens = 0
		}
	} else {
		f.Err, f.Cause = reason, cause
	}
	m.emit(f)
}

// release frees the pages of an ended request once neither the forward nor
// page I/O uses them.
func (m *Machine) release(r *req) {
	if r.stage != StageDone || r.inBatch || r.pins > 0 {
		return
	}
	delete(m.draining, r)
	if len(r.pages) > 0 {
		m.free(r.pages)
		r.pages = nil
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

func (m *Machine) free(pages []kvcache.PageID) {
	if err := m.alloc.Free(pages); err != nil {
		// A double free would hand one page to two requests; the machine's
		// bookkeeping makes it impossible, so this is a bug worth a crash.
		panic(fmt.Sprintf("lifecycle: %v", err))
	}
}

func (m *Machine) addTomb(k tombKey, gen uint32, o outcome.Outcome, cause outcome.Cause) {
	if k.room.IsZero() && k.rid == "" {
		return
	}
	if _, exists := m.tombs[k]; !exists {
		m.tombOrder = append(m.tombOrder, k)
	}
	m.tombs[k] = tombstone{gen: gen, outcome: o, cause: cause, until: m.now.Add(m.cfg.TombstoneTTL)}
	for len(m.tombs) > m.cfg.MaxTombstones && len(m.tombOrder) > 0 {
		delete(m.tombs, m.tombOrder[0])
		m.tombOrder = m.tombOrder[1:]
	}
}

// tombFor finds a tombstone that covers (rid, room, gen): a room tombstone
// covers its gen and older ones (gen 0 covers every gen).
func (m *Machine) tombFor(rid string, room kvxfer.Room, gen uint32) (tombstone, bool) {
	if !room.IsZero() {
		if t, ok := m.tombs[tombKey{room: room}]; ok && (t.gen == 0 || gen <= t.gen) {
			return t, true
		}
	}
	if rid != "" {
		if t, ok := m.tombs[tombKey{rid: rid}]; ok && (t.gen == 0 || gen <= t.gen) {
			return t, true
		}
	}
	return tombstone{}, false
}

// dropPendingWithAbort removes a pending ROOM_OPEN and tells its sender why.
func (m *Machine) dropPendingWithAbort(room kvxfer.Room, gen uint32, cause outcome.Cause) {
	p, ok := m.pending[room]
	if !ok || p.open.Gen != gen {
		return
	}
	delete(m.pending, room)
	m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: p.open.RoomGen, Cause: cause}})
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
		if a.RID != "" {
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
		m.finish(r, o, "", "stop")
		return
	}
	if o == outcome.AbortedPeer && a.Cause.Known() {
		r.peerCause = a.Cause
	}
	m.finish(r, o, reason, "")
}

func (m *Machine) doShutdown() {
	m.shutdown = true
	for _, r := range m.sortedLive() {
		m.finish(r, outcome.Shutdown, "worker is shutting down", "")
	}
	for room, p := range m.pending {
		delete(m.pending, room)
		m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: p.open.RoomGen,
			Cause: m.cause(outcome.Shutdown, StageNone, "prefill worker is shutting down")}})
	}
}

// sortedLive returns live requests in arrival order (deterministic effects).
func (m *Machine) sortedLive() []*req {
	out := make([]*req, 0, len(m.reqs))
	for _, r := range m.queue {
		if r.stage != StageDone && m.reqs[r.RID] == r {
			out = append(out, r)
		}
	}
	return out
}

func (m *Machine) tick() {
	now := m.now
	for _, r := range m.sortedLive() {
		switch {
		case !r.deadline.IsZero() && !now.Before(r.deadline):
			m.finish(r, r.cause, fmt.Sprintf("%s deadline passed after %s", r.stage, now.Sub(r.stageSince).Round(time.Millisecond)), "")
		case !now.Before(r.hardDeadline):
			m.finish(r, outcome.TimeoutRequest, fmt.Sprintf("request exceeded its time limit of %s (in stage %s)", r.hardDeadline.Sub(r.arrived), r.stage), "")
		case m.leased(r) && now.Sub(r.lastRenew) > m.cfg.Lease():
			m.finish(r, outcome.LeaseExpired, fmt.Sprintf("peer %d stopped renewing the room (no renewal for %s)", r.Peer, now.Sub(r.lastRenew).Round(time.Millisecond)), "")
		}
	}
	for room, p := range m.pending {
		if now.Sub(p.at) >= m.cfg.BootstrapTimeout {
			delete(m.pending, room)
			m.counters.PendingOpensExpired++
			m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: p.open.RoomGen, Cause: m.cause(outcome.TimeoutBootstrap, StageNone,
				fmt.Sprintf("unknown_room: no prefill request arrived for room %s within %s", room, m.cfg.BootstrapTimeout))}})
		}
	}
	for p, at := range m.lostPeers {
		if now.Sub(at) > m.cfg.TombstoneTTL {
			delete(m.lostPeers, p)
		}
	}
	for len(m.tombOrder) > 0 {
		k := m.tombOrder[0]
		t, ok := m.tombs[k]
		if ok && now.Before(t.until) {
			break
		}
		delete(m.tombs, k)
		m.tombOrder = m.tombOrder[1:]
	}
	if m.cfg.Role != RoleColocated && now.Sub(m.lastRenewal) >= m.cfg.HeartbeatInterval {
		m.lastRenewal = now
		m.renew()
	}
	m.compactQueue()
}

// leased reports whether r is held for a peer that must keep renewing it.
func (m *Machine) leased(r *req) bool {
	switch m.cfg.Role {
	case RolePrefill:
		return r.opened
	case RoleDecode:
		return r.peerUp && (r.stage == StagePrealloc || r.stage == StageAwaitingKV)
	}
	return false
}

// renew sends each peer the rooms this side still holds for it.
func (m *Machine) renew() {
	byPeer := make(map[kvxfer.PeerID][]kvxfer.RoomGen)
	var peers []kvxfer.PeerID
	add := func(p kvxfer.PeerID, rg kvxfer.RoomGen) {
		if _, ok := byPeer[p]; !ok {
			peers = append(peers, p)
		}
		byPeer[p] = append(byPeer[p], rg)
	}
	for _, r := range m.sortedLive() {
		switch m.cfg.Role {
		case RolePrefill:
			if r.opened {
				add(r.Peer, r.roomGen())
			}
		case RoleDecode:
			if r.stage == StagePrealloc || r.stage == StageAwaitingKV {
				add(r.Peer, r.roomGen())
			}
		}
	}
	for _, p := range m.pending {
		add(p.peer, p.open.RoomGen)
	}
	slices.Sort(peers)
	for _, p := range peers {
		m.emit(Send{Peer: p, Msg: kvxfer.RoomRenew{Rooms: byPeer[p]}})
	}
}

// compactQueue drops finished requests from the queue. Tick calls it, and
// schedule does once half the queue is finished, so that the scans over the
// queue cost O(live requests) however rarely the shell ticks.
// maybeCancelBatch emits CancelBatch once every sequence of the running
// forward has ended.
func (m *Machine) maybeCancelBatch() {
	if m.batch == nil || m.batchCancelled {
		return
	}
	for _, b := range m.batch {
		if b.r.stage != StageDone && b.r.Gen == b.gen {
			return
		}
	}
	m.batchCancelled = true
	m.emit(CancelBatch{})
}

func (m *Machine) compactQueue() {
	m.doneInQueue = 0
	live := m.queue[:0]
	for _, r := range m.queue {
		if r.stage != StageDone {
			live = append(live, r)
		}
	}
	clear(m.queue[len(live):])
	m.queue = live
}

func (m *Machine) peerUp(p kvxfer.PeerID) {
	m.peersUp[p] = true
	for _, r := range m.sortedLive() {
		if r.Peer == p && !r.peerUp && m.cfg.Role == RoleDecode {
			r.peerUp = true
			r.lastRenew = m.now
			m.record(r, "peer %d up", p)
		}
	}
}

func (m *Machine) peerLost(p kvxfer.PeerID, err error) {
	delete(m.peersUp, p)
	if m.cfg.Role == RoleColocated {
		return
	}
	m.lostPeers[p] = m.now
	reason := fmt.Sprintf("KV connection (peer %d) lost", p)
	if err != nil {
		reason = fmt.Sprintf("KV connection lost: %v", err)
	}
	for _, r := range m.sortedLive() {
		if r.Peer != p {
			continue
		}
		if m.cfg.Role == RolePrefill && !r.opened {
			continue
		}
		if m.cfg.Role == RoleDecode && r.ackSent {
			continue // the KV is here; the peer no longer matters
		}
		m.finish(r, outcome.PeerLost, reason, "")
	}
	for room, po := range m.pending {
		if po.peer == p {
			delete(m.pending, room)
		}
	}
}

func (m *Machine) drop(reason string) { m.counters.FramesDropped[reason]++ }

func (m *Machine) message(p kvxfer.PeerID, msg kvxfer.Message) {
	switch x := msg.(type) {
	case kvxfer.RoomRenew:
		for _, rg := range x.Rooms {
			if r, ok := m.rooms[rg.Room]; ok && r.Gen == rg.Gen && r.Peer == p {
				r.lastRenew = m.now
			}
		}
		return
	case kvxfer.AbortAck:
		m.counters.AbortsAcked++
		return
	case kvxfer.Abort:
		m.peerAbort(p, x)
		return
	}
	if m.cfg.Role == RolePrefill {
		m.prefillMessage(p, msg)
	} else if m.cfg.Role == RoleDecode {
		m.decodeMessage(p, msg)
	} else {
		m.drop("wrong_role")
	}
}

func (m *Machine) peerAbort(p kvxfer.PeerID, a kvxfer.Abort) {
	m.emit(Send{Peer: p, Msg: kvxfer.AbortAck{RoomGen: a.RoomGen}})
	if po, ok := m.pending[a.Room]; ok && po.peer == p && po.open.Gen == a.Gen {
		delete(m.pending, a.Room)
	}
	reason := "peer aborted: " + a.Reason()
	r, ok := m.rooms[a.Room]
	if !ok || r.Gen != a.Gen || (r.Peer != p && m.shared(r)) {
		cause := a.Cause
		if !cause.Known() {
			cause = m.cause(outcome.AbortedPeer, StageNone, reason)
		}
		m.addTomb(tombKey{room: a.Room}, a.Gen, outcome.AbortedPeer, cause)
		return
	}
	m.record(r, "ABORT from peer: %s", a.Reason())
	if m.cfg.Role == RoleDecode && r.ackSent {
		return // prefill's side ended after handing over the KV
	}
	r.peerEnded = true
	if a.Cause.Known() {
		r.peerCause = a.Cause
	}
	m.finish(r, outcome.AbortedPeer, reason, "")
}

// liveFor finds the live request for a room message and checks gen and peer;
// it counts and returns nil for a message to drop.
func (m *Machine) liveFor(p kvxfer.PeerID, rg kvxfer.RoomGen) *req {
	r, ok := m.rooms[rg.Room]
	switch {
	case !ok:
		m.drop("unknown_room")
		return nil
	case r.Gen != rg.Gen:
		m.drop("stale_gen")
		return nil
	case r.opened && r.Peer != p:
		m.drop("wrong_peer")
		return nil
	}
	return r
}

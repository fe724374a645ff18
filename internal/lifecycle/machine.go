package lifecycle

import (
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Machine is the state machine of one worker. See the package doc.
type Machine struct {
	cfg Config
	// cache holds the pages: the allocator with reference counts and,
	// with Config.PrefixCache, the index of full pages (prefix.go).
	cache *kvcache.Cache
	now   time.Time

	// seed roots the page hashes of this model (kvxfer.ChainSeed).
	seed kvxfer.PageHash
	// pageHash (prefill) is, per page, the hash of the prompt tokens whose
	// KV the forward wrote into it (kvxfer.ChainPage), set when the page's
	// last token is computed (a page matched in the prefix cache keeps the
	// one it was published with) and cleared when the page is freed. KV_DONE's
	// binding is built from these, not from the request the pages are sent
	// for, so pages that hold another request's KV do not bind.
	pageHash []kvxfer.PageHash

	reqs  map[string]*req
	rooms map[kvxfer.Room]*req
	// queue holds requests in arrival order; scheduling scans it and drops
	// entries that left.
	queue []*req
	// doneInQueue counts finished requests still in queue.
	doneInQueue int

	pending    map[kvxfer.Room]*pendingOpen
	pendingSeq uint64 // last pendingOpen.seq
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
	// request that arrives naming one fails at once, as the connection's
	// rooms did.
	lostPeers   map[kvxfer.PeerID]lostPeer
	lastRenewal time.Time
	shutdown    bool
	leaving     bool // Drain: new requests are refused

	effects  []Effect
	counters Counters
	// mut is the rule the model checker's mutation test breaks (mutation.go);
	// mutNone in every real machine.
	mut mutation
}

// New returns a machine over alloc, whose pages must all be free; the
// machine alone allocates them from then on. It returns an error for an
// invalid config.
func New(cfg Config, alloc *kvcache.Allocator) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Machine{
		cfg:       cfg,
		cache:     kvcache.NewCache(alloc, cfg.PrefixCache),
		seed:      kvxfer.ChainSeed(cfg.Fingerprint),
		reqs:      make(map[string]*req),
		rooms:     make(map[kvxfer.Room]*req),
		pending:   make(map[kvxfer.Room]*pendingOpen),
		tombs:     make(map[tombKey]tombstone),
		peersUp:   make(map[kvxfer.PeerID]bool),
		draining:  make(map[*req]struct{}),
		jobs:      make(map[uint64]*req),
		lostPeers: make(map[kvxfer.PeerID]lostPeer),
		counters: Counters{
			FramesDropped: make(map[string]uint64),
		},
	}
	if cfg.Role == RolePrefill {
		m.pageHash = make([]kvxfer.PageHash, alloc.Total())
	}
	return m, nil
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
	case Drain:
		m.doDrain()
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
	r.deadline, r.cause, r.budget = time.Time{}, outcome.None, 0
	if d > 0 {
		r.deadline, r.cause, r.budget = m.now.Add(d), cause, d
	}
	m.record(r, "stage %s", s)
}

// sortedLive returns live requests in arrival order (deterministic effects).
func (m *Machine) sortedLive() []*req {
	out := make([]*req, 0, len(m.reqs))
	for _, r := range m.queue {
		head := r
		if r.group != nil {
			head = r.group.members[0] // the choices of an n > 1 request live under its head
		}
		if r.stage != StageDone && m.reqs[r.RID] == head {
			out = append(out, r)
		}
	}
	return out
}

func (m *Machine) tick() {
	now := m.now
	for _, r := range m.sortedLive() {
		switch {
		case !r.deadline.IsZero() && !now.Before(r.deadline) && r.stage == StageAwaitingKV:
			m.finish(r, r.cause, fmt.Sprintf("KV transfer made no progress for %s (no KV chunk and no renewal of the room from prefill); %s in awaiting_kv",
				r.budget, now.Sub(r.stageSince).Round(time.Millisecond)), "")
		case !r.deadline.IsZero() && !now.Before(r.deadline) && r.opt.unbound && r.cause == outcome.TimeoutBootstrap:
			m.finish(r, r.cause, fmt.Sprintf("decode did not open the room within %s; its optimistic KV (%s) is dropped",
				m.cfg.BootstrapTimeout, r.stage), "")
		case !r.deadline.IsZero() && !now.Before(r.deadline):
			m.finish(r, r.cause, fmt.Sprintf("%s deadline passed after %s", r.stage, now.Sub(r.stageSince).Round(time.Millisecond)), "")
		case !now.Before(r.hardDeadline):
			m.finish(r, outcome.TimeoutRequest, fmt.Sprintf("request exceeded its time limit of %s (in stage %s)", r.hardDeadline.Sub(r.arrived), r.stage), "")
		case m.leased(r) && now.Sub(r.lastRenew) > m.cfg.Lease() && m.mut != mutNoLease:
			m.finish(r, outcome.LeaseExpired, fmt.Sprintf("peer %d stopped renewing the room (no renewal for %s)", r.Peer, now.Sub(r.lastRenew).Round(time.Millisecond)), "")
		}
	}
	m.expirePending()
	for p, lp := range m.lostPeers { // only forgets: nothing is emitted
		if now.Sub(lp.at) > m.cfg.TombstoneTTL {
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

// compactQueue drops finished requests from the queue. Tick calls it, and
// schedule does once half the queue is finished, so that the scans over the
// queue cost O(live requests) however rarely the shell ticks.
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

package lifecycle

import (
	"maps"
	"time"
)

// Counters are totals since the machine started.
type Counters struct {
	// FramesDropped counts room messages dropped, by reason: unknown_room,
	// stale_gen, wrong_peer, wrong_state, duplicate, malformed, and
	// wrong_binding (a KV_DONE whose binding is not its request's: the
	// request fails with failed_transfer).
	FramesDropped map[string]uint64
	// TombstoneHits counts arrivals and messages that met a tombstone.
	TombstoneHits uint64
	// PeerAbortTombstones counts ABORTs from a peer for a room (or gen)
	// this side did not hold: each left a tombstone (for TombstoneTTL) so
	// that the room's request or frames, if they still come, fail at once.
	PeerAbortTombstones uint64
	// AbortsAcked counts ABORT_ACKs received.
	AbortsAcked uint64
	// PendingOpensExpired counts ROOM_OPENs for which no request arrived.
	PendingOpensExpired uint64
	// Preemptions counts requests that lost their pages to older ones and
	// recomputed their KV.
	Preemptions uint64
	// Optimistic counts optimistic prefill (prefill role), indexed by
	// OptimisticOutcome: requests started before their ROOM_OPEN, parked
	// complete before it, and how their optimistic KV ended (sent, expired,
	// aborted, fell back; started = the sum of these and the ones still
	// pending).
	Optimistic [numOptimisticOutcomes]uint64
	// PrefixQueriedTokens counts the tokens looked up in the prefix cache
	// (each time a request starts computing, or decode admits a room) and
	// PrefixHitTokens those found (vLLM's prefix_cache_queries and
	// prefix_cache_hits); PrefixEvictions the cached pages evicted to make
	// room.
	PrefixQueriedTokens uint64
	PrefixHitTokens     uint64
	PrefixEvictions     uint64
}

// HistoryEntry is one lifecycle event of a request, for /debug/requests/{rid}.
type HistoryEntry struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

// Stats is a point-in-time view of a machine, for gauges.
type Stats struct {
	Role Role
	// Stages counts live requests per stage of the role (every stage of the
	// role is present, possibly 0).
	Stages map[Stage]int
	// OldestInStage is, per stage, how long the request that entered it
	// earliest has been there (0 when the stage is empty).
	OldestInStage map[Stage]time.Duration
	// MaxInStage is, per stage, the longest time a request spent in it
	// before leaving it, since the machine started.
	MaxInStage map[Stage]time.Duration
	Live       int
	// PagesUsed are the pages requests hold (shared ones once), PagesCached
	// the prefix cache's unreferenced pages (evicted as allocations need
	// them); the rest of PagesTotal is free.
	PagesUsed    int
	PagesCached  int
	PagesTotal   int
	PendingOpens int
	Tombstones   int
	// UnboundComputingPages and UnboundParkedPages (prefill) are the pages
	// held by optimistic requests before their ROOM_OPEN: being computed,
	// and complete (parked).
	UnboundComputingPages int
	UnboundParkedPages    int
	// Draining is set once the machine refuses new requests to drain;
	// Drained once, draining, it holds nothing.
	Draining bool
	Drained  bool
	Counters Counters
}

// Pages returns the page accounting: pages requests hold, the prefix
// cache's unreferenced pages, and the pool's total. Safe from any
// goroutine (the counts are atomic), unlike the rest of the machine.
func (m *Machine) Pages() (used, cached, total int) {
	return m.cache.Used(), m.cache.Cached(), m.cache.Total()
}

// Stats returns the machine's counts at time now.
func (m *Machine) Stats(now time.Time) Stats {
	s := Stats{
		Role:          m.cfg.Role,
		Stages:        make(map[Stage]int),
		OldestInStage: make(map[Stage]time.Duration),
		MaxInStage:    make(map[Stage]time.Duration),
		Live:          len(m.reqs),
		PagesUsed:     m.cache.Used(),
		PagesCached:   m.cache.Cached(),
		PagesTotal:    m.cache.Total(),
		PendingOpens:  len(m.pending),
		Tombstones:    len(m.tombs),
		Draining:      m.leaving,
		Drained:       m.Drained(),
		Counters: Counters{
			FramesDropped:       maps.Clone(m.counters.FramesDropped),
			TombstoneHits:       m.counters.TombstoneHits,
			PeerAbortTombstones: m.counters.PeerAbortTombstones,
			AbortsAcked:         m.counters.AbortsAcked,
			PendingOpensExpired: m.counters.PendingOpensExpired,
			Preemptions:         m.counters.Preemptions,
			Optimistic:          m.counters.Optimistic,
			PrefixQueriedTokens: m.counters.PrefixQueriedTokens,
			PrefixHitTokens:     m.counters.PrefixHitTokens,
			PrefixEvictions:     m.cache.Evictions(),
		},
	}
	s.UnboundComputingPages, s.UnboundParkedPages = m.unboundPages()
	for _, st := range m.cfg.Role.Stages() {
		s.Stages[st] = m.stageCount[st]
		s.OldestInStage[st] = 0
		s.MaxInStage[st] = m.maxStage[st]
	}
	for _, r := range m.reqs { // a maximum: the order does not matter
		if age := now.Sub(r.stageSince); age > s.OldestInStage[r.stage] {
			s.OldestInStage[r.stage] = age
		}
	}
	return s
}

// RequestInfo describes one live request, for /debug/requests and
// `pdserve inspect`.
// DeadlineKind values of RequestInfo.
const (
	DeadlineStage   = "stage"
	DeadlineLease   = "lease"
	DeadlineRequest = "request"
)

type RequestInfo struct {
	RID          string  `json:"rid"`
	Room         string  `json:"room,omitempty"`
	Gen          uint32  `json:"gen,omitempty"`
	Stage        string  `json:"stage"`
	AgeSeconds   float64 `json:"age_s"`
	InStageSecs  float64 `json:"in_stage_s"`
	DeadlineLeft float64 `json:"deadline_left_s"`
	// DeadlineKind says what DeadlineLeft counts down to: DeadlineStage
	// (the stage's own deadline), DeadlineLease (the peer's renewals: it
	// moves out each time the peer renews the room, so a small value is
	// normal) or DeadlineRequest (the request's time limit).
	DeadlineKind string `json:"deadline_kind,omitempty"`
	// StageBudget is the span the stage's deadline was last set to, by its
	// flag (0 when the stage is bounded only by the request's time limit);
	// decode's transfer deadline is re-armed on progress, so for it this is
	// --transfer-timeout from the last KV chunk or renewal.
	StageBudget  float64 `json:"stage_budget_s"`
	Peer         uint64  `json:"peer,omitempty"`
	PeerAddr     string  `json:"peer_addr,omitempty"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	Pages        int     `json:"pages"`
	// Optimistic (prefill): its KV is computed before decode's ROOM_OPEN
	// and not yet bound to the room.
	Optimistic bool `json:"optimistic,omitempty"`
	// Choice is the choice this entry generates, for a request with n > 1
	// (each choice is listed, under the request's rid).
	Choice    int            `json:"choice,omitempty"`
	LastEvent string         `json:"last_event"`
	History   []HistoryEntry `json:"history,omitempty"`
}

func (m *Machine) info(r *req, now time.Time, history bool) RequestInfo {
	ri := RequestInfo{
		RID: r.RID, Gen: r.Gen, Stage: r.stage.String(),
		AgeSeconds:   now.Sub(r.arrived).Seconds(),
		InStageSecs:  now.Sub(r.stageSince).Seconds(),
		Peer:         uint64(r.Peer),
		PeerAddr:     r.PeerAddr,
		PromptTokens: len(r.InputIDs),
		OutputTokens: len(r.outputs),
		Pages:        len(r.pages),
		Optimistic:   r.opt.unbound,
		Choice:       r.choice,
	}
	if !r.Room.IsZero() {
		ri.Room = r.Room.String()
	}
	deadline := r.hardDeadline
	ri.DeadlineKind = DeadlineRequest
	if !r.deadline.IsZero() && r.deadline.Before(deadline) {
		deadline, ri.DeadlineKind = r.deadline, DeadlineStage
		ri.StageBudget = r.budget.Seconds()
	}
	if m.leased(r) {
		if lease := r.lastRenew.Add(m.cfg.Lease()); lease.Before(deadline) {
			deadline, ri.DeadlineKind = lease, DeadlineLease
		}
	}
	ri.DeadlineLeft = deadline.Sub(now).Seconds()
	h := r.orderedHistory()
	if len(h) > 0 {
		ri.LastEvent = h[len(h)-1].What
	}
	if history {
		ri.History = h
	}
	return ri
}

func (r *req) orderedHistory() []HistoryEntry {
	out := make([]HistoryEntry, 0, len(r.history))
	out = append(out, r.history[r.hpos:]...)
	return append(out, r.history[:r.hpos]...)
}

// Requests lists live requests in arrival order.
func (m *Machine) Requests(now time.Time) []RequestInfo {
	live := m.sortedLive()
	out := make([]RequestInfo, 0, len(live))
	for _, r := range live {
		out = append(out, m.info(r, now, false))
	}
	return out
}

// Request describes one live request with its recent lifecycle events.
func (m *Machine) Request(rid string, now time.Time) (RequestInfo, bool) {
	r, ok := m.reqs[rid]
	if !ok {
		return RequestInfo{}, false
	}
	return m.info(r, now, true), true
}

// Live is the number of live requests.
func (m *Machine) Live() int { return len(m.reqs) }

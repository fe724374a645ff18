package lifecycle

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// pendingOpen is a ROOM_OPEN that reached prefill before the request it
// opens (bounded by MaxPendingOpens, dropped after BootstrapTimeout), and a
// ROOM_READY that followed it.
type pendingOpen struct {
	open kvxfer.RoomOpen
	peer kvxfer.PeerID
	at   time.Time
	// seq orders pending opens by arrival: whatever the machine emits about
	// several of them (renewals, expiry, shutdown) goes out in this order,
	// never in map order, so a seeded run replays bit for bit.
	seq         uint64
	ready       bool
	readyNT     uint32
	readyCached uint32
}

// pendingInOrder returns the pending ROOM_OPENs in arrival order.
func (m *Machine) pendingInOrder() []*pendingOpen {
	out := slices.Collect(maps.Values(m.pending))
	slices.SortFunc(out, func(a, b *pendingOpen) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// expirePending drops the pending ROOM_OPENs older than BootstrapTimeout and
// tells each sender (ABORT{unknown_room}), in arrival order.
func (m *Machine) expirePending() {
	// A ROOM_OPEN held back for its live request (the optimistic test hook)
	// ends with the request.
	expired := func(p *pendingOpen) bool { return m.now.Sub(p.at) >= m.cfg.BootstrapTimeout && m.heldFor(p) == nil }
	due := false
	for _, p := range m.pending {
		if expired(p) {
			due = true
			break
		}
	}
	if !due {
		return // the common case: no sort
	}
	for _, p := range m.pendingInOrder() {
		if !expired(p) {
			continue
		}
		delete(m.pending, p.open.Room)
		m.counters.PendingOpensExpired++
		m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: p.open.RoomGen, Cause: m.cause(outcome.TimeoutBootstrap, StageNone,
			fmt.Sprintf("unknown_room: no prefill request arrived for room %s within %s", p.open.Room, m.cfg.BootstrapTimeout))}})
	}
}

// abortPending drops every pending ROOM_OPEN and tells each sender why, in
// arrival order; one held back for its live request (the optimistic test
// hook) stays: it ends with the request.
func (m *Machine) abortPending(cause outcome.Cause) {
	for _, p := range m.pendingInOrder() {
		if m.heldFor(p) != nil {
			continue
		}
		delete(m.pending, p.open.Room)
		m.emit(Send{Peer: p.peer, Msg: kvxfer.Abort{RoomGen: p.open.RoomGen, Cause: cause}})
	}
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

func (m *Machine) prefillMessage(p kvxfer.PeerID, msg kvxfer.Message) {
	switch x := msg.(type) {
	case kvxfer.RoomOpen:
		m.prefillRoomOpen(p, x)
	case kvxfer.RoomReady:
		r, ok := m.rooms[x.Room]
		if !ok || r.Gen != x.Gen {
			if po, ok := m.pending[x.Room]; ok && po.peer == p && po.open.Gen == x.Gen {
				po.ready, po.readyNT, po.readyCached = true, x.NTokens, x.CachedPages
				return
			}
			m.refuse(p, x.RoomGen)
			return
		}
		if po, ok := m.pending[x.Room]; ok && po.peer == p && po.open.Gen == x.Gen && !r.opened {
			po.ready, po.readyNT, po.readyCached = true, x.NTokens, x.CachedPages // its ROOM_OPEN is held back (optimistic test hook)
			return
		}
		if r = m.liveFor(p, x.RoomGen); r == nil {
			return
		}
		if !r.opened {
			m.drop("wrong_state")
			return
		}
		m.roomReady(r, x.NTokens, x.CachedPages)
	case kvxfer.KVAck:
		r := m.liveFor(p, x.RoomGen)
		if r == nil {
			return
		}
		if r.stage != StageTransferring {
			m.drop("wrong_state")
			return
		}
		m.record(r, "KV_ACK")
		m.finish(r, outcome.OK, "", "length")
	default:
		m.drop("wrong_role")
	}
}

// refuse answers a room message for a room this side does not hold with an
// ABORT, so the peer fails at once instead of waiting for a deadline.
func (m *Machine) refuse(p kvxfer.PeerID, rg kvxfer.RoomGen) {
	cause := outcome.Cause{Detail: fmt.Sprintf("unknown_room: worker holds no room %s", rg)}
	if t, ok := m.tombFor("", rg.Room, rg.Gen); ok {
		m.counters.TombstoneHits++
		cause = t.cause
	} else if r, ok := m.rooms[rg.Room]; ok {
		m.drop("stale_gen")
		cause.Detail = fmt.Sprintf("stale generation %d: room %s is at gen %d", rg.Gen, rg.Room, r.Gen)
	} else {
		m.drop("unknown_room")
	}
	m.emit(Send{Peer: p, Msg: kvxfer.Abort{RoomGen: rg, Cause: cause}})
}

func (m *Machine) prefillRoomOpen(p kvxfer.PeerID, x kvxfer.RoomOpen) {
	if r, ok := m.rooms[x.Room]; ok && r.Gen == x.Gen {
		if r.opened {
			m.drop("duplicate")
			return
		}
		if po, held := m.pending[x.Room]; held && po.open.Gen == x.Gen {
			m.drop("duplicate")
			return
		}
		if m.holdsOpen(r) {
			m.pendingSeq++
			m.pending[x.Room] = &pendingOpen{open: x, peer: p, at: m.now, seq: m.pendingSeq}
			m.record(r, "ROOM_OPEN from peer %d held back until the optimistic prefill ends (test hook)", p)
			return
		}
		m.roomOpened(r, p, x)
		return
	}
	if r, ok := m.rooms[x.Room]; ok {
		// A newer gen is a retry whose ROOM_OPEN came before its prefill
		// leg (decode got its leg first): the leg will supersede r, so the
		// open is held for it as for a room not seen yet — refusing it
		// would fail the retry. An older gen, or a room whose own open is
		// held back, is refused.
		if _, held := m.pending[x.Room]; x.Gen <= r.Gen || held {
			m.refuse(p, x.RoomGen)
			return
		}
	}
	if _, ok := m.tombFor(x.RID, x.Room, x.Gen); ok {
		m.refuse(p, x.RoomGen)
		return
	}
	if po, ok := m.pending[x.Room]; ok {
		if po.peer == p && po.open.Gen == x.Gen {
			m.drop("duplicate")
			return
		}
		m.refuse(p, x.RoomGen)
		return
	}
	if m.leaving {
		m.emit(Send{Peer: p, Msg: kvxfer.Abort{RoomGen: x.RoomGen,
			Cause: m.cause(outcome.Draining, StageNone, "prefill worker is draining: it takes no new room")}})
		return
	}
	if m.shutdown || len(m.pending) >= m.cfg.MaxPendingOpens {
		m.emit(Send{Peer: p, Msg: kvxfer.Abort{RoomGen: x.RoomGen, Cause: outcome.Cause{
			Detail: fmt.Sprintf("prefill cannot hold room %s: %d rooms already wait for their request", x.Room, len(m.pending))}}})
		return
	}
	m.pendingSeq++
	m.pending[x.Room] = &pendingOpen{open: x, peer: p, at: m.now, seq: m.pendingSeq}
}

func (m *Machine) roomOpened(r *req, p kvxfer.PeerID, x kvxfer.RoomOpen) {
	r.Peer, r.opened, r.lastRenew = p, true, m.now
	m.record(r, "ROOM_OPEN from peer %d", p)
	if x.RID != r.RID || int(x.NTokens) != len(r.InputIDs) || x.PromptHash != PromptHash(r.InputIDs) {
		m.finish(r, outcome.FailedIdentity, fmt.Sprintf(
			"request identity mismatch for room %s: decode has rid %q with %d prompt tokens (hash %016x), prefill has rid %q with %d (hash %016x)",
			r.Room, x.RID, x.NTokens, x.PromptHash, r.RID, len(r.InputIDs), PromptHash(r.InputIDs)), "")
		return
	}
	if r.opt.unbound {
		m.bindOptimistic(r)
		return
	}
	m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
}

func (m *Machine) roomReady(r *req, nt, cached uint32) {
	if int(nt) != len(r.InputIDs) {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf("ROOM_READY is for %d tokens but the prompt has %d", nt, len(r.InputIDs)), "")
		return
	}
	if r.ready {
		m.drop("duplicate")
		return
	}
	if int64(cached) > int64(m.promptPages(r)) {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf("ROOM_READY says decode holds %d cached pages of a %d-page prompt", cached, m.promptPages(r)), "")
		return
	}
	r.ready, r.peerCached = true, int(cached)
	m.record(r, "ROOM_READY%s", heldByDecode(r.peerCached))
	switch r.stage {
	case StagePrefilling:
		m.sendComputed(r)
	case StageParked:
		m.startTransfer(r)
	}
}

// sendComputed sends the pages whose KV is complete and not yet sent: full
// pages while prefilling (a partial page is still being written), every
// page once the prompt is done.
//
// Pages decode holds from its cache (peerCached) are not sent: once the
// computed pages reach them they count as sent.
func (m *Machine) sendComputed(r *req) {
	upto := r.computed / m.cfg.PageSize
	if r.computed == len(r.InputIDs) {
		upto = m.promptPages(r)
	}
	if r.sentPages < r.peerCached && upto >= r.peerCached {
		r.sentPages = r.peerCached
	}
	for r.sentPages < upto && r.sentPages >= r.peerCached {
		k := min(m.cfg.MaxChunkPages, upto-r.sentPages)
		m.emit(SendKV{Job: m.pin(r), Peer: r.Peer, RoomGen: r.roomGen(), Seq: r.chunks, FirstPage: uint32(r.sentPages),
			Pages: r.pages[r.sentPages : r.sentPages+k]})
		r.chunks++
		r.sentPages += k
	}
}

func (m *Machine) startTransfer(r *req) {
	m.sendComputed(r)
	np := m.promptPages(r)
	// The binding names what the pages hold (the hashes recorded when they
	// were computed), so decode can tell KV computed for another request.
	hashes := make([]kvxfer.PageHash, np)
	for i, p := range r.pages[:np] {
		hashes[i] = m.pageHash[p]
	}
	m.emit(SendKVDone{Job: m.pin(r), Peer: r.Peer, Pages: r.pages[:np], Done: kvxfer.KVDone{RoomGen: r.roomGen(),
		NChunks: r.chunks, NPages: uint32(np), NTokens: uint32(len(r.InputIDs)),
		Binding:    kvxfer.BindKVConstrained(r.roomGen(), uint32(len(r.InputIDs)), hashes, r.ConstraintDigest),
		FirstToken: r.first.Token, FirstLogprob: r.first.Logprob, CachedTokens: uint32(r.cachedTokens),
		First: firstTokens(r)}})
	m.record(r, "KV sent: %d pages in %d chunks%s", np, r.chunks, heldByDecode(r.peerCached))
	m.resolveOptimistic(r, OptimisticSent)
	m.setStage(r, StageTransferring, m.cfg.TransferTimeout, outcome.TimeoutTransfer)
}

// firstTokens is KV_DONE's tail for prefill request r: every choice's first
// token with its top logprobs, for a request with N > 1 or top logprobs
// (nil otherwise, so a plain request's frame is as before the tail
// existed).
func firstTokens(r *req) []kvxfer.FirstToken {
	if r.choices() == 1 && r.Sampling.TopLogprobs == 0 {
		return nil
	}
	out := make([]kvxfer.FirstToken, 0, 1+len(r.first.Forks))
	out = append(out, kvxfer.FirstToken{Token: r.first.Token, Logprob: r.first.Logprob, Top: r.first.Top})
	for _, f := range r.first.Forks {
		out = append(out, kvxfer.FirstToken{Token: f.Token, Logprob: f.Logprob, Top: f.Top})
	}
	return out
}

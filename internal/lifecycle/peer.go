package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

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
	for _, p := range m.pendingInOrder() {
		add(p.peer, p.open.RoomGen)
	}
	slices.Sort(peers)
	for _, p := range peers {
		m.emit(Send{Peer: p, Msg: kvxfer.RoomRenew{Rooms: byPeer[p]}})
	}
}

func (m *Machine) peerUp(p kvxfer.PeerID) {
	m.peersUp[p] = true
	for _, r := range m.sortedLive() {
		if r.Peer == p && !r.peerUp && m.cfg.Role == RoleDecode && !r.Room.IsZero() {
			r.peerUp = true
			r.lastRenew = m.now
			m.record(r, "peer %d up", p)
		}
	}
}

// lostPeer is a dead connection: when it died, the outcome its rooms
// failed with, and why.
type lostPeer struct {
	at      time.Time
	outcome outcome.Outcome
	reason  string
}

// connGone reports an outcome that says the room's connection is dead, so
// the peer cannot be told.
func connGone(o outcome.Outcome) bool { return o == outcome.PeerLost || o == outcome.PeerRefused }

func (m *Machine) peerLost(p kvxfer.PeerID, err error) {
	delete(m.peersUp, p)
	if m.cfg.Role == RoleColocated {
		return
	}
	o := outcome.PeerLost
	reason := fmt.Sprintf("KV connection (peer %d) lost", p)
	switch {
	case errors.Is(err, kvxfer.ErrRefused):
		o, reason = outcome.PeerRefused, fmt.Sprintf("KV connection refused: %v", err)
	case err != nil:
		reason = fmt.Sprintf("KV connection lost: %v", err)
	}
	m.lostPeers[p] = lostPeer{at: m.now, outcome: o, reason: reason}
	for _, r := range m.sortedLive() {
		if r.Peer != p || r.Room.IsZero() { // a request without a room has no peer
			continue
		}
		if m.cfg.Role == RolePrefill && !r.opened {
			continue
		}
		if m.cfg.Role == RoleDecode && r.ackSent {
			continue // the KV is here; the peer no longer matters
		}
		m.finish(r, o, reason, "")
	}
	for _, po := range m.pendingInOrder() { // dropped without a word: the peer is gone
		if po.peer != p {
			continue
		}
		if r := m.heldFor(po); r != nil {
			m.finish(r, o, reason, "") // its ROOM_OPEN was held back (optimistic test hook)
		}
		delete(m.pending, po.open.Room)
	}
}

func (m *Machine) drop(reason string) { m.counters.FramesDropped[reason]++ }

func (m *Machine) message(p kvxfer.PeerID, msg kvxfer.Message) {
	switch x := msg.(type) {
	case kvxfer.RoomRenew:
		for _, rg := range x.Rooms {
			if r, ok := m.rooms[rg.Room]; ok && r.Gen == rg.Gen && r.Peer == p {
				r.lastRenew = m.now
				if m.cfg.Role == RoleDecode && r.stage == StageAwaitingKV && r.xferStarted {
					m.transferProgress(r)
				}
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
		m.counters.PeerAbortTombstones++
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
	case r.Gen != rg.Gen && m.mut != mutNoGenCheck:
		m.drop("stale_gen")
		return nil
	case r.opened && r.Peer != p:
		m.drop("wrong_peer")
		return nil
	}
	return r
}

package lifecycle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// stageSetup drives request q of a fresh harness into one stage.
type stageSetup struct {
	role  Role
	stage Stage
	// promptLen of the request under test.
	promptLen int
	drive     func(h *harness, q Request)
	// deadline and outcome of the stage's own deadline (hard cap if none).
	deadline time.Duration
	timeout  outcome.Outcome
	// shared: an end on this side must be told to the peer.
	shared bool
	// leased: the peer must renew the room.
	leased bool
}

func next1(string) int32 { return 5 }

func transferAll(h *harness, q Request) {
	h.t.Helper()
	pages := h.m.reqs[q.RID].pages
	np := (len(q.InputIDs) + 3) / 4
	for i := 0; i < np; i++ {
		data := []byte(fmt.Sprintf("page%04d", i))
		h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen},
			Seq: uint32(i), FirstPage: uint32(i), NPages: 1, Data: data}})
	}
	sum := h.checksum(pages[:np])
	effs := h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVDone{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen},
		NChunks: uint32(np), NPages: uint32(np), NTokens: uint32(len(q.InputIDs)), Binding: h.binding(q), Checksum: sum,
		FirstToken: 5}})
	v := effectsOf[VerifyKV](effs)
	if len(v) != 1 {
		h.t.Fatalf("want one VerifyKV, got\n%s", describe(effs))
	}
	h.step(KVVerified{RID: v[0].RID, Gen: v[0].Gen, Checksum: h.checksum(v[0].Pages)})
}

// preemptDecode brings decode request q to Preempted: an older filler takes
// almost all pages, both decode, and when q needs a page the filler has
// taken the last one.
func preemptDecode(h *harness, q Request) {
	h.t.Helper()
	filler := request(99, 44, 20)
	h.step(PeerUp{Peer: 7})
	for _, r := range []Request{filler, q} {
		h.step(Arrive{Req: r})
		transferAll(h, r)
	}
	runUntil(h, q.RID, StagePreempted)
}

// runUntil runs batches until rid reaches stage.
func runUntil(h *harness, rid string, stage Stage) {
	h.t.Helper()
	for range 20 {
		if r := h.m.reqs[rid]; r != nil && r.stage == stage {
			return
		}
		h.step(Schedule{})
		if h.batch != nil {
			if r := h.m.reqs[rid]; r != nil && r.stage == stage {
				return
			}
			h.done(next1)
		}
	}
	h.t.Fatalf("%s never reached %s", rid, stage)
}

var stageSetups = []stageSetup{
	{role: RolePrefill, stage: StageBootstrap, promptLen: 8, deadline: 10 * time.Second, timeout: outcome.TimeoutBootstrap,
		drive: func(h *harness, q Request) { h.step(Arrive{Req: q}) }},
	{role: RolePrefill, stage: StageWaiting, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
		}},
	{role: RolePrefill, stage: StagePrefilling, promptLen: 20, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
			h.step(Schedule{})
		}},
	{role: RolePrefill, stage: StageParked, promptLen: 8, deadline: 30 * time.Second, timeout: outcome.TimeoutKVHold, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
			h.step(Schedule{})
			h.done(next1)
		}},
	{role: RolePrefill, stage: StageTransferring, promptLen: 8, deadline: 30 * time.Second, timeout: outcome.TimeoutTransfer, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, NTokens: uint32(len(q.InputIDs))}})
			h.step(Schedule{})
			h.done(next1)
		}},
	{role: RoleDecode, stage: StagePrealloc, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			filler := request(99, 56, 8) // takes 15 of 16 pages
			h.step(Arrive{Req: filler})
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
		}},
	{role: RoleDecode, stage: StageAwaitingKV, promptLen: 8, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
		}},
	// Once KV flows, the transfer deadline runs from the last progress (a
	// chunk, or prefill renewing the room): renewed every second, the
	// request lives until its hard cap. TestTransferDeadlineMeasuresProgress
	// has the transfer deadline itself.
	{role: RoleDecode, stage: StageAwaitingKV, promptLen: 8, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest, shared: true, leased: true,
		drive: func(h *harness, q Request) {
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, NPages: 1, Data: make([]byte, testPageBytes)}})
		}},
	{role: RoleDecode, stage: StageQueued, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue,
		drive: func(h *harness, q Request) {
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
			transferAll(h, q)
		}},
	{role: RoleDecode, stage: StageDecoding, promptLen: 8, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest,
		drive: func(h *harness, q Request) {
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
			transferAll(h, q)
			h.step(Schedule{})
		}},
	{role: RoleDecode, stage: StagePreempted, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue,
		drive: preemptDecode},
	{role: RoleDecode, stage: StagePrefilling, promptLen: 8, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest,
		drive: func(h *harness, q Request) {
			preemptDecode(h, q)
			h.step(AbortRequest{RID: "r99"}) // the filler leaves; q recomputes its KV
			runUntil(h, q.RID, StagePrefilling)
		}},
	{role: RoleColocated, stage: StagePreempted, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: request(99, 44, 20)})
			runUntil(h, "r99", StageDecoding)
			h.step(Arrive{Req: q})
			runUntil(h, q.RID, StagePreempted)
		}},
	{role: RoleColocated, stage: StageWaiting, promptLen: 8, deadline: 60 * time.Second, timeout: outcome.TimeoutQueue,
		drive: func(h *harness, q Request) { h.step(Arrive{Req: q}) }},
	{role: RoleColocated, stage: StagePrefilling, promptLen: 20, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(Schedule{})
		}},
	{role: RoleColocated, stage: StageDecoding, promptLen: 8, deadline: 600 * time.Second, timeout: outcome.TimeoutRequest,
		drive: func(h *harness, q Request) {
			h.step(Arrive{Req: q})
			h.step(Schedule{})
			h.done(next1)
			h.step(Schedule{})
		}},
}

func (s stageSetup) name() string {
	return fmt.Sprintf("%s/%s/deadline=%s", s.role, s.stage, s.deadline)
}

// setup returns a harness with the request under test in s.stage.
func (s stageSetup) setup(t *testing.T) (*harness, Request) {
	h := newHarness(t, testConfig(s.role), 16)
	q := request(1, s.promptLen, 20)
	s.drive(h, q)
	if got := h.m.reqs[q.RID]; got == nil || got.stage != s.stage {
		t.Fatalf("setup: request not in stage %s:\n%s", s.stage, describe(h.got))
	}
	h.take()
	return h, q
}

// quiesce finishes a running batch and checks nothing is held.
func (h *harness) quiesce() {
	h.t.Helper()
	if h.batch != nil {
		h.done(next1)
	}
	for _, r := range h.m.reqs {
		if r.RID == "r99" {
			h.step(AbortRequest{RID: "r99", Reason: AbortClient})
		}
	}
	if h.alloc.Used() != 0 {
		h.t.Fatalf("%d pages still in use", h.alloc.Used())
	}
	st := h.m.Stats(h.now)
	for s, n := range st.Stages {
		if n != 0 {
			h.t.Fatalf("stage %s gauge %d, want 0", s, n)
		}
	}
	if st.Live != 0 {
		h.t.Fatalf("%d requests still live", st.Live)
	}
}

// renewAll plays the peer: it renews every room the machine holds for peer 7.
func (h *harness) renewAll() {
	var rooms []kvxfer.RoomGen
	for _, r := range h.m.reqs {
		rooms = append(rooms, r.roomGen())
	}
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomRenew{Rooms: rooms}})
}

func TestAbortInEveryStage(t *testing.T) {
	for _, s := range stageSetups {
		t.Run(s.name(), func(t *testing.T) {
			h, q := s.setup(t)
			effs := h.step(AbortRequest{RID: q.RID, Reason: AbortClient})
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.AbortedClient {
				t.Fatalf("want aborted_client, got %+v\n%s", f, describe(effs))
			}
			aborts := sends[kvxfer.Abort](effs)
			if s.shared != (len(aborts) == 1) {
				t.Fatalf("shared=%v but %d ABORTs sent:\n%s", s.shared, len(aborts), describe(effs))
			}
			// Idempotent: a second abort changes nothing and emits nothing.
			if effs := h.step(AbortRequest{RID: q.RID, Reason: AbortClient}); len(effs) != 0 {
				t.Fatalf("second abort emitted:\n%s", describe(effs))
			}
			// Absorbing: a late peer message does not resurrect it.
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVAck{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}}})
			if h.finals[q.RID] != 1 {
				t.Fatalf("finalized %d times", h.finals[q.RID])
			}
			h.quiesce()
		})
	}
}

func TestDeadlineInEveryStage(t *testing.T) {
	for _, s := range stageSetups {
		t.Run(s.name(), func(t *testing.T) {
			h, q := s.setup(t)
			// Just before the deadline the request is alive (the peer keeps
			// renewing its lease)...
			for elapsed := time.Duration(0); elapsed+time.Second < s.deadline; elapsed += time.Second {
				h.renewAll()
				h.advance(time.Second)
				if _, ok := h.finalOf(q.RID); ok {
					t.Fatalf("ended after %s, before its %s deadline: %+v", elapsed+time.Second, s.deadline, h.outcomes[q.RID])
				}
			}
			// ...and at it, it ends with the stage's timeout.
			h.renewAll()
			h.advance(time.Second)
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != s.timeout {
				t.Fatalf("want %s at the deadline, got %+v", s.timeout, f)
			}
			h.quiesce()
		})
	}
}

func TestLeaseExpiryInEveryLeasedStage(t *testing.T) {
	for _, s := range stageSetups {
		if !s.leased {
			continue
		}
		t.Run(s.name(), func(t *testing.T) {
			h, q := s.setup(t)
			lease := h.m.cfg.Lease()
			h.advance(lease)
			if _, ok := h.finalOf(q.RID); ok {
				t.Fatalf("ended at exactly one lease")
			}
			effs := h.advance(time.Millisecond)
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.LeaseExpired {
				t.Fatalf("want lease_expired just after one lease, got %+v\n%s", f, describe(effs))
			}
			told := 0
			for _, a := range sends[kvxfer.Abort](effs) {
				if a.Room == q.Room {
					told++
				}
			}
			if told != 1 {
				t.Fatalf("the peer was not told:\n%s", describe(effs))
			}
			h.quiesce()
		})
	}
}

// TestPeerLostInEveryStage: a lost connection fails every room on it that
// still needs the peer, with peer_lost, or with peer_refused when the
// transport says the connection's handshake was refused (the error wraps
// kvxfer.ErrRefused); the dead peer is never sent an ABORT.
func TestPeerLostInEveryStage(t *testing.T) {
	losses := []struct {
		err  error
		want outcome.Outcome
	}{
		{fmt.Errorf("boom"), outcome.PeerLost},
		{fmt.Errorf("kv handshake with p:1 %w: page_size 16 vs 32", kvxfer.ErrRefused), outcome.PeerRefused},
	}
	for _, loss := range losses {
		for _, s := range stageSetups {
			t.Run(loss.want.String()+"/"+s.name(), func(t *testing.T) {
				h, q := s.setup(t)
				effs := h.step(PeerLost{Peer: 7, Err: loss.err})
				f, ok := h.finalOf(q.RID)
				holdsPeer := s.shared
				if holdsPeer {
					if !ok || f.Outcome != loss.want || !contains(f.Err, loss.err.Error()) || f.Cause.Outcome != loss.want {
						t.Fatalf("want %s naming %q, got %+v", loss.want, loss.err, f)
					}
					if len(sends[kvxfer.Abort](effs)) != 0 {
						t.Fatalf("ABORT sent to a lost peer:\n%s", describe(effs))
					}
				} else if ok {
					t.Fatalf("request that no longer needs the peer ended: %+v", f)
				}
				h.step(AbortRequest{RID: q.RID})
				h.quiesce()
			})
		}
	}
}

// TestArrivalOnDeadConnection: a decode request that names a connection
// already gone fails at once as that connection's rooms did: peer_refused
// (with the refusal's reason) after a refused handshake, peer_lost after
// any other loss.
func TestArrivalOnDeadConnection(t *testing.T) {
	refused := fmt.Errorf("kv handshake with p:1 %w: protocol version 2 vs 3", kvxfer.ErrRefused)
	for _, tc := range []struct {
		err  error
		want outcome.Outcome
		msg  string
	}{
		{refused, outcome.PeerRefused, "protocol version 2 vs 3"},
		{fmt.Errorf("kv peer p:1 silent for 3s"), outcome.PeerLost, "lost before the request arrived"},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			h := newHarness(t, testConfig(RoleDecode), 16)
			h.step(PeerLost{Peer: 7, Err: tc.err})
			q := request(1, 8, 4)
			effs := h.step(Arrive{Req: q})
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != tc.want || !contains(f.Err, tc.msg) || f.Cause.Outcome != tc.want {
				t.Fatalf("want %s naming %q, got %+v", tc.want, tc.msg, f)
			}
			if len(sends[kvxfer.RoomOpen](effs)) != 0 || h.alloc.Used() != 0 {
				t.Fatalf("a room was opened on a dead connection:\n%s", describe(effs))
			}
		})
	}
}

func TestPeerAbortInEveryStage(t *testing.T) {
	for _, s := range stageSetups {
		t.Run(s.name(), func(t *testing.T) {
			h, q := s.setup(t)
			effs := h.step(PeerMessage{Peer: 7, Msg: kvxfer.Abort{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, Cause: outcome.Cause{Detail: "decode gone"}}})
			if len(sends[kvxfer.AbortAck](effs)) != 1 {
				t.Fatalf("no ABORT_ACK:\n%s", describe(effs))
			}
			if len(sends[kvxfer.Abort](effs)) != 0 {
				t.Fatalf("peer's ABORT echoed back:\n%s", describe(effs))
			}
			f, ok := h.finalOf(q.RID)
			switch {
			case s.role == RoleDecode && !s.shared:
				if ok {
					t.Fatalf("ABORT after the KV was handed over ended the request: %+v", f)
				}
				h.step(AbortRequest{RID: q.RID})
			case s.role == RoleColocated:
				if ok {
					t.Fatalf("colocated request ended by a room message: %+v", f)
				}
				h.step(AbortRequest{RID: q.RID})
			default:
				if !ok || f.Outcome != outcome.AbortedPeer {
					t.Fatalf("want aborted_peer, got %+v", f)
				}
			}
			h.quiesce()
		})
	}
}

// TestAbortBeforeArrival: an abort for a room nobody registered is kept as a
// tombstone, so the late request fails at once (PD-REFERENCE §9.3).
func TestAbortBeforeArrival(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		t.Run(role.String(), func(t *testing.T) {
			h := newHarness(t, testConfig(role), 16)
			q := request(1, 8, 4)
			h.step(AbortRequest{RID: q.RID, Room: q.Room, Gen: 1, Reason: AbortClient})
			effs := h.step(Arrive{Req: q})
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.AbortedClient {
				t.Fatalf("late arrival not failed at once: %+v\n%s", f, describe(effs))
			}
			if role == RoleDecode && len(sends[kvxfer.RoomOpen](effs)) != 0 {
				t.Fatalf("decode opened a room for an aborted request")
			}
			// A retry (gen 2) is not covered by the gen-1 tombstone.
			q2 := q
			q2.RID, q2.Gen = "r1-retry", 2
			h.step(Arrive{Req: q2})
			if h.m.reqs[q2.RID] == nil {
				t.Fatalf("retry with gen 2 was refused: %+v", h.outcomes[q2.RID])
			}
			h.step(AbortRequest{RID: q2.RID})
			// The tombstone expires.
			h.advance(h.m.cfg.TombstoneTTL + time.Second)
			if n := h.m.Stats(h.now).Tombstones; n != 0 {
				t.Fatalf("%d tombstones after their TTL", n)
			}
			h.quiesce()
		})
	}
}

// TestPeerAbortTombstonesCounted (issue 18): a peer's ABORT for a room
// this side does not hold (it ended here first, or never came) leaves a
// tombstone, and is counted, so the tombstones an operator sees are
// explained; an ABORT for a room it holds ends that room and is not.
func TestPeerAbortTombstonesCounted(t *testing.T) {
	h := newHarness(t, testConfig(RoleDecode), 16)
	h.step(PeerUp{Peer: 7})
	live, late := request(1, 8, 4), request(2, 8, 4)
	h.step(Arrive{Req: live})
	abort := func(q Request, gen uint32) {
		h.step(PeerMessage{Peer: 7, Msg: kvxfer.Abort{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: gen},
			Cause: outcome.Cause{Outcome: outcome.LeaseExpired, Role: "prefill", Detail: "late"}}})
	}
	abort(late, 1) // a room decode never held
	abort(live, 2) // another gen of a room it holds
	st := h.m.Stats(h.now)
	if st.Counters.PeerAbortTombstones != 2 || st.Tombstones != 2 || h.m.reqs[live.RID] == nil {
		t.Fatalf("tombstones %d, counted %d, live request kept %v; want 2, 2, true",
			st.Tombstones, st.Counters.PeerAbortTombstones, h.m.reqs[live.RID] != nil)
	}
	abort(live, 1) // the room it holds: that room ends
	if f, _ := h.finalOf(live.RID); f.Outcome != outcome.AbortedPeer {
		t.Fatalf("live room: %+v", f)
	}
	if n := h.m.Stats(h.now).Counters.PeerAbortTombstones; n != 2 {
		t.Fatalf("the ABORT of a held room counted as a peer-abort tombstone (%d)", n)
	}
	// The tombstone does its job: the late room's request fails at once,
	// with prefill's cause.
	h.step(Arrive{Req: late})
	if f, _ := h.finalOf(late.RID); f.Outcome != outcome.AbortedPeer || f.Cause.Outcome != outcome.LeaseExpired {
		t.Fatalf("late arrival: %+v", f)
	}
	h.quiesce()
}

// TestLateRoomOpenAfterPrefillFailed: decode's ROOM_OPEN for a room prefill
// already failed is answered with ABORT at once (PD-REFERENCE §9.4, §9.7).
func TestLateRoomOpenAfterPrefillFailed(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 8, 4)
	h.step(Arrive{Req: q})
	h.advance(11 * time.Second) // bootstrap timeout
	if f, _ := h.finalOf(q.RID); f.Outcome != outcome.TimeoutBootstrap {
		t.Fatalf("got %+v", f)
	}
	effs := h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	a := sends[kvxfer.Abort](effs)
	if len(a) != 1 || a[0].Room != q.Room {
		t.Fatalf("want ABORT for the late ROOM_OPEN, got\n%s", describe(effs))
	}
	if n := h.m.Stats(h.now).PendingOpens; n != 0 {
		t.Fatalf("late ROOM_OPEN left %d pending opens", n)
	}
	h.quiesce()
}

// TestPendingOpenExpires: a ROOM_OPEN whose request never arrives is dropped
// after the bootstrap timeout and decode is told.
func TestPendingOpenExpires(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 8, 4)
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	if n := h.m.Stats(h.now).PendingOpens; n != 1 {
		t.Fatalf("pending opens %d", n)
	}
	h.advance(9 * time.Second)
	effs := h.advance(time.Second)
	if a := sends[kvxfer.Abort](effs); len(a) != 1 {
		t.Fatalf("want ABORT on expiry:\n%s", describe(effs))
	}
	if n := h.m.Stats(h.now).PendingOpens; n != 0 {
		t.Fatalf("pending opens %d after expiry", n)
	}
}

// TestPrefillRejectTellsDecode: a request prefill rejects leaves a tombstone,
// so decode's ROOM_OPEN gets prefill's reason at once (scenario 1).
func TestPrefillRejectTellsDecode(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 70, 4) // longer than the 64-token context
	h.step(Arrive{Req: q})
	if f, _ := h.finalOf(q.RID); f.Outcome != outcome.RejectedInvalid {
		t.Fatalf("got %+v", f)
	}
	effs := h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	a := sends[kvxfer.Abort](effs)
	if len(a) != 1 {
		t.Fatalf("want ABORT:\n%s", describe(effs))
	}
	if want := "context length"; !contains(a[0].Reason(), want) {
		t.Fatalf("reason %q does not carry prefill's %q", a[0].Reason(), want)
	}
	if c := a[0].Cause; c.Outcome != outcome.RejectedInvalid || c.Role != "prefill" {
		t.Fatalf("cause %+v, want prefill's rejected_invalid", c)
	}
}

// TestIdentityMismatch: both legs must carry the same request (scenario 9).
func TestIdentityMismatch(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 8, 4)
	h.step(Arrive{Req: q})
	open := roomOpen(q)
	open.RID = "rewritten"
	effs := h.step(PeerMessage{Peer: 7, Msg: open})
	f, _ := h.finalOf(q.RID)
	if f.Outcome != outcome.FailedIdentity || !contains(f.Err, "identity mismatch") {
		t.Fatalf("got %+v", f)
	}
	if len(sends[kvxfer.Abort](effs)) != 1 {
		t.Fatalf("decode not told:\n%s", describe(effs))
	}
}

// TestChecksumMismatch: corrupted KV fails the request instead of decoding it.
func TestChecksumMismatch(t *testing.T) {
	h := newHarness(t, testConfig(RoleDecode), 16)
	q := request(1, 8, 4)
	h.step(Arrive{Req: q})
	pages := h.m.reqs[q.RID].pages
	for i := 0; i < 2; i++ {
		h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, Seq: uint32(i), FirstPage: uint32(i), NPages: 1, Data: []byte("abcdefgh")}})
	}
	good := h.checksum(pages[:2])
	effs := h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVDone{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, NChunks: 2, NPages: 2, NTokens: 8,
		Binding: h.binding(q), Checksum: good ^ 1}})
	v := effectsOf[VerifyKV](effs)
	effs = h.step(KVVerified{RID: v[0].RID, Gen: 1, Checksum: h.checksum(v[0].Pages)})
	f, _ := h.finalOf(q.RID)
	if f.Outcome != outcome.FailedTransfer || !contains(f.Err, "checksum") {
		t.Fatalf("got %+v", f)
	}
	if len(effectsOf[Emit](effs)) != 0 {
		t.Fatalf("tokens emitted from corrupted KV")
	}
	if len(sends[kvxfer.Abort](effs)) != 1 {
		t.Fatalf("prefill not told")
	}
	h.quiesce()
}

// TestStaleFramesAreDropped: frames of an old gen, of another peer or of a
// finished room never reach pages (invariant 3).
func TestStaleFramesAreDropped(t *testing.T) {
	h := newHarness(t, testConfig(RoleDecode), 16)
	q := request(1, 8, 4)
	h.step(Arrive{Req: q})
	chunk := func(peer kvxfer.PeerID, gen uint32) []Effect {
		return h.step(PeerMessage{Peer: peer, Msg: kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: gen}, NPages: 1, Data: make([]byte, testPageBytes)}})
	}
	if len(effectsOf[WriteKV](chunk(7, 2))) != 0 || len(effectsOf[WriteKV](chunk(8, 1))) != 0 {
		t.Fatalf("stale or foreign frame written")
	}
	h.step(AbortRequest{RID: q.RID})
	if len(effectsOf[WriteKV](chunk(7, 1))) != 0 {
		t.Fatalf("frame for an aborted room written")
	}
	d := h.m.Stats(h.now).Counters.FramesDropped
	if d["stale_gen"] != 1 || d["wrong_peer"] != 1 || d["unknown_room"] != 1 {
		t.Fatalf("dropped counters %v", d)
	}
}

// TestAbortMidBatchDefersFree: pages written by the running forward are freed
// only when it finishes, never under it.
func TestAbortMidBatchDefersFree(t *testing.T) {
	h := newHarness(t, testConfig(RoleColocated), 16)
	q := request(1, 8, 4)
	h.step(Arrive{Req: q})
	h.step(Schedule{})
	used := h.alloc.Used()
	h.step(AbortRequest{RID: q.RID})
	if h.alloc.Used() != used {
		t.Fatalf("pages freed under the running forward")
	}
	q2 := request(2, 8, 4)
	h.step(Arrive{Req: q2})
	h.step(Schedule{}) // busy: no second batch
	h.done(next1)
	if h.alloc.Used() != 0 {
		t.Fatalf("pages not freed after the batch: %d", h.alloc.Used())
	}
	h.step(AbortRequest{RID: q2.RID})
	h.quiesce()
}

func contains(s, sub string) bool { return len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

var _ = kvcache.PageID(0)

// TestPrefillUnparksForReadyRequest: prefill holds KV for A, whose decode has
// no pages yet (parked), and cannot admit B, whose decode has pages (ready)
// — the cross-worker wait that only a deadline would break. Prefill drops
// A's KV, computes B, and recomputes A once its decode is ready.
func TestPrefillUnparksForReadyRequest(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 12) // 48 tokens: one 40-token prompt
	a, b := request(1, 40, 4), request(2, 40, 4)
	for _, q := range []Request{a, b} {
		h.step(Arrive{Req: q})
		h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	}
	runUntil(h, a.RID, StageParked)
	h.step(Schedule{})
	if h.m.reqs[a.RID].stage != StageParked || h.m.reqs[b.RID].stage != StageWaiting {
		t.Fatalf("setup: A %s, B %s", h.m.reqs[a.RID].stage, h.m.reqs[b.RID].stage)
	}
	// B's decode has pages; A's still does not.
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: b.Room, Gen: 1}, NTokens: 40}})
	h.step(Schedule{})
	if h.m.reqs[a.RID].stage != StageWaiting || h.m.reqs[b.RID].stage != StagePrefilling {
		t.Fatalf("A %s, B %s: want A's KV dropped and B computing", h.m.reqs[a.RID].stage, h.m.reqs[b.RID].stage)
	}
	runUntil(h, b.RID, StageTransferring)
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVAck{RoomGen: kvxfer.RoomGen{Room: b.Room, Gen: 1}}})
	if f, _ := h.finalOf(b.RID); f.Outcome != outcome.OK {
		t.Fatalf("B: %+v", f)
	}
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: a.Room, Gen: 1}, NTokens: 40}})
	h.take()
	runUntil(h, a.RID, StageTransferring)
	if effs := h.take(); len(effectsOf[SendKVDone](effs)) != 1 {
		t.Fatalf("A was not recomputed and sent:\n%s", describe(effs))
	}
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVAck{RoomGen: kvxfer.RoomGen{Room: a.Room, Gen: 1}}})
	if f, _ := h.finalOf(a.RID); f.Outcome != outcome.OK {
		t.Fatalf("A: %+v", f)
	}
	if h.m.Stats(h.now).Counters.Preemptions != 1 {
		t.Fatalf("preemptions %d", h.m.Stats(h.now).Counters.Preemptions)
	}
	h.quiesce()
}

// TestQueueCompactedWithoutTicks: finished requests leave the queue even if
// the shell never ticks, so the scheduling scans stay O(live requests).
func TestQueueCompactedWithoutTicks(t *testing.T) {
	cfg := DefaultConfig(RoleColocated)
	cfg.PageBytes, cfg.VocabSize = 1, 1000
	m, err := New(cfg, kvcache.NewAllocator(1<<12))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	out := []model.SeqOutput{{Token: 1}}
	for i := range 1000 {
		m.Step(now, Arrive{Req: Request{RID: fmt.Sprint(i), InputIDs: make([]int32, 8), MaxTokens: 2, IgnoreEOS: true,
			Sampling: model.SamplingParams{TopP: 1}}})
		for m.Live() > 0 {
			m.Step(now, Schedule{})
			m.Ready()
			m.Step(now, BatchDone{Out: out})
			m.Ready()
		}
		if len(m.queue) > 4 {
			t.Fatalf("after %d finished requests the queue holds %d entries", i+1, len(m.queue))
		}
	}
}

// TestCancelBatchWhenAllItsRequestsEnded: the running forward is cancelled
// (CancelBatch, once) only when every request in it has ended, and its
// pages are freed when BatchDone comes back, even with an error.
func TestCancelBatchWhenAllItsRequestsEnded(t *testing.T) {
	h := newHarness(t, testConfig(RoleColocated), 64)
	h.step(Arrive{Req: request(1, 6, 4)})
	h.step(Arrive{Req: request(2, 6, 4)})
	h.step(Schedule{})
	if h.batch == nil || len(h.batch.Seqs) != 2 {
		t.Fatalf("want one batch of both requests, got %+v", h.batch)
	}
	h.take()
	if effs := h.step(AbortRequest{RID: "r1", Reason: AbortClient}); len(effectsOf[CancelBatch](effs)) != 0 {
		t.Fatalf("CancelBatch with a request of the batch still running: %s", describe(effs))
	}
	effs := h.step(AbortRequest{RID: "r2", Reason: AbortClient})
	if n := len(effectsOf[CancelBatch](effs)); n != 1 {
		t.Fatalf("%d CancelBatch after the last request of the batch ended, want 1: %s", n, describe(effs))
	}
	if h.alloc.Used() == 0 {
		t.Fatal("pages freed while the forward may still write them")
	}
	h.batch = nil
	h.step(BatchDone{Err: context.Canceled})
	if h.alloc.Used() != 0 || h.m.Live() != 0 {
		t.Fatalf("after the cancelled forward: %d pages used, %d live", h.alloc.Used(), h.m.Live())
	}
	for _, rid := range []string{"r1", "r2"} {
		if f, _ := h.finalOf(rid); f.Outcome != outcome.AbortedClient {
			t.Errorf("%s ended %s, want aborted_client", rid, f.Outcome)
		}
	}
	// The next batch is not cancelled on its own.
	h.step(Arrive{Req: request(3, 6, 2)})
	if effs := h.step(Schedule{}); len(effectsOf[CancelBatch](effs)) != 0 || h.batch == nil {
		t.Fatalf("next batch: %s", describe(effs))
	}
}

// TestCauseTravels: a request's first failure reaches whoever reads either
// side's answer. A peer's ABORT naming a cause, and the router's abort of
// the other leg naming one, end the request with that cause; an end on this
// side tells the peer its own cause (outcome, role, stage).
func TestCauseTravels(t *testing.T) {
	root := outcome.Cause{Outcome: outcome.FailedTransfer, Role: "decode", Stage: "awaiting_kv", Detail: "KV checksum mismatch"}
	for _, s := range stageSetups {
		t.Run(s.name()+"/peer_abort", func(t *testing.T) {
			h, q := s.setup(t)
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.Abort{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, Cause: root}})
			if f, ok := h.finalOf(q.RID); ok && f.Outcome == outcome.AbortedPeer && f.Cause != root {
				t.Fatalf("cause %+v, want the peer's %+v", f.Cause, root)
			}
			h.step(AbortRequest{RID: q.RID}) // a request that no longer needs its peer goes on
			h.quiesce()
		})
		t.Run(s.name()+"/router_abort", func(t *testing.T) {
			h, q := s.setup(t)
			effs := h.step(AbortRequest{RID: q.RID, Reason: AbortPeerLeg, Cause: root})
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.AbortedPeer || f.Cause != root {
				t.Fatalf("ended %+v, want aborted_peer with cause %+v", f, root)
			}
			if s.shared {
				a := sends[kvxfer.Abort](effs)
				if len(a) != 1 || a[0].Cause != root {
					t.Fatalf("peer not told the root cause:\n%s", describe(effs))
				}
			}
			h.quiesce()
		})
		t.Run(s.name()+"/own_failure", func(t *testing.T) {
			h, q := s.setup(t)
			stage := h.m.reqs[q.RID].stage
			effs := h.advance(s.deadline)
			f, ok := h.finalOf(q.RID)
			if !ok {
				t.Fatalf("not ended after its deadline:\n%s", describe(effs))
			}
			want := outcome.Cause{Outcome: f.Outcome, Role: s.role.String(), Stage: stage.String(), Detail: f.Err}
			if f.Cause != want {
				t.Fatalf("cause %+v, want %+v", f.Cause, want)
			}
			if s.shared {
				var told []outcome.Cause
				for _, a := range sends[kvxfer.Abort](effs) {
					if a.Room == q.Room {
						told = append(told, a.Cause)
					}
				}
				if len(told) != 1 || told[0] != want {
					t.Fatalf("peer not told this side's cause %+v:\n%s", want, describe(effs))
				}
			}
			h.quiesce()
		})
	}
}

// TestMinTokensValidated: min_tokens outside [0, max_tokens] is refused at
// arrival, naming the field.
func TestMinTokensValidated(t *testing.T) {
	for _, mt := range []int{-1, 5} {
		h := newHarness(t, testConfig(RoleColocated), 16)
		q := request(1, 8, 4)
		q.MinTokens = mt
		h.step(Arrive{Req: q})
		if f, _ := h.finalOf(q.RID); f.Outcome != outcome.RejectedInvalid || !contains(f.Err, "min_tokens") {
			t.Fatalf("min_tokens %d: got %+v", mt, f)
		}
	}
}

// TestRetryOpenBeforeItsPrefillLeg: a retry's ROOM_OPEN (gen 2) that
// reaches prefill while the room is still at gen 1 — decode got its leg
// first — is held for the gen-2 leg, which then supersedes gen 1 and binds
// it, instead of being refused as stale (which failed the retry).
func TestRetryOpenBeforeItsPrefillLeg(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q1 := request(1, 8, 4)
	h.step(Arrive{Req: q1})
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(q1)})
	q2 := q1
	q2.RID, q2.Gen = "r1-retry", 2
	effs := h.step(PeerMessage{Peer: 7, Msg: roomOpen(q2)})
	if a := sends[kvxfer.Abort](effs); len(a) != 0 {
		t.Fatalf("gen 2's ROOM_OPEN refused while gen 1 holds the room:\n%s", describe(effs))
	}
	if n := h.m.Stats(h.now).PendingOpens; n != 1 {
		t.Fatalf("pending opens %d, want gen 2's", n)
	}
	h.step(Arrive{Req: q2})
	if f, ok := h.finalOf(q1.RID); !ok || f.Outcome != outcome.AbortedPeer {
		t.Fatalf("gen 1: %+v (final %v), want aborted_peer (superseded)", f, ok)
	}
	if n := h.m.Stats(h.now).PendingOpens; n != 0 {
		t.Fatalf("pending opens %d after gen 2 arrived", n)
	}
	if r := h.m.reqs[q2.RID]; r == nil || !r.opened || r.Gen != 2 {
		t.Fatalf("gen 2 not bound to its open: %+v", r)
	}
	// An older gen than the room's is still refused.
	effs = h.step(PeerMessage{Peer: 7, Msg: roomOpen(q1)})
	if a := sends[kvxfer.Abort](effs); len(a) != 1 {
		t.Fatalf("gen 1's ROOM_OPEN after gen 2 holds the room: want an ABORT:\n%s", describe(effs))
	}
}

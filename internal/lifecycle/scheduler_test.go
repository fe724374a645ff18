package lifecycle

import (
	"testing"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// TestPrefillMaxRunningBoundsBatch: on a prefill worker, MaxRunning
// (--max-running-requests) bounds the sequences of one forward, as it does
// on an SGLang prefill server. Nine bootstrapped requests whose prompts all
// fit the token budget and the pool are computed one forward each with
// MaxRunning 1, three at a time with MaxRunning 3, and all in one with the
// limit above nine; each limit still serves every request.
func TestPrefillMaxRunningBoundsBatch(t *testing.T) {
	for _, tc := range []struct {
		maxRunning int
		batches    []int // sequences per forward, in order
	}{
		{1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{3, []int{3, 3, 3}},
		{16, []int{9}},
	} {
		cfg := testConfig(RolePrefill)
		cfg.MaxRunning = tc.maxRunning
		cfg.MaxPrefillTokens = 64 // nine 4-token prompts fit one forward's budget
		h := newHarness(t, cfg, 64)
		var qs []Request
		for i := range 9 {
			q := request(i+1, 4, 4)
			qs = append(qs, q)
			h.step(Arrive{Req: q})
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}, NTokens: 4}})
		}
		var got []int
		for range 20 {
			h.step(Schedule{})
			if h.batch == nil {
				break
			}
			if n := len(h.batch.Seqs); n > tc.maxRunning {
				t.Fatalf("max running %d: a forward of %d sequences", tc.maxRunning, n)
			}
			got = append(got, len(h.batch.Seqs))
			h.done(next1)
		}
		if len(got) != len(tc.batches) {
			t.Fatalf("max running %d: forwards of %v sequences, want %v", tc.maxRunning, got, tc.batches)
		}
		for i := range got {
			if got[i] != tc.batches[i] {
				t.Fatalf("max running %d: forwards of %v sequences, want %v", tc.maxRunning, got, tc.batches)
			}
		}
		for _, q := range qs {
			h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVAck{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}}})
			if f, ok := h.finalOf(q.RID); !ok || f.Outcome != outcome.OK {
				t.Fatalf("max running %d: %s ended %+v", tc.maxRunning, q.RID, f)
			}
		}
		h.quiesce()
	}
}

// TestPrefillMaxRunningKeepsChunkedPromptsGoing: a prompt longer than the
// token budget is computed in chunks; with MaxRunning 1 it keeps the one
// place in the forward until its last chunk, and the next request starts
// only then (first come, first served), so no prompt holds its pages while
// it waits for a place.
func TestPrefillMaxRunningKeepsChunkedPromptsGoing(t *testing.T) {
	cfg := testConfig(RolePrefill)
	cfg.MaxRunning = 1
	cfg.MaxPrefillTokens = 8
	h := newHarness(t, cfg, 64)
	long, short := request(1, 20, 4), request(2, 4, 4)
	for _, q := range []Request{long, short} {
		h.step(Arrive{Req: q})
		h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	}
	var order []string
	for range 10 {
		h.step(Schedule{})
		if h.batch == nil {
			break
		}
		if len(h.batch.Seqs) != 1 {
			t.Fatalf("a forward of %d sequences with max running 1", len(h.batch.Seqs))
		}
		order = append(order, h.batch.Seqs[0].RID)
		if r := h.m.reqs[short.RID]; r.stage != StageWaiting && h.batch.Seqs[0].RID == long.RID {
			t.Fatalf("%s left waiting (%s) while %s still computes", short.RID, r.stage, long.RID)
		}
		h.done(next1)
	}
	want := []string{"r1", "r1", "r1", "r2"} // 20 tokens in chunks of 8, then the short one
	if len(order) != len(want) {
		t.Fatalf("forwards ran %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("forwards ran %v, want %v", order, want)
		}
	}
	for _, q := range []Request{long, short} {
		if st := h.m.reqs[q.RID].stage; st != StageParked {
			t.Fatalf("%s in %s, want parked", q.RID, st)
		}
		h.step(AbortRequest{RID: q.RID, Reason: AbortClient})
	}
	h.quiesce()
}

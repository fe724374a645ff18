package lifecycle

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// sendKV delivers a complete, internally consistent KV stream for decode
// request q (one chunk per page, KV_DONE with the checksum of the bytes
// sent) whose KV_DONE carries binding b, and answers the checksum if decode
// asks for it. It returns the effects of KV_DONE and of the checksum.
func sendKV(h *harness, q Request, b kvxfer.Binding) []Effect {
	h.t.Helper()
	rg := kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}
	pages := h.m.reqs[q.RID].pages
	np := (len(q.InputIDs) + 3) / 4
	for i := range np {
		h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVChunk{RoomGen: rg, Seq: uint32(i), FirstPage: uint32(i), NPages: 1,
			Data: fmt.Appendf(nil, "page%04d", i)}})
	}
	effs := h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVDone{RoomGen: rg, NChunks: uint32(np), NPages: uint32(np),
		NTokens: uint32(len(q.InputIDs)), Binding: b, Checksum: h.checksum(pages[:np]), FirstToken: 5}})
	for _, v := range effectsOf[VerifyKV](effs) {
		effs = append(effs, h.step(KVVerified{RID: v.RID, Gen: v.Gen, Checksum: h.checksum(v.Pages)})...)
	}
	return effs
}

// TestKVBoundToAnotherRequestFails (issue 18): decode uses KV only if
// KV_DONE binds it to this attempt of this request under this model. A
// stream that is whole and uncorrupted but was computed for another room,
// another gen, another prompt of the same length or by another model fails
// the request with failed_transfer (counted as a wrong_binding frame),
// emits no token and tells prefill; the request's own binding passes.
func TestKVBoundToAnotherRequestFails(t *testing.T) {
	q := request(1, 10, 4)
	bind := func(h *harness, rg kvxfer.RoomGen, fp kvxfer.Fingerprint, ids []int32) kvxfer.Binding {
		return kvxfer.BindKV(rg, uint32(len(ids)), kvxfer.AppendPromptChain(nil, kvxfer.ChainSeed(fp), ids, h.m.Config().PageSize))
	}
	rg := kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}
	other := slices.Clone(q.InputIDs)
	other[9]++ // the last token: only the last page differs
	cases := []struct {
		name string
		b    func(h *harness) kvxfer.Binding
		ok   bool
	}{
		{"its own", func(h *harness) kvxfer.Binding { return h.binding(q) }, true},
		{"another room", func(h *harness) kvxfer.Binding {
			return bind(h, kvxfer.RoomGen{Room: room(2), Gen: 1}, kvxfer.Fingerprint{}, q.InputIDs)
		}, false},
		{"an earlier gen", func(h *harness) kvxfer.Binding {
			return bind(h, kvxfer.RoomGen{Room: q.Room, Gen: 0}, kvxfer.Fingerprint{}, q.InputIDs)
		}, false},
		{"another prompt of the same length", func(h *harness) kvxfer.Binding {
			return bind(h, rg, kvxfer.Fingerprint{}, other)
		}, false},
		{"another model", func(h *harness) kvxfer.Binding {
			return bind(h, rg, kvxfer.Fingerprint{Model: "other"}, q.InputIDs)
		}, false},
		{"none", func(*harness) kvxfer.Binding { return kvxfer.Binding{} }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(RoleDecode), 16)
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
			effs := sendKV(h, q, tc.b(h))
			if tc.ok {
				if r := h.m.reqs[q.RID]; r == nil || r.stage != StageQueued || len(effectsOf[Emit](effs)) != 1 {
					t.Fatalf("the request's own KV was not taken:\n%s", describe(effs))
				}
				return
			}
			f, ended := h.finalOf(q.RID)
			if !ended || f.Outcome != outcome.FailedTransfer || !contains(f.Err, "not this request's") ||
				f.Cause.Outcome != outcome.FailedTransfer || f.Cause.Role != "decode" {
				t.Fatalf("want failed_transfer naming the binding, got %+v", f)
			}
			if n := len(effectsOf[Emit](effs)); n != 0 || len(effectsOf[VerifyKV](effs)) != 0 {
				t.Fatalf("KV of another request was used (%d tokens emitted):\n%s", n, describe(effs))
			}
			if a := sends[kvxfer.Abort](effs); len(a) != 1 || a[0].Cause.Outcome != outcome.FailedTransfer {
				t.Fatalf("prefill not told the root cause:\n%s", describe(effs))
			}
			if d := h.m.Stats(h.now).Counters.FramesDropped["wrong_binding"]; d != 1 {
				t.Fatalf("wrong_binding counted %d times", d)
			}
			if h.alloc.Used() != 0 {
				t.Fatalf("%d pages still used", h.alloc.Used())
			}
		})
	}
}

// TestPrefillBindsWhatItsPagesHold: prefill builds KV_DONE's binding from
// the hash it recorded with each page when it computed it, not from the
// request it now sends the pages for. If its bookkeeping sent one
// request's pages for another (two parked prompts of the same length whose
// pages got swapped), the KV and its checksum arrive intact, and decode
// still refuses it: the binding names the prompt the pages were computed
// for. This drives the machines by hand: the swap breaks the invariants
// the harnesses check after every step.
func TestPrefillBindsWhatItsPagesHold(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p, err := New(testConfig(RolePrefill), kvcache.NewAllocator(16))
	if err != nil {
		t.Fatal(err)
	}
	q1, q2 := request(1, 8, 4), request(2, 8, 4) // one forward computes both (16 tokens)
	q2.InputIDs = slices.Clone(q2.InputIDs)
	slices.Reverse(q2.InputIDs)
	for _, q := range []Request{q1, q2} {
		p.Step(now, Arrive{Req: q})
		p.Step(now, PeerMessage{Peer: 7, Msg: roomOpen(q)})
	}
	p.Step(now, Schedule{})
	var b *RunBatch
	for _, e := range p.Ready() {
		if x, ok := e.(RunBatch); ok {
			b = &x
		}
	}
	if b == nil || len(b.Seqs) != 2 {
		t.Fatalf("want one forward of both prompts, got %+v", b)
	}
	p.Step(now, BatchDone{Out: make([]model.SeqOutput, 2)})
	p.Ready()
	r1, r2 := p.reqs[q1.RID], p.reqs[q2.RID]
	if r1.stage != StageParked || r2.stage != StageParked {
		t.Fatalf("stages %s, %s; want both parked", r1.stage, r2.stage)
	}
	r1.pages, r2.pages = r2.pages, r1.pages // the bug
	p.Step(now, PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: q2.Room, Gen: 1}, NTokens: 8}})
	var done *SendKVDone
	for _, e := range p.Ready() {
		if x, ok := e.(SendKVDone); ok {
			done = &x
		}
	}
	if done == nil || !slices.Equal(done.Pages, r2.pages[:2]) {
		t.Fatalf("want KV_DONE over q2's (swapped) pages, got %+v", done)
	}

	// The binding names q1's prompt (what the pages hold) under q2's room.
	pagesHold := kvxfer.BindKV(done.Done.RoomGen, 8, kvxfer.AppendPromptChain(nil, kvxfer.ChainSeed(kvxfer.Fingerprint{}), q1.InputIDs, 4))
	if done.Done.Binding != pagesHold {
		t.Fatalf("binding %s, want %s: built from the prompt the pages were computed for", done.Done.Binding, pagesHold)
	}
	// Decode gets an intact stream (bytes and their checksum) with that
	// binding, and refuses it.
	h := newHarness(t, testConfig(RoleDecode), 16)
	h.step(PeerUp{Peer: 7})
	h.step(Arrive{Req: q2})
	effs := sendKV(h, q2, done.Done.Binding)
	if f, _ := h.finalOf(q2.RID); f.Outcome != outcome.FailedTransfer || len(effectsOf[Emit](effs)) != 0 {
		t.Fatalf("decode used pages computed for another prompt: %+v\n%s", f, describe(effs))
	}
}

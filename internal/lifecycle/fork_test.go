package lifecycle

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// decodeWithChoices brings decode request q (N > 1) through its transfer:
// KV_DONE carries the first tokens first (one per choice), and the forks
// are made. It returns the effects of the verification step.
func decodeWithChoices(h *harness, q Request, first []kvxfer.FirstToken) []Effect {
	h.t.Helper()
	h.step(PeerUp{Peer: q.Peer})
	h.step(Arrive{Req: q})
	return transferChoices(h, q, first)
}

// transferChoices is decodeWithChoices for a request that has arrived.
func transferChoices(h *harness, q Request, first []kvxfer.FirstToken) []Effect {
	h.t.Helper()
	r := h.m.reqs[q.RID]
	if r == nil || r.stage != StageAwaitingKV {
		h.t.Fatalf("decode request not awaiting KV: %+v", r)
	}
	np := h.m.promptPages(r)
	rg := kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}
	for i := range np {
		h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVChunk{RoomGen: rg, Seq: uint32(i), FirstPage: uint32(i), NPages: 1,
			Data: fmt.Appendf(nil, "page%04d", i)}})
	}
	done := kvxfer.KVDone{RoomGen: rg, NChunks: uint32(np), NPages: uint32(np), NTokens: uint32(len(q.InputIDs)),
		Binding: h.binding(q), Checksum: h.checksum(r.pages[:np]), FirstToken: first[0].Token, FirstLogprob: first[0].Logprob,
		First: first}
	effs := h.step(PeerMessage{Peer: q.Peer, Msg: done})
	v := effectsOf[VerifyKV](effs)
	if len(v) != 1 {
		h.t.Fatalf("want one VerifyKV, got\n%s", describe(effs))
	}
	return h.step(KVVerified{RID: v[0].RID, Gen: v[0].Gen, Checksum: h.checksum(v[0].Pages)})
}

// choiceTokens collects the tokens of each choice in effs, and the finish
// reason of each choice that ended alone (Emit.Finish).
func choiceTokens(effs []Effect) (map[int][]int32, map[int]string) {
	toks, fin := map[int][]int32{}, map[int]string{}
	for _, e := range effectsOf[Emit](effs) {
		for _, t := range e.Tokens {
			toks[e.Choice] = append(toks[e.Choice], t.Token)
		}
		if e.Finish != "" {
			fin[e.Choice] = e.Finish
		}
	}
	return toks, fin
}

func TestDecodeForksChoices(t *testing.T) {
	for _, promptLen := range []int{10, 12} { // a partial last page, and none
		t.Run(fmt.Sprintf("prompt=%d", promptLen), func(t *testing.T) {
			h := newHarness(t, testConfig(RoleDecode), 32)
			q := request(1, promptLen, 3)
			q.N, q.IgnoreEOS = 3, true
			q.Sampling.TopLogprobs = 1
			top := func(id int32) []model.TokenLogprob { return []model.TokenLogprob{{ID: id, Logprob: -0.1}} }
			first := []kvxfer.FirstToken{{Token: 5, Logprob: -1, Top: top(5)}, {Token: 6, Logprob: -2, Top: top(6)},
				{Token: 7, Logprob: -3, Top: top(7)}}
			h.step(PeerUp{Peer: q.Peer})
			h.step(Arrive{Req: q})
			r := h.m.reqs[q.RID]
			if want := h.m.pagesFor(promptLen+1) + 2; len(r.pages)+len(r.forkPages) != want || len(r.forkPages) != 2 {
				t.Fatalf("admission took %d pages and reserved %d for choices, want %d in all with 2 reserved",
					len(r.pages), len(r.forkPages), want)
			}
			effs := transferChoices(h, q, first)
			toks, _ := choiceTokens(effs)
			for i, f := range first {
				if !slices.Equal(toks[i], []int32{f.Token}) {
					t.Fatalf("choice %d's first token: %v, want %d", i, toks[i], f.Token)
				}
			}
			for _, e := range effectsOf[Emit](effs) {
				if len(e.Tokens) == 1 && len(e.Tokens[0].Top) != 1 {
					t.Fatalf("choice %d's first token lost its top logprobs: %+v", e.Choice, e.Tokens[0])
				}
			}
			copies := effectsOf[CopyKV](effs)
			full := promptLen / 4
			if partial := promptLen%4 != 0; partial != (len(copies) == 2) {
				t.Fatalf("prompt of %d tokens: %d page copies\n%s", promptLen, len(copies), describe(effs))
			}
			head := h.m.reqs[q.RID]
			g := head.group
			if g == nil || len(g.members) != 3 || g.live != 3 {
				t.Fatalf("no group of 3: %+v", g)
			}
			for _, c := range copies {
				if c.Src != head.pages[full] {
					t.Fatalf("copy from page %d, want the head's partial page %d", c.Src, head.pages[full])
				}
			}
			for i, c := range g.members[1:] {
				if !slices.Equal(c.pages[:full], head.pages[:full]) || c.pages[full] == head.pages[full] {
					t.Fatalf("choice %d pages %v, head %v: want the full prompt pages shared, its own after", i+1, c.pages, head.pages)
				}
				if c.Sampling.Seed != model.ForkSeed(q.Sampling.Seed, i+1) || c.stage != StageQueued {
					t.Fatalf("choice %d: seed %d stage %s", i+1, c.Sampling.Seed, c.stage)
				}
			}
			for _, p := range head.pages[:full] {
				if h.m.cache.Refs(p) != 3 {
					t.Fatalf("shared prompt page %d has %d references, want 3", p, h.m.cache.Refs(p))
				}
			}
			// Decode to the end: every choice ends with length at 3
			// tokens, each alone, then the request once.
			var all []Effect
			for range 3 {
				h.step(Schedule{})
				if h.batch == nil {
					break
				}
				if n := len(h.batch.Seqs); n != 3 {
					t.Fatalf("a decode step of %d sequences, want the 3 choices", n)
				}
				for _, s := range h.batch.Seqs {
					if s.Input.Sampling.TopLogprobs != 1 || s.Input.Forks != 0 {
						t.Fatalf("choice %d decodes with %+v", s.Choice, s.Input)
					}
				}
				all = append(all, h.done(next1)...)
			}
			toks, fin := choiceTokens(all)
			for c := range 3 {
				if len(toks[c]) != 2 || fin[c] != "length" {
					t.Fatalf("choice %d: %d more tokens, finish %q\n%s", c, len(toks[c]), fin[c], describe(all))
				}
			}
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.OK || f.OutputTokens != 9 || h.finals[q.RID] != 1 {
				t.Fatalf("final %+v (ok %v, %d finals), want one OK with 9 output tokens", f, ok, h.finals[q.RID])
			}
			if st := h.m.Stats(h.now); st.PagesUsed != 0 || st.Live != 0 {
				t.Fatalf("after the end: %d pages used, %d live", st.PagesUsed, st.Live)
			}
		})
	}
}

func TestDecodeChoicesFailTogether(t *testing.T) {
	h := newHarness(t, testConfig(RoleDecode), 32)
	q := request(1, 10, 8)
	q.N, q.IgnoreEOS = 3, true
	decodeWithChoices(h, q, []kvxfer.FirstToken{{Token: 5}, {Token: 6}, {Token: 7}})
	h.step(Schedule{})
	h.done(next1)
	// Choice 1 is stopped by the front end (a stop string): it ends alone.
	effs := h.step(AbortRequest{RID: q.RID, Reason: AbortStop, OneChoice: true, Choice: 1})
	if _, fin := choiceTokens(effs); fin[1] != "stop" || len(effectsOf[Finalize](effs)) != 0 {
		t.Fatalf("stopping choice 1:\n%s", describe(effs))
	}
	h.step(Schedule{})
	if n := len(h.batch.Seqs); n != 2 {
		t.Fatalf("%d sequences decode after choice 1 stopped, want 2", n)
	}
	h.done(next1)
	// The client goes away: the other two end at once, with one Finalize.
	effs = h.step(AbortRequest{RID: q.RID, Reason: AbortClient})
	fins := effectsOf[Finalize](effs)
	if len(fins) != 1 || fins[0].Outcome != outcome.AbortedClient || fins[0].OutputTokens != 2+3+3 {
		t.Fatalf("abort: %s", describe(effs))
	}
	h.quiesce()
	if st := h.m.Stats(h.now); st.PagesUsed != 0 || st.Live != 0 {
		t.Fatalf("after the abort: %d pages used, %d live", st.PagesUsed, st.Live)
	}
}

func TestDecodeChoicesTimeOutTogether(t *testing.T) {
	cfg := testConfig(RoleDecode)
	cfg.MaxRunning = 2 // one choice waits in queued for a slot
	h := newHarness(t, cfg, 32)
	q := request(1, 9, 8)
	q.N, q.IgnoreEOS = 3, true
	decodeWithChoices(h, q, []kvxfer.FirstToken{{Token: 5}, {Token: 6}, {Token: 7}})
	h.step(Schedule{})
	h.done(next1)
	// The third choice never gets a slot: the machine runs no forward, and
	// its queue deadline ends the whole request.
	effs := h.advance(cfg.QueueTimeout + time.Second)
	fins := effectsOf[Finalize](effs)
	if len(fins) != 1 || fins[0].Outcome != outcome.TimeoutQueue {
		t.Fatalf("deadline: %s", describe(effs))
	}
	if st := h.m.Stats(h.now); st.Live != 0 || st.Stages[StageDecoding]+st.Stages[StageQueued] != 0 {
		t.Fatalf("after the deadline: %+v", st.Stages)
	}
}

func TestDecodeRefusesFirstTokensThatDoNotMatch(t *testing.T) {
	h := newHarness(t, testConfig(RoleDecode), 32)
	q := request(1, 10, 4)
	q.N = 3
	effs := decodeWithChoices(h, q, []kvxfer.FirstToken{{Token: 5}, {Token: 6}}) // two for three choices
	f := effectsOf[Finalize](effs)
	if len(f) != 1 || f[0].Outcome != outcome.FailedTransfer {
		t.Fatalf("want failed_transfer:\n%s", describe(effs))
	}
	if st := h.m.Stats(h.now); st.PagesUsed != 0 {
		t.Fatalf("%d pages held after the failure", st.PagesUsed)
	}
}

func TestColocatedForksAndScoresPrompt(t *testing.T) {
	for _, cache := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache=%v", cache), func(t *testing.T) {
			cfg := testConfig(RoleColocated)
			cfg.PrefixCache = cache
			h := newHarness(t, cfg, 40)
			q := request(1, 10, 2)
			q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
			q.N, q.IgnoreEOS, q.ScorePrompt, q.PromptTop = 2, true, true, 1
			h.step(Arrive{Req: q})
			h.step(Schedule{})
			in := h.batch.Seqs[0].Input
			if in.Forks != 2 || len(in.Score) != 10 || in.Score[0] != q.InputIDs[1] || in.Score[9] != -1 || in.ScoreTop != 1 {
				t.Fatalf("prefill input %+v", in)
			}
			h.batch = nil
			out := make([]model.SeqOutput, 1)
			out[0] = model.SeqOutput{Token: 5, Logprob: -1, Forks: []model.SeqOutput{{Token: 6, Logprob: -2}}}
			for j, target := range in.Score {
				if target >= 0 {
					out[0].Scores = append(out[0].Scores, model.PositionLogprobs{Token: model.TokenLogprob{ID: target, Logprob: -float32(j + 1)}, Rank: 1})
				} else {
					out[0].Scores = append(out[0].Scores, model.PositionLogprobs{})
				}
			}
			effs := h.step(BatchDone{Out: out})
			emits := effectsOf[Emit](effs)
			if len(emits) < 3 || emits[0].Prompt == nil {
				t.Fatalf("want the prompt's logprobs first, then each choice's first token:\n%s", describe(effs))
			}
			if p := emits[0].Prompt; len(p) != 10 || !reflect.DeepEqual(p[0], model.PositionLogprobs{}) || p[1].Token.ID != q.InputIDs[1] || p[9].Token.Logprob != -9 {
				t.Fatalf("prompt logprobs %+v", p)
			}
			toks, _ := choiceTokens(effs)
			if !slices.Equal(toks[0], []int32{5}) || !slices.Equal(toks[1], []int32{6}) {
				t.Fatalf("first tokens %v", toks)
			}
			h.step(Schedule{})
			all := h.done(next1)
			f, ok := h.finalOf(q.RID)
			if !ok || f.OutputTokens != 4 || len(f.PromptLogprobs) != 10 {
				t.Fatalf("final %+v:\n%s", f, describe(all))
			}
			if st := h.m.Stats(h.now); st.PagesUsed != 0 {
				t.Fatalf("%d pages held after the end", st.PagesUsed)
			}
		})
	}
}

func TestPromptOnly(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleColocated} {
		t.Run(role.String(), func(t *testing.T) {
			h := newHarness(t, testConfig(role), 16)
			q := request(1, 10, 0)
			q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
			q.ScorePrompt = true
			h.step(Arrive{Req: q})
			if r := h.m.reqs[q.RID]; r == nil || r.stage != StageWaiting {
				t.Fatalf("a prompt-only request waits to be computed: %+v", r)
			}
			h.step(Schedule{})
			if in := h.batch.Seqs[0].Input; in.Sample || len(in.Score) != 10 {
				t.Fatalf("prompt-only input %+v", in)
			}
			effs := h.done(next1)
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.OK || f.FinishReason != "length" || f.OutputTokens != 0 || len(f.PromptLogprobs) != 10 {
				t.Fatalf("final %+v:\n%s", f, describe(effs))
			}
			if len(sends[kvxfer.Abort](effs)) != 0 || h.m.Stats(h.now).Tombstones != 0 {
				t.Fatalf("a prompt-only request has no peer to tell:\n%s", describe(effs))
			}
		})
	}
	// A decode worker, or a prefill request with a room, cannot be prompt-only.
	h := newHarness(t, testConfig(RolePrefill), 16)
	effs := h.step(Arrive{Req: request(2, 10, 0)})
	if f := effectsOf[Finalize](effs); len(f) != 1 || f[0].Outcome != outcome.RejectedInvalid {
		t.Fatalf("prefill prompt-only with a room:\n%s", describe(effs))
	}
	h = newHarness(t, testConfig(RoleDecode), 16)
	effs = h.step(Arrive{Req: request(3, 10, 0)})
	if f := effectsOf[Finalize](effs); len(f) != 1 || f[0].Outcome != outcome.RejectedInvalid {
		t.Fatalf("decode prompt-only:\n%s", describe(effs))
	}
}

func TestPrefillDrawsEveryChoice(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 16)
	q := request(1, 6, 4)
	q.N = 3
	q.Sampling.TopLogprobs = 2
	h.step(Arrive{Req: q})
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}, NTokens: 6}})
	h.step(Schedule{})
	if in := h.batch.Seqs[0].Input; in.Forks != 3 || !in.Sample {
		t.Fatalf("prefill's sampling input %+v", in)
	}
	h.batch = nil
	top := []model.TokenLogprob{{ID: 1, Logprob: -0.5}, {ID: 2, Logprob: -0.7}}
	out := []model.SeqOutput{{Token: 5, Logprob: -1, Top: top,
		Forks: []model.SeqOutput{{Token: 6, Logprob: -2, Top: top}, {Token: 7, Logprob: -3, Top: top}}}}
	effs := h.step(BatchDone{Out: out})
	d := effectsOf[SendKVDone](effs)
	if len(d) != 1 {
		t.Fatalf("no KV_DONE:\n%s", describe(effs))
	}
	first := d[0].Done.First
	if len(first) != 3 || first[0].Token != 5 || first[1].Token != 6 || first[2].Token != 7 || len(first[2].Top) != 2 {
		t.Fatalf("KV_DONE's first tokens %+v", first)
	}
	if _, err := kvxfer.AppendFrame(nil, d[0].Done); err != nil {
		t.Fatalf("KV_DONE does not encode: %v", err)
	}
}

func TestPriorityScheduling(t *testing.T) {
	cfg := testConfig(RoleColocated)
	cfg.PriorityScheduling = true
	cfg.MaxRunning = 1
	cfg.MaxPrefillTokens = 4
	h := newHarness(t, cfg, 40)
	var qs []Request
	for i, prio := range []int{5, 1, 3} {
		q := request(i+1, 4, 1)
		q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
		q.Priority = prio
		qs = append(qs, q)
		h.step(Arrive{Req: q})
	}
	var order []string
	for range 3 {
		h.step(Schedule{})
		order = append(order, h.batch.Seqs[0].RID)
		h.done(next1)
	}
	if want := []string{qs[1].RID, qs[2].RID, qs[0].RID}; !slices.Equal(order, want) {
		t.Fatalf("computed in order %v, want by priority %v", order, want)
	}
}

// TestForkedChoicesPreempted: under page pressure choices lose their
// pages (the newest admissions first), recompute prompt and output from
// the shared prefix, and still end with the tokens they would have had.
func TestForkedChoicesPreempted(t *testing.T) {
	cfg := testConfig(RoleColocated)
	cfg.PrefixCache = true
	// A: 10-token prompt, 3 choices of 12 tokens (14 pages at the end, 2
	// shared); B: 10 + 12 tokens alone (6 pages). 16 pages hold either,
	// not both.
	want := runChoices(t, cfg, 64)
	got := runChoices(t, cfg, 16)
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Fatalf("%s: with preemptions %v, without %v", k, got[k], w)
		}
	}
}

func runChoices(t *testing.T, cfg Config, pages int) map[string][]int32 {
	t.Helper()
	h := newHarness(t, cfg, pages)
	a, b := request(1, 10, 12), request(2, 10, 12)
	a.N = 3
	for _, q := range []*Request{&a, &b} {
		q.Room, q.Peer, q.PeerAddr, q.IgnoreEOS = kvxfer.Room{}, 0, "", true
		h.step(Arrive{Req: *q})
	}
	var all []Effect
	for range 400 {
		_, doneA := h.finalOf(a.RID)
		_, doneB := h.finalOf(b.RID)
		if doneA && doneB {
			break
		}
		all = append(all, h.step(Schedule{})...)
		if h.batch == nil {
			t.Fatalf("stuck with %d pages: %+v", pages, h.m.Requests(h.now))
		}
		batch := h.batch
		h.batch = nil
		out := make([]model.SeqOutput, len(batch.Seqs))
		for i, s := range batch.Seqs {
			if s.Input.Sample {
				// A token that depends on the request, the choice and the
				// step only, as a real model's does on what the KV holds.
				tok := func(c int) int32 { return int32(1 + (len(s.RID)*5+c*7+s.Input.Step*3)%90) }
				out[i] = model.SeqOutput{Token: tok(s.Choice)}
				for f := 1; f < s.Input.Forks; f++ {
					out[i].Forks = append(out[i].Forks, model.SeqOutput{Token: tok(f)})
				}
			}
		}
		all = append(all, h.step(BatchDone{Out: out})...)
	}
	for _, q := range []Request{a, b} {
		if f, ok := h.finalOf(q.RID); !ok || f.Outcome != outcome.OK {
			t.Fatalf("%s with %d pages: %+v", q.RID, pages, f)
		}
	}
	if pages < 20 && h.m.Stats(h.now).Counters.Preemptions == 0 {
		t.Fatalf("with %d pages nothing was preempted", pages)
	}
	out := map[string][]int32{}
	for _, e := range effectsOf[Emit](all) {
		for _, tk := range e.Tokens {
			out[choiceKey(e.RID, e.Choice)] = append(out[choiceKey(e.RID, e.Choice)], tk.Token)
		}
	}
	if len(out) != 4 {
		t.Fatalf("tokens of %d choices, want 4: %v", len(out), out)
	}
	return out
}

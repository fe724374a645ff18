package lifecycle

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// toyVocab is testConfig's vocabulary (100 tokens, EOS 99) as a grammar
// sees it: a few tokens that spell "yes" and "no" in pieces, capitals for
// the rest, and token 0 special (no bytes).
var toyTokens = map[int32]string{1: "y", 2: "e", 3: "s", 4: "n", 5: "o", 6: "ye", 7: "no", 8: "yes", 9: "x"}

func toyVocab(t testing.TB) *grammar.Vocab {
	t.Helper()
	toks := make([][]byte, 100)
	for i := int32(10); i < 99; i++ {
		toks[i] = []byte{byte('A' + i%26)}
	}
	for id, s := range toyTokens {
		toks[id] = []byte(s)
	}
	toks[99] = []byte{}
	v, err := grammar.NewVocab(toks, []int32{99})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// constrain gives q the constraint of spec over the toy vocabulary.
func constrain(t testing.TB, q *Request, spec grammar.Spec) {
	t.Helper()
	g, err := grammar.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := grammar.NewConstraint(g, toyVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	q.Constraint, q.ConstraintDigest = c, spec.Digest()
}

var yesNo = grammar.Spec{Kind: grammar.KindChoice, Source: `["yes","no"]`}

// maskIDs lists the ids a mask allows.
func maskIDs(mask []uint64) []int32 {
	var ids []int32
	for id := range int32(len(mask) * 64) {
		if mask[id/64]>>(id%64)&1 != 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// text is the toy vocabulary's text of toks, with "<eos>" for 99.
func text(toks []int32) string {
	var b strings.Builder
	for _, t := range toks {
		if t == 99 {
			b.WriteString("<eos>")
			continue
		}
		b.WriteString(toyTokens[t])
	}
	return b.String()
}

// TestConstrainedColocated: every sampling input of a constrained request
// carries the mask of its grammar after the output so far (the mask a
// fresh matcher fed that output gives), each choice of n > 1 its own after
// the first step, and the real sampler's draws from random logits end
// every choice with one of the grammar's texts and EOS, "stop" — with
// ignore_eos and with min_tokens beyond the grammar's end too.
func TestConstrainedColocated(t *testing.T) {
	for _, tc := range []struct {
		n, minTokens int
		ignoreEOS    bool
	}{{1, 0, false}, {1, 3, true}, {3, 0, true}, {4, 2, false}} {
		t.Run(fmt.Sprintf("n=%d,min_tokens=%d,ignore_eos=%v", tc.n, tc.minTokens, tc.ignoreEOS), func(t *testing.T) {
			for seed := range uint64(8) {
				h := newHarness(t, testConfig(RoleColocated), 32)
				q := request(1, 6, 10)
				q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
				q.N, q.MinTokens, q.IgnoreEOS = tc.n, tc.minTokens, tc.ignoreEOS
				q.Sampling = model.SamplingParams{Temperature: 1, TopP: 1, Seed: seed}
				constrain(t, &q, yesNo)
				h.step(Arrive{Req: q})
				outs := runSampled(t, h, q, seed)
				f, ok := h.finalOf(q.RID)
				if !ok || f.Outcome != outcome.OK || f.FinishReason != "stop" {
					t.Fatalf("seed %d: finalize %+v", seed, f)
				}
				if len(outs) != tc.n {
					t.Fatalf("seed %d: %d choices, want %d", seed, len(outs), tc.n)
				}
				for c, toks := range outs {
					if s := text(toks); s != "yes<eos>" && s != "no<eos>" {
						t.Fatalf("seed %d choice %d: %q (%v), want yes or no and EOS", seed, c, s, toks)
					}
				}
			}
		})
	}
}

// runSampled runs h's batches until q ends, drawing every token with
// model.SampleSeq from logits that depend on the request, choice and step,
// and checks each sampling input's mask against a fresh matcher fed the
// choice's output so far. It returns each choice's tokens.
func runSampled(t *testing.T, h *harness, q Request, seed uint64) map[int][]int32 {
	t.Helper()
	outs := map[int][]int32{}
	for range 100 {
		if _, done := h.finalOf(q.RID); done {
			break
		}
		effs := h.step(Schedule{})
		for _, e := range effectsOf[Emit](effs) {
			for _, tk := range e.Tokens {
				outs[e.Choice] = append(outs[e.Choice], tk.Token)
			}
		}
		if h.batch == nil {
			t.Fatalf("stuck: %+v", h.m.Requests(h.now))
		}
		b := h.batch
		h.batch = nil
		out := make([]model.SeqOutput, len(b.Seqs))
		for i, s := range b.Seqs {
			in := s.Input
			if !in.Sample {
				continue
			}
			m := q.Constraint.NewMatcher()
			for _, tok := range outs[s.Choice] {
				if !m.Accept(tok) {
					t.Fatalf("choice %d: its output %v is not the grammar's", s.Choice, outs[s.Choice])
				}
			}
			want := make([]uint64, len(in.Mask))
			m.FillMask(want)
			if in.Mask == nil || !slices.Equal(in.Mask, want) {
				t.Fatalf("choice %d step %d: mask %v, want %v", s.Choice, in.Step, in.Mask, maskIDs(want))
			}
			hs := fnv.New64a()
			fmt.Fprintf(hs, "%s/%d/%d/%d", s.RID, s.Choice, in.Step, seed)
			rng := rand.New(rand.NewPCG(hs.Sum64(), 1))
			logits := make([]float32, 100)
			for j := range logits {
				logits[j] = float32(rng.NormFloat64() * 2)
			}
			out[i] = model.SampleSeq(logits, &in, nil)
		}
		effs = h.step(BatchDone{Out: out})
		for _, e := range effectsOf[Emit](effs) {
			for _, tk := range e.Tokens {
				outs[e.Choice] = append(outs[e.Choice], tk.Token)
			}
		}
	}
	return outs
}

// TestConstrainedTokenRefused: a token the grammar refuses (the sampler
// never draws one: a bug) fails the request as failed_internal, and the
// token is never emitted.
func TestConstrainedTokenRefused(t *testing.T) {
	h := newHarness(t, testConfig(RoleColocated), 32)
	q := request(1, 6, 10)
	q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
	constrain(t, &q, yesNo)
	h.step(Arrive{Req: q})
	h.step(Schedule{})
	effs := h.done(func(string) int32 { return 9 }) // "x"
	if f, ok := h.finalOf(q.RID); !ok || f.Outcome != outcome.FailedInternal || !strings.Contains(f.Err, "outside the request's grammar") {
		t.Fatalf("finalize %+v", f)
	}
	if e := effectsOf[Emit](effs); len(e) != 0 {
		t.Fatalf("emitted %+v", e)
	}
}

// TestConstrainedPrefillMasksFirstToken: prefill draws the first token
// under the grammar's initial mask.
func TestConstrainedPrefillMasksFirstToken(t *testing.T) {
	h := newHarness(t, testConfig(RolePrefill), 32)
	q := request(1, 6, 1)
	constrain(t, &q, yesNo)
	h.step(Arrive{Req: q})
	h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
	h.step(Schedule{})
	if h.batch == nil || len(h.batch.Seqs) != 1 || !h.batch.Seqs[0].Input.Sample {
		t.Fatalf("no sampling forward: %+v", h.batch)
	}
	if got, want := maskIDs(h.batch.Seqs[0].Input.Mask), []int32{1, 4, 6, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("first token's mask %v, want %v (y, n, ye, no, yes)", got, want)
	}
}

// TestConstrainedDecodeFirstToken: decode takes prefill's first token
// into its matcher (the next mask follows it), refuses KV_DONE whose first
// token the grammar does not allow, and refuses KV bound to another
// constraint or to none (kvxfer.BindKVConstrained): decode never continues
// under another grammar.
func TestConstrainedDecodeFirstToken(t *testing.T) {
	q := request(1, 10, 4)
	constrain(t, &q, yesNo)
	other := q
	constrain(t, &other, grammar.Spec{Kind: grammar.KindChoice, Source: `["yes","nope"]`})
	for _, tc := range []struct {
		name  string
		first int32
		bind  func(h *harness) kvxfer.Binding
		err   string
		mask  []int32
	}{
		{"its own", 6, func(h *harness) kvxfer.Binding { return h.binding(q) }, "", []int32{3}},
		{"a first token outside the grammar", 9, func(h *harness) kvxfer.Binding { return h.binding(q) },
			"outside the request's grammar", nil},
		{"another constraint", 6, func(h *harness) kvxfer.Binding { return h.binding(other) }, "KV is not this request's", nil},
		{"no constraint", 6, func(h *harness) kvxfer.Binding {
			plain := q
			plain.Constraint, plain.ConstraintDigest = nil, ""
			return h.binding(plain)
		}, "KV is not this request's", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(RoleDecode), 16)
			h.step(PeerUp{Peer: 7})
			h.step(Arrive{Req: q})
			rg := kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}
			pages := h.m.reqs[q.RID].pages
			for i := range 3 {
				h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVChunk{RoomGen: rg, Seq: uint32(i), FirstPage: uint32(i), NPages: 1,
					Data: fmt.Appendf(nil, "page%04d", i)}})
			}
			effs := h.step(PeerMessage{Peer: q.Peer, Msg: kvxfer.KVDone{RoomGen: rg, NChunks: 3, NPages: 3,
				NTokens: 10, Binding: tc.bind(h), Checksum: h.checksum(pages[:3]), FirstToken: tc.first}})
			for _, v := range effectsOf[VerifyKV](effs) {
				effs = append(effs, h.step(KVVerified{RID: v.RID, Gen: v.Gen, Checksum: h.checksum(v.Pages)})...)
			}
			if tc.err != "" {
				f, ok := h.finalOf(q.RID)
				if !ok || f.Outcome != outcome.FailedTransfer || !strings.Contains(f.Err, tc.err) {
					t.Fatalf("finalize %+v, want failed_transfer with %q", f, tc.err)
				}
				if len(effectsOf[Emit](effs)) != 0 {
					t.Fatalf("emitted a token:\n%s", describe(effs))
				}
				return
			}
			if e := effectsOf[Emit](effs); len(e) != 1 || e[0].Tokens[0].Token != tc.first {
				t.Fatalf("first token not emitted:\n%s", describe(effs))
			}
			h.step(Schedule{})
			if h.batch == nil {
				t.Fatal("no decode step")
			}
			if got := maskIDs(h.batch.Seqs[0].Input.Mask); !slices.Equal(got, tc.mask) {
				t.Fatalf("second token's mask %v, want %v", got, tc.mask)
			}
			h.done(func(string) int32 { return 3 })
			h.step(Schedule{})
			if got := maskIDs(h.batch.Seqs[0].Input.Mask); !slices.Equal(got, []int32{99}) {
				t.Fatalf("third token's mask %v, want only EOS", got)
			}
			h.done(func(string) int32 { return 99 })
			if f, ok := h.finalOf(q.RID); !ok || f.Outcome != outcome.OK || f.FinishReason != "stop" || f.OutputTokens != 3 {
				t.Fatalf("finalize %+v", f)
			}
		})
	}
}

// TestConstrainedValidate: a constraint comes with its digest, bound to a
// vocabulary of the worker's size.
func TestConstrainedValidate(t *testing.T) {
	good := request(1, 6, 4)
	constrain(t, &good, yesNo)
	noDigest := good
	noDigest.ConstraintDigest = ""
	noConstraint := good
	noConstraint.Constraint = nil
	small, err := grammar.NewVocab([][]byte{[]byte("y"), []byte("e"), []byte("s"), nil}, []int32{3})
	if err != nil {
		t.Fatal(err)
	}
	g, err := grammar.Compile(yesNo)
	if err != nil {
		t.Fatal(err)
	}
	c, err := grammar.NewConstraint(g, small)
	if err != nil {
		t.Fatal(err)
	}
	otherVocab := good
	otherVocab.Constraint = c
	for name, q := range map[string]Request{"no digest": noDigest, "no constraint": noConstraint, "another vocabulary": otherVocab} {
		h := newHarness(t, testConfig(RoleDecode), 16)
		h.step(Arrive{Req: q})
		if f, ok := h.finalOf(q.RID); !ok || f.Outcome != outcome.RejectedInvalid {
			t.Errorf("%s: %+v, want rejected_invalid", name, f)
		}
	}
	h := newHarness(t, testConfig(RoleDecode), 16)
	h.step(Arrive{Req: good})
	if _, ended := h.finalOf(good.RID); ended {
		t.Fatal("a good constrained request was refused")
	}
}

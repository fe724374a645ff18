package lifecycle

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// draw is one sampling of a run: the input the sampler was given and what
// it drew.
type draw struct {
	in  model.SeqInput
	out model.SeqOutput
}

// sampledForward is the world's forward (page bytes written, and read, as
// w.forward does), each token then drawn by the real sampler, model.SampleSeq,
// from logits that are a function of the bytes of every page the sequence
// reads: what a real model does with its KV. Each draw is recorded under
// its sampler step.
func sampledForward(w *world, n *node, b *RunBatch, draws map[int]draw) []model.SeqOutput {
	out := w.forward(n, b)
	ps := n.m.cfg.PageSize
	for i, s := range b.Seqs {
		in := s.Input
		if !in.Sample {
			continue
		}
		total := in.Pos + len(in.Tokens)
		h := fnv.New64a()
		for p := 0; p < (total+ps-1)/ps; p++ {
			h.Write(n.page(in.Pages[p]))
		}
		rng := rand.New(rand.NewPCG(h.Sum64(), 7))
		logits := make([]float32, n.m.cfg.VocabSize)
		for j := range logits {
			logits[j] = float32(rng.NormFloat64() * 2)
		}
		out[i] = model.SampleSeq(logits, &in, nil)
		if _, dup := draws[in.Step]; dup {
			w.fatalf("%s: step %d of %s sampled twice", n.name, in.Step, s.RID)
		}
		rec := in
		rec.Prompt, rec.Output = slices.Clone(in.Prompt), slices.Clone(in.Output)
		rec.Ban, rec.Mask = slices.Clone(in.Ban), slices.Clone(in.Mask)
		draws[in.Step] = draw{in: rec, out: out[i]}
	}
	return out
}

// continueRun is one request run to its end in a fresh world.
type continueRun struct {
	emitted []int32
	draws   map[int]draw
	final   Finalize
	// history is the request's lifecycle on the node that emits its
	// tokens, as arrival left it.
	history []HistoryEntry
}

// runToEnd runs q alone, on a colocated node or (pd) a prefill and a decode
// node, every forward sampled by sampledForward, until it ended on every
// node. The prefill leg is q as the worker maps it (MaxTokens 1, MinTokens
// at most 1).
func runToEnd(t *testing.T, pd bool, q Request) continueRun {
	t.Helper()
	w := newWorld(t)
	var nodes []*node
	var out *node
	run := continueRun{draws: map[int]draw{}}
	if pd {
		P := w.addNode(testConfig(RolePrefill), 32, 0)
		D := w.addNode(testConfig(RoleDecode), 32, 0)
		w.connect()
		q.Peer, q.PeerAddr = 0, "" // the world's connection
		qp := q
		qp.MaxTokens, qp.MinTokens = 1, min(qp.MinTokens, 1)
		w.arrive(P, qp)
		w.arrive(D, q)
		nodes, out = []*node{P, D}, D
	} else {
		C := w.addNode(testConfig(RoleColocated), 32, 0)
		q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
		w.arrive(C, q)
		nodes, out = []*node{C}, C
	}
	if info, ok := out.m.Request(q.RID, w.now); ok {
		run.history = info.History
	}
	for range 1000 {
		ended := true
		for _, n := range nodes {
			_, done := n.finals[q.RID]
			ended = ended && done
		}
		if ended {
			break
		}
		progress := false
		for _, n := range nodes {
			if n.batch != nil {
				b := n.batch
				n.batch = nil
				w.step(n, BatchDone{Out: sampledForward(w, n, b, run.draws)})
				progress = true
			} else {
				w.schedule(n)
				progress = progress || n.batch != nil
			}
			if k := len(n.io); k > 0 {
				w.runIO(n, k)
				progress = true
			}
			if k := len(n.inbox); k > 0 {
				w.deliver(n, k)
				progress = true
			}
		}
		if !progress {
			t.Fatalf("%s stuck: %+v", q.RID, out.m.Requests(w.now))
		}
	}
	f, ok := out.finals[q.RID]
	if !ok {
		t.Fatalf("%s did not end", q.RID)
	}
	run.final = f
	run.emitted = out.emitted[q.RID]
	return run
}

// continuation is q continued after its first k output tokens out[:k], as
// the router sends it: those tokens appended to the input, max_tokens and
// min_tokens what is left.
func continuation(q Request, out []int32, k int) Request {
	c := q
	c.InputIDs = append(slices.Clone(q.InputIDs), out[:k]...)
	c.Continued = k
	c.MaxTokens = q.MaxTokens - k
	c.MinTokens = max(0, q.MinTokens-k)
	return c
}

// sameDraw compares two draws of one step bit for bit: the sampler's input
// (step, bans, mask, history) and its token, logprob and top logprobs.
func sameDraw(a, b draw) string {
	switch {
	case a.in.Step != b.in.Step:
		return fmt.Sprintf("step %d vs %d", a.in.Step, b.in.Step)
	case !slices.Equal(a.in.Ban, b.in.Ban):
		return fmt.Sprintf("bans %v vs %v", a.in.Ban, b.in.Ban)
	case !slices.Equal(a.in.Mask, b.in.Mask):
		return fmt.Sprintf("masks %v vs %v", maskIDs(a.in.Mask), maskIDs(b.in.Mask))
	case !slices.Equal(a.in.Prompt, b.in.Prompt) || !slices.Equal(a.in.Output, b.in.Output):
		return fmt.Sprintf("history %v|%v vs %v|%v", a.in.Prompt, a.in.Output, b.in.Prompt, b.in.Output)
	case a.out.Token != b.out.Token || math.Float32bits(a.out.Logprob) != math.Float32bits(b.out.Logprob):
		return fmt.Sprintf("drew %d (%v) vs %d (%v)", a.out.Token, a.out.Logprob, b.out.Token, b.out.Logprob)
	case len(a.out.Top) != len(b.out.Top):
		return fmt.Sprintf("top %v vs %v", a.out.Top, b.out.Top)
	}
	for i := range a.out.Top {
		if a.out.Top[i].ID != b.out.Top[i].ID || math.Float32bits(a.out.Top[i].Logprob) != math.Float32bits(b.out.Top[i].Logprob) {
			return fmt.Sprintf("top %v vs %v", a.out.Top, b.out.Top)
		}
	}
	return ""
}

// TestContinuationEqualsUninterrupted: a request continued after k of its
// output tokens (its input the prompt and those tokens, Continued k,
// max_tokens and min_tokens what is left) generates exactly the rest of
// what it generates uninterrupted: the same tokens with bit-identical
// logprobs, each drawn at the same sampler step from the same bans, mask
// and penalty history, and ends the same way. Colocated and PD; seeded
// temperature sampling, penalties and bad words (processed logprobs, top
// logprobs), min_tokens across the break, a grammar; k = 1, mid-output and
// the last but one.
func TestContinuationEqualsUninterrupted(t *testing.T) {
	yesNoMany := grammar.Spec{Kind: grammar.KindRegex, Source: `(yes|no)+`}
	cases := []struct {
		name string
		make func(t *testing.T, seed uint64) Request
	}{
		{"sampled", func(t *testing.T, seed uint64) Request {
			q := request(1, 9, 12)
			q.IgnoreEOS = true
			q.Sampling = model.SamplingParams{Temperature: 0.8, TopP: 0.95, Seed: seed}
			return q
		}},
		{"penalties", func(t *testing.T, seed uint64) Request {
			q := request(1, 7, 14)
			q.IgnoreEOS = true
			q.Sampling = model.SamplingParams{Temperature: 1.1, TopP: 1, Seed: seed, PresencePenalty: 0.7, FrequencyPenalty: 0.4,
				RepetitionPenalty: 1.3, BadWords: [][]int32{{3, 4}, {17}}, TopLogprobs: 3, LogprobsMode: model.LogprobsProcessed,
				LogitBias: []model.LogitBias{{ID: 5, Bias: 3}, {ID: 6, Bias: 3}}}
			return q
		}},
		{"min_tokens", func(t *testing.T, seed uint64) Request {
			// EOS is likely (biased up), so min_tokens holds it back and
			// the request stops soon after.
			q := request(1, 6, 14)
			q.MinTokens = 5
			q.StopTokenIDs = []int32{42}
			q.Sampling = model.SamplingParams{Temperature: 0.7, TopP: 1, Seed: seed,
				LogitBias: []model.LogitBias{{ID: 42, Bias: 2}, {ID: 99, Bias: 2.5}}}
			return q
		}},
		{"constraint", func(t *testing.T, seed uint64) Request {
			q := request(1, 6, 12)
			q.MinTokens = 3
			q.Sampling = model.SamplingParams{Temperature: 1, TopP: 1, Seed: seed, PresencePenalty: 0.2}
			constrain(t, &q, yesNoMany)
			return q
		}},
	}
	for _, pd := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("pd=%v/%s", pd, tc.name), func(t *testing.T) {
				continued := 0
				for seed := range uint64(4) {
					q := tc.make(t, seed+1)
					whole := runToEnd(t, pd, q)
					if whole.final.Outcome != outcome.OK {
						t.Fatalf("seed %d: uninterrupted run ended %+v", seed, whole.final)
					}
					out := whole.emitted
					if len(out) != len(whole.draws) {
						t.Fatalf("seed %d: %d tokens out, %d draws", seed, len(out), len(whole.draws))
					}
					ks := []int{1, len(out) / 2, len(out) - 1}
					slices.Sort(ks)
					for _, k := range slices.Compact(ks) {
						if k < 1 || k >= len(out) {
							continue
						}
						continued++
						c := continuation(q, out, k)
						part := runToEnd(t, pd, c)
						if part.final.Outcome != whole.final.Outcome || part.final.FinishReason != whole.final.FinishReason {
							t.Fatalf("seed %d k=%d: ended %+v, uninterrupted %+v", seed, k, part.final, whole.final)
						}
						if !slices.Equal(part.emitted, out[k:]) {
							t.Fatalf("seed %d k=%d: emitted %v, want %v (uninterrupted %v)", seed, k, part.emitted, out[k:], out)
						}
						if part.final.OutputTokens != len(out)-k {
							t.Fatalf("seed %d k=%d: %d output tokens counted, want %d", seed, k, part.final.OutputTokens, len(out)-k)
						}
						for s := k; s < len(out); s++ {
							got, ok := part.draws[s]
							if !ok {
								t.Fatalf("seed %d k=%d: no draw at step %d (draws at %v)", seed, k, s, keys(part.draws))
							}
							if d := sameDraw(got, whole.draws[s]); d != "" {
								t.Fatalf("seed %d k=%d step %d: %s", seed, k, s, d)
							}
						}
						if len(part.draws) != len(out)-k {
							t.Fatalf("seed %d k=%d: draws at %v", seed, k, keys(part.draws))
						}
						if len(part.history) == 0 || !strings.Contains(part.history[0].What, fmt.Sprintf("continues %d output tokens", k)) {
							t.Fatalf("seed %d k=%d: transcript %+v", seed, k, part.history)
						}
					}
				}
				if continued < 6 {
					t.Fatalf("only %d continuations ran: outputs too short to test", continued)
				}
			})
		}
	}
}

func keys(m map[int]draw) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestContinuationValidated: a continuation is refused (rejected_invalid,
// with a message that names the problem) when continued_tokens is negative
// or not below the input's length, with n > 1, with prompt logprobs, with
// max_tokens 0, when a continued token is one that would have ended the
// request (EOS without ignore_eos, a stop token; EOS with a grammar even
// with ignore_eos), or when its grammar refuses a continued token. A good
// one is admitted, its matcher advanced over the continued tokens (the
// first mask is the grammar's after them).
func TestContinuationValidated(t *testing.T) {
	base := func() Request {
		q := request(1, 6, 4)
		q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
		q.Continued = 2
		return q
	}
	for _, tc := range []struct {
		name string
		edit func(q *Request)
		msg  string
	}{
		{"negative", func(q *Request) { q.Continued = -1 }, "continued_tokens must be in [0, 6)"},
		{"all of the input", func(q *Request) { q.Continued = 6 }, "continued_tokens must be in [0, 6)"},
		{"n > 1", func(q *Request) { q.N = 2 }, "n is 2"},
		{"prompt logprobs", func(q *Request) { q.ScorePrompt, q.PromptTop = true, 1 }, "prompt_logprobs must be unset"},
		{"max_tokens 0", func(q *Request) { q.MaxTokens = 0 }, "max_tokens must be at least 1"},
		{"EOS continued", func(q *Request) { q.InputIDs[4] = 99 }, "continued token 99 (output step 0) ends the request"},
		{"stop token continued", func(q *Request) { q.StopTokenIDs = []int32{q.InputIDs[5]} }, "output step 1) ends the request"},
		{"EOS continued under a grammar", func(q *Request) {
			q.IgnoreEOS = true
			q.InputIDs[4], q.InputIDs[5] = 8, 99
			constrain(t, q, yesNo)
		}, "continued token 99 (output step 1) ends the request"},
		{"outside the grammar", func(q *Request) {
			q.InputIDs[4], q.InputIDs[5] = 6, 5 // "ye", "o"
			constrain(t, q, yesNo)
		}, "continued token 5 (output step 1) is outside the request's grammar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(RoleColocated), 32)
			q := base()
			tc.edit(&q)
			h.step(Arrive{Req: q})
			f, ok := h.finalOf(q.RID)
			if !ok || f.Outcome != outcome.RejectedInvalid || !strings.Contains(f.Err, tc.msg) {
				t.Fatalf("finalize %+v, want rejected_invalid with %q", f, tc.msg)
			}
		})
	}
	for _, role := range []Role{RoleColocated, RolePrefill, RoleDecode} {
		h := newHarness(t, testConfig(role), 32)
		q := base()
		if role == RoleColocated {
			q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
		} else {
			q.Room, q.Peer, q.PeerAddr = room(1), 7, "p:1"
		}
		q.InputIDs[4], q.InputIDs[5] = 6, 3 // "ye", "s": the grammar's "yes" is whole
		constrain(t, &q, yesNo)
		h.step(PeerUp{Peer: 7})
		h.step(Arrive{Req: q})
		if f, ended := h.finalOf(q.RID); ended {
			t.Fatalf("%s: a good continuation was refused: %+v", role, f)
		}
		if role == RolePrefill {
			h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
		}
		if role == RoleDecode {
			continue // decode samples after the transfer (the PD test)
		}
		h.step(Schedule{})
		if h.batch == nil || len(h.batch.Seqs) == 0 {
			t.Fatalf("%s: no forward", role)
		}
		in := h.batch.Seqs[len(h.batch.Seqs)-1].Input
		if !in.Sample || in.Step != 2 || !slices.Equal(maskIDs(in.Mask), []int32{99}) {
			t.Fatalf("%s: first draw at step %d (sample %v) with mask %v, want step 2 and only EOS", role, in.Step, in.Sample, maskIDs(in.Mask))
		}
	}
}

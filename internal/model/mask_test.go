package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// maskOf is a mask over v tokens allowing ids.
func maskOf(v int, ids ...int32) []uint64 {
	m := make([]uint64, (v+63)/64)
	for _, id := range ids {
		m[id/64] |= 1 << (id % 64)
	}
	return m
}

// TestSampleSeqMask: greedy and seeded draws, and every fork, land in the
// mask whatever the logits; the mask beats a higher logit, logit bias and
// allowed_token_ids never widen it.
func TestSampleSeqMask(t *testing.T) {
	const V = 300
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	allowedIDs := []int32{3, 64, 65, 127, 128, 299}
	mask := maskOf(V, allowedIDs...)
	inMask := func(id int32) bool {
		for _, a := range allowedIDs {
			if a == id {
				return true
			}
		}
		return false
	}
	cases := []SamplingParams{
		{Temperature: 0},
		{Temperature: 1, Seed: 9},
		{Temperature: 0.7, TopP: 0.9, Seed: 4},
		{Temperature: 1.3, TopK: 2, Seed: 5},
		{Temperature: 1, MinP: 0.5, Seed: 6},
		{Temperature: 1, Seed: 7, LogitBias: []LogitBias{{ID: 10, Bias: 100}}},
		{Temperature: 0, LogitBias: []LogitBias{{ID: 10, Bias: 100}}},
		{Temperature: 1, Seed: 8, AllowedTokenIDs: []int32{10, 11}},
		{Temperature: 1, Seed: 8, RepetitionPenalty: 1.5, FrequencyPenalty: 0.3},
	}
	for ci, p := range cases {
		counts := map[int32]int{}
		for step := range 200 {
			s := SeqInput{Sampling: p, Step: step, Mask: mask, Forks: 4, Output: []int32{3, 3}, Prompt: []int32{64}}
			out := SampleSeq(logits, &s, nil)
			toks := []int32{out.Token}
			for _, f := range out.Forks {
				toks = append(toks, f.Token)
			}
			for _, tok := range toks {
				if !inMask(tok) {
					t.Fatalf("case %d step %d: drew %d, outside the mask %v", ci, step, tok, allowedIDs)
				}
				counts[tok]++
			}
		}
		if p.Temperature == 0 {
			// Greedy: the most likely allowed token.
			best := allowedIDs[0]
			for _, id := range allowedIDs {
				if logits[id] > logits[best] {
					best = id
				}
			}
			if counts[best] != 800 {
				t.Fatalf("case %d: greedy drew %v, want only %d", ci, counts, best)
			}
		}
	}
}

// TestSampleSeqMaskOverridesBan: min_tokens' ban (SeqInput.Ban) yields to a
// mask that allows only banned tokens; without the mask the ban holds.
func TestSampleSeqMaskOverridesBan(t *testing.T) {
	logits := []float32{5, 1, 2, 0}
	const eos = 3
	for _, p := range []SamplingParams{{Temperature: 0}, {Temperature: 1, Seed: 3}} {
		for step := range 50 {
			s := SeqInput{Sampling: p, Step: step, Ban: []int32{eos}, Mask: maskOf(4, eos)}
			if got := SampleSeq(logits, &s, nil).Token; got != eos {
				t.Fatalf("%+v step %d: drew %d, want EOS (the mask's only token)", p, step, got)
			}
			// The ban still applies within the mask when something is left.
			s.Mask = maskOf(4, eos, 1)
			if got := SampleSeq(logits, &s, nil).Token; got != 1 {
				t.Fatalf("%+v step %d: drew %d, want 1 (EOS banned)", p, step, got)
			}
			s.Mask = nil
			if got := SampleSeq(logits, &s, nil).Token; got == eos {
				t.Fatalf("%+v step %d: drew the banned EOS without a mask", p, step)
			}
		}
	}
}

// TestSampleSeqMaskInfLogits: when every token the mask allows has logit
// −∞, one of them is still drawn (as equals), never a token outside it.
func TestSampleSeqMaskInfLogits(t *testing.T) {
	logits := []float32{9, negInf, 8, negInf, negInf}
	mask := maskOf(5, 1, 3)
	seen := map[int32]bool{}
	for step := range 200 {
		s := SeqInput{Sampling: SamplingParams{Temperature: 1, Seed: 1}, Step: step, Mask: mask, Ban: []int32{1}}
		tok := SampleSeq(logits, &s, nil).Token
		if tok != 1 && tok != 3 {
			t.Fatalf("step %d drew %d, outside the mask", step, tok)
		}
		seen[tok] = true
	}
	if !seen[3] || seen[1] {
		t.Fatalf("drew %v: want only 3 (1 is banned and 3 is left)", seen)
	}
	s := SeqInput{Sampling: SamplingParams{Temperature: 0}, Mask: mask}
	if tok := SampleSeq(logits, &s, nil).Token; tok != 1 {
		t.Fatalf("greedy drew %d, want 1 (the lowest of equals)", tok)
	}
}

// TestSampleSeqMaskLogprobs: raw logprobs are the model's (the mask does
// not change them); processed ones are of the masked distribution.
func TestSampleSeqMaskLogprobs(t *testing.T) {
	logits := []float32{1, 3, 2, 0}
	mask := maskOf(4, 0, 2)
	rawZ := refLogSumExp(logits)
	s := SeqInput{Sampling: SamplingParams{Temperature: 0, TopLogprobs: 2}, Mask: mask}
	out := SampleSeq(logits, &s, nil)
	if out.Token != 2 || !near(out.Logprob, 2-rawZ) {
		t.Fatalf("raw greedy: %d %v, want 2 %v", out.Token, out.Logprob, 2-rawZ)
	}
	if out.Top[0].ID != 1 || !near(out.Top[0].Logprob, 3-rawZ) {
		t.Fatalf("raw top %+v: want the model's most likely token 1 first", out.Top)
	}
	s.Sampling.LogprobsMode = LogprobsProcessed
	out = SampleSeq(logits, &s, nil)
	procZ := math.Log(math.Exp(1) + math.Exp(2))
	if out.Token != 2 || !near(out.Logprob, 2-procZ) || out.Top[0].ID != 2 || out.Top[1].ID != 0 || !near(out.Top[1].Logprob, 1-procZ) {
		t.Fatalf("processed greedy: %+v", out)
	}
	s.Sampling = SamplingParams{Temperature: 1, Seed: 2, TopLogprobs: 3, LogprobsMode: LogprobsProcessed}
	for step := range 50 {
		s.Step = step
		out = SampleSeq(logits, &s, nil)
		want := float64(logits[out.Token]) - procZ
		if (out.Token != 0 && out.Token != 2) || !near(out.Logprob, want) {
			t.Fatalf("processed seeded step %d: %d %v, want a masked token with %v", step, out.Token, out.Logprob, want)
		}
		if !math.IsInf(float64(out.Top[2].Logprob), -1) {
			t.Fatalf("processed top %+v: a token outside the mask has −∞", out.Top)
		}
	}
}

func near(a float32, b float64) bool { return math.Abs(float64(a)-b) < 1e-5 }

// BenchmarkSampleSeqMask: a seeded draw over a Llama 3 sized vocabulary,
// with no mask, a mask allowing a few tokens (inside a JSON structure) and
// one allowing most (inside a string).
func BenchmarkSampleSeqMask(b *testing.B) {
	const V = 128256
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	few := maskOf(V, 1, 2, 3, 500, 70000)
	most := make([]uint64, (V+63)/64)
	for i := range most {
		most[i] = ^uint64(0) &^ (1 << (i % 64))
	}
	var sc SampleScratch
	for _, c := range []struct {
		name string
		mask []uint64
	}{{"none", nil}, {"few", few}, {"most", most}} {
		b.Run(c.name, func(b *testing.B) {
			in := SeqInput{Sampling: SamplingParams{Temperature: 1, Seed: 3}, Mask: c.mask}
			for b.Loop() {
				SampleSeq(logits, &in, &sc)
			}
		})
	}
}

// TestSortByLogitFinite: leaving −∞ out of the sort gives the full order
// without its −∞ tail; with every logit −∞, the full order.
func TestSortByLogitFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	var sc SampleScratch
	for trial := range 50 {
		V := 1 + rng.IntN(3000)
		logits := make([]float32, V)
		for i := range logits {
			switch rng.IntN(4) {
			case 0:
				logits[i] = negInf
			case 1:
				logits[i] = float32(rng.IntN(3)) // ties
			default:
				logits[i] = float32(rng.NormFloat64())
			}
		}
		if trial%10 == 0 {
			for i := range logits {
				logits[i] = negInf
			}
		}
		full := slices.Clone(sortByLogit(logits, &sc, false))
		want := full
		for len(want) > 0 && math.IsInf(float64(logits[want[len(want)-1]]), -1) {
			want = want[:len(want)-1]
		}
		if len(want) == 0 {
			want = full
		}
		if got := sortByLogit(logits, &sc, true); !slices.Equal(got, want) {
			t.Fatalf("trial %d (V %d): %d ids, want %d", trial, V, len(got), len(want))
		}
	}
}

package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var negInf = float32(math.Inf(-1))

// refLogSumExp is log Σ exp(x) as SampleSeq documents it: the highest
// value M, then M + log Σ exp(l − M) in id order.
func refLogSumExp(x []float32) float64 {
	m := math.Inf(-1)
	for _, l := range x {
		if float64(l) > m {
			m = float64(l)
		}
	}
	var s float64
	for _, l := range x {
		s += math.Exp(float64(l) - m)
	}
	return m + math.Log(s)
}

// refProcess applies SampleSeq's processors the plain way: a set of banned
// ids, maps of counts.
func refProcess(logits []float32, in *SeqInput) []float32 {
	V := int32(len(logits))
	p := in.Sampling
	inV := func(id int32) bool { return id >= 0 && id < V }
	// allowed_token_ids first, ignored if it leaves nothing; then the
	// other bans, all ignored if they leave nothing.
	proc := slices.Clone(logits)
	banAll := func(banned map[int32]bool) {
		n := 0
		for id := range V {
			if banned[id] || math.IsInf(float64(proc[id]), -1) {
				n++
			}
		}
		if n == int(V) {
			return
		}
		for id := range banned {
			if inV(id) {
				proc[id] = negInf
			}
		}
	}
	if len(p.AllowedTokenIDs) > 0 {
		notAllowed := map[int32]bool{}
		for id := range V {
			if !slices.Contains(p.AllowedTokenIDs, id) {
				notAllowed[id] = true
			}
		}
		banAll(notAllowed)
	}
	banned := map[int32]bool{}
	for _, id := range in.Ban {
		banned[id] = true
	}
	for _, w := range p.BadWords {
		k := len(w)
		out := in.Output
		if k == 1 || (len(out) >= k-1 && slices.Equal(out[len(out)-k+1:], w[:k-1])) {
			banned[w[k-1]] = true
		}
	}
	banAll(banned)
	if rp := p.RepetitionPenalty; rp != 0 && rp != 1 {
		seen := map[int32]bool{}
		for _, t := range append(slices.Clone(in.Prompt), in.Output...) {
			if inV(t) {
				seen[t] = true
			}
		}
		for t := range seen {
			if proc[t] > 0 {
				proc[t] /= rp
			} else {
				proc[t] *= rp
			}
		}
	}
	counts := map[int32]int{}
	for _, t := range in.Output {
		if inV(t) {
			counts[t]++
		}
	}
	for t, c := range counts {
		proc[t] = proc[t] - float32(c)*p.FrequencyPenalty
		proc[t] = proc[t] - p.PresencePenalty
	}
	for _, b := range p.LogitBias {
		if inV(b.ID) {
			proc[b.ID] += b.Bias
		}
	}
	return proc
}

// refOrder is every id of x in candidate order, by a full sort.
func refOrder(x []float32) []int32 {
	ids := make([]int32, len(x))
	for i := range ids {
		ids[i] = int32(i)
	}
	sort.Slice(ids, func(a, b int) bool {
		if x[ids[a]] != x[ids[b]] {
			return x[ids[a]] > x[ids[b]]
		}
		return ids[a] < ids[b]
	})
	return ids
}

// sampleSeqRef is SampleSeq as its documentation states it, computed
// naively: full sorts, no shared passes, no scratch.
func sampleSeqRef(logits []float32, in *SeqInput) SeqOutput {
	V := len(logits)
	if V == 0 {
		return SeqOutput{}
	}
	p := in.Sampling
	proc := refProcess(logits, in)
	raw := p.LogprobsMode == LogprobsRaw
	nTop := min(p.TopLogprobs, V)
	forks := max(in.Forks, 1)
	rawZ := refLogSumExp(logits)
	var draws []int32
	var lp func(id int32) float32
	var topIDs []int32
	if p.Temperature == 0 {
		ord := refOrder(proc)
		for range forks {
			draws = append(draws, ord[0])
		}
		dist, z := logits, rawZ
		if !raw {
			dist, z = proc, refLogSumExp(proc)
		}
		lp = func(id int32) float32 { return float32(float64(dist[id]) - z) }
		topIDs = refOrder(dist)[:nTop]
	} else {
		ord := refOrder(proc)
		m := float64(proc[ord[0]])
		if p.TopK > 0 && p.TopK < V {
			ord = ord[:p.TopK]
		}
		cand := ord
		for len(cand) > 1 && math.IsInf(float64(proc[cand[len(cand)-1]]), -1) {
			cand = cand[:len(cand)-1]
		}
		t := float64(p.Temperature)
		var probs []float64
		for _, id := range cand {
			probs = append(probs, math.Exp((float64(proc[id])-m)/t))
		}
		if p.MinP > 0 {
			for i := range probs {
				if probs[i] < float64(p.MinP)*probs[0] {
					probs = probs[:i]
					break
				}
			}
		}
		var z float64
		for _, pi := range probs {
			z += pi
		}
		topP := float64(p.TopP)
		if topP <= 0 || topP > 1 {
			topP = 1
		}
		keep, cum := len(probs), 0.0
		for i, pi := range probs {
			cum += pi / z
			if cum >= topP {
				keep = i + 1
				break
			}
		}
		var zk float64
		for _, pi := range probs[:keep] {
			zk += pi
		}
		kept := map[int32]bool{}
		for _, id := range cand[:keep] {
			kept[id] = true
		}
		for f := range forks {
			u := Uniform(ForkSeed(p.Seed, f), in.Step) * zk
			tok := cand[keep-1]
			for i := range keep {
				u -= probs[i]
				if u < 0 {
					tok = cand[i]
					break
				}
			}
			draws = append(draws, tok)
		}
		if raw {
			lp = func(id int32) float32 { return float32(float64(logits[id]) - rawZ) }
			topIDs = refOrder(logits)[:nTop]
		} else {
			lp = func(id int32) float32 {
				if !kept[id] {
					return negInf
				}
				return float32((float64(proc[id])-m)/t - math.Log(zk))
			}
			topIDs = refOrder(proc)[:nTop]
		}
	}
	var top []TokenLogprob
	for _, id := range topIDs {
		top = append(top, TokenLogprob{ID: id, Logprob: lp(id)})
	}
	out := SeqOutput{Token: draws[0], Logprob: lp(draws[0]), Top: top}
	for _, tok := range draws[1:] {
		out.Forks = append(out.Forks, SeqOutput{Token: tok, Logprob: lp(tok), Top: slices.Clone(top)})
	}
	return out
}

// sameOutput compares outputs bit for bit (NaN never expected; −∞ equal).
var sameOutput = cmp.Comparer(func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })

func TestProcessEachProcessor(t *testing.T) {
	logits := []float32{2, -1, 0, 4, 1, -3}
	inf := negInf
	for _, tc := range []struct {
		name string
		in   SeqInput
		want []float32
	}{
		{"nothing", SeqInput{}, []float32{2, -1, 0, 4, 1, -3}},
		{"ban", SeqInput{Ban: []int32{3, 99, -1}}, []float32{2, -1, 0, inf, 1, -3}},
		{"ban everything is ignored", SeqInput{Ban: []int32{0, 1, 2, 3, 4, 5}}, []float32{2, -1, 0, 4, 1, -3}},
		{"allowed", SeqInput{Sampling: SamplingParams{AllowedTokenIDs: []int32{4, 1, 77}}}, []float32{inf, -1, inf, inf, 1, inf}},
		{"allowed outside the vocabulary only: ignored", SeqInput{Sampling: SamplingParams{AllowedTokenIDs: []int32{6, 100}}}, []float32{2, -1, 0, 4, 1, -3}},
		{"bans that leave no allowed token give way", SeqInput{Ban: []int32{1}, Sampling: SamplingParams{AllowedTokenIDs: []int32{4, 1},
			BadWords: [][]int32{{4}}}}, []float32{inf, -1, inf, inf, 1, inf}},
		{"bans within the allowed tokens apply", SeqInput{Ban: []int32{1}, Sampling: SamplingParams{AllowedTokenIDs: []int32{4, 1}}},
			[]float32{inf, inf, inf, inf, 1, inf}},
		{"bad word of one token", SeqInput{Sampling: SamplingParams{BadWords: [][]int32{{0}}}}, []float32{inf, -1, 0, 4, 1, -3}},
		{"bad word whose prefix ends the output", SeqInput{Output: []int32{5, 1, 2},
			Sampling: SamplingParams{BadWords: [][]int32{{1, 2, 3}, {2, 4}, {5, 2, 0}, {9, 1, 2, 1}}}},
			[]float32{2, -1, 0, inf, inf, -3}},
		{"bad word longer than the output", SeqInput{Output: []int32{2},
			Sampling: SamplingParams{BadWords: [][]int32{{1, 2, 3}}}}, []float32{2, -1, 0, 4, 1, -3}},
		{"repetition over prompt and output, each once", SeqInput{Prompt: []int32{0, 1, 0}, Output: []int32{1, 2, 0, 42},
			Sampling: SamplingParams{RepetitionPenalty: 2}}, []float32{1, -2, 0, 4, 1, -3}},
		{"repetition 1 is off", SeqInput{Prompt: []int32{0}, Sampling: SamplingParams{RepetitionPenalty: 1}}, []float32{2, -1, 0, 4, 1, -3}},
		{"frequency and presence over the output", SeqInput{Prompt: []int32{5, 5}, Output: []int32{3, 3, 3, 1, -7},
			Sampling: SamplingParams{FrequencyPenalty: 0.5, PresencePenalty: 0.25}}, []float32{2, -1 - 0.5 - 0.25, 0, 4 - 1.5 - 0.25, 1, -3}},
		{"negative penalties raise", SeqInput{Output: []int32{2},
			Sampling: SamplingParams{FrequencyPenalty: -1, PresencePenalty: -2}}, []float32{2, -1, 3, 4, 1, -3}},
		{"logit bias", SeqInput{Sampling: SamplingParams{LogitBias: []LogitBias{{0, -2}, {5, 10}, {8, 1}}}}, []float32{0, -1, 0, 4, 1, 7}},
		// Order: bans, then repetition, then frequency/presence, then bias.
		{"penalty before bias", SeqInput{Output: []int32{0},
			Sampling: SamplingParams{RepetitionPenalty: 2, FrequencyPenalty: 1, LogitBias: []LogitBias{{0, 3}}}}, []float32{2/2 - 1 + 3, -1, 0, 4, 1, -3}},
		{"a banned token stays banned", SeqInput{Ban: []int32{0}, Output: []int32{0},
			Sampling: SamplingParams{RepetitionPenalty: 0.5, FrequencyPenalty: -2, LogitBias: []LogitBias{{0, 100}}}}, []float32{inf, -1, 0, 4, 1, -3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sc SampleScratch
			in := tc.in
			orig := slices.Clone(logits)
			for range 2 { // the second run checks the scratch was left clean
				got := process(logits, &in, &sc)
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("processed logits (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(refProcess(logits, &in), got); diff != "" {
					t.Fatalf("against refProcess (-ref +got):\n%s", diff)
				}
			}
			if !slices.Equal(logits, orig) {
				t.Fatalf("logits modified: %v", logits)
			}
		})
	}
}

// TestSampleSeqTruncation checks min_p, top_k and top_p and their order on
// a vocabulary small enough to reason about: which tokens can be drawn
// and their processed logprobs.
func TestSampleSeqTruncation(t *testing.T) {
	ln := func(x float64) float32 { return float32(math.Log(x)) }
	// Probabilities at temperature 1: 0.4, 0.3, 0.2, 0.1.
	logits := []float32{ln(0.2), ln(0.4), ln(0.1), ln(0.3)}
	for _, tc := range []struct {
		name string
		p    SamplingParams
		kept map[int32]float64 // kept token → probability drawn with
	}{
		{"none", SamplingParams{Temperature: 1}, map[int32]float64{1: 0.4, 3: 0.3, 0: 0.2, 2: 0.1}},
		{"min_p 0.45 drops p < 0.18", SamplingParams{Temperature: 1, MinP: 0.45}, map[int32]float64{1: 0.4 / 0.9, 3: 0.3 / 0.9, 0: 0.2 / 0.9}},
		// At T = 0.5, p ∝ p₁²: .16, .09, .04, .01 → 0.16·0.3 = 0.048 > 0.04: min_p
		// sees probabilities after temperature.
		{"min_p after temperature", SamplingParams{Temperature: 0.5, MinP: 0.3}, map[int32]float64{1: 0.16 / 0.25, 3: 0.09 / 0.25}},
		{"top_k", SamplingParams{Temperature: 1, TopK: 3}, map[int32]float64{1: 0.4 / 0.9, 3: 0.3 / 0.9, 0: 0.2 / 0.9}},
		{"top_k after min_p", SamplingParams{Temperature: 1, TopK: 3, MinP: 0.6}, map[int32]float64{1: 0.4 / 0.7, 3: 0.3 / 0.7}},
		// top_p over what min_p and top_k leave, renormalized: 0.42 ≤ 0.4/0.9,
		// while over all tokens 0.4 < 0.42 ≤ 0.7.
		{"top_p renormalized", SamplingParams{Temperature: 1, TopK: 3, TopP: 0.42}, map[int32]float64{1: 1}},
		{"top_p alone", SamplingParams{Temperature: 1, TopP: 0.42}, map[int32]float64{1: 0.4 / 0.7, 3: 0.3 / 0.7}},
		{"top_p 0.4 keeps one", SamplingParams{Temperature: 1, TopP: 0.35}, map[int32]float64{1: 1}},
		{"ban then truncation", SamplingParams{Temperature: 1, TopK: 2, BadWords: [][]int32{{1}}}, map[int32]float64{3: 0.3 / 0.5, 0: 0.2 / 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			p.LogprobsMode, p.TopLogprobs = LogprobsProcessed, 4
			seen := map[int32]bool{}
			for step := range 2000 {
				in := SeqInput{Sampling: p, Step: step}
				out := SampleSeq(logits, &in, nil)
				want, ok := tc.kept[out.Token]
				if !ok {
					t.Fatalf("step %d drew %d, want one of %v", step, out.Token, tc.kept)
				}
				seen[out.Token] = true
				if math.Abs(float64(out.Logprob)-math.Log(want)) > 1e-5 {
					t.Fatalf("token %d: processed logprob %v, want log %v", out.Token, out.Logprob, want)
				}
				for _, e := range out.Top {
					w, ok := tc.kept[e.ID]
					switch {
					case ok && math.Abs(float64(e.Logprob)-math.Log(w)) > 1e-5:
						t.Fatalf("top %v: want log %v", e, w)
					case !ok && !math.IsInf(float64(e.Logprob), -1):
						t.Fatalf("top %v: excluded, want −Inf", e)
					}
				}
			}
			if len(seen) != len(tc.kept) {
				t.Fatalf("drew %v in 2000 steps, want each of %v", seen, tc.kept)
			}
		})
	}
}

func TestSampleSeqLogprobModes(t *testing.T) {
	logits := []float32{1, 3, 3, -2, 0}
	rawZ := refLogSumExp(logits)
	p := SamplingParams{Temperature: 0, TopLogprobs: 3, LogitBias: []LogitBias{{0, 5}}}
	// Raw: the token is chosen from the processed logits (0 has 6), the
	// logprobs are the model's.
	in := SeqInput{Sampling: p}
	out := SampleSeq(logits, &in, nil)
	want := SeqOutput{Token: 0, Logprob: float32(1 - rawZ), Top: []TokenLogprob{
		{1, float32(3 - rawZ)}, {2, float32(3 - rawZ)}, {0, float32(1 - rawZ)}}}
	if diff := cmp.Diff(want, out, sameOutput); diff != "" {
		t.Fatalf("raw (-want +got):\n%s", diff)
	}
	// Processed, greedy: log softmax of the biased logits, no temperature.
	in.Sampling.LogprobsMode = LogprobsProcessed
	in.Sampling.Temperature = 0
	procZ := refLogSumExp([]float32{6, 3, 3, -2, 0})
	out = SampleSeq(logits, &in, nil)
	want = SeqOutput{Token: 0, Logprob: float32(6 - procZ), Top: []TokenLogprob{
		{0, float32(6 - procZ)}, {1, float32(3 - procZ)}, {2, float32(3 - procZ)}}}
	if diff := cmp.Diff(want, out, sameOutput); diff != "" {
		t.Fatalf("processed greedy (-want +got):\n%s", diff)
	}
	// Processed with fewer tokens kept than asked: the rest by processed
	// order with −∞.
	in.Sampling = SamplingParams{Temperature: 2, TopK: 2, TopLogprobs: 4, LogprobsMode: LogprobsProcessed}
	in.Ban = []int32{1}
	out = SampleSeq(logits, &in, nil)
	// Kept: 2 (3/2) and 0 (1/2) at T = 2.
	z := math.Exp(0) + math.Exp(-1)
	wantTop := []TokenLogprob{{2, float32(-math.Log(z))}, {0, float32(-1 - math.Log(z))}, {4, negInf}, {3, negInf}}
	if diff := cmp.Diff(wantTop, out.Top, cmp.Comparer(func(a, b float32) bool {
		return a == b || math.Abs(float64(a-b)) < 1e-6
	})); diff != "" {
		t.Fatalf("processed top (-want +got):\n%s", diff)
	}
	if out.Token != 2 && out.Token != 0 {
		t.Fatalf("drew %d", out.Token)
	}
}

func TestSampleSeqGreedyTiesAndInf(t *testing.T) {
	logits := []float32{negInf, 2, 5, 5, negInf, 5}
	in := SeqInput{Sampling: SamplingParams{TopLogprobs: 6}}
	out := SampleSeq(logits, &in, nil)
	if out.Token != 2 {
		t.Fatalf("greedy drew %d, want 2 (lowest id of the maxima)", out.Token)
	}
	var ids []int32
	for _, e := range out.Top {
		ids = append(ids, e.ID)
	}
	if want := []int32{2, 3, 5, 1, 0, 4}; !slices.Equal(ids, want) {
		t.Fatalf("top ids %v, want %v (ties by lower id, −∞ last)", ids, want)
	}
	if !math.IsInf(float64(out.Top[5].Logprob), -1) || math.IsInf(float64(out.Top[3].Logprob), 0) {
		t.Fatalf("top logprobs %v", out.Top)
	}
	// A sampled draw never lands on a −∞ token, even when every other is
	// banned.
	for step := range 500 {
		in := SeqInput{Sampling: SamplingParams{Temperature: 1.5, Seed: 3}, Step: step, Ban: []int32{2, 3, 5}}
		if got := SampleSeq(logits, &in, nil).Token; got != 1 {
			t.Fatalf("step %d drew %d, want 1", step, got)
		}
	}
}

func TestSampleSeqForks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	in := SeqInput{Sampling: SamplingParams{Temperature: 1, Seed: 77, TopLogprobs: 2}, Forks: 8, Step: 0}
	var sc SampleScratch
	out := SampleSeq(logits, &in, &sc)
	if len(out.Forks) != 7 {
		t.Fatalf("%d forks, want 7", len(out.Forks))
	}
	if again := SampleSeq(logits, &in, nil); !cmp.Equal(out, again, sameOutput) {
		t.Fatalf("not reproducible:\n%+v\n%+v", out, again)
	}
	// Fork 0 is the plain draw; fork i draws as a request seeded ForkSeed(seed, i).
	one := in
	one.Forks = 0
	if plain := SampleSeq(logits, &one, nil); plain.Token != out.Token || plain.Logprob != out.Logprob {
		t.Fatalf("fork 0 %d, plain draw %d", out.Token, plain.Token)
	}
	distinct := map[int32]bool{out.Token: true}
	for i, f := range out.Forks {
		alone := one
		alone.Sampling.Seed = ForkSeed(in.Sampling.Seed, i+1)
		if a := SampleSeq(logits, &alone, nil); a.Token != f.Token || a.Logprob != f.Logprob || !cmp.Equal(a.Top, f.Top) {
			t.Fatalf("fork %d: %+v, drawn alone %+v", i+1, f, a)
		}
		distinct[f.Token] = true
	}
	if len(distinct) < 6 {
		t.Fatalf("8 forks over 1000 near-flat tokens drew only %d distinct tokens", len(distinct))
	}
	// Each fork's Top is its own.
	out.Forks[0].Top[0].ID = -5
	if out.Top[0].ID == -5 || out.Forks[1].Top[0].ID == -5 {
		t.Fatal("forks share their Top")
	}
}

// randomInput makes a sequence input for a vocabulary of V with every
// sampling field drawn at random, often zero.
func randomInput(rng *rand.Rand, V int) SeqInput {
	pick := func(n int) bool { return rng.IntN(n) == 0 }
	id := func() int32 { return int32(rng.IntN(V+3)) - 1 } // sometimes outside
	ids := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = id()
		}
		return s
	}
	p := SamplingParams{
		Temperature: []float32{0, 0.3, 1, 1, 1.7}[rng.IntN(5)],
		TopP:        []float32{1, 1, 0.95, 0.5, 1e-6}[rng.IntN(5)],
		TopK:        []int{0, 0, 1, 3, V / 16, V/16 + 1, V - 1, V + 5}[rng.IntN(8)],
		Seed:        rng.Uint64(),
	}
	if pick(3) {
		p.MinP = []float32{0.01, 0.1, 0.5, 1}[rng.IntN(4)]
	}
	if pick(3) {
		p.RepetitionPenalty = []float32{0.5, 1, 1.3, 2}[rng.IntN(4)]
	}
	if pick(3) {
		p.FrequencyPenalty = float32(rng.IntN(9)-4) / 2
	}
	if pick(3) {
		p.PresencePenalty = float32(rng.IntN(9)-4) / 2
	}
	if pick(3) {
		for i := range int32(V + 2) {
			if pick(4) {
				p.LogitBias = append(p.LogitBias, LogitBias{ID: i, Bias: float32(rng.NormFloat64() * 5)})
			}
		}
	}
	if pick(5) {
		p.AllowedTokenIDs = ids(1 + rng.IntN(5))
	}
	if pick(4) {
		for range 1 + rng.IntN(4) {
			p.BadWords = append(p.BadWords, ids(1+rng.IntN(3)))
		}
	}
	if pick(2) {
		p.TopLogprobs = []int{1, 5, 20, V, V + 3}[rng.IntN(5)]
	}
	if pick(2) {
		p.LogprobsMode = LogprobsProcessed
	}
	in := SeqInput{Sampling: p, Step: rng.IntN(100), Prompt: ids(rng.IntN(8)), Output: ids(rng.IntN(8))}
	if pick(3) {
		in.Ban = ids(1 + rng.IntN(4))
	}
	if pick(4) {
		in.Ban = nil
		for i := range int32(V) {
			in.Ban = append(in.Ban, i) // everything: ignored
		}
	}
	if pick(3) {
		in.Forks = 1 + rng.IntN(5)
	}
	// Bad words ending with the output's last tokens, so that they bite.
	if len(in.Output) > 1 && pick(2) {
		in.Sampling.BadWords = append(in.Sampling.BadWords, append(slices.Clone(in.Output[len(in.Output)-2:]), id()))
	}
	return in
}

// randomLogits fills a vocabulary of V with spread or near-flat values,
// ties, ±0, small integers and a few −∞.
func randomLogits(rng *rand.Rand, V int) []float32 {
	logits := make([]float32, V)
	scale := []float64{0.01, 1, 5, 30}[rng.IntN(4)]
	for i := range logits {
		switch r := rng.IntN(25); {
		case r == 0 && i > 0:
			logits[i] = logits[rng.IntN(i)]
		case r == 1:
			logits[i] = float32(math.Copysign(0, float64(rng.IntN(2)-1)))
		case r == 2:
			logits[i] = float32(rng.IntN(5))
		case r == 3 && V > 2:
			logits[i] = negInf
		default:
			logits[i] = float32(rng.NormFloat64() * scale)
		}
	}
	if allInf(logits) {
		logits[0] = 0
	}
	return logits
}

// TestSampleSeqMatchesReference compares SampleSeq bit for bit with the
// naive reference over random logits and every sampling field, with and
// without scratch, and checks it leaves the logits and the scratch as they
// were (a second call gives the same result).
func TestSampleSeqMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var sc SampleScratch
	trials := 3000
	if raceEnabled {
		trials = 1000 // 14 s under the race detector otherwise
	}
	for trial := range trials {
		V := []int{1, 2, 5, 17, 300, 2000}[trial%6]
		logits := randomLogits(rng, V)
		in := randomInput(rng, V)
		orig := slices.Clone(logits)
		want := sampleSeqRef(logits, &in)
		got := SampleSeq(logits, &in, &sc)
		if diff := cmp.Diff(want, got, sameOutput); diff != "" {
			t.Fatalf("trial %d V=%d %+v:\n(-ref +got):\n%s", trial, V, in, diff)
		}
		if !slices.Equal(logits, orig) && !slices.EqualFunc(logits, orig, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Fatalf("trial %d: logits modified", trial)
		}
		if trial%7 == 0 {
			if again := SampleSeq(logits, &in, nil); !cmp.Equal(got, again, sameOutput) {
				t.Fatalf("trial %d: without scratch %+v, with %+v", trial, again, got)
			}
		}
	}
	for i, c := range sc.count {
		if c != 0 {
			t.Fatalf("scratch count[%d] = %d after use", i, c)
		}
	}
	if slices.Contains(sc.allowed, true) {
		t.Fatal("scratch allowed flags left set")
	}
}

// FuzzSampleSeq compares SampleSeq with the naive reference on logits and
// sampling fields drawn from the fuzzer's seed (go test -fuzz
// FuzzSampleSeq ./internal/model/).
func FuzzSampleSeq(f *testing.F) {
	for _, s := range [][2]uint64{{0, 1}, {1, 700}, {2, 3}, {99, 16}, {5, 5000}} {
		f.Add(s[0], s[1])
	}
	var sc SampleScratch
	f.Fuzz(func(t *testing.T, seed, size uint64) {
		rng := rand.New(rand.NewPCG(seed, size))
		V := 1 + int(size%5000)
		logits := randomLogits(rng, V)
		in := randomInput(rng, V)
		if diff := cmp.Diff(sampleSeqRef(logits, &in), SampleSeq(logits, &in, &sc), sameOutput); diff != "" {
			t.Fatalf("V=%d %+v:\n(-ref +got):\n%s", V, in, diff)
		}
	})
}

// TestSampleSeqLegacy checks that a request setting none of the new fields
// draws exactly as the reference of Sample before they existed (sampleRef
// of sample_test.go) over vocabularies on both sides of the radix/heap
// boundaries.
func TestSampleSeqLegacy(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	var sc SampleScratch
	for trial := range 400 {
		V := []int{3, 40, 1000, 5000}[trial%4]
		logits := make([]float32, V)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		in := randomInput(rng, V)
		p := SamplingParams{Temperature: in.Sampling.Temperature, TopP: in.Sampling.TopP, TopK: in.Sampling.TopK, Seed: in.Sampling.Seed}
		wt, wl := sampleRef(logits, p, in.Step)
		seq := SeqInput{Sampling: p, Step: in.Step}
		got := SampleSeq(logits, &seq, &sc)
		if got.Token != wt || math.Float32bits(got.Logprob) != math.Float32bits(wl) || got.Top != nil || got.Forks != nil {
			t.Fatalf("trial %d %+v: %+v, legacy (%d, %v)", trial, p, got, wt, wl)
		}
	}
}

func TestScorePosition(t *testing.T) {
	logits := []float32{1, 3, 3, -2, negInf, 3}
	z := refLogSumExp(logits)
	var sc SampleScratch
	for _, tc := range []struct {
		target int32
		rank   int32
	}{{1, 1}, {2, 2}, {5, 3}, {0, 4}, {3, 5}, {4, 6}} {
		top := make([]TokenLogprob, 2)
		got := ScorePosition(logits, tc.target, top, &sc)
		want := PositionLogprobs{Token: TokenLogprob{tc.target, float32(float64(logits[tc.target]) - z)}, Rank: tc.rank,
			Top: []TokenLogprob{{1, float32(3 - z)}, {2, float32(3 - z)}}}
		if diff := cmp.Diff(want, got, sameOutput); diff != "" {
			t.Fatalf("target %d (-want +got):\n%s", tc.target, diff)
		}
	}
	if got := ScorePosition(logits, 6, nil, &sc); !cmp.Equal(got, PositionLogprobs{}) {
		t.Fatalf("target outside the vocabulary: %+v", got)
	}
	// Randomized: rank and top against a full sort; the logprob equals
	// what SampleSeq reports for the same token in raw mode.
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		V := 1 + rng.IntN(500)
		logits := randomLogits(rng, V)
		target := int32(rng.IntN(V))
		n := rng.IntN(min(V, 30) + 1)
		got := ScorePosition(logits, target, make([]TokenLogprob, n), &sc)
		ord := refOrder(logits)
		z := refLogSumExp(logits)
		want := PositionLogprobs{Token: TokenLogprob{target, float32(float64(logits[target]) - z)},
			Rank: int32(slices.Index(ord, target) + 1)}
		for _, id := range ord[:n] {
			want.Top = append(want.Top, TokenLogprob{id, float32(float64(logits[id]) - z)})
		}
		if diff := cmp.Diff(want, got, sameOutput); diff != "" {
			t.Fatalf("trial %d (-want +got):\n%s", trial, diff)
		}
		in := SeqInput{Sampling: SamplingParams{Temperature: 0, AllowedTokenIDs: []int32{target}}}
		if s := SampleSeq(logits, &in, &sc); !math.IsInf(float64(logits[target]), -1) && (s.Token != target || s.Logprob != got.Token.Logprob) {
			t.Fatalf("trial %d: SampleSeq forced to %d gives %+v, score %+v", trial, target, s, got.Token)
		}
	}
}

func TestSampleSeqAllocations(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	logits := make([]float32, 4096)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	hist := make([]int32, 200)
	for i := range hist {
		hist[i] = int32(rng.IntN(len(logits)))
	}
	var sc SampleScratch
	for _, tc := range []struct {
		name   string
		in     SeqInput
		allocs float64
	}{
		{"greedy", SeqInput{}, 0},
		{"sampled", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopP: 0.9}}, 0},
		{"top_k", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopK: 40}}, 0},
		{"processors", SeqInput{Ban: []int32{1, 2}, Prompt: hist, Output: hist[:50], Sampling: SamplingParams{Temperature: 1, MinP: 0.05,
			RepetitionPenalty: 1.2, FrequencyPenalty: 0.5, PresencePenalty: 0.5, LogitBias: []LogitBias{{3, 2}},
			AllowedTokenIDs: hist, BadWords: [][]int32{{5, 6}}, LogprobsMode: LogprobsProcessed}}, 0},
		{"top logprobs", SeqInput{Sampling: SamplingParams{Temperature: 1, TopLogprobs: 20}}, 1},
		{"forks with top logprobs", SeqInput{Forks: 4, Sampling: SamplingParams{Temperature: 1, TopLogprobs: 5}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			SampleSeq(logits, &tc.in, &sc)
			if got := testing.AllocsPerRun(20, func() { SampleSeq(logits, &tc.in, &sc) }); got != tc.allocs {
				t.Fatalf("%v allocations per call, want %v", got, tc.allocs)
			}
		})
	}
	top := make([]TokenLogprob, 5)
	if got := testing.AllocsPerRun(20, func() { ScorePosition(logits, 7, top, &sc) }); got != 0 {
		t.Fatalf("ScorePosition: %v allocations per call", got)
	}
}

// BenchmarkSampleSeq measures one row of a 49152-token vocabulary
// (SmolLM2's): the plain draws, with 20 top logprobs, and with penalties
// over a 512-token history.
func BenchmarkSampleSeq(b *testing.B) {
	const V = 49152
	rng := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	hist := make([]int32, 512)
	for i := range hist {
		hist[i] = int32(rng.IntN(V))
	}
	pen := SamplingParams{RepetitionPenalty: 1.1, FrequencyPenalty: 0.3, PresencePenalty: 0.3}
	for _, c := range []struct {
		name string
		in   SeqInput
	}{
		{"greedy", SeqInput{}},
		{"greedy-top20", SeqInput{Sampling: SamplingParams{TopLogprobs: 20}}},
		{"greedy-penalties", SeqInput{Sampling: pen, Prompt: hist[:256], Output: hist[256:]}},
		{"topP0.9", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopP: 0.9}}},
		{"topP0.9-top20", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopP: 0.9, TopLogprobs: 20}}},
		{"topP0.9-processed-top20", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopP: 0.9, TopLogprobs: 20, LogprobsMode: LogprobsProcessed}}},
		{"topP0.9-penalties", SeqInput{Sampling: SamplingParams{Temperature: 0.8, TopP: 0.9,
			RepetitionPenalty: 1.1, FrequencyPenalty: 0.3, PresencePenalty: 0.3}, Prompt: hist[:256], Output: hist[256:]}},
		{"minP0.05", SeqInput{Sampling: SamplingParams{Temperature: 0.8, MinP: 0.05}}},
		{"topK40-forks8", SeqInput{Forks: 8, Sampling: SamplingParams{Temperature: 0.8, TopK: 40}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var sc SampleScratch
			in := c.in
			for i := range b.N {
				in.Step = i
				SampleSeq(logits, &in, &sc)
			}
		})
	}
	b.Run("score-top1", func(b *testing.B) {
		var sc SampleScratch
		top := make([]TokenLogprob, 1)
		for i := range b.N {
			ScorePosition(logits, int32(i%V), top, &sc)
		}
	})
}

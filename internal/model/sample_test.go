package model

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestSampleGreedyAndLogprob(t *testing.T) {
	logits := []float32{1, 3, 3, -2}
	tok, lp := Sample(logits, SamplingParams{TopP: 1}, 0, nil)
	if tok != 1 {
		t.Fatalf("greedy picked %d, want the lowest id among the maxima (1)", tok)
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	if want := 3 - math.Log(z); math.Abs(float64(lp)-want) > 1e-6 {
		t.Fatalf("logprob %v, want %v", lp, want)
	}
}

func TestSampleDeterministicAndDistributed(t *testing.T) {
	logits := []float32{0, 1, 2, 0.5}
	p := SamplingParams{Temperature: 1, TopP: 1, Seed: 42}
	counts := make([]int, len(logits))
	for step := 0; step < 20000; step++ {
		a, _ := Sample(logits, p, step, nil)
		b, _ := Sample(logits, p, step, nil)
		if a != b {
			t.Fatalf("step %d: %d then %d for the same seed", step, a, b)
		}
		counts[a]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	for i, c := range counts {
		want := math.Exp(float64(logits[i])) / z
		if got := float64(c) / 20000; math.Abs(got-want) > 0.02 {
			t.Fatalf("token %d drawn %.3f of the time, want %.3f", i, got, want)
		}
	}
	// top_p keeps only the smallest set reaching p: here token 2 alone.
	for step := 0; step < 1000; step++ {
		if tok, _ := Sample(logits, SamplingParams{Temperature: 1, TopP: 0.5, Seed: 1}, step, nil); tok != 2 {
			t.Fatalf("top_p 0.5 drew %d", tok)
		}
	}
	// top_k 2 keeps tokens 2 and 1.
	for step := 0; step < 1000; step++ {
		if tok, _ := Sample(logits, SamplingParams{Temperature: 1, TopP: 1, TopK: 2, Seed: 1}, step, nil); tok != 2 && tok != 1 {
			t.Fatalf("top_k 2 drew %d", tok)
		}
	}
}

// sampleRef is Sample as it was before the partial sort (a full sort.Slice
// of the vocabulary): the reference that Sample must match bit for bit.
func sampleRef(logits []float32, p SamplingParams, step int) (int32, float32) {
	if len(logits) == 0 {
		return 0, 0
	}
	maxI := 0
	for i, l := range logits {
		if l > logits[maxI] {
			maxI = i
		}
	}
	maxL := float64(logits[maxI])
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - maxL)
	}
	logZ := maxL + math.Log(sum)
	logprob := func(i int) float32 { return float32(float64(logits[i]) - logZ) }
	if p.Temperature == 0 {
		return int32(maxI), logprob(maxI)
	}
	idx := make([]int32, 0, len(logits))
	for i := range logits {
		idx = append(idx, int32(i))
	}
	sort.Slice(idx, func(a, b int) bool {
		la, lb := logits[idx[a]], logits[idx[b]]
		if la != lb {
			return la > lb
		}
		return idx[a] < idx[b]
	})
	if p.TopK > 0 && p.TopK < len(idx) {
		idx = idx[:p.TopK]
	}
	t := float64(p.Temperature)
	probs := make([]float64, len(idx))
	var z float64
	for i, id := range idx {
		probs[i] = math.Exp((float64(logits[id]) - maxL) / t)
		z += probs[i]
	}
	topP := float64(p.TopP)
	if topP <= 0 || topP > 1 {
		topP = 1
	}
	keep, cum := len(idx), 0.0
	for i := range probs {
		cum += probs[i] / z
		if cum >= topP {
			keep = i + 1
			break
		}
	}
	var zk float64
	for i := range keep {
		zk += probs[i]
	}
	u := Uniform(p.Seed, step) * zk
	for i := range keep {
		u -= probs[i]
		if u < 0 {
			return idx[i], logprob(int(idx[i]))
		}
	}
	return idx[keep-1], logprob(int(idx[keep-1]))
}

// TestSampleMatchesFullSort checks that Sample picks exactly the token (and
// log-probability) of the full-sort reference for random logits — spread
// out or nearly flat, with ties, ±0 and a few huge values — and every
// combination of temperature, top-p and top-k, including top-k across the
// heap/radix boundary and top-p values hit exactly.
func TestSampleMatchesFullSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 14))
	scratch := new(SampleScratch)
	for trial := range 20 {
		n := []int{1, 2, 17, 300, 3000}[trial%5]
		logits := make([]float32, n)
		scale := []float64{0.01, 1, 5, 30}[rng.IntN(4)]
		for i := range logits {
			switch r := rng.IntN(20); {
			case r == 0 && i > 0:
				logits[i] = logits[rng.IntN(i)] // a tie
			case r == 1:
				logits[i] = float32(math.Copysign(0, float64(rng.IntN(2)-1)))
			case r == 2:
				logits[i] = float32(rng.IntN(5)) // small integers: many ties
			default:
				logits[i] = float32(rng.NormFloat64() * scale)
			}
		}
		for _, temp := range []float32{0, 0.3, 1, 1.7} {
			for _, topP := range []float32{1, 0.999, 0.9, 0.5, 1e-6} {
				for _, topK := range []int{0, 1, 3, n / 16, n/16 + 1, n - 1, n + 5} {
					p := SamplingParams{Temperature: temp, TopP: topP, TopK: topK, Seed: uint64(trial)}
					step := trial + topK
					wt, wl := sampleRef(logits, p, step)
					gt, gl := Sample(logits, p, step, scratch)
					if gt != wt || math.Float32bits(gl) != math.Float32bits(wl) {
						t.Fatalf("trial %d n=%d %+v step %d: Sample = (%d, %v), reference (%d, %v)", trial, n, p, step, gt, gl, wt, wl)
					}
					if trial%5 == 0 {
						if gt2, _ := Sample(logits, p, step, nil); gt2 != gt {
							t.Fatalf("without scratch: %d, with: %d", gt2, gt)
						}
					}
				}
			}
		}
	}
}

// BenchmarkSample measures one draw over a 128K vocabulary.
func BenchmarkSample(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, 128256)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	scratch := new(SampleScratch)
	for _, c := range []struct {
		name string
		p    SamplingParams
	}{
		{"greedy", SamplingParams{TopP: 1}},
		{"topP0.9", SamplingParams{Temperature: 0.8, TopP: 0.9}},
		{"topK40", SamplingParams{Temperature: 0.8, TopP: 0.95, TopK: 40}},
		{"full", SamplingParams{Temperature: 1, TopP: 1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := range b.N {
				Sample(logits, c.p, i, scratch)
			}
		})
		b.Run(c.name+"-fullsort", func(b *testing.B) {
			for i := range b.N {
				sampleRef(logits, c.p, i)
			}
		})
	}
}

func TestSampleBan(t *testing.T) {
	logprob := func(logits []float32, i int32) float64 {
		var z float64
		for _, l := range logits {
			z += math.Exp(float64(l))
		}
		return float64(logits[i]) - math.Log(z)
	}
	logits := []float32{1, 3, 3, -2}
	tok, lp := SampleBan(logits, SamplingParams{TopP: 1}, []int32{1, 2, 99, -1}, 0, nil)
	if tok != 0 {
		t.Fatalf("greedy with 1 and 2 banned picked %d, want 0", tok)
	}
	if want := logprob(logits, 0); math.Abs(float64(lp)-want) > 1e-6 {
		t.Fatalf("logprob %v, want %v (under the unmodified logits)", lp, want)
	}
	if logits[1] != 3 || logits[2] != 3 {
		t.Fatalf("SampleBan changed its input: %v", logits)
	}

	rng := rand.New(rand.NewPCG(7, 8))
	var sc SampleScratch
	for trial := range 300 {
		v := make([]float32, 1+rng.IntN(300))
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 3)
		}
		p := SamplingParams{Temperature: []float32{0, 0.7, 1, 1.5}[trial%4], TopP: []float32{1, 0.9, 0.3}[trial%3],
			TopK: []int{0, 5, 40}[trial%3], Seed: rng.Uint64()}
		ban := []int32{int32(rng.IntN(len(v))), int32(rng.IntN(len(v)))}
		masked := append([]float32(nil), v...)
		for _, id := range ban {
			masked[id] = float32(math.Inf(-1))
		}
		all := make([]int32, len(v))
		for i := range all {
			all[i] = int32(i)
		}
		for step := range 20 {
			got, lp := SampleBan(v, p, ban, step, &sc)
			if got == ban[0] || got == ban[1] {
				if !allInf(masked) {
					t.Fatalf("trial %d step %d: drew banned token %d (ban %v)", trial, step, got, ban)
				}
			}
			if !allInf(masked) {
				if want, _ := Sample(masked, p, step, nil); got != want {
					t.Fatalf("trial %d step %d: SampleBan drew %d, Sample over the masked logits %d", trial, step, got, want)
				}
			}
			if want := logprob(v, got); math.Abs(float64(lp)-want) > 1e-4 {
				t.Fatalf("trial %d step %d: logprob %v, want %v", trial, step, lp, want)
			}
			// No ban, or one that would leave nothing, draws as Sample.
			a, la := SampleBan(v, p, nil, step, &sc)
			b, lb := Sample(v, p, step, nil)
			c, lc := SampleBan(v, p, all, step, &sc)
			if a != b || la != lb || c != b || lc != lb {
				t.Fatalf("trial %d step %d: no ban %d/%v, Sample %d/%v, everything banned %d/%v", trial, step, a, la, b, lb, c, lc)
			}
		}
	}
}

// allInf reports whether every logit is −∞.
func allInf(v []float32) bool {
	for _, l := range v {
		if !math.IsInf(float64(l), -1) {
			return false
		}
	}
	return true
}

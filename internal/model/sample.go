package model

import (
	"fmt"
	"math"
	"sort"
)

// SamplingParams controls token choice.
type SamplingParams struct {
	// Temperature 0 means greedy (argmax).
	Temperature float32
	// TopP in (0, 1]; 1 keeps every token.
	TopP float32
	// TopK ≤ 0 keeps every token.
	TopK int
	// Seed keys the randomness; with Step it fully determines the draw.
	Seed uint64
}

// Validate reports parameters out of range, naming the parameter.
func (p SamplingParams) Validate() error {
	switch {
	case math.IsNaN(float64(p.Temperature)) || p.Temperature < 0 || p.Temperature > 100:
		return fmt.Errorf("temperature must be in [0, 100], got %v", p.Temperature)
	case math.IsNaN(float64(p.TopP)) || p.TopP <= 0 || p.TopP > 1:
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	}
	return nil
}

// splitmix64 is Steele, Lea and Flood's SplitMix64 finalizer ("Fast
// splittable pseudorandom number generators", OOPSLA 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Uniform returns the draw in [0, 1) for (seed, step): the same on every
// worker, so prefill (step 0) and decode (steps ≥ 1) sample exactly as a
// colocated worker does.
func Uniform(seed uint64, step int) float64 {
	return float64(splitmix64(seed^splitmix64(uint64(step)+1))>>11) / (1 << 53)
}

// Sample picks a token from logits ([vocab] float32) and returns it with its
// log-probability under softmax(logits). scratch, if it has room for
// len(logits) entries, is used to avoid allocation.
//
// Greedy (Temperature 0) returns the lowest id among equal maxima. Otherwise
// it applies temperature, keeps the TopK most likely tokens, then the
// smallest set whose probability reaches TopP, and inverts the CDF at
// Uniform(Seed, step) over ids sorted by probability (ties by id).
func Sample(logits []float32, p SamplingParams, step int, scratch []int32) (int32, float32) {
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
	idx := scratch[:0]
	if cap(idx) < len(logits) {
		idx = make([]int32, 0, len(logits))
	}
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

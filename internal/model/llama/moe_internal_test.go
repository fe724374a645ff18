package llama

import (
	"math"
	"testing"
)

// TestRoute checks the router's choice and weights against values worked
// out by hand: the largest probabilities in rank order, ties to the lower
// index, renormalised only with norm. (llama.cpp's clamp of the sum at
// 2⁻¹⁴ never applies to softmax probabilities: the top k of E sum to at
// least k/E ≥ 1/512.)
func TestRoute(t *testing.T) {
	// Logits ln 1, ln 2, ln 4, ln 2, ln 1: probabilities 0.1, 0.2, 0.4, 0.2, 0.1.
	logits := func() []float32 {
		return []float32{0, float32(math.Ln2), float32(2 * math.Ln2), float32(math.Ln2), 0}
	}
	for _, c := range []struct {
		k     int
		norm  bool
		sel   []int32
		wt    []float64
		probs []float64
	}{
		{1, false, []int32{2}, []float64{0.4}, nil},
		{2, false, []int32{2, 1}, []float64{0.4, 0.2}, nil},
		{3, true, []int32{2, 1, 3}, []float64{0.5, 0.25, 0.25}, nil},
		{5, true, []int32{2, 1, 3, 0, 4}, []float64{0.4, 0.2, 0.2, 0.1, 0.1}, []float64{0.1, 0.2, 0.4, 0.2, 0.1}},
	} {
		l := logits()
		sel, wt := make([]int32, c.k), make([]float32, c.k)
		route(l, sel, wt, c.norm)
		for i := range sel {
			if sel[i] != c.sel[i] || math.Abs(float64(wt[i])-c.wt[i]) > 1e-6 {
				t.Fatalf("k %d norm %v: experts %v weights %v, want %v %v", c.k, c.norm, sel, wt, c.sel, c.wt)
			}
		}
		for i, p := range c.probs {
			if math.Abs(float64(l[i])-p) > 1e-6 {
				t.Fatalf("probabilities %v, want %v", l, c.probs)
			}
		}
	}
}

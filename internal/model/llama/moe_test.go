package llama_test

import (
	"fmt"
	"math"
	"sort"
)

// moe is transformers' Qwen3MoeSparseMoeBlock in float64 for one token's
// normalised input h (layer prefix p): the softmax of the router logits,
// the top ExpertsUsed experts (divided by their sum with norm_topk_prob),
// and the weighted sum of their SwiGLU outputs.
func (r *refModel) moe(p string, h []float64) []float64 {
	s := r.spec
	logits := r.linear(p+"mlp.gate", h, s.Experts, false)
	m := math.Inf(-1)
	for _, l := range logits {
		m = math.Max(m, l)
	}
	var z float64
	prob := make([]float64, len(logits))
	for i, l := range logits {
		prob[i] = math.Exp(l - m)
		z += prob[i]
	}
	idx := make([]int, len(prob))
	for i := range idx {
		prob[i] /= z
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return prob[idx[a]] > prob[idx[b]] })
	top := idx[:s.ExpertsUsed]
	var sum float64
	for _, e := range top {
		sum += prob[e]
	}
	out := make([]float64, s.Hidden)
	for _, e := range top {
		w := prob[e]
		if s.NormTopK {
			w /= sum
		}
		ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
		gt := r.linear(ep+"gate_proj", h, s.ExpertIntermediate, false)
		up := r.linear(ep+"up_proj", h, s.ExpertIntermediate, false)
		for i := range gt {
			gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
		}
		for i, v := range r.linear(ep+"down_proj", gt, s.Hidden, false) {
			out[i] += w * v
		}
	}
	return out
}

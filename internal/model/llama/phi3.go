package llama

import (
	"errors"
	"fmt"
	"math"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// phi3Config fills the Phi3 fields of c from r (transformers' Phi3Config
// and modeling_phi3.py): the Llama forward with q, k and v computed by one
// fused projection (qkv_proj [heads·hd + 2·kvHeads·hd, hidden], rows q
// then k then v) and gate and up by another (gate_up_proj
// [2·intermediate, hidden], gate rows first), no biases, SiLU. It returns an
// error for a partial_rotary_factor other than 1 (Phi-4-mini's partial
// RoPE is not supported); rope_scaling "longrope" is refused by
// parseRopeScaling. A sliding_window caps the context as Mistral's does.
func phi3Config(c *Config, r *rawConfig) error {
	if r.PartialRotary != nil && *r.PartialRotary != 1 {
		return fmt.Errorf("partial_rotary_factor %v is not supported (Phi3 with partial rotary embeddings)", *r.PartialRotary)
	}
	if r.AttentionBias != nil && *r.AttentionBias {
		return errors.New("attention_bias is not supported for Phi3")
	}
	if r.SlidingWindow != nil {
		c.SlidingWindow = *r.SlidingWindow
	}
	return nil
}

// ggufPhi3 sets the Phi3 fields of c as llama.cpp's phi3 reads them
// (src/models/phi3.cpp): phi3.attention.sliding_window is ignored (llama.cpp
// disables Phi3's sliding window), the queries are scaled by
// 1/√head_dim before q·k (as ggml_scale there), and LongRoPE
// (rope_factors_long and rope_factors_short tensors) is refused: only
// plain RoPE is supported.
func ggufPhi3(f *gguf.File, c *Config) error {
	c.SlidingWindow = 0
	c.QueryScale = float64(1 / float32(math.Sqrt(float64(float32(c.HeadDim)))))
	for _, n := range []string{"rope_factors_long.weight", "rope_factors_short.weight"} {
		if _, ok := f.Tensor(n); ok {
			return fmt.Errorf("the file has %s: Phi3's LongRoPE scaling is not supported", n)
		}
	}
	return nil
}

// rowRange returns rows [r0, r1) of matrix t as a matrix named name (a
// view of t's data, no copy): the parts of a fused projection.
func rowRange(t *tensor, name string, r0, r1 int) *tensor {
	c := t.Cols()
	out := &tensor{Name: name, DType: t.DType, Quant: t.Quant, Shape: []int{r1 - r0, c}, rowBytes: t.rowBytes}
	switch {
	case t.quantized():
		out.q = t.q[r0*t.rowBytes : r1*t.rowBytes : r1*t.rowBytes]
	case t.DType == F32:
		out.f32 = t.f32[r0*c : r1*c : r1*c]
	default:
		out.u16 = t.u16[r0*c : r1*c : r1*c]
	}
	return out
}

// splitRows splits matrix t into consecutive row blocks of the given
// heights (which sum to t.Rows()), named t.Name plus suffix.
func splitRows(t *tensor, heights []int, suffixes []string) []*tensor {
	out := make([]*tensor, len(heights))
	r := 0
	for i, h := range heights {
		out[i] = rowRange(t, t.Name+suffixes[i], r, r+h)
		r += h
	}
	return out
}

// concatRows returns the matrices ts (same columns and element type, not
// quantized: a checkpoint's) stacked by rows into one new matrix: Phi3's
// fused projections as llama.cpp's converter writes them.
func concatRows(ts ...*tensor) *tensor {
	out := &tensor{Name: ts[0].Name, DType: ts[0].DType, Shape: []int{0, ts[0].Cols()}}
	for _, t := range ts {
		out.Shape[0] += t.Rows()
		out.f32 = append(out.f32, t.f32...)
		out.u16 = append(out.u16, t.u16...)
	}
	return out
}

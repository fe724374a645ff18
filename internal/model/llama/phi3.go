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
// error for attention_bias; rope_scaling "longrope" is read by hfLongRope
// and partial_rotary_factor (Phi-4-mini's 0.75) by ParseConfig, once the
// head dimension is known. A sliding_window caps the context as Mistral's
// does.
func phi3Config(c *Config, r *rawConfig) error {
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
// disables Phi3's sliding window), the queries are scaled by 1/√head_dim
// before q·k (as ggml_scale there), and for LongRoPE (whose factors
// phi3LongRope reads) phi3.rope.scaling.attn_factor (default 1) and
// phi3.rope.scaling.original_context_length (default context_length, as
// llama.cpp's n_ctx_orig_yarn).
func ggufPhi3(f *gguf.File, c *Config) error {
	c.SlidingWindow = 0
	c.QueryScale = float64(1 / float32(math.Sqrt(float64(float32(c.HeadDim)))))
	c.RopeAttnFactor, c.RopeOrigPositions = 1, c.MaxPositions
	if v, ok, err := f.Float("phi3.rope.scaling.attn_factor"); err != nil {
		return err
	} else if ok {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("phi3.rope.scaling.attn_factor is %v, want a positive number", v)
		}
		c.RopeAttnFactor = v
	}
	if v, ok, err := f.Uint("phi3.rope.scaling.original_context_length"); err != nil {
		return err
	} else if ok {
		if v == 0 || v > 1<<30 {
			return fmt.Errorf("phi3.rope.scaling.original_context_length is %d, want 1 to %d", v, 1<<30)
		}
		c.RopeOrigPositions = int(v)
	}
	return nil
}

// phi3LongRope reads a phi3 file's LongRoPE factors, rope_factors_long and
// rope_factors_short ([head_dim/2] each, positive; both or neither), into
// w.cfg through vec (fromGGUF's optional-vector reader).
func (w *weights) phi3LongRope(f *gguf.File, vec func(name string, n int, optional bool) ([]float32, error)) error {
	cfg := &w.cfg
	var fs [2][]float64
	for i, n := range []string{"rope_factors_long.weight", "rope_factors_short.weight"} {
		v, err := vec(n, cfg.ropeDims()/2, true)
		if err != nil {
			return err
		}
		if v == nil {
			continue
		}
		fs[i] = make([]float64, len(v))
		for j, x := range v {
			if !(x > 0) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("tensor %q holds %v, want positive factors", n, x)
			}
			fs[i][j] = float64(x)
		}
	}
	if (fs[0] == nil) != (fs[1] == nil) {
		return errors.New("the file has only one of rope_factors_long and rope_factors_short")
	}
	cfg.RopeLongFactors, cfg.RopeShortFactors = fs[0], fs[1]
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

// hfLongRope moves a config.json's "longrope" rope_scaling into c's
// LongRoPE fields (Phi3 only): original_max_position_embeddings (top level,
// as Phi3Config has it, or inside rope_scaling) is required, each factor
// list must have head_dim/2 positive values, and the attention factor is
// transformers' _compute_longrope_parameters: √(1 + ln(s)/ln(original)),
// s = max_position_embeddings/original, 1 when s ≤ 1.
func hfLongRope(c *Config, r *rawConfig) error {
	s := c.RopeScaling
	if c.Architecture != archPhi3 {
		return fmt.Errorf("rope_scaling: longrope is supported for Phi3ForCausalLM only, not %s", c.Architecture)
	}
	orig := s.OriginalMaxPositions
	if r.OrigMaxPositions != nil {
		orig = *r.OrigMaxPositions
	}
	if orig <= 0 {
		return errors.New("rope_scaling: longrope needs a positive original_max_position_embeddings")
	}
	long, err := ropeFactorList("long_factor", s.LongFactor, c.ropeDims()/2)
	if err != nil {
		return err
	}
	short, err := ropeFactorList("short_factor", s.ShortFactor, c.ropeDims()/2)
	if err != nil {
		return err
	}
	c.RopeLongFactors, c.RopeShortFactors, c.RopeOrigPositions = long, short, orig
	c.RopeAttnFactor = 1
	if f := float64(c.MaxPositions) / float64(orig); f > 1 {
		c.RopeAttnFactor = math.Sqrt(1 + math.Log(f)/math.Log(float64(orig)))
	}
	c.RopeScaling = nil
	return nil
}

// ropeFactorList checks a LongRoPE factor list: n positive finite values.
func ropeFactorList(name string, v []float64, n int) ([]float64, error) {
	if len(v) != n {
		return nil, fmt.Errorf("rope_scaling: %s has %d values, want one per rotated pair, %d", name, len(v), n)
	}
	for _, x := range v {
		if !(x > 0) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("rope_scaling: %s holds %v, want positive factors", name, x)
		}
	}
	return append([]float64(nil), v...), nil
}

// globalRope returns the RoPE configuration the model rotates its (global)
// layers with for a context of ctxLen positions, and the scale of cos and
// sin: cfg and 1, or for LongRoPE a copy of cfg whose RopeFactors are the
// long factors if ctxLen > RopeOrigPositions, else the short ones, with
// RopeAttnFactor (llama.cpp's get_rope_factors, chosen by the context
// size), and whether the long ones were chosen.
func globalRope(cfg *Config, ctxLen int) (rc *Config, mscale float32, long bool) {
	if cfg.RopeLongFactors == nil {
		return cfg, 1, false
	}
	c := *cfg
	long = ctxLen > cfg.RopeOrigPositions
	c.RopeFactors = cfg.RopeShortFactors
	if long {
		c.RopeFactors = cfg.RopeLongFactors
	}
	mscale = 1
	if cfg.RopeAttnFactor != 0 {
		mscale = float32(cfg.RopeAttnFactor)
	}
	return &c, mscale, long
}

// f32s converts v to float32.
func f32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

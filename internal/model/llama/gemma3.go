package llama

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// maxLayers bounds a configuration's layer count (as ggufConfig does).
const maxLayers = 4096

// swaPattern returns which of n layers slide for llama.cpp's
// sliding_window_pattern period (llama_hparams::set_swa_pattern): layer i
// slides unless it is the last of its group of period layers,
// i mod period < period−1 (0: every layer slides; 1: none). Gemma2 uses
// period 2 (even layers slide), Gemma3 period 6 (layers 5, 11, … are
// global), as transformers' layer_types for them.
func swaPattern(n, period int) []bool {
	s := make([]bool, n)
	for i := range s {
		s[i] = period == 0 || i%period < period-1
	}
	return s
}

// hfSlidingLayers reads which layers of a config.json slide: layer_types
// ("sliding_attention" or "full_attention" per layer) if present, else
// swaPattern of sliding_window_pattern (def if absent). It returns nil for
// a layer count out of range (ParseConfig refuses it), and an error for a
// layer_types list of the wrong length or with another entry, or a
// sliding_window_pattern below 1.
func hfSlidingLayers(r *rawConfig, def int) ([]bool, error) {
	n := r.NumHiddenLayers
	if n <= 0 || n > maxLayers {
		return nil, nil
	}
	if r.LayerTypes != nil {
		if len(r.LayerTypes) != n {
			return nil, fmt.Errorf("layer_types has %d entries for %d layers", len(r.LayerTypes), n)
		}
		s := make([]bool, n)
		for i, t := range r.LayerTypes {
			switch t {
			case "sliding_attention":
				s[i] = true
			case "full_attention":
			default:
				return nil, fmt.Errorf("layer_types[%d] is %q; want sliding_attention or full_attention", i, t)
			}
		}
		return s, nil
	}
	period := def
	if r.SlidingPattern != nil {
		period = *r.SlidingPattern
	}
	if period < 1 {
		return nil, fmt.Errorf("sliding_window_pattern must be at least 1, got %d", period)
	}
	return swaPattern(n, period), nil
}

// gemma3Config fills the Gemma3 fields of c from r (transformers'
// Gemma3TextConfig and modeling_gemma3.py: Gemma3ForCausalLM, the text
// model): as Gemma2 (√hidden embedding scale, GeGLU with
// gelu_pytorch_tanh, post-norms, RMSNorm gains applied as 1 + w,
// query_pre_attn_scalar^−½ as the attention scale) plus per-head q and k
// RMSNorm (q_norm, k_norm [head_dim], also 1 + w), and with Gemma3's
// defaults: head_dim 256, query_pre_attn_scalar 256, rope_theta 1e6 for the
// global layers and rope_local_base_freq 10000 (without rope_scaling) for
// the sliding ones, sliding_window 4096 in five of every six layers
// (sliding_window_pattern 6, or layer_types), no soft-capping unless
// attn_logit_softcapping or final_logit_softcapping is set, tied
// embeddings.
func gemma3Config(c *Config, r *rawConfig) error {
	if err := gemmaBase(c, r, "Gemma3"); err != nil {
		return err
	}
	c.QKNorm = true
	if r.RopeTheta == nil {
		th := 1e6
		r.RopeTheta = &th
	}
	c.RopeThetaLocal = 10000
	if r.RopeLocalBase != nil {
		c.RopeThetaLocal = *r.RopeLocalBase
		if !(c.RopeThetaLocal > 0) {
			return fmt.Errorf("rope_local_base_freq must be positive, got %v", c.RopeThetaLocal)
		}
	}
	// Gemma3TextConfig: sliding_window_pattern 6, no soft-capping by default.
	return gemmaAttention(c, r, 6, 0, 0)
}

// ggufGemma3 sets the Gemma3 fields of c as llama.cpp's gemma3 reads them
// (src/models/gemma3.cpp, llama_model_gemma3::load_arch_hparams): the
// Gemma2 forward without attention soft-capping, with per-head q and k
// RMSNorm; a sliding window only if gemma3.attention.sliding_window is
// present and positive, then in the layers of swaPattern with period
// gemma3.attention.sliding_window_pattern (default 6), whose RoPE base is
// gemma3.rope.freq_base_swa (default 10000, llama_hparams'
// rope_freq_base_train_swa) without the linear rope scaling; the final
// logits soft-capped only if gemma3.final_logit_softcapping is set; the
// attention scale 1/√head_dim, or 1/√(embedding_length/head_count) for the
// 62-layer 27B model (llama.cpp's rule, from gemma_pytorch's config). The
// RMSNorm gains are read as stored (the converter added 1).
//
// With f nil it only derives the attention scale (gemma3Exportable).
func ggufGemma3(f *gguf.File, c *Config) error {
	c.EmbedScale, c.GeluTanh, c.PostNorms, c.QKNorm = true, true, true, true
	d := c.HeadDim
	if c.Layers == 62 {
		d = c.HiddenSize / c.Heads
	}
	c.QueryScale = float64(1 / float32(math.Sqrt(float64(float32(d)))))
	if f == nil {
		return nil
	}
	window, ok, err := f.Uint("gemma3.attention.sliding_window")
	if err != nil {
		return err
	}
	c.SlidingWindow = 0
	if ok && window > 0 {
		if window > 1<<30 {
			return fmt.Errorf("gemma3.attention.sliding_window is %d, want at most %d", window, 1<<30)
		}
		period, _, err := f.Uint("gemma3.attention.sliding_window_pattern")
		if err != nil {
			return err
		}
		if _, has := f.Value("gemma3.attention.sliding_window_pattern"); !has {
			period = 6
		}
		if period > maxLayers {
			return fmt.Errorf("gemma3.attention.sliding_window_pattern is %d, want at most %d", period, maxLayers)
		}
		c.SlidingWindow = int(window)
		c.SlidingLayers = swaPattern(c.Layers, int(period))
		c.RopeThetaLocal = 10000
		if th, ok, err := f.Float("gemma3.rope.freq_base_swa"); err != nil {
			return err
		} else if ok {
			if !(th > 0) || math.IsInf(th, 0) {
				return fmt.Errorf("gemma3.rope.freq_base_swa is %v, want a positive number", th)
			}
			c.RopeThetaLocal = th
		}
	}
	if v, ok, err := f.Float("gemma3.final_logit_softcapping"); err != nil {
		return err
	} else if ok && v != 0 {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("gemma3.final_logit_softcapping is %v, want a positive number", v)
		}
		c.FinalSoftcap = v
	}
	return nil
}

// gemma3Exportable says why a Gemma3 configuration cannot be written for
// llama.cpp's gemma3 (nil if it can): llama.cpp has no attention
// soft-capping for it, reads the sliding pattern as a period (so the
// layers must follow swaPattern of some period), and derives the attention
// scale from the shape (see ggufGemma3) rather than reading
// query_pre_attn_scalar. period is the sliding_window_pattern to write (0:
// no sliding window).
func gemma3Exportable(cfg *Config) (period int, err error) {
	if cfg.AttnSoftcap != 0 {
		return 0, errors.New("llama: WriteGGUF: llama.cpp's gemma3 has no attention soft-capping; the checkpoint sets attn_logit_softcapping")
	}
	want := *cfg
	want.GGMLNumerics = true
	if err := ggufGemma3(nil, &want); err != nil {
		return 0, err
	}
	if float32(want.QueryScale) != float32(cfg.QueryScale) {
		return 0, fmt.Errorf("llama: WriteGGUF: query_pre_attn_scalar gives the attention scale %v, llama.cpp's gemma3 would use %v", cfg.QueryScale, want.QueryScale)
	}
	return slidingPeriod(cfg)
}

// localRope returns the RoPE configuration of cfg's sliding layers when it
// differs from the global layers' (RopeThetaLocal set): cfg with that base
// and without rope scaling or factors (llama.cpp's gemma3 rotates them with
// rope_freq_base_train_swa, rope_freq_scale_train_swa = 1 and no factors).
// Otherwise nil.
func localRope(cfg *Config) *Config {
	if cfg.RopeThetaLocal == 0 || cfg.SlidingLayers == nil {
		return nil
	}
	l := *cfg
	l.RopeTheta, l.RopeScaling, l.RopeFactors = cfg.RopeThetaLocal, nil, nil
	return &l
}

// slidingPeriod returns the sliding_window_pattern period whose swaPattern
// is cfg.SlidingLayers (0 if there are none), or an error if no period
// gives it.
func slidingPeriod(cfg *Config) (int, error) {
	if cfg.SlidingLayers == nil {
		return 0, nil
	}
	for p := 1; p <= cfg.Layers+1; p++ {
		if slices.Equal(swaPattern(cfg.Layers, p), cfg.SlidingLayers) {
			return p, nil
		}
	}
	return 0, errors.New("llama: WriteGGUF: the sliding layers follow no period llama.cpp's sliding_window_pattern can express")
}

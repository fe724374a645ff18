package llama

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// Config is the model configuration read from a Hugging Face config.json
// (field names as in transformers' LlamaConfig, Qwen2Config, Qwen3Config,
// Qwen3MoeConfig, MistralConfig, MixtralConfig, Gemma2Config,
// Gemma3TextConfig and Phi3Config).
type Config struct {
	// Architecture is architectures[0], e.g. "LlamaForCausalLM".
	Architecture string
	// HiddenSize is the residual stream width (hidden_size).
	HiddenSize int
	// IntermediateSize is the MLP width (intermediate_size).
	IntermediateSize int
	// Layers is num_hidden_layers.
	Layers int
	// Heads is num_attention_heads (query heads).
	Heads int
	// KVHeads is num_key_value_heads (defaults to Heads); query head h reads
	// KV head h / (Heads/KVHeads) (grouped-query attention, Ainslie et al.
	// 2023).
	KVHeads int
	// HeadDim is head_dim (defaults to HiddenSize/Heads; to 128 for Qwen3
	// and 256 for Gemma2, as in transformers' Qwen3Config and Gemma2Config).
	HeadDim int
	// RMSNormEps is rms_norm_eps, the ε inside RMSNorm's square root.
	RMSNormEps float64
	// RopeTheta is rope_theta, the RoPE base (default 10000).
	RopeTheta float64
	// RopeScaling is rope_scaling; nil means none.
	RopeScaling *RopeScaling
	// TieEmbeddings is tie_word_embeddings: the classifier is the token
	// embedding matrix.
	TieEmbeddings bool
	// VocabSize is vocab_size, the embedding rows.
	VocabSize int
	// MaxPositions is max_position_embeddings.
	MaxPositions int
	// SlidingWindow is the attention window when the configuration enables
	// one (Mistral's sliding_window, Qwen2's with use_sliding_window,
	// Gemma2's and Gemma3's), else 0. With SlidingLayers nil (a window in
	// every layer) the model caps its context length at the window, so the
	// window never cuts anything off.
	SlidingWindow int
	// SlidingLayers, if not nil, says for each layer ([Layers]) whether it
	// attends through the sliding window: the token at position p sees
	// positions max(0, p−SlidingWindow+1) … p (llama.cpp's
	// LLAMA_SWA_TYPE_STANDARD mask; transformers' sliding_window mask),
	// and the other layers see the whole context, which is then not capped.
	// Gemma2 slides in every other layer, the first included (llama.cpp's
	// sliding_window_pattern 2); Gemma3 in five of every six (pattern 6):
	// see swaPattern.
	SlidingLayers []bool
	// RopeThetaLocal, if not 0, is the RoPE base of the sliding layers
	// (Gemma3's rope_local_base_freq, llama.cpp's rope.freq_base_swa),
	// which also take no rope_scaling (llama.cpp's rope_freq_scale_train_swa
	// is 1; transformers builds their rotary embedding with the default
	// rope type). RopeTheta and RopeScaling are then the global layers'.
	RopeThetaLocal float64
	// QKVBias: q_proj, k_proj and v_proj have a bias (always for Qwen2;
	// attention_bias for Llama).
	QKVBias bool
	// OBias: o_proj has a bias (Llama's attention_bias).
	OBias bool
	// MLPBias: gate_proj, up_proj and down_proj have a bias (Llama's mlp_bias).
	MLPBias bool
	// QKNorm: each head of q and of k ([heads, headDim] per token) is
	// RMS-normalised with its own gain vector [headDim] (q_norm, k_norm;
	// epsilon RMSNormEps) after the projection and before RoPE: Qwen3
	// (transformers' Qwen3Attention; llama.cpp's attn_q_norm and
	// attn_k_norm).
	QKNorm bool
	// The fields below are Gemma2's (transformers' modeling_gemma2.py;
	// llama.cpp's gemma2). Its RMSNorm gains are stored as w and applied as
	// 1 + w: the loader adds 1 to a checkpoint's (a GGUF file holds 1 + w
	// already). Gemma3 sets them too (without the soft-capping), with
	// QKNorm, SlidingLayers and RopeThetaLocal.

	// EmbedScale: the token embeddings are multiplied by √HiddenSize.
	EmbedScale bool
	// GeluTanh: the MLP is GeGLU, gelu with the tanh approximation
	// (gelu_pytorch_tanh) instead of SiLU.
	GeluTanh bool
	// PostNorms: the attention and MLP outputs are RMS-normalised (gains
	// post_attention_layernorm and post_feedforward_layernorm [hidden])
	// before their residual adds.
	PostNorms bool
	// QueryScale, if not 0, scales the attention scores instead of
	// 1/√HeadDim: query_pre_attn_scalar^−½.
	QueryScale float64
	// AttnSoftcap, if not 0, soft-caps the attention scores (after the
	// scale) to AttnSoftcap·tanh(s/AttnSoftcap): attn_logit_softcapping.
	AttnSoftcap float64
	// FinalSoftcap, if not 0, soft-caps the logits to
	// FinalSoftcap·tanh(l/FinalSoftcap): final_logit_softcapping.
	FinalSoftcap float64
	// BOS is bos_token_id (-1 if unset).
	BOS int32
	// EOS lists eos_token_id (an int or a list in config.json).
	EOS []int32
	// TorchDType is torch_dtype as written (informational: each tensor's own
	// dtype is what counts).
	TorchDType string
	// RopeInterleaved: RoPE rotates the pairs (x[2i], x[2i+1]) of a head,
	// the layout of Meta's checkpoints and of GGUF files of llama.cpp's
	// llama architecture, rather than Hugging Face's (x[i], x[i+d/2]).
	RopeInterleaved bool
	// RopeDim is how many of each head's first dimensions RoPE rotates:
	// partial rotary embeddings (Phi-4-mini's partial_rotary_factor 0.75,
	// transformers' rotary_ndims = head_dim·factor; a GGUF file's
	// rope.dimension_count below the head dimension, ggml's n_dims). The
	// other dimensions pass through unrotated. 0 means all of them.
	RopeDim int
	// RopeFactors, if set, divide the RoPE frequencies (headDim/2 values: a
	// GGUF file's rope_freqs tensor, llama.cpp's form of llama3 scaling).
	RopeFactors []float64
	// RopeLongFactors and RopeShortFactors, if set, are Phi-3's LongRoPE
	// (rope_scaling "longrope" or "su": long_factor and short_factor; a
	// GGUF file's rope_factors_long and rope_factors_short), headDim/2
	// values each: the model divides the RoPE frequencies by the long
	// ones when its context length (Options.ContextLen) exceeds
	// RopeOrigPositions, else by the short ones — llama.cpp's choice
	// (llama_model::get_rope_factors), fixed for the model, where
	// transformers switches with each sequence's length — and multiplies
	// cos and sin by RopeAttnFactor.
	RopeLongFactors, RopeShortFactors []float64
	// RopeOrigPositions is original_max_position_embeddings (a GGUF file's
	// rope.scaling.original_context_length).
	RopeOrigPositions int
	// RopeAttnFactor is LongRoPE's scale of cos and sin: transformers'
	// √(1 + ln(s)/ln(RopeOrigPositions)) with s = MaxPositions /
	// RopeOrigPositions (1 if s ≤ 1); a GGUF file's rope.scaling.attn_factor
	// (default 1). 0 means 1.
	RopeAttnFactor float64
	// The fields below are a mixture-of-experts MLP's (Qwen3-MoE:
	// transformers' Qwen3MoeSparseMoeBlock; llama.cpp's qwen3moe, and its
	// llama architecture with ffn_*_exps tensors): every layer's MLP is
	// Experts SwiGLU experts of width ExpertIntermediate and a router
	// [Experts, hidden]; each token goes through the ExpertsUsed experts of
	// largest softmax router probability, their outputs weighted by those
	// probabilities (see moe.go). Experts is 0 for a dense model.

	// Experts is num_experts (GGUF: expert_count).
	Experts int
	// ExpertsUsed is num_experts_per_tok, the experts per token (GGUF:
	// expert_used_count).
	ExpertsUsed int
	// ExpertIntermediate is moe_intermediate_size, each expert's MLP width
	// (GGUF: expert_feed_forward_length).
	ExpertIntermediate int
	// NormTopK is norm_topk_prob: the chosen experts' probabilities are
	// divided by their sum (always, in llama.cpp's qwen3moe and Mixtral).
	NormTopK bool
	// GGMLNumerics: RMSNorm's scale and the RoPE angles are computed in
	// float32 the way ggml computes them (see rmsNorm and ropeTableGGML), so
	// that a GGUF file's activations match llama.cpp's to the last bit more
	// often; set for GGUF files. Otherwise they are computed in float64.
	GGMLNumerics bool
}

// RopeScaling is the rope_scaling object of config.json.
type RopeScaling struct {
	// Type is rope_type (or the older key "type"): "default", "linear" or
	// "llama3".
	Type string
	// Factor divides the frequencies (linear: the positions).
	Factor float64
	// LowFreqFactor, HighFreqFactor and OriginalMaxPositions are the llama3
	// parameters (low_freq_factor, high_freq_factor,
	// original_max_position_embeddings).
	LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions          int
	// LongFactor and ShortFactor are the "longrope" parameters (long_factor,
	// short_factor); ParseConfig moves them into Config.
	LongFactor, ShortFactor []float64
}

// rawConfig is config.json as written; pointers tell absent from zero.
type rawConfig struct {
	Architectures     []string        `json:"architectures"`
	ModelType         string          `json:"model_type"`
	HiddenSize        int             `json:"hidden_size"`
	IntermediateSize  int             `json:"intermediate_size"`
	NumHiddenLayers   int             `json:"num_hidden_layers"`
	NumAttentionHeads int             `json:"num_attention_heads"`
	NumKeyValueHeads  *int            `json:"num_key_value_heads"`
	HeadDim           *int            `json:"head_dim"`
	RMSNormEps        *float64        `json:"rms_norm_eps"`
	RopeTheta         *float64        `json:"rope_theta"`
	RopeScaling       json.RawMessage `json:"rope_scaling"`
	TieWordEmbeddings *bool           `json:"tie_word_embeddings"`
	VocabSize         int             `json:"vocab_size"`
	MaxPositions      int             `json:"max_position_embeddings"`
	HiddenAct         *string         `json:"hidden_act"`
	HiddenActivation  *string         `json:"hidden_activation"`
	QueryPreAttn      *float64        `json:"query_pre_attn_scalar"`
	AttnSoftcap       json.RawMessage `json:"attn_logit_softcapping"`
	FinalSoftcap      json.RawMessage `json:"final_logit_softcapping"`
	AttentionBias     *bool           `json:"attention_bias"`
	MLPBias           *bool           `json:"mlp_bias"`
	SlidingWindow     *int            `json:"sliding_window"`
	UseSlidingWindow  *bool           `json:"use_sliding_window"`
	SlidingPattern    *int            `json:"sliding_window_pattern"`
	LayerTypes        []string        `json:"layer_types"`
	RopeLocalBase     *float64        `json:"rope_local_base_freq"`
	OrigMaxPositions  *int            `json:"original_max_position_embeddings"`
	PartialRotary     *float64        `json:"partial_rotary_factor"`
	BOSTokenID        json.RawMessage `json:"bos_token_id"`
	EOSTokenID        json.RawMessage `json:"eos_token_id"`
	TorchDType        string          `json:"torch_dtype"`
	// Qwen3MoeConfig's.
	NumExperts          *int  `json:"num_experts"`
	NumLocalExperts     *int  `json:"num_local_experts"` // MixtralConfig's
	NumExpertsPerTok    *int  `json:"num_experts_per_tok"`
	MoeIntermediateSize *int  `json:"moe_intermediate_size"`
	NormTopKProb        *bool `json:"norm_topk_prob"`
	DecoderSparseStep   *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers       []int `json:"mlp_only_layers"`
}

// Supported architectures (config.json "architectures").
const (
	archLlama    = "LlamaForCausalLM"
	archQwen2    = "Qwen2ForCausalLM"
	archMistral  = "MistralForCausalLM"
	archQwen3    = "Qwen3ForCausalLM"
	archGemma2   = "Gemma2ForCausalLM"
	archQwen3MoE = "Qwen3MoeForCausalLM"
	archMixtral  = "MixtralForCausalLM"
	archGemma3   = "Gemma3ForCausalLM"
	archPhi3     = "Phi3ForCausalLM"
)

// supportedArchs lists the supported architectures for error messages.
const supportedArchs = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MistralForCausalLM, MixtralForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM"

// ReadConfig reads dir/config.json and, if present, the eos_token_id of
// dir/generation_config.json (merged into EOS). It returns the configuration
// and the raw bytes of config.json (part of the model's digest), or an
// error for a missing or malformed file, an unsupported architecture or
// activation, an unsupported rope_scaling type, and inconsistent sizes.
func ReadConfig(dir string) (cfg Config, raw []byte, err error) {
	path := filepath.Join(dir, "config.json")
	raw, err = os.ReadFile(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("llama: %w", err)
	}
	cfg, err = ParseConfig(raw)
	if err != nil {
		return Config{}, nil, fmt.Errorf("llama: %s: %w", path, err)
	}
	gpath := filepath.Join(dir, "generation_config.json")
	if graw, err := os.ReadFile(gpath); err == nil {
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(graw, &g); err != nil {
			return Config{}, nil, fmt.Errorf("llama: %s: %w", gpath, err)
		}
		ids, err := tokenIDs(g.EOS)
		if err != nil {
			return Config{}, nil, fmt.Errorf("llama: %s: eos_token_id: %w", gpath, err)
		}
		cfg.EOS = mergeIDs(cfg.EOS, ids)
	} else if !errors.Is(err, os.ErrNotExist) {
		return Config{}, nil, fmt.Errorf("llama: %w", err)
	}
	return cfg, raw, nil
}

// ParseConfig parses and validates the bytes of a config.json (see
// ReadConfig). Defaults follow transformers' LlamaConfig: num_key_value_heads
// = num_attention_heads, head_dim = hidden_size / num_attention_heads
// (Qwen3Config: 128), rms_norm_eps 1e-6, rope_theta 10000,
// tie_word_embeddings false.
func ParseConfig(raw []byte) (Config, error) {
	var r rawConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return Config{}, fmt.Errorf("bad JSON: %w", err)
	}
	if len(r.Architectures) == 0 {
		return Config{}, errors.New(`no "architectures"; want one of ` + supportedArchs)
	}
	c := Config{
		Architecture:     r.Architectures[0],
		HiddenSize:       r.HiddenSize,
		IntermediateSize: r.IntermediateSize,
		Layers:           r.NumHiddenLayers,
		Heads:            r.NumAttentionHeads,
		KVHeads:          r.NumAttentionHeads,
		RMSNormEps:       1e-6,
		RopeTheta:        10000,
		VocabSize:        r.VocabSize,
		MaxPositions:     r.MaxPositions,
		BOS:              -1,
		TorchDType:       r.TorchDType,
	}
	switch c.Architecture {
	case archLlama:
		c.QKVBias = r.AttentionBias != nil && *r.AttentionBias
		c.OBias = c.QKVBias
		c.MLPBias = r.MLPBias != nil && *r.MLPBias
	case archQwen2:
		// Qwen2Attention: q/k/v projections with bias, o_proj without.
		c.QKVBias = true
		if r.UseSlidingWindow != nil && *r.UseSlidingWindow && r.SlidingWindow != nil {
			c.SlidingWindow = *r.SlidingWindow
		}
	case archQwen3, archQwen3MoE:
		// Qwen3Attention: q/k/v/o biases only with attention_bias, and an
		// RMSNorm on every head of q and k; head_dim defaults to 128.
		c.QKVBias = r.AttentionBias != nil && *r.AttentionBias
		c.OBias = c.QKVBias
		c.QKNorm = true
		if r.UseSlidingWindow != nil && *r.UseSlidingWindow && r.SlidingWindow != nil {
			c.SlidingWindow = *r.SlidingWindow
		}
		if r.HeadDim == nil {
			hd := 128
			r.HeadDim = &hd
		}
		if c.Architecture == archQwen3MoE {
			if err := qwen3MoEConfig(&c, &r); err != nil {
				return Config{}, err
			}
		}
	case archMistral, archMixtral:
		if r.SlidingWindow != nil {
			c.SlidingWindow = *r.SlidingWindow
		}
		if c.Architecture == archMixtral {
			if err := mixtralConfig(&c, &r); err != nil {
				return Config{}, err
			}
		}
	case archGemma2:
		if err := gemma2Config(&c, &r); err != nil {
			return Config{}, err
		}
	case archGemma3:
		if err := gemma3Config(&c, &r); err != nil {
			return Config{}, err
		}
	case archPhi3:
		if err := phi3Config(&c, &r); err != nil {
			return Config{}, err
		}
	default:
		return Config{}, fmt.Errorf("unsupported architecture %q; want one of %s", c.Architecture, supportedArchs)
	}
	if c.Architecture != archGemma2 && c.Architecture != archGemma3 && r.HiddenAct != nil && *r.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("unsupported hidden_act %q; want silu", *r.HiddenAct)
	}
	if r.NumKeyValueHeads != nil {
		c.KVHeads = *r.NumKeyValueHeads
	}
	if r.RMSNormEps != nil {
		c.RMSNormEps = *r.RMSNormEps
	}
	if r.RopeTheta != nil {
		c.RopeTheta = *r.RopeTheta
	}
	if r.TieWordEmbeddings != nil {
		c.TieEmbeddings = *r.TieWordEmbeddings
	}
	pos := func(name string, v int) error {
		if v <= 0 {
			return fmt.Errorf("%s must be positive, got %d", name, v)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize}, {"num_hidden_layers", c.Layers},
		{"num_attention_heads", c.Heads}, {"num_key_value_heads", c.KVHeads}, {"vocab_size", c.VocabSize},
		{"max_position_embeddings", c.MaxPositions}} {
		if err := pos(f.name, f.v); err != nil {
			return Config{}, err
		}
	}
	if r.HeadDim != nil {
		c.HeadDim = *r.HeadDim
	} else {
		if c.HiddenSize%c.Heads != 0 {
			return Config{}, fmt.Errorf("hidden_size %d is not a multiple of num_attention_heads %d (and head_dim is not set)", c.HiddenSize, c.Heads)
		}
		c.HeadDim = c.HiddenSize / c.Heads
	}
	if c.HeadDim <= 0 || c.HeadDim%2 != 0 {
		return Config{}, fmt.Errorf("head_dim must be positive and even (RoPE rotates pairs), got %d", c.HeadDim)
	}
	if c.Heads%c.KVHeads != 0 {
		return Config{}, fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	}
	if c.Architecture == archPhi3 && r.PartialRotary != nil && *r.PartialRotary != 1 {
		f := *r.PartialRotary
		c.RopeDim = int(float64(c.HeadDim) * f) // transformers' int(head_dim * partial_rotary_factor)
		if !(f > 0 && f < 1) || c.RopeDim < 2 || c.RopeDim%2 != 0 {
			return Config{}, fmt.Errorf("partial_rotary_factor %v gives %d rotated dimensions of %d; want an even number from 2 to the head dimension", f, c.RopeDim, c.HeadDim)
		}
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return Config{}, fmt.Errorf("rms_norm_eps must be positive, got %v", c.RMSNormEps)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return Config{}, fmt.Errorf("rope_theta must be positive, got %v", c.RopeTheta)
	}
	if c.SlidingWindow < 0 {
		return Config{}, fmt.Errorf("sliding_window must not be negative, got %d", c.SlidingWindow)
	}
	if c.SlidingLayers != nil && c.SlidingWindow == 0 {
		return Config{}, errors.New("sliding_window must be positive for a model with sliding-window layers")
	}
	if !(c.RopeThetaLocal >= 0) || math.IsInf(c.RopeThetaLocal, 0) {
		return Config{}, fmt.Errorf("rope_local_base_freq must be positive, got %v", c.RopeThetaLocal)
	}
	var err error
	if c.RopeScaling, err = parseRopeScaling(r.RopeScaling); err != nil {
		return Config{}, err
	}
	if s := c.RopeScaling; s != nil && s.Type == "longrope" {
		if err := hfLongRope(&c, &r); err != nil {
			return Config{}, err
		}
	}
	if c.EOS, err = tokenIDs(r.EOSTokenID); err != nil {
		return Config{}, fmt.Errorf("eos_token_id: %w", err)
	}
	bos, err := tokenIDs(r.BOSTokenID)
	if err != nil {
		return Config{}, fmt.Errorf("bos_token_id: %w", err)
	}
	if len(bos) > 0 {
		c.BOS = bos[0]
	}
	return c, nil
}

// qwen3MoEConfig fills the mixture-of-experts fields of c from r, with
// Qwen3MoeConfig's defaults: num_experts 128, num_experts_per_tok 8,
// moe_intermediate_size 768, norm_topk_prob false; intermediate_size (the
// width of dense layers, which pdserve does not support here) defaults to
// moe_intermediate_size. Every layer must be sparse: decoder_sparse_step 1
// (or absent) and no mlp_only_layers.
func qwen3MoEConfig(c *Config, r *rawConfig) error {
	c.Experts, c.ExpertsUsed, c.ExpertIntermediate = 128, 8, 768
	for _, f := range []struct {
		src *int
		dst *int
	}{{r.NumExperts, &c.Experts}, {r.NumExpertsPerTok, &c.ExpertsUsed}, {r.MoeIntermediateSize, &c.ExpertIntermediate}} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	c.NormTopK = r.NormTopKProb != nil && *r.NormTopKProb
	if c.IntermediateSize == 0 {
		c.IntermediateSize = c.ExpertIntermediate
	}
	if r.DecoderSparseStep != nil && *r.DecoderSparseStep != 1 || len(r.MLPOnlyLayers) > 0 {
		return errors.New("dense layers among the experts' (decoder_sparse_step other than 1, or mlp_only_layers) are not supported")
	}
	return checkExperts(c)
}

// mixtralConfig fills the mixture-of-experts fields of c from r as
// transformers' MixtralConfig reads them: num_local_experts (default 8),
// num_experts_per_tok (default 2), each expert intermediate_size wide; the
// chosen experts' softmax over their own logits (MixtralSparseMoeBlock),
// which is the renormalised top of the softmax over all: NormTopK.
func mixtralConfig(c *Config, r *rawConfig) error {
	c.Experts, c.ExpertsUsed, c.NormTopK = 8, 2, true
	if r.NumLocalExperts != nil {
		c.Experts = *r.NumLocalExperts
	}
	if r.NumExpertsPerTok != nil {
		c.ExpertsUsed = *r.NumExpertsPerTok
	}
	c.ExpertIntermediate = c.IntermediateSize
	return checkExperts(c)
}

// maxExperts bounds Experts (llama.cpp's LLAMA_MAX_EXPERTS is 512).
const maxExperts = 512

// checkExperts checks the mixture-of-experts sizes of c: 1 ≤ ExpertsUsed ≤
// Experts ≤ maxExperts and a positive ExpertIntermediate.
func checkExperts(c *Config) error {
	switch {
	case c.Experts < 1 || c.Experts > maxExperts:
		return fmt.Errorf("the expert count must be 1 to %d, got %d", maxExperts, c.Experts)
	case c.ExpertsUsed < 1 || c.ExpertsUsed > c.Experts:
		return fmt.Errorf("the experts used per token must be 1 to the expert count %d, got %d", c.Experts, c.ExpertsUsed)
	case c.ExpertIntermediate < 1:
		return fmt.Errorf("the expert MLP width must be positive, got %d", c.ExpertIntermediate)
	}
	return nil
}

// gemma2Config fills the Gemma2 fields of c from r, with Gemma2Config's
// defaults: head_dim 256, query_pre_attn_scalar 256, attn_logit_softcapping
// 50, final_logit_softcapping 30 (either may be null: none),
// sliding_window 4096 (in the even layers, or as layer_types says),
// tie_word_embeddings true, attention_bias false
// (true: q, k, v and o biases). The activation (hidden_activation, else
// hidden_act) must be gelu_pytorch_tanh.
func gemma2Config(c *Config, r *rawConfig) error {
	if err := gemmaBase(c, r, "Gemma2"); err != nil {
		return err
	}
	// Gemma2DecoderLayer: is_sliding = not layer_idx % 2; Gemma2Config's
	// soft-capping defaults 50 (attention) and 30 (final).
	return gemmaAttention(c, r, 2, 50, 30)
}

// gemmaBase sets what Gemma 2 and Gemma 3 share from a config.json: the
// √hidden embedding scale, GeGLU with gelu-tanh, the post-norms,
// attention_bias (false if absent; true: q, k, v and o biases), and the
// defaults head_dim 256 and tie_word_embeddings true. The activation
// (hidden_activation, else hidden_act) must be gelu_pytorch_tanh: an error
// naming arch otherwise.
func gemmaBase(c *Config, r *rawConfig, arch string) error {
	act := "gelu_pytorch_tanh"
	if r.HiddenActivation != nil {
		act = *r.HiddenActivation
	} else if r.HiddenAct != nil {
		act = *r.HiddenAct
	}
	if act != "gelu_pytorch_tanh" {
		return fmt.Errorf("unsupported hidden_activation %q for %s; want gelu_pytorch_tanh", act, arch)
	}
	c.EmbedScale, c.GeluTanh, c.PostNorms = true, true, true
	c.QKVBias = r.AttentionBias != nil && *r.AttentionBias
	c.OBias = c.QKVBias
	if r.HeadDim == nil {
		hd := 256
		r.HeadDim = &hd
	}
	if r.TieWordEmbeddings == nil {
		t := true
		r.TieWordEmbeddings = &t
	}
	return nil
}

// gemmaAttention sets the attention fields Gemma 2 and Gemma 3 read alike
// from a config.json: the sliding window (4096 if absent), which layers
// slide (hfSlidingLayers with the architecture's default period), the query
// scale 1/√query_pre_attn_scalar (256 if absent) and the attention and final
// logit soft-capping (attnCap and finalCap if absent, none if null). It
// returns an error naming a key whose value is out of range.
func gemmaAttention(c *Config, r *rawConfig, period int, attnCap, finalCap float64) error {
	c.SlidingWindow = 4096
	if r.SlidingWindow != nil {
		c.SlidingWindow = *r.SlidingWindow
	}
	var err error
	if c.SlidingLayers, err = hfSlidingLayers(r, period); err != nil {
		return err
	}
	scalar := 256.0
	if r.QueryPreAttn != nil {
		scalar = *r.QueryPreAttn
	}
	if !(scalar > 0) || math.IsInf(scalar, 0) {
		return fmt.Errorf("query_pre_attn_scalar must be positive, got %v", scalar)
	}
	c.QueryScale = 1 / math.Sqrt(scalar)
	if c.AttnSoftcap, err = softcap("attn_logit_softcapping", r.AttnSoftcap, attnCap); err != nil {
		return err
	}
	if c.FinalSoftcap, err = softcap("final_logit_softcapping", r.FinalSoftcap, finalCap); err != nil {
		return err
	}
	return nil
}

// softcap reads a soft-capping value: def if absent, 0 (none) if null,
// else a positive number.
func softcap(name string, raw json.RawMessage, def float64) (float64, error) {
	if len(raw) == 0 {
		return def, nil
	}
	if string(raw) == "null" {
		return 0, nil
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if !(v > 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s must be positive or null, got %v", name, v)
	}
	return v, nil
}

// parseRopeScaling reads rope_scaling: null, or an object with rope_type (or
// type) "default", "linear" or "llama3" and its parameters.
func parseRopeScaling(raw json.RawMessage) (*RopeScaling, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var r struct {
		RopeType             string    `json:"rope_type"`
		Type                 string    `json:"type"`
		Factor               *float64  `json:"factor"`
		LowFreqFactor        *float64  `json:"low_freq_factor"`
		HighFreqFactor       *float64  `json:"high_freq_factor"`
		OriginalMaxPositions *int      `json:"original_max_position_embeddings"`
		LongFactor           []float64 `json:"long_factor"`
		ShortFactor          []float64 `json:"short_factor"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("rope_scaling: %w", err)
	}
	s := &RopeScaling{Type: r.RopeType}
	if s.Type == "" {
		s.Type = r.Type
	}
	switch s.Type {
	case "", "default":
		return nil, nil
	case "linear":
		if r.Factor == nil || !(*r.Factor > 0) {
			return nil, errors.New("rope_scaling: linear needs a positive factor")
		}
		s.Factor = *r.Factor
	case "llama3":
		if r.Factor == nil || r.LowFreqFactor == nil || r.HighFreqFactor == nil || r.OriginalMaxPositions == nil {
			return nil, errors.New("rope_scaling: llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings")
		}
		s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositions = *r.Factor, *r.LowFreqFactor, *r.HighFreqFactor, *r.OriginalMaxPositions
		if !(s.Factor > 0) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositions <= 0 {
			return nil, fmt.Errorf("rope_scaling: llama3 parameters out of range: factor %v, low_freq_factor %v, high_freq_factor %v, original_max_position_embeddings %d",
				s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositions)
		}
	case "longrope", "su":
		s.Type = "longrope"
		if r.LongFactor == nil || r.ShortFactor == nil {
			return nil, errors.New("rope_scaling: longrope needs long_factor and short_factor")
		}
		s.LongFactor, s.ShortFactor = r.LongFactor, r.ShortFactor
	default:
		return nil, fmt.Errorf("rope_scaling: unsupported type %q; want default, linear, llama3 or (Phi3) longrope", s.Type)
	}
	return s, nil
}

// tokenIDs parses a token id field that is absent, null, an int or a list
// of ints.
func tokenIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int64
	if err := json.Unmarshal(raw, &one); err == nil {
		if one < 0 || one > math.MaxInt32 {
			return nil, fmt.Errorf("token id %d out of range", one)
		}
		return []int32{int32(one)}, nil
	}
	var many []int64
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want an int or a list of ints, got %s", raw)
	}
	out := make([]int32, 0, len(many))
	for _, v := range many {
		if v < 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("token id %d out of range", v)
		}
		out = append(out, int32(v))
	}
	return mergeIDs(nil, out), nil
}

// mergeIDs returns the sorted union of a and b without duplicates.
func mergeIDs(a, b []int32) []int32 {
	seen := make(map[int32]bool, len(a)+len(b))
	var out []int32
	for _, v := range append(append([]int32(nil), a...), b...) {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Package llamatest provides test helpers for package llama and the
// end-to-end tests: the stories260K fixture (a real trained model with
// llama.cpp reference outputs) converted to a Hugging Face directory, and
// synthetic checkpoints with real shapes and seeded random weights.
//
// # Concurrency and ownership
//
// Helpers write only into directories their callers give them (t.TempDir());
// they keep no state.
package llamatest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama2c"
)

// FixtureEnv names an environment variable that may point at another copy
// of the stories260K fixture directory (stories260K.bin and reference/). By
// default the copy in internal/model/llama/testdata/stories260K is used (a
// real 260K-parameter llama2.c checkpoint, MIT licensed, with llama.cpp
// reference outputs; see its README).
const FixtureEnv = "PDSERVE_STORIES260K"

// FixtureDir returns the stories260K fixture directory; the test fails if
// it is missing.
func FixtureDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(FixtureEnv)
	if dir == "" {
		_, self, _, ok := runtime.Caller(0)
		if !ok {
			t.Fatal("cannot locate the llamatest package")
		}
		dir = filepath.Join(filepath.Dir(self), "..", "testdata", "stories260K")
	}
	if _, err := os.Stat(filepath.Join(dir, "stories260K.bin")); err != nil {
		t.Fatalf("stories260K fixture not found: %v", err)
	}
	return dir
}

// Stories260K converts the fixture's stories260K.bin into a fresh temporary
// directory (the fixture itself is read-only) and returns it.
func Stories260K(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "stories260K")
	if _, err := llama2c.Convert(filepath.Join(FixtureDir(t), "stories260K.bin"), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Top5 is one position's five most likely next tokens.
type Top5 struct {
	IDs      []int32   `json:"ids"`
	Logprobs []float64 `json:"logprobs"`
}

// Reference is one reference/seq-NN.json of the fixture (see its README).
type Reference struct {
	Name     string    `json:"name"`
	Kind     string    `json:"kind"`
	Tokens   []int32   `json:"tokens"`
	Top5     []Top5    `json:"next_token_logprobs_top5"`
	Argmax   []int32   `json:"argmax"`
	Greedy   []int32   `json:"greedy_continuation"`
	LastProb []float64 `json:"last_position_probs"`
}

// References reads every reference sequence, sorted by name.
func References(t testing.TB) []Reference {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(FixtureDir(t), "reference", "seq-*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no reference files: %v", err)
	}
	sort.Strings(files)
	var refs []Reference
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r Reference
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(r.Top5) != len(r.Tokens) || len(r.Argmax) != len(r.Tokens) || len(r.LastProb) == 0 || len(r.Greedy) == 0 {
			t.Fatalf("%s: inconsistent reference", f)
		}
		refs = append(refs, r)
	}
	return refs
}

// Spec describes a synthetic checkpoint.
type Spec struct {
	// Architecture is config.json's architectures[0]: "LlamaForCausalLM"
	// (the default), "Qwen2ForCausalLM", "Qwen3ForCausalLM" (adds the
	// per-head q_norm and k_norm gains, uniform in 1 ± 0.5 so that their
	// order against RoPE matters), "MistralForCausalLM" or
	// "Qwen3MoeForCausalLM" (Qwen3's attention; every layer's MLP a mixture
	// of Experts experts of width ExpertIntermediate, ExpertsUsed per token,
	// norm_topk_prob NormTopK; the router's weights uniform in ±RouterScale
	// or, if that is 0, the matrices' Scale),
	// "MixtralForCausalLM" (Llama's attention; Experts experts of width
	// Intermediate, ExpertsUsed per token, always renormalised),
	// "Gemma2ForCausalLM" (gelu_pytorch_tanh, the four norms of a layer
	// stored as w around 0 — applied as 1 + w —, query_pre_attn_scalar =
	// head_dim, the soft-capping below), "Gemma3ForCausalLM" (as Gemma2 plus
	// per-head q_norm and k_norm stored as w uniform in ±0.5, the sliding
	// window in five of every six layers — SlidingPattern —, the local RoPE
	// base RopeThetaLocal) or "Phi3ForCausalLM" (fused qkv_proj and
	// gate_up_proj).
	Architecture   string
	Hidden         int
	Intermediate   int
	Layers         int
	Heads, KVHeads int
	HeadDim        int // 0: Hidden/Heads, and no head_dim key
	Vocab          int
	MaxPositions   int
	Tied           bool
	DType          llama.DType
	RopeTheta      float64
	RMSNormEps     float64
	QKVBias        bool           // Llama and Qwen3 attention_bias (q, k, v and o) or Qwen2 (q, k, v)
	RopeScaling    map[string]any // written as rope_scaling when non-nil
	BOS            int
	EOS            []int
	Seed           uint64
	// AttnSoftcap and FinalSoftcap are Gemma2's attn_logit_softcapping and
	// final_logit_softcapping (0: written as null, none); SlidingWindow its
	// sliding_window (0: MaxPositions).
	AttnSoftcap, FinalSoftcap float64
	SlidingWindow             int
	// Experts, ExpertsUsed, ExpertIntermediate and NormTopK are a
	// Qwen3MoeForCausalLM's num_experts, num_experts_per_tok,
	// moe_intermediate_size and norm_topk_prob.
	Experts, ExpertsUsed, ExpertIntermediate int
	NormTopK                                 bool
	RouterScale                              float64
	// SlidingPattern is Gemma3's sliding_window_pattern (0: its default,
	// 6); RopeThetaLocal its rope_local_base_freq (0: its default, 10000).
	SlidingPattern int
	RopeThetaLocal float64
	// LongRopeOrig, if > 0 (Phi3), writes a LongRoPE rope_scaling
	// ("longrope", LongRopeFactors) with original_max_position_embeddings
	// LongRopeOrig.
	LongRopeOrig int
	// PartialRotary, if > 0 (Phi3), is partial_rotary_factor: RoPE
	// rotates the first RopeDim() dimensions of each head (Phi-4-mini's
	// 0.75).
	PartialRotary float64
	// Scale is the half-width of the uniform distribution of matrix and
	// embedding weights; 0 means 0.02·√3 (standard deviation 0.02, the
	// transformers initializer_range).
	Scale float64
}

// SmolLM2135M is the shape of HuggingFaceTB/SmolLM2-135M (its config.json):
// 30 layers, hidden 576, 9 heads, 3 KV heads, intermediate 1536, vocab
// 49152, tied embeddings, bf16, rope_theta 100000, rms_norm_eps 1e-5, 8192
// positions, BOS 0 and EOS 0 (its <|endoftext|>).
func SmolLM2135M() Spec {
	return Spec{Hidden: 576, Intermediate: 1536, Layers: 30, Heads: 9, KVHeads: 3, Vocab: 49152,
		MaxPositions: 8192, Tied: true, DType: llama.BF16, RopeTheta: 100000, RMSNormEps: 1e-5,
		BOS: 0, EOS: []int{0}, Seed: 135}
}

// Qwen3Shaped is a Qwen3 checkpoint with the layer shape of Qwen/Qwen3-0.6B
// (its config.json: hidden 1024, 16 heads and 8 KV heads of head_dim 128 —
// so q is 2048 wide, twice the hidden size —, intermediate 3072, tied
// embeddings, bf16, rope_theta 1e6, rms_norm_eps 1e-6, 40960 positions, EOS
// 151645) but 8 of its 28 layers and a 32768-token vocabulary (its 151936
// would triple the file): 160M parameters, about SmolLM2-135M's size.
func Qwen3Shaped() Spec {
	return Spec{Architecture: "Qwen3ForCausalLM", Hidden: 1024, Intermediate: 3072, Layers: 8, Heads: 16, KVHeads: 8,
		HeadDim: 128, Vocab: 32768, MaxPositions: 40960, Tied: true, DType: llama.BF16, RopeTheta: 1e6,
		RMSNormEps: 1e-6, BOS: 1, EOS: []int{2}, Seed: 3}
}

// Gemma2Shaped is a Gemma2 checkpoint with the layer shape of
// google/gemma-2-2b (its config.json: hidden 2304, 8 heads and 4 KV heads
// of head_dim 256, intermediate 9216, tied, bf16, rope_theta 10000,
// rms_norm_eps 1e-6, query_pre_attn_scalar 256, soft-capping 50 and 30,
// sliding window 4096 of 8192 positions) but 2 of its 26 layers and a
// 16384-token vocabulary (its 256000 would be 1.2 GB of embeddings): 194M
// parameters.
func Gemma2Shaped() Spec {
	return Spec{Architecture: "Gemma2ForCausalLM", Hidden: 2304, Intermediate: 9216, Layers: 2, Heads: 8, KVHeads: 4,
		HeadDim: 256, Vocab: 16384, MaxPositions: 8192, Tied: true, DType: llama.BF16, RopeTheta: 10000,
		RMSNormEps: 1e-6, BOS: 2, EOS: []int{1}, Seed: 2, AttnSoftcap: 50, FinalSoftcap: 30, SlidingWindow: 4096}
}

// Qwen3MoEShaped is a Qwen3-MoE checkpoint with the attention of
// Qwen/Qwen3-30B-A3B's layers but half as wide (its config.json: hidden
// 2048, 32 heads and 4 KV heads of head_dim 128, 128 experts of width 768,
// 8 per token, norm_topk_prob true, rope_theta 1e6, rms_norm_eps 1e-6, EOS
// 151645; here hidden 1024 and 16 heads), 16 experts of width 768 with 2
// per token, 4 of its 48 layers, a 32768-token vocabulary, tied, bf16: 206M
// parameters, of which a token's step reads 40M in the layers (attention
// and 2 experts) and the 34M of the classifier. The router's weights are uniform in ±0.1, so that a token's
// experts are chosen by clear margins.
func Qwen3MoEShaped() Spec {
	return Spec{Architecture: "Qwen3MoeForCausalLM", Hidden: 1024, Intermediate: 6144, Layers: 4, Heads: 16, KVHeads: 4,
		HeadDim: 128, Vocab: 32768, MaxPositions: 40960, Tied: true, DType: llama.BF16, RopeTheta: 1e6,
		RMSNormEps: 1e-6, BOS: 1, EOS: []int{2}, Seed: 30, Experts: 16, ExpertsUsed: 2, ExpertIntermediate: 768,
		NormTopK: true, RouterScale: 0.1}
}

// TinyMoE is Tiny with Qwen3-MoE's layers: 8 experts of width 64, 2 per
// token, norm_topk_prob true, the router's weights uniform in ±1 (the
// experts of a token differ from its neighbours').
func TinyMoE() Spec {
	s := Tiny()
	s.Architecture, s.Experts, s.ExpertsUsed, s.ExpertIntermediate, s.NormTopK, s.RouterScale = "Qwen3MoeForCausalLM", 8, 2, 64, true, 1
	return s
}

// MixtralShaped is a small Mixtral checkpoint: Mixtral-8x7B's 8 experts
// with 2 per token, untied classifier, rope_theta 1e6, rms_norm_eps 1e-5
// (its config.json), at hidden 1024 with 16 heads and 4 KV heads of 64,
// experts 1024 wide, 4 layers, a 32000-token vocabulary, bf16: 176M
// parameters, the router's weights uniform in ±0.1.
func MixtralShaped() Spec {
	return Spec{Architecture: "MixtralForCausalLM", Hidden: 1024, Intermediate: 1024, Layers: 4, Heads: 16, KVHeads: 4,
		Vocab: 32000, MaxPositions: 32768, DType: llama.BF16, RopeTheta: 1e6, RMSNormEps: 1e-5, BOS: 1, EOS: []int{2},
		Seed: 87, Experts: 8, ExpertsUsed: 2, RouterScale: 0.1}
}

// TinyMixtral is Tiny as a Mixtral checkpoint: 8 experts of width 96
// (intermediate_size), 2 per token, the router's weights uniform in ±1.
func TinyMixtral() Spec {
	s := Tiny()
	s.Architecture, s.Experts, s.ExpertsUsed, s.RouterScale = "MixtralForCausalLM", 8, 2, 1
	return s
}

// Gemma3Shaped is a Gemma3 checkpoint with the layer shape of
// google/gemma-3-1b-pt (its config.json: hidden 1152, 4 heads and 1 KV head
// of head_dim 256, intermediate 6912, tied, bf16, rope_theta 1e6 and
// rope_local_base_freq 10000, rms_norm_eps 1e-6, query_pre_attn_scalar
// 256, sliding window 512 in five of every six layers, 32768 positions, no
// soft-capping) but 6 of its 26 layers (one period: five sliding, one
// global) and a 16384-token vocabulary (its 262144 would be 600 MB of
// embeddings): 180M parameters.
func Gemma3Shaped() Spec {
	return Spec{Architecture: "Gemma3ForCausalLM", Hidden: 1152, Intermediate: 6912, Layers: 6, Heads: 4, KVHeads: 1,
		HeadDim: 256, Vocab: 16384, MaxPositions: 32768, Tied: true, DType: llama.BF16, RopeTheta: 1e6,
		RMSNormEps: 1e-6, BOS: 2, EOS: []int{1}, Seed: 33, SlidingWindow: 512, SlidingPattern: 6, RopeThetaLocal: 10000}
}

// Phi3Shaped is a Phi3 checkpoint with the layer shape of
// microsoft/Phi-3-mini-4k-instruct (its config.json: hidden 3072, 32 heads
// of 96, no grouped KV, intermediate 8192, untied, bf16, rope_theta 10000,
// rms_norm_eps 1e-5, 4096 positions, no rope_scaling) but 2 of its 32
// layers, a 8192-token vocabulary (its 32064 would add 300 MB) and no
// sliding window (llama.cpp ignores Phi3's): 277M parameters.
func Phi3Shaped() Spec {
	return Spec{Architecture: "Phi3ForCausalLM", Hidden: 3072, Intermediate: 8192, Layers: 2, Heads: 32, KVHeads: 32,
		Vocab: 8192, MaxPositions: 4096, DType: llama.BF16, RopeTheta: 10000, RMSNormEps: 1e-5, BOS: 1, EOS: []int{2}, Seed: 34}
}

// Tiny is a small spec for fast tests: 2 layers, hidden 64, 4 heads of 16,
// 2 KV heads, vocab 97, untied, F32. Its weights are large enough (uniform
// in ±0.25) that attention is far from uniform, so a wrong rotation, mask or
// head mapping changes the logits visibly.
func Tiny() Spec {
	return Spec{Hidden: 64, Intermediate: 96, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 97, MaxPositions: 256,
		DType: llama.F32, RopeTheta: 10000, RMSNormEps: 1e-5, BOS: 1, EOS: []int{2}, Seed: 1, Scale: 0.25}
}

// Geometry is the KV geometry of the spec with KV dtype dt.
func (s Spec) Geometry(dt kvcache.DType) kvcache.Geometry {
	return kvcache.Geometry{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.headDim(), DType: dt}
}

func (s Spec) headDim() int {
	if s.HeadDim > 0 {
		return s.HeadDim
	}
	return s.Hidden / s.Heads
}

// Config returns the config.json of the spec.
func (s Spec) Config() map[string]any {
	arch := s.Architecture
	if arch == "" {
		arch = "LlamaForCausalLM"
	}
	c := map[string]any{
		"architectures": []string{arch}, "hidden_size": s.Hidden, "intermediate_size": s.Intermediate,
		"num_hidden_layers": s.Layers, "num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads,
		"vocab_size": s.Vocab, "max_position_embeddings": s.MaxPositions, "tie_word_embeddings": s.Tied,
		"rope_theta": s.RopeTheta, "rms_norm_eps": s.RMSNormEps, "hidden_act": "silu",
		"bos_token_id": s.BOS, "eos_token_id": s.EOS, "torch_dtype": map[llama.DType]string{llama.F32: "float32", llama.F16: "float16", llama.BF16: "bfloat16"}[s.DType],
	}
	if arch == "MixtralForCausalLM" {
		c["num_local_experts"], c["num_experts_per_tok"] = s.Experts, s.ExpertsUsed
	}
	if arch == "Qwen3MoeForCausalLM" {
		c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"] = s.Experts, s.ExpertsUsed, s.ExpertIntermediate, s.NormTopK
		c["decoder_sparse_step"], c["mlp_only_layers"] = 1, []int{}
	}
	gemma := arch == "Gemma2ForCausalLM" || arch == "Gemma3ForCausalLM"
	if s.HeadDim > 0 || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM" || gemma { // their default head_dim is not hidden/heads
		c["head_dim"] = s.headDim()
	}
	if s.QKVBias && (arch == "LlamaForCausalLM" || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM" || gemma) {
		c["attention_bias"] = true
	}
	if gemma {
		c["hidden_act"], c["hidden_activation"] = "gelu_pytorch_tanh", "gelu_pytorch_tanh"
		c["query_pre_attn_scalar"] = s.headDim()
		c["attn_logit_softcapping"], c["final_logit_softcapping"] = nullIfZero(s.AttnSoftcap), nullIfZero(s.FinalSoftcap)
		c["sliding_window"] = s.MaxPositions
		if s.SlidingWindow > 0 {
			c["sliding_window"] = s.SlidingWindow
		}
	}
	if arch == "Gemma3ForCausalLM" {
		if s.SlidingPattern > 0 {
			c["sliding_window_pattern"] = s.SlidingPattern
		}
		if s.RopeThetaLocal > 0 {
			c["rope_local_base_freq"] = s.RopeThetaLocal
		}
	}
	if s.RopeScaling != nil {
		c["rope_scaling"] = s.RopeScaling
	}
	if s.LongRopeOrig > 0 {
		long, short := s.LongRopeFactors()
		c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": long, "short_factor": short}
		c["original_max_position_embeddings"] = s.LongRopeOrig
	}
	if s.PartialRotary > 0 {
		c["partial_rotary_factor"] = s.PartialRotary
	}
	return c
}

// RopeDim is the number of each head's first dimensions RoPE rotates:
// transformers' int(head_dim · partial_rotary_factor), or all.
func (s Spec) RopeDim() int {
	if s.PartialRotary > 0 {
		return int(float64(s.headDim()) * s.PartialRotary)
	}
	return s.headDim()
}

// LongRopeFactors are the long and short LongRoPE factors the spec writes
// (RopeDim()/2 each), rising smoothly as Phi-3-mini-128k's do: from 1 to 8
// (long) and from 1 to 1.5 (short) across the pairs, the low frequencies
// divided most.
func (s Spec) LongRopeFactors() (long, short []float64) {
	n := s.RopeDim() / 2
	for i := range n {
		x := float64(i) / float64(max(1, n-1))
		long = append(long, 1+7*x*x)
		short = append(short, 1+0.5*x)
	}
	return long, short
}

// nullIfZero is v, or nil (JSON null) for 0.
func nullIfZero(v float64) any {
	if v == 0 {
		return nil
	}
	return v
}

// Tensors returns the spec's tensors with seeded uniform random weights
// (norm gains near 1), in s.DType.
func (s Spec) Tensors() []llama.SafetensorsTensor {
	rng := rand.New(rand.NewPCG(s.Seed, 0x11a3a))
	scale := s.Scale
	if scale == 0 {
		scale = 0.02 * math.Sqrt(3)
	}
	enc := func(v []float32) []byte {
		switch s.DType {
		case llama.BF16:
			return llama.BF16Bytes(v)
		case llama.F16:
			return llama.F16Bytes(v)
		}
		return llama.F32Bytes(v)
	}
	rnd := func(n int, center, half float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(center + half*(2*rng.Float64()-1))
		}
		return v
	}
	var out []llama.SafetensorsTensor
	add := func(name string, v []float32, shape ...int) {
		out = append(out, llama.SafetensorsTensor{Name: name, DType: s.DType, Shape: shape, Data: enc(v)})
	}
	H, D := s.Hidden, s.headDim()
	q, kv := s.Heads*D, s.KVHeads*D
	gemma := s.Architecture == "Gemma2ForCausalLM" || s.Architecture == "Gemma3ForCausalLM"
	phi3 := s.Architecture == "Phi3ForCausalLM"
	mixtral := s.Architecture == "MixtralForCausalLM"
	moe := s.Architecture == "Qwen3MoeForCausalLM" || mixtral
	qwen3 := s.Architecture == "Qwen3ForCausalLM" || s.Architecture == "Qwen3MoeForCausalLM"
	normCenter := 1.0
	if gemma {
		normCenter = 0 // applied as 1 + w
	}
	add("model.embed_tokens.weight", rnd(s.Vocab*H, 0, scale), s.Vocab, H)
	for i := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", rnd(H, normCenter, 0.1), H)
		if phi3 {
			add(p+"self_attn.qkv_proj.weight", rnd((q+2*kv)*H, 0, scale), q+2*kv, H)
		} else {
			add(p+"self_attn.q_proj.weight", rnd(q*H, 0, scale), q, H)
			add(p+"self_attn.k_proj.weight", rnd(kv*H, 0, scale), kv, H)
			add(p+"self_attn.v_proj.weight", rnd(kv*H, 0, scale), kv, H)
		}
		add(p+"self_attn.o_proj.weight", rnd(H*q, 0, scale), H, q)
		if s.QKVBias {
			add(p+"self_attn.q_proj.bias", rnd(q, 0, 0.1), q)
			add(p+"self_attn.k_proj.bias", rnd(kv, 0, 0.1), kv)
			add(p+"self_attn.v_proj.bias", rnd(kv, 0, 0.1), kv)
			if s.Architecture == "" || s.Architecture == "LlamaForCausalLM" || qwen3 || gemma {
				add(p+"self_attn.o_proj.bias", rnd(H, 0, 0.1), H)
			}
		}
		if qwen3 || s.Architecture == "Gemma3ForCausalLM" {
			add(p+"self_attn.q_norm.weight", rnd(D, normCenter, 0.5), D)
			add(p+"self_attn.k_norm.weight", rnd(D, normCenter, 0.5), D)
		}
		add(p+"post_attention_layernorm.weight", rnd(H, normCenter, 0.1), H)
		if gemma {
			add(p+"pre_feedforward_layernorm.weight", rnd(H, 0, 0.1), H)
		}
		if moe {
			rs := s.RouterScale
			if rs == 0 {
				rs = scale
			}
			F, block, gate, up, down := s.ExpertIntermediate, "mlp.", "gate_proj", "up_proj", "down_proj"
			if mixtral {
				F, block, gate, up, down = s.Intermediate, "block_sparse_moe.", "w1", "w3", "w2"
			}
			add(p+block+"gate.weight", rnd(s.Experts*H, 0, rs), s.Experts, H)
			for e := range s.Experts {
				ep := fmt.Sprintf("%s%sexperts.%d.", p, block, e)
				add(ep+gate+".weight", rnd(F*H, 0, scale), F, H)
				add(ep+up+".weight", rnd(F*H, 0, scale), F, H)
				add(ep+down+".weight", rnd(H*F, 0, scale), H, F)
			}
		} else if phi3 {
			add(p+"mlp.gate_up_proj.weight", rnd(2*s.Intermediate*H, 0, scale), 2*s.Intermediate, H)
			add(p+"mlp.down_proj.weight", rnd(H*s.Intermediate, 0, scale), H, s.Intermediate)
		} else {
			add(p+"mlp.gate_proj.weight", rnd(s.Intermediate*H, 0, scale), s.Intermediate, H)
			add(p+"mlp.up_proj.weight", rnd(s.Intermediate*H, 0, scale), s.Intermediate, H)
			add(p+"mlp.down_proj.weight", rnd(H*s.Intermediate, 0, scale), H, s.Intermediate)
		}
		if gemma {
			add(p+"post_feedforward_layernorm.weight", rnd(H, 0, 0.1), H)
		}
	}
	add("model.norm.weight", rnd(H, normCenter, 0.1), H)
	if !s.Tied {
		add("lm_head.weight", rnd(s.Vocab*H, 0, scale), s.Vocab, H)
	}
	return out
}

// Write writes the spec's config.json and model.safetensors into dir
// (created if needed).
func (s Spec) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cj, err := json.MarshalIndent(s.Config(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cj, 0o644); err != nil {
		return err
	}
	return llama.WriteSafetensorsFile(filepath.Join(dir, "model.safetensors"), s.Tensors(), map[string]string{"format": "pt"})
}

// WriteT writes the spec into a new temporary directory of t and returns it.
func (s Spec) WriteT(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := s.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

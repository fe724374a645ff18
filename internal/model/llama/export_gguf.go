package llama

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// ExportGGUF writes the checkpoint in dir as a GGUF file for llama.cpp's
// "llama" architecture (or "qwen3" for a Qwen3 checkpoint: see WriteGGUF)
// with the same weights in dtype dt: F32 (exact for
// any checkpoint) or the checkpoint's own dtype (the bytes as stored). It
// is WriteGGUF with gguf.F32, gguf.BF16 or gguf.F16.
func ExportGGUF(dir, path string, dt DType) error {
	t := map[DType]FileType{F32: FileF32, BF16: FileBF16, F16: FileF16}[dt]
	_, err := WriteGGUF(dir, path, t)
	return err
}

// FileType is the element type of a GGUF file's matrices, as llama.cpp's
// llama_ftype names it ("Q8_0", "Q4_K_M", …).
type FileType string

// File types WriteGGUF writes.
const (
	FileF32   FileType = "F32"
	FileF16   FileType = "F16"
	FileBF16  FileType = "BF16"
	FileQ8_0  FileType = "Q8_0"
	FileQ4_0  FileType = "Q4_0"
	FileQ4_1  FileType = "Q4_1"
	FileQ5_0  FileType = "Q5_0"
	FileQ5_1  FileType = "Q5_1"
	FileIQ4NL FileType = "IQ4_NL"
	FileQ4_KM FileType = "Q4_K_M"
	FileQ5_KM FileType = "Q5_K_M"
	FileQ3_KM FileType = "Q3_K_M"
	FileQ2_K  FileType = "Q2_K"
	FileIQ4XS FileType = "IQ4_XS"
)

// FileTypes lists the file types WriteGGUF writes.
var FileTypes = []FileType{FileF32, FileF16, FileBF16, FileQ8_0, FileQ4_0, FileQ4_1, FileQ5_0, FileQ5_1, FileIQ4NL, FileQ4_KM, FileQ5_KM, FileQ3_KM, FileQ2_K, FileIQ4XS}

// llamaFtype is general.file_type (llama.cpp's enum llama_ftype).
var llamaFtype = map[FileType]uint32{FileF32: 0, FileF16: 1, FileBF16: 32, FileQ8_0: 7, FileQ4_0: 2, FileQ4_1: 3,
	FileQ5_0: 8, FileQ5_1: 9, FileIQ4NL: 25, FileQ4_KM: 15, FileQ5_KM: 17, FileQ3_KM: 12, FileQ2_K: 10, FileIQ4XS: 30}

// useMoreBits is llama.cpp's rule (llama-quant.cpp) for the layers of a
// Q4_K_M or Q5_K_M file whose attn_v and ffn_down get Q6_K: the first and
// last eighth, and every third between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// tensorType is the type of one matrix in a file of type ft, as llama.cpp's
// llama_tensor_get_type (llama-quant.cpp) chooses it for a dense model
// (not Falcon, not 70B; experts' ffn_down_exps count as ffn_down, and
// llama.cpp's other rules for 8-expert models are not applied): the classifier (the token embedding
// when tied) is Q6_K in every K-quant mix; Q4_K_M and Q5_K_M give attn_v
// and ffn_down of the useMoreBits layers Q6_K and the rest Q4_K or Q5_K;
// Q3_K_M gives attn_v Q5_K in layers 0 and 1 and Q4_K after, ffn_down Q5_K
// in the first sixteenth of the layers and Q4_K after, attn_output Q4_K,
// and the rest Q3_K; Q2_K gives attn_v Q4_K if gqa (query heads per KV
// head) is at least 4, else Q3_K, ffn_down and attn_output Q3_K, and the
// rest Q2_K; IQ4_XS (without an importance matrix) gives attn_v Q5_K if
// gqa is at least 4, ffn_down Q5_K in the first eighth of the layers, the
// classifier Q6_K, and the rest IQ4_XS. For every quantized type rows that
// are not a multiple of the block fall back as llama.cpp's
// tensor_type_fallback does for the K-quants — Q5_0 for Q4_K, Q5_1 for
// Q5_K, Q4_0 for Q3_K and Q2_K, Q8_0 for Q6_K, IQ4_NL for IQ4_XS — and to
// F32 for the 32-element types and for rows not a
// multiple of 32.
func tensorType(ft FileType, name string, cols, layer, layers, gqa int, classifier bool) gguf.Type {
	var t gguf.Type
	switch ft {
	case FileF32:
		return gguf.F32
	case FileF16:
		return gguf.F16
	case FileBF16:
		return gguf.BF16
	case FileQ8_0:
		t = gguf.Q8_0
	case FileQ4_0:
		t = gguf.Q4_0
	case FileQ4_1:
		t = gguf.Q4_1
	case FileQ5_0:
		t = gguf.Q5_0
	case FileQ5_1:
		t = gguf.Q5_1
	case FileIQ4NL:
		t = gguf.IQ4_NL
	case FileQ4_KM, FileQ5_KM:
		t = gguf.Q4_K
		if ft == FileQ5_KM {
			t = gguf.Q5_K
		}
		if classifier || (strings.HasSuffix(name, "attn_v.weight") || isFFNDown(name)) && useMoreBits(layer, layers) {
			t = gguf.Q6_K
		}
	case FileQ3_KM:
		switch {
		case classifier:
			t = gguf.Q6_K
		case strings.HasSuffix(name, "attn_v.weight"):
			t = gguf.Q4_K
			if layer < 2 {
				t = gguf.Q5_K
			}
		case isFFNDown(name):
			t = gguf.Q4_K
			if layer < layers/16 {
				t = gguf.Q5_K
			}
		case strings.HasSuffix(name, "attn_output.weight"):
			t = gguf.Q4_K
		default:
			t = gguf.Q3_K
		}
	case FileQ2_K:
		switch {
		case classifier:
			t = gguf.Q6_K
		case strings.HasSuffix(name, "attn_v.weight"):
			t = gguf.Q3_K
			if gqa >= 4 {
				t = gguf.Q4_K
			}
		case isFFNDown(name), strings.HasSuffix(name, "attn_output.weight"):
			t = gguf.Q3_K
		default:
			t = gguf.Q2_K
		}
	case FileIQ4XS:
		switch {
		case classifier:
			t = gguf.Q6_K
		case strings.HasSuffix(name, "attn_v.weight") && gqa >= 4,
			isFFNDown(name) && layer < layers/8:
			t = gguf.Q5_K
		default:
			t = gguf.IQ4_XS
		}
	}
	if cols%t.BlockSize() != 0 {
		if cols%32 != 0 || t.BlockSize() != 256 {
			return gguf.F32
		}
		switch t {
		case gguf.Q4_K:
			return gguf.Q5_0
		case gguf.Q5_K:
			return gguf.Q5_1
		case gguf.Q3_K, gguf.Q2_K:
			return gguf.Q4_0
		case gguf.IQ4_XS:
			return gguf.IQ4_NL
		}
		return gguf.Q8_0
	}
	return t
}

// isFFNDown reports whether name is a layer's ffn_down matrix or its
// experts' stacked ffn_down_exps (llama.cpp's FFN_DOWN category).
func isFFNDown(name string) bool {
	return strings.HasSuffix(name, "ffn_down.weight") || strings.HasSuffix(name, "ffn_down_exps.weight")
}

// GGUFReport says what WriteGGUF wrote.
type GGUFReport struct {
	// Tensors is the number of tensors written.
	Tensors int
	// Fallback lists the matrices written in another type because their
	// rows are not a multiple of the type's block (see tensorType).
	Fallback []string
	// Bytes is the size of the file.
	Bytes int64
}

// WriteGGUF writes the checkpoint in dir as a GGUF file (version 3) for
// llama.cpp's "llama" architecture — or its "qwen3", "qwen3moe", "gemma2",
// "gemma3" or "phi3" architecture for a Qwen3ForCausalLM,
// Qwen3MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM or
// Phi3ForCausalLM checkpoint; a MixtralForCausalLM becomes a "llama" file
// with experts, as llama.cpp's converter writes it — its
// matrices of file type ft: F32
// (exact), F16 or BF16 (exact when the checkpoint has that dtype; otherwise
// an error), quantized Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 (QuantizeQ8_0,
// QuantizeQ4_0, …: ggml's reference quantizers), IQ4_NL (QuantizeIQ4NL, a
// plain fitted-scale quantizer), or llama.cpp's K-quant mixes Q4_K_M (Q4_K
// and Q6_K: QuantizeQ4K, QuantizeQ6K, plain range quantizers), Q5_K_M (Q5_K
// and Q6_K), Q3_K_M (Q3_K, Q4_K, Q5_K and Q6_K) and Q2_K (Q2_K, Q3_K, Q4_K
// and Q6_K; QuantizeQ5K, QuantizeQ3K and QuantizeQ2K are ggml's reference
// quantizers), and llama.cpp's IQ4_XS mix (IQ4_XS, QuantizeIQ4XS after
// ggml's reference quantizer, with Q5_K and Q6_K; see tensorType). A matrix whose rows
// are not a multiple of the block is written in a fallback type and listed
// in the report: F32 for the 32-element types (llama.cpp's converter
// writes F16 there, but llama.cpp then rounds that matrix's activations to
// F16 too, and pdserve does not: with F32 both multiply the same values),
// and llama.cpp's fallbacks for the K-quants (tensorType). Norm gains and biases are
// always F32, as llama.cpp expects.
//
// Tensors get llama.cpp's names (token_embd, blk.N.attn_q, …, output_norm,
// output when untied; blk.N.attn_q_norm and attn_k_norm for qwen3) and the
// metadata keys its architecture's prefix ("llama.block_count", …). For the
// llama architecture the rows of wq and wk (and their biases) are permuted
// from Hugging Face's rotate-half RoPE layout back to Meta's interleaved
// pairs, which llama.cpp's llama architecture rotates (and Load reads back
// the same way): within a head of dimension d, GGUF row 2i+s is checkpoint
// row s·d/2 + i (s = 0, 1) — the inverse of the permutation transformers'
// convert_llama_weights_to_hf applies. qwen3 and gemma2 rotate in the
// rotate-half layout (LLAMA_ROPE_TYPE_NEOX), so their rows are written as
// stored, as llama.cpp's convert_hf_to_gguf.py does. A Gemma2ForCausalLM
// checkpoint becomes a "gemma2" file: its RMSNorm gains written as the 1 + w
// it applies (computed in float32), post_attention_norm and post_ffw_norm,
// gemma2.attention.sliding_window, attn_logit_softcapping and
// final_logit_softcapping; it must be tied, soft-capped and have the
// attention scale llama.cpp derives (gemma2Exportable); sliding layers other
// than the even ones are written as gemma2.attention.sliding_window_pattern.
// A Gemma3ForCausalLM checkpoint becomes a "gemma3" file the same way, plus
// attn_q_norm and attn_k_norm (1 + w), gemma3.attention.sliding_window,
// sliding_window_pattern and rope.freq_base_swa (when it has sliding
// layers), final_logit_softcapping if set, and a linear rope_scaling as
// gemma3.rope.scaling.*; it must have no attention soft-capping and the
// attention scale llama.cpp derives (gemma3Exportable). A Phi3ForCausalLM
// checkpoint becomes a "phi3" file with blk.N.attn_qkv ([q; k; v]) and an
// ffn_up of [gate; up] rows, as llama.cpp's converter writes them, and its
// LongRoPE as rope_factors_long, rope_factors_short,
// phi3.rope.scaling.attn_factor and original_context_length. The vocabulary is a placeholder of
// vocab_size tokens (SentencePiece "llama" model: <unk>, <s>, </s>, the 256
// byte tokens, then "▁tN"): such files are for token-id prompts and
// comparisons. A Qwen3MoeForCausalLM checkpoint becomes a "qwen3moe" file
// (writeExperts: ffn_gate_inp in F32, the experts stacked into
// ffn_gate_exps, ffn_up_exps and ffn_down_exps; qwen3moe.expert_count,
// expert_used_count and expert_feed_forward_length); its norm_topk_prob
// must be true, as llama.cpp's qwen3moe assumes. A phi3 file's last token
// is <|endoftext|>, which llama.cpp requires of Phi-3 models.
//
// It returns an error for rope_scaling, a sliding window and MLP biases,
// which it does not export, and for an unsupported type.
func WriteGGUF(dir, path string, ft FileType) (rep GGUFReport, err error) {
	if _, ok := llamaFtype[ft]; !ok {
		return rep, fmt.Errorf("llama: WriteGGUF: file type %q is not supported; want one of %v", ft, FileTypes)
	}
	m, err := Load(dir, Options{})
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	cfg := &m.w.cfg
	arch, permute := "llama", true
	swaPeriod := 0 // gemma2 and gemma3: sliding_window_pattern
	switch cfg.Architecture {
	case archQwen3:
		arch, permute = "qwen3", false
	case archQwen3MoE:
		arch, permute = "qwen3moe", false
		if !cfg.NormTopK {
			return rep, errors.New("llama: WriteGGUF: llama.cpp's qwen3moe always renormalises the chosen experts' weights; the checkpoint's norm_topk_prob is false")
		}
	case archGemma2:
		arch, permute = "gemma2", false
		if err := gemma2Exportable(cfg); err != nil {
			return rep, err
		}
		if swaPeriod, err = slidingPeriod(cfg); err != nil {
			return rep, err
		}
	case archGemma3:
		arch, permute = "gemma3", false
		if swaPeriod, err = gemma3Exportable(cfg); err != nil {
			return rep, err
		}
	case archPhi3:
		arch, permute = "phi3", false
	}
	heads, kvHeads := cfg.Heads, cfg.KVHeads // rows to permute, by head
	if !permute {
		heads, kvHeads = 0, 0
	}
	if s := cfg.RopeScaling; s != nil && (arch != "gemma3" || s.Type != "linear") {
		return rep, errors.New("llama: WriteGGUF does not export rope_scaling (other than gemma3's linear scaling)")
	}
	if cfg.SlidingWindow > 0 && cfg.SlidingWindow < cfg.MaxPositions && arch != "gemma2" && arch != "gemma3" {
		return rep, errors.New("llama: WriteGGUF does not export a sliding window")
	}
	var tensors []gguf.Tensor
	var convErr error
	layer := 0
	mat := func(name string, t *tensor, permuteHeads int) {
		rows, cols := t.Rows(), t.Cols()
		vals := F32Bytes(t.Float32())
		if permuteHeads > 0 {
			vals = permuteRope(vals, rows, cols*4, permuteHeads)
		}
		f := f32View(vals)
		classifier := name == "output.weight" || name == "token_embd.weight" && cfg.TieEmbeddings
		gqa := cfg.Heads / cfg.KVHeads
		tt := tensorType(ft, name, cols, layer, cfg.Layers, gqa, classifier)
		if want := tensorType(ft, name, 256*32, layer, cfg.Layers, gqa, classifier); tt != want {
			rep.Fallback = append(rep.Fallback, name+" ("+tt.String()+")")
		}
		var data []byte
		switch tt {
		case gguf.F32:
			data = vals
		case gguf.BF16, gguf.F16:
			if t.DType != map[gguf.Type]DType{gguf.BF16: BF16, gguf.F16: F16}[tt] {
				convErr = fmt.Errorf("llama: cannot export %s weights as %s exactly (--type %s needs a checkpoint in %s; for this one use f32 or a quantized type such as q8_0)",
					safetensorsName(t.DType), tt, strings.ToLower(tt.String()), tt)
				return
			}
			data = BF16Bytes(f) // exact: the values are bf16
			if tt == gguf.F16 {
				data = F16Bytes(f)
			}
		case gguf.Q8_0:
			data = QuantizeQ8_0(f)
		case gguf.Q4_0:
			data = QuantizeQ4_0(f)
		case gguf.Q4_1:
			data = QuantizeQ4_1(f)
		case gguf.Q5_0:
			data = QuantizeQ5_0(f)
		case gguf.Q5_1:
			data = QuantizeQ5_1(f)
		case gguf.IQ4_NL:
			data = QuantizeIQ4NL(f)
		case gguf.Q4_K:
			data = QuantizeQ4K(f)
		case gguf.Q5_K:
			data = QuantizeQ5K(f)
		case gguf.Q3_K:
			data = QuantizeQ3K(f)
		case gguf.Q2_K:
			data = QuantizeQ2K(f)
		case gguf.IQ4_XS:
			data = QuantizeIQ4XS(f)
		default: // Q6_K
			data = QuantizeQ6K(f)
		}
		tensors = append(tensors, gguf.Tensor{Name: name, Type: tt, Dims: []uint64{uint64(cols), uint64(rows)}, Data: data})
	}
	vec := func(name string, v []float32, permuteHeads int) {
		if v == nil {
			return
		}
		data := F32Bytes(v)
		if permuteHeads > 0 {
			data = permuteRope(data, len(v), 4, permuteHeads)
		}
		tensors = append(tensors, gguf.Tensor{Name: name, Type: gguf.F32, Dims: []uint64{uint64(len(v))}, Data: data})
	}
	mat("token_embd.weight", m.w.embed, 0)
	for i := range m.w.layers {
		ly := &m.w.layers[i]
		layer = i
		p := fmt.Sprintf("blk.%d.", i)
		vec(p+"attn_norm.weight", ly.attnNorm, 0)
		if arch == "phi3" {
			// llama.cpp's phi3 converter keeps the fused [q; k; v].
			mat(p+"attn_qkv.weight", concatRows(ly.q, ly.k, ly.v), 0)
		} else {
			mat(p+"attn_q.weight", ly.q, heads)
			mat(p+"attn_k.weight", ly.k, kvHeads)
			mat(p+"attn_v.weight", ly.v, 0)
		}
		mat(p+"attn_output.weight", ly.o, 0)
		vec(p+"attn_q.bias", ly.qb, heads)
		vec(p+"attn_k.bias", ly.kb, kvHeads)
		vec(p+"attn_v.bias", ly.vb, 0)
		vec(p+"attn_output.bias", ly.ob, 0)
		vec(p+"attn_q_norm.weight", ly.qNorm, 0)
		vec(p+"attn_k_norm.weight", ly.kNorm, 0)
		vec(p+"post_attention_norm.weight", ly.attnPostNorm, 0)
		vec(p+"ffn_norm.weight", ly.mlpNorm, 0)
		vec(p+"post_ffw_norm.weight", ly.mlpPostNorm, 0)
		if ly.router != nil {
			if err := writeExperts(ly, p, mat, &tensors); err != nil {
				return rep, err
			}
			continue
		}
		if arch == "phi3" {
			mat(p+"ffn_up.weight", concatRows(ly.gate, ly.up), 0) // [gate; up]
		} else {
			mat(p+"ffn_gate.weight", ly.gate, 0)
			mat(p+"ffn_up.weight", ly.up, 0)
		}
		mat(p+"ffn_down.weight", ly.down, 0)
		if ly.gateB != nil || ly.upB != nil || ly.downB != nil {
			return rep, errors.New("llama: WriteGGUF does not export MLP biases")
		}
	}
	vec("output_norm.weight", m.w.norm, 0)
	if cfg.RopeLongFactors != nil {
		vec("rope_factors_long.weight", f32s(cfg.RopeLongFactors), 0)
		vec("rope_factors_short.weight", f32s(cfg.RopeShortFactors), 0)
	}
	if !cfg.TieEmbeddings {
		mat("output.weight", m.w.lmHead, 0)
	}
	if convErr != nil {
		return rep, convErr
	}
	rep.Tensors = len(tensors)

	V := cfg.VocabSize
	if V < 259 {
		return rep, fmt.Errorf("llama: ExportGGUF needs a vocabulary of at least 259 tokens, got %d", V)
	}
	tokens := make([]string, V)
	scores := make([]float32, V)
	types := make([]int32, V)
	tokens[0], types[0] = "<unk>", 2 // UNKNOWN
	tokens[1], types[1] = "<s>", 3   // CONTROL
	tokens[2], types[2] = "</s>", 3
	for b := range 256 {
		tokens[3+b], types[3+b] = fmt.Sprintf("<0x%02X>", b), 6 // BYTE
	}
	for i := 259; i < V; i++ {
		tokens[i], types[i], scores[i] = fmt.Sprintf("▁t%d", i), 1, float32(-i)
	}
	if arch == "phi3" {
		// llama.cpp looks up <|endoftext|> in the vocabulary of a model
		// whose general.name contains "phi3" (llama-vocab.cpp, the token
		// attributes it sets for Phi-3), and fails to load one without it.
		tokens[V-1], types[V-1], scores[V-1] = "<|endoftext|>", 3, 0
	}
	ftype := llamaFtype[ft]
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.name", Value: m.info.Name},
		{Key: "general.file_type", Value: ftype},
		{Key: "general.alignment", Value: uint32(gguf.Alignment)},
		{Key: arch + ".vocab_size", Value: uint32(V)},
		{Key: arch + ".context_length", Value: uint32(cfg.MaxPositions)},
		{Key: arch + ".embedding_length", Value: uint32(cfg.HiddenSize)},
		{Key: arch + ".block_count", Value: uint32(cfg.Layers)},
		{Key: arch + ".feed_forward_length", Value: uint32(cfg.IntermediateSize)},
		{Key: arch + ".attention.head_count", Value: uint32(cfg.Heads)},
		{Key: arch + ".attention.head_count_kv", Value: uint32(cfg.KVHeads)},
		{Key: arch + ".attention.key_length", Value: uint32(cfg.HeadDim)},
		{Key: arch + ".attention.value_length", Value: uint32(cfg.HeadDim)},
		{Key: arch + ".rope.dimension_count", Value: uint32(cfg.ropeDims())},
		{Key: arch + ".rope.freq_base", Value: float32(cfg.RopeTheta)},
		{Key: arch + ".attention.layer_norm_rms_epsilon", Value: float32(cfg.RMSNormEps)},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: tokens},
		{Key: "tokenizer.ggml.scores", Value: scores},
		{Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
		{Key: "tokenizer.ggml.add_bos_token", Value: false},
		{Key: "tokenizer.ggml.add_eos_token", Value: false},
	}
	if cfg.Experts > 0 {
		kvs = append(kvs,
			gguf.KV{Key: arch + ".expert_count", Value: uint32(cfg.Experts)},
			gguf.KV{Key: arch + ".expert_used_count", Value: uint32(cfg.ExpertsUsed)},
			gguf.KV{Key: arch + ".expert_feed_forward_length", Value: uint32(cfg.ExpertIntermediate)})
	}
	switch arch {
	case "gemma2":
		kvs = append(kvs,
			gguf.KV{Key: "gemma2.attention.sliding_window", Value: uint32(cfg.SlidingWindow)},
			gguf.KV{Key: "gemma2.attn_logit_softcapping", Value: float32(cfg.AttnSoftcap)},
			gguf.KV{Key: "gemma2.final_logit_softcapping", Value: float32(cfg.FinalSoftcap)})
		if swaPeriod != 2 {
			kvs = append(kvs, gguf.KV{Key: "gemma2.attention.sliding_window_pattern", Value: uint32(swaPeriod)})
		}
	case "phi3":
		if cfg.RopeLongFactors != nil {
			kvs = append(kvs,
				gguf.KV{Key: "phi3.rope.scaling.attn_factor", Value: float32(cfg.RopeAttnFactor)},
				gguf.KV{Key: "phi3.rope.scaling.original_context_length", Value: uint32(cfg.RopeOrigPositions)})
		}
	case "gemma3":
		if swaPeriod > 0 {
			kvs = append(kvs,
				gguf.KV{Key: "gemma3.attention.sliding_window", Value: uint32(cfg.SlidingWindow)},
				gguf.KV{Key: "gemma3.attention.sliding_window_pattern", Value: uint32(swaPeriod)},
				gguf.KV{Key: "gemma3.rope.freq_base_swa", Value: float32(cfg.RopeThetaLocal)})
		}
		if cfg.FinalSoftcap != 0 {
			kvs = append(kvs, gguf.KV{Key: "gemma3.final_logit_softcapping", Value: float32(cfg.FinalSoftcap)})
		}
		if s := cfg.RopeScaling; s != nil {
			kvs = append(kvs, gguf.KV{Key: "gemma3.rope.scaling.type", Value: "linear"},
				gguf.KV{Key: "gemma3.rope.scaling.factor", Value: float32(s.Factor)})
		}
	}
	if ft != FileF32 && ft != FileF16 && ft != FileBF16 {
		kvs = append(kvs, gguf.KV{Key: "general.quantization_version", Value: uint32(2)}) // GGML_QNT_VERSION
	}
	f, err := os.Create(path)
	if err != nil {
		return rep, fmt.Errorf("llama: %w", err)
	}
	if err := gguf.Write(f, kvs, tensors); err != nil {
		_ = f.Close()
		return rep, err
	}
	if fi, err := f.Stat(); err == nil {
		rep.Bytes = fi.Size()
	}
	return rep, f.Close()
}

// gemma2Exportable says why a Gemma2 configuration cannot be written for
// llama.cpp's gemma2 (nil if it can): llama.cpp always ties the classifier
// to the embedding, needs both soft-capping values, and derives the
// attention scale from the shape (see ggufGemma2) rather than reading
// query_pre_attn_scalar, so a checkpoint whose scale differs would compute
// another model there.
func gemma2Exportable(cfg *Config) error {
	if !cfg.TieEmbeddings {
		return errors.New("llama: WriteGGUF: llama.cpp's gemma2 has no separate classifier; the checkpoint's is untied")
	}
	if cfg.AttnSoftcap == 0 || cfg.FinalSoftcap == 0 {
		return errors.New("llama: WriteGGUF: llama.cpp's gemma2 needs attn_logit_softcapping and final_logit_softcapping")
	}
	want := *cfg
	want.GGMLNumerics = true
	if err := ggufGemma2(nil, &want); err != nil {
		return err
	}
	if float32(want.QueryScale) != float32(cfg.QueryScale) {
		return fmt.Errorf("llama: WriteGGUF: query_pre_attn_scalar gives the attention scale %v, llama.cpp's gemma2 would use %v", cfg.QueryScale, want.QueryScale)
	}
	return nil
}

// permuteRope reorders the rows (rowBytes each) of a [heads·d, …] q or k
// projection from rotate-half to interleaved pairs: in each head, output row
// 2i+s is input row s·d/2 + i.
func permuteRope(data []byte, rows, rowBytes, heads int) []byte {
	d := rows / heads
	out := make([]byte, len(data))
	for h := range heads {
		for i := range d / 2 {
			for s := range 2 {
				src := h*d + s*d/2 + i
				dst := h*d + 2*i + s
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}

package llama

import (
	"errors"
	"fmt"
	"os"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// ExportGGUF writes the checkpoint in dir as a GGUF file for llama.cpp's
// "llama" architecture, the same weights in dtype dt: F32 (exact for any
// checkpoint) or the checkpoint's own dtype (the bytes as stored). Norm
// gains are always F32, as llama.cpp expects. It is for comparisons with
// llama.cpp (tools/llamacpp-bench); pdserve itself never reads GGUF.
//
// Tensors get llama.cpp's names (token_embd, blk.N.attn_q, …, output_norm,
// output when untied). The rows of wq and wk (and their biases) are permuted
// from Hugging Face's rotate-half RoPE layout back to Meta's interleaved
// pairs, which llama.cpp's llama architecture rotates: within a head of
// dimension d, GGUF row 2i+s is checkpoint row s·d/2 + i (s = 0, 1) — the
// inverse of the permutation transformers' convert_llama_weights_to_hf
// applies. The vocabulary is a placeholder of vocab_size tokens ("llama"
// tokenizer model: <unk>, <s>, </s>, the 256 byte tokens, then "▁tN"):
// comparisons feed token ids, never text.
//
// It returns an error for rope_scaling, which it does not export.
func ExportGGUF(dir, path string, dt DType) (err error) {
	m, err := Load(dir, Options{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	cfg := &m.w.cfg
	if cfg.RopeScaling != nil {
		return errors.New("llama: ExportGGUF does not export rope_scaling")
	}
	if cfg.SlidingWindow > 0 && cfg.SlidingWindow < cfg.MaxPositions {
		return errors.New("llama: ExportGGUF does not export a sliding window")
	}
	var tensors []gguf.Tensor
	var convErr error
	mat := func(name string, t *tensor, permuteHeads int) {
		rows, cols := t.Rows(), t.Cols()
		var data []byte
		var typ gguf.Type
		switch {
		case dt == F32:
			data, typ = F32Bytes(t.Float32()), gguf.F32
		case dt == t.DType && dt == BF16:
			data, typ = BF16Bytes(t.Float32()), gguf.BF16 // exact: the values are bf16
		case dt == t.DType && dt == F16:
			data, typ = F16Bytes(t.Float32()), gguf.F16
		default:
			convErr = fmt.Errorf("llama: cannot export %s weights as %s exactly", safetensorsName(t.DType), safetensorsName(dt))
			return
		}
		if permuteHeads > 0 {
			data = permuteRope(data, rows, int(typ.RowBytes(uint64(cols))), permuteHeads)
		}
		tensors = append(tensors, gguf.Tensor{Name: name, Type: typ, Dims: []uint64{uint64(cols), uint64(rows)}, Data: data})
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
		p := fmt.Sprintf("blk.%d.", i)
		vec(p+"attn_norm.weight", ly.attnNorm, 0)
		mat(p+"attn_q.weight", ly.q, cfg.Heads)
		mat(p+"attn_k.weight", ly.k, cfg.KVHeads)
		mat(p+"attn_v.weight", ly.v, 0)
		mat(p+"attn_output.weight", ly.o, 0)
		vec(p+"attn_q.bias", ly.qb, cfg.Heads)
		vec(p+"attn_k.bias", ly.kb, cfg.KVHeads)
		vec(p+"attn_v.bias", ly.vb, 0)
		vec(p+"attn_output.bias", ly.ob, 0)
		vec(p+"ffn_norm.weight", ly.mlpNorm, 0)
		mat(p+"ffn_gate.weight", ly.gate, 0)
		mat(p+"ffn_up.weight", ly.up, 0)
		mat(p+"ffn_down.weight", ly.down, 0)
		if ly.gateB != nil || ly.upB != nil || ly.downB != nil {
			return errors.New("llama: ExportGGUF does not export MLP biases")
		}
	}
	vec("output_norm.weight", m.w.norm, 0)
	if !cfg.TieEmbeddings {
		mat("output.weight", m.w.lmHead, 0)
	}
	if convErr != nil {
		return convErr
	}

	V := cfg.VocabSize
	if V < 259 {
		return fmt.Errorf("llama: ExportGGUF needs a vocabulary of at least 259 tokens, got %d", V)
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
	ftype := map[DType]uint32{F32: 0, F16: 1, BF16: 32}[dt] // LLAMA_FTYPE_ALL_F32, MOSTLY_F16, MOSTLY_BF16
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: m.info.Name},
		{Key: "general.file_type", Value: ftype},
		{Key: "general.alignment", Value: uint32(gguf.Alignment)},
		{Key: "llama.vocab_size", Value: uint32(V)},
		{Key: "llama.context_length", Value: uint32(cfg.MaxPositions)},
		{Key: "llama.embedding_length", Value: uint32(cfg.HiddenSize)},
		{Key: "llama.block_count", Value: uint32(cfg.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(cfg.IntermediateSize)},
		{Key: "llama.attention.head_count", Value: uint32(cfg.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(cfg.KVHeads)},
		{Key: "llama.attention.key_length", Value: uint32(cfg.HeadDim)},
		{Key: "llama.attention.value_length", Value: uint32(cfg.HeadDim)},
		{Key: "llama.rope.dimension_count", Value: uint32(cfg.HeadDim)},
		{Key: "llama.rope.freq_base", Value: float32(cfg.RopeTheta)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(cfg.RMSNormEps)},
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
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	if err := gguf.Write(f, kvs, tensors); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
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

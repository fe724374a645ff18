package llama

import (
	"errors"
	"fmt"
	"os"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// ExportGGUF writes the checkpoint in dir as a GGUF file for llama.cpp's
// "llama" architecture with the same weights in dtype dt: F32 (exact for
// any checkpoint) or the checkpoint's own dtype (the bytes as stored). It
// is WriteGGUF with gguf.F32, gguf.BF16 or gguf.F16.
func ExportGGUF(dir, path string, dt DType) error {
	t := map[DType]gguf.Type{F32: gguf.F32, BF16: gguf.BF16, F16: gguf.F16}[dt]
	_, err := WriteGGUF(dir, path, t)
	return err
}

// GGUFReport says what WriteGGUF wrote.
type GGUFReport struct {
	// Tensors is the number of tensors written.
	Tensors int
	// Fallback lists the matrices written as F32 because their rows are not
	// a multiple of the quantized type's block (32 values).
	Fallback []string
	// Bytes is the size of the file.
	Bytes int64
}

// WriteGGUF writes the checkpoint in dir as a GGUF file (version 3) for
// llama.cpp's "llama" architecture, its matrices in type t: F32 (exact), F16
// or BF16 (exact when the checkpoint has that dtype; otherwise an error), or
// quantized Q8_0 or Q4_0 (QuantizeQ8_0, QuantizeQ4_0: ggml's reference
// quantizers). A matrix whose rows are not a multiple of 32 values cannot
// be quantized; it is written as F32 and listed in the report. (llama.cpp's
// converter writes F16 there, but llama.cpp then rounds that matrix's
// activations to F16 too, and pdserve does not: with F32 both multiply
// the same values.) Norm gains and biases are always F32, as llama.cpp
// expects.
//
// Tensors get llama.cpp's names (token_embd, blk.N.attn_q, …, output_norm,
// output when untied). The rows of wq and wk (and their biases) are permuted
// from Hugging Face's rotate-half RoPE layout back to Meta's interleaved
// pairs, which llama.cpp's llama architecture rotates (and Load reads back
// the same way): within a head of dimension d, GGUF row 2i+s is checkpoint
// row s·d/2 + i (s = 0, 1) — the inverse of the permutation transformers'
// convert_llama_weights_to_hf applies. The vocabulary is a placeholder of
// vocab_size tokens (SentencePiece "llama" model: <unk>, <s>, </s>, the 256
// byte tokens, then "▁tN"): such files are for token-id prompts and
// comparisons.
//
// It returns an error for rope_scaling, a sliding window and MLP biases,
// which it does not export, and for an unsupported type.
func WriteGGUF(dir, path string, typ gguf.Type) (rep GGUFReport, err error) {
	switch typ {
	case gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0, gguf.Q4_0:
	default:
		return rep, fmt.Errorf("llama: WriteGGUF: type %s is not supported; want F32, F16, BF16, Q8_0 or Q4_0", typ)
	}
	m, err := Load(dir, Options{})
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	cfg := &m.w.cfg
	if cfg.RopeScaling != nil {
		return rep, errors.New("llama: WriteGGUF does not export rope_scaling")
	}
	if cfg.SlidingWindow > 0 && cfg.SlidingWindow < cfg.MaxPositions {
		return rep, errors.New("llama: WriteGGUF does not export a sliding window")
	}
	var tensors []gguf.Tensor
	var convErr error
	mat := func(name string, t *tensor, permuteHeads int) {
		rows, cols := t.Rows(), t.Cols()
		vals := F32Bytes(t.Float32())
		if permuteHeads > 0 {
			vals = permuteRope(vals, rows, cols*4, permuteHeads)
		}
		f := f32View(vals)
		var data []byte
		tt := typ
		switch {
		case typ == gguf.F32:
			data = vals
		case (typ == gguf.BF16 || typ == gguf.F16) && t.DType != map[gguf.Type]DType{gguf.BF16: BF16, gguf.F16: F16}[typ]:
			convErr = fmt.Errorf("llama: cannot export %s weights as %s exactly", safetensorsName(t.DType), typ)
			return
		case typ == gguf.BF16:
			data = BF16Bytes(f) // exact: the values are bf16
		case typ == gguf.F16:
			data = F16Bytes(f)
		case cols%32 != 0:
			tt, data = gguf.F32, vals
			rep.Fallback = append(rep.Fallback, name)
		case typ == gguf.Q8_0:
			data = QuantizeQ8_0(f)
		default:
			data = QuantizeQ4_0(f)
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
			return rep, errors.New("llama: WriteGGUF does not export MLP biases")
		}
	}
	vec("output_norm.weight", m.w.norm, 0)
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
	// llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_0.
	ftype := map[gguf.Type]uint32{gguf.F32: 0, gguf.F16: 1, gguf.BF16: 32, gguf.Q8_0: 7, gguf.Q4_0: 2}[typ]
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
	if typ == gguf.Q8_0 || typ == gguf.Q4_0 {
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

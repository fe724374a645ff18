// Package llama2c converts checkpoints of Andrej Karpathy's llama2.c
// (the "legacy", version-0 format written by its export_meta_llama_bin.py and
// train.py) to the Hugging Face layout that package llama loads:
// config.json plus model.safetensors with float32 tensors.
//
// # Overview
//
// The legacy format is little-endian: a header of 7 int32 values
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
// then float32 tensors without padding, each holding all layers one after
// another: token_embedding [vocab, dim], rms_att [layers, dim],
// wq [layers, dim, dim], wk and wv [layers, kv_heads·head_size, dim],
// wo [layers, dim, dim], rms_ffn [layers, dim], w1 [layers, hidden, dim],
// w2 [layers, dim, hidden], w3 [layers, hidden, dim], rms_final [dim], the
// legacy RoPE tables freq_cis_real and freq_cis_imag [seq_len, head_size/2]
// (skipped), and wcls [vocab, dim] only when vocab_size is negative (an
// untied classifier). Matrices are [out, in].
//
// llama2.c (like Meta's checkpoints) rotates interleaved RoPE pairs
// (x[2i], x[2i+1]); Hugging Face rotates halves (x[i], x[i+hs/2]). Convert
// permutes the rows of wq (per query head) and wk (per KV head) so that the
// rotate-half model computes the same function: for head h and j < hs/2,
// HF row h·hs+j is llama2.c row h·hs+2j and HF row h·hs+hs/2+j is llama2.c
// row h·hs+2j+1 (the inverse of the permutation in transformers'
// convert_llama_weights_to_hf.py).
//
// The configuration is llama2.c's: rms_norm_eps 1e-5 and rope_theta 10000
// (its model.py and run.c), max_position_embeddings = seq_len, and the
// Llama 2 SentencePiece ids BOS 1 and EOS 2 that run.c uses.
//
// # Concurrency and ownership
//
// Convert has no shared state; it reads its input whole and writes two
// files in the output directory.
package llama2c

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/pdserve/pdserve/internal/model/llama"
)

// Header is the configuration of a llama2.c checkpoint.
type Header struct {
	Dim, HiddenDim, Layers, Heads, KVHeads int
	// Vocab is |vocab_size|.
	Vocab  int
	SeqLen int
	// Shared is true when the classifier is the token embedding (vocab_size
	// > 0 in the file).
	Shared bool
}

// HeadSize is Dim / Heads.
func (h Header) HeadSize() int { return h.Dim / h.Heads }

// Size is the byte size of a legacy checkpoint with this header.
func (h Header) Size() int64 {
	d, f, L := int64(h.Dim), int64(h.HiddenDim), int64(h.Layers)
	kv := int64(h.KVHeads * h.HeadSize())
	n := int64(h.Vocab)*d + // token_embedding
		L*d + // rms_att
		L*d*d + 2*L*kv*d + L*d*d + // wq, wk, wv, wo
		L*d + // rms_ffn
		3*L*f*d + // w1, w2, w3
		d + // rms_final
		int64(h.SeqLen)*int64(h.HeadSize()) // freq_cis_real + freq_cis_imag: 2 × seq_len × hs/2
	if !h.Shared {
		n += int64(h.Vocab) * d
	}
	return 28 + 4*n
}

// magicV1 is 0x616b3432 ("ak42" in hex digits; bytes "24ka" on disk): the first word of the
// newer llama2.c export formats (version ≥ 1), which this package does not
// read.
const magicV1 = 0x616b3432

// maxDim bounds every header field so that sizes cannot overflow.
const maxDim = 1 << 20

// ErrGGUF is the error ParseHeader (and Convert) returns for a file that
// starts with the GGUF magic: it is a GGUF file already, not a llama2.c
// checkpoint.
var ErrGGUF = errors.New(`llama2c: this is a GGUF file (magic "GGUF"), not a llama2.c checkpoint`)

// ParseHeader reads and validates the 28-byte header of a legacy checkpoint
// of fileSize bytes. It returns ErrGGUF for a GGUF file, and an error for a
// newer (magic "ak42") export, a non-positive or oversized field, heads
// that do not divide dim, KV heads that do not divide heads, an odd head
// size, and a file size other than the header implies.
func ParseHeader(b []byte, fileSize int64) (Header, error) {
	if bytes.HasPrefix(b, []byte("GGUF")) {
		return Header{}, ErrGGUF
	}
	if len(b) < 28 {
		return Header{}, fmt.Errorf("llama2c: %d bytes is too short for a llama2.c header (28 bytes)", len(b))
	}
	if binary.LittleEndian.Uint32(b) == magicV1 {
		return Header{}, fmt.Errorf("llama2c: this is a version-%d llama2.c export (magic \"ak42\"); only the legacy version-0 format is supported",
			int32(binary.LittleEndian.Uint32(b[4:])))
	}
	var v [7]int
	for i := range v {
		v[i] = int(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	h := Header{Dim: v[0], HiddenDim: v[1], Layers: v[2], Heads: v[3], KVHeads: v[4], Vocab: v[5], SeqLen: v[6], Shared: v[5] > 0}
	if h.Vocab < 0 {
		h.Vocab = -h.Vocab
	}
	names := []string{"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"}
	for i, x := range []int{h.Dim, h.HiddenDim, h.Layers, h.Heads, h.KVHeads, h.Vocab, h.SeqLen} {
		if x <= 0 || x > maxDim {
			return Header{}, fmt.Errorf("llama2c: header field %s = %d out of range (0, %d]", names[i], v[i], maxDim)
		}
	}
	switch {
	case h.Dim%h.Heads != 0:
		return Header{}, fmt.Errorf("llama2c: dim %d is not a multiple of n_heads %d", h.Dim, h.Heads)
	case h.Heads%h.KVHeads != 0:
		return Header{}, fmt.Errorf("llama2c: n_heads %d is not a multiple of n_kv_heads %d", h.Heads, h.KVHeads)
	case h.HeadSize()%2 != 0:
		return Header{}, fmt.Errorf("llama2c: head size %d is odd (RoPE rotates pairs)", h.HeadSize())
	}
	if want := h.Size(); fileSize != want {
		return Header{}, fmt.Errorf("llama2c: the header (%+v) implies %d bytes, but the file has %d (truncated, or not a legacy llama2.c checkpoint?)",
			h, want, fileSize)
	}
	return h, nil
}

// Convert reads the legacy llama2.c checkpoint in and writes outDir/config.json
// and outDir/model.safetensors (F32; see the package comment), creating
// outDir if needed and replacing those two files. It returns the header, or
// an error for an unreadable or invalid input (see ParseHeader) or a failed
// write.
func Convert(in, outDir string) (Header, error) {
	raw, err := os.ReadFile(in)
	if err != nil {
		return Header{}, fmt.Errorf("llama2c: %w", err)
	}
	h, err := ParseHeader(raw, int64(len(raw)))
	if err != nil {
		return Header{}, fmt.Errorf("%s: %w", in, err)
	}
	cfg, tensors := toHF(h, raw[28:])
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Header{}, fmt.Errorf("llama2c: %w", err)
	}
	cj, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return Header{}, err
	}
	if err := os.WriteFile(filepath.Join(outDir, "config.json"), append(cj, '\n'), 0o644); err != nil {
		return Header{}, fmt.Errorf("llama2c: %w", err)
	}
	if err := llama.WriteSafetensorsFile(filepath.Join(outDir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		return Header{}, fmt.Errorf("llama2c: %w", err)
	}
	return h, nil
}

// hfConfig is the config.json Convert writes (transformers' LlamaConfig
// field names).
type hfConfig struct {
	Architectures     []string `json:"architectures"`
	ModelType         string   `json:"model_type"`
	HiddenSize        int      `json:"hidden_size"`
	IntermediateSize  int      `json:"intermediate_size"`
	NumHiddenLayers   int      `json:"num_hidden_layers"`
	NumAttentionHeads int      `json:"num_attention_heads"`
	NumKeyValueHeads  int      `json:"num_key_value_heads"`
	HeadDim           int      `json:"head_dim"`
	HiddenAct         string   `json:"hidden_act"`
	RMSNormEps        float64  `json:"rms_norm_eps"`
	RopeTheta         float64  `json:"rope_theta"`
	MaxPositions      int      `json:"max_position_embeddings"`
	VocabSize         int      `json:"vocab_size"`
	TieWordEmbeddings bool     `json:"tie_word_embeddings"`
	BOSTokenID        int      `json:"bos_token_id"`
	EOSTokenID        int      `json:"eos_token_id"`
	TorchDType        string   `json:"torch_dtype"`
}

// toHF splits the tensor data (after the header) into HF tensors.
func toHF(h Header, data []byte) (hfConfig, []llama.SafetensorsTensor) {
	cfg := hfConfig{
		Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama",
		HiddenSize: h.Dim, IntermediateSize: h.HiddenDim, NumHiddenLayers: h.Layers,
		NumAttentionHeads: h.Heads, NumKeyValueHeads: h.KVHeads, HeadDim: h.HeadSize(),
		HiddenAct: "silu", RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositions: h.SeqLen,
		VocabSize: h.Vocab, TieWordEmbeddings: h.Shared, BOSTokenID: 1, EOSTokenID: 2, TorchDType: "float32",
	}
	off := 0
	take := func(n int) []byte {
		b := data[off : off+4*n]
		off += 4 * n
		return b
	}
	d, f, L, hs := h.Dim, h.HiddenDim, h.Layers, h.HeadSize()
	kv := h.KVHeads * hs
	emb := take(h.Vocab * d)
	rmsAtt := take(L * d)
	wq := take(L * d * d)
	wk := take(L * kv * d)
	wv := take(L * kv * d)
	wo := take(L * d * d)
	rmsFFN := take(L * d)
	w1 := take(L * f * d)
	w2 := take(L * d * f)
	w3 := take(L * f * d)
	rmsFinal := take(d)
	take(h.SeqLen * hs) // freq_cis_real and freq_cis_imag
	var wcls []byte
	if !h.Shared {
		wcls = take(h.Vocab * d)
	}
	t := func(name string, b []byte, shape ...int) llama.SafetensorsTensor {
		return llama.SafetensorsTensor{Name: name, DType: llama.F32, Shape: shape, Data: b}
	}
	out := []llama.SafetensorsTensor{t("model.embed_tokens.weight", emb, h.Vocab, d)}
	for i := range L {
		p := fmt.Sprintf("model.layers.%d.", i)
		out = append(out,
			t(p+"input_layernorm.weight", rmsAtt[4*i*d:4*(i+1)*d], d),
			t(p+"self_attn.q_proj.weight", PermuteRoPE(wq[4*i*d*d:4*(i+1)*d*d], h.Heads, hs, d), d, d),
			t(p+"self_attn.k_proj.weight", PermuteRoPE(wk[4*i*kv*d:4*(i+1)*kv*d], h.KVHeads, hs, d), kv, d),
			t(p+"self_attn.v_proj.weight", wv[4*i*kv*d:4*(i+1)*kv*d], kv, d),
			t(p+"self_attn.o_proj.weight", wo[4*i*d*d:4*(i+1)*d*d], d, d),
			t(p+"post_attention_layernorm.weight", rmsFFN[4*i*d:4*(i+1)*d], d),
			t(p+"mlp.gate_proj.weight", w1[4*i*f*d:4*(i+1)*f*d], f, d),
			t(p+"mlp.down_proj.weight", w2[4*i*d*f:4*(i+1)*d*f], d, f),
			t(p+"mlp.up_proj.weight", w3[4*i*f*d:4*(i+1)*f*d], f, d),
		)
	}
	out = append(out, t("model.norm.weight", rmsFinal, d))
	if !h.Shared {
		out = append(out, t("lm_head.weight", wcls, h.Vocab, d))
	}
	return cfg, out
}

// PermuteRoPE reorders the rows of a q or k projection ([heads·hs, in]
// float32, little-endian bytes) from the interleaved RoPE layout (Meta,
// llama2.c) to rotate-half (Hugging Face): per head h and j < hs/2, output
// row h·hs+j is input row h·hs+2j and output row h·hs+hs/2+j is input row
// h·hs+2j+1. It returns a new slice.
func PermuteRoPE(w []byte, heads, hs, in int) []byte {
	rowBytes := 4 * in
	out := make([]byte, len(w))
	for h := range heads {
		for j := range hs / 2 {
			src0 := (h*hs + 2*j) * rowBytes
			src1 := (h*hs + 2*j + 1) * rowBytes
			dst0 := (h*hs + j) * rowBytes
			dst1 := (h*hs + hs/2 + j) * rowBytes
			copy(out[dst0:dst0+rowBytes], w[src0:src0+rowBytes])
			copy(out[dst1:dst1+rowBytes], w[src1:src1+rowBytes])
		}
	}
	return out
}

// Float32s decodes little-endian float32 bytes (for tests and tools).
func Float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

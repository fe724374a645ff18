package llama_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestExportGGUF exports a small checkpoint and checks the header, the
// tensor shapes, and that q and k rows are permuted to interleaved RoPE
// pairs while the other tensors keep their bytes.
func TestExportGGUF(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Vocab = 300
	dir := spec.WriteT(t)
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := llama.ExportGGUF(dir, out, llama.F32); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	h, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"general.architecture": "llama", "llama.block_count": uint32(2), "llama.embedding_length": uint32(64),
		"llama.attention.head_count": uint32(4), "llama.attention.head_count_kv": uint32(2),
		"llama.feed_forward_length": uint32(96), "llama.rope.freq_base": float32(10000),
		"tokenizer.ggml.model": "llama",
	} {
		if v, _ := h.Value(k); v != want {
			t.Errorf("%s = %v, want %v", k, v, want)
		}
	}
	if v, _ := h.Value("tokenizer.ggml.tokens"); len(v.([]string)) != 300 || v.([]string)[3] != "<0x00>" {
		t.Errorf("vocabulary: %v", v)
	}
	byName := map[string]gguf.TensorInfo{}
	for _, ti := range h.Tensors {
		byName[ti.Name] = ti
	}
	if len(h.Tensors) != 3+2*9 { // token_embd, output_norm, output; 9 per layer
		t.Errorf("%d tensors", len(h.Tensors))
	}
	src := map[string][]byte{}
	for _, st := range spec.Tensors() {
		src[st.Name] = st.Data
	}
	data := func(name string) []byte {
		ti := byName[name]
		n := uint64(4)
		for _, d := range ti.Dims {
			n *= d
		}
		return raw[ti.Offset : ti.Offset+n]
	}
	if ti := byName["blk.1.attn_q.weight"]; ti.Type != gguf.F32 || ti.Dims[0] != 64 || ti.Dims[1] != 64 {
		t.Fatalf("attn_q %+v", ti)
	}
	const D, rowBytes = 16, 64 * 4
	for _, c := range []struct {
		gg, hf string
		heads  int
	}{{"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4}, {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 2}} {
		got, want := data(c.gg), src[c.hf]
		for h := range c.heads {
			for i := range D / 2 {
				for s := range 2 {
					g, w := h*D+2*i+s, h*D+s*D/2+i
					if !bytes.Equal(got[g*rowBytes:(g+1)*rowBytes], want[w*rowBytes:(w+1)*rowBytes]) {
						t.Fatalf("%s row %d is not checkpoint row %d", c.gg, g, w)
					}
				}
			}
		}
	}
	for gg, hf := range map[string]string{"blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
		"blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight", "output.weight": "lm_head.weight",
		"token_embd.weight": "model.embed_tokens.weight"} {
		if !bytes.Equal(data(gg), src[hf]) {
			t.Errorf("%s differs from %s", gg, hf)
		}
	}
	if err := llama.ExportGGUF(dir, out, llama.BF16); err == nil {
		t.Error("F32 weights exported as BF16")
	}
}

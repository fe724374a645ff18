package llama_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// writeGGUF writes the checkpoint dir as a GGUF file of type typ.
func writeGGUF(t *testing.T, dir string, typ gguf.Type) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "m-"+typ.String()+".gguf")
	if _, err := llama.WriteGGUF(dir, out, llama.FileType(typ.String())); err != nil {
		t.Fatal(err)
	}
	return out
}

// logitsOf returns the logits after every token of toks.
func logitsOf(t *testing.T, m *llama.Model, toks []int32) []float32 {
	t.Helper()
	p := newPool(t, m, 8, max(4, (len(toks)+7)/8))
	lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: alloc(t, p, p.PagesFor(len(toks))), Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	return lg[0]
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// snapped returns spec's checkpoint with every matrix rounded onto the grid
// of quantized type typ (quantized and dequantized), so that the GGUF file
// of that type holds exactly the checkpoint's weights.
func snapped(t *testing.T, spec llamatest.Spec, typ gguf.Type) string {
	t.Helper()
	ts := spec.Tensors()
	for i := range ts {
		if len(ts[i].Shape) != 2 || typ == gguf.F32 {
			continue
		}
		v := make([]float32, len(ts[i].Data)/4)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(ts[i].Data[4*j:]))
		}
		quant := map[gguf.Type]func([]float32) []byte{gguf.Q8_0: llama.QuantizeQ8_0, gguf.Q4_0: llama.QuantizeQ4_0,
			gguf.Q4_1: llama.QuantizeQ4_1, gguf.Q5_0: llama.QuantizeQ5_0, gguf.Q5_1: llama.QuantizeQ5_1}[typ]
		q := quant(v)
		ts[i].Data = llama.F32Bytes(llama.Dequantize(typ, q, len(v)))
	}
	return writeCkpt(t, spec, nil, ts)
}

// TestGGUFMatchesCheckpoint exports checkpoints to GGUF (llama.cpp's
// interleaved RoPE layout for llama, rotate-half for qwen3 and gemma2) and checks that loading the file computes the
// checkpoint's function: F32 and BF16 exports to float rounding; Q8_0,
// Q4_0, Q4_1, Q5_0 and Q5_1 exports of checkpoints already on their grid (so the weights are
// the same) within the error of quantizing the activations to 8 bits
// (large on this random model: its dot products are small against the
// norms of their operands).
func TestGGUFMatchesCheckpoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for name, spec := range map[string]llamatest.Spec{
		"llama-f32": llamatest.Tiny(),
		"llama-bf16-tied": func() llamatest.Spec {
			s := llamatest.Tiny()
			s.DType, s.Tied = llama.BF16, true
			return s
		}(),
		"qwen2-bias": func() llamatest.Spec {
			s := llamatest.Tiny()
			s.Architecture, s.QKVBias = "Qwen2ForCausalLM", true
			return s
		}(),
		"qwen3-headdim":   qwen3Tiny(),
		"qwen3-bf16-tied": func() llamatest.Spec { s := qwen3Tiny(); s.DType, s.Tied = llama.BF16, true; return s }(),
		"gemma2":          gemma2Tiny(),
		"qwen3moe":        llamatest.TinyMoE(),
		"qwen3moe-bf16":   func() llamatest.Spec { s := llamatest.TinyMoE(); s.DType = llama.BF16; return s }(),
		"mixtral":         llamatest.TinyMixtral(),
	} {
		t.Run(name, func(t *testing.T) {
			spec.Vocab = 300
			toks := randomTokens(rng, 30, spec.Vocab)
			gemma := spec.Architecture == "Gemma2ForCausalLM"
			exact := 2e-5
			if gemma {
				exact = 2e-3 // the file's gelu goes through ggml's float16 table
			}
			for _, c := range []struct {
				typ gguf.Type
				tol float64
			}{{gguf.F32, exact}, {map[llama.DType]gguf.Type{llama.F32: gguf.F32, llama.BF16: gguf.BF16}[spec.DType], exact}, {gguf.Q8_0, 0.3}, {gguf.Q4_0, 0.3},
				{gguf.Q4_1, 0.3}, {gguf.Q5_0, 0.3}, {gguf.Q5_1, 0.3}} {
				dir := spec.WriteT(t)
				if c.typ.BlockSize() == 32 {
					// A mixture of experts routes some tokens elsewhere
					// once its activations are quantized to 8 bits (a
					// token whose k-th and next experts are nearly tied):
					// too many to compare position by position. Its quantized files are checked bit for bit
					// across paths (TestMoEBatchInvariance) and against
					// llama.cpp (tools/llamacpp-bench) instead.
					if spec.DType != llama.F32 || spec.Experts > 0 {
						continue
					}
					dir = snapped(t, spec, c.typ)
				}
				want := logitsOf(t, load(t, dir, llama.Options{}), toks)
				m := load(t, writeGGUF(t, dir, c.typ), llama.Options{})
				qwen3 := spec.Architecture == "Qwen3ForCausalLM" || spec.Architecture == "Qwen3MoeForCausalLM"
				if mc := m.Config(); m.Info().VocabSize != spec.Vocab || mc.RopeInterleaved == (qwen3 || gemma) || mc.QKNorm != qwen3 || mc.PostNorms != gemma ||
					mc.Experts != spec.Experts || mc.ExpertsUsed != spec.ExpertsUsed || mc.ExpertIntermediate != expertWidth(spec) {
					t.Fatalf("%s: info %+v, config %+v", c.typ, m.Info(), m.Config())
				}
				d := maxDiff(logitsOf(t, m, toks), want)
				t.Logf("%s: max |Δ logit| vs the checkpoint %.3g", c.typ, d)
				if d > c.tol {
					t.Errorf("%s: max |Δ logit| = %.3g, want ≤ %g", c.typ, d, c.tol)
				}
			}
		})
	}
}

// TestGGUFQuantizedInvariance checks that a quantized model's logits do
// not depend on the batch, the chunking, the thread count or the kernels,
// for the llama, qwen3, gemma2, qwen3moe, gemma3 (its 7-position window
// crossed by the 25 tokens, mid-page) and phi3 (fused matrices as views)
// architectures. Under the race detector, which slows the Go loops several
// times, the architectures after llama take one type (the kernels are the
// same; CI runs them all without it, .ci/run).
func TestGGUFQuantizedInvariance(t *testing.T) {
	tiny := llamatest.Tiny()
	tiny.Vocab = 300
	moe := llamatest.TinyMoE()
	moe.Vocab = 300
	all := []gguf.Type{gguf.Q8_0, gguf.Q4_0, gguf.Q4_1, gguf.Q5_0, gguf.Q5_1, gguf.IQ4_NL}
	for i, spec := range []llamatest.Spec{tiny, qwen3Tiny(), gemma2Tiny(), moe, gemma3Tiny(), phi3Tiny()} {
		types := all
		if testbin.RaceEnabled && i > 0 {
			types = all[1:2]
		}
		t.Run(spec.Config()["architectures"].([]string)[0], func(t *testing.T) { ggufInvariance(t, spec, types) })
	}
}

// ggufInvariance checks that spec's GGUF files of types give the same
// logits whole and chunked, on every kernel choice and 1 and 3 threads.
func ggufInvariance(t *testing.T, spec llamatest.Spec, types []gguf.Type) {
	dir := spec.WriteT(t)
	rng := rand.New(rand.NewPCG(8, 8))
	toks := randomTokens(rng, 25, spec.Vocab)
	for _, typ := range types {
		path := writeGGUF(t, dir, typ)
		var want []float32
		for _, k := range llama.KernelChoices {
			for _, threads := range []int{1, 3} {
				m, err := llama.Load(path, llama.Options{Kernels: k, Threads: threads})
				if err != nil {
					t.Logf("%s: %v", k, err)
					continue
				}
				t.Cleanup(func() { _ = m.Close() })
				whole := logitsOf(t, m, toks)
				if want == nil {
					want = whole
				}
				// In chunks of 7, 1, 17 tokens.
				p := newPool(t, m, 8, 4)
				pages := alloc(t, p, 4)
				var chunked []float32
				for _, r := range [][2]int{{0, 7}, {7, 8}, {8, 25}} {
					lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: pages, Pos: r[0], Tokens: toks[r[0]:r[1]]}})
					if err != nil {
						t.Fatal(err)
					}
					chunked = append(chunked, lg[0]...)
				}
				for i := range want {
					if math.Float32bits(whole[i]) != math.Float32bits(want[i]) || math.Float32bits(chunked[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s kernels %s threads %d: logit %d whole %v chunked %v, reference %v", typ, k, threads, i, whole[i], chunked[i], want[i])
					}
				}
			}
		}
	}
}

// TestGGUFLoadErrors checks that bad GGUF files are refused with an error
// naming the problem.
func TestGGUFLoadErrors(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Vocab = 300
	good := writeGGUF(t, spec.WriteT(t), gguf.Q8_0)
	f := readGGUF(t, good)
	// rewrite writes the file's metadata and tensors after edit.
	rewrite := func(edit func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) string {
		return rewriteGGUF(t, f, edit)
	}
	setKV := func(key string, v any) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range kvs {
				if kvs[i].Key == key {
					if v == nil {
						return append(kvs[:i], kvs[i+1:]...), ts
					}
					kvs[i].Value = v
				}
			}
			return kvs, ts
		}
	}
	editTensor := func(name string, edit func(*gguf.Tensor) bool) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			var out []gguf.Tensor
			for _, tn := range ts {
				if tn.Name != name || edit(&tn) {
					out = append(out, tn)
				}
			}
			return kvs, out
		}
	}
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	trunc := filepath.Join(t.TempDir(), "trunc.gguf")
	if err := os.WriteFile(trunc, raw[:len(raw)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		want       []string
	}{
		{"truncated", trunc, []string{"trunc.gguf", "lies past its end", "truncated file?"}},
		{"architecture", rewrite(setKV("general.architecture", "gpt2")), []string{`general.architecture "gpt2" is not supported`}},
		{"no layers", rewrite(setKV("llama.block_count", nil)), []string{"no llama.block_count"}},
		{"absurd layers", rewrite(setKV("llama.block_count", uint32(1<<30))), []string{"llama.block_count is 1073741824, want 1 to 4096"}},
		{"string heads", rewrite(setKV("llama.attention.head_count", "four")), []string{"llama.attention.head_count is a string, want an unsigned integer"}},
		{"heads", rewrite(setKV("llama.attention.head_count_kv", uint32(3))), []string{"head_count 4 is not a multiple of llama.attention.head_count_kv 3"}},
		{"eos", rewrite(setKV("tokenizer.ggml.eos_token_id", uint32(5000))), []string{"tokenizer.ggml.eos_token_id 5000 is outside the vocabulary"}},
		{"missing tensor", rewrite(editTensor("blk.1.ffn_up.weight", func(*gguf.Tensor) bool { return false })), []string{`tensor "blk.1.ffn_up.weight" not found`}},
		{"shape", rewrite(editTensor("blk.0.attn_k.weight", func(tn *gguf.Tensor) bool {
			tn.Dims = []uint64{32, 64}
			tn.Data = tn.Data[:2*34*32]
			return true
		})), []string{`tensor "blk.0.attn_k.weight" has shape [64 32]`, "implies [32 64]"}},
		{"type", rewrite(editTensor("blk.0.attn_q.weight", func(tn *gguf.Tensor) bool {
			tn.Type = gguf.Q8_1 // an activation format, never a weight's
			tn.Data = make([]byte, 64*2*36)
			return true
		})), []string{`tensor "blk.0.attn_q.weight" has type Q8_1`, "want F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"}},
		{"quantized norm", rewrite(editTensor("output_norm.weight", func(tn *gguf.Tensor) bool {
			tn.Type = gguf.Q8_0
			tn.Data = make([]byte, 2*34)
			return true
		})), []string{`tensor "output_norm.weight" has type Q8_0`, "want F32, F16 or BF16"}},
		{"extra tensor", rewrite(func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kvs, append(ts, gguf.Tensor{Name: "blk.0.frob.weight", Type: gguf.F32, Dims: []uint64{4}, Data: make([]byte, 16)})
		}), []string{`"blk.0.frob.weight"`, "does not use"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, c.path, llama.Options{}, c.want...) })
	}
}

// TestGGUFKMixes writes a checkpoint 256 wide as each of llama.cpp's
// K-quant mixes — Q4_K_M (Q4_K matrices, Q6_K for the tied classifier and
// for attn_v and ffn_down of llama.cpp's use-more-bits layers), Q5_K_M
// (the same with Q5_K) and Q3_K_M (Q3_K, with Q5_K for attn_v of layers 0
// and 1, Q4_K for ffn_down and attn_output, Q6_K for the classifier) and
// Q2_K (Q2_K, with Q3_K for attn_v, ffn_down and attn_output) and IQ4_XS
// (IQ4_XS, Q6_K for the classifier; tied and untied) — and
// checks the types, that the model computes the checkpoint's function
// within the quantization error, and that its logits do not depend on
// chunking or threads.
func TestGGUFKMixes(t *testing.T) {
	for _, c := range []struct {
		ft     llama.FileType
		untied bool
		tol    float64 // max |Δ logit| relative to the largest logit
		want   map[string]gguf.Type
	}{
		// Of 2 layers, use-more-bits picks the last (i ≥ 7n/8).
		{llama.FileQ4_KM, false, 0.25, map[string]gguf.Type{"token_embd.weight": gguf.Q6_K, "blk.1.attn_v.weight": gguf.Q6_K, "blk.1.ffn_down.weight": gguf.Q6_K,
			"blk.0.attn_v.weight": gguf.Q4_K, "blk.0.ffn_down.weight": gguf.Q4_K, "blk.0.attn_q.weight": gguf.Q4_K,
			"blk.1.ffn_up.weight": gguf.Q4_K, "blk.1.attn_output.weight": gguf.Q4_K, "blk.0.attn_norm.weight": gguf.F32}},
		{llama.FileQ5_KM, false, 0.15, map[string]gguf.Type{"token_embd.weight": gguf.Q6_K, "blk.1.attn_v.weight": gguf.Q6_K, "blk.1.ffn_down.weight": gguf.Q6_K,
			"blk.0.attn_v.weight": gguf.Q5_K, "blk.0.ffn_down.weight": gguf.Q5_K, "blk.0.attn_q.weight": gguf.Q5_K,
			"blk.1.ffn_up.weight": gguf.Q5_K, "blk.1.attn_output.weight": gguf.Q5_K, "blk.0.attn_norm.weight": gguf.F32}},
		{llama.FileQ3_KM, false, 0.3, map[string]gguf.Type{"token_embd.weight": gguf.Q6_K, "blk.0.attn_v.weight": gguf.Q5_K, "blk.1.attn_v.weight": gguf.Q5_K,
			"blk.0.ffn_down.weight": gguf.Q4_K, "blk.1.attn_output.weight": gguf.Q4_K, "blk.0.attn_q.weight": gguf.Q3_K,
			"blk.1.attn_k.weight": gguf.Q3_K, "blk.1.ffn_up.weight": gguf.Q3_K, "blk.0.ffn_gate.weight": gguf.Q3_K, "blk.0.attn_norm.weight": gguf.F32}},
		// 4 query heads per 2 KV heads: attn_v Q3_K.
		{llama.FileQ2_K, false, 0.45, map[string]gguf.Type{"token_embd.weight": gguf.Q6_K, "blk.0.attn_v.weight": gguf.Q3_K, "blk.1.ffn_down.weight": gguf.Q3_K,
			"blk.0.attn_output.weight": gguf.Q3_K, "blk.0.attn_q.weight": gguf.Q2_K, "blk.1.ffn_gate.weight": gguf.Q2_K, "blk.0.attn_norm.weight": gguf.F32}},
		{llama.FileIQ4XS, false, 0.25, map[string]gguf.Type{"token_embd.weight": gguf.Q6_K, "blk.0.attn_v.weight": gguf.IQ4_XS, "blk.0.ffn_down.weight": gguf.IQ4_XS,
			"blk.1.attn_output.weight": gguf.IQ4_XS, "blk.0.attn_q.weight": gguf.IQ4_XS, "blk.1.ffn_up.weight": gguf.IQ4_XS, "blk.0.attn_norm.weight": gguf.F32}},
		{llama.FileIQ4XS, true, 0.25, map[string]gguf.Type{"token_embd.weight": gguf.IQ4_XS, "output.weight": gguf.Q6_K}},
		// Untied: the token embedding (rows read dequantized) is Q3_K, the classifier Q6_K.
		{llama.FileQ3_KM, true, 0.3, map[string]gguf.Type{"token_embd.weight": gguf.Q3_K, "output.weight": gguf.Q6_K, "blk.0.attn_q.weight": gguf.Q3_K}},
	} {
		name := string(c.ft)
		if c.untied {
			name += "/untied"
		}
		t.Run(name, func(t *testing.T) { testGGUFKMix(t, c.ft, !c.untied, c.tol, c.want) })
	}
}

func testGGUFKMix(t *testing.T, ft llama.FileType, tied bool, tol float64, want map[string]gguf.Type) {
	spec := llamatest.Tiny()
	spec.Hidden, spec.Intermediate, spec.Vocab, spec.Tied, spec.Scale = 256, 512, 300, tied, 0.05
	dir := spec.WriteT(t)
	out := filepath.Join(t.TempDir(), "kmix.gguf")
	if _, err := llama.WriteGGUF(dir, out, ft); err != nil {
		t.Fatal(err)
	}
	f := readGGUF(t, out)
	for name, typ := range want {
		if ti, ok := f.Tensor(name); !ok || ti.Type != typ {
			t.Errorf("%s: type %v (found %v), want %s", name, ti.Type, ok, typ)
		}
	}
	// A file cut inside a quantized matrix is refused.
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"blk.0.attn_q.weight", "blk.0.attn_v.weight"} {
		ti, _ := f.Tensor(name)
		end := int(ti.Offset) + len(ti.Data)
		cut := filepath.Join(t.TempDir(), "cut.gguf")
		if err := os.WriteFile(cut, raw[:end-ti.Type.BlockBytes()/2], 0o644); err != nil {
			t.Fatal(err)
		}
		wantLoadError(t, cut, llama.Options{}, name, "truncated")
	}
	rng := rand.New(rand.NewPCG(9, 9))
	toks := randomTokens(rng, 20, spec.Vocab)
	ref := logitsOf(t, load(t, dir, llama.Options{}), toks)
	var scale float64
	for _, v := range ref {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	var whole []float32
	for _, threads := range []int{1, 2} {
		m := load(t, out, llama.Options{Threads: threads})
		got := logitsOf(t, m, toks)
		if d := maxDiff(got, ref); d > tol*scale {
			t.Errorf("max |Δ logit| vs the checkpoint = %.3g (largest logit %.3g)", d, scale)
		} else {
			t.Logf("max |Δ logit| vs the checkpoint %.3g (largest logit %.3g)", d, scale)
		}
		if whole == nil {
			whole = got
		}
		p := newPool(t, m, 8, 4)
		pages := alloc(t, p, 4)
		var chunked []float32
		for _, r := range [][2]int{{0, 3}, {3, 4}, {4, 20}} {
			lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: pages, Pos: r[0], Tokens: toks[r[0]:r[1]]}})
			if err != nil {
				t.Fatal(err)
			}
			chunked = append(chunked, lg[0]...)
		}
		for i := range whole {
			if math.Float32bits(got[i]) != math.Float32bits(whole[i]) || math.Float32bits(chunked[i]) != math.Float32bits(whole[i]) {
				t.Fatalf("threads %d: logit %d = %v (chunked %v), 1 thread %v", threads, i, got[i], chunked[i], whole[i])
			}
		}
	}
}

// TestGGUFQwen3Errors checks that a qwen3 file without its q/k norms, or
// with one of the wrong shape, or with a head dimension the metadata
// contradicts, or with an odd or too large rope.dimension_count, is
// refused with an error naming the problem.
func TestGGUFQwen3Errors(t *testing.T) {
	good := writeGGUF(t, qwen3Tiny().WriteT(t), gguf.F32)
	f := readGGUF(t, good)
	if a, _, _ := f.String("general.architecture"); a != "qwen3" {
		t.Fatalf("general.architecture %q, want qwen3", a)
	}
	rewrite := func(edit func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) string {
		return rewriteGGUF(t, f, edit)
	}
	drop := func(name string) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			var out []gguf.Tensor
			for _, tn := range ts {
				if tn.Name != name {
					out = append(out, tn)
				}
			}
			return kvs, out
		}
	}
	for _, c := range []struct {
		name, path string
		want       []string
	}{
		{"no q norm", rewrite(drop("blk.1.attn_q_norm.weight")), []string{`tensor "blk.1.attn_q_norm.weight" not found`}},
		{"no k norm", rewrite(drop("blk.0.attn_k_norm.weight")), []string{`tensor "blk.0.attn_k_norm.weight" not found`}},
		{"k norm shape", rewrite(func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range ts {
				if ts[i].Name == "blk.0.attn_k_norm.weight" {
					ts[i].Dims, ts[i].Data = []uint64{16}, ts[i].Data[:64]
				}
			}
			return kvs, ts
		}), []string{`tensor "blk.0.attn_k_norm.weight" has shape [16]`, "implies [32]"}},
		{"key length", rewrite(func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range kvs {
				if kvs[i].Key == "qwen3.attention.key_length" || kvs[i].Key == "qwen3.attention.value_length" || kvs[i].Key == "qwen3.rope.dimension_count" {
					kvs[i].Value = uint32(16)
				}
			}
			return kvs, ts
		}), []string{`tensor "blk.0.attn_q.weight" has shape [128 64]`, "implies [64 64]"}},
		{"odd rotary dimensions", setRopeDim(rewrite, 15), []string{"qwen3.rope.dimension_count 15: want an even number up to the head dimension 32"}},
		{"rotary dimensions past the head", setRopeDim(rewrite, 34), []string{"qwen3.rope.dimension_count 34"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, c.path, llama.Options{}, c.want...) })
	}
}

// setRopeDim returns rewrite's file with qwen3.rope.dimension_count n.
func setRopeDim(rewrite func(func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) string, n int) string {
	return rewrite(func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		for i := range kvs {
			if kvs[i].Key == "qwen3.rope.dimension_count" {
				kvs[i].Value = uint32(n)
			}
		}
		return kvs, ts
	})
}

// TestGGUFGemma2Errors checks that a gemma2 file without a soft-capping
// value or a post-norm is refused with an error naming it, and that
// WriteGGUF refuses Gemma2 checkpoints llama.cpp would compute differently.
func TestGGUFGemma2Errors(t *testing.T) {
	good := writeGGUF(t, gemma2Tiny().WriteT(t), gguf.F32)
	f := readGGUF(t, good)
	if a, _, _ := f.String("general.architecture"); a != "gemma2" {
		t.Fatalf("general.architecture %q, want gemma2", a)
	}
	rewrite := func(dropKey, dropTensor string) string {
		var kvs []gguf.KV
		for _, kv := range f.KV {
			if kv.Key != dropKey {
				kvs = append(kvs, kv)
			}
		}
		var ts []gguf.Tensor
		for _, ti := range f.Tensors {
			if ti.Name != dropTensor {
				ts = append(ts, gguf.Tensor{Name: ti.Name, Type: ti.Type, Dims: ti.Dims, Data: ti.Data})
			}
		}
		p := filepath.Join(t.TempDir(), "bad.gguf")
		fh, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := gguf.Write(fh, kvs, ts); err != nil {
			t.Fatal(err)
		}
		if err := fh.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wantLoadError(t, rewrite("gemma2.final_logit_softcapping", ""), llama.Options{}, "no gemma2.final_logit_softcapping")
	wantLoadError(t, rewrite("", "blk.1.post_ffw_norm.weight"), llama.Options{}, `tensor "blk.1.post_ffw_norm.weight" not found`)
	for name, c := range map[string]struct {
		edit func(c map[string]any)
		want string
	}{
		"untied":          {func(c map[string]any) { c["tie_word_embeddings"] = false }, "no separate classifier"},
		"no final cap":    {func(c map[string]any) { c["final_logit_softcapping"] = nil }, "needs attn_logit_softcapping and final_logit_softcapping"},
		"another scaling": {func(c map[string]any) { c["query_pre_attn_scalar"] = 64 }, "attention scale 0.125, llama.cpp's gemma2 would use 0.17677"},
	} {
		spec := gemma2Tiny()
		ts := spec.Tensors()
		if name == "untied" {
			ts = append(ts, llama.SafetensorsTensor{Name: "lm_head.weight", DType: llama.F32, Shape: []int{spec.Vocab, spec.Hidden}, Data: make([]byte, 4*spec.Vocab*spec.Hidden)})
		}
		dir := writeCkpt(t, spec, c.edit, ts)
		if _, err := llama.WriteGGUF(dir, filepath.Join(t.TempDir(), "m.gguf"), llama.FileF32); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: WriteGGUF error %v, want one containing %q", name, err, c.want)
		}
	}
}

// rewriteGGUF writes f's metadata and tensors, after edit, to a new file
// in t's temporary directory and returns its path.
func rewriteGGUF(t *testing.T, f *gguf.File, edit func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) string {
	t.Helper()
	kvs := append([]gguf.KV(nil), f.KV...)
	var ts []gguf.Tensor
	for _, ti := range f.Tensors {
		ts = append(ts, gguf.Tensor{Name: ti.Name, Type: ti.Type, Dims: ti.Dims, Data: ti.Data})
	}
	kvs, ts = edit(kvs, ts)
	p := filepath.Join(t.TempDir(), "bad.gguf")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.Write(fh, kvs, ts); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// readGGUF reads and parses the GGUF file at path.
func readGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

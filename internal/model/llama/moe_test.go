package llama_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// moe is transformers' Qwen3MoeSparseMoeBlock (or MixtralSparseMoeBlock) in float64 for one token's
// normalised input h (layer prefix p): the softmax of the router logits,
// the top ExpertsUsed experts (divided by their sum with norm_topk_prob),
// and the weighted sum of their SwiGLU outputs.
func (r *refModel) moe(p string, h []float64) []float64 {
	s := r.spec
	block, gate, up, down, F := "mlp.", "gate_proj", "up_proj", "down_proj", s.ExpertIntermediate
	if s.Architecture == "MixtralForCausalLM" { // MixtralSparseMoeBlock: softmax, top k, renormalised
		block, gate, up, down, F = "block_sparse_moe.", "w1", "w3", "w2", s.Intermediate
	}
	norm := s.NormTopK || s.Architecture == "MixtralForCausalLM"
	logits := r.linear(p+block+"gate", h, s.Experts, false)
	m := math.Inf(-1)
	for _, l := range logits {
		m = math.Max(m, l)
	}
	var z float64
	prob := make([]float64, len(logits))
	for i, l := range logits {
		prob[i] = math.Exp(l - m)
		z += prob[i]
	}
	idx := make([]int, len(prob))
	for i := range idx {
		prob[i] /= z
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return prob[idx[a]] > prob[idx[b]] })
	top := idx[:s.ExpertsUsed]
	var sum float64
	for _, e := range top {
		sum += prob[e]
	}
	out := make([]float64, s.Hidden)
	for _, e := range top {
		w := prob[e]
		if norm {
			w /= sum
		}
		ep := fmt.Sprintf("%s%sexperts.%d.", p, block, e)
		gt := r.linear(ep+gate, h, F, false)
		u := r.linear(ep+up, h, F, false)
		for i := range gt {
			gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * u[i]
		}
		for i, v := range r.linear(ep+down, gt, s.Hidden, false) {
			out[i] += w * v
		}
	}
	return out
}

// moeWide is TinyMoE 256 wide (hidden and experts), so that its GGUF files
// can hold K-quants, with a 300-token vocabulary for WriteGGUF.
func moeWide() llamatest.Spec {
	s := llamatest.TinyMoE()
	s.Hidden, s.ExpertIntermediate, s.Vocab, s.Scale = 256, 256, 300, 0.15
	return s
}

// TestMoEBatchInvariance runs three sequences of a mixture-of-experts model
// through a schedule that mixes prefill chunks, one-token decode steps and
// sequences of different lengths in the same batches — so that each
// expert's rows change from batch to batch — on every kernel set and on 1
// and 3 threads, for the checkpoint and its F32, BF16, Q8_0, Q4_1, IQ4_NL
// and Q4_K_M GGUF files (under the race detector Q4_K_M alone), and
// checks every logit is bit-identical to the sequence prefilled alone and
// whole on the pure-Go kernels.
func TestMoEBatchInvariance(t *testing.T) {
	spec := moeWide()
	dir := spec.WriteT(t)
	rng := rand.New(rand.NewPCG(30, 1))
	seqs := [][]int32{randomTokens(rng, 23, spec.Vocab), randomTokens(rng, 9, spec.Vocab), randomTokens(rng, 31, spec.Vocab)}
	schedule := [][]step{
		{{0, 0, 5}, {1, 0, 8}},
		{{0, 5, 6}, {1, 8, 9}, {2, 0, 13}},
		{{2, 13, 14}, {0, 6, 23}},
		{{2, 14, 30}},
		{{2, 30, 31}},
	}
	files := map[string]string{}
	types := []llama.FileType{llama.FileF32, llama.FileQ8_0, llama.FileQ4_1, llama.FileIQ4NL, llama.FileQ4_KM}
	if testbin.RaceEnabled {
		// The race detector slows the Go loops several times: one
		// quantized file (CI runs them all, and the checkpoint, without
		// it: .ci/run).
		types = []llama.FileType{llama.FileQ4_KM}
	} else {
		files["checkpoint"] = dir
		bspec := spec
		bspec.DType = llama.BF16
		files["BF16"] = writeFileType(t, bspec.WriteT(t), llama.FileBF16)
	}
	for _, ft := range types {
		files[string(ft)] = writeFileType(t, dir, ft)
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			solo := load(t, path, llama.Options{Threads: 1, Kernels: llama.KernelsGo})
			if c := solo.Config(); c.Experts != 8 || c.ExpertsUsed != 2 || !c.NormTopK {
				t.Fatalf("config %+v", c)
			}
			sp := newPool(t, solo, 4, 64)
			want := make([][]float32, len(seqs))
			for i, s := range seqs {
				lg, err := solo.ForwardLogits(context.Background(), sp, []model.SeqInput{{Pages: alloc(t, sp, sp.PagesFor(len(s))), Tokens: s}})
				if err != nil {
					t.Fatal(err)
				}
				want[i] = lg[0]
			}
			for _, k := range llama.KernelChoices {
				for _, threads := range []int{1, 3} {
					m, err := llama.Load(path, llama.Options{Kernels: k, Threads: threads})
					if err != nil {
						t.Logf("%s: %v", k, err) // a kernel set this CPU lacks
						continue
					}
					t.Cleanup(func() { _ = m.Close() })
					runSchedule(t, m, seqs, schedule, want, fmt.Sprintf("kernels %s threads %d", k, threads))
				}
			}
		})
	}
}

// TestGGUFQwen3MoEErrors checks that a qwen3moe file without its expert
// counts, with counts that contradict each other or the tensors, or with a
// missing or truncated expert tensor is refused with an error naming the
// problem, and that WriteGGUF refuses a checkpoint whose chosen experts'
// weights are not renormalised (llama.cpp's qwen3moe always renormalises).
func TestGGUFQwen3MoEErrors(t *testing.T) {
	spec := llamatest.TinyMoE()
	spec.Vocab = 300
	good := writeGGUF(t, spec.WriteT(t), gguf.F32)
	f := readGGUF(t, good)
	if a, _, _ := f.String("general.architecture"); a != "qwen3moe" {
		t.Fatalf("general.architecture %q, want qwen3moe", a)
	}
	if ti, ok := f.Tensor("blk.1.ffn_down_exps.weight"); !ok || len(ti.Dims) != 3 || ti.Dims[0] != 64 || ti.Dims[1] != 64 || ti.Dims[2] != 8 {
		t.Fatalf("blk.1.ffn_down_exps.weight: %+v", ti)
	}
	setKV := func(key string, v any) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			var out []gguf.KV
			for _, kv := range kvs {
				if kv.Key == key {
					if v == nil {
						continue
					}
					kv.Value = v
				}
				out = append(out, kv)
			}
			return out, ts
		}
	}
	editTensor := func(name string, edit func(tn *gguf.Tensor) bool) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
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
	for _, c := range []struct {
		name string
		edit func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)
		want []string
	}{
		{"no expert count", setKV("qwen3moe.expert_count", nil), []string{"no qwen3moe.expert_count"}},
		{"no experts used", setKV("qwen3moe.expert_used_count", nil), []string{"no qwen3moe.expert_used_count"}},
		{"more used than experts", setKV("qwen3moe.expert_used_count", uint32(9)), []string{"experts used per token must be 1 to the expert count 8, got 9"}},
		{"too many experts", setKV("qwen3moe.expert_count", uint32(100000)), []string{"qwen3moe.expert_count is 100000, want at most 512"}},
		{"no experts", setKV("qwen3moe.expert_count", uint32(0)), []string{"qwen3moe: the expert count must be 1 to 512, got 0"}},
		{"fewer experts than tensors", setKV("qwen3moe.expert_count", uint32(4)), []string{`tensor "blk.0.ffn_gate_inp.weight" has shape [8 64]`, "implies [4 64]"}},
		{"expert width", setKV("qwen3moe.expert_feed_forward_length", uint32(32)), []string{`tensor "blk.0.ffn_gate_exps.weight" has shape [8 64 64]`, "implies [8 32 64]"}},
		{"no router", editTensor("blk.1.ffn_gate_inp.weight", func(*gguf.Tensor) bool { return false }), []string{`tensor "blk.1.ffn_gate_inp.weight" not found`}},
		{"no down", editTensor("blk.0.ffn_down_exps.weight", func(*gguf.Tensor) bool { return false }), []string{`tensor "blk.0.ffn_down_exps.weight" not found`}},
		{"2-D experts", editTensor("blk.0.ffn_up_exps.weight", func(tn *gguf.Tensor) bool {
			tn.Dims = []uint64{64, 512}
			return true
		}), []string{`tensor "blk.0.ffn_up_exps.weight" has shape [512 64]`, "implies [8 64 64]"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, rewriteGGUF(t, f, c.edit), llama.Options{}, c.want...) })
	}

	t.Run("unnormalised", func(t *testing.T) {
		s := llamatest.TinyMoE()
		s.NormTopK = false
		_, err := llama.WriteGGUF(s.WriteT(t), filepath.Join(t.TempDir(), "m.gguf"), llama.FileF32)
		if err == nil || !strings.Contains(err.Error(), "norm_topk_prob is false") {
			t.Fatalf("WriteGGUF: %v, want an error about norm_topk_prob", err)
		}
	})
}

// writeFileType writes the checkpoint dir as a GGUF file of type ft.
func writeFileType(t *testing.T, dir string, ft llama.FileType) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "m-"+string(ft)+".gguf")
	if _, err := llama.WriteGGUF(dir, out, ft); err != nil {
		t.Fatal(err)
	}
	return out
}

// expertWidth is the width of spec's experts (0 for a dense model).
func expertWidth(s llamatest.Spec) int {
	if s.Architecture == "MixtralForCausalLM" {
		return s.Intermediate
	}
	return s.ExpertIntermediate
}

// TestMoECheckpointErrors checks that a Qwen3-MoE or Mixtral checkpoint
// whose configuration pdserve does not compute (dense layers among the
// sparse ones, more experts per token than experts) or whose experts do
// not match it is refused with an error naming the problem.
func TestMoECheckpointErrors(t *testing.T) {
	spec := llamatest.TinyMoE()
	ts := spec.Tensors()
	set := func(kv ...any) func(map[string]any) {
		return func(c map[string]any) {
			for i := 0; i < len(kv); i += 2 {
				c[kv[i].(string)] = kv[i+1]
			}
		}
	}
	mix := llamatest.TinyMixtral()
	for _, c := range []struct {
		name string
		dir  string
		want []string
	}{
		{"dense layers", writeCkpt(t, spec, set("mlp_only_layers", []int{1}), ts), []string{"dense layers among the experts'"}},
		{"sparse step", writeCkpt(t, spec, set("decoder_sparse_step", 2), ts), []string{"decoder_sparse_step"}},
		{"too many per token", writeCkpt(t, spec, set("num_experts_per_tok", 9), ts), []string{"experts used per token must be 1 to the expert count 8, got 9"}},
		{"fewer experts", writeCkpt(t, spec, set("num_experts", 4), ts), []string{`tensor "model.layers.0.mlp.gate.weight" has shape [8 64]`, "implies [4 64]"}},
		{"expert width", writeCkpt(t, spec, set("moe_intermediate_size", 32), ts), []string{`tensor "model.layers.0.mlp.experts.0.gate_proj.weight" has shape [64 64]`, "implies [32 64]"}},
		{"missing expert", writeCkpt(t, spec, nil, without(ts, "model.layers.1.mlp.experts.7.down_proj.weight")),
			[]string{`tensor "model.layers.1.mlp.experts.7.down_proj.weight" not found`}},
		{"mixtral missing w3", writeCkpt(t, mix, nil, without(mix.Tensors(), "model.layers.0.block_sparse_moe.experts.3.w3.weight")),
			[]string{`tensor "model.layers.0.block_sparse_moe.experts.3.w3.weight" not found`}},
		{"mixtral experts", writeCkpt(t, mix, set("num_local_experts", 0), mix.Tensors()), []string{"the expert count must be 1 to 512, got 0"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, c.dir, llama.Options{}, c.want...) })
	}
}

// TestGGUFLlamaZeroExperts checks that a dense llama file whose metadata
// says llama.expert_count = 0 (as some converters write) loads as the
// dense model it is.
func TestGGUFLlamaZeroExperts(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Vocab = 300
	good := writeGGUF(t, spec.WriteT(t), gguf.F32)
	path := rewriteGGUF(t, readGGUF(t, good), func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return append(kvs, gguf.KV{Key: "llama.expert_count", Value: uint32(0)}, gguf.KV{Key: "llama.expert_used_count", Value: uint32(0)}), ts
	})
	toks := []int32{1, 300 - 1, 17, 42, 256}
	m := load(t, path, llama.Options{})
	if c := m.Config(); c.Experts != 0 {
		t.Fatalf("config %+v, want a dense model", c)
	}
	if d := maxDiff(logitsOf(t, m, toks), logitsOf(t, load(t, good, llama.Options{}), toks)); d != 0 {
		t.Fatalf("logits differ from the file without the keys by %g", d)
	}
}

// TestQwen3MoEFusedExperts checks that a Qwen3-MoE checkpoint in
// transformers' fused layout (mlp.experts.gate_up_proj [experts, 2·F,
// hidden], each expert's gate rows before its up rows, and
// mlp.experts.down_proj [experts, hidden, F]) computes bit for bit what the
// same weights as mlp.experts.E.{gate,up,down}_proj do.
func TestQwen3MoEFusedExperts(t *testing.T) {
	spec := llamatest.TinyMoE()
	spec.DType = llama.BF16
	ts := spec.Tensors()
	byName := map[string]llama.SafetensorsTensor{}
	for _, x := range ts {
		byName[x.Name] = x
	}
	var fused []llama.SafetensorsTensor
	for _, x := range ts {
		if !strings.Contains(x.Name, ".mlp.experts.") {
			fused = append(fused, x)
		}
	}
	E, F, H := spec.Experts, spec.ExpertIntermediate, spec.Hidden
	for l := range spec.Layers {
		p := fmt.Sprintf("model.layers.%d.mlp.experts.", l)
		var gu, dn []byte
		for e := range E {
			ep := fmt.Sprintf("%s%d.", p, e)
			gu = append(gu, byName[ep+"gate_proj.weight"].Data...)
			gu = append(gu, byName[ep+"up_proj.weight"].Data...)
			dn = append(dn, byName[ep+"down_proj.weight"].Data...)
		}
		fused = append(fused,
			llama.SafetensorsTensor{Name: p + "gate_up_proj", DType: spec.DType, Shape: []int{E, 2 * F, H}, Data: gu},
			llama.SafetensorsTensor{Name: p + "down_proj", DType: spec.DType, Shape: []int{E, H, F}, Data: dn})
	}
	toks := []int32{1, 5, 77, 3, 96, 40, 12}
	want := logitsOf(t, load(t, spec.WriteT(t), llama.Options{}), toks)
	got := logitsOf(t, load(t, writeCkpt(t, spec, nil, fused), llama.Options{}), toks)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d: fused %v, per expert %v", i, got[i], want[i])
		}
	}
	// Fused experts of another width than config.json's are refused.
	bad := writeCkpt(t, spec, func(c map[string]any) { c["moe_intermediate_size"] = F / 2 }, fused)
	wantLoadError(t, bad, llama.Options{}, `tensor "model.layers.0.mlp.experts.gate_up_proj" has shape [8 128 64]`, "implies [8 64 64]")
}

package llama_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// writeCkpt writes spec's config.json and the given tensors into a new
// directory.
func writeCkpt(t *testing.T, spec llamatest.Spec, cfgEdit func(map[string]any), tensors []llama.SafetensorsTensor) string {
	t.Helper()
	dir := t.TempDir()
	cfg := spec.Config()
	if cfgEdit != nil {
		cfgEdit(cfg)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if tensors != nil {
		if err := llama.WriteSafetensorsFile(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// without returns tensors minus the named one.
func without(ts []llama.SafetensorsTensor, name string) []llama.SafetensorsTensor {
	var out []llama.SafetensorsTensor
	for _, x := range ts {
		if x.Name != name {
			out = append(out, x)
		}
	}
	return out
}

func wantLoadError(t *testing.T, dir string, opts llama.Options, parts ...string) {
	t.Helper()
	m, err := llama.Load(dir, opts)
	if err == nil {
		_ = m.Close()
		t.Fatalf("Load succeeded, want an error containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("Load error %q does not contain %q", err, p)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	spec := llamatest.Tiny()
	ts := spec.Tensors()
	t.Run("missing directory", func(t *testing.T) {
		wantLoadError(t, filepath.Join(t.TempDir(), "nope"), llama.Options{}, "config.json", "no such file")
	})
	t.Run("no weights", func(t *testing.T) {
		wantLoadError(t, writeCkpt(t, spec, nil, nil), llama.Options{}, "neither model.safetensors nor model.safetensors.index.json")
	})
	t.Run("unsupported architecture", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["architectures"] = []string{"GPT2LMHeadModel"} }, ts)
		wantLoadError(t, dir, llama.Options{}, `unsupported architecture "GPT2LMHeadModel"`)
	})
	t.Run("unsupported activation", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["hidden_act"] = "gelu" }, ts)
		wantLoadError(t, dir, llama.Options{}, `unsupported hidden_act "gelu"`)
	})
	t.Run("unsupported rope scaling", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0} }, ts)
		wantLoadError(t, dir, llama.Options{}, `unsupported type "yarn"`)
	})
	t.Run("heads do not divide", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["num_key_value_heads"] = 3 }, ts)
		wantLoadError(t, dir, llama.Options{}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3")
	})
	t.Run("shape mismatch", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["num_key_value_heads"] = 1 }, ts)
		wantLoadError(t, dir, llama.Options{}, `tensor "model.layers.0.self_attn.k_proj.weight" has shape [32 64], but config.json implies [16 64]`)
	})
	t.Run("missing tensor", func(t *testing.T) {
		dir := writeCkpt(t, spec, nil, without(ts, "model.layers.1.mlp.up_proj.weight"))
		wantLoadError(t, dir, llama.Options{}, `tensor "model.layers.1.mlp.up_proj.weight" not found`)
	})
	t.Run("untied without classifier", func(t *testing.T) {
		dir := writeCkpt(t, spec, nil, without(ts, "lm_head.weight"))
		wantLoadError(t, dir, llama.Options{}, `"lm_head.weight" not found`, "tie_word_embeddings is false")
	})
	t.Run("unused tensor", func(t *testing.T) {
		extra := append(append([]llama.SafetensorsTensor(nil), ts...), llama.SafetensorsTensor{
			Name: "model.layers.0.self_attn.q_proj.bias", DType: llama.F32, Shape: []int{64}, Data: make([]byte, 256)})
		wantLoadError(t, writeCkpt(t, spec, nil, extra), llama.Options{}, "does not use", "q_proj.bias")
	})
	t.Run("wrong dtype", func(t *testing.T) {
		dir := writeCkpt(t, spec, nil, without(ts, "model.norm.weight"))
		path := filepath.Join(dir, "model.safetensors")
		// Append model.norm.weight as F64 (a valid safetensors dtype we do not compute with).
		rewriteWithExtra(t, path, "model.norm.weight", "F64", []int{64}, make([]byte, 8*64))
		wantLoadError(t, dir, llama.Options{}, `tensor "model.norm.weight"`, `unsupported dtype "F64" (want BF16, F16 or F32)`)
	})
	t.Run("truncated tensor", func(t *testing.T) {
		dir := writeCkpt(t, spec, nil, ts)
		path := filepath.Join(dir, "model.safetensors")
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, fi.Size()-100); err != nil {
			t.Fatal(err)
		}
		wantLoadError(t, dir, llama.Options{}, "truncated file?", `tensor "lm_head.weight"`)
	})
	t.Run("context length beyond the model", func(t *testing.T) {
		wantLoadError(t, writeCkpt(t, spec, nil, ts), llama.Options{ContextLen: 257}, "context length 257 exceeds the model's 256")
	})
	t.Run("bad KV dtype", func(t *testing.T) {
		wantLoadError(t, writeCkpt(t, spec, nil, ts), llama.Options{KVDType: 9}, "invalid KV geometry")
	})
}

// rewriteWithExtra appends one raw tensor to a safetensors file by
// rebuilding its header.
func rewriteWithExtra(t *testing.T, path, name, dtype string, shape []int, data []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	var hdr map[string]any
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	body := raw[8+n:]
	hdr[name] = map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{len(body), len(body) + len(data)}}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(append(out, h...), body...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTruncatedAnywhere cuts a checkpoint at many lengths: every one fails
// to load with an error, none panics.
func TestTruncatedAnywhere(t *testing.T) {
	spec := llamatest.Tiny()
	dir := writeCkpt(t, spec, nil, spec.Tensors())
	path := filepath.Join(dir, "model.safetensors")
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hdr := int(binary.LittleEndian.Uint64(full)) + 8
	for _, n := range []int{0, 3, 8, 9, hdr / 2, hdr - 1, hdr, hdr + 1, len(full) / 2, len(full) - 1} {
		if err := os.WriteFile(path, full[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := llama.Load(dir, llama.Options{}); err == nil {
			_ = m.Close()
			t.Errorf("a checkpoint cut to %d of %d bytes loaded", n, len(full))
		}
	}
	// Garbage header length.
	bad := append([]byte(nil), full...)
	binary.LittleEndian.PutUint64(bad, 1<<62)
	if err := os.WriteFile(path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	wantLoadError(t, dir, llama.Options{}, "header length")
}

// TestSharded loads a checkpoint split over two files with an index, and
// checks it computes exactly what the single file does; an index that names
// the wrong shard is an error.
func TestSharded(t *testing.T) {
	spec := llamatest.Tiny()
	ts := spec.Tensors()
	single := writeCkpt(t, spec, nil, ts)
	dir := writeCkpt(t, spec, nil, nil)
	half := len(ts) / 2
	files := map[string][]llama.SafetensorsTensor{
		"model-00001-of-00002.safetensors": ts[:half], "model-00002-of-00002.safetensors": ts[half:]}
	wm := map[string]string{}
	for f, part := range files {
		if err := llama.WriteSafetensorsFile(filepath.Join(dir, f), part, nil); err != nil {
			t.Fatal(err)
		}
		for _, x := range part {
			wm[x.Name] = f
		}
	}
	writeIndex := func(wm map[string]string) {
		raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": wm})
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeIndex(wm)
	a, b := load(t, single, llama.Options{}), load(t, dir, llama.Options{})
	tokens := []int32{1, 40, 41, 42, 7}
	var got [2][]float32
	for i, m := range []*llama.Model{a, b} {
		p := newPool(t, m, 8, 4)
		lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: alloc(t, p, 1), Tokens: tokens}})
		if err != nil {
			t.Fatal(err)
		}
		got[i] = lg[0]
	}
	for i := range got[0] {
		if got[0][i] != got[1][i] {
			t.Fatalf("sharded logit %d = %v, single file %v", i, got[1][i], got[0][i])
		}
	}
	wm[ts[0].Name] = "model-00002-of-00002.safetensors"
	writeIndex(wm)
	wantLoadError(t, dir, llama.Options{}, "lists tensor", "does not hold it")
}

// fakeTokenizer stands in for internal/model/tokenizer.
type fakeTokenizer struct{ model.Tokenizer }

func (fakeTokenizer) EOS() []int32 { return []int32{7, 2} }

func TestInfoTokenizerDigest(t *testing.T) {
	spec := llamatest.Tiny()
	dir := spec.WriteT(t)
	m := load(t, dir, llama.Options{Name: "tiny"})
	info := m.Info()
	if info.Name != "tiny" || info.VocabSize != 97 || info.ContextLen != 256 || len(info.EOS) != 1 || info.EOS[0] != 2 {
		t.Errorf("info %+v", info)
	}
	if info.Geometry.Layers != 2 || info.Geometry.KVHeads != 2 || info.Geometry.HeadDim != 16 || info.Geometry.DType.String() != "f32" {
		t.Errorf("geometry %+v", info.Geometry)
	}
	if m.Tokenizer() != nil {
		t.Error("a checkpoint without tokenizer.json has a tokenizer")
	}
	// The digest does not depend on the directory, but on the weights.
	same := spec.WriteT(t)
	if d := load(t, same, llama.Options{}).Info().Digest; d != info.Digest {
		t.Errorf("same weights, other directory: digest %s vs %s", d, info.Digest)
	}
	spec.Seed++
	if d := load(t, spec.WriteT(t), llama.Options{}).Info().Digest; d == info.Digest {
		t.Error("other weights, same digest")
	}
	// Tokenizer: loaded only when tokenizer.json exists; its EOS ids and
	// generation_config.json's join the config's.
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": [5, 2]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var gotDir string
	mt := load(t, dir, llama.Options{LoadTokenizer: func(d string) (model.Tokenizer, error) {
		gotDir = d
		return fakeTokenizer{}, nil
	}})
	if mt.Tokenizer() == nil || gotDir != dir {
		t.Errorf("tokenizer %v loaded from %q", mt.Tokenizer(), gotDir)
	}
	if eos := mt.Info().EOS; !slices.Equal(eos, []int32{2, 5, 7}) {
		t.Errorf("EOS %v, want [2 5 7]", eos)
	}
	wantLoadError(t, dir, llama.Options{LoadTokenizer: func(string) (model.Tokenizer, error) {
		return nil, os.ErrPermission
	}}, "tokenizer", "permission denied")
}

// TestQwen3Config checks how a Qwen3 config.json is read: head_dim
// defaults to 128 (transformers' Qwen3Config), not hidden/heads; biases
// only with attention_bias; the per-head q/k norms are required and must be
// [head_dim].
func TestQwen3Config(t *testing.T) {
	spec := llamatest.Tiny()
	spec.Architecture = "Qwen3ForCausalLM"
	base := spec.Config()
	delete(base, "head_dim")
	raw, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	c, err := llama.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 128 || !c.QKNorm || c.QKVBias || c.OBias {
		t.Errorf("Qwen3 without head_dim: head_dim %d, QKNorm %v, QKVBias %v, OBias %v; want 128, true, false, false", c.HeadDim, c.QKNorm, c.QKVBias, c.OBias)
	}
	base["attention_bias"], base["head_dim"] = true, 16
	if raw, err = json.Marshal(base); err != nil {
		t.Fatal(err)
	}
	if c, err = llama.ParseConfig(raw); err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 16 || !c.QKVBias || !c.OBias {
		t.Errorf("Qwen3 with attention_bias and head_dim 16: head_dim %d, QKVBias %v, OBias %v", c.HeadDim, c.QKVBias, c.OBias)
	}
	ts := spec.Tensors()
	t.Run("default head_dim against the tensors", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { delete(c, "head_dim") }, ts)
		wantLoadError(t, dir, llama.Options{}, `tensor "model.layers.0.self_attn.q_proj.weight" has shape [64 64], but config.json implies [512 64]`)
	})
	t.Run("missing q_norm", func(t *testing.T) {
		dir := writeCkpt(t, spec, nil, without(ts, "model.layers.1.self_attn.q_norm.weight"))
		wantLoadError(t, dir, llama.Options{}, `tensor "model.layers.1.self_attn.q_norm.weight" not found`)
	})
	t.Run("k_norm of the hidden size", func(t *testing.T) {
		bad := without(ts, "model.layers.0.self_attn.k_norm.weight")
		bad = append(bad, llama.SafetensorsTensor{Name: "model.layers.0.self_attn.k_norm.weight", DType: llama.F32, Shape: []int{64}, Data: make([]byte, 4*64)})
		wantLoadError(t, writeCkpt(t, spec, nil, bad), llama.Options{}, `tensor "model.layers.0.self_attn.k_norm.weight" has shape [64], but config.json implies [16]`)
	})
	t.Run("q/k norms on a Llama checkpoint", func(t *testing.T) {
		dir := writeCkpt(t, spec, func(c map[string]any) { c["architectures"] = []string{"LlamaForCausalLM"} }, ts)
		wantLoadError(t, dir, llama.Options{}, "does not use", "k_norm")
	})
}

// TestGemma2Config checks how a Gemma2 config.json is read: Gemma2Config's
// defaults (head_dim 256, query_pre_attn_scalar 256, soft-capping 50 and 30,
// sliding window 4096 in the even layers, tied), null soft-capping, the
// activation, and the context length, which the window (in some layers
// only) does not cap.
func TestGemma2Config(t *testing.T) {
	parse := func(edit func(map[string]any)) (llama.Config, error) {
		spec := gemma2Tiny()
		c := spec.Config()
		for _, k := range []string{"head_dim", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "tie_word_embeddings", "hidden_act", "hidden_activation"} {
			delete(c, k)
		}
		if edit != nil {
			edit(c)
		}
		raw, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return llama.ParseConfig(raw)
	}
	c, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HeadDim != 256 || c.QueryScale != 1.0/16 || c.AttnSoftcap != 50 || c.FinalSoftcap != 30 || c.SlidingWindow != 4096 ||
		!c.TieEmbeddings || !c.GeluTanh || !c.PostNorms || !c.EmbedScale || c.QKVBias {
		t.Errorf("Gemma2 defaults: %+v", c)
	}
	if c, err = parse(func(m map[string]any) { m["final_logit_softcapping"], m["attn_logit_softcapping"] = nil, nil }); err != nil {
		t.Fatal(err)
	} else if c.AttnSoftcap != 0 || c.FinalSoftcap != 0 {
		t.Errorf("null soft-capping read as %v, %v", c.AttnSoftcap, c.FinalSoftcap)
	}
	if _, err := parse(func(m map[string]any) { m["hidden_activation"] = "gelu" }); err == nil || !strings.Contains(err.Error(), `unsupported hidden_activation "gelu"`) {
		t.Errorf("hidden_activation gelu: %v", err)
	}
	if _, err := parse(func(m map[string]any) { m["attn_logit_softcapping"] = -1 }); err == nil || !strings.Contains(err.Error(), "attn_logit_softcapping must be positive or null") {
		t.Errorf("negative soft-capping: %v", err)
	}
	if want := []bool{true, false}; !slices.Equal(c.SlidingLayers, want) {
		t.Errorf("sliding layers %v, want %v", c.SlidingLayers, want)
	}
	spec := gemma2Tiny()
	spec.SlidingWindow = 40
	m := load(t, spec.WriteT(t), llama.Options{})
	if got := m.Info().ContextLen; got != spec.MaxPositions {
		t.Errorf("context length %d, want max_position_embeddings %d", got, spec.MaxPositions)
	}
}

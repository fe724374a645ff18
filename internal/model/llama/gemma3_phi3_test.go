package llama_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// refDist is the largest |Δ| between got ([positions, vocab]) and want.
func refDist(got []float32, want [][]float64) float64 {
	var worst float64
	for p := range want {
		V := len(want[p])
		for id, w := range want[p] {
			worst = math.Max(worst, math.Abs(float64(got[p*V+id])-w))
		}
	}
	return worst
}

// TestGemma3 checks the Gemma3 forward pass (gemma3Tiny: a window of 7
// positions in five of six layers, RoPE base 100 there) against the float64
// reference, from the checkpoint (to 2e-5) and from its GGUF file (to 2e-3:
// gelu through ggml's float16 table), and that the reference without the
// window, or with the global RoPE base in the sliding layers, is more than
// 100× the checkpoint's tolerance away, so that the comparison sees both.
func TestGemma3(t *testing.T) {
	spec := gemma3Tiny()
	tokens := randomTokens(rand.New(rand.NewPCG(13, 13)), 24, spec.Vocab)
	dir := spec.WriteT(t)
	want := newRefModel(spec).logits(tokens)
	r := newRefModel(spec)
	r.noWindow = true
	unwindowed := r.logits(tokens)
	r = newRefModel(spec)
	r.invLocal = r.inv
	oneBase := r.logits(tokens)
	wantSliding := []bool{true, true, true, true, true, false}
	for _, c := range []struct {
		name, path string
		tol        float64
	}{{"safetensors", dir, 2e-5}, {"gguf", writeGGUF(t, dir, gguf.F32), 2e-3}} {
		m := load(t, c.path, llama.Options{})
		cfg := m.Config()
		if !cfg.PostNorms || !cfg.GeluTanh || !cfg.EmbedScale || !cfg.QKNorm || cfg.AttnSoftcap != 0 || cfg.FinalSoftcap != 0 ||
			cfg.HeadDim != 32 || cfg.RopeInterleaved || cfg.SlidingWindow != 7 || cfg.RopeThetaLocal != 100 ||
			!slices.Equal(cfg.SlidingLayers, wantSliding) {
			t.Fatalf("%s: config %+v", c.name, cfg)
		}
		if got := m.Info().ContextLen; got != spec.MaxPositions {
			t.Errorf("%s: context length %d, want %d (the window does not cap it)", c.name, got, spec.MaxPositions)
		}
		got := logitsOf(t, m, tokens)
		d, dw, db := refDist(got, want), refDist(got, unwindowed), refDist(got, oneBase)
		t.Logf("%s: max |Δ logit| vs the reference %.3g; without the window %.3g; with one RoPE base %.3g", c.name, d, dw, db)
		if d > c.tol {
			t.Errorf("%s: max |Δ logit| vs the reference = %.3g, want ≤ %g", c.name, d, c.tol)
		}
		if dw < 2e-3 || db < 2e-3 {
			t.Errorf("%s: the reference without the window (%.3g) or with one RoPE base (%.3g) is within 2e-3: the test could not tell", c.name, dw, db)
		}
	}
}

// TestSlidingWindowInvariance checks the sliding-window attention on
// gemma3Tiny with 4-token pages (the window of 7 starts mid-page): every
// kernel set gives the same bits as pure Go, and prefilling in chunks of 5
// then decoding one token at a time gives the bits of one whole prefill,
// for each KV dtype.
func TestSlidingWindowInvariance(t *testing.T) {
	spec := gemma3Tiny()
	dir := spec.WriteT(t)
	tokens := randomTokens(rand.New(rand.NewPCG(17, 17)), 30, spec.Vocab)
	ctx := context.Background()
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		var want []float32
		for _, k := range llama.KernelChoices {
			m, err := llama.Load(dir, llama.Options{Kernels: k, KVDType: dt})
			if err != nil {
				if k == llama.KernelsAVX512 || k == llama.KernelsAVX2 {
					t.Logf("%s: %v", k, err)
					continue
				}
				t.Fatal(err)
			}
			pool := newPool(t, m, 4, 20)
			whole, err := m.ForwardLogits(ctx, pool, []model.SeqInput{{Pages: alloc(t, pool, 8), Tokens: tokens}})
			if err != nil {
				t.Fatal(err)
			}
			if want == nil {
				want = whole[0]
			} else if i := firstDiff(whole[0], want); i >= 0 {
				t.Errorf("KV %v, kernels %s: logit %d = %v, pure Go %v", dt, k, i, whole[0][i], want[i])
			}
			pages := alloc(t, pool, 8)
			var pieces []float32
			for pos := 0; pos < len(tokens); {
				n := 5
				if pos >= 20 {
					n = 1
				}
				n = min(n, len(tokens)-pos)
				lg, err := m.ForwardLogits(ctx, pool, []model.SeqInput{{Pages: pages, Pos: pos, Tokens: tokens[pos : pos+n]}})
				if err != nil {
					t.Fatal(err)
				}
				pieces = append(pieces, lg[0]...)
				pos += n
			}
			if i := firstDiff(pieces, whole[0]); i >= 0 {
				t.Errorf("KV %v, kernels %s: chunked logit %d = %v, whole prefill %v", dt, k, i, pieces[i], whole[0][i])
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// firstDiff is the first index where a and b differ in bits, or -1.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestGemma3Config checks how a Gemma3 config.json is read: Gemma3TextConfig's
// defaults (head_dim 256, rope_theta 1e6, rope_local_base_freq 10000,
// sliding window 4096 in five of six layers, no soft-capping, tied),
// layer_types instead of the pattern, and the errors.
func TestGemma3Config(t *testing.T) {
	parse := func(edit func(map[string]any)) (llama.Config, error) {
		spec := gemma3Tiny()
		c := spec.Config()
		for _, k := range []string{"head_dim", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
			"tie_word_embeddings", "hidden_act", "hidden_activation", "rope_theta", "rope_local_base_freq", "sliding_window_pattern"} {
			delete(c, k)
		}
		c["num_hidden_layers"] = 12
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
	global := []bool{5: false, 11: false}
	for i := range global {
		global[i] = i != 5 && i != 11
	}
	if c.HeadDim != 256 || c.QueryScale != 1.0/16 || c.AttnSoftcap != 0 || c.FinalSoftcap != 0 || c.SlidingWindow != 4096 ||
		c.RopeTheta != 1e6 || c.RopeThetaLocal != 10000 || !slices.Equal(c.SlidingLayers, global) ||
		!c.TieEmbeddings || !c.GeluTanh || !c.PostNorms || !c.EmbedScale || !c.QKNorm || c.QKVBias {
		t.Errorf("Gemma3 defaults: %+v", c)
	}
	types := make([]string, 12)
	for i := range types {
		types[i] = "full_attention"
	}
	types[3] = "sliding_attention"
	if c, err = parse(func(m map[string]any) { m["layer_types"] = types }); err != nil {
		t.Fatal(err)
	} else if want := []bool{3: true, 11: false}; !slices.Equal(c.SlidingLayers, want) {
		t.Errorf("layer_types: sliding layers %v, want %v", c.SlidingLayers, want)
	}
	for _, e := range []struct {
		edit func(map[string]any)
		msg  string
	}{
		{func(m map[string]any) { m["layer_types"] = types[:3] }, "layer_types has 3 entries for 12 layers"},
		{func(m map[string]any) { m["layer_types"] = append(types[:11:11], "chunked") }, `layer_types[11] is "chunked"`},
		{func(m map[string]any) { m["sliding_window_pattern"] = 0 }, "sliding_window_pattern must be at least 1"},
		{func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive"},
		{func(m map[string]any) { m["rope_local_base_freq"] = -1 }, "rope_local_base_freq must be positive"},
		{func(m map[string]any) { m["hidden_activation"] = "gelu" }, `unsupported hidden_activation "gelu"`},
	} {
		if _, err := parse(e.edit); err == nil || !strings.Contains(err.Error(), e.msg) {
			t.Errorf("want an error with %q, got %v", e.msg, err)
		}
	}
}

// TestPhi3 checks Phi3 (phi3Tiny) against the float64 reference from the
// checkpoint and from its GGUF file (F32 to 2e-5; Q8_0, whose fused matrices
// are split into views of quantized rows, to 0.5: Q8_0's rounding of
// Tiny's ±0.25 weights moves the logits by ~0.15, the logits themselves
// span several units), that the
// file holds the fused attn_qkv and the [gate; up] ffn_up as llama.cpp's
// converter writes them, and partial rotary embeddings (and the errors
// for a factor that leaves no even number of dimensions).
func TestPhi3(t *testing.T) {
	spec := phi3Tiny()
	tokens := randomTokens(rand.New(rand.NewPCG(19, 19)), 24, spec.Vocab)
	dir := spec.WriteT(t)
	want := newRefModel(spec).logits(tokens)
	f32 := writeGGUF(t, dir, gguf.F32)
	for _, c := range []struct {
		name, path string
		tol        float64
	}{{"safetensors", dir, 2e-5}, {"gguf", f32, 2e-5}, {"gguf-q8_0", writeGGUF(t, dir, gguf.Q8_0), 0.5}} {
		m := load(t, c.path, llama.Options{})
		got := logitsOf(t, m, tokens)
		d := refDist(got, want)
		t.Logf("%s: max |Δ logit| vs the reference %.3g", c.name, d)
		if d > c.tol {
			t.Errorf("%s: max |Δ logit| vs the reference = %.3g, want ≤ %g", c.name, d, c.tol)
		}
	}
	raw, err := os.ReadFile(f32)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	H, I, D := spec.Hidden, spec.Intermediate, spec.Hidden/spec.Heads
	if arch, _, _ := f.String("general.architecture"); arch != "phi3" {
		t.Errorf("general.architecture %q, want phi3", arch)
	}
	if ti, ok := f.Tensor("blk.1.attn_qkv.weight"); !ok || !slices.Equal(ti.Dims, []uint64{uint64(H), uint64((spec.Heads + 2*spec.KVHeads) * D)}) {
		t.Errorf("attn_qkv: %+v", ti)
	}
	if ti, ok := f.Tensor("blk.1.ffn_up.weight"); !ok || !slices.Equal(ti.Dims, []uint64{uint64(H), uint64(2 * I)}) {
		t.Errorf("ffn_up: %+v", ti)
	}
	for _, n := range []string{"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"} {
		if _, ok := f.Tensor(n); ok {
			t.Errorf("the phi3 file has %s", n)
		}
	}

	// Partial rotary embeddings (Phi-4-mini's partial_rotary_factor 0.75:
	// 12 of the 16 dimensions of a head), from the checkpoint and its GGUF
	// file (rope.dimension_count 12); a model rotating all 16 is far off.
	pr := phi3Tiny()
	pr.PartialRotary = 0.75
	prDir := pr.WriteT(t)
	prWant := newRefModel(pr).logits(tokens)
	if d := refDist(logitsOf(t, load(t, dir, llama.Options{}), tokens), prWant); d < 0.05 {
		t.Fatalf("partial and full rotation differ by %.3g only: the check cannot tell them apart", d)
	}
	prFile := writeGGUF(t, prDir, gguf.F32)
	for _, path := range []string{prDir, prFile} {
		m := load(t, path, llama.Options{})
		if rd := m.Config().RopeDim; rd != 12 {
			t.Errorf("%s: RopeDim %d, want 12", path, rd)
		}
		if d := refDist(logitsOf(t, m, tokens), prWant); d > 2e-5 {
			t.Errorf("%s: partial rotary: max |Δ logit| vs the reference = %.3g, want ≤ 2e-5", path, d)
		}
	}
	if raw, err := os.ReadFile(prFile); err != nil {
		t.Fatal(err)
	} else if f, err := gguf.Parse(raw); err != nil {
		t.Fatal(err)
	} else if v, _, _ := f.Uint("phi3.rope.dimension_count"); v != 12 {
		t.Errorf("phi3.rope.dimension_count %d, want 12", v)
	}
	for _, bad := range []float64{0.1, 1.5, -1} {
		c := spec.Config()
		c["partial_rotary_factor"] = bad
		cj, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := llama.ParseConfig(cj); err == nil || !strings.Contains(err.Error(), "partial_rotary_factor") {
			t.Errorf("partial_rotary_factor %v: %v", bad, err)
		}
	}
}

// TestGemma3GGUFKeys checks the gemma3 keys WriteGGUF writes and how
// ggufConfig reads them back: a file written without a sliding window has
// no sliding layers, and one with llamatest.Gemma3Shaped's pattern gets it.
func TestGemma3GGUFKeys(t *testing.T) {
	spec := gemma3Tiny()
	spec.SlidingPattern = 3
	path := writeGGUF(t, spec.WriteT(t), gguf.F32)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"gemma3.attention.sliding_window": 7, "gemma3.attention.sliding_window_pattern": 3, "gemma3.rope.freq_base_swa": 100} {
		if v, ok, err := f.Float(k); err != nil || !ok || v != want {
			t.Errorf("%s = %v (present %v, %v), want %v", k, v, ok, err, want)
		}
	}
	m := load(t, path, llama.Options{})
	if got, want := m.Config().SlidingLayers, []bool{true, true, false, true, true, false}; !slices.Equal(got, want) {
		t.Errorf("sliding layers %v, want %v", got, want)
	}
	if cfg, err := llama.ParseConfig(mustJSON(t, llamatest.Gemma3Shaped().Config())); err != nil {
		t.Fatal(err)
	} else if want := []bool{true, true, true, true, true, false}; !slices.Equal(cfg.SlidingLayers, want) {
		t.Errorf("Gemma3Shaped: sliding layers %v, want %v", cfg.SlidingLayers, want)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPhi3LongRope checks Phi-3's LongRoPE (phi3Tiny with
// original_max_position_embeddings 32 of 256 positions: attention factor
// √(1 + ln 8 / ln 32) ≈ 1.26) against the float64 reference, from the
// checkpoint and from its GGUF file (rope_factors_long and _short,
// phi3.rope.scaling.*): a context of at most 32 positions rotates with the
// short factors, a longer one with the long factors, as llama.cpp chooses;
// the other choice is far from the reference (so the test tells them
// apart), and the two choices get different digests (their KV differs, so
// a prefill and a decode worker that chose differently are never paired);
// with all of a head rotated and with Phi-4-mini's partial rotation (its
// factors one per rotated pair).
func TestPhi3LongRope(t *testing.T) {
	for _, partial := range []float64{0, 0.75} {
		t.Run(fmt.Sprintf("partial_rotary_factor=%v", partial), func(t *testing.T) { phi3LongRope(t, partial) })
	}
}

func phi3LongRope(t *testing.T, partial float64) {
	spec := phi3Tiny()
	spec.LongRopeOrig = 32
	spec.PartialRotary = partial
	tokens := randomTokens(rand.New(rand.NewPCG(23, 23)), 24, spec.Vocab)
	dir := spec.WriteT(t)
	refs := map[bool][][]float64{}
	for _, long := range []bool{false, true} {
		r := newRefModel(spec)
		r.useLongRope(long)
		refs[long] = r.logits(tokens)
	}
	for _, c := range []struct{ name, path string }{{"safetensors", dir}, {"gguf", writeGGUF(t, dir, gguf.F32)}} {
		digests := map[bool]string{}
		for _, long := range []bool{false, true} {
			ctxLen := 32
			if long {
				ctxLen = 0 // max_position_embeddings, 256
			}
			m := load(t, c.path, llama.Options{ContextLen: ctxLen})
			cfg := m.Config()
			if len(cfg.RopeLongFactors) != spec.RopeDim()/2 || cfg.RopeOrigPositions != 32 || math.Abs(cfg.RopeAttnFactor-math.Sqrt(1+math.Log(8)/math.Log(32))) > 1e-6 {
				t.Fatalf("%s: config %+v", c.name, cfg)
			}
			digests[long] = m.Info().Digest
			got := logitsOf(t, m, tokens)
			d, other := refDist(got, refs[long]), refDist(got, refs[!long])
			t.Logf("%s, long factors %v: max |Δ logit| vs the reference %.3g, vs the other factors' %.3g", c.name, long, d, other)
			if d > 2e-5 {
				t.Errorf("%s, long factors %v: max |Δ logit| vs the reference = %.3g, want ≤ 2e-5", c.name, long, d)
			}
			if other < 2e-3 {
				t.Errorf("%s, long factors %v: the reference with the other factors is within %.3g: the test could not tell", c.name, long, other)
			}
		}
		if digests[false] == digests[true] {
			t.Errorf("%s: the short and long LongRoPE choices share the digest %s", c.name, digests[false])
		}
	}
	for _, e := range []struct {
		edit func(map[string]any)
		msg  string
	}{
		{func(m map[string]any) { m["architectures"] = []string{"LlamaForCausalLM"} }, "longrope is supported for Phi3ForCausalLM only"},
		{func(m map[string]any) { delete(m, "original_max_position_embeddings") }, "original_max_position_embeddings"},
		{func(m map[string]any) { m["rope_scaling"].(map[string]any)["long_factor"] = []float64{1, 2} },
			fmt.Sprintf("long_factor has 2 values, want one per rotated pair, %d", spec.RopeDim()/2)},
		{func(m map[string]any) {
			m["rope_scaling"].(map[string]any)["short_factor"] = make([]float64, spec.RopeDim()/2)
		}, "short_factor holds 0"},
	} {
		c := spec.Config()
		e.edit(c)
		if _, err := llama.ParseConfig(mustJSON(t, c)); err == nil || !strings.Contains(err.Error(), e.msg) {
			t.Errorf("want an error with %q, got %v", e.msg, err)
		}
	}
}

// TestGGUFGemma3Phi3Errors checks that bad gemma3 and phi3 files and
// checkpoints WriteGGUF cannot express for llama.cpp are refused with an
// error naming the problem.
func TestGGUFGemma3Phi3Errors(t *testing.T) {
	g3 := readGGUF(t, writeGGUF(t, gemma3Tiny().WriteT(t), gguf.F32))
	setKV := func(f *gguf.File, key string, v any) string {
		return rewriteGGUF(t, f, func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range kvs {
				if kvs[i].Key == key {
					kvs[i].Value = v
					return kvs, ts
				}
			}
			return append(kvs, gguf.KV{Key: key, Value: v}), ts
		})
	}
	drop := func(f *gguf.File, name string) string {
		return rewriteGGUF(t, f, func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kvs, slices.DeleteFunc(ts, func(x gguf.Tensor) bool { return x.Name == name })
		})
	}
	wantLoadError(t, setKV(g3, "gemma3.rope.freq_base_swa", float32(-1)), llama.Options{}, "gemma3.rope.freq_base_swa is -1")
	wantLoadError(t, setKV(g3, "gemma3.attention.sliding_window_pattern", "six"), llama.Options{}, "gemma3.attention.sliding_window_pattern", "unsigned integer")
	wantLoadError(t, setKV(g3, "gemma3.final_logit_softcapping", float32(-2)), llama.Options{}, "gemma3.final_logit_softcapping is -2")
	wantLoadError(t, drop(g3, "blk.2.attn_k_norm.weight"), llama.Options{}, `tensor "blk.2.attn_k_norm.weight" not found`)
	m := load(t, setKV(g3, "gemma3.attention.sliding_window", uint32(0)), llama.Options{})
	if c := m.Config(); c.SlidingLayers != nil || c.SlidingWindow != 0 {
		t.Errorf("gemma3 without a window: sliding layers %v, window %d", c.SlidingLayers, c.SlidingWindow)
	}

	p3 := readGGUF(t, writeGGUF(t, phi3Tiny().WriteT(t), gguf.F32))
	D := 16
	factors := func(name string, v float32) gguf.Tensor {
		f := make([]float32, D/2)
		for i := range f {
			f[i] = v
		}
		return gguf.Tensor{Name: name, Type: gguf.F32, Dims: []uint64{uint64(D / 2)}, Data: llama.F32Bytes(f)}
	}
	withTensors := func(extra ...gguf.Tensor) string {
		return rewriteGGUF(t, p3, func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kvs, append(ts, extra...)
		})
	}
	wantLoadError(t, withTensors(factors("rope_factors_long.weight", 2)), llama.Options{}, "only one of rope_factors_long and rope_factors_short")
	wantLoadError(t, withTensors(factors("rope_factors_long.weight", 2), factors("rope_factors_short.weight", 0)), llama.Options{},
		`"rope_factors_short.weight" holds 0`)
	wantLoadError(t, setKV(p3, "phi3.rope.scaling.attn_factor", float32(-1)), llama.Options{}, "phi3.rope.scaling.attn_factor is -1")
	wantLoadError(t, drop(p3, "blk.0.attn_qkv.weight"), llama.Options{}, `tensor "blk.0.attn_q.weight" not found`)
	wantLoadError(t, rewriteGGUF(t, p3, func(kvs []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		for i := range ts {
			if ts[i].Name == "blk.1.ffn_up.weight" { // [gate; up] cut to the up half's rows
				ts[i].Dims = []uint64{ts[i].Dims[0], ts[i].Dims[1] / 2}
				ts[i].Data = ts[i].Data[:len(ts[i].Data)/2]
			}
		}
		return kvs, ts
	}), llama.Options{}, `tensor "blk.1.ffn_up.weight" has shape [96 64], but the metadata implies [192 64]`)

	for name, c := range map[string]struct {
		spec llamatest.Spec
		edit func(c map[string]any)
		want string
	}{
		"gemma3 attention soft-capping": {gemma3Tiny(), func(c map[string]any) { c["attn_logit_softcapping"] = 50.0 }, "llama.cpp's gemma3 has no attention soft-capping"},
		"gemma3 another scaling":        {gemma3Tiny(), func(c map[string]any) { c["query_pre_attn_scalar"] = 64 }, "llama.cpp's gemma3 would use"},
		"gemma3 irregular layers": {gemma3Tiny(), func(c map[string]any) {
			c["layer_types"] = []string{"sliding_attention", "full_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"}
		}, "no period llama.cpp's sliding_window_pattern can express"},
	} {
		dir := writeCkpt(t, c.spec, c.edit, c.spec.Tensors())
		if _, err := llama.WriteGGUF(dir, filepath.Join(t.TempDir(), "m.gguf"), llama.FileF32); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: WriteGGUF error %v, want one containing %q", name, err, c.want)
		}
	}
}

// TestGemma3LinearRope checks gemma-3-4b's linear rope_scaling (factor 8)
// through a GGUF file: written as gemma3.rope.scaling.*, read back for the
// global layers only (the sliding ones rotate unscaled, as llama.cpp's
// rope_freq_scale_train_swa = 1 and transformers' local rotary embedding
// do), and within 5e-3 of the float64 reference (ggml's float16 gelu
// table moves a GGUF file's logits by a few 1e-3: TestGemma3), which
// would be units away if the sliding layers were scaled too.
func TestGemma3LinearRope(t *testing.T) {
	spec := gemma3Tiny()
	spec.RopeScaling = map[string]any{"rope_type": "linear", "factor": 8.0}
	tokens := randomTokens(rand.New(rand.NewPCG(29, 29)), 24, spec.Vocab)
	path := writeGGUF(t, spec.WriteT(t), gguf.F32)
	f := readGGUF(t, path)
	if typ, _, _ := f.String("gemma3.rope.scaling.type"); typ != "linear" {
		t.Errorf("gemma3.rope.scaling.type %q, want linear", typ)
	}
	m := load(t, path, llama.Options{})
	if s := m.Config().RopeScaling; s == nil || s.Type != "linear" || s.Factor != 8 {
		t.Fatalf("rope scaling %+v", s)
	}
	got := logitsOf(t, m, tokens)
	r := newRefModel(spec)
	want := r.logits(tokens)
	for i := range r.invLocal {
		r.invLocal[i] /= 8 // the sliding layers scaled too: wrong
	}
	allScaled := r.logits(tokens)
	d, dw := refDist(got, want), refDist(got, allScaled)
	t.Logf("max |Δ logit| vs the reference %.3g; with the sliding layers scaled too %.3g", d, dw)
	if d > 5e-3 {
		t.Errorf("max |Δ logit| vs the reference = %.3g, want ≤ 5e-3", d)
	}
	if dw < 0.5 {
		t.Errorf("the reference with every layer scaled is within %.3g: the test could not tell", dw)
	}
}

package llama_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// refModel is an independent float64 forward pass over a spec's tensors,
// written straight from transformers' modeling_llama.py with no paging,
// batching or tiling: the oracle for the configurations the stories260K
// fixture does not cover (untied classifier, biases, F16/BF16 weights,
// llama3 RoPE scaling), Qwen3 (transformers' modeling_qwen3.py: q_norm
// and k_norm on each head before RoPE), Qwen3-MoE (modeling_qwen3_moe.py's
// Qwen3MoeSparseMoeBlock: refModel.moe) and Gemma2 (modeling_gemma2.py:
// embeddings ×√hidden, norms with 1 + w, post-norms, GeGLU with
// gelu_pytorch_tanh, soft-capped scores and logits, sliding window in the
// even layers), Gemma3 (modeling_gemma3.py: as Gemma2 without the
// soft-capping, with q_norm and k_norm applied as 1 + w, the window in five
// of every six layers, whose RoPE base is rope_local_base_freq) and Phi3
// (modeling_phi3.py: fused qkv_proj and gate_up_proj).
type refModel struct {
	spec llamatest.Spec
	w    map[string][]float64
	inv  []float64
	// invLocal are the sliding layers' inverse frequencies (Gemma3).
	invLocal []float64
	// noWindow drops the sliding window, to show what the tests would
	// catch.
	noWindow bool
	// mscale multiplies cos and sin (LongRoPE's attention factor; 0: 1).
	mscale float64
	// qkNorm places Qwen3's per-head q/k norm: qkNormBeforeRope (the
	// model's), or, to show what the tests would catch,
	// qkNormSkipped or qkNormAfterRope.
	qkNorm int
	// noAttnSoftcap drops Gemma2's soft-capping of the attention scores,
	// to show what the tests would catch.
	noAttnSoftcap bool
}

// Placements of Qwen3's q/k norm in refModel.
const (
	qkNormBeforeRope = iota
	qkNormSkipped
	qkNormAfterRope
)

func newRefModel(spec llamatest.Spec) *refModel {
	r := &refModel{spec: spec, w: map[string][]float64{}}
	for _, t := range spec.Tensors() {
		n := len(t.Data) / t.DType.Size()
		v := make([]float64, n)
		for i := range v {
			switch t.DType {
			case llama.F32:
				v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:])))
			case llama.BF16:
				v[i] = float64(llama.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
			case llama.F16:
				v[i] = float64(llama.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
			}
		}
		r.w[t.Name] = v
	}
	D := spec.RopeDim() // the rotated dimensions
	for i := 0; i < D; i += 2 {
		f := 1 / math.Pow(spec.RopeTheta, float64(i)/float64(D))
		if sc := spec.RopeScaling; sc != nil && sc["rope_type"] == "linear" {
			f /= sc["factor"].(float64)
		}
		if sc := spec.RopeScaling; sc != nil && sc["rope_type"] == "llama3" {
			factor, lo, hi := sc["factor"].(float64), sc["low_freq_factor"].(float64), sc["high_freq_factor"].(float64)
			orig := float64(sc["original_max_position_embeddings"].(int))
			wavelen := 2 * math.Pi / f
			if wavelen > orig/lo {
				f /= factor
			} else if wavelen >= orig/hi {
				smooth := (orig/wavelen - lo) / (hi - lo)
				f = (1-smooth)*f/factor + smooth*f
			}
		}
		r.inv = append(r.inv, f)
		local := spec.RopeThetaLocal
		if local == 0 {
			local = 10000
		}
		r.invLocal = append(r.invLocal, 1/math.Pow(local, float64(i)/float64(D)))
	}
	return r
}

// window returns the number of positions layer l sees back from a token
// (itself included), 0 for all.
func (r *refModel) window(l int) int {
	s := r.spec
	if r.noWindow || s.SlidingWindow == 0 {
		return 0
	}
	switch s.Architecture {
	case "Gemma2ForCausalLM":
		if l%2 == 0 {
			return s.SlidingWindow
		}
	case "Gemma3ForCausalLM":
		period := s.SlidingPattern
		if period == 0 {
			period = 6
		}
		if (l+1)%period != 0 {
			return s.SlidingWindow
		}
	}
	return 0
}

func (r *refModel) headDim() int {
	if r.spec.HeadDim > 0 {
		return r.spec.HeadDim
	}
	return r.spec.Hidden / r.spec.Heads
}

func (r *refModel) linear(name string, x []float64, out int, bias bool) []float64 {
	w := r.w[name+".weight"]
	in := len(x)
	y := make([]float64, out)
	for o := range out {
		var s float64
		for i := range in {
			s += w[o*in+i] * x[i]
		}
		if bias {
			s += r.w[name+".bias"][o]
		}
		y[o] = s
	}
	return y
}

// headNorm RMS-normalises each head (D values) of x in place with the gain
// vector name [D] (Qwen3RMSNorm over the last dimension of [heads, D]).
func (r *refModel) headNorm(name string, x []float64) {
	D := r.headDim()
	for h := range len(x) / D {
		copy(x[h*D:(h+1)*D], r.norm(name, x[h*D:(h+1)*D]))
	}
}

func (r *refModel) norm(name string, x []float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+r.spec.RMSNormEps)
	g := r.w[name]
	one := 0.0
	if r.spec.Architecture == "Gemma2ForCausalLM" || r.spec.Architecture == "Gemma3ForCausalLM" {
		one = 1 // Gemma2RMSNorm, Gemma3RMSNorm: x·(1 + w)
	}
	y := make([]float64, len(x))
	for i := range x {
		y[i] = (one + g[i]) * x[i] * inv
	}
	return y
}

// rope rotates the first spec.RopeDim() dimensions of each head as
// transformers' apply_rotary_pos_emb does (Phi3's splits q and k at
// rotary_ndims and rotates the first part); the rest pass through.
func (r *refModel) rope(x []float64, heads, pos int, inv []float64) {
	HD, D := r.headDim(), r.spec.RopeDim()
	for h := range heads {
		v := x[h*HD : h*HD+D]
		rot := make([]float64, D) // rotate_half: cat(-x2, x1)
		for i := range D / 2 {
			rot[i] = -v[i+D/2]
			rot[i+D/2] = v[i]
		}
		ms := r.mscale
		if ms == 0 {
			ms = 1
		}
		for i := range D {
			ang := float64(pos) * inv[i%(D/2)]
			v[i] = v[i]*math.Cos(ang)*ms + rot[i]*math.Sin(ang)*ms
		}
	}
}

// logits returns the next-token logits after every token of a sequence.
func (r *refModel) logits(tokens []int32) [][]float64 {
	s := r.spec
	H, D := s.Hidden, r.headDim()
	bias := s.QKVBias
	qwen3 := s.Architecture == "Qwen3ForCausalLM" || s.Architecture == "Qwen3MoeForCausalLM"
	gemma3 := s.Architecture == "Gemma3ForCausalLM"
	gemma := s.Architecture == "Gemma2ForCausalLM" || gemma3
	phi3 := s.Architecture == "Phi3ForCausalLM"
	oBias := bias && (s.Architecture == "" || s.Architecture == "LlamaForCausalLM" || qwen3 || gemma)
	capped := func(v, c float64) float64 {
		if !gemma || c == 0 {
			return v
		}
		return c * math.Tanh(v/c)
	}
	attnCap := s.AttnSoftcap
	if r.noAttnSoftcap {
		attnCap = 0
	}
	var keys, vals [][][]float64 // [layer][pos][kv·D]
	keys = make([][][]float64, s.Layers)
	vals = make([][][]float64, s.Layers)
	var out [][]float64
	for pos, tok := range tokens {
		x := append([]float64(nil), r.w["model.embed_tokens.weight"][int(tok)*H:(int(tok)+1)*H]...)
		if gemma {
			for i := range x {
				x[i] *= math.Sqrt(float64(H))
			}
		}
		for l := range s.Layers {
			p := "model.layers." + itoa(l) + "."
			h := r.norm(p+"input_layernorm.weight", x)
			var q, k, v []float64
			if phi3 {
				qkv := r.linear(p+"self_attn.qkv_proj", h, (s.Heads+2*s.KVHeads)*D, false)
				q, k, v = qkv[:s.Heads*D], qkv[s.Heads*D:(s.Heads+s.KVHeads)*D], qkv[(s.Heads+s.KVHeads)*D:]
			} else {
				q = r.linear(p+"self_attn.q_proj", h, s.Heads*D, bias)
				k = r.linear(p+"self_attn.k_proj", h, s.KVHeads*D, bias)
				v = r.linear(p+"self_attn.v_proj", h, s.KVHeads*D, bias)
			}
			if (qwen3 && r.qkNorm == qkNormBeforeRope) || gemma3 {
				r.headNorm(p+"self_attn.q_norm.weight", q)
				r.headNorm(p+"self_attn.k_norm.weight", k)
			}
			win := r.window(l)
			inv := r.inv
			if gemma3 && win > 0 {
				inv = r.invLocal
			}
			r.rope(q, s.Heads, pos, inv)
			r.rope(k, s.KVHeads, pos, inv)
			if qwen3 && r.qkNorm == qkNormAfterRope {
				r.headNorm(p+"self_attn.q_norm.weight", q)
				r.headNorm(p+"self_attn.k_norm.weight", k)
			}
			keys[l] = append(keys[l], k)
			vals[l] = append(vals[l], v)
			att := make([]float64, s.Heads*D)
			for hd := range s.Heads {
				g := hd / (s.Heads / s.KVHeads)
				lo := 0
				if win > 0 {
					lo = max(0, pos-win+1)
				}
				sc := make([]float64, pos+1-lo)
				m := math.Inf(-1)
				for j := range pos + 1 - lo {
					j := j + lo
					var d float64
					for i := range D {
						d += q[hd*D+i] * keys[l][j][g*D+i]
					}
					sc[j-lo] = capped(d/math.Sqrt(float64(D)), attnCap) // query_pre_attn_scalar = head_dim
					m = math.Max(m, sc[j-lo])
				}
				var z float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - m)
					z += sc[j]
				}
				for j := range sc {
					for i := range D {
						att[hd*D+i] += sc[j] / z * vals[l][j+lo][g*D+i]
					}
				}
			}
			o := r.linear(p+"self_attn.o_proj", att, H, oBias)
			if gemma {
				o = r.norm(p+"post_attention_layernorm.weight", o)
			}
			for i := range x {
				x[i] += o[i]
			}
			if gemma {
				h = r.norm(p+"pre_feedforward_layernorm.weight", x)
			} else {
				h = r.norm(p+"post_attention_layernorm.weight", x)
			}
			if s.Experts > 0 {
				for i, v := range r.moe(p, h) {
					x[i] += v
				}
				continue
			}
			var gt, up []float64
			if phi3 {
				gu := r.linear(p+"mlp.gate_up_proj", h, 2*s.Intermediate, false)
				gt, up = gu[:s.Intermediate], gu[s.Intermediate:]
			} else {
				gt = r.linear(p+"mlp.gate_proj", h, s.Intermediate, false)
				up = r.linear(p+"mlp.up_proj", h, s.Intermediate, false)
			}
			for i := range gt {
				if gemma { // gelu_pytorch_tanh
					g := gt[i]
					gt[i] = 0.5 * g * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g+0.044715*g*g*g))) * up[i]
				} else {
					gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
				}
			}
			d := r.linear(p+"mlp.down_proj", gt, H, false)
			if gemma {
				d = r.norm(p+"post_feedforward_layernorm.weight", d)
			}
			for i := range x {
				x[i] += d[i]
			}
		}
		h := r.norm("model.norm.weight", x)
		head := "lm_head"
		if s.Tied {
			head = "model.embed_tokens"
		}
		lg := r.linear(head, h, s.Vocab, false)
		for i := range lg {
			lg[i] = capped(lg[i], s.FinalSoftcap)
		}
		out = append(out, lg)
	}
	return out
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// variants are the configurations checked against the reference.
func variants() map[string]llamatest.Spec {
	v := map[string]llamatest.Spec{}
	base := llamatest.Tiny()
	v["llama-f32-untied-gqa"] = base
	s := base
	s.DType, s.Tied = llama.BF16, true
	v["llama-bf16-tied"] = s
	s = base
	s.Architecture, s.QKVBias, s.DType = "Qwen2ForCausalLM", true, llama.BF16
	v["qwen2-bias-bf16"] = s
	s = base
	s.QKVBias, s.DType, s.Heads, s.KVHeads = true, llama.F16, 4, 4
	v["llama-attention-bias-f16-mha"] = s
	s = base
	s.RopeScaling = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
		"original_max_position_embeddings": 16}
	s.RopeTheta = 500000
	s.HeadDim, s.Heads, s.KVHeads = 32, 4, 1 // head_dim × heads ≠ hidden, one KV head
	v["llama3-rope-headdim"] = s
	s = base
	s.Architecture = "MistralForCausalLM"
	v["mistral"] = s
	v["qwen3-headdim"] = qwen3Tiny()
	s = qwen3Tiny()
	s.QKVBias, s.DType, s.Tied = true, llama.BF16, true
	v["qwen3-attention-bias-bf16-tied"] = s
	v["qwen3moe"] = llamatest.TinyMoE()
	s = llamatest.TinyMoE()
	s.NormTopK, s.ExpertsUsed, s.DType, s.Tied = false, 3, llama.BF16, true
	v["qwen3moe-top3-unnormalised-bf16-tied"] = s
	s = llamatest.TinyMoE()
	s.Experts, s.ExpertsUsed, s.ExpertIntermediate = 128, 8, 32 // Qwen3-30B-A3B's routing
	v["qwen3moe-128-experts-top8"] = s
	v["mixtral"] = llamatest.TinyMixtral()
	v["gemma2-headdim-softcap"] = gemma2Tiny()
	s = gemma2Tiny()
	s.FinalSoftcap = 0 // null: the logits uncompressed
	v["gemma2-no-final-softcap"] = s
	s = gemma2Tiny()
	s.QKVBias, s.DType = true, llama.BF16
	v["gemma2-attention-bias-bf16"] = s
	s = gemma2Tiny()
	s.SlidingWindow = 7
	v["gemma2-window"] = s
	v["gemma3-window"] = gemma3Tiny()
	s = gemma3Tiny()
	s.SlidingPattern, s.FinalSoftcap, s.DType = 2, 1, llama.BF16
	v["gemma3-pattern2-softcap-bf16"] = s
	s = gemma3Tiny()
	s.RopeScaling = map[string]any{"rope_type": "linear", "factor": 8.0} // the global layers' only (gemma-3-4b's)
	v["gemma3-linear-rope"] = s
	v["phi3"] = phi3Tiny()
	return v
}

// gemma3Tiny is Tiny as a Gemma3 checkpoint: head_dim 32, a 300-token
// vocabulary, 6 layers (five sliding, one global) with a window of 7
// positions — so that a 24-token sequence crosses it — and RoPE bases
// 10000 (global) and 100 (sliding), far enough apart that mixing them up
// shows.
func gemma3Tiny() llamatest.Spec {
	s := llamatest.Tiny()
	s.Architecture, s.HeadDim, s.Vocab, s.Tied, s.Layers = "Gemma3ForCausalLM", 32, 300, true, 6
	s.SlidingWindow, s.RopeThetaLocal = 7, 100
	return s
}

// phi3Tiny is Tiny as a Phi3 checkpoint (fused projections) with a
// 300-token vocabulary.
func phi3Tiny() llamatest.Spec {
	s := llamatest.Tiny()
	s.Architecture, s.Vocab = "Phi3ForCausalLM", 300
	return s
}

// gemma2Tiny is Tiny as a Gemma2 checkpoint (tied, as Gemma2 always is)
// whose head_dim (32) is not hidden/heads, with soft-capping at 0.5 for
// the attention scores and 1 for the logits — far below Gemma 2's 50 and
// 30, so that on this small random model they change the result — and a
// 300-token vocabulary for WriteGGUF.
func gemma2Tiny() llamatest.Spec {
	s := llamatest.Tiny()
	s.Architecture, s.HeadDim, s.Vocab, s.Tied = "Gemma2ForCausalLM", 32, 300, true
	s.AttnSoftcap, s.FinalSoftcap = 0.5, 1
	return s
}

// qwen3Tiny is Tiny as a Qwen3 checkpoint whose head_dim (32) is not
// hidden/heads (16): q is 128 wide, twice the hidden size. Its vocabulary
// (300) is large enough for WriteGGUF's placeholder tokens.
func qwen3Tiny() llamatest.Spec {
	s := llamatest.Tiny()
	s.Architecture, s.HeadDim, s.Vocab = "Qwen3ForCausalLM", 32, 300
	return s
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// TestAgainstReference compares the logits at every position of a 40-token
// sequence with the float64 reference, for each variant and KV dtype.
func TestAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for name, spec := range variants() {
		t.Run(name, func(t *testing.T) {
			ref := newRefModel(spec)
			dir := spec.WriteT(t)
			tokens := randomTokens(rng, 40, spec.Vocab)
			want := ref.logits(tokens)
			for _, kv := range []struct {
				dt  kvcache.DType
				tol float64
			}{{kvcache.F32, 2e-5}, {kvcache.BF16, 0.1}, {kvcache.F16, 1e-2}} {
				if spec.Experts > 0 && kv.dt != kvcache.F32 {
					// A rounded KV cache moves the activations enough to
					// route a token whose k-th and next experts are nearly
					// tied to the other one, a legitimate discontinuity
					// that moves its logits (and, through its KV, later
					// ones) far past the tolerance. The dense variants
					// check the KV dtypes; the experts are checked here
					// with the exact cache.
					continue
				}
				m, err := llama.Load(dir, llama.Options{KVDType: kv.dt})
				if err != nil {
					t.Fatal(err)
				}
				pool, err := kvcache.NewPool(m.Info().Geometry, 8, 8<<20)
				if err != nil {
					t.Fatal(err)
				}
				pages, _ := pool.Alloc(pool.PagesFor(len(tokens)))
				got, err := m.ForwardLogits(context.Background(), pool, []model.SeqInput{{Pages: pages, Tokens: tokens}})
				if err != nil {
					t.Fatal(err)
				}
				var worst float64
				for p := range tokens {
					for id := range spec.Vocab {
						d := math.Abs(float64(got[0][p*spec.Vocab+id]) - want[p][id])
						worst = math.Max(worst, d)
					}
				}
				if worst > kv.tol {
					t.Errorf("KV %v: max |Δ logit| = %.3g, want ≤ %g", kv.dt, worst, kv.tol)
				}
				t.Logf("KV %v: max |Δ logit| vs float64 reference = %.3g", kv.dt, worst)
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestQwen3QKNormPlacement checks that the Qwen3 forward pass normalises
// each head of q and k before RoPE: its logits match the float64 reference
// that does so (to 2e-5) and are far (more than 100× that) from the same
// reference with the norm skipped or applied after RoPE. The gains vary
// (1 ± 0.5) so that the norm does not commute with the rotation.
func TestQwen3QKNormPlacement(t *testing.T) {
	spec := qwen3Tiny()
	tokens := randomTokens(rand.New(rand.NewPCG(9, 9)), 24, spec.Vocab)
	dir := spec.WriteT(t)
	paths := map[string]string{"safetensors": dir, "gguf": writeGGUF(t, dir, gguf.F32)}
	refs := map[int][][]float64{}
	for _, pl := range []int{qkNormBeforeRope, qkNormSkipped, qkNormAfterRope} {
		r := newRefModel(spec)
		r.qkNorm = pl
		refs[pl] = r.logits(tokens)
	}
	dist := func(got []float32, want [][]float64) float64 {
		var worst float64
		for p := range want {
			for id, w := range want[p] {
				worst = math.Max(worst, math.Abs(float64(got[p*spec.Vocab+id])-w))
			}
		}
		return worst
	}
	for name, path := range paths {
		m := load(t, path, llama.Options{})
		if c := m.Config(); !c.QKNorm || c.HeadDim != 32 || c.RopeInterleaved {
			t.Fatalf("%s: config %+v", name, c)
		}
		got := logitsOf(t, m, tokens)
		right, skipped, after := dist(got, refs[qkNormBeforeRope]), dist(got, refs[qkNormSkipped]), dist(got, refs[qkNormAfterRope])
		t.Logf("%s: max |Δ logit| vs the reference %.3g; with the q/k norm skipped %.3g, after RoPE %.3g", name, right, skipped, after)
		if right > 2e-5 {
			t.Errorf("%s: max |Δ logit| vs the reference = %.3g, want ≤ 2e-5", name, right)
		}
		if skipped < 2e-3 || after < 2e-3 {
			t.Errorf("%s: the reference with the q/k norm skipped (%.3g) or after RoPE (%.3g) is within 2e-3: the test could not tell", name, skipped, after)
		}
	}
}

// TestGemma2 checks the Gemma2 forward pass against the float64 reference,
// from the checkpoint (to 2e-5) and from its GGUF file (to 2e-3: there gelu
// goes through ggml's float16 table, as llama.cpp computes it), and that the
// reference without the attention scores' soft-capping is far from both
// (more than 100× the checkpoint's tolerance), so that the comparison sees
// it (the logits' soft-capping at 1 bounds them: it could not go unseen).
func TestGemma2(t *testing.T) {
	spec := gemma2Tiny()
	tokens := randomTokens(rand.New(rand.NewPCG(11, 11)), 24, spec.Vocab)
	dir := spec.WriteT(t)
	want := newRefModel(spec).logits(tokens)
	r := newRefModel(spec)
	r.noAttnSoftcap = true
	uncapped := r.logits(tokens)
	dist := func(got []float32, want [][]float64) float64 {
		var worst float64
		for p := range want {
			for id, w := range want[p] {
				worst = math.Max(worst, math.Abs(float64(got[p*spec.Vocab+id])-w))
			}
		}
		return worst
	}
	for _, c := range []struct {
		name, path string
		tol        float64
	}{{"safetensors", dir, 2e-5}, {"gguf", writeGGUF(t, dir, gguf.F32), 2e-3}} {
		m := load(t, c.path, llama.Options{})
		if cfg := m.Config(); !cfg.PostNorms || !cfg.GeluTanh || !cfg.EmbedScale || cfg.AttnSoftcap != 0.5 || cfg.FinalSoftcap != 1 || cfg.HeadDim != 32 || cfg.RopeInterleaved {
			t.Fatalf("%s: config %+v", c.name, cfg)
		}
		got := logitsOf(t, m, tokens)
		d, du := dist(got, want), dist(got, uncapped)
		t.Logf("%s: max |Δ logit| vs the reference %.3g; without the attention soft-capping %.3g", c.name, d, du)
		if d > c.tol {
			t.Errorf("%s: max |Δ logit| vs the reference = %.3g, want ≤ %g", c.name, d, c.tol)
		}
		if du < 2e-3 {
			t.Errorf("%s: the reference without the attention soft-capping is within %.3g: the test could not tell", c.name, du)
		}
	}
}

// useLongRope sets the reference's RoPE to the spec's LongRoPE
// (transformers' _compute_longrope_parameters): the frequencies divided by
// the long factors (long) or the short ones, cos and sin scaled by
// √(1 + ln(s)/ln(original)), s = max_position_embeddings/original.
func (r *refModel) useLongRope(long bool) {
	lf, sf := r.spec.LongRopeFactors()
	f := sf
	if long {
		f = lf
	}
	D := r.spec.RopeDim()
	for i := range r.inv {
		r.inv[i] = 1 / (f[i] * math.Pow(r.spec.RopeTheta, float64(2*i)/float64(D)))
	}
	r.mscale = 1
	if s := float64(r.spec.MaxPositions) / float64(r.spec.LongRopeOrig); s > 1 {
		r.mscale = math.Sqrt(1 + math.Log(s)/math.Log(float64(r.spec.LongRopeOrig)))
	}
}

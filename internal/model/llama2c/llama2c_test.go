package llama2c_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama2c"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// legacy is a llama2.c checkpoint held as float64 tensors, in llama2.c's
// order and layout.
type legacy struct {
	h                                    llama2c.Header
	emb, rmsAtt, wq, wk, wv, wo, rmsFFN  []float64
	w1, w2, w3, rmsFinal, freqRe, freqIm []float64
	wcls                                 []float64
}

func randLegacy(seed uint64, h llama2c.Header) *legacy {
	rng := rand.New(rand.NewPCG(seed, 1))
	r := func(n int, c, s float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(float32(c + s*rng.NormFloat64())) // exactly representable in float32
		}
		return v
	}
	d, f, L, kv, hs := h.Dim, h.HiddenDim, h.Layers, h.KVHeads*h.HeadSize(), h.HeadSize()
	l := &legacy{h: h,
		emb: r(h.Vocab*d, 0, 1), rmsAtt: r(L*d, 1, 0.1), wq: r(L*d*d, 0, 0.3), wk: r(L*kv*d, 0, 0.3),
		wv: r(L*kv*d, 0, 0.3), wo: r(L*d*d, 0, 0.3), rmsFFN: r(L*d, 1, 0.1), w1: r(L*f*d, 0, 0.3),
		w2: r(L*d*f, 0, 0.3), w3: r(L*f*d, 0, 0.3), rmsFinal: r(d, 1, 0.1),
		freqRe: r(h.SeqLen*hs/2, 0, 1), freqIm: r(h.SeqLen*hs/2, 0, 1)}
	if !h.Shared {
		l.wcls = r(h.Vocab*d, 0, 0.3)
	}
	return l
}

func (l *legacy) bytes() []byte {
	h := l.h
	vocab := h.Vocab
	if !h.Shared {
		vocab = -vocab
	}
	var b []byte
	for _, v := range []int{h.Dim, h.HiddenDim, h.Layers, h.Heads, h.KVHeads, vocab, h.SeqLen} {
		b = binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
	}
	for _, t := range [][]float64{l.emb, l.rmsAtt, l.wq, l.wk, l.wv, l.wo, l.rmsFFN, l.w1, l.w2, l.w3, l.rmsFinal, l.freqRe, l.freqIm, l.wcls} {
		for _, v := range t {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
		}
	}
	return b
}

// logits is llama2.c's forward pass (its README semantics, interleaved
// RoPE pairs) in float64: the logits after every token.
func (l *legacy) logits(tokens []int32) [][]float64 {
	h := l.h
	d, f, hs := h.Dim, h.HiddenDim, h.HeadSize()
	kvd := h.KVHeads * hs
	mat := func(w []float64, off, out, in int, x []float64) []float64 {
		y := make([]float64, out)
		for o := range out {
			for i := range in {
				y[o] += w[off+o*in+i] * x[i]
			}
		}
		return y
	}
	norm := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+1e-5)
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] * inv * g[i]
		}
		return y
	}
	rope := func(v []float64, pos int) {
		for i := 0; i < len(v); i += 2 {
			j := i % hs
			a := float64(pos) * math.Pow(10000, -float64(j)/float64(hs))
			c, s := math.Cos(a), math.Sin(a)
			v[i], v[i+1] = v[i]*c-v[i+1]*s, v[i]*s+v[i+1]*c
		}
	}
	keys := make([][][]float64, h.Layers)
	vals := make([][][]float64, h.Layers)
	var out [][]float64
	for pos, tok := range tokens {
		x := append([]float64(nil), l.emb[int(tok)*d:(int(tok)+1)*d]...)
		for li := range h.Layers {
			xb := norm(x, l.rmsAtt[li*d:(li+1)*d])
			q := mat(l.wq, li*d*d, d, d, xb)
			k := mat(l.wk, li*kvd*d, kvd, d, xb)
			v := mat(l.wv, li*kvd*d, kvd, d, xb)
			rope(q, pos)
			rope(k, pos)
			keys[li] = append(keys[li], k)
			vals[li] = append(vals[li], v)
			att := make([]float64, d)
			for hd := range h.Heads {
				g := hd / (h.Heads / h.KVHeads)
				sc := make([]float64, pos+1)
				var z float64
				m := math.Inf(-1)
				for t := range pos + 1 {
					for i := range hs {
						sc[t] += q[hd*hs+i] * keys[li][t][g*hs+i]
					}
					sc[t] /= math.Sqrt(float64(hs))
					m = math.Max(m, sc[t])
				}
				for t := range sc {
					sc[t] = math.Exp(sc[t] - m)
					z += sc[t]
				}
				for t := range sc {
					for i := range hs {
						att[hd*hs+i] += sc[t] / z * vals[li][t][g*hs+i]
					}
				}
			}
			o := mat(l.wo, li*d*d, d, d, att)
			for i := range x {
				x[i] += o[i]
			}
			xb = norm(x, l.rmsFFN[li*d:(li+1)*d])
			h1 := mat(l.w1, li*f*d, f, d, xb)
			h3 := mat(l.w3, li*f*d, f, d, xb)
			for i := range h1 {
				h1[i] = h1[i] / (1 + math.Exp(-h1[i])) * h3[i]
			}
			o = mat(l.w2, li*d*f, d, f, h1)
			for i := range x {
				x[i] += o[i]
			}
		}
		x = norm(x, l.rmsFinal)
		cls := l.emb
		if !h.Shared {
			cls = l.wcls
		}
		out = append(out, mat(cls, 0, h.Vocab, d, x))
	}
	return out
}

// TestConvertMatchesInterleavedForward converts random llama2.c checkpoints
// (tied and untied) and checks the rotate-half model computes what
// llama2.c's interleaved forward pass does.
func TestConvertMatchesInterleavedForward(t *testing.T) {
	for _, shared := range []bool{true, false} {
		h := llama2c.Header{Dim: 32, HiddenDim: 40, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 50, SeqLen: 64, Shared: shared}
		l := randLegacy(9, h)
		in := filepath.Join(t.TempDir(), "model.bin")
		if err := os.WriteFile(in, l.bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "hf")
		got, err := llama2c.Convert(in, out)
		if err != nil {
			t.Fatal(err)
		}
		if got != h {
			t.Fatalf("header %+v, want %+v", got, h)
		}
		var cfg map[string]any
		raw, _ := os.ReadFile(filepath.Join(out, "config.json"))
		if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg["tie_word_embeddings"] != shared || cfg["rope_theta"] != 10000.0 || cfg["rms_norm_eps"] != 1e-5 {
			t.Errorf("config %v", cfg)
		}
		m, err := llama.Load(out, llama.Options{})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := kvcache.NewPool(m.Info().Geometry, 16, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		tokens := []int32{1, 7, 33, 49, 0, 12, 12, 12, 5, 40, 41, 42, 43, 44, 45, 46, 47, 48, 2, 3}
		pages, _ := pool.Alloc(2)
		lg, err := m.ForwardLogits(context.Background(), pool, []model.SeqInput{{Pages: pages, Tokens: tokens}})
		if err != nil {
			t.Fatal(err)
		}
		want := l.logits(tokens)
		var worst float64
		for p := range tokens {
			for id := range h.Vocab {
				worst = math.Max(worst, math.Abs(float64(lg[0][p*h.Vocab+id])-want[p][id]))
			}
		}
		if worst > 1e-4 {
			t.Errorf("shared %v: max |Δ logit| vs llama2.c semantics = %.3g", shared, worst)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPermuteRoPE(t *testing.T) {
	// 2 heads of size 4, one input column: rows are their own indices.
	w := llama.F32Bytes([]float32{0, 1, 2, 3, 4, 5, 6, 7})
	got := llama2c.Float32s(llama2c.PermuteRoPE(w, 2, 4, 1))
	want := []float32{0, 2, 1, 3, 4, 6, 5, 7}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("permuted rows %v, want %v", got, want)
		}
	}
}

func TestConvertErrors(t *testing.T) {
	h := llama2c.Header{Dim: 16, HiddenDim: 24, Layers: 1, Heads: 2, KVHeads: 1, Vocab: 10, SeqLen: 8, Shared: true}
	good := randLegacy(1, h).bytes()
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"short header", good[:20], "too short"},
		{"truncated", good[:len(good)-4], "implies"},
		{"trailing bytes", append(append([]byte(nil), good...), 0, 0, 0, 0), "implies"},
		{"GGUF file", append([]byte("GGUF\x03\x00\x00\x00"), good[8:]...), `this is a GGUF file (magic "GGUF")`},
		{"version 1 magic", append([]byte("24ka\x01\x00\x00\x00"), good[8:]...), `version-1 llama2.c export (magic "ak42")`},
		{"zero layers", func() []byte {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint32(b[8:], 0)
			return b
		}(), "n_layers = 0"},
		{"heads do not divide dim", func() []byte {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint32(b[12:], 3)
			return b
		}(), "not a multiple of n_heads 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := filepath.Join(t.TempDir(), "m.bin")
			if err := os.WriteFile(in, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := llama2c.Convert(in, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Convert = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := llama2c.Convert(filepath.Join(t.TempDir(), "missing.bin"), t.TempDir()); err == nil {
		t.Error("missing input converted")
	}
}

package llama

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// TestKQuantizeRoundTrip checks the K-quant quantizers through dequantRow:
// every value within (about) one step of its quantization grid, and the
// root-mean-square error bounded.
func TestKQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	x := randVec(rng, 256*4)
	for i := 256; i < 512; i++ {
		x[i] = 0 // an all-zero block
	}
	for i := 600; i < 632; i++ {
		x[i] = float32(math.Abs(float64(x[i]))) + 3 // a positive sub-block
	}
	for _, c := range []struct {
		typ gguf.Type
		q   func([]float32) []byte
		tol float64 // relative to the block's largest magnitude
		rms float64 // root-mean-square error relative to the input's
	}{{gguf.Q4_K, QuantizeQ4K, 0.16, 0.1}, {gguf.Q6_K, QuantizeQ6K, 0.04, 0.025},
		{gguf.Q5_K, QuantizeQ5K, 0.07, 0.04}, {gguf.Q3_K, QuantizeQ3K, 0.3, 0.2}, {gguf.Q2_K, QuantizeQ2K, 0.5, 0.35},
		{gguf.IQ4_XS, QuantizeIQ4XS, 0.2, 0.1}} {
		b := c.q(x)
		if len(b) != len(x)/256*c.typ.BlockBytes() {
			t.Fatalf("%s: %d bytes", c.typ, len(b))
		}
		y := make([]float32, len(x))
		dequantRow(c.typ, b, y)
		var se, sx float64
		for i := range x {
			se += float64(y[i]-x[i]) * float64(y[i]-x[i])
			sx += float64(x[i]) * float64(x[i])
		}
		t.Logf("%s: rms error %.4f of rms", c.typ, math.Sqrt(se/sx))
		if math.Sqrt(se/sx) > c.rms {
			t.Errorf("%s: rms error %.4f of the input's, want ≤ %v", c.typ, math.Sqrt(se/sx), c.rms)
		}
		for blk := range len(x) / 256 {
			var amax float64
			for _, v := range x[256*blk : 256*blk+256] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			for i := 256 * blk; i < 256*blk+256; i++ {
				if e := math.Abs(float64(y[i] - x[i])); e > c.tol*amax+1e-7 {
					t.Fatalf("%s: element %d: %v → %v (block max %v)", c.typ, i, x[i], y[i], amax)
				}
			}
		}
	}
}

// TestQ8KActivations checks the Q8_K activation quantization: the value of
// largest magnitude at ∓127 with the scale's sign, sums of 16, and values
// within half a step.
func TestQ8KActivations(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	x := randVec(rng, 2*512)
	for i := 256; i < 512; i++ {
		x[i] = 0
	}
	var a q8KActs
	a.reset(2, 512, false)
	a.quantizeRows(x, 0, 2)
	for k, blk := range a.blk {
		if k == 1 {
			if blk.d != 0 {
				t.Fatalf("zero block: d %v", blk.d)
			}
			continue
		}
		for i, q := range blk.qs {
			if e := math.Abs(float64(blk.d)*float64(q) - float64(x[256*k+i])); e > math.Abs(float64(blk.d))*0.501 {
				t.Fatalf("block %d element %d: %v → %d·%v", k, i, x[256*k+i], q, blk.d)
			}
		}
		for j := range 16 {
			var s int32
			for _, q := range blk.qs[16*j : 16*j+16] {
				s += int32(q)
			}
			if blk.bsums[j] != s {
				t.Fatalf("block %d: bsums[%d] = %d, want %d", k, j, blk.bsums[j], s)
			}
		}
	}
}

// TestDotK checks the canonical K-quant dot products against a
// float64 sum over the dequantized weights and activations.
func TestDotK(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for _, c := range []struct {
		typ gguf.Type
		q   func([]float32) []byte
		dot func([]byte, *q8KActs, int) float32
	}{{gguf.Q4_K, QuantizeQ4K, dotQ4KGo}, {gguf.Q6_K, QuantizeQ6K, dotQ6KGo},
		{gguf.Q5_K, QuantizeQ5K, dotQ5KGo}, {gguf.Q3_K, QuantizeQ3K, dotQ3KGo}, {gguf.Q2_K, QuantizeQ2K, dotQ2KGo},
		{gguf.IQ4_XS, QuantizeIQ4XS, dotIQ4XSGo}} {
		for _, n := range []int{256, 1536} {
			w := c.q(randVec(rng, n))
			wf := make([]float32, n)
			dequantRow(c.typ, w, wf)
			x := randVec(rng, 2*n)
			var a q8KActs
			a.reset(2, n, c.typ == gguf.IQ4_XS)
			a.quantizeRows(x, 0, 2)
			for tok := range 2 {
				var want, mag float64
				for i := range n {
					blk := &a.blk[(tok*n+i)/256]
					xv := float64(blk.d) * float64(blk.qs[i%256])
					want += float64(wf[i]) * xv
					mag += math.Abs(float64(wf[i]) * xv)
				}
				if got := c.dot(w, &a, tok); math.Abs(float64(got)-want) > 2e-6*mag {
					t.Fatalf("%s n=%d: %v, want %v", c.typ, n, got, want)
				}
			}
		}
	}
}

// TestKTileKernel checks the K-quant kernels of every kernel set
// against the pure-Go canonical dot product bit for bit, for 1 to 9 and 15
// activation rows (every call size: up to 4 rows per call on AVX-512, 8
// for IQ4_XS, 2 on AVX2) and 1 to 6 blocks; and the layouts the assembly
// assumes.
func TestKTileKernel(t *testing.T) {
	var a ktileArgs
	var blk q8KBlock
	var pb q8KPerm
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"ktileArgs.x", unsafe.Offsetof(a.x), 8}, {"ktileArgs.nb", unsafe.Offsetof(a.nb), 72},
		{"ktileArgs.out", unsafe.Offsetof(a.out), 80}, {"ktileArgs.os", unsafe.Offsetof(a.os), 88},
		{"ktileArgs.scr", unsafe.Offsetof(a.scr), 96}, {"q8KBlock.qs", unsafe.Offsetof(blk.qs), 4},
		{"q8KBlock.ssum", unsafe.Offsetof(blk.ssum), 324}, {"q8KBlock size", unsafe.Sizeof(blk), 340},
		{"q8KPerm.init", unsafe.Offsetof(pb.init), 256}, {"q8KPerm.d", unsafe.Offsetof(pb.d), 320},
		{"q8KPerm size", unsafe.Sizeof(pb), 384},
	} {
		if c.got != c.want {
			t.Fatalf("%s at %d, the assembly assumes %d", c.name, c.got, c.want)
		}
	}
	rng := rand.New(rand.NewPCG(10, 10))
	for _, ks := range kernelSets(t) {
		if ks.kisa == 0 {
			continue
		}
		for _, c := range []struct {
			typ gguf.Type
			q   func([]float32) []byte
		}{{gguf.Q4_K, QuantizeQ4K}, {gguf.Q6_K, QuantizeQ6K}, {gguf.Q5_K, QuantizeQ5K}, {gguf.Q3_K, QuantizeQ3K}, {gguf.Q2_K, QuantizeQ2K},
			{gguf.IQ4_XS, QuantizeIQ4XS}} {
			for _, sh := range []struct{ nb, T int }{{1, 7}, {2, 7}, {6, 7}, {1, 1}, {2, 2}, {1, 3}, {2, 4}, {1, 5}, {2, 6}, {3, 8}, {1, 9}, {2, 15}} {
				nb, T := sh.nb, sh.T
				n := 256 * nb
				const rows = 3
				wf := randVec(rng, rows*n)
				for i := range wf[:300] {
					wf[i] = float32(math.Abs(float64(wf[i]))) // positive sub-blocks: mins 0
				}
				w, err := newQuantTensor("w", c.typ, []int{rows, n}, c.q(wf))
				if err != nil {
					t.Fatal(err)
				}
				x := randVec(rng, T*n)
				var acts q8KActs
				acts.reset(T, n, c.typ == gguf.IQ4_XS)
				acts.quantizeRows(x, 0, T)
				want := make([]float32, T*rows)
				matRowsK(nil, want, rows, &acts, T, w, 0, rows)
				got := make([]float32, T*rows)
				matRowsK(ks, got, rows, &acts, T, w, 0, rows)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %s nb=%d T=%d: [%d, %d] = %v, Go %v", ks.name, c.typ, nb, T, i/rows, i%rows, got[i], want[i])
					}
				}
			}
		}
	}
}

// BenchmarkKKernels measures the K-quant dot products alone on one
// thread: GB/s of weight bytes for a 576 × 1536 matrix (SmolLM2's
// ffn_down, ~0.5–0.7 MB: from L2/L3, as in decode), 1 or 16 activation
// rows, on each kernel set and in pure Go.
func BenchmarkKKernels(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, n = 576, 1536
	for _, ks := range append(kernelSets(b), nil) {
		name := "go"
		if ks != nil {
			name = ks.name
		}
		for _, c := range []struct {
			typ gguf.Type
			q   func([]float32) []byte
		}{{gguf.Q4_K, QuantizeQ4K}, {gguf.Q6_K, QuantizeQ6K}, {gguf.Q5_K, QuantizeQ5K}, {gguf.Q3_K, QuantizeQ3K}, {gguf.Q2_K, QuantizeQ2K},
			{gguf.IQ4_XS, QuantizeIQ4XS}} {
			w, err := newQuantTensor("w", c.typ, []int{rows, n}, c.q(randVec(rng, rows*n)))
			if err != nil {
				b.Fatal(err)
			}
			for _, T := range []int{1, 16} {
				if ks == nil && T > 1 {
					continue
				}
				b.Run(name+"/"+c.typ.String()+"/T"+itoaT(T), func(b *testing.B) {
					var a q8KActs
					a.reset(T, n, c.typ == gguf.IQ4_XS)
					a.quantizeRows(randVec(rng, T*n), 0, T)
					dst := make([]float32, T*rows)
					for range b.N {
						for r0 := 0; r0 < rows; r0 += blockRows {
							matRowsK(ks, dst, rows, &a, T, w, r0, r0+blockRows)
						}
					}
					b.ReportMetric(float64(len(w.q))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// TestKQuantTensorSize checks that a Q5_K, Q3_K, Q2_K or IQ4_XS matrix is built
// only over exactly its rows' bytes, and only for rows a multiple of 256.
func TestKQuantTensorSize(t *testing.T) {
	for _, typ := range []gguf.Type{gguf.Q5_K, gguf.Q3_K, gguf.Q2_K, gguf.IQ4_XS} {
		raw := make([]byte, 2*2*typ.BlockBytes())
		if _, err := newQuantTensor("w", typ, []int{2, 512}, raw); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		for _, c := range []struct {
			shape []int
			n     int
		}{{[]int{2, 512}, len(raw) - 1}, {[]int{2, 512}, len(raw) - typ.BlockBytes()}, {[]int{2, 512}, len(raw) + 1}, {[]int{2, 288}, len(raw)}} {
			if _, err := newQuantTensor("w", typ, c.shape, make([]byte, c.n)); err == nil {
				t.Errorf("%s %v over %d bytes: no error", typ, c.shape, c.n)
			}
		}
	}
}

package llama

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// TestQuantizeRoundTrip checks ggml's reference quantizers through
// dequantRow: Q8_0 within half a step (d/2) of each value, Q4_0 within one
// step, and exact for values already on the grid.
func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randVec(rng, 32*20)
	x[5], x[40] = 0, negZero
	for i := 64; i < 96; i++ {
		x[i] = 0 // an all-zero block
	}
	for _, c := range []struct {
		typ  gguf.Type
		q    func([]float32) []byte
		step func(d float32) float64
	}{{gguf.Q8_0, QuantizeQ8_0, func(d float32) float64 { return float64(d) / 2 * 1.07 }}, {gguf.Q4_0, QuantizeQ4_0, func(d float32) float64 { return math.Abs(float64(d)) }}} {
		b := c.q(x)
		if len(b) != len(x)/32*c.typ.BlockBytes() {
			t.Fatalf("%s: %d bytes", c.typ, len(b))
		}
		y := make([]float32, len(x))
		dequantRow(c.typ, b, y)
		for i := range x {
			d := f16At(b, i/32*c.typ.BlockBytes())
			if e := math.Abs(float64(y[i] - x[i])); e > c.step(d)*1.01+1e-7 {
				t.Fatalf("%s: element %d: %v → %v (scale %v)", c.typ, i, x[i], y[i], d)
			}
		}
		// Values on the grid come back exactly.
		again := c.q(y)
		z := make([]float32, len(y))
		dequantRow(c.typ, again, z)
		for i := range y {
			if z[i] != y[i] {
				t.Fatalf("%s: requantizing element %d: %v → %v", c.typ, i, y[i], z[i])
			}
		}
	}
}

// TestQ8Activations checks the activation quantization: quants within
// [−127, 127], the block's largest magnitude at ±127, the lane sums, and
// dequantized values within half a step.
func TestQ8Activations(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	const T, n = 3, 96
	x := randVec(rng, T*n)
	for i := 32; i < 64; i++ {
		x[i] = 0
	}
	var a q8Acts
	a.reset(T, n)
	a.quantizeRows(x, 0, T)
	for k := range T * n / 32 {
		qs := a.qs[32*k : 32*k+32]
		d := a.d8[8*k]
		var big int8
		for i, q := range qs {
			big = max(big, q, -q)
			if e := math.Abs(float64(d)*float64(q) - float64(x[32*k+i])); e > float64(d)*0.502+1e-9 {
				t.Fatalf("block %d element %d: %v → %d·%v", k, i, x[32*k+i], q, d)
			}
		}
		if k != 1 && big != 127 || k == 1 && (big != 0 || d != 0) {
			t.Fatalf("block %d: largest quant %d, scale %v", k, big, d)
		}
		for j := range 8 {
			s := int32(qs[4*j]) + int32(qs[4*j+1]) + int32(qs[4*j+2]) + int32(qs[4*j+3])
			if a.ls[8*k+j] != -s || a.d8[8*k+j] != d {
				t.Fatalf("block %d lane %d: sum %d (want %d), scale %v", k, j, -a.ls[8*k+j], s, a.d8[8*k+j])
			}
		}
	}
}

// TestDotQ8 checks the canonical quantized dot product against a float64
// sum over the dequantized weights and activations.
func TestDotQ8(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, typ := range []gguf.Type{gguf.Q8_0, gguf.Q4_0} {
		for _, n := range []int{32, 64, 96, 576} {
			w := typeQuantize(typ, randVec(rng, n))
			wf := make([]float32, n)
			dequantRow(typ, w, wf)
			x := randVec(rng, 2*n)
			var a q8Acts
			a.reset(2, n)
			a.quantizeRows(x, 0, 2)
			for tok := range 2 {
				var want, mag float64
				for i := range n {
					xv := float64(a.d8[8*((tok*n+i)/32)]) * float64(a.qs[tok*n+i])
					want += float64(wf[i]) * xv
					mag += math.Abs(float64(wf[i]) * xv)
				}
				got := dotQ8Go(typ, w, &a, tok)
				if e := math.Abs(float64(got) - want); e > 1e-6*mag {
					t.Fatalf("%s n=%d: %v, want %v", typ, n, got, want)
				}
			}
		}
	}
}

func typeQuantize(t gguf.Type, x []float32) []byte {
	if t == gguf.Q8_0 {
		return QuantizeQ8_0(x)
	}
	return QuantizeQ4_0(x)
}

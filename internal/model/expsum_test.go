package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestExpNeg(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	check := func(d float64) {
		got, want := expNeg(d), math.Exp(d)
		if d <= -708 {
			if got != 0 {
				t.Fatalf("expNeg(%v) = %v, want 0", d, got)
			}
			return
		}
		if rel := math.Abs(got-want) / want; !(rel <= 0x1p-50) {
			t.Fatalf("expNeg(%v) = %v, math.Exp %v: relative error %v", d, got, want, rel)
		}
	}
	for _, d := range []float64{0, math.Copysign(0, -1), -1e-300, -0x1p-30, -math.Ln2 / 64, -math.Ln2 / 32, -math.Ln2, -1, -20, -87.3, -700, -707.99, -708, -709, -1e10} {
		check(d)
	}
	for range 200000 {
		check(-rng.ExpFloat64() * []float64{0.01, 1, 10, 100}[rng.IntN(4)])
	}
	if got := expNeg(math.Inf(-1)); got != 0 {
		t.Fatalf("expNeg(−Inf) = %v", got)
	}
	if got := expNeg(math.NaN()); got != 0 {
		t.Fatalf("expNeg(NaN) = %v", got)
	}
}

func TestExpSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, n := range []int{1, 7, 8, 9, 100, 49152} {
		x := make([]float32, n)
		m := math.Inf(-1)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 4)
			m = max(m, float64(x[i]))
		}
		x[n/2] = float32(math.Inf(-1))
		if n == 1 {
			x[0], m = 0, 0
		}
		var want float64
		for _, l := range x {
			want += math.Exp(float64(l) - m)
		}
		if got := expSum(x, m); math.Abs(got-want)/want > 1e-14 {
			t.Fatalf("n=%d: expSum %v, Σ math.Exp %v", n, got, want)
		}
	}
}

func BenchmarkExpSum(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, 49152)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 3)
	}
	b.Run("expSum", func(b *testing.B) {
		for range b.N {
			expSum(x, 20)
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for range b.N {
			var s float64
			for _, l := range x {
				s += math.Exp(float64(l) - 20)
			}
			if s < 0 {
				b.Fatal(s)
			}
		}
	})
}

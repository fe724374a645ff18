package llama

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind (Forward's team
// must be stopped on every path).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBF16RoundTrip(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {0, 0}, {float32(math.Inf(1)), 0x7f80},
		// 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even (1).
		{1 + 1.0/256, 0x3f80},
		// 1 + 3·2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even (1+2^-6).
		{1 + 3.0/256, 0x3f82},
		{1 + 1.0/256 + 1.0/65536, 0x3f81},
	} {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	for b := range 1 << 16 {
		f := BF16ToF32(uint16(b))
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(BF16ToF32(F32ToBF16(f)))) {
				t.Fatalf("NaN %#04x did not stay NaN", b)
			}
			continue
		}
		if got := F32ToBF16(f); got != uint16(b) {
			t.Fatalf("bf16 %#04x → %v → %#04x", b, f, got)
		}
	}
}

func TestF16RoundTrip(t *testing.T) {
	for _, c := range []struct {
		in   uint16
		want float64
	}{
		{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, math.Ldexp(1, -24)}, {0x0400, math.Ldexp(1, -14)},
		{0x03ff, 1023 * math.Ldexp(1, -24)}, {0x7c00, math.Inf(1)}, {0x8000, math.Copysign(0, -1)},
	} {
		if got := F16ToF32(c.in); float64(got) != c.want || math.Signbit(float64(got)) != math.Signbit(c.want) {
			t.Errorf("F16ToF32(%#04x) = %v, want %v", c.in, got, c.want)
		}
	}
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(F16ToF32(F32ToF16(f)))) {
				t.Fatalf("NaN %#04x did not stay NaN", h)
			}
			continue
		}
		if got := F32ToF16(f); got != uint16(h) {
			t.Fatalf("f16 %#04x → %v → %#04x", h, f, got)
		}
	}
	// Rounding: halfway cases tie to even; overflow goes to Inf; tiny to 0.
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}, {65520, 0x7c00}, {65519, 0x7bff},
		{float32(math.Ldexp(1, -25)), 0}, {float32(math.Ldexp(1.5, -25)), 1}, {float32(math.Ldexp(3, -25)), 2},
		{1e-10, 0}, {-1e10, 0xfc00},
	} {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

// randTensor returns a random [rows, cols] tensor of dtype dt and its exact
// float32 values.
func randTensor(rng *rand.Rand, dt DType, rows, cols int) (*tensor, []float32) {
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	var raw []byte
	switch dt {
	case F32:
		raw = F32Bytes(v)
	case BF16:
		raw = BF16Bytes(v)
	case F16:
		raw = F16Bytes(v)
	}
	tn, err := newTensor("w", dt, []int{rows, cols}, raw)
	if err != nil {
		panic(err)
	}
	return tn, tn.Float32()
}

func TestRMSNormAndSoftmax(t *testing.T) {
	x := []float32{1, 2, 3, 4, -1, 0, 0, 1}
	g := []float32{1, 0.5, 2, 1}
	r0 := math.Sqrt((1 + 4 + 9 + 16) / 4.0)
	r1 := math.Sqrt(2 / 4.0)
	want := []float64{1 / r0, 0.5 * 2 / r0, 2 * 3 / r0, 4 / r0, -1 / r1, 0, 0, 1 / r1}
	for _, ggml := range []bool{false, true} {
		dst := make([]float32, 8)
		rmsNorm(dst, x, 2, 4, g, 1e-6, ggml)
		for i := range want {
			if math.Abs(float64(dst[i])-want[i]) > 1e-5 {
				t.Errorf("rmsNorm (ggml %v) [%d] = %v, want %v", ggml, i, dst[i], want[i])
			}
		}
	}
	s := []float32{1, 2, 3, 1000}
	softmax(kernelSetFor(2), s)
	if s[3] != 1 || s[0] > 1e-37 {
		t.Errorf("softmax with a dominant entry: %v", s)
	}
	s = []float32{0, float32(math.Log(3))}
	softmax(kernelSetFor(2), s)
	if math.Abs(float64(s[0])-0.25) > 1e-7 || math.Abs(float64(s[1])-0.75) > 1e-7 {
		t.Errorf("softmax(0, ln 3) = %v, want 0.25, 0.75", s)
	}
	gate, up := []float32{0, 1, -2}, []float32{5, 2, 1}
	siluMul(kernelSetFor(2), gate, up)
	for i, w := range []float64{0, 2 / (1 + math.Exp(-1)), -2 / (1 + math.Exp(2))} {
		if math.Abs(float64(gate[i])-w) > 1e-6 {
			t.Errorf("silu·up[%d] = %v, want %v", i, gate[i], w)
		}
	}
}

// TestRopeInvFreq checks the three regimes of llama3 scaling with Llama
// 3.1's parameters (factor 8, low 1, high 4, original 8192), and linear.
func TestRopeInvFreq(t *testing.T) {
	cfg := Config{HeadDim: 128, RopeTheta: 500000}
	plain := ropeInvFreq(&cfg)
	if plain[0] != 1 || math.Abs(plain[1]-math.Pow(500000, -2.0/128)) > 1e-18 {
		t.Fatalf("default inv freq %v %v", plain[0], plain[1])
	}
	cfg.RopeScaling = &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
	scaled := ropeInvFreq(&cfg)
	var kept, divided, mixed int
	for i, f := range plain {
		wave := 2 * math.Pi / f
		switch {
		case wave < 8192.0/4: // high frequency: unchanged
			kept++
			if scaled[i] != f {
				t.Errorf("freq %d (wavelength %.0f) changed: %v → %v", i, wave, f, scaled[i])
			}
		case wave > 8192: // low frequency: divided by the factor
			divided++
			if math.Abs(scaled[i]-f/8) > 1e-15*f {
				t.Errorf("freq %d (wavelength %.0f): %v, want %v", i, wave, scaled[i], f/8)
			}
		default: // interpolated between f/8 and f, monotonically in the wavelength
			mixed++
			s := (8192/wave - 1) / 3
			if want := (1-s)*f/8 + s*f; math.Abs(scaled[i]-want) > 1e-15 || scaled[i] <= f/8 || scaled[i] >= f {
				t.Errorf("freq %d (wavelength %.0f): %v, want %v in (%v, %v)", i, wave, scaled[i], want, f/8, f)
			}
		}
	}
	if kept == 0 || divided == 0 || mixed == 0 {
		t.Errorf("regimes kept %d, divided %d, interpolated %d: want each > 0", kept, divided, mixed)
	}
	cfg.RopeScaling = &RopeScaling{Type: "linear", Factor: 4}
	for i, f := range ropeInvFreq(&cfg) {
		if f != plain[i]/4 {
			t.Errorf("linear freq %d = %v, want %v", i, f, plain[i]/4)
		}
	}
}

// TestTeam checks that parallelFor covers every index exactly once, with
// worker indices in range.
func TestTeam(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		tm := startTeam(n)
		for _, size := range []int{0, 1, 7, 1000} {
			for _, grain := range []int{1, 3, 2000} {
				hits := make([]int32, size)
				tm.parallelFor(size, grain, loopFunc(func(w, lo, hi int) {
					if w < 0 || w >= tm.size() {
						panic("worker index out of range")
					}
					for i := lo; i < hi; i++ {
						hits[i]++
					}
				}))
				for i, h := range hits {
					if h != 1 {
						t.Fatalf("team %d size %d grain %d: index %d hit %d times", n, size, grain, i, h)
					}
				}
			}
		}
		tm.stop()
	}
}

// TestTeamSteals checks that a worker held up inside a chunk holds up only
// that chunk: the others take the rest of its share. Worker 1's first
// chunk waits until every other index is done, which without stealing
// would never happen (worker 0 would finish its own half and wait).
func TestTeamSteals(t *testing.T) {
	tm := startTeam(2)
	defer tm.stop()
	const n = 1000
	var done atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	tm.parallelFor(n, 1, loopFunc(func(w, lo, hi int) {
		if w == 1 {
			once.Do(func() { <-release })
		}
		if done.Add(int64(hi-lo)) == n-1 {
			close(release)
		}
	}))
	if got := done.Load(); got != n {
		t.Fatalf("%d of %d indices done", got, n)
	}
}

func itoaT(n int) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}

package llama

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// TestKVRounding checks the edge cases of the float32 → BF16 and → F16
// roundings the KV cache stores with, beyond TestBF16RoundTrip and
// TestF16RoundTrip: overflow past the largest finite value, NaN whose
// payload lies only in the bits rounded away (it must stay NaN, not become
// Inf), signs of zero, Inf and NaN, float32 subnormals, and ties at the
// subnormal/normal boundary. The expected patterns follow from the formats
// (IEEE 754 binary16; bfloat16 = the top half of binary32).
func TestKVRounding(t *testing.T) {
	f := math.Float32frombits
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{f(0x7f7fffff), 0x7f80}, // largest finite float32: rounds up to +Inf
		{f(0xff7fffff), 0xff80}, // and its negative to −Inf
		{f(0x7f7f7fff), 0x7f7f}, // just below the tie: the largest finite bfloat16
		{f(0x7f800000), 0x7f80}, // +Inf
		{f(0xff800000), 0xff80}, // −Inf
		{f(0x7f800001), 0x7fc0}, // NaN with the payload in the low bits: still NaN (quiet)
		{f(0xff800001), 0xffc0}, // negative NaN keeps its sign
		{f(0x80000000), 0x8000}, // −0
		{f(0x00000001), 0x0000}, // smallest float32 subnormal: below half of bfloat16's
		{f(0x00008000), 0x0000}, // a tie between 0 and bfloat16's smallest subnormal: even (0)
		{f(0x00018000), 0x0002}, // a tie between subnormals 1 and 2: even (2)
		{f(0x00010000), 0x0001}, // bfloat16's smallest subnormal, exact
		{f(0x007fffff), 0x0080}, // largest float32 subnormal rounds up to the smallest normal
		{f(0x80018001), 0x8002}, // above a tie, negative
		{f(0x3f808000), 0x3f80}, // 1 + 2^-8, a tie: even (1)
		{f(0x3f818000), 0x3f82}, // 1 + 3·2^-8, a tie: even (1 + 2^-6)
		{f(0x3f808001), 0x3f81}, // just above the tie
		{f(0x3f807fff), 0x3f80}, // just below it
		{f(0xc0000000), 0xc000}, // −2
	} {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", math.Float32bits(c.in), got, c.want)
		}
	}
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{65504, 0x7bff},                            // largest finite binary16
		{65519.996, 0x7bff},                        // below the tie with 65536: stays finite
		{65520, 0x7c00},                            // the tie: rounds to even, which is Inf
		{f(0x7f7fffff), 0x7c00},                    // far beyond: +Inf
		{-1e30, 0xfc00},                            // −Inf
		{f(0x7f800000), 0x7c00},                    // +Inf
		{f(0xff800000), 0xfc00},                    // −Inf
		{f(0x7f800001), 0x7e00},                    // NaN with the payload in the low bits: still NaN
		{f(0xffc00000), 0xfe00},                    // negative NaN keeps its sign
		{f(0x80000000), 0x8000},                    // −0
		{f(0x00000001), 0x0000},                    // float32 subnormal: far below binary16's
		{f(0x80000001), 0x8000},                    // and negative: −0
		{float32(math.Ldexp(1, -24)), 0x0001},      // smallest binary16 subnormal, exact
		{float32(math.Ldexp(1023.5, -24)), 0x0400}, // a tie between the largest subnormal and the smallest normal: even (normal)
		{float32(math.Ldexp(1022.5, -24)), 0x03fe}, // a tie between subnormals 1022 and 1023: even (1022)
		{float32(math.Ldexp(1, -14)), 0x0400},      // smallest normal, exact
		{float32(math.Ldexp(-5, -24)), 0x8005},     // negative subnormal, exact
		{float32(math.Ldexp(1.25, -24)), 0x0001},   // below a tie: down
		{float32(math.Ldexp(1.75, -24)), 0x0002},   // above a tie: up
		{1 + 1.0/2048, 0x3c00},                     // a tie at 1: even (1)
		{2047.0 / 1024 * (1 + 1.0/4096), 0x3fff},   // close below 2: the largest binary16 below 2
		{float32(math.Ldexp(2047, -10)) + float32(math.Ldexp(1, -11)), 0x4000}, // the tie below 2: even (2)
	} {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%v = %#08x) = %#04x, want %#04x", c.in, math.Float32bits(c.in), got, c.want)
		}
	}
}

// TestEncodeKV checks that what the forward pass writes into a KV slot
// (encodeKV) and what attention reads back from it (kvRow) are each
// element's rounding to the pool's dtype and its exact widening, for
// random values, specials, and values beyond the 2-byte ranges.
func TestEncodeKV(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 31))
	src := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		1e-8, -1e-8, 6e-8, 70000, -70000, 3.4e38, 1e-40}
	for len(src) < 96 {
		src = append(src, float32(rng.NormFloat64()*math.Pow(10, float64(rng.IntN(9)-4))))
	}
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		dst := make([]byte, len(src)*dt.Size())
		encodeKV(nil, dt, dst, src)
		got := kvRow(dt, unsafe.Pointer(&dst[0]), len(src), make([]float32, len(src)))
		for i, v := range src {
			var want float32
			switch dt {
			case kvcache.F32:
				want = v
			case kvcache.BF16:
				want = BF16ToF32(F32ToBF16(v))
			case kvcache.F16:
				want = F16ToF32(F32ToF16(v))
			}
			if math.Float32bits(got[i]) != math.Float32bits(want) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want))) {
				t.Errorf("%v: %v stored and read back as %v, want %v", dt, v, got[i], want)
			}
		}
	}
}

// TestEncodeKVKernels checks that every kernel set writes an F16 slot
// (encodeKV through narrowF16, the rest in Go) with F32ToF16's bits: for
// every float32 exponent with random mantissas and signs, the ties and
// near-ties of binary16's normal and subnormal ranges, overflow, ±0, ±Inf,
// and NaNs with payloads in the bits kept and in those rounded away, at
// lengths that leave every tail.
func TestEncodeKVKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 32))
	var src []float32
	f := math.Float32frombits
	for e := range uint32(256) {
		for range 64 {
			src = append(src, f(rng.Uint32()&0x80000000|e<<23|rng.Uint32()&0x7fffff))
		}
	}
	for e := uint32(127 - 26); e <= 127+16; e++ { // binary16's range and beyond, with ties
		for _, m := range []uint32{0, 1 << 12, 1<<12 | 1, 1<<12 - 1, 3 << 12, 0x7fffff, 0x7fe000, 0x7ff000} {
			for _, sg := range []uint32{0, 0x80000000} {
				src = append(src, f(sg|e<<23|m))
				src = append(src, f(sg|e<<23|(m|1<<13)&0x7fffff)) // the other parity
			}
		}
	}
	for _, u := range []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,
		0x7fffffff, 0xffffffff, 0x7fa00000, 0x7f802000, 0x7fc02000, 0x477ff000, 0x477fefff, 0x477fe000, 0xc77ff000} {
		src = append(src, f(u))
	}
	want := make([]uint16, len(src))
	for i, v := range src {
		want[i] = F32ToF16(v)
	}
	for _, ks := range kernelSets(t) {
		for _, n := range []int{len(src), 1, 7, 8, 9, 15, 16, 17, 31, 33, 192} {
			s := src[len(src)-n:]
			dst := make([]byte, 2*n+2)
			dst[2*n], dst[2*n+1] = 0xa5, 0x5a // a guard past the end
			encodeKV(ks, kvcache.F16, dst[:2*n], s)
			if dst[2*n] != 0xa5 || dst[2*n+1] != 0x5a {
				t.Fatalf("%s, n %d: wrote past the slot", ks.name, n)
			}
			got := unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), n)
			for i, w := range want[len(src)-n:] {
				if got[i] != w {
					t.Fatalf("%s, n %d: %#08x stored as %#04x, want %#04x (F32ToF16)", ks.name, n, math.Float32bits(s[i]), got[i], w)
				}
			}
		}
	}
}

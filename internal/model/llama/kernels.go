package llama

import (
	"math"
	"unsafe"
)

// Element-wise math kernels. Every floating-point result here depends only
// on its own inputs, never on how work is split across goroutines or on the
// batch it is part of (see simd.go for the dot products and matmul.go for
// the layers built on them). So a sequence computes bit-identical KV and
// logits whether it is prefilled whole or in chunks, alone or batched, on any
// number of threads (which is what makes PD output equal colocated output).

// widen converts len(dst) 16-bit values of dtype dt (F16 or BF16) to float32.
func widen(dt DType, dst []float32, src []uint16) {
	src = src[:len(dst)]
	switch dt {
	case BF16:
		widenBF16(dst, src)
	case F16:
		for i, h := range src {
			dst[i] = F16ToF32(h)
		}
	default:
		panic("llama: widen of " + dt.String())
	}
}

// widenBF16 converts bfloat16 bit patterns to float32 (exact: a shift). It
// moves four values per step through 64-bit words (little-endian host).
func widenBF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	i := 0
	if n := len(dst) / 4 * 4; n > 0 {
		s := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(src))), n/4)
		d := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(dst))), n/2)
		for len(s) >= 2 && len(d) >= 4 {
			v, u := s[0], s[1]
			d[0] = (v&0xffff)<<16 | (v&0xffff0000)<<32
			d[1] = (v>>32&0xffff)<<16 | (v>>48)<<48
			d[2] = (u&0xffff)<<16 | (u&0xffff0000)<<32
			d[3] = (u>>32&0xffff)<<16 | (u>>48)<<48
			s, d = s[2:], d[4:]
		}
		for len(s) >= 1 && len(d) >= 2 {
			v := s[0]
			d[0] = (v&0xffff)<<16 | (v&0xffff0000)<<32
			d[1] = (v>>32&0xffff)<<16 | (v>>48)<<48
			s, d = s[1:], d[2:]
		}
		i = n
	}
	for ; i < len(dst); i++ {
		dst[i] = math.Float32frombits(uint32(src[i]) << 16)
	}
}

// rmsNorm computes dst[t] = x[t] / sqrt(mean(x[t]²) + eps) ⊙ g for each of
// the T rows of width n (Zhang and Sennrich, "Root Mean Square Layer
// Normalization", 2019; transformers' LlamaRMSNorm, which also normalises in
// float32 and applies the gain last). The sum of squares is accumulated in
// float64. With ggml set, the scale is computed as ggml's rms_norm does
// (ggml-cpu ops.cpp): each square rounded to float32 before the float64
// sum, the mean, mean + eps, its square root and the reciprocal each in
// float32; otherwise the whole scale in float64, rounded once. dst may be x.
func rmsNorm(dst, x []float32, T, n int, g []float32, eps float64, ggml bool) {
	g = g[:n]
	for t := range T {
		row := x[t*n : (t+1)*n]
		var ss float64
		var inv float32
		if ggml {
			for _, v := range row {
				ss += float64(float32(v * v))
			}
			mean := float32(ss / float64(n))
			inv = 1 / float32(math.Sqrt(float64(mean+float32(eps))))
		} else {
			for _, v := range row {
				ss += float64(v) * float64(v)
			}
			inv = float32(1 / math.Sqrt(ss/float64(n)+eps))
		}
		d := dst[t*n : (t+1)*n]
		for i, v := range row {
			d[i] = g[i] * (v * inv)
		}
	}
}

// tanhf is tanh of a float32: math.Tanh (pure Go, the same bits on every
// machine) in float64, rounded once.
func tanhf(x float32) float32 { return float32(math.Tanh(float64(x))) }

// Constants of the tanh approximation of GELU (Hendrycks and Gimpel,
// "Gaussian Error Linear Units", 2016): √(2/π) and 0.044715, as float32
// like ggml's SQRT_2_OVER_PI and GELU_COEF_A (ggml-cpu vec.h).
const (
	geluSqrt2OverPi = 0.79788456080286535587989211986876
	geluCoefA       = 0.044715
)

// geluTanh32 is ggml_gelu_f32 (ggml-cpu vec.h): 0.5·x·(1 + tanh(√(2/π)·x·
// (1 + 0.044715·x²))), every operation in float32 from left to right (the
// explicit conversions keep the compiler from fusing any of them).
func geluTanh32(x float32) float32 {
	a := float32(float32(geluCoefA) * x)
	a = float32(a * x)
	inner := float32(float32(float32(geluSqrt2OverPi)*x) * float32(1+a))
	return float32(float32(0.5)*x) * float32(1+tanhf(inner))
}

// geluMul sets gate[i] = gelu(gate[i])·up[i]: the GeGLU MLP (Shazeer, "GLU
// Variants Improve Transformer", 2020) with gelu's tanh approximation
// (transformers' gelu_pytorch_tanh). With a table (geluTableGGML) it is
// ggml_vec_geglu_f32 as ggml builds it (GGML_GELU_FP16): 0 for g ≤ −10,
// g·up for g ≥ 10, and otherwise g rounded to float16, looked up, widened
// and times up. Without one, gelu is computed in float64 from the float32
// g (0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))) and rounded once. Pure
// Go: the same bits on every kernel set.
func geluMul(gate, up []float32, table []uint16) {
	up = up[:len(gate)]
	for i, g := range gate {
		switch {
		case table == nil:
			x := float64(g)
			gl := 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
			gate[i] = float32(gl) * up[i]
		case g <= -10:
			gate[i] = 0
		case g >= 10:
			gate[i] = g * up[i]
		default:
			gate[i] = F16ToF32(table[F32ToF16(g)]) * up[i]
		}
	}
}

// geluTableGGML returns ggml's ggml_table_gelu_f16 (ggml-cpu.c,
// ggml_cpu_init): for every float16 bit pattern h, float16(geluTanh32(h)).
// 128 KiB, built once per Load (2^16 tanh) and shared read-only.
func geluTableGGML() []uint16 {
	t := make([]uint16, 1<<16)
	for i := range t {
		t[i] = F32ToF16(geluTanh32(F16ToF32(uint16(i))))
	}
	return t
}

// softcapRow replaces each x by c·tanh(x·(1/c)) (logit soft-capping; Gemma
// 2, Team et al. 2024): ggml's scale by 1/c (rounded to float32), tanhf,
// scale by c, as llama.cpp builds it for gemma2.
func softcapRow(x []float32, c float64) {
	inv, cf := float32(1/float32(c)), float32(c)
	for i, v := range x {
		x[i] = tanhf(v*inv) * cf
	}
}

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

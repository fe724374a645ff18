package llama

import (
	"math"
	"unsafe"

	"github.com/viterin/vek/vek32"
)

// Math kernels. Every floating-point result here depends only on its own
// inputs, never on how work is split across goroutines or on the batch it
// is part of: an output element is one dot product over the full reduction
// dimension. So a sequence computes bit-identical KV and logits whether it is
// prefilled whole or in chunks, alone or batched, on any number of threads
// (which is what makes PD output equal colocated output).
//
// The weight dtype enters only in widen (and tensor.Row): a faster kernel for
// a dtype (SIMD widening, or a fused widen-and-dot) is a local change here.

// rowTile is how many weight rows a linear-layer task widens and keeps hot
// while it streams every token of the batch past them: for a batch of T
// tokens each weight byte is read once per batch, not once per token.
const rowTile = 32

// minParallelFlops is the work below which a loop runs on the caller alone:
// handing it to the team would cost more than it saves.
const minParallelFlops = 1 << 16

// dot is Σ a[i]·b[i] over len(a) = len(b) > 0 elements, through vek's AVX2
// kernel where the CPU has it and its pure-Go loop otherwise.
func dot(a, b []float32) float32 { return vek32.Dot(a, b) }

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

// linear computes a PyTorch nn.Linear over a batch: dst[t, r] =
// Σ_i x[t, i]·w[r, i] + bias[r] for t < T, r < out, with dst [T, out],
// x [T, in], w [out, in] and bias [out] or nil. Work is split over tiles of
// rowTile weight rows; each worker widens its tile into its scratch
// (tiles[w], at least rowTile·in floats) once and applies it to all T tokens.
func linear(tm *team, tiles [][]float32, dst, x []float32, T int, w *tensor, bias []float32) {
	out, in := w.Rows(), w.Cols()
	nTiles := (out + rowTile - 1) / rowTile
	grain := 1
	if T*out*in < minParallelFlops {
		grain = nTiles
	}
	tb := max(1, min(16, l1TokenBytes/(4*in)))
	tm.parallelFor(nTiles, grain, func(wk, lo, hi int) {
		for tile := lo; tile < hi; tile++ {
			r0 := tile * rowTile
			r1 := min(r0+rowTile, out)
			var rows []float32
			if w.DType == F32 {
				rows = w.f32[r0*in : r1*in]
			} else {
				rows = tiles[wk][:(r1-r0)*in]
				widen(w.DType, rows, w.u16[r0*in:r1*in])
			}
			// A block of tokens stays in L1 while each row of the tile
			// (in L2) is applied to all of them.
			for t0 := 0; t0 < T; t0 += tb {
				t1 := min(t0+tb, T)
				for i := range r1 - r0 {
					w := rows[i*in : (i+1)*in]
					for t := t0; t < t1; t++ {
						dst[t*out+r0+i] = dot(x[t*in:(t+1)*in], w)
					}
				}
			}
			if bias != nil {
				for t := range T {
					d := dst[t*out+r0 : t*out+r1]
					for i := range d {
						d[i] += bias[r0+i]
					}
				}
			}
		}
	})
}

// l1TokenBytes is how many bytes of activations linear keeps hot per token
// block: half of a typical 32–48 KiB L1 data cache.
const l1TokenBytes = 16 << 10

// rmsNorm computes dst[t] = x[t] / sqrt(mean(x[t]²) + eps) ⊙ g for each of
// the T rows of width n (Zhang and Sennrich, "Root Mean Square Layer
// Normalization", 2019; transformers' LlamaRMSNorm, which also normalises in
// float32 and applies the gain last). The sum of squares is accumulated in
// float64. dst may be x.
func rmsNorm(dst, x []float32, T, n int, g []float32, eps float64) {
	g = g[:n]
	for t := range T {
		row := x[t*n : (t+1)*n]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(n)+eps))
		d := dst[t*n : (t+1)*n]
		for i, v := range row {
			d[i] = g[i] * (v * inv)
		}
	}
}

// siluMul sets gate[i] = silu(gate[i])·up[i], with silu(x) = x·σ(x) =
// x / (1 + e^−x) (Elfwing et al., "Sigmoid-Weighted Linear Units", 2017;
// hidden_act "silu" in transformers): the SwiGLU MLP of Shazeer, "GLU
// Variants Improve Transformer", 2020.
func siluMul(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = float32(float64(g)/(1+math.Exp(-float64(g)))) * up[i]
	}
}

// softmax replaces x by exp(x − max x) / Σ exp(x − max x), accumulating in
// float64.
func softmax(x []float32) {
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - m))
		x[i] = float32(e)
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] = float32(float64(x[i]) * inv)
	}
}

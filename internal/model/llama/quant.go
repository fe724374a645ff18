package llama

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// Quantized weights: the block formats of ggml (ggml-common.h), read in
// place from a memory-mapped GGUF file. A row of a quantized matrix is a
// sequence of blocks; all formats here store a block's scale(s) as IEEE
// binary16.
//
//	Q8_0 (32 elements, 34 bytes): d f16, qs [32]int8;       w[i] = d·qs[i]
//	Q4_0 (32 elements, 18 bytes): d f16, qs [16]uint8;      w[i] = d·((qs[i] & 15) − 8),
//	                                                        w[i+16] = d·((qs[i] >> 4) − 8)
//	Q4_1 (32 elements, 20 bytes): d, m f16, qs [16]uint8;   w[i] = d·(qs[i] & 15) + m,
//	                                                        w[i+16] = d·(qs[i] >> 4) + m
//	Q5_0 (32 elements, 22 bytes): d f16, qh [4]uint8, qs [16]uint8:
//	     w[i] = d·(q[i] − 16), q[i] = (qs[i] & 15) | h_i<<4 and q[i+16] =
//	     (qs[i] >> 4) | h_{i+16}<<4 for i < 16, h_k bit k of qh as a
//	     little-endian uint32
//	Q5_1 (32 elements, 24 bytes): d, m f16, qh [4]uint8, qs [16]uint8:
//	     w[i] = d·q[i] + m, q[i] the 5-bit value as in Q5_0
//	IQ4_NL (32 elements, 18 bytes): d f16, qs [16]uint8, nibbles as Q4_0:
//	     w[i] = d·kvaluesIQ4NL[nibble] (a non-uniform 4-bit grid)
//	Q4_K (256 elements, 144 bytes): d, dmin f16, scales [12]uint8 (6-bit scale
//	     and min of 8 sub-blocks of 32), qs [128]uint8:
//	     w = d·sc_j·q − dmin·m_j, q the nibbles of sub-block j (qs[32⌊j/2⌋ …],
//	     low nibbles for even j, high for odd)
//	Q6_K (256 elements, 210 bytes): ql [128]uint8 (low 4 bits), qh [64]uint8
//	     (high 2 bits), scales [16]int8 (one per 16 elements), d f16:
//	     w = d·scales[k]·(q − 32), q a 6-bit value
//	Q5_K, Q3_K, Q2_K: see kquant2.go
//	IQ4_XS: see iq4xs.go
//
// Dequantization is the float32 arithmetic of ggml's dequantize_row_*: the
// scale widened from binary16, times the integer, rounded once (for Q4_K:
// d·sc and dmin·m first, then the fused expression as ggml writes it; for
// Q4_1 and Q5_1 the product d·q rounded, then m added).

// quantBlock returns the elements per block and bytes per block of a
// quantized type pdserve computes with (0, 0 for any other).
func quantBlock(t gguf.Type) (elems, bytes int) {
	switch t {
	case gguf.Q8_0, gguf.Q4_0, gguf.Q4_1, gguf.Q5_0, gguf.Q5_1, gguf.IQ4_NL, gguf.Q4_K, gguf.Q6_K,
		gguf.Q5_K, gguf.Q3_K, gguf.Q2_K, gguf.IQ4_XS:
		return t.BlockSize(), t.BlockBytes()
	}
	return 0, 0
}

func f16At(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// dequantRow widens the n elements of quantized row src (type t) into dst.
func dequantRow(t gguf.Type, src []byte, dst []float32) {
	switch t {
	case gguf.Q8_0:
		for b := range len(dst) / 32 {
			blk := src[34*b : 34*b+34]
			d := f16At(blk, 0)
			for i := range 32 {
				dst[32*b+i] = d * float32(int8(blk[2+i]))
			}
		}
	case gguf.Q4_0:
		for b := range len(dst) / 32 {
			blk := src[18*b : 18*b+18]
			d := f16At(blk, 0)
			for i := range 16 {
				q := blk[2+i]
				dst[32*b+i] = d * float32(int(q&15)-8)
				dst[32*b+16+i] = d * float32(int(q>>4)-8)
			}
		}
	case gguf.IQ4_NL:
		// ggml-quants.c dequantize_row_iq4_nl.
		for b := range len(dst) / 32 {
			blk := src[18*b : 18*b+18]
			d := f16At(blk, 0)
			for i := range 16 {
				q := blk[2+i]
				dst[32*b+i] = d * float32(kvaluesIQ4NL[q&15])
				dst[32*b+16+i] = d * float32(kvaluesIQ4NL[q>>4])
			}
		}
	case gguf.Q4_1, gguf.Q5_0, gguf.Q5_1:
		// ggml-quants.c dequantize_row_q4_1, dequantize_row_q5_0,
		// dequantize_row_q5_1.
		bb := t.BlockBytes()
		var q [32]int32
		for b := range len(dst) / 32 {
			d, m := q32Block(t, src[bb*b:bb*b+bb], &q)
			y := dst[32*b : 32*b+32]
			for i, v := range q {
				if t == gguf.Q5_0 {
					y[i] = d * float32(v)
				} else {
					y[i] = float32(d*float32(v)) + m // rounded product, as ggml
				}
			}
		}
	case gguf.Q4_K:
		for b := range len(dst) / 256 {
			blk := src[144*b : 144*b+144]
			d, dmin := f16At(blk, 0), f16At(blk, 2)
			y := dst[256*b : 256*b+256]
			for j := range 8 {
				sc, m := q4kScaleMin(blk[4:16], j)
				d1, m1 := d*float32(sc), dmin*float32(m)
				qs := blk[16+32*(j/2) : 16+32*(j/2)+32]
				for i := range 32 {
					q := qs[i] & 15
					if j%2 == 1 {
						q = qs[i] >> 4
					}
					y[32*j+i] = float32(d1*float32(q)) - m1 // rounded product, as ggml (no fused multiply-add)
				}
			}
		}
	case gguf.Q6_K:
		for b := range len(dst) / 256 {
			blk := src[210*b : 210*b+210]
			d := f16At(blk, 208)
			y := dst[256*b : 256*b+256]
			for i := range 256 {
				y[i] = d * float32(int8(blk[192+i/16])) * float32(q6kValue(blk, i)-32)
			}
		}
	case gguf.IQ4_XS:
		dequantRowIQ4XS(src, dst) // iq4xs.go
	default:
		dequantRowK2(t, src, dst) // Q5_K, Q3_K, Q2_K (kquant2.go)
	}
}

// Dequantize returns the n values (a multiple of t's block) of quantized
// data src of type t (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K,
// Q3_K, Q4_K, Q5_K or Q6_K),
// as ggml's dequantize_row_* computes them. It panics for another type or
// too little data.
func Dequantize(t gguf.Type, src []byte, n int) []float32 {
	if e, _ := quantBlock(t); e == 0 || uint64(len(src)) < t.RowBytes(uint64(n)) {
		panic("llama: Dequantize: bad type or data")
	}
	out := make([]float32, n)
	dequantRow(t, src, out)
	return out
}

// kvaluesIQ4NL is IQ4_NL's grid, ggml-common.h kvalues_iq4nl (read only).
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// q32Block unpacks one block of a Q4_1, Q5_0 or Q5_1 row (blk, its
// BlockBytes bytes) into its 32 integers q — Q5_0's already less 16, so that
// w = d·q, the others' unsigned, w = d·q + m — and returns d and m (0 for
// Q5_0) widened from binary16. The high bit of element k of a Q5 block is
// bit k of qh (ggml-quants.c dequantize_row_q5_0).
func q32Block(t gguf.Type, blk []byte, q *[32]int32) (d, m float32) {
	d = f16At(blk, 0)
	var qh uint32
	var qs []byte
	switch t {
	case gguf.Q4_1:
		m, qs = f16At(blk, 2), blk[4:20]
	case gguf.Q5_0:
		qh, qs = binary.LittleEndian.Uint32(blk[2:]), blk[6:22]
	default: // Q5_1
		m, qh, qs = f16At(blk, 2), binary.LittleEndian.Uint32(blk[4:]), blk[8:24]
	}
	var off int32
	if t == gguf.Q5_0 {
		off = 16
	}
	for i := range 16 {
		lo := int32(qs[i]&15) | int32(qh>>i&1)<<4
		hi := int32(qs[i]>>4) | int32(qh>>(i+16)&1)<<4
		q[i], q[i+16] = lo-off, hi-off
	}
	return d, m
}

// q4kScaleMin returns the 6-bit scale and min of sub-block j of a Q4_K
// block's 12 scale bytes (ggml's get_scale_min_k4).
func q4kScaleMin(s []byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&15 | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// q6kValue returns the 6-bit quant (0–63) of element i of a Q6_K block
// (ggml's dequantize_row_q6_K: elements in halves of 128, each in four
// quarters l, l+32, l+64, l+96 taking ql's low/high nibbles and qh's bit
// pairs 0–1, 2–3, 4–5, 6–7).
func q6kValue(blk []byte, i int) int {
	h, r := i/128, i%128
	quarter, l := r/32, r%32
	ql := blk[64*h:]
	qh := blk[128+32*h:]
	var lo byte
	switch quarter {
	case 0:
		lo = ql[l] & 15
	case 1:
		lo = ql[l+32] & 15
	case 2:
		lo = ql[l] >> 4
	default:
		lo = ql[l+32] >> 4
	}
	hi := (qh[l] >> (2 * quarter)) & 3
	return int(lo) | int(hi)<<4
}

// QuantizeQ8_0 quantizes x (a multiple of 32 values) to Q8_0 blocks as
// ggml's quantize_row_q8_0_ref does: d = max|x|/127, q = round(x/d)
// (half away from zero, with 1/d as a float32), d stored as binary16.
func QuantizeQ8_0(x []float32) []byte {
	out := make([]byte, len(x)/32*34)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		o := out[34*b:]
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		for i, v := range blk {
			o[2+i] = byte(int8(math.Round(float64(v * id))))
		}
	}
	return out
}

// signedAbsMax returns the value of blk with the largest magnitude, the
// first of several (ggml's quantize_row_q4_0_ref and its kin pick it so),
// with its sign; 0 for an all-zero block.
func signedAbsMax(blk []float32) float32 {
	var amax, m float32
	for _, v := range blk {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, m = a, v
		}
	}
	return m
}

// QuantizeQ4_0 quantizes x (a multiple of 32 values) to Q4_0 blocks as
// ggml's quantize_row_q4_0_ref does: with m the value of largest magnitude,
// d = m/−8 and q = min(15, trunc(x/d + 8.5)), d stored as binary16.
func QuantizeQ4_0(x []float32) []byte {
	out := make([]byte, len(x)/32*18)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		m := signedAbsMax(blk)
		d := m / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		o := out[18*b:]
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		for i := range 16 {
			x0 := min(15, int8(blk[i]*id+8.5))
			x1 := min(15, int8(blk[16+i]*id+8.5))
			o[2+i] = byte(x0) | byte(x1)<<4
		}
	}
	return out
}

// QuantizeQ5_0 quantizes x (a multiple of 32 values) to Q5_0 blocks as
// ggml's quantize_row_q5_0_ref does (ggml-quants.c): with m the value of
// largest magnitude (the first, if several), d = m/−16 and q =
// min(31, trunc(x/d + 16.5)) (x/d as x times 1/d in float32), the low four
// bits in qs and the fifth in qh; d stored as binary16.
func QuantizeQ5_0(x []float32) []byte {
	out := make([]byte, len(x)/32*22)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		m := signedAbsMax(blk)
		d := m / -16
		var id float32
		if d != 0 {
			id = 1 / d
		}
		o := out[22*b : 22*b+22]
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		var q [32]int32
		for i, v := range blk {
			q[i] = int32(min(31, int8(float32(v*id)+16.5)))
		}
		putQ5(o[2:6], o[6:22], &q)
	}
	return out
}

// QuantizeQ5_1 quantizes x (a multiple of 32 values) to Q5_1 blocks as
// ggml's quantize_row_q5_1_ref does: with lo and hi the block's least and
// greatest values, d = (hi − lo)/31, m = lo, q = trunc((x − lo)·(1/d) +
// 0.5) (clamped to 31, which ggml's rounding never exceeds); d and m stored
// as binary16.
func QuantizeQ5_1(x []float32) []byte {
	out := make([]byte, len(x)/32*24)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		d, id, lo := minMaxScale(blk, 31)
		o := out[24*b : 24*b+24]
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		binary.LittleEndian.PutUint16(o[2:], F32ToF16(lo))
		var q [32]int32
		for i, v := range blk {
			q[i] = int32(min(31, uint8(float32((v-lo)*id)+0.5)))
		}
		putQ5(o[4:8], o[8:24], &q)
	}
	return out
}

// QuantizeQ4_1 quantizes x (a multiple of 32 values) to Q4_1 blocks as
// ggml's quantize_row_q4_1_ref does: with lo and hi the block's least and
// greatest values, d = (hi − lo)/15, m = lo, q = min(15, trunc((x −
// lo)·(1/d) + 0.5)); d and m stored as binary16.
func QuantizeQ4_1(x []float32) []byte {
	out := make([]byte, len(x)/32*20)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		d, id, lo := minMaxScale(blk, 15)
		o := out[20*b : 20*b+20]
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		binary.LittleEndian.PutUint16(o[2:], F32ToF16(lo))
		for i := range 16 {
			x0 := min(15, int8(float32((blk[i]-lo)*id)+0.5))
			x1 := min(15, int8(float32((blk[16+i]-lo)*id)+0.5))
			o[4+i] = byte(x0) | byte(x1)<<4
		}
	}
	return out
}

// QuantizeIQ4NL quantizes x (a multiple of 32 values) to IQ4_NL blocks:
// with m the value of largest magnitude, the scale starts at d = m/−127
// (ggml's quantize_row_iq4_nl_impl's first step: m on the grid's end
// −127), each value takes the nearest grid point of x/d, and then d is
// refitted by least squares to those points (Σ x·k / Σ k²), the points
// chosen again, and the better of the two fits by squared error kept; d
// stored as binary16. Like QuantizeQ4K a plain quantizer, not ggml's
// weighted scale search (ntry = 7); the format is the same.
func QuantizeIQ4NL(x []float32) []byte {
	out := make([]byte, len(x)/32*18)
	for b := range len(x) / 32 {
		blk := x[32*b : 32*b+32]
		m := signedAbsMax(blk)
		o := out[18*b : 18*b+18]
		var idx [32]uint8
		d := float32(0)
		if m != 0 {
			d = m / -127
			best := iq4nlFit(blk, F16ToF32(F32ToF16(d)), &idx)
			var sxk, skk float64
			for i, v := range blk {
				k := float64(kvaluesIQ4NL[idx[i]])
				sxk += float64(v) * k
				skk += k * k
			}
			if skk > 0 {
				var idx2 [32]uint8
				d2 := float32(sxk / skk)
				if e := iq4nlFit(blk, F16ToF32(F32ToF16(d2)), &idx2); e < best {
					d, idx = d2, idx2
				}
			}
		}
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		for i := range 16 {
			o[2+i] = idx[i] | idx[16+i]<<4
		}
	}
	return out
}

// iq4nlFit sets idx to the grid points nearest to each x/d and returns the
// squared error of d·kvaluesIQ4NL[idx] against x.
func iq4nlFit(x []float32, d float32, idx *[32]uint8) float64 {
	var e float64
	for i, v := range x {
		var k uint8
		if d != 0 {
			t := v / d
			for j := 1; j < 16; j++ {
				if math.Abs(float64(t-float32(kvaluesIQ4NL[j]))) < math.Abs(float64(t-float32(kvaluesIQ4NL[k]))) {
					k = uint8(j)
				}
			}
		}
		idx[i] = k
		r := float64(v) - float64(d)*float64(kvaluesIQ4NL[k])
		e += r * r
	}
	return e
}

// minMaxScale returns the scale d = (hi − lo)/levels of a block with least
// value lo and greatest hi, its inverse (0 for d = 0) and lo, as ggml's
// quantize_row_q4_1_ref and quantize_row_q5_1_ref compute them.
func minMaxScale(blk []float32, levels float32) (d, id, lo float32) {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range blk {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	d = (hi - lo) / levels
	if d != 0 {
		id = 1 / d
	}
	return d, id, lo
}

// putQ5 stores 32 five-bit values (0–31) as a Q5 block's qh (bit k the
// fifth bit of element k) and qs (element i in the low nibble of byte i,
// element i+16 in its high nibble).
func putQ5(qh, qs []byte, q *[32]int32) {
	var h uint32
	for i := range 16 {
		qs[i] = byte(q[i]&15) | byte(q[i+16]&15)<<4
		h |= uint32(q[i]>>4&1)<<i | uint32(q[i+16]>>4&1)<<(i+16)
	}
	binary.LittleEndian.PutUint32(qh, h)
}

// # Activations for the integer dot products
//
// Before a linear layer with Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 weights, each token's input row
// is quantized per block of 32 as ggml's quantize_row_q8_0 does on x86
// (ggml-cpu/arch/x86/quants.c): amax = max|x|, d = amax/127, q =
// round-half-even(x · (127/amax)) (0 where amax is 0), and the scale used is
// d rounded to binary16 and widened. (The reference C code rounds half away
// from zero; the SIMD code pdserve's numbers are compared with rounds to
// even.) The quantization depends only on the token's own row.

// q8Block is one block of 32 quantized activations in the layout the
// assembly kernels read (96 bytes): the quants, their negated lane sums
// ls[j] = −(q[4j] + q[4j+1] + q[4j+2] + q[4j+3]), and the scale, 8 copies.
type q8Block struct {
	qs [32]int8
	ls [8]int32
	d8 [8]float32
}

// q8Acts holds T token rows of n values quantized for the 32-element
// block types' dot products: block b (of nb = n/32) of token t is blk[t·nb + b].
type q8Acts struct {
	n, nb int
	blk   []q8Block
}

// reset sizes a for T rows of n values (n a multiple of 32).
func (a *q8Acts) reset(T, n int) {
	a.n, a.nb = n, n/32
	if need := T * a.nb; cap(a.blk) < need {
		a.blk = make([]q8Block, need)
	}
	a.blk = a.blk[:T*a.nb]
}

// roundMagic is 1.5·2^23: for |x| < 2^22, x + roundMagic is x rounded to
// an integer (to nearest, ties to even) plus roundMagic, exactly.
const roundMagic = 12582912

// quantizeRows quantizes rows [t0, t1) of x ([T, n]) into a.
func (a *q8Acts) quantizeRows(x []float32, t0, t1 int) {
	n := a.n
	for t := t0; t < t1; t++ {
		row := x[t*n : (t+1)*n]
		for b := range a.nb {
			src := row[32*b : 32*b+32]
			var amax float32
			for _, v := range src {
				if a := math.Float32frombits(math.Float32bits(v) & 0x7fffffff); a > amax {
					amax = a
				}
			}
			blk := &a.blk[t*a.nb+b]
			var id float32
			if amax != 0 {
				id = 127 / amax
			}
			for i, v := range src {
				// |v·id| ≤ 127 < 2^22: adding 1.5·2^23 rounds it to an
				// integer, to nearest even, in float32.
				blk.qs[i] = int8(int32(v*id+roundMagic) - int32(roundMagic))
			}
			d := F16ToF32(F32ToF16(amax / 127))
			for j := range 8 {
				q := blk.qs[4*j : 4*j+4]
				blk.ls[j] = -(int32(q[0]) + int32(q[1]) + int32(q[2]) + int32(q[3]))
				blk.d8[j] = d
			}
		}
	}
}

// # The canonical quantized dot product
//
// dotQ(w, a_t) for a Q8_0, Q4_0, Q5_0 or IQ4_NL weight row w and a
// quantized activation row has one defined result, computed the same way
// by every implementation, and the same as ggml's ggml_vec_dot_q8_0_q8_0
// and ggml_vec_dot_q5_0_q8_0 (the x86
// AVX2/AVX-512 code, ggml-cpu/arch/x86/quants.c; also the order of its
// llamafile tinyBLAS kernels): for block b with weight integers w_i and
// scale dw_b, activation quants q_i and scale dx_b, the 8 lane sums
//
//	p_{b,j} = Σ_{i=4j}^{4j+3} w_i·q_i          (exact in int32)
//
// are accumulated into 8 float32 lanes starting at +0, block by block in
// order:
//
//	acc_j = fma(dw_b·dx_b, float32(p_{b,j}), acc_j)
//
// (dw_b·dx_b a float32 product, float32(p) exact), and the lanes are added
// as ggml's hsum_float_8: s4[i] = acc[i] + acc[i+4], s2[i] = s4[i] +
// s4[i+2], dot = s2[0] + s2[1].

// reduce8 adds 8 lanes in the order of ggml's hsum_float_8.
func reduce8(l *[8]float32) float32 {
	s0, s1, s2, s3 := l[0]+l[4], l[1]+l[5], l[2]+l[6], l[3]+l[7]
	return (s0 + s2) + (s1 + s3)
}

// For Q4_0 and Q5_0 the weight integers w_i are the block's quants less 8
// or 16, for IQ4_NL the grid values kvaluesIQ4NL[q_i], and the sums are
// those above. (ggml's x86 ggml_vec_dot_iq4_nl_q8_0 accumulates even and
// odd blocks in two sets of lanes and adds them before hsum_float_8; one
// set, as here, differs from it only in float rounding.) Q4_1 and Q5_1 (w = dw·q + m) take
// the unsigned quants for w_i, and each block adds its offset's share
// m_b·dx_b·Σ_{i=4j}^{4j+3} q_i to the same lanes, after the scale's step:
//
//	acc_j = fma(−(m_b·dx_b), float32(ls_j), acc_j)
//
// with ls_j = −Σ q_i the activations' negated lane sum (q8Block.ls) and
// m_b·dx_b a float32 product. (ggml's vec_dot_q4_1_q8_1 adds m_b times the
// activation block's binary16 d·Σq in a separate scalar sum instead; the
// lane form keeps it inside the kernels' vector arithmetic.)

// dotQ8Go is the canonical dot product of a Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
// or IQ4_NL row w (type t) with token row k of a (pure Go).
func dotQ8Go(t gguf.Type, w []byte, a *q8Acts, k int) float32 {
	var acc [8]float32
	var wi [32]int32
	bb := t.BlockBytes()
	for b := range a.nb {
		blk := w[bb*b : bb*b+bb]
		var dw, m float32
		switch t {
		case gguf.Q8_0:
			dw = f16At(blk, 0)
			for i := range 32 {
				wi[i] = int32(int8(blk[2+i]))
			}
		case gguf.Q4_0:
			dw = f16At(blk, 0)
			for i := range 16 {
				wi[i] = int32(blk[2+i]&15) - 8
				wi[16+i] = int32(blk[2+i]>>4) - 8
			}
		case gguf.IQ4_NL:
			dw = f16At(blk, 0)
			for i := range 16 {
				wi[i] = int32(kvaluesIQ4NL[blk[2+i]&15])
				wi[16+i] = int32(kvaluesIQ4NL[blk[2+i]>>4])
			}
		default: // Q4_1, Q5_0, Q5_1
			dw, m = q32Block(t, blk, &wi)
		}
		xb := &a.blk[k*a.nb+b]
		d := dw * xb.d8[0]
		x := &xb.qs
		for j := range 8 {
			p := wi[4*j]*int32(x[4*j]) + wi[4*j+1]*int32(x[4*j+1]) + wi[4*j+2]*int32(x[4*j+2]) + wi[4*j+3]*int32(x[4*j+3])
			acc[j] = fma32(d, float32(p), acc[j])
		}
		if hasMin(t) {
			md := m * xb.d8[0]
			for j := range 8 {
				acc[j] = fma32(-md, float32(xb.ls[j]), acc[j])
			}
		}
	}
	return reduce8(&acc)
}

// hasMin reports whether blocks of type t carry an offset m (w = d·q + m).
func hasMin(t gguf.Type) bool { return t == gguf.Q4_1 || t == gguf.Q5_1 }

// usesQ8 reports whether a weight of type t takes q8Acts activations.
func usesQ8(t gguf.Type) bool {
	switch t {
	case gguf.Q8_0, gguf.Q4_0, gguf.Q4_1, gguf.Q5_0, gguf.Q5_1, gguf.IQ4_NL:
		return true
	}
	return false
}

// qtileKinds are the weight types of the integer tile kernels, in the
// order of their kind argument (asmgen's qkinds).
var qtileKinds = [...]gguf.Type{gguf.Q8_0, gguf.Q4_0, gguf.Q5_0, gguf.Q5_1, gguf.Q4_1, gguf.IQ4_NL}

// qtileKind returns the kind argument of the integer tile kernels for
// weight type t.
func qtileKind(t gguf.Type) int {
	for i, k := range qtileKinds {
		if k == t {
			return i
		}
	}
	panic("llama: no integer tile kernel for " + t.String())
}

// quantJob quantizes the rows of x into a, a range of tokens per task.
type quantJob struct {
	a *q8Acts
	x []float32
}

func (j *quantJob) run(_, lo, hi int) { j.a.quantizeRows(j.x, lo, hi) }

// matRowsQ is matRows for a Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 matrix: dst[t·ds + r] =
// dotQ(W[r], a_t) for t < T and r0 ≤ r < r1 (r1 − r0 ≤ blockRows), on the
// integer tile kernels of ks if it has them, else in Go. Activations are
// taken in token blocks small enough for L1, streamed past each group of
// ks.qrows weight rows.
func matRowsQ(ks *kernelSet, sc *scratch, dst []float32, ds int, a *q8Acts, T int, w *tensor, r0, r1 int) {
	if ks == nil || ks.qisa == 0 {
		for r := r0; r < r1; r++ {
			row := w.q[r*w.rowBytes : (r+1)*w.rowBytes]
			for t := range T {
				dst[t*ds+r] = dotQ8Go(w.Quant, row, a, t)
			}
		}
		return
	}
	kind := qtileKind(w.Quant)
	R, V := ks.qrows, ks.qvecs
	tb := max(V, l1Budget/(a.nb*int(unsafe.Sizeof(q8Block{})))/V*V)
	args := qtileArgs{nb: uintptr(a.nb)}
	nrows := r1 - r0
	for t0 := 0; t0 < T; t0 += tb {
		t1 := min(t0+tb, T)
		for i := 0; i < nrows; i += R {
			nr := min(R, nrows-i)
			for k := range R {
				args.w[k] = unsafe.Pointer(&w.q[(r0+i+min(k, nr-1))*w.rowBytes])
			}
			args.pf = uintptr(unsafe.Pointer(unsafe.SliceData(w.q))) + uintptr((r0+i+R)*w.rowBytes) // may be past the rows: only prefetched
			for t := t0; t < t1; t += V {
				nv := min(V, t1-t)
				for j := range nv {
					args.x[j] = unsafe.Pointer(&a.blk[(t+j)*a.nb])
				}
				if nr == R {
					args.out, args.os = unsafe.Pointer(&dst[t*ds+r0+i]), uintptr(4*ds)
					ks.qtile(kind, nv, &args)
					continue
				}
				// Rows past the block were duplicates; keep the real ones.
				args.out, args.os = unsafe.Pointer(&sc.res[0]), uintptr(4*R)
				ks.qtile(kind, nv, &args)
				for j := range nv {
					o := (t+j)*ds + r0 + i
					copy(dst[o:o+nr], sc.res[j*R:j*R+nr])
				}
			}
		}
	}
}

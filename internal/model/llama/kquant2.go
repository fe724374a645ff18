package llama

import (
	"encoding/binary"
	"math"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// # Q5_K, Q3_K and Q2_K
//
// Their blocks (ggml-common.h block_q5_K, block_q3_K, block_q2_K; QK_K =
// 256 elements):
//
//	Q5_K (176 bytes): d, dmin f16, scales [12]uint8 (6-bit scale and min of
//	     8 sub-blocks of 32, packed as Q4_K's), qh [32]uint8, qs [128]uint8:
//	     w = d·sc_j·q − dmin·m_j, q = nibble | h<<4, the nibble of element
//	     l of sub-block j in qs[32⌊j/2⌋ + l] (low for even j, high for odd)
//	     and h bit j of qh[l]
//	Q3_K (110 bytes): hmask [32]uint8, qs [64]uint8, scales [12]uint8 (16
//	     6-bit scales), d f16: w = d·(s_k − 32)·q, q = q2 − 4·(1 − h) in
//	     −4…3, for element 128n + 32j + l: q2 bits 2j, 2j+1 of qs[32n + l],
//	     h bit 4n+j of hmask[l], k = 8n + 2j + ⌊l/16⌋
//	Q2_K (84 bytes): scales [16]uint8 (scale in the low nibble, min in the
//	     high one, per 16), qs [64]uint8, d, dmin f16: w = d·sc_k·q −
//	     dmin·m_k, q bits 2j, 2j+1 of qs[32n + l] for element 128n + 32j +
//	     l, k as for Q3_K
//
// Q3_K's 6-bit scales: s_k = (b_k & 15) | (b_{8+k} & 3)<<4 for k < 4,
// (b_k & 15) | (b_{4+k}>>2 & 3)<<4 for 4 ≤ k < 8, (b_{k−8} >> 4) |
// (b_k>>4 & 3)<<4 for 8 ≤ k < 12, (b_{k−8} >> 4) | (b_{k−4}>>6)<<4 for
// k ≥ 12, b the 12 scale bytes (ggml-quants.c dequantize_row_q3_K's
// kmask1/kmask2 shuffle).

// q3kScales returns the 16 scales of a Q3_K block's 12 scale bytes s,
// less 32 (−32…31).
func q3kScales(s []byte) (sc [16]int8) {
	for k := range 4 {
		sc[k] = int8(s[k]&15|(s[8+k]&3)<<4) - 32
		sc[4+k] = int8(s[4+k]&15|(s[8+k]>>2&3)<<4) - 32
		sc[8+k] = int8(s[k]>>4|(s[8+k]>>4&3)<<4) - 32
		sc[12+k] = int8(s[4+k]>>4|(s[8+k]>>6)<<4) - 32
	}
	return sc
}

// q5kQuants sets q to the 5-bit quants (0–31) of a Q5_K block.
func q5kQuants(blk []byte, q *[256]int8) {
	qh := blk[16:48]
	for j := range 8 {
		qs := blk[48+32*(j/2) : 48+32*(j/2)+32]
		sh := 4 * uint(j%2)
		for l := range 32 {
			q[32*j+l] = int8(qs[l]>>sh&15 | (qh[l]>>j&1)<<4)
		}
	}
}

// q3kQuants sets q to the quants (−4…3) of a Q3_K block.
func q3kQuants(blk []byte, q *[256]int8) {
	hm := blk[0:32]
	for n := range 2 {
		qs := blk[32+32*n : 64+32*n]
		for j := range 4 {
			for l := range 32 {
				v := int8(qs[l] >> (2 * j) & 3)
				if hm[l]>>(4*n+j)&1 == 0 {
					v -= 4
				}
				q[128*n+32*j+l] = v
			}
		}
	}
}

// q2kQuants sets q to the quants (0–3) of a Q2_K block.
func q2kQuants(blk []byte, q *[256]int8) {
	for n := range 2 {
		qs := blk[16+32*n : 48+32*n]
		for j := range 4 {
			for l := range 32 {
				q[128*n+32*j+l] = int8(qs[l] >> (2 * j) & 3)
			}
		}
	}
}

// dequantRowK2 is dequantRow for Q5_K, Q3_K and Q2_K: ggml-quants.c's
// dequantize_row_q5_K, dequantize_row_q3_K and dequantize_row_q2_K in
// float32 (the scale products d·sc and dmin·m first, then each value's
// product rounded before the min is subtracted, no fused multiply-add).
func dequantRowK2(t gguf.Type, src []byte, dst []float32) {
	var q [256]int8
	switch t {
	case gguf.Q5_K:
		for b := range len(dst) / 256 {
			blk := src[176*b : 176*b+176]
			d, dmin := f16At(blk, 0), f16At(blk, 2)
			y := dst[256*b : 256*b+256]
			q5kQuants(blk, &q)
			for j := range 8 {
				sc, m := q4kScaleMin(blk[4:16], j)
				d1, m1 := d*float32(sc), dmin*float32(m)
				for l := range 32 {
					y[32*j+l] = float32(d1*float32(q[32*j+l])) - m1
				}
			}
		}
	case gguf.Q3_K:
		for b := range len(dst) / 256 {
			blk := src[110*b : 110*b+110]
			d := f16At(blk, 108)
			sc := q3kScales(blk[96:108])
			y := dst[256*b : 256*b+256]
			q3kQuants(blk, &q)
			for i := range 256 {
				dl := d * float32(sc[i/16])
				y[i] = dl * float32(q[i])
			}
		}
	case gguf.Q2_K:
		for b := range len(dst) / 256 {
			blk := src[84*b : 84*b+84]
			d, dmin := f16At(blk, 80), f16At(blk, 82)
			y := dst[256*b : 256*b+256]
			q2kQuants(blk, &q)
			for i := range 256 {
				s := blk[i/16]
				dl, ml := d*float32(s&15), dmin*float32(s>>4)
				y[i] = float32(dl*float32(q[i])) - ml
			}
		}
	default:
		panic("llama: dequantize " + t.String())
	}
}

// # Their canonical dot products with Q8_K activations
//
// As Q4_K's and Q6_K's (kquant.go), after ggml's x86 AVX2
// ggml_vec_dot_q5_K_q8_K, ggml_vec_dot_q3_K_q8_K and
// ggml_vec_dot_q2_K_q8_K: per block of 256, 8 exact int32 lane sums, lane
// L holding the scaled sums of products of elements 4L … 4L+3 of each 32
// values, and 8 float32 lanes accumulating fma(d, float32(isum_L), acc_L),
// d the activation scale times the block's widened d; reduce8 at the end.
//
// Q5_K: exactly Q4_K's form with the 5-bit quants: isum_L = Σ_j sc_j ·
// Σ_{i<4} q·x over the 8 sub-blocks j of 32, and the mins in 4 more lanes
// accm_k = fma(−(dx·dmin), float32(m_{2k}·s_{2k} + m_{2k+1}·s_{2k+1}),
// accm_k), s_j the sum of sub-block j's activation quants, added last as
// (accm0 + accm2) + (accm1 + accm3).
//
// Q3_K: isum_L = Σ_c sc_{2c+⌊L/4⌋} · Σ_{i<4} q·x over the 8 chunks c of 32
// (q in −4…3, sc the scale less 32 of each 16), as Q6_K's.
//
// Q2_K: isum_L as Q3_K's with q in 0…3 and the 4-bit scales; its 16 mins
// go into the same 8 lanes first, acc_L = fma(−(dx·dmin),
// float32(m_{2L}·b_{2L} + m_{2L+1}·b_{2L+1}), acc_L) with b_k the sum of
// the k-th 16 activation quants, then acc_L = fma(dx·d, float32(isum_L),
// acc_L).

// isum8 adds to each lane L of isum the products of the 4 quants and
// activation quants 4L … 4L+3 of a chunk of 32 (q, x), times s0 for lanes
// 0–3 and s1 for lanes 4–7.
func isum8(isum *[8]int32, q, x []int8, s0, s1 int32) {
	for l := range 8 {
		q, x := q[4*l:4*l+4], x[4*l:4*l+4]
		p := int32(q[0])*int32(x[0]) + int32(q[1])*int32(x[1]) + int32(q[2])*int32(x[2]) + int32(q[3])*int32(x[3])
		if l < 4 {
			isum[l] += s0 * p
		} else {
			isum[l] += s1 * p
		}
	}
}

// dotQ5KGo is the canonical dot product of Q5_K row w with token row k of
// a.
func dotQ5KGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var q [256]int8
	var accm [4]float32
	for b := range a.nb {
		blk := w[176*b : 176*b+176]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 0)
		dmin := -x.d * f16At(blk, 2)
		var isum [8]int32
		var mn [8]int32
		q5kQuants(blk, &q)
		for j := range 8 {
			sc, m := q4kScaleMin(blk[4:16], j)
			mn[j] = int32(m)
			isum8(&isum, q[32*j:32*j+32], x.qs[32*j:32*j+32], int32(sc), int32(sc))
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
		addMins(&accm, dmin, &mn, &x.bsums)
	}
	return reduce8(&acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]))
}

// dotQ3KGo is the canonical dot product of Q3_K row w with token row k of
// a.
func dotQ3KGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var q [256]int8
	for b := range a.nb {
		blk := w[110*b : 110*b+110]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 108)
		sc := q3kScales(blk[96:108])
		var isum [8]int32
		q3kQuants(blk, &q)
		for c := range 8 {
			isum8(&isum, q[32*c:32*c+32], x.qs[32*c:32*c+32], int32(sc[2*c]), int32(sc[2*c+1]))
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
	}
	return reduce8(&acc)
}

// dotQ2KGo is the canonical dot product of Q2_K row w with token row k of
// a.
func dotQ2KGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var q [256]int8
	for b := range a.nb {
		blk := w[84*b : 84*b+84]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 80)
		dmin := -x.d * f16At(blk, 82)
		for l := range 8 {
			m0, m1 := int32(blk[2*l]>>4), int32(blk[2*l+1]>>4)
			acc[l] = fma32(dmin, float32(m0*x.bsums[2*l]+m1*x.bsums[2*l+1]), acc[l])
		}
		var isum [8]int32
		q2kQuants(blk, &q)
		for c := range 8 {
			isum8(&isum, q[32*c:32*c+32], x.qs[32*c:32*c+32], int32(blk[2*c]&15), int32(blk[2*c+1]&15))
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
	}
	return reduce8(&acc)
}

// # Reference quantizers
//
// They follow ggml-quants.c's quantize_row_q5_K_ref, quantize_row_q3_K_ref
// and quantize_row_q2_K_ref (the quantizers llama.cpp's llama-quantize uses
// without an importance matrix), in float32, with nearest as ggml's
// nearest_int (round half to even).

// nearestInt rounds v to the nearest integer, ties to even, as ggml's
// nearest_int (|v| < 2^22).
func nearestInt(v float32) int {
	return int(int32(math.Float32bits(v+roundMagic)&0x007fffff) - 0x00400000)
}

// fitMinScale fits x ≈ scale·L − min with L in 0…nmax, weights w: ggml's
// make_qkx2_quants (ggml-quants.c). It starts from the range (min ≤ 0),
// then tries nstep+1 scales (rmin + rdelta·is + nmax)/(max − min), each
// with a weighted least-squares scale and min for its quants, keeping the
// one of least weighted error (absolute with useMAD, else squared). It
// sets L and returns the scale and −min (≥ 0).
func fitMinScale(x, w []float32, nmax int, L []uint8, rmin, rdelta float32, nstep int, useMAD bool) (scale, negMin float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		lo, hi = min(lo, x[i]), max(hi, x[i])
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	lo = min(lo, 0)
	if hi == lo {
		for i := range L[:n] {
			L[i] = 0
		}
		return 0, -lo
	}
	errOf := func(s, m float32, q []uint8) float32 {
		var e float32
		for i, v := range x {
			diff := float32(s*float32(q[i])) + m - v
			if useMAD {
				diff = float32(math.Abs(float64(diff)))
			} else {
				diff = float32(diff * diff)
			}
			e += float32(w[i] * diff)
		}
		return e
	}
	fnmax := float32(nmax)
	iscale := fnmax / (hi - lo)
	scale = 1 / iscale
	for i, v := range x {
		L[i] = uint8(max(0, min(nmax, nearestInt(iscale*(v-lo)))))
	}
	best := errOf(scale, lo, L)
	var aux [32]uint8
	for is := 0; is <= nstep; is++ {
		iscale := (rmin + float32(rdelta*float32(is)) + fnmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := max(0, min(nmax, nearestInt(iscale*(v-lo))))
			aux[i] = uint8(l)
			fl := float32(l)
			sumL += float32(w[i] * fl)
			sumL2 += float32(float32(w[i]*fl) * fl)
			sumXL += float32(float32(w[i]*fl) * v)
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			s := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			m := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if m > 0 {
				m, s = 0, sumXL/sumL2
			}
			if e := errOf(s, m, aux[:n]); e < best {
				copy(L, aux[:n])
				best, scale, lo = e, s, m
			}
		}
	}
	return scale, -lo
}

// packScalesK stores 8 six-bit scales and mins as Q4_K's and Q5_K's 12
// scale bytes (ggml's get_scale_min_k4 reads them back: q4kScaleMin).
func packScalesK(s []byte, sc, mn *[8]uint8) {
	for j := range 4 {
		s[j] = sc[j] | (sc[j+4]>>4)<<6
		s[j+4] = mn[j] | (mn[j+4]>>4)<<6
		s[j+8] = sc[j+4]&15 | (mn[j+4]&15)<<4
	}
}

// QuantizeQ5K quantizes x (a multiple of 256 values) to Q5_K blocks as
// ggml-quants.c's quantize_row_q5_K_ref does: each sub-block of 32 gets a
// scale and min from fitMinScale (ggml's make_qkx2_quants: 31 levels,
// weights rms(sub-block) + |x|, 16 trial scales from −0.5 in steps of
// 0.1); the block's d and dmin are the largest scale and min over 63, the
// 6-bit scales and mins nearest(63·s/max) (at most 63); then each value is
// nearest((x + dmin·m)/(d·sc)) clamped to 0–31, with the binary16 d and
// dmin.
func QuantizeQ5K(x []float32) []byte {
	out := make([]byte, len(x)/256*176)
	var L [256]uint8
	var w [32]float32
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		blk := out[176*b : 176*b+176]
		var scales, mins [8]float32
		var maxScale, maxMin float32
		for j := range 8 {
			sub := src[32*j : 32*j+32]
			var sumX2 float32
			for _, v := range sub {
				sumX2 += float32(v * v)
			}
			av := float32(math.Sqrt(float64(sumX2 / 32)))
			for l, v := range sub {
				w[l] = av + float32(math.Abs(float64(v)))
			}
			scales[j], mins[j] = fitMinScale(sub, w[:], 31, L[32*j:32*j+32], -0.5, 0.1, 15, false)
			maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
		}
		var invScale, invMin float32
		if maxScale > 0 {
			invScale = 63 / maxScale
		}
		if maxMin > 0 {
			invMin = 63 / maxMin
		}
		var sc, mn [8]uint8
		for j := range 8 {
			sc[j] = uint8(min(63, uint8(nearestInt(invScale*scales[j]))))
			mn[j] = uint8(min(63, uint8(nearestInt(invMin*mins[j]))))
		}
		packScalesK(blk[4:16], &sc, &mn)
		binary.LittleEndian.PutUint16(blk[0:], F32ToF16(maxScale/63))
		binary.LittleEndian.PutUint16(blk[2:], F32ToF16(maxMin/63))
		d, dmin := f16At(blk, 0), f16At(blk, 2)
		for j := range 8 {
			dj := d * float32(sc[j])
			if dj == 0 {
				continue
			}
			dm := dmin * float32(mn[j])
			for i, v := range src[32*j : 32*j+32] {
				L[32*j+i] = uint8(max(0, min(31, nearestInt((v+dm)/dj))))
			}
		}
		qh, qs := blk[16:48], blk[48:176]
		for j := range 8 {
			for l := range 32 {
				q := L[32*j+l]
				if j%2 == 0 {
					qs[32*(j/2)+l] = q & 15
				} else {
					qs[32*(j/2)+l] |= (q & 15) << 4
				}
				qh[l] |= (q >> 4) << j
			}
		}
	}
	return out
}

// fitSymScale quantizes x to L in −nmax…nmax−1 as ggml's make_q3_quants
// with do_rmse: from the scale that puts the value of largest magnitude at
// −nmax, up to 5 passes move single quants where that raises Σwxl²/Σwl²
// (weights x²), and the scale returned is Σwxl/Σwl² (0 for an all-zero x).
func fitSymScale(x []float32, nmax int, L []int8) float32 {
	var amax, m float32
	for _, v := range x {
		if av := float32(math.Abs(float64(v))); av > amax {
			amax, m = av, v
		}
	}
	if amax < 1e-15 {
		for i := range L[:len(x)] {
			L[i] = 0
		}
		return 0
	}
	iscale := -float32(nmax) / m
	var sumLX, sumL2 float32
	for i, v := range x {
		l := max(-nmax, min(nmax-1, nearestInt(iscale*v)))
		L[i] = int8(l)
		w := v * v
		sumLX += float32(float32(w*v) * float32(l))
		sumL2 += float32(float32(w*float32(l)) * float32(l))
	}
	for range 5 {
		changed := 0
		for i, v := range x {
			w := v * v
			slx := sumLX - float32(float32(w*v)*float32(L[i]))
			if slx <= 0 {
				continue
			}
			sl2 := sumL2 - float32(float32(w*float32(L[i]))*float32(L[i]))
			nl := max(-nmax, min(nmax-1, nearestInt(float32(v*sl2)/slx)))
			if nl == int(L[i]) {
				continue
			}
			slx += float32(float32(w*v) * float32(nl))
			sl2 += float32(float32(w*float32(nl)) * float32(nl))
			if sl2 > 0 && float32(float32(slx*slx)*sumL2) > float32(float32(sumLX*sumLX)*sl2) {
				L[i], sumLX, sumL2 = int8(nl), slx, sl2
				changed++
			}
		}
		if changed == 0 {
			break
		}
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// QuantizeQ3K quantizes x (a multiple of 256 values) to Q3_K blocks as
// ggml-quants.c's quantize_row_q3_K_ref does: each 16 values get a scale
// from fitSymScale (ggml's make_q3_quants, 4 levels each side); with m the
// scale of largest magnitude, d = m/−32 and the 6-bit scales
// nearest(−32·s/m) clamped to −32…31 (stored +32); then each value is
// nearest(x/(d·sc)) clamped to −4…3, with the binary16 d.
func QuantizeQ3K(x []float32) []byte {
	out := make([]byte, len(x)/256*110)
	var L [256]int8
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		blk := out[110*b : 110*b+110]
		var scales [16]float32
		var amax, maxScale float32
		for j := range 16 {
			scales[j] = fitSymScale(src[16*j:16*j+16], 4, L[16*j:16*j+16])
			if a := float32(math.Abs(float64(scales[j]))); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		s := blk[96:108]
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := range 16 {
				l := uint8(max(-32, min(31, int(int8(nearestInt(iscale*scales[j]))))) + 32)
				if j < 8 {
					s[j] = l & 15
				} else {
					s[j-8] |= (l & 15) << 4
				}
				s[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			binary.LittleEndian.PutUint16(blk[108:], F32ToF16(1/iscale))
		}
		d := f16At(blk, 108)
		sc := q3kScales(s)
		var q [256]uint8 // the quants + 4, 0–7
		for j := range 16 {
			dj := d * float32(sc[j])
			for i := range 16 {
				if dj == 0 {
					q[16*j+i] = uint8(L[16*j+i] + 4) // ggml keeps make_q3_quants' quants here
					continue
				}
				q[16*j+i] = uint8(max(-4, min(3, nearestInt(src[16*j+i]/dj))) + 4)
			}
		}
		hm, qs := blk[0:32], blk[32:96]
		for e, v := range q {
			n, j, l := e/128, e%128/32, e%32
			if v > 3 {
				hm[l] |= 1 << (4*n + j)
				v -= 4
			}
			qs[32*n+l] |= v << (2 * j)
		}
	}
	return out
}

// QuantizeQ2K quantizes x (a multiple of 256 values) to Q2_K blocks as
// ggml-quants.c's quantize_row_q2_K_ref does: each 16 values get a scale
// and min from fitMinScale (ggml's make_qkx2_quants: 3 levels, weights |x|,
// 16 trial scales from −0.5 in steps of 0.1, absolute error); d and dmin
// are the largest scale and min over 15, the 4-bit scales and mins
// nearest(15·s/max); then each value is nearest((x + dmin·m)/(d·sc))
// clamped to 0–3, with the binary16 d and dmin.
func QuantizeQ2K(x []float32) []byte {
	out := make([]byte, len(x)/256*84)
	var L [256]uint8
	var w [16]float32
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		blk := out[84*b : 84*b+84]
		var scales, mins [16]float32
		var maxScale, maxMin float32
		for j := range 16 {
			sub := src[16*j : 16*j+16]
			for l, v := range sub {
				w[l] = float32(math.Abs(float64(v)))
			}
			scales[j], mins[j] = fitMinScale(sub, w[:], 3, L[16*j:16*j+16], -0.5, 0.1, 15, true)
			maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
		}
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range 16 {
				blk[j] = uint8(nearestInt(iscale * scales[j]))
			}
			binary.LittleEndian.PutUint16(blk[80:], F32ToF16(maxScale/15))
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range 16 {
				blk[j] |= uint8(nearestInt(iscale*mins[j])) << 4
			}
			binary.LittleEndian.PutUint16(blk[82:], F32ToF16(maxMin/15))
		}
		d, dmin := f16At(blk, 80), f16At(blk, 82)
		for j := range 16 {
			dj := d * float32(blk[j]&15)
			if dj == 0 {
				continue
			}
			dm := dmin * float32(blk[j]>>4)
			for i, v := range src[16*j : 16*j+16] {
				L[16*j+i] = uint8(max(0, min(3, nearestInt((v+dm)/dj))))
			}
		}
		qs := blk[16:80]
		for e, v := range L {
			n, j, l := e/128, e%128/32, e%32
			qs[32*n+l] |= v << (2 * j)
		}
	}
	return out
}

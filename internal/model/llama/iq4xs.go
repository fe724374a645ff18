package llama

import (
	"encoding/binary"
	"math"
)

// # IQ4_XS
//
// Its block (ggml-common.h block_iq4_xs; QK_K = 256 elements, 136 bytes):
// d f16, scales_h uint16, scales_l [4]uint8, qs [128]uint8. Sub-block j
// (of 8, 32 elements each) has the 6-bit scale ls_j = (scales_l[⌊j/2⌋] >>
// 4·(j mod 2)) & 15 | ((scales_h >> 2j) & 3) << 4 and its 16 bytes
// qs[16j … 16j+15] hold elements 0–15 in the low nibbles and 16–31 in the
// high ones, as IQ4_NL's: w = d·(ls_j − 32)·kvaluesIQ4NL[nibble]
// (ggml-quants.c dequantize_row_iq4_xs).
//
// Its canonical dot product with Q8_K activations is K-quant shaped
// (kquant.go), after ggml's x86 AVX2 ggml_vec_dot_iq4_xs_q8_K: per block
// of 256, isum_L = Σ_j (ls_j − 32) · Σ_{i<4} k·x over the 8 sub-blocks j
// (k the grid values, x the activation quants, elements 32j + 4L + i),
// exact in int32; then acc_L = fma(dx·d, float32(isum_L), acc_L) and
// reduce8 at the end.

// iq4xsScales returns the 8 sub-block scales of IQ4_XS block blk, less 32
// (−32…31).
func iq4xsScales(blk []byte) (sc [8]int32) {
	h := binary.LittleEndian.Uint16(blk[2:])
	for j := range 8 {
		l := blk[4+j/2] >> (4 * uint(j%2)) & 15
		sc[j] = int32(l|byte(h>>(2*j)&3)<<4) - 32
	}
	return sc
}

// iq4xsQuants sets q to the grid values (−127…113) of IQ4_XS block blk.
func iq4xsQuants(blk []byte, q *[256]int8) {
	for j := range 8 {
		qs := blk[8+16*j : 8+16*j+16]
		for i, b := range qs {
			q[32*j+i] = kvaluesIQ4NL[b&15]
			q[32*j+16+i] = kvaluesIQ4NL[b>>4]
		}
	}
}

// dequantRowIQ4XS is dequantRow for IQ4_XS: ggml-quants.c's
// dequantize_row_iq4_xs in float32 (dl = d·(ls − 32) first, then dl times
// the grid value).
func dequantRowIQ4XS(src []byte, dst []float32) {
	var q [256]int8
	for b := range len(dst) / 256 {
		blk := src[136*b : 136*b+136]
		d := f16At(blk, 0)
		sc := iq4xsScales(blk)
		iq4xsQuants(blk, &q)
		y := dst[256*b : 256*b+256]
		for j := range 8 {
			dl := d * float32(sc[j])
			for l := range 32 {
				y[32*j+l] = dl * float32(q[32*j+l])
			}
		}
	}
}

// dotIQ4XSGo is the canonical dot product of IQ4_XS row w with token row k
// of a.
func dotIQ4XSGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var q [256]int8
	for b := range a.nb {
		blk := w[136*b : 136*b+136]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 0)
		sc := iq4xsScales(blk)
		iq4xsQuants(blk, &q)
		var isum [8]int32
		for j := range 8 {
			isum8(&isum, q[32*j:32*j+32], x.qs[32*j:32*j+32], sc[j], sc[j])
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
	}
	return reduce8(&acc)
}

// iq4Index returns the index of the grid point of kvaluesIQ4NL nearest to
// v, the lower one on a tie, as ggml-quants.c's best_index_int8.
func iq4Index(v float32) uint8 {
	if v <= float32(kvaluesIQ4NL[0]) {
		return 0
	}
	if v >= float32(kvaluesIQ4NL[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if v < float32(kvaluesIQ4NL[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if v-float32(kvaluesIQ4NL[hi-1]) < float32(kvaluesIQ4NL[hi])-v {
		return uint8(hi - 1)
	}
	return uint8(hi)
}

// QuantizeIQ4XS quantizes x (a multiple of 256 values) to IQ4_XS blocks as
// ggml-quants.c's quantize_row_iq4_xs_ref does (quantize_row_iq4_nl_impl
// with super-blocks of 256, blocks of 32, ntry = 7 and no importance
// matrix), in float32: each sub-block of 32 with weights x² starts from
// the scale m/127 (m its value of largest magnitude), takes the
// least-squares scale Σwkx/Σwk² of its nearest grid points, and tries the
// 15 inverse scales (t − 127)/m, t = −7…7, keeping the least-squares scale
// of whichever maximizes (Σwkx)²/Σwk²; the block's d is −s/32 for the
// sub-block scale s of largest magnitude, each 6-bit scale nearest(s_j/d)
// clamped to −32…31 (stored +32), and each value the grid point nearest
// to x/(d·l_j) (float32 d, as ggml, not the stored binary16).
func QuantizeIQ4XS(x []float32) []byte {
	out := make([]byte, len(x)/256*136)
	var w [32]float32
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		blk := out[136*b : 136*b+136]
		var scales [8]float32
		var maxScale, amaxScale float32
		for j := range 8 {
			xb := src[32*j : 32*j+32]
			var amax, m float32
			for i, v := range xb {
				w[i] = v * v
				if av := float32(math.Abs(float64(v))); av > amax {
					amax, m = av, v
				}
			}
			if amax < 1e-15 {
				continue
			}
			fit := func(id float32) (sumQX, sumQ2 float32) {
				for i, v := range xb {
					q := float32(kvaluesIQ4NL[iq4Index(id*v)])
					sumQX += float32(float32(w[i]*q) * v)
					sumQ2 += float32(float32(w[i]*q) * q)
				}
				return sumQX, sumQ2
			}
			d := m / 127 // −m/kvalues[0]
			sqx, sq2 := fit(1 / d)
			d = sqx / sq2
			best := d * sqx
			for t := -7; t <= 7; t++ {
				sqx, sq2 := fit(float32(t-127) / m)
				if sq2 > 0 && float32(sqx*sqx) > float32(best*sq2) {
					d = sqx / sq2
					best = d * sqx
				}
			}
			scales[j] = d
			if a := float32(math.Abs(float64(d))); a > amaxScale {
				amaxScale, maxScale = a, d
			}
		}
		d := -maxScale / 32
		binary.LittleEndian.PutUint16(blk[0:], F32ToF16(d))
		var id float32
		if d != 0 {
			id = 1 / d
		}
		var sh uint16
		for j := range 8 {
			l := max(-32, min(31, nearestInt(id*scales[j])))
			dl := d * float32(l)
			var idl float32
			if dl != 0 {
				idl = 1 / dl
			}
			xb := src[32*j : 32*j+32]
			qs := blk[8+16*j : 8+16*j+16]
			for i := range 16 {
				qs[i] = iq4Index(idl*xb[i]) | iq4Index(idl*xb[16+i])<<4
			}
			u := uint8(l + 32)
			blk[4+j/2] |= (u & 15) << (4 * uint(j%2))
			sh |= uint16(u>>4) << (2 * j)
		}
		binary.LittleEndian.PutUint16(blk[2:], sh)
	}
	return out
}

package llama

import (
	"encoding/binary"
	"math"
	"unsafe"
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
// Its canonical dot product with Q8_K activations has the K-quants' shape
// (kquant.go) with a lane per sub-block: per block of 256, isum_L =
// (ls_j − 32) · Σ_{i<32} k_{32j+i}·x_{32j+i} for sub-block j =
// iq4xsLane[L] (k the grid values, x the activation quants), exact in
// int32; then acc_L = fma(dx·d, float32(isum_L), acc_L) and reduce8 at the
// end. A lane per sub-block lets the kernels apply the scales once per
// block and lane instead of once per sub-block: they take the activations
// in the order of q8KPerm, 4 values of each sub-block side by side, and
// the AVX-512 VNNI kernel multiplies the grid values plus 128 (unsigned)
// by them with one VPDPBUSD per 64 products, from a start of −128·Σx per
// sub-block.

// iq4xsLane gives the sub-block of each lane of the canonical IQ4_XS dot
// product: the order in which the AVX2 kernel's unpacking (two rounds of
// VPUNPCKL/HDQ and VPUNPCKL/HQDQ on the 4 registers of a block's nibbles)
// leaves them.
var iq4xsLane = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

// q8KPerm is a Q8_K activation block (q8KBlock) in the order of the IQ4_XS
// kernels: qs[32q + 4L + i] = x[32·iq4xsLane[L] + 4q + i] for q, L < 8 and
// i < 4 — 32 bytes per group q of 4 values, lane L of each group from the
// lane's sub-block, as the kernels unpack the weights. init holds the
// starting lane sums of the AVX-512 kernel: −128·s_j (s_j the sum of
// sub-block j's 32 quants, j = iq4xsLane[L]) in lanes 0–7, zero in 8–15;
// d is the block's scale. 384 bytes (asmgen's pbQS, pbInit, pbD, pbSize).
type q8KPerm struct {
	qs   [256]int8
	init [16]int32
	d    float32
	_    [60]byte
}

// set fills p from Q8_K block b.
func (p *q8KPerm) set(b *q8KBlock) {
	// Groups of 4 quants as uint32: group q of lane L's sub-block j.
	src := (*[64]uint32)(unsafe.Pointer(&b.qs))
	dst := (*[64]uint32)(unsafe.Pointer(&p.qs))
	for L, j := range iq4xsLane {
		for q := range 8 {
			dst[8*q+L] = src[8*j+q]
		}
		p.init[L] = -128 * (b.bsums[2*j] + b.bsums[2*j+1])
	}
	p.d = b.d
}

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
		for L, j := range iq4xsLane {
			var s int32
			for i, k := range q[32*j : 32*j+32] {
				s += int32(k) * int32(x.qs[32*j+i])
			}
			acc[L] = fma32(d, float32(sc[j]*s), acc[L])
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

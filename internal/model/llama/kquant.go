package llama

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// # K-quants
//
// K-quant weights (Q4_K and Q6_K: quant.go has their layouts; Q5_K, Q3_K
// and Q2_K: kquant2.go; and IQ4_XS, iq4xs.go) multiply activations
// quantized per block of 256 as ggml's quantize_row_q8_K_ref does (ggml's
// Q8_K, which its K-quant dot products take): with m the value of largest
// magnitude (the first, if several), iscale = −127/m, q =
// min(127, round-half-even(iscale·x)), the scale d = 1/iscale in float32,
// and the sums of each 16 quants. (A block of zeros has d = 0 and zero
// quants.)

// q8KBlock is one block of 256 activations quantized to Q8_K.
type q8KBlock struct {
	d     float32
	qs    [256]int8
	bsums [16]int32
	ssum  [8]int16 // sums of each 32 quants (bsums in pairs), for the kernels
}

// q8KActs holds T token rows of n values (a multiple of 256) quantized to
// Q8_K: block b (of nb = n/256) of token t is blk[t·nb + b], and, for IQ4_XS
// weights, the same block in the IQ4_XS kernels' order is pblk[t·nb + b]
// (pblk is empty otherwise).
type q8KActs struct {
	n, nb int
	blk   []q8KBlock
	pblk  []q8KPerm
}

// reset sizes a for T rows of n values, with the blocks in the IQ4_XS
// kernels' order too if perm.
func (a *q8KActs) reset(T, n int, perm bool) {
	a.n, a.nb = n, n/256
	need := T * a.nb
	if cap(a.blk) < need {
		a.blk = make([]q8KBlock, need)
	}
	a.blk = a.blk[:need]
	a.pblk = a.pblk[:0]
	if perm {
		if cap(a.pblk) < need {
			a.pblk = make([]q8KPerm, need)
		}
		a.pblk = a.pblk[:need]
	}
}

// rows returns a view of token rows [t0, t0+T) of a.
func (a *q8KActs) rows(t0, T int) q8KActs {
	v := q8KActs{n: a.n, nb: a.nb, blk: a.blk[t0*a.nb : (t0+T)*a.nb]}
	if len(a.pblk) > 0 {
		v.pblk = a.pblk[t0*a.nb : (t0+T)*a.nb]
	}
	return v
}

// quantizeRows quantizes rows [t0, t1) of x ([T, n]) into a.
func (a *q8KActs) quantizeRows(x []float32, t0, t1 int) {
	n := a.n
	for t := t0; t < t1; t++ {
		row := x[t*n : (t+1)*n]
		for b := range a.nb {
			src := row[256*b : 256*b+256]
			blk := &a.blk[t*a.nb+b]
			var amax, m float32
			for _, v := range src {
				if av := math.Float32frombits(math.Float32bits(v) & 0x7fffffff); av > amax {
					amax, m = av, v
				}
			}
			if amax == 0 {
				*blk = q8KBlock{}
				if len(a.pblk) > 0 {
					a.pblk[t*a.nb+b] = q8KPerm{}
				}
				continue
			}
			iscale := -127 / m
			for i, v := range src {
				blk.qs[i] = int8(min(127, int32(iscale*v+roundMagic)-int32(roundMagic)))
			}
			for j := range 16 {
				var s int32
				for _, q := range blk.qs[16*j : 16*j+16] {
					s += int32(q)
				}
				blk.bsums[j] = s
			}
			for j := range 8 {
				blk.ssum[j] = int16(blk.bsums[2*j] + blk.bsums[2*j+1])
			}
			blk.d = 1 / iscale
			if len(a.pblk) > 0 {
				a.pblk[t*a.nb+b].set(blk)
			}
		}
	}
}

// usesQ8K reports whether a weight of type t takes q8KActs activations.
func usesQ8K(t gguf.Type) bool {
	switch t {
	case gguf.Q4_K, gguf.Q6_K, gguf.Q5_K, gguf.Q3_K, gguf.Q2_K, gguf.IQ4_XS:
		return true
	}
	return false
}

// quantKJob quantizes the rows of x into a, a range of tokens per task.
type quantKJob struct {
	a *q8KActs
	x []float32
}

func (j *quantKJob) run(_, lo, hi int) { j.a.quantizeRows(j.x, lo, hi) }

// # The canonical K-quant dot products
//
// They are ggml's x86 AVX2 ggml_vec_dot_q4_K_q8_K and
// ggml_vec_dot_q6_K_q8_K (ggml-cpu/arch/x86/quants.c): per block of 256,
// 8 int32 lane sums, exact, lane L holding the scaled sums of products of
// elements 4L … 4L+3 of each 32 values; 8 float32 lanes accumulating
// fma(d, float32(isum_L), acc_L) block by block, d the activation scale
// times the block's widened scale; reduce8 at the end.
//
// Q4_K: isum_L = Σ_j sc_j · Σ_{i<4} q_{32j+4L+i}·x_{32j+4L+i} over its 8
// sub-blocks j (q the nibbles, sc_j the 6-bit scale); its mins go into 4
// more lanes, accm_k = fma(−(dx·dmin), float32(m_{2k}·s_{2k} +
// m_{2k+1}·s_{2k+1}), accm_k) with s_j the sum of sub-block j's activation
// quants, added last as (accm0 + accm2) + (accm1 + accm3).
//
// Q6_K: isum_L = Σ_c sc_{2c+⌊L/4⌋} · Σ_{i<4} (q_{32c+4L+i} − 32)·x_{32c+4L+i}
// over the 8 chunks c of 32 values (q the 6-bit quants, sc the int8 scale of
// each 16).

// dotQ4KGo is the canonical dot product of Q4_K row w with token row k of
// a.
func dotQ4KGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var accm [4]float32
	for b := range a.nb {
		blk := w[144*b : 144*b+144]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 0)
		dmin := -x.d * f16At(blk, 2)
		var isum [8]int32
		var mn [8]int32
		for jj := range 4 {
			sl, ml := q4kScaleMin(blk[4:16], 2*jj)
			sh, mh := q4kScaleMin(blk[4:16], 2*jj+1)
			mn[2*jj], mn[2*jj+1] = int32(ml), int32(mh)
			qs := blk[16+32*jj : 16+32*jj+32]
			xl := x.qs[64*jj : 64*jj+32]
			xh := x.qs[64*jj+32 : 64*jj+64]
			for l := range 8 {
				q, lo, hi := qs[4*l:4*l+4], xl[4*l:4*l+4], xh[4*l:4*l+4]
				pl := int32(q[0]&15)*int32(lo[0]) + int32(q[1]&15)*int32(lo[1]) + int32(q[2]&15)*int32(lo[2]) + int32(q[3]&15)*int32(lo[3])
				ph := int32(q[0]>>4)*int32(hi[0]) + int32(q[1]>>4)*int32(hi[1]) + int32(q[2]>>4)*int32(hi[2]) + int32(q[3]>>4)*int32(hi[3])
				isum[l] += int32(sl)*pl + int32(sh)*ph
			}
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
		addMins(&accm, dmin, &mn, &x.bsums)
	}
	return reduce8(&acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]))
}

// addMins adds a Q4_K or Q5_K block's min term, dmin · Σ_j m_j · (sum of
// the activation quants of sub-block j), to accm in the canonical order:
// lane kk takes sub-blocks 2kk and 2kk+1 (bsums are per 16 quants).
func addMins(accm *[4]float32, dmin float32, mn *[8]int32, bsums *[16]int32) {
	for kk := range 4 {
		s0 := bsums[4*kk] + bsums[4*kk+1]
		s1 := bsums[4*kk+2] + bsums[4*kk+3]
		accm[kk] = fma32(dmin, float32(mn[2*kk]*s0+mn[2*kk+1]*s1), accm[kk])
	}
}

// dotQ6KGo is the canonical dot product of Q6_K row w with token row k of
// a.
func dotQ6KGo(w []byte, a *q8KActs, k int) float32 {
	var acc [8]float32
	var v [4][32]int32 // one half's four quarters of 32 quants, minus 32
	for b := range a.nb {
		blk := w[210*b : 210*b+210]
		x := &a.blk[k*a.nb+b]
		d := x.d * f16At(blk, 208)
		var isum [8]int32
		for h := range 2 {
			ql := blk[64*h : 64*h+64]
			qh := blk[128+32*h : 128+32*h+32]
			for l := range 32 {
				hb := qh[l]
				v[0][l] = int32(ql[l]&15|(hb&3)<<4) - 32
				v[1][l] = int32(ql[l+32]&15|(hb>>2&3)<<4) - 32
				v[2][l] = int32(ql[l]>>4|(hb>>4&3)<<4) - 32
				v[3][l] = int32(ql[l+32]>>4|(hb>>6&3)<<4) - 32
			}
			for q := range 4 {
				xs := x.qs[128*h+32*q : 128*h+32*q+32]
				sc := blk[192+8*h+2*q : 192+8*h+2*q+2]
				vq := &v[q]
				for l := range 8 {
					p := vq[4*l]*int32(xs[4*l]) + vq[4*l+1]*int32(xs[4*l+1]) + vq[4*l+2]*int32(xs[4*l+2]) + vq[4*l+3]*int32(xs[4*l+3])
					isum[l] += int32(int8(sc[l/4])) * p
				}
			}
		}
		for l := range 8 {
			acc[l] = fma32(d, float32(isum[l]), acc[l])
		}
	}
	return reduce8(&acc)
}

// ktileKinds are the weight types of the K-quant kernels, in the order of
// their kind argument (asmgen's ktile dispatch).
var ktileKinds = [...]gguf.Type{gguf.Q4_K, gguf.Q6_K, gguf.Q5_K, gguf.Q3_K, gguf.Q2_K, gguf.IQ4_XS}

// dotKGo returns the canonical pure-Go dot product of K-quant type t.
func dotKGo(t gguf.Type) func([]byte, *q8KActs, int) float32 {
	switch t {
	case gguf.Q4_K:
		return dotQ4KGo
	case gguf.Q6_K:
		return dotQ6KGo
	case gguf.Q5_K:
		return dotQ5KGo
	case gguf.Q3_K:
		return dotQ3KGo
	case gguf.Q2_K:
		return dotQ2KGo
	case gguf.IQ4_XS:
		return dotIQ4XSGo
	}
	panic("llama: no K-quant dot product for " + t.String())
}

// matRowsK is matRows for a Q4_K, Q6_K, Q5_K, Q3_K, Q2_K or IQ4_XS matrix: on the
// K-quant kernels of ks if it has them (one weight row by up to ks.kvecs
// tokens per call, ks.kvecsIQ4XS for IQ4_XS), else in Go.
func matRowsK(ks *kernelSet, dst []float32, ds int, a *q8KActs, T int, w *tensor, r0, r1 int) {
	if ks != nil && ks.kisa != 0 {
		kind := -1
		for i, k := range ktileKinds {
			if k == w.Quant {
				kind = i
			}
		}
		args := ktileArgs{nb: uintptr(a.nb), os: uintptr(4 * ds)}
		kvecs, blkBytes := ks.kvecs, int(unsafe.Sizeof(q8KBlock{}))
		if w.Quant == gguf.IQ4_XS {
			kvecs, blkBytes = ks.kvecsIQ4XS, int(unsafe.Sizeof(q8KPerm{}))
		}
		// Token blocks whose activations stay in L1 while the rows pass
		// over them (a long prompt's would not: every row would read them
		// all from L2 or beyond).
		tb := max(kvecs, l1Budget/(a.nb*blkBytes)/kvecs*kvecs)
		for t0 := 0; t0 < T; t0 += tb {
			t1 := min(t0+tb, T)
			for r := r0; r < r1; r++ {
				args.w = unsafe.Pointer(&w.q[r*w.rowBytes])
				for t := t0; t < t1; t += kvecs {
					nv := min(kvecs, t1-t)
					for j := range nv {
						if w.Quant == gguf.IQ4_XS {
							args.x[j] = unsafe.Pointer(&a.pblk[(t+j)*a.nb])
						} else {
							args.x[j] = unsafe.Pointer(&a.blk[(t+j)*a.nb])
						}
					}
					args.out = unsafe.Pointer(&dst[t*ds+r])
					ks.ktile(kind, nv, &args)
				}
			}
		}
		return
	}
	dot := dotKGo(w.Quant)
	for r := r0; r < r1; r++ {
		row := w.q[r*w.rowBytes : (r+1)*w.rowBytes]
		for t := range T {
			dst[t*ds+r] = dot(row, a, t)
		}
	}
}

// QuantizeQ4K quantizes x (a multiple of 256 values) to Q4_K blocks: each
// sub-block of 32 gets the scale and min of its range, (max − min)/15 and
// −min (min ≤ 0), and the block's d and dmin are the largest of those over
// 63, so the 6-bit scales and mins are round(scale/d) and round(min/dmin);
// the nibbles are round((x + m)/s) with the stored s = d·sc and m =
// dmin·mn, clamped to 0–15. This is a plain range quantizer, not ggml's
// searched scales (make_qkx2_quants), so its error is somewhat larger; the
// format is the same.
func QuantizeQ4K(x []float32) []byte {
	out := make([]byte, len(x)/256*144)
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		var scales, mins [8]float32
		var maxScale, maxMin float32
		for j := range 8 {
			sub := src[32*j : 32*j+32]
			lo, hi := sub[0], sub[0]
			for _, v := range sub {
				lo, hi = min(lo, v), max(hi, v)
			}
			lo = min(lo, 0)
			scales[j], mins[j] = (hi-lo)/15, -lo
			maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
		}
		blk := out[144*b : 144*b+144]
		d, dmin := maxScale/63, maxMin/63
		binary.LittleEndian.PutUint16(blk[0:], F32ToF16(d))
		binary.LittleEndian.PutUint16(blk[2:], F32ToF16(dmin))
		d, dmin = F16ToF32(F32ToF16(d)), F16ToF32(F32ToF16(dmin))
		var sc, mn [8]uint8
		for j := range 8 {
			if d > 0 {
				sc[j] = uint8(min(63, math.Round(float64(scales[j]/d))))
			}
			if dmin > 0 {
				mn[j] = uint8(min(63, math.Round(float64(mins[j]/dmin))))
			}
		}
		s := blk[4:16]
		for j := range 4 {
			s[j] = sc[j] | (sc[j+4]>>4)<<6
			s[j+4] = mn[j] | (mn[j+4]>>4)<<6
			s[j+8] = sc[j+4]&15 | (mn[j+4]&15)<<4
		}
		for j := range 8 {
			step, off := d*float32(sc[j]), dmin*float32(mn[j])
			qs := blk[16+32*(j/2) : 16+32*(j/2)+32]
			for i, v := range src[32*j : 32*j+32] {
				var q int
				if step > 0 {
					q = int(min(15, max(0, math.Round(float64((v+off)/step)))))
				}
				if j%2 == 0 {
					qs[i] = qs[i]&0xf0 | uint8(q)
				} else {
					qs[i] = qs[i]&0x0f | uint8(q)<<4
				}
			}
		}
	}
	return out
}

// QuantizeQ6K quantizes x (a multiple of 256 values) to Q6_K blocks: each
// 16 values get the scale max|x|/32 (signed as the value of largest
// magnitude, as ggml's make_qx_quants starts), stored as an int8 multiple
// of the block's d = (largest scale magnitude)/127; the quants are
// round(x/(d·sc)) + 32 clamped to 0–63. Like QuantizeQ4K a plain range
// quantizer, not ggml's searched scales.
func QuantizeQ6K(x []float32) []byte {
	out := make([]byte, len(x)/256*210)
	for b := range len(x) / 256 {
		src := x[256*b : 256*b+256]
		var scales [16]float32
		var maxAbs float32
		for j := range 16 {
			var amax, m float32
			for _, v := range src[16*j : 16*j+16] {
				if av := float32(math.Abs(float64(v))); av > amax {
					amax, m = av, v
				}
			}
			scales[j] = m / -32
			maxAbs = max(maxAbs, float32(math.Abs(float64(scales[j]))))
		}
		blk := out[210*b : 210*b+210]
		d := maxAbs / 127
		binary.LittleEndian.PutUint16(blk[208:], F32ToF16(d))
		d = F16ToF32(F32ToF16(d))
		for j := range 16 {
			var sc int8
			if d > 0 {
				sc = int8(max(-128, min(127, math.Round(float64(scales[j]/d)))))
			}
			blk[192+j] = byte(sc)
			step := d * float32(sc)
			for i := range 16 {
				e := 16*j + i
				q := 32
				if step != 0 {
					q = int(min(63, max(0, math.Round(float64(src[e]/step))+32)))
				}
				h, r := e/128, e%128
				quarter, l := r/32, r%32
				ql := blk[64*h:]
				qh := blk[128+32*h:]
				lo, hi := byte(q&15), byte(q>>4)
				switch quarter {
				case 0:
					ql[l] = ql[l]&0xf0 | lo
				case 1:
					ql[l+32] = ql[l+32]&0xf0 | lo
				case 2:
					ql[l] = ql[l]&0x0f | lo<<4
				default:
					ql[l+32] = ql[l+32]&0x0f | lo<<4
				}
				qh[l] = qh[l]&^(3<<(2*quarter)) | hi<<(2*quarter)
			}
		}
	}
	return out
}

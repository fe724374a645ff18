// Command asmgen writes the amd64 assembly kernels of package llama
// (simd_amd64.s) and their Go declarations (simd_amd64_gen.go). It is run by
// hand, through go generate in package llama, when a kernel changes; the
// build only needs its output, which is committed.
//
// Every kernel computes exactly the canonical operations of simd.go (see
// "Canonical kernels" there): 16 partial sums per dot product, lane j
// accumulating the elements i ≡ j (mod 16) in order with fused
// multiply-adds, then the fixed tree s8[i] = l[i]+l[i+8], s4[i] =
// s8[i]+s8[i+4], s2[i] = s4[i]+s4[i+2], s = s2[0]+s2[1]; and weighted sums
// of rows as one fused multiply-add chain per output element, row by row.
// So the AVX-512, AVX2 and pure-Go paths give the same bits.
//
// Usage (from internal/model/llama):
//
//	go run ./asmgen -s simd_amd64.s -go simd_amd64_gen.go
package main

import (
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"strings"
)

// Argument block layouts, shared with simd.go (tileArgs, pvArgs, expArgs,
// siluArgs); the offsets are checked by TestArgLayout.
const (
	tileW   = 0   // [4]pointer: weight rows
	tileX   = 32  // [6]pointer: activation vectors
	tileN   = 80  // elements per dot product, a positive multiple of 16
	tileOut = 88  // results: vector v's rows at out + v·os, consecutive float32
	tileOS  = 96  // bytes between vectors' results
	tilePF  = 104 // the rows after the tile's (prefetched while it runs)

	pvV   = 0  // first row
	pvVS  = 8  // bytes between rows
	pvN   = 16 // rows, > 0
	pvP   = 24 // weights: head h's weight of row j at p + h·ps + 4j (float32)
	pvPS  = 32 // bytes between heads' weights
	pvOut = 40 // accumulators, read and written: head h's at out + h·os
	pvOS  = 48 // bytes between heads' accumulators
	pvCol = 56 // masked kernels: columns (1–16) of the one chunk
)

// qtileArgs layout (simd.go): the dot products of 4 quantized weight
// rows with up to 4 rows of quantized activations (q8Block arrays).
const (
	qtW   = 0  // [4]pointer: weight rows (block 0)
	qtX   = 32 // [4]pointer: activation rows
	qtNB  = 64 // blocks per row, > 0
	qtOut = 72 // results: token v's rows at out + v·os, consecutive float32
	qtOS  = 80 // bytes between tokens' results
	qtPF  = 88 // the rows after the call's (prefetched in decode)
)

// q8Block layout: quants, negated lane sums, scale ×8.
const (
	qbQS    = 0
	qbLS    = 32
	qbD8    = 64
	qbBytes = 96
)

// qkind is a quantized weight format of the integer tile kernels, with
// its block layout (ggml-common.h block_q8_0, block_q4_0, block_q5_0,
// block_q5_1, block_q4_1: d at offset 0).
type qkind struct {
	name       string // Go-side suffix: Q8 (Q8_0), Q4 (Q4_0), Q50, Q51, Q41
	typ        string // the ggml type
	blockBytes int    // bytes per block of 32 weights
	shift      int    // lane correction: init = ls << shift = −2^shift·Σx (0: none)
	qs         int    // offset of the quants (Q8_0) or nibbles
	qh         int    // offset of the 32 fifth bits, −1 for none
	m          int    // offset of the binary16 offset m (w = d·q + m), −1 for none
	lut        bool   // the nibbles index IQ4_NL's grid (iq4nlTable)
}

var (
	q8_0  = qkind{"Q8", "Q8_0", 34, 7, 2, -1, -1, false}
	q4_0  = qkind{"Q4", "Q4_0", 18, 3, 2, -1, -1, false}
	q5_0  = qkind{"Q50", "Q5_0", 22, 4, 6, 2, -1, false}
	q5_1  = qkind{"Q51", "Q5_1", 24, 0, 8, 4, 2, false}
	q4_1  = qkind{"Q41", "Q4_1", 20, 0, 4, -1, 2, false}
	iq4nl = qkind{"IQ4NL", "IQ4_NL", 18, 7, 2, -1, -1, true}
	// qkinds in the order of the kernels' kind argument (quant.go's
	// qtileKinds).
	qkinds = []qkind{q8_0, q4_0, q5_0, q5_1, q4_1, iq4nl}
)

// qtile512 writes an AVX-512 (VL, BW, VNNI) integer tile kernel: 4 weight
// rows × V activation rows in the canonical order of dotQ8Go (quant.go).
// Each zmm register holds two (row, activation row) pairs, rows 2p and
// 2p+1 in its low and high 256 bits, so every instruction works on two
// weight rows' blocks of 32 while each half keeps the 8 lanes of its own
// dot product. Per block, the 8 lane sums p_j come from VPDPBUSD of the
// weights as unsigned bytes (Q8_0: w+128; IQ4_NL: its grid value + 128,
// looked up with VPSHUFB; the others: the nibbles, with the fifth bits of
// Q5_0 and Q5_1 added as 16 under a byte mask from qh)
// with the signed activations (broadcast to both halves), starting from
// the lane correction −2^shift·Σx (ls << shift; zero for Q4_1 and Q5_1,
// whose quants are unsigned), so they are the exact Σ w·q; then acc_j =
// fma(dw·dx, float(p_j), acc_j), and for Q4_1 and Q5_1 acc_j =
// fma(−(m·dx), float(ls_j), acc_j); each half's 8 lanes are added as
// reduce8.
func (g *gen) qtile512(k qkind, V int) {
	const R, P = 4, 2 // rows, row pairs
	name := fmt.Sprintf("qtile%sAVX512V%d", k.name, V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, %d %s rows × %d quantized activation rows", R, k.typ, V))
	g.op("MOVQ a+0(FP), AX")
	for r := range R {
		g.op("MOVQ %d(AX), %s", qtW+8*r, wGPR[r])
	}
	for v := range V {
		g.op("MOVQ %d(AX), %s", qtX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", qtNB)
	pf := V <= prefetchMaxV
	if pf {
		g.op("MOVQ %d(AX), R15", qtPF)
	}
	g.op("XORQ R13, R13") // weight byte offset
	g.op("XORQ R14, R14") // activation byte offset
	// Registers: acc Z0–Z7 (pair p, token v: Z(v·P+p)); per token v the
	// quants Z(8+v), lane correction (or, with an offset m, the lane sums
	// ls as floats) Z(12+v) and scale Z(16+v); the weight pair Z20–Z21,
	// their scales Z22–Z23; Z24–Z25 products, Z26–Z27 scale products;
	// Z28–Z29 the pairs' offsets m; Z30 the bytes 16 (Q5) or the IQ4_NL
	// grid; Z31 the byte constant.
	acc := func(p, v int) string { return fmt.Sprintf("Z%d", v*P+p) }
	for v := range V {
		for p := range P {
			g.op("VPXORD %s, %s, %s", acc(p, v), acc(p, v), acc(p, v))
		}
	}
	if k == q8_0 {
		g.op("MOVL $0x80808080, AX")
	} else {
		if k.qh >= 0 {
			g.op("MOVL $0x10101010, AX")
			g.op("VPBROADCASTD AX, Z30")
		}
		if k.lut {
			g.op("VBROADCASTI32X4 iq4nlTable<>+32(SB), Z30") // the grid + 128
		}
		g.op("MOVL $0x0f0f0f0f, AX")
		// K3: the words of 128-bit lanes 1 and 3 (the high nibbles).
		g.op("MOVL $0xff00ff00, DX")
		g.op("KMOVD DX, K3")
		// K2: the dwords of the high 256 bits.
		g.op("MOVL $0xff00, DX")
		g.op("KMOVW DX, K2")
	}
	g.op("VPBROADCASTD AX, Z31")
	// K1: the high 8 words of a ymm register (the second row's scale).
	g.op("MOVL $0xff00, DX")
	g.op("KMOVW DX, K1")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		// The next R rows are contiguous from R15: prefetch the R blocks'
		// worth of them that this iteration's blocks stand for (as
		// qtileAVX2 does).
		for off := 0; off < R*k.blockBytes; off += 64 {
			g.op("PREFETCHT0 %d(R15)(R13*%d)", off, R)
		}
	}
	for v := range V {
		g.op("VBROADCASTI64X4 %d(%s)(R14*1), Z%d", qbQS, xGPR[v], 8+v)
		switch {
		case k.shift > 0:
			g.op("VBROADCASTI64X4 %d(%s)(R14*1), Z%d", qbLS, xGPR[v], 12+v)
			g.op("VPSLLD $%d, Z%d, Z%d", k.shift, 12+v, 12+v)
		case k.m >= 0:
			g.op("VBROADCASTI64X4 %d(%s)(R14*1), Z%d", qbLS, xGPR[v], 12+v)
			g.op("VCVTDQ2PS Z%d, Z%d", 12+v, 12+v)
		}
		g.op("VBROADCASTSS %d(%s)(R14*1), Z%d", qbD8, xGPR[v], 16+v)
	}
	for p := range P {
		r0, r1 := wGPR[2*p], wGPR[2*p+1]
		u, dw := fmt.Sprintf("Z%d", 20+p), fmt.Sprintf("Z%d", 22+p)
		if k == q8_0 {
			g.op("VMOVDQU64 %d(%s)(R13*1), Y%s", k.qs, r0, u[1:])
			g.op("VINSERTI64X4 $1, %d(%s)(R13*1), %s, %s", k.qs, r1, u, u)
			g.op("VPXORD Z31, %s, %s", u, u)
		} else {
			// [row 2p, row 2p, row 2p+1, row 2p+1] in 128-bit lanes, the
			// second copy of each shifted to its high nibbles: byte i of
			// each half is element i.
			g.op("VBROADCASTI32X4 %d(%s)(R13*1), %s", k.qs, r0, u)
			g.op("VBROADCASTI32X4 %d(%s)(R13*1), K2, %s", k.qs, r1, u)
			g.op("VPSRLW $4, %s, K3, %s", u, u)
			g.op("VPANDD Z31, %s, %s", u, u)
		}
		if k.lut {
			g.op("VPSHUFB %s, Z30, %s", u, u)
		}
		if k.qh >= 0 {
			// K4: bit i of row 2p's qh and bit 32+i of row 2p+1's, one per
			// byte of u; add 16 under it.
			g.op("MOVL %d(%s)(R13*1), AX", k.qh, r0)
			g.op("MOVL %d(%s)(R13*1), DX", k.qh, r1)
			g.op("SHLQ $32, DX")
			g.op("ORQ DX, AX")
			g.op("KMOVQ AX, K4")
			g.op("VPADDB Z30, %s, K4, %s", u, u)
		}
		g.op("VPBROADCASTW (%s)(R13*1), Y%s", r0, dw[1:])
		g.op("VPBROADCASTW (%s)(R13*1), K1, Y%s", r1, dw[1:])
		g.op("VCVTPH2PS Y%s, %s", dw[1:], dw)
		mm := fmt.Sprintf("Z%d", 28+p)
		if k.m >= 0 {
			g.op("VPBROADCASTW %d(%s)(R13*1), Y%s", k.m, r0, mm[1:])
			g.op("VPBROADCASTW %d(%s)(R13*1), K1, Y%s", k.m, r1, mm[1:])
			g.op("VCVTPH2PS Y%s, %s", mm[1:], mm)
		}
		for v := range V {
			t, m := fmt.Sprintf("Z%d", 24+v%2), fmt.Sprintf("Z%d", 26+v%2)
			if k.shift > 0 {
				g.op("VMOVDQA32 Z%d, %s", 12+v, t)
			} else {
				g.op("VPXORD %s, %s, %s", t, t, t)
			}
			g.op("VPDPBUSD Z%d, %s, %s", 8+v, u, t)
			g.op("VCVTDQ2PS %s, %s", t, t)
			g.op("VMULPS Z%d, %s, %s", 16+v, dw, m)
			g.op("VFMADD231PS %s, %s, %s", m, t, acc(p, v))
			if k.m >= 0 {
				g.op("VMULPS Z%d, %s, %s", 16+v, mm, m)
				g.op("VFNMADD231PS Z%d, %s, %s", 12+v, m, acc(p, v))
			}
		}
	}
	g.op("ADDQ $%d, R13", k.blockBytes)
	g.op("ADDQ $%d, R14", qbBytes)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	// Each half as reduce8: s4[i] = l[i] + l[i+4] (128-bit lanes swapped
	// in pairs), s2[i] = s4[i] + s4[i+2] (64-bit halves swapped), s =
	// s2[0] + s2[1]; the results are lanes 0 and 8.
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), DI", qtOut)
	g.op("MOVQ %d(AX), SI", qtOS)
	for v := range V {
		for p := range P {
			z := acc(p, v)
			g.op("VSHUFF32X4 $0xb1, %s, %s, Z30", z, z)
			g.op("VADDPS Z30, %s, %s", z, z)
			g.op("VPERMILPS $0x4e, %s, Z30", z)
			g.op("VADDPS Z30, %s, %s", z, z)
			g.op("VMOVSHDUP %s, Z30", z)
			g.op("VADDPS Z30, %s, %s", z, z)
			g.op("VMOVSS X%s, %d(DI)", z[1:], 8*p)
			g.op("VEXTRACTF32X4 $2, %s, X30", z)
			g.op("VMOVSS X30, %d(DI)", 8*p+4)
		}
		g.op("ADDQ SI, DI")
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// qtileStore reduces the accumulators (reduce8 order) and stores the
// results: token v's R rows at out + v·os.
func (g *gen) qtileStore(R, V int, acc func(r, v int) string, tmp string) {
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), DI", qtOut)
	g.op("MOVQ %d(AX), SI", qtOS)
	for v := range V {
		for r := range R {
			y := acc(r, v)
			x := "X" + y[1:]
			if tmp == "X15" {
				g.op("VEXTRACTF128 $1, %s, X15", y)
			} else {
				g.op("VEXTRACTF32X4 $1, %s, %s", y, tmp)
			}
			g.op("VADDPS %s, %s, %s", tmp, x, x) // s4[i] = l[i] + l[i+4]
			g.op("VMOVHLPS %s, %s, %s", x, x, tmp)
			g.op("VADDPS %s, %s, %s", tmp, x, x) // s2[i] = s4[i] + s4[i+2]
			g.op("VMOVSHDUP %s, %s", x, tmp)
			g.op("VADDSS %s, %s, %s", tmp, x, x) // s2[0] + s2[1]
			g.op("VMOVSS %s, %d(DI)", x, 4*r)
		}
		g.op("ADDQ SI, DI")
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// qtileAVX2 writes the AVX2 integer tile kernel: 2 weight rows × V
// activation rows, one block at a time, the same canonical result as
// qtile512; for V ≤ prefetchMaxV (decode) it prefetches the next two rows
// as it goes. Q8_0 and IQ4_NL (its grid values looked up with VPSHUFB)
// take ggml's sign trick (|w| as unsigned bytes times x with w's sign,
// VPMADDUBSW then VPMADDWD with ones; no pair of products exceeds
// 2·128·127 < 2^15, so nothing saturates); the other types
// multiply their unsigned quants (at most 31: pairs below 2·31·127) with x
// and add the lane correction −2^shift·Σx (Q4_0, Q5_0) or, for an offset
// m (Q4_1, Q5_1), the term −(m·dx)·ls. Q5's fifth bits are spread to
// bytes as ggml's bytes_from_bits_32 does (a byte shuffle, a bit test per
// byte). The weight scale is widened with F16C (which every AVX2 CPU has).
func (g *gen) qtileAVX2(k qkind, V int) {
	const R = 2
	name := fmt.Sprintf("qtile%sAVX2V%d", k.name, V)
	g.text(name, fmt.Sprintf("AVX2, %d %s rows × %d quantized activation rows", R, k.typ, V))
	g.op("MOVQ a+0(FP), AX")
	for r := range R {
		g.op("MOVQ %d(AX), %s", qtW+8*r, wGPR[r])
	}
	for v := range V {
		g.op("MOVQ %d(AX), %s", qtX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", qtNB)
	pf := V <= prefetchMaxV
	if pf {
		g.op("MOVQ %d(AX), DX", qtPF)
	}
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
	acc := func(r, v int) string { return fmt.Sprintf("Y%d", v*R+r) }
	for v := range V {
		for r := range R {
			g.op("VXORPS %s, %s, %s", acc(r, v), acc(r, v), acc(r, v))
		}
	}
	g.op("MOVL $0x00010001, AX")
	g.op("VMOVD AX, X14")
	g.op("VPBROADCASTD X14, Y14") // int16 ones
	if k != q8_0 {
		g.op("MOVL $0x0f0f0f0f, AX")
		g.op("VMOVD AX, X15")
		g.op("VPBROADCASTD X15, Y15")
	}
	loop := name + "_loop"
	g.label(loop)
	if pf {
		// The next R rows are contiguous from DX: prefetch the R blocks'
		// worth of them that this iteration's R blocks stand for, so they
		// are in cache when the next call starts (a prefetch never
		// faults, so DX may point past the matrix).
		for off := 0; off < R*k.blockBytes; off += 64 {
			g.op("PREFETCHT0 %d(DX)(R13*%d)", off, R)
		}
	}
	// Per token: Q8_0 the quants (Y10+v); Q4_0 and Q5_0 the lane
	// correction, Q4_1 and Q5_1 the lane sums as floats (Y10+v).
	for v := range V {
		switch {
		case k == q8_0 || k.lut:
			g.op("VMOVDQU %d(%s)(R14*1), Y%d", qbQS, xGPR[v], 10+v)
		case k.shift > 0:
			g.op("VMOVDQU %d(%s)(R14*1), Y%d", qbLS, xGPR[v], 10+v)
			g.op("VPSLLD $%d, Y%d, Y%d", k.shift, 10+v, 10+v)
		default:
			g.op("VCVTDQ2PS %d(%s)(R14*1), Y%d", qbLS, xGPR[v], 10+v)
		}
	}
	for r := range R {
		// Row r: weights Y(4+r), |w| (Q8_0, IQ4_NL) or the offset m Y(6+r),
		// scale Y(8+r).
		w, abs, dw := fmt.Sprintf("Y%d", 4+r), fmt.Sprintf("Y%d", 6+r), fmt.Sprintf("Y%d", 8+r)
		if k == q8_0 {
			g.op("VMOVDQU %d(%s)(R13*1), %s", k.qs, wGPR[r], w)
			g.op("VPSIGNB %s, %s, %s", w, w, abs)
		} else {
			x := "X" + w[1:]
			g.op("VMOVDQU %d(%s)(R13*1), %s", k.qs, wGPR[r], x)
			g.op("VPSRLW $4, %s, X12", x)
			g.op("VINSERTI128 $1, X12, %s, %s", w, w)
			g.op("VPAND Y15, %s, %s", w, w)
		}
		if k.lut {
			g.op("VMOVDQU iq4nlTable<>+0(SB), Y13") // the grid, in both lanes
			g.op("VPSHUFB %s, Y13, %s", w, w)
			g.op("VPSIGNB %s, %s, %s", w, w, abs)
		}
		if k.qh >= 0 {
			g.op("VPBROADCASTD %d(%s)(R13*1), Y13", k.qh, wGPR[r])
			g.op("VPSHUFB q5Bits<>+0(SB), Y13, Y13") // byte i ← byte i/8 of qh
			g.op("VPAND q5Bits<>+32(SB), Y13, Y13")  // its bit i%8
			g.op("VPCMPEQB q5Bits<>+32(SB), Y13, Y13")
			g.op("VPAND q5Bits<>+64(SB), Y13, Y13") // 16 where set
			g.op("VPOR Y13, %s, %s", w, w)
		}
		if k.m >= 0 {
			g.op("VPBROADCASTW %d(%s)(R13*1), X%s", k.m, wGPR[r], abs[1:])
			g.op("VCVTPH2PS X%s, %s", abs[1:], abs)
		}
		g.op("VPBROADCASTW (%s)(R13*1), X%s", wGPR[r], dw[1:])
		g.op("VCVTPH2PS X%s, %s", dw[1:], dw)
		for v := range V {
			if k == q8_0 || k.lut {
				g.op("VPSIGNB %s, Y%d, Y12", w, 10+v)
				g.op("VPMADDUBSW Y12, %s, Y12", abs)
				g.op("VPMADDWD Y14, Y12, Y12")
			} else {
				g.op("VPMADDUBSW %d(%s)(R14*1), %s, Y12", qbQS, xGPR[v], w)
				g.op("VPMADDWD Y14, Y12, Y12")
				if k.shift > 0 {
					g.op("VPADDD Y%d, Y12, Y12", 10+v)
				}
			}
			g.op("VCVTDQ2PS Y12, Y12")
			g.op("VMULPS %d(%s)(R14*1), %s, Y13", qbD8, xGPR[v], dw)
			g.op("VFMADD231PS Y13, Y12, %s", acc(r, v))
			if k.m >= 0 {
				g.op("VMULPS %d(%s)(R14*1), %s, Y13", qbD8, xGPR[v], abs)
				g.op("VFNMADD231PS Y%d, Y13, %s", 10+v, acc(r, v))
			}
		}
	}
	g.op("ADDQ $%d, R13", k.blockBytes)
	g.op("ADDQ $%d, R14", qbBytes)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	g.qtileStore(R, V, acc, "X15")
}

// iq4nlTable writes iq4nlTable: IQ4_NL's grid (ggml-common.h
// kvalues_iq4nl) as int8 twice (a ymm register's two lanes, for the AVX2
// kernels), then plus 128 as uint8 (for VPDPBUSD).
func (g *gen) iq4nlTable() {
	grid := []int{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	for i := range 32 {
		fmt.Fprintf(&g.s, "DATA iq4nlTable<>+%d(SB)/1, $%d\n", i, uint8(int8(grid[i%16])))
	}
	for i := range 16 {
		fmt.Fprintf(&g.s, "DATA iq4nlTable<>+%d(SB)/1, $%d\n", 32+i, grid[i]+128)
	}
	fmt.Fprintf(&g.s, "GLOBL iq4nlTable<>(SB), RODATA|NOPTR, $48\n")
}

// q5BitsTable writes q5Bits, the constants of the AVX2 kernels' spreading
// of a Q5 block's 32 fifth bits to bytes: a VPSHUFB mask giving byte i the
// qh byte i/8 (of the dword broadcast to every lane), the bit 1 << (i%8)
// that byte i tests, and 16 in every byte.
func (g *gen) q5BitsTable() {
	for i := range 32 {
		fmt.Fprintf(&g.s, "DATA q5Bits<>+%d(SB)/1, $%d\n", i, i/8)
	}
	for i := range 32 {
		fmt.Fprintf(&g.s, "DATA q5Bits<>+%d(SB)/1, $%d\n", 32+i, 1<<(i%8))
	}
	for i := range 32 {
		fmt.Fprintf(&g.s, "DATA q5Bits<>+%d(SB)/1, $16\n", 64+i)
	}
	fmt.Fprintf(&g.s, "GLOBL q5Bits<>(SB), RODATA|NOPTR, $96\n")
}

// ktileArgs layout (simd.go) and q8KBlock offsets (kquant.go).
const (
	ktW    = 0
	ktX    = 8  // [8]pointer
	ktNB   = 72 // blocks of 256
	ktOut  = 80
	ktOS   = 88
	ktScr  = 96 // [16]byte: sc0…sc7, m0…m7 of the current block
	kbD    = 0
	kbQS   = 4
	kbSSum = 324 // [8]int16
	kbSize = 340
)

// ktile512 writes the AVX-512 VNNI Q4_K kernel (Q5_K with q5): one weight
// row × V Q8_K activation rows, in the canonical order of dotQ4KGo
// (dotQ5KGo). Per block of 256 it unpacks the 6-bit scales and mins as
// ggml's utmp code does; per 32 values the 8 lane sums come from
// VPMADDUBSW (quants × activation quants, pairs in int16: at most
// 2·31·127) and VPDPWSSD with the scale as int16 pairs, which adds
// sc·(4 products) to each int32 lane, exactly; then acc = fma(dx·d,
// float(isum), acc) and, for the mins, accm = fma(−(dx·dmin), float(m·s
// pairs), accm) through VPMADDWD and VFNMADD231PS. Q5_K's fifth bits
// (bit j of qh[l] for sub-block j) are shifted to bit 4 and merged into
// the nibbles with VPTERNLOGD.
func (g *gen) ktile512(V int, q5 bool) {
	kb := kBlock(q5)
	name := fmt.Sprintf("ktile%sAVX512V%d", kb.name, V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one %s row × %d Q8_K activation rows", kb.typ, V))
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", ktW)
	for v := range V {
		g.op("MOVQ %d(AX), %s", ktX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", ktNB)
	pf := V <= prefetchMaxV
	if pf {
		g.ktilePrefetchSetup(kb.bytes)
	}
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y3
	isum := func(v int) string { return fmt.Sprintf("Y%d", 4+v) } // Y4–Y7
	accm := func(v int) string { return fmt.Sprintf("X%d", 8+v) } // X8–X11
	// isum2: the odd pairs of sub-blocks' lane sums, added to isum at the
	// block's end (exact in int32), so that a block's eight VPDPWSSD form
	// two chains of four rather than one of eight.
	isum2 := func(v int) string { return fmt.Sprintf("Y%d", 26+v) } // Y26–Y29
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
		g.op("VXORPS %s, %s, %s", accm(v), accm(v), accm(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VPBROADCASTD R9, Y31")
	if q5 {
		g.op("MOVL $0x10101010, R9")
		g.op("VPBROADCASTD R9, Y22")
	}
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(kb.bytes)
	}
	g.ktileScalesVec()
	g.op("VPBROADCASTW (R8)(R13*1), X13")
	g.op("VCVTPH2PS X13, Y13") // d
	g.op("VPBROADCASTW 2(R8)(R13*1), X14")
	g.op("VCVTPH2PS X14, X14") // dmin
	if q5 {
		g.op("VMOVDQU64 16(R8)(R13*1), Y24") // qh
	}
	for v := range V {
		g.op("VPXORD %s, %s, %s", isum(v), isum(v), isum(v))
		g.op("VPXORD %s, %s, %s", isum2(v), isum2(v), isum2(v))
	}
	for jj := range 4 {
		is := isum
		if jj%2 == 1 {
			is = isum2
		}
		g.op("VMOVDQU64 %d(R8)(R13*1), Y16", kb.qs+32*jj)
		g.op("VPSRLW $4, Y16, Y17")
		g.op("VPANDD Y31, Y16, Y16") // sub-block 2jj
		g.op("VPANDD Y31, Y17, Y17") // sub-block 2jj+1
		if q5 {
			for h, y := range []string{"Y16", "Y17"} {
				b := g.shiftBit("Y24", "Y23", 2*jj+h, 4)
				g.op("VPTERNLOGD $0xf8, Y22, %s, %s", b, y) // y |= bit & 0x10
			}
		}
		g.op("VPSHUFB ktShuf<>+%d(SB), Y30, Y18", 64*jj) // sc(2jj) as int16 pairs
		g.op("VPSHUFB ktShuf<>+%d(SB), Y30, Y19", 64*jj+32)
		for v := range V {
			g.op("VPMADDUBSW %d(%s)(R14*1), Y16, Y20", kbQS+64*jj, xGPR[v])
			g.op("VPDPWSSD Y20, Y18, %s", is(v))
			g.op("VPMADDUBSW %d(%s)(R14*1), Y17, Y21", kbQS+64*jj+32, xGPR[v])
			g.op("VPDPWSSD Y21, Y19, %s", is(v))
		}
	}
	for v := range V {
		g.op("VPADDD %s, %s, %s", isum2(v), isum(v), isum(v))
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y15", kbD, xGPR[v])
		g.op("VMULPS Y13, Y15, Y23") // dx·d
		g.op("VFMADD231PS Y23, %s, %s", isum(v), acc(v))
		g.op("VPMADDWD %d(%s)(R14*1), X12, X24", kbSSum, xGPR[v])
		g.op("VCVTDQ2PS X24, X24")
		g.op("VMULPS X14, X15, X25") // dx·dmin
		g.op("VFNMADD231PS X25, X24, %s", accm(v))
	}
	g.op("ADDQ $%d, R13", kb.bytes)
	g.op("ADDQ $%d, R14", kbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, accm)
}

// ktile6512 writes the AVX-512 VNNI Q6_K kernel: one weight row × V Q8_K
// activation rows, in the canonical order of dotQ6KGo. Per quarter of 32
// values the 6-bit quants q are assembled from ql and qh, VPMADDUBSW gives
// q·x and 32·x in int16 pairs (at most 2·63·127), their difference is the
// exact (q−32)·x pair sum, and VPDPWSSD with the int8 scales of the two
// halves (as int16) adds sc·(4 products) to each int32 lane.
func (g *gen) ktile6512(V int) {
	name := fmt.Sprintf("ktileQ6KAVX512V%d", V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one Q6_K row × %d Q8_K activation rows", V))
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", ktW)
	for v := range V {
		g.op("MOVQ %d(AX), %s", ktX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", ktNB)
	pf := V <= prefetchMaxV
	if pf {
		g.ktilePrefetchSetup(210)
	}
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	isum := func(v int) string { return fmt.Sprintf("Y%d", 4+v) }
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VPBROADCASTD R9, Y31")
	g.op("MOVL $0x03030303, R9")
	g.op("VPBROADCASTD R9, Y30")
	g.op("MOVL $0x20202020, R9")
	g.op("VPBROADCASTD R9, Y29")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(210)
	}
	g.op("VPBROADCASTW 208(R8)(R13*1), X13")
	g.op("VCVTPH2PS X13, Y13") // d
	// The 16 int8 scales as int16: 0–7 in both 128-bit lanes of Y14, 8–15
	// in both lanes of Y15, for VPSHUFB with q6Shuf.
	g.op("VPMOVSXBW 192(R8)(R13*1), Y12")
	g.op("VPERMQ $0x44, Y12, Y14")
	g.op("VPERMQ $0xee, Y12, Y15")
	for v := range V {
		g.op("VPXORD %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for h := range 2 {
		g.op("VMOVDQU64 %d(R8)(R13*1), Y16", 64*h)     // ql, quarters 0 and 2
		g.op("VMOVDQU64 %d(R8)(R13*1), Y17", 64*h+32)  // ql, quarters 1 and 3
		g.op("VMOVDQU64 %d(R8)(R13*1), Y18", 128+32*h) // qh
		for q := range 4 {
			lo := []string{"Y16", "Y17", "Y16", "Y17"}[q]
			// Y19 = low 4 bits, Y20 = high 2 bits << 4.
			if q < 2 {
				g.op("VPANDD Y31, %s, Y19", lo)
			} else {
				g.op("VPSRLW $4, %s, Y19", lo)
				g.op("VPANDD Y31, Y19, Y19")
			}
			if q == 0 {
				g.op("VPANDD Y30, Y18, Y20")
			} else {
				g.op("VPSRLW $%d, Y18, Y20", 2*q)
				g.op("VPANDD Y30, Y20, Y20")
			}
			g.op("VPSLLW $4, Y20, Y20")
			g.op("VPORD Y20, Y19, Y19") // q, 0–63
			// Scales 8h+2q (lanes 0–3) and 8h+2q+1 (lanes 4–7) as int16 pairs.
			g.op("VPSHUFB q6Shuf<>+%d(SB), %s, Y21", 32*q, []string{"Y14", "Y15"}[h])
			for v := range V {
				off := kbQS + 128*h + 32*q
				g.op("VPMADDUBSW %d(%s)(R14*1), Y19, Y23", off, xGPR[v])
				g.op("VPMADDUBSW %d(%s)(R14*1), Y29, Y24", off, xGPR[v])
				g.op("VPSUBW Y24, Y23, Y23")
				g.op("VPDPWSSD Y23, Y21, %s", isum(v))
			}
		}
	}
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y25", kbD, xGPR[v])
		g.op("VMULPS Y13, Y25, Y26")
		g.op("VFMADD231PS Y26, %s, %s", isum(v), acc(v))
	}
	g.op("ADDQ $210, R13")
	g.op("ADDQ $%d, R14", kbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	g.ktileStore(V, acc, nil)
}

// ktileScales unpacks the 6-bit scales and mins of the Q4_K block at
// (R8)(R13*1) as ggml's utmp code does, in general registers (R9–R11, R15),
// into the argument block's scratch (AX): sc0…sc7, then m0…m7.
func (g *gen) ktileScales() {
	// u0, u1, u2 = scale bytes 0–3, 4–7, 8–11.
	g.op("MOVL 4(R8)(R13*1), R9")   // u0
	g.op("MOVL 8(R8)(R13*1), R10")  // u1
	g.op("MOVL 12(R8)(R13*1), R11") // u2
	// t0 = u0 & 0x3f3f3f3f
	g.op("MOVL R9, R15")
	g.op("ANDL $0x3f3f3f3f, R15")
	g.op("MOVL R15, %d(AX)", ktScr)
	// t1 = (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4
	g.op("MOVL R11, R15")
	g.op("ANDL $0x0f0f0f0f, R15")
	g.op("SHRL $6, R9")
	g.op("ANDL $0x03030303, R9")
	g.op("SHLL $4, R9")
	g.op("ORL R9, R15")
	g.op("MOVL R15, %d(AX)", ktScr+4)
	// t2 = u1 & 0x3f3f3f3f
	g.op("MOVL R10, R15")
	g.op("ANDL $0x3f3f3f3f, R15")
	g.op("MOVL R15, %d(AX)", ktScr+8)
	// t3 = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4
	g.op("SHRL $4, R11")
	g.op("ANDL $0x0f0f0f0f, R11")
	g.op("SHRL $6, R10")
	g.op("ANDL $0x03030303, R10")
	g.op("SHLL $4, R10")
	g.op("ORL R10, R11")
	g.op("MOVL R11, %d(AX)", ktScr+12)
}

// ktileScalesVec unpacks the 6-bit scales and mins of the Q4_K block at
// (R8)(R13*1) as ktileScales does, but into vector registers, with no
// store and reload (an 8-byte load of two 4-byte stores cannot be
// forwarded from the store buffer and waits for them): X12 the mins
// m0…m7 as int16, Y30 the scales sc0…sc7 as int16 in both 128-bit lanes
// (for VPSHUFB with ktShuf). It uses R9–R11, R15, AX and Y15.
func (g *gen) ktileScalesVec() {
	g.op("MOVL 4(R8)(R13*1), R9")   // u0
	g.op("MOVL 8(R8)(R13*1), R10")  // u1
	g.op("MOVL 12(R8)(R13*1), R11") // u2
	// R15 = t0 | t1<<32, R11 = t2 | t3<<32 (ggml's utmp words).
	g.ktileScalePair("R9", "R15", "MOVL R11, R15")
	g.op("VMOVQ R15, X15")
	g.ktileScalePair("R10", "R11", "SHRL $4, R11")
	g.op("VPINSRQ $1, R11, X15, X15")
	g.op("VPMOVZXBW X15, Y15")        // sc0…sc7, m0…m7 as int16
	g.op("VEXTRACTI128 $1, Y15, X12") // mins
	g.op("VPERMQ $0x44, Y15, Y30")    // scales, in both lanes
}

// ktileScalePair sets dst to two of ggml's utmp words of a Q4_K block,
// lo | hi<<32: lo = u & 0x3f3f3f3f (scales 0–3 from u0, or mins 0–3 from
// u1) and hi = (h & 0x0f0f0f0f) | ((u >> 6) & 0x03030303) << 4 (scales or
// mins 4–7), where prep moves h — u2, or u2 >> 4 — into dst. It uses AX.
func (g *gen) ktileScalePair(u, dst, prep string) {
	g.op("MOVL %s, AX", u)
	g.op("SHRL $6, AX")
	g.op("ANDL $0x03030303, AX")
	g.op("SHLL $4, AX")
	g.op(prep)
	g.op("ANDL $0x0f0f0f0f, %s", dst)
	g.op("ORL AX, %s", dst)
	g.op("SHLQ $32, %s", dst)
	g.op("ANDL $0x3f3f3f3f, %s", u)
	g.op("ORQ %s, %s", u, dst)
}

// ktShufTable writes ktShuf: for each sub-block j of a Q4_K block, a
// VPSHUFB mask that copies int16 word j of a 128-bit lane to all its words.
func (g *gen) ktShufTable() {
	for j := range 8 {
		for k := range 8 {
			fmt.Fprintf(&g.s, "DATA ktShuf<>+%d(SB)/4, $%#08x\n", 32*j+4*k, (2*j+1)<<24|(2*j)<<16|(2*j+1)<<8|2*j)
		}
	}
	fmt.Fprintf(&g.s, "GLOBL ktShuf<>(SB), RODATA|NOPTR, $256\n")
}

// q6ShufTable writes q6Shuf: for each quarter q of a Q6_K half, a VPSHUFB
// mask that copies int16 word 2q of the low 128-bit lane to all its words
// and word 2q+1 of the high lane to all of its.
func (g *gen) q6ShufTable() {
	for q := range 4 {
		for k := range 8 {
			w := 2*q + k/4
			fmt.Fprintf(&g.s, "DATA q6Shuf<>+%d(SB)/4, $%#08x\n", 32*q+4*k, (2*w+1)<<24|(2*w)<<16|(2*w+1)<<8|2*w)
		}
	}
	fmt.Fprintf(&g.s, "GLOBL q6Shuf<>(SB), RODATA|NOPTR, $128\n")
}

// ktilePrefetchSetup points DX at the weight row after this call's (rows
// are contiguous: R8 + blocks·blockBytes), for ktilePrefetch.
func (g *gen) ktilePrefetchSetup(blockBytes int) {
	g.op("MOVQ R12, DX")
	g.op("IMULQ $%d, DX", blockBytes)
	g.op("ADDQ R8, DX")
}

// ktilePrefetch prefetches the block of the next row at the offset of the
// current one (R13), so the next call finds its row in cache (a prefetch
// never faults, so DX may point past the matrix).
func (g *gen) ktilePrefetch(blockBytes int) {
	for off := 0; off < blockBytes; off += 64 {
		g.op("PREFETCHT0 %d(DX)(R13*1)", off)
	}
}

// ktileAVX2 writes the AVX2 Q4_K kernel (Q5_K with q5): one weight row ×
// V (≤ 2) Q8_K activation rows, the canonical result of dotQ4KGo
// (dotQ5KGo) as ktile512 computes it, in ggml's AVX2 order
// (ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q5_K_q8_K): per 32 values
// VPMADDUBSW (quants × activation quants, int16 pairs of at most
// 2·31·128) and VPMADDWD with the 6-bit scale as int16, which gives sc·(4
// products) per int32 lane exactly, added into the block's lane sums with
// VPADDD; the mins as in ktile512. AVX2 has 16 vector registers, hence V
// ≤ 2. It prefetches the next row as it goes.
func (g *gen) ktileAVX2(V int, q5 bool) {
	kb := kBlock(q5)
	name := fmt.Sprintf("ktile%sAVX2V%d", kb.name, V)
	g.text(name, fmt.Sprintf("AVX2, one %s row × %d Q8_K activation rows", kb.typ, V))
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", ktW)
	for v := range V {
		g.op("MOVQ %d(AX), %s", ktX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", ktNB)
	g.ktilePrefetchSetup(kb.bytes)
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y1
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) } // Y2–Y3
	accm := func(v int) string { return fmt.Sprintf("X%d", 4+v) } // X4–X5
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
		g.op("VXORPS %s, %s, %s", accm(v), accm(v), accm(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VMOVD R9, X6")
	g.op("VPBROADCASTD X6, Y6")
	loop := name + "_loop"
	g.label(loop)
	g.ktilePrefetch(kb.bytes)
	g.ktileScales()
	g.op("VPMOVZXBW %d(AX), X9", ktScr+8) // mins as int16
	g.op("VPBROADCASTW (R8)(R13*1), X7")
	g.op("VCVTPH2PS X7, Y7") // d
	g.op("VPBROADCASTW 2(R8)(R13*1), X8")
	g.op("VCVTPH2PS X8, X8") // dmin
	if q5 {
		g.op("VMOVDQU 16(R8)(R13*1), Y14") // qh
	}
	for v := range V {
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for jj := range 4 {
		g.op("VMOVDQU %d(R8)(R13*1), Y10", kb.qs+32*jj)
		g.op("VPSRLW $4, Y10, Y11")
		g.op("VPAND Y6, Y10, Y10") // sub-block 2jj
		g.op("VPAND Y6, Y11, Y11") // sub-block 2jj+1
		for h, wq := range []string{"Y10", "Y11"} {
			if q5 {
				b := g.shiftBit("Y14", "Y15", 2*jj+h, 4)
				g.op("VPAND q5Bits<>+64(SB), %s, Y15", b) // 16 in every byte
				g.op("VPOR Y15, %s, %s", wq, wq)
			}
			g.op("MOVBLZX %d(AX), R9", ktScr+2*jj+h)
			g.op("VMOVD R9, X12")
			g.op("VPBROADCASTW X12, Y12")
			for v := range V {
				g.op("VPMADDUBSW %d(%s)(R14*1), %s, Y13", kbQS+64*jj+32*h, xGPR[v], wq)
				g.op("VPMADDWD Y12, Y13, Y13")
				g.op("VPADDD Y13, %s, %s", isum(v), isum(v))
			}
		}
	}
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", kbD, xGPR[v])
		g.op("VMULPS Y7, Y14, Y15") // dx·d
		g.op("VFMADD231PS Y15, %s, %s", isum(v), acc(v))
		g.op("VPMADDWD %d(%s)(R14*1), X9, X13", kbSSum, xGPR[v])
		g.op("VCVTDQ2PS X13, X13")
		g.op("VMULPS X8, X14, X15") // dx·dmin
		g.op("VFNMADD231PS X15, X13, %s", accm(v))
	}
	g.op("ADDQ $%d, R13", kb.bytes)
	g.op("ADDQ $%d, R14", kbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	g.ktileStore(V, acc, accm)
}

// ktileStore reduces the K-quant accumulators (reduce8 of acc, then with
// accm the mins' (m0 + m2) + (m1 + m3) added) and stores token v's result
// at out + v·os. X15 is scratch.
func (g *gen) ktileStore(V int, acc, accm func(v int) string) {
	g.op("MOVQ %d(AX), DI", ktOut)
	g.op("MOVQ %d(AX), SI", ktOS)
	for v := range V {
		y, x := acc(v), "X"+acc(v)[1:]
		g.op("VEXTRACTF128 $1, %s, X15", y)
		g.op("VADDPS X15, %s, %s", x, x)
		g.op("VMOVHLPS %s, %s, X15", x, x)
		g.op("VADDPS X15, %s, %s", x, x)
		g.op("VMOVSHDUP %s, X15", x)
		g.op("VADDSS X15, %s, %s", x, x) // reduce8(acc)
		if accm != nil {
			m := accm(v)
			g.op("VMOVHLPS %s, %s, X15", m, m)
			g.op("VADDPS X15, %s, %s", m, m) // [m0+m2, m1+m3]
			g.op("VMOVSHDUP %s, X15", m)
			g.op("VADDSS X15, %s, %s", m, m)
			g.op("VADDSS %s, %s, %s", m, x, x)
		}
		g.op("VMOVSS %s, (DI)", x)
		g.op("ADDQ SI, DI")
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// ktile6AVX2 writes the AVX2 Q6_K kernel: one weight row × V (≤ 2) Q8_K
// activation rows, the canonical result of dotQ6KGo as ktile6512 computes
// it, in ggml's AVX2 order (ggml_vec_dot_q6_K_q8_K): per quarter of 32
// values the 6-bit quants q from ql and qh, VPMADDUBSW of q·x and 32·x,
// their difference the exact (q−32)·x int16 pair sums, and VPMADDWD with
// the int8 scales of the two halves (as int16) giving sc·(4 products) per
// int32 lane, added with VPADDD. It prefetches the next row as it goes.
func (g *gen) ktile6AVX2(V int) {
	name := fmt.Sprintf("ktileQ6KAVX2V%d", V)
	g.text(name, fmt.Sprintf("AVX2, one Q6_K row × %d Q8_K activation rows", V))
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", ktW)
	for v := range V {
		g.op("MOVQ %d(AX), %s", ktX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", ktNB)
	g.ktilePrefetchSetup(210)
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y1
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) } // Y2–Y3
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	for _, c := range []struct {
		v   string
		reg int
	}{{"0x0f0f0f0f", 4}, {"0x03030303", 5}, {"0x20202020", 6}} {
		g.op("MOVL $%s, R9", c.v)
		g.op("VMOVD R9, X%d", c.reg)
		g.op("VPBROADCASTD X%d, Y%d", c.reg, c.reg)
	}
	loop := name + "_loop"
	g.label(loop)
	g.ktilePrefetch(210)
	g.op("VPBROADCASTW 208(R8)(R13*1), X7")
	g.op("VCVTPH2PS X7, Y7") // d
	for v := range V {
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for h := range 2 {
		g.op("VMOVDQU %d(R8)(R13*1), Y8", 64*h)      // ql, quarters 0 and 2
		g.op("VMOVDQU %d(R8)(R13*1), Y9", 64*h+32)   // ql, quarters 1 and 3
		g.op("VMOVDQU %d(R8)(R13*1), Y10", 128+32*h) // qh
		for q := range 4 {
			lo := []string{"Y8", "Y9", "Y8", "Y9"}[q]
			// Y11 = low 4 bits, Y12 = high 2 bits << 4.
			if q < 2 {
				g.op("VPAND Y4, %s, Y11", lo)
			} else {
				g.op("VPSRLW $4, %s, Y11", lo)
				g.op("VPAND Y4, Y11, Y11")
			}
			if q == 0 {
				g.op("VPAND Y5, Y10, Y12")
			} else {
				g.op("VPSRLW $%d, Y10, Y12", 2*q)
				g.op("VPAND Y5, Y12, Y12")
			}
			g.op("VPSLLW $4, Y12, Y12")
			g.op("VPOR Y12, Y11, Y11") // q, 0–63
			g.op("MOVBQSX %d(R8)(R13*1), R9", 192+8*h+2*q)
			g.op("VMOVD R9, X13")
			g.op("VPBROADCASTW X13, X13")
			g.op("MOVBQSX %d(R8)(R13*1), R10", 192+8*h+2*q+1)
			g.op("VMOVD R10, X12")
			g.op("VPBROADCASTW X12, X12")
			g.op("VINSERTI128 $1, X12, Y13, Y13") // scales: lanes 0–3, 4–7
			for v := range V {
				off := kbQS + 128*h + 32*q
				g.op("VPMADDUBSW %d(%s)(R14*1), Y11, Y14", off, xGPR[v])
				g.op("VPMADDUBSW %d(%s)(R14*1), Y6, Y15", off, xGPR[v])
				g.op("VPSUBW Y15, Y14, Y14")
				g.op("VPMADDWD Y13, Y14, Y14")
				g.op("VPADDD Y14, %s, %s", isum(v), isum(v))
			}
		}
	}
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", kbD, xGPR[v])
		g.op("VMULPS Y7, Y14, Y15")
		g.op("VFMADD231PS Y15, %s, %s", isum(v), acc(v))
	}
	g.op("ADDQ $210, R13")
	g.op("ADDQ $%d, R14", kbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
	g.ktileStore(V, acc, nil)
}

// dtype is the element type of the rows a kernel reads.
type dtype struct {
	name string // Go-side suffix
	size int    // bytes per element
}

var (
	f32  = dtype{"F32", 4}
	bf16 = dtype{"BF16", 2}
	f16  = dtype{"F16", 2}
)

type gen struct {
	s, decl strings.Builder
}

func (g *gen) op(format string, args ...any) {
	fmt.Fprintf(&g.s, "\t"+format+"\n", args...)
}

func (g *gen) label(l string) { fmt.Fprintf(&g.s, "%s:\n", l) }

func (g *gen) text(name string, doc string) {
	fmt.Fprintf(&g.s, "\n// func %s(a *%s)\nTEXT ·%s(SB), NOSPLIT, $0-8\n", name, argType(name), name)
	fmt.Fprintf(&g.decl, "\n// %s: %s\n//\n//go:noescape\nfunc %s(a *%s)\n", name, doc, name, argType(name))
}

// argType is the argument block type of kernel name.
func argType(name string) string {
	switch {
	case strings.HasPrefix(name, "tile"):
		return "tileArgs"
	case strings.HasPrefix(name, "qtile"):
		return "qtileArgs"
	case strings.HasPrefix(name, "ktile"):
		return "ktileArgs"
	case strings.HasPrefix(name, "pv"):
		return "pvArgs"
	case strings.HasPrefix(name, "exp"):
		return "expArgs"
	case strings.HasPrefix(name, "narrow"):
		return "narrowArgs"
	case strings.HasPrefix(name, "prefetch"):
		return "prefetchArgs"
	}
	return "siluArgs"
}

// loadMasked loads 16 elements at mem under mask K1 (zeros elsewhere; no
// fault past the mask) and widens them into zmm register reg.
func (g *gen) loadMasked(dt dtype, mem, reg string) {
	y := "Y" + reg[1:]
	switch dt {
	case f32:
		g.op("VMOVUPS.Z %s, K1, %s", mem, reg)
	case bf16:
		g.op("VMOVDQU16.Z %s, K1, %s", mem, y)
		g.op("VPMOVZXWD %s, %s", y, reg)
		g.op("VPSLLD $16, %s, %s", reg, reg)
	case f16:
		g.op("VMOVDQU16.Z %s, K1, %s", mem, y)
		g.op("VCVTPH2PS %s, %s", y, reg)
	}
}

// load widens 16 (zmm) or 8 (ymm) elements at mem into register reg.
func (g *gen) load(dt dtype, mem, reg string) {
	switch dt {
	case f32:
		g.op("VMOVUPS %s, %s", mem, reg)
	case bf16:
		g.op("VPMOVZXWD %s, %s", mem, reg)
		g.op("VPSLLD $16, %s, %s", reg, reg)
	case f16:
		g.op("VCVTPH2PS %s, %s", mem, reg)
	}
}

// tileGPR are the pointer registers of a tile kernel: 4 weight rows, 6
// vectors. AX is the element offset (in 2-byte units), DX its end.
var (
	wGPR = []string{"R8", "R9", "R10", "R11"}
	xGPR = []string{"SI", "DI", "BX", "CX", "R12", "R13"}
)

// tileIndex is the addressing of element offset AX (counted in 2-byte
// units, so ×2 for float32) in a row of dt.
func tileIndex(dt dtype) string {
	if dt.size == 4 {
		return "(AX*2)"
	}
	return "(AX*1)"
}

// prefetch512 is the instruction of the AVX-512 float tile kernels'
// software prefetches in decode: into L2 (PREFETCHT1), not L1. A prefetch into L1
// holds one of the core's few L1 miss buffers until its line arrives (at
// ~24 buffers and a ~150 ns memory latency, 24 · 64 B / 150 ns ≈ 10 GB/s
// per core, about what the BF16 kernel streamed at with PREFETCHT0), while
// L2 tracks more misses; the demand loads then hit L2. BenchmarkStream on
// Zen 4, five alternations: 2 threads 16–20 GB/s with PREFETCHT0, 19–23
// with PREFETCHT1 (rows of 576), 21–25 against 24–33 (rows of 1536). The
// integer kernels keep PREFETCHT0: with PREFETCHT1 their one-thread stream
// (BenchmarkStreamQ Q8_0/576) fell from 17–18 to ~10 GB/s, as they do more
// work per byte and wait on each L2 hit; so do the AVX2 tile kernels, not
// measured against it on the CPUs they run on (Zen 3, Haswell and later).
const prefetch512 = "PREFETCHT1"

// prefetchMaxV is the largest vector count for which tile kernels prefetch
// the next rows: with few vectors a tile is bound by memory bandwidth.
var prefetchMaxV = 2

// prefetchNext prefetches the part of the next R rows (contiguous from R14)
// that one iteration's worth of this tile's rows covers: R·16 elements of
// dt, so that the next tile's rows are in cache when it starts. (A
// prefetch never faults, so R14 may point past the matrix.)
func (g *gen) prefetchNext(op string, R int, dt dtype) {
	bytes := R * 16 * dt.size
	scale := R * dt.size / 2 // AX counts 2-byte units of one row
	for off := 0; off < bytes; off += 64 {
		g.op("%s %d(R14)(AX*%d)", op, off, scale)
	}
}

// tile512 writes an AVX-512 tile kernel: 4 weight rows × V vectors, one
// zmm accumulator (16 lanes) per (row, vector) pair, reduced with the
// transposed tree (reduce512).
func (g *gen) tile512(dt dtype, V int) {
	const R = 4
	name := fmt.Sprintf("tile%sAVX512V%d", dt.name, V)
	g.text(name, fmt.Sprintf("AVX-512, %d %s rows × %d float32 vectors", R, dt.name, V))
	g.op("MOVQ a+0(FP), AX")
	for r := range R {
		g.op("MOVQ %d(AX), %s", tileW+8*r, wGPR[r])
	}
	for v := range V {
		g.op("MOVQ %d(AX), %s", tileX+8*v, xGPR[v])
	}
	// DX: end of the whole chunks (2-byte units); CX holds the tail length.
	g.op("MOVQ %d(AX), DX", tileN)
	g.op("MOVQ DX, R15")
	g.op("ANDQ $15, R15")
	g.op("ANDQ $-16, DX")
	g.op("SHLQ $1, DX")
	pf := V <= prefetchMaxV
	if pf {
		g.op("MOVQ %d(AX), R14", tilePF)
	}
	g.op("XORQ AX, AX")
	acc := func(r, v int) string { return fmt.Sprintf("Z%d", v*R+r) }
	xr := func(v int) string { return fmt.Sprintf("Z%d", 24+v) }
	for v := range V {
		for r := range R {
			g.op("VPXORD %s, %s, %s", acc(r, v), acc(r, v), acc(r, v))
		}
	}
	loop, tail, done := name+"_loop", name+"_tail", name+"_done"
	g.op("TESTQ DX, DX")
	g.op("JEQ %s", tail)
	g.label(loop)
	for v := range V {
		g.op("VMOVUPS (%s)%s, %s", xGPR[v], "(AX*2)", xr(v))
	}
	if pf {
		g.prefetchNext(prefetch512, R, dt)
	}
	for r := range R {
		w := []string{"Z30", "Z31"}[r%2]
		g.load(dt, fmt.Sprintf("(%s)%s", wGPR[r], tileIndex(dt)), w)
		for v := range V {
			g.op("VFMADD231PS %s, %s, %s", xr(v), w, acc(r, v))
		}
	}
	g.op("ADDQ $32, AX")
	g.op("CMPQ AX, DX")
	g.op("JLT %s", loop)
	// The last n%16 elements under a mask: the other lanes load zeros and
	// add +0, which leaves an accumulator unchanged (it is never −0).
	g.label(tail)
	g.op("TESTQ R15, R15")
	g.op("JEQ %s", done)
	g.op("MOVL $1, DX")
	g.op("SHLXL R15, DX, DX")
	g.op("DECL DX")
	g.op("KMOVW DX, K1")
	for v := range V {
		g.op("VMOVUPS.Z (%s)(AX*2), K1, %s", xGPR[v], xr(v))
	}
	for r := range R {
		w := []string{"Z30", "Z31"}[r%2]
		g.loadMasked(dt, fmt.Sprintf("(%s)%s", wGPR[r], tileIndex(dt)), w)
		for v := range V {
			g.op("VFMADD231PS %s, %s, %s", xr(v), w, acc(r, v))
		}
	}
	g.label(done)

	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), DI", tileOut)
	g.op("MOVQ %d(AX), SI", tileOS)
	// Pairs k = v·4 + r, in groups of 16 (4 vectors).
	for g0 := 0; g0 < V; g0 += 4 {
		var pairs []string
		for v := g0; v < min(g0+4, V); v++ {
			for r := range R {
				pairs = append(pairs, acc(r, v))
			}
		}
		res := g.reduce512(pairs)
		for v := g0; v < min(g0+4, V); v++ {
			g.op("VEXTRACTF32X4 $%d, %s, (DI)", v-g0, res)
			g.op("ADDQ SI, DI")
		}
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// reduce512 reduces up to 16 zmm accumulators (pair k in pairs[k]) to one
// zmm whose lane k holds pair k's canonical sum, and returns its name. Each
// step adds, lane by lane, exactly the two partial sums the canonical tree
// adds, four or eight pairs at once:
//
//	A: s8 of two slots per register ([a.s8, b.s8])          (VSHUFF64X2 0x44/0xEE)
//	B: s4 of four slots ([a.s4, b.s4, c.s4, d.s4])          (VSHUFF64X2 0x88/0xDD)
//	C: s2 of eight slots (per 128-bit lane m: slots m, 4+m) (VSHUFPS 0x44/0xEE)
//	D: s of sixteen slots (lane 4m+i: slot 4i+m)            (VSHUFPS 0x88/0xDD)
//
// so pair k goes into slot (k%4)·4 + k/4 to come out in lane k. Missing
// pairs are a zeroed dummy register (Z29), whose lanes are never stored.
// Z29–Z31 are scratch; accumulator registers are overwritten.
func (g *gen) reduce512(pairs []string) string {
	const dummy = "Z29"
	g.op("VPXORD %s, %s, %s", dummy, dummy, dummy)
	slots := make([]string, 16)
	for s := range slots {
		k := (s%4)*4 + s/4
		slots[s] = dummy
		if k < len(pairs) {
			slots[s] = pairs[k]
		}
	}
	step := func(in []string, shuf string, lo, hi int) []string {
		out := make([]string, len(in)/2)
		for i := range out {
			a, b := in[2*i], in[2*i+1]
			if a == dummy && b == dummy {
				out[i] = dummy
				continue
			}
			dst := a
			if dst == dummy {
				dst = b
			}
			g.op("%s $%#02x, %s, %s, Z30", shuf, lo, b, a)
			g.op("%s $%#02x, %s, %s, Z31", shuf, hi, b, a)
			g.op("VADDPS Z31, Z30, %s", dst)
			out[i] = dst
		}
		return out
	}
	a := step(slots, "VSHUFF64X2", 0x44, 0xEE)
	b := step(a, "VSHUFF64X2", 0x88, 0xDD)
	c := step(b, "VSHUFPS", 0x44, 0xEE)
	d := step(c, "VSHUFPS", 0x88, 0xDD)
	return d[0]
}

// tileAVX2 writes an AVX2 tile kernel: 2 rows × V vectors, two ymm
// accumulators per pair (lanes 0–7 and 8–15), reduced one pair at a time.
func (g *gen) tileAVX2(dt dtype, V int) {
	const R = 2
	name := fmt.Sprintf("tile%sAVX2V%d", dt.name, V)
	g.text(name, fmt.Sprintf("AVX2, %d %s rows × %d float32 vectors", R, dt.name, V))
	g.op("MOVQ a+0(FP), AX")
	for r := range R {
		g.op("MOVQ %d(AX), %s", tileW+8*r, wGPR[r])
	}
	for v := range V {
		g.op("MOVQ %d(AX), %s", tileX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), DX", tileN)
	g.op("SHLQ $1, DX")
	pf := V <= prefetchMaxV
	if pf {
		g.op("MOVQ %d(AX), R14", tilePF)
	}
	g.op("XORQ AX, AX")
	acc := func(r, v, h int) string { return fmt.Sprintf("Y%d", (v*R+r)*2+h) }
	for v := range V {
		for r := range R {
			for h := range 2 {
				g.op("VXORPS %s, %s, %s", acc(r, v, h), acc(r, v, h), acc(r, v, h))
			}
		}
	}
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.prefetchNext("PREFETCHT0", R, dt)
	}
	for h := range 2 {
		for r := range R {
			w := []string{"Y14", "Y15"}[r%2]
			g.load(dt, fmt.Sprintf("%d(%s)%s", h*8*dt.size, wGPR[r], tileIndex(dt)), w)
			for v := range V {
				g.op("VFMADD231PS %d(%s)(AX*2), %s, %s", h*32, xGPR[v], w, acc(r, v, h))
			}
		}
	}
	g.op("ADDQ $32, AX")
	g.op("CMPQ AX, DX")
	g.op("JLT %s", loop)

	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), DI", tileOut)
	g.op("MOVQ %d(AX), SI", tileOS)
	for v := range V {
		for r := range R {
			lo, hi := acc(r, v, 0), acc(r, v, 1)
			x := "X" + lo[1:]
			g.op("VADDPS %s, %s, %s", hi, lo, lo) // s8
			g.op("VEXTRACTF128 $1, %s, X15", lo)
			g.op("VADDPS X15, %s, %s", x, x) // s4
			g.op("VMOVHLPS %s, %s, X15", x, x)
			g.op("VADDPS X15, %s, %s", x, x) // s2
			g.op("VMOVSHDUP %s, X15", x)
			g.op("VADDSS X15, %s, %s", x, x) // s
			g.op("VMOVSS %s, %d(DI)", x, 4*r)
		}
		g.op("ADDQ SI, DI")
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// pvGPR are the per-head weight pointers of a pv kernel.
var pvGPR = []string{"SI", "DI", "BX", "R10", "R11", "R12"}

// pv512 writes an AVX-512 weighted-sum kernel over C chunks of 16 columns
// for G heads: acc[h][c] = fma(p[h][j], row_j[c], acc[h][c]) for each row j
// in order.
func (g *gen) pv512(dt dtype, C, G int) {
	name := fmt.Sprintf("pv%sAVX512C%dG%d", dt.name, C, G)
	g.text(name, fmt.Sprintf("AVX-512, %d columns of %s rows, %d heads", 16*C, dt.name, G))
	g.pvPrologue(G)
	acc := func(h, c int) string { return fmt.Sprintf("Z%d", h*C+c) }
	vr := func(c int) string { return fmt.Sprintf("Z%d", 24+c) }
	g.op("MOVQ DX, R14")
	for h := range G {
		for c := range C {
			g.op("VMOVUPS %d(R14), %s", 64*c, acc(h, c))
		}
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	loop := name + "_loop"
	g.label(loop)
	for c := range C {
		g.load(dt, fmt.Sprintf("%d(R8)", c*16*dt.size), vr(c))
	}
	for h := range G {
		b := []string{"Z28", "Z29"}[h%2]
		g.op("VBROADCASTSS (%s)(AX*1), %s", pvGPR[h], b)
		for c := range C {
			g.op("VFMADD231PS %s, %s, %s", vr(c), b, acc(h, c))
		}
	}
	g.op("ADDQ R9, R8")
	g.op("ADDQ $4, AX")
	g.op("CMPQ AX, CX")
	g.op("JLT %s", loop)
	g.op("MOVQ DX, R14")
	for h := range G {
		for c := range C {
			g.op("VMOVUPS %s, %d(R14)", acc(h, c), 64*c)
		}
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// pv512Masked writes an AVX-512 weighted-sum kernel over one chunk of
// 1–16 columns (pvArgs.cols) for G heads, under a mask: the other lanes of
// rows and accumulators load as zeros and are not stored.
func (g *gen) pv512Masked(dt dtype, G int) {
	name := fmt.Sprintf("pv%sAVX512MG%d", dt.name, G)
	g.text(name, fmt.Sprintf("AVX-512, up to 16 columns of %s rows (masked), %d heads", dt.name, G))
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R15", pvCol)
	g.op("MOVL $1, DX")
	g.op("SHLXL R15, DX, DX")
	g.op("DECL DX")
	g.op("KMOVW DX, K1")
	g.pvPrologue(G)
	acc := func(h int) string { return fmt.Sprintf("Z%d", h) }
	g.op("MOVQ DX, R14")
	for h := range G {
		g.op("VMOVUPS.Z (R14), K1, %s", acc(h))
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	loop := name + "_loop"
	g.label(loop)
	g.loadMasked(dt, "(R8)", "Z24")
	for h := range G {
		b := []string{"Z28", "Z29"}[h%2]
		g.op("VBROADCASTSS (%s)(AX*1), %s", pvGPR[h], b)
		g.op("VFMADD231PS Z24, %s, %s", b, acc(h))
	}
	g.op("ADDQ R9, R8")
	g.op("ADDQ $4, AX")
	g.op("CMPQ AX, CX")
	g.op("JLT %s", loop)
	g.op("MOVQ DX, R14")
	for h := range G {
		g.op("VMOVUPS %s, K1, (R14)", acc(h))
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// pvAVX2 writes an AVX2 weighted-sum kernel over 16 columns (two ymm) for G
// heads.
func (g *gen) pvAVX2(dt dtype, G int) {
	name := fmt.Sprintf("pv%sAVX2C1G%d", dt.name, G)
	g.text(name, fmt.Sprintf("AVX2, 16 columns of %s rows, %d heads", dt.name, G))
	g.pvPrologue(G)
	acc := func(h, c int) string { return fmt.Sprintf("Y%d", h*2+c) }
	vr := func(c int) string { return fmt.Sprintf("Y%d", 12+c) }
	g.op("MOVQ DX, R14")
	for h := range G {
		for c := range 2 {
			g.op("VMOVUPS %d(R14), %s", 32*c, acc(h, c))
		}
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	loop := name + "_loop"
	g.label(loop)
	for c := range 2 {
		g.load(dt, fmt.Sprintf("%d(R8)", c*8*dt.size), vr(c))
	}
	for h := range G {
		b := []string{"Y14", "Y15"}[h%2]
		g.op("VBROADCASTSS (%s)(AX*1), %s", pvGPR[h], b)
		for c := range 2 {
			g.op("VFMADD231PS %s, %s, %s", vr(c), b, acc(h, c))
		}
	}
	g.op("ADDQ R9, R8")
	g.op("ADDQ $4, AX")
	g.op("CMPQ AX, CX")
	g.op("JLT %s", loop)
	g.op("MOVQ DX, R14")
	for h := range G {
		for c := range 2 {
			g.op("VMOVUPS %s, %d(R14)", acc(h, c), 32*c)
		}
		if h+1 < G {
			g.op("ADDQ R13, R14")
		}
	}
	g.op("VZEROUPPER")
	g.op("RET")
}

// pvPrologue loads a pvArgs block: R8 row pointer, R9 row stride, CX end of
// the weight offset (4n), AX weight offset 0, DX accumulators, R13 their
// stride, and the head weight pointers pvGPR[:G].
func (g *gen) pvPrologue(G int) {
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", pvV)
	g.op("MOVQ %d(AX), R9", pvVS)
	g.op("MOVQ %d(AX), CX", pvN)
	g.op("SHLQ $2, CX")
	g.op("MOVQ %d(AX), %s", pvP, pvGPR[0])
	g.op("MOVQ %d(AX), R13", pvPS)
	for h := 1; h < G; h++ {
		g.op("LEAQ (%s)(R13*1), %s", pvGPR[h-1], pvGPR[h])
	}
	g.op("MOVQ %d(AX), DX", pvOut)
	g.op("MOVQ %d(AX), R13", pvOS)
	g.op("XORQ AX, AX")
}

// Exp constants, as float32 bit patterns, in the order of expTab (see
// expf in simd.go for the algorithm).
var expConsts = []struct {
	name string
	bits uint32
}{
	{"lo", 0xc2ae0000},     // -87
	{"hi", 0x42b00000},     // 88
	{"log2e", 0x3fb8aa3b},  // log2(e)
	{"magic", 0x4b400000},  // 1.5·2^23
	{"nln2hi", 0xbf317200}, // −0.693145751953125
	{"nln2lo", 0xb5bfbe8e}, // −1.42860677e-06
	{"c6", 0x3ab60b61},     // 1/720
	{"c5", 0x3c088889},     // 1/120
	{"c4", 0x3d2aaaab},     // 1/24
	{"c3", 0x3e2aaaab},     // 1/6
	{"c2", 0x3f000000},     // 1/2
	{"one", 0x3f800000},    // 1
	{"koff", 0x4b3fff81},   // bits(magic) − 127
	{"sign", 0x80000000},   // sign bit
}

func expConst(name string) int {
	for i, c := range expConsts {
		if c.name == name {
			return i
		}
	}
	panic(name)
}

// expTable writes expTab: each constant repeated 8 times (a ymm vector).
func (g *gen) expTable() {
	for i, c := range expConsts {
		for k := range 8 {
			fmt.Fprintf(&g.s, "DATA expTab<>+%d(SB)/4, $%#08x\n", (i*8+k)*4, c.bits)
		}
	}
	fmt.Fprintf(&g.s, "GLOBL expTab<>(SB), RODATA|NOPTR, $%d\n", len(expConsts)*32)
}

// exp512 computes expf of every lane of z in place; constants are in
// registers Z(16+i) (expConsts order); Z4–Z7 are scratch.
func (g *gen) exp512(z string) {
	c := func(n string) string { return fmt.Sprintf("Z%d", 16+expConst(n)) }
	g.op("VMAXPS %s, %s, %s", c("lo"), z, z)
	g.op("VMINPS %s, %s, %s", c("hi"), z, z)
	g.op("VMOVAPS %s, Z4", c("magic"))
	g.op("VFMADD231PS %s, %s, Z4", c("log2e"), z) // t = x·log2e + magic
	g.op("VSUBPS %s, Z4, Z5", c("magic"))         // n = t − magic
	g.op("VMOVAPS %s, Z6", z)
	g.op("VFMADD231PS %s, Z5, Z6", c("nln2hi")) // r = n·(−ln2hi) + x
	g.op("VFMADD231PS %s, Z5, Z6", c("nln2lo")) // r = n·(−ln2lo) + r
	g.op("VMOVAPS %s, Z7", c("c6"))
	for _, k := range []string{"c5", "c4", "c3", "c2", "one", "one"} {
		g.op("VFMADD213PS %s, Z6, Z7", c(k)) // p = r·p + c
	}
	g.op("VPSUBD %s, Z4, Z4", c("koff"))
	g.op("VPSLLD $23, Z4, Z4")
	g.op("VMULPS Z4, Z7, %s", z)
}

// exp256 is exp512 on a ymm register with the constants in memory (expTab);
// Y12–Y15 are scratch.
func (g *gen) exp256(y string) {
	c := func(n string) string { return fmt.Sprintf("expTab<>+%d(SB)", expConst(n)*32) }
	g.op("VMAXPS %s, %s, %s", c("lo"), y, y)
	g.op("VMINPS %s, %s, %s", c("hi"), y, y)
	g.op("VMOVUPS %s, Y12", c("magic"))
	g.op("VFMADD231PS %s, %s, Y12", c("log2e"), y)
	g.op("VSUBPS %s, Y12, Y13", c("magic"))
	g.op("VMOVAPS %s, Y14", y)
	g.op("VFMADD231PS %s, Y13, Y14", c("nln2hi"))
	g.op("VFMADD231PS %s, Y13, Y14", c("nln2lo"))
	g.op("VMOVUPS %s, Y15", c("c6"))
	for _, k := range []string{"c5", "c4", "c3", "c2", "one", "one"} {
		g.op("VFMADD213PS %s, Y14, Y15", c(k))
	}
	g.op("VPSUBD %s, Y12, Y12", c("koff"))
	g.op("VPSLLD $23, Y12, Y12")
	g.op("VMULPS Y12, Y15, %s", y)
}

// expArgs layout.
const (
	expX     = 0  // float32 values, replaced by exp(x − m)
	expN     = 8  // count
	expM     = 16 // m (float32)
	expLanes = 24 // [16]float32 partial sums, read and written
)

// expSum512 writes the AVX-512 softmax numerator kernel: x[i] = expf(x[i]
// − m) for i < n, lane i%16 of the partial sums accumulating it in order
// (the tail under a mask, so every n is handled).
func (g *gen) expSum512() {
	g.text("expSumAVX512", "AVX-512: x[i] = expf(x[i] − m), partial sums by lane")
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", expX)
	g.op("MOVQ %d(AX), CX", expN)
	g.op("VBROADCASTSS %d(AX), Z1", expM)
	g.op("VMOVUPS %d(AX), Z0", expLanes)
	for i := range expConsts {
		g.op("VBROADCASTSS expTab<>+%d(SB), Z%d", i*32, 16+i)
	}
	g.op("CMPQ CX, $16")
	g.op("JLT expSumAVX512_tail")
	g.label("expSumAVX512_loop")
	g.op("VMOVUPS (SI), Z2")
	g.op("VSUBPS Z1, Z2, Z2")
	g.exp512("Z2")
	g.op("VMOVUPS Z2, (SI)")
	g.op("VADDPS Z2, Z0, Z0")
	g.op("ADDQ $64, SI")
	g.op("SUBQ $16, CX")
	g.op("CMPQ CX, $16")
	g.op("JGE expSumAVX512_loop")
	g.label("expSumAVX512_tail")
	g.op("TESTQ CX, CX")
	g.op("JEQ expSumAVX512_done")
	g.op("MOVL $1, DX")
	g.op("SHLL CX, DX")
	g.op("DECL DX")
	g.op("KMOVW DX, K1")
	g.op("VMOVUPS.Z (SI), K1, Z2")
	g.op("VSUBPS Z1, Z2, Z2")
	g.exp512("Z2")
	g.op("VMOVUPS Z2, K1, (SI)")
	g.op("VADDPS Z2, Z0, K1, Z0")
	g.label("expSumAVX512_done")
	g.op("VMOVUPS Z0, %d(AX)", expLanes)
	g.op("VZEROUPPER")
	g.op("RET")
}

// expSum256 writes the AVX2 version for n a multiple of 16 (the caller does
// the tail): lanes 0–7 in Y0, 8–15 in Y1.
func (g *gen) expSum256() {
	g.text("expSumAVX2", "AVX2: x[i] = expf(x[i] − m), partial sums by lane, n a multiple of 16")
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", expX)
	g.op("MOVQ %d(AX), CX", expN)
	g.op("VBROADCASTSS %d(AX), Y2", expM)
	g.op("VMOVUPS %d(AX), Y0", expLanes)
	g.op("VMOVUPS %d(AX), Y1", expLanes+32)
	g.op("TESTQ CX, CX")
	g.op("JEQ expSumAVX2_done")
	g.label("expSumAVX2_loop")
	for h := range 2 {
		g.op("VMOVUPS %d(SI), Y3", 32*h)
		g.op("VSUBPS Y2, Y3, Y3")
		g.exp256("Y3")
		g.op("VMOVUPS Y3, %d(SI)", 32*h)
		g.op("VADDPS Y3, Y%d, Y%d", h, h)
	}
	g.op("ADDQ $64, SI")
	g.op("SUBQ $16, CX")
	g.op("JGT expSumAVX2_loop")
	g.label("expSumAVX2_done")
	g.op("VMOVUPS Y0, %d(AX)", expLanes)
	g.op("VMOVUPS Y1, %d(AX)", expLanes+32)
	g.op("VZEROUPPER")
	g.op("RET")
}

// siluArgs layout: gate and up pointers, count (a multiple of the vector
// width; the caller does the rest).
const (
	siluG = 0
	siluU = 8
	siluN = 16
)

// silu512 writes gate[i] = gate[i] / (1 + expf(−gate[i])) · up[i].
func (g *gen) silu512() {
	g.text("siluAVX512", "AVX-512: gate = silu(gate)·up, n a multiple of 16")
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", siluG)
	g.op("MOVQ %d(AX), DI", siluU)
	g.op("MOVQ %d(AX), CX", siluN)
	for i := range expConsts {
		g.op("VBROADCASTSS expTab<>+%d(SB), Z%d", i*32, 16+i)
	}
	g.op("TESTQ CX, CX")
	g.op("JEQ siluAVX512_done")
	g.label("siluAVX512_loop")
	g.op("VMOVUPS (SI), Z0")
	g.op("VXORPS Z%d, Z0, Z2", 16+expConst("sign"))
	g.exp512("Z2")
	g.op("VADDPS Z%d, Z2, Z2", 16+expConst("one"))
	g.op("VDIVPS Z2, Z0, Z0")
	g.op("VMULPS (DI), Z0, Z0")
	g.op("VMOVUPS Z0, (SI)")
	g.op("ADDQ $64, SI")
	g.op("ADDQ $64, DI")
	g.op("SUBQ $16, CX")
	g.op("JGT siluAVX512_loop")
	g.label("siluAVX512_done")
	g.op("VZEROUPPER")
	g.op("RET")
}

// silu256 is silu512 on ymm, n a multiple of 8.
func (g *gen) silu256() {
	g.text("siluAVX2", "AVX2: gate = silu(gate)·up, n a multiple of 8")
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", siluG)
	g.op("MOVQ %d(AX), DI", siluU)
	g.op("MOVQ %d(AX), CX", siluN)
	g.op("TESTQ CX, CX")
	g.op("JEQ siluAVX2_done")
	g.label("siluAVX2_loop")
	g.op("VMOVUPS (SI), Y0")
	g.op("VXORPS expTab<>+%d(SB), Y0, Y2", expConst("sign")*32)
	g.exp256("Y2")
	g.op("VADDPS expTab<>+%d(SB), Y2, Y2", expConst("one")*32)
	g.op("VDIVPS Y2, Y0, Y0")
	g.op("VMULPS (DI), Y0, Y0")
	g.op("VMOVUPS Y0, (SI)")
	g.op("ADDQ $32, SI")
	g.op("ADDQ $32, DI")
	g.op("SUBQ $8, CX")
	g.op("JGT siluAVX2_loop")
	g.label("siluAVX2_done")
	g.op("VZEROUPPER")
	g.op("RET")
}

// narrowArgs layout: source and destination pointers, count (a multiple
// of the vector width; the caller does the rest).
const (
	narrowSrc = 0
	narrowDst = 8
	narrowN   = 16
)

// narrowF16 writes narrowF16AVX512 (isa512) or narrowF16AVX2: dst[i] =
// F32ToF16(src[i]) for n elements, n a multiple of 16 (8 for AVX2), with
// VCVTPS2PH rounding to nearest even (imm8 0, not MXCSR's mode). VCVTPS2PH
// rounds, overflows to ±Inf, makes subnormals and keeps signs of zero as
// F32ToF16 does, but keeps the top 9 bits of a NaN's payload where F32ToF16
// stores the one quiet NaN 0x7e00 (with the sign): so a NaN lane is first
// replaced by sign | 0x7fc00000, the float32 quiet NaN with no payload,
// which converts to sign | 0x7e00.
func (g *gen) narrowF16(isa512 bool) {
	name, w, reg := "narrowF16AVX2", 8, "Y"
	doc := "AVX2 (F16C): dst = float32 src rounded to binary16 (F32ToF16), n a multiple of 8"
	if isa512 {
		name, w, reg = "narrowF16AVX512", 16, "Z"
		doc = "AVX-512: dst = float32 src rounded to binary16 (F32ToF16), n a multiple of 16"
	}
	g.text(name, doc)
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", narrowSrc)
	g.op("MOVQ %d(AX), DI", narrowDst)
	g.op("MOVQ %d(AX), CX", narrowN)
	// The sign mask in register 14, the quiet NaN in 15.
	g.op("MOVL $0x80000000, DX")
	g.op("MOVQ DX, X14")
	g.op("VPBROADCASTD X14, %s14", reg)
	g.op("MOVL $0x7fc00000, DX")
	g.op("MOVQ DX, X15")
	g.op("VPBROADCASTD X15, %s15", reg)
	g.op("TESTQ CX, CX")
	g.op("JEQ %s_done", name)
	g.label(name + "_loop")
	g.op("VMOVUPS (SI), %s0", reg)
	if isa512 {
		g.op("VCMPPS $3, Z0, Z0, K1") // unordered: NaN lanes
		g.op("VPANDD Z14, Z0, K1, Z0")
		g.op("VPORD Z15, Z0, K1, Z0")
	} else {
		g.op("VCMPPS $3, Y0, Y0, Y1") // unordered: NaN lanes
		g.op("VANDPS Y14, Y0, Y2")
		g.op("VORPS Y15, Y2, Y2")
		g.op("VBLENDVPS Y1, Y2, Y0, Y0")
	}
	g.op("VCVTPS2PH $0, %s0, (DI)", reg)
	g.op("ADDQ $%d, SI", 4*w)
	g.op("ADDQ $%d, DI", 2*w)
	g.op("SUBQ $%d, CX", w)
	g.op("JGT %s_loop", name)
	g.label(name + "_done")
	g.op("VZEROUPPER")
	g.op("RET")
}

// prefetchArgs layout: first row, bytes between rows, rows (> 0), bytes
// per row (> 0).
const (
	pfP     = 0
	pfS     = 8
	pfRows  = 16
	pfBytes = 24
)

// prefetchRows writes prefetchRowsT1 (plain amd64, for either kernel
// set): a PREFETCHT1 of every 64-byte line at offsets 0, 64, … below bytes
// from the start of each of rows rows (rows at p, p+s, …; aligned rows
// take exactly their lines). A prefetch never faults.
func (g *gen) prefetchRows() {
	const name, op = "prefetchRowsT1", "PREFETCHT1"
	g.text(name, "PREFETCHT1 of rows (KV rows of attention's next task)")
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), SI", pfP)
	g.op("MOVQ %d(AX), DX", pfS)
	g.op("MOVQ %d(AX), CX", pfRows)
	g.op("MOVQ %d(AX), BX", pfBytes)
	g.label(name + "_row")
	g.op("XORQ R8, R8")
	g.label(name + "_line")
	g.op("%s (SI)(R8*1)", op)
	g.op("ADDQ $64, R8")
	g.op("CMPQ R8, BX")
	g.op("JLT %s_line", name)
	g.op("ADDQ DX, SI")
	g.op("DECQ CX")
	g.op("JNZ %s_row", name)
	g.op("RET")
}

func main() {
	sOut := flag.String("s", "simd_amd64.s", "assembly output")
	goOut := flag.String("go", "simd_amd64_gen.go", "Go declarations output")
	flag.Parse()
	g := &gen{}
	const header = "// Code generated by asmgen (internal/model/llama/asmgen); DO NOT EDIT.\n"
	g.s.WriteString(header + "\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	g.decl.WriteString(header + "\n//go:build amd64 && !purego\n\npackage llama\n")

	dts := []dtype{f32, bf16, f16}
	for _, dt := range dts {
		for V := 1; V <= 6; V++ {
			g.tile512(dt, V)
		}
	}
	for _, dt := range dts {
		for V := 1; V <= 3; V++ {
			g.tileAVX2(dt, V)
		}
	}
	for _, dt := range dts {
		for _, C := range []int{1, 4} {
			for G := 1; G <= 6; G++ {
				g.pv512(dt, C, G)
			}
		}
	}
	for _, dt := range dts {
		for G := 1; G <= 6; G++ {
			g.pv512Masked(dt, G)
		}
	}
	for _, dt := range dts {
		for G := 1; G <= 6; G++ {
			g.pvAVX2(dt, G)
		}
	}

	for _, k := range qkinds {
		for V := 1; V <= 4; V++ {
			g.qtile512(k, V)
		}
		for V := 1; V <= 2; V++ {
			g.qtileAVX2(k, V)
		}
	}

	for V := 1; V <= 4; V++ {
		g.ktile512(V, false)
	}
	for V := 1; V <= 4; V++ {
		g.ktile6512(V)
	}
	for V := 1; V <= 2; V++ {
		g.ktileAVX2(V, false)
		g.ktile6AVX2(V)
	}
	g.kquant2Kernels()
	g.iq4xsKernels()

	g.expTable()
	g.ktShufTable()
	g.q6ShufTable()
	g.q3BiasTable()
	g.q5BitsTable()
	g.iq4nlTable()
	g.expSum512()
	g.expSum256()
	g.silu512()
	g.silu256()
	g.narrowF16(true)
	g.narrowF16(false)
	g.prefetchRows()

	// Dispatch: direct calls (an indirect call would make the argument
	// block escape to the heap).
	var t strings.Builder
	t.WriteString(`
// Instruction sets of a kernelSet.
const (
	isaAVX2   = 1
	isaAVX512 = 2
)

// tile calls the tile kernel for weight dtype dt and nv vectors.
func (ks *kernelSet) tile(dt DType, nv int, a *tileArgs) {
	switch ks.isa {
`)
	sw := func(isa string, dts []dtype, n int, call string) {
		fmt.Fprintf(&t, "\tcase %s:\n\t\tswitch dt {\n", isa)
		for _, dt := range dts {
			fmt.Fprintf(&t, "\t\tcase %s:\n\t\t\tswitch nv {\n", dt.name)
			for i := 1; i <= n; i++ {
				fmt.Fprintf(&t, "\t\t\tcase %d:\n\t\t\t\t"+call+"(a)\n\t\t\t\treturn\n", i, dt.name, i)
			}
			t.WriteString("\t\t\t}\n")
		}
		t.WriteString("\t\t}\n")
	}
	sw("isaAVX512", dts, 6, "tile%sAVX512V%d")
	sw("isaAVX2", dts, 3, "tile%sAVX2V%d")
	t.WriteString("\t}\n\tpanic(\"llama: no tile kernel\")\n}\n")

	t.WriteString(`
// pv calls the weighted-sum kernel for row dtype dt, c column chunks (0:
// one masked chunk of a.cols columns) and nv heads.
func (ks *kernelSet) pv(dt DType, c, nv int, a *pvArgs) {
	switch {
`)
	pvsw := func(isa string, C int, dts []dtype, call string) {
		fmt.Fprintf(&t, "\tcase ks.isa == %s && c == %d:\n\t\tswitch dt {\n", isa, C)
		for _, dt := range dts {
			fmt.Fprintf(&t, "\t\tcase %s:\n\t\t\tswitch nv {\n", dt.name)
			for i := 1; i <= 6; i++ {
				fmt.Fprintf(&t, "\t\t\tcase %d:\n\t\t\t\t"+call+"(a)\n\t\t\t\treturn\n", i, dt.name, C, i)
			}
			t.WriteString("\t\t\t}\n")
		}
		t.WriteString("\t\t}\n")
	}
	pvsw("isaAVX512", 4, dts, "pv%sAVX512C%dG%d")
	pvsw("isaAVX512", 1, dts, "pv%sAVX512C%dG%d")
	t.WriteString(`	case ks.isa == isaAVX512 && c == 0:
		switch dt {
`)
	for _, dt := range dts {
		fmt.Fprintf(&t, "\t\tcase %s:\n\t\t\tswitch nv {\n", dt.name)
		for i := 1; i <= 6; i++ {
			fmt.Fprintf(&t, "\t\t\tcase %d:\n\t\t\t\tpv%sAVX512MG%d(a)\n\t\t\t\treturn\n", i, dt.name, i)
		}
		t.WriteString("\t\t\t}\n")
	}
	t.WriteString("\t\t}\n")
	pvsw("isaAVX2", 1, dts, "pv%sAVX2C%dG%d")
	t.WriteString("\t}\n\tpanic(\"llama: no pv kernel\")\n}\n")
	t.WriteString(`
// qtile calls the integer tile kernel for weight format kind (0 Q8_0, 1
// Q4_0, 2 Q5_0, 3 Q5_1, 4 Q4_1, 5 IQ4_NL: qtileKinds) and nv activation
// rows.
func (ks *kernelSet) qtile(kind, nv int, a *qtileArgs) {
	switch ks.qisa {
`)
	for _, isa := range []struct {
		name string
		v    int
	}{{"AVX512", 4}, {"AVX2", 2}} {
		fmt.Fprintf(&t, "\tcase isa%s:\n\t\tswitch kind {\n", isa.name)
		for ki, k := range qkinds {
			fmt.Fprintf(&t, "\t\tcase %d:\n\t\t\tswitch nv {\n", ki)
			for v := 1; v <= isa.v; v++ {
				fmt.Fprintf(&t, "\t\t\tcase %d:\n\t\t\t\tqtile%s%sV%d(a)\n\t\t\t\treturn\n", v, k.name, isa.name, v)
			}
			t.WriteString("\t\t\t}\n")
		}
		t.WriteString("\t\t}\n")
	}
	t.WriteString("\t}\n\tpanic(\"llama: no qtile kernel\")\n}\n")
	t.WriteString(`
// ktile calls the K-quant kernel for weight format kind (0 Q4_K, 1 Q6_K,
// 2 Q5_K, 3 Q3_K, 4 Q2_K, 5 IQ4_XS: ktileKinds) and nv activation rows.
func (ks *kernelSet) ktile(kind, nv int, a *ktileArgs) {
	switch ks.kisa {
`)
	for _, isa := range []struct {
		name string
		v    int
	}{{"AVX512", 4}, {"AVX2", 2}} {
		fmt.Fprintf(&t, "\tcase isa%s:\n\t\tswitch kind {\n", isa.name)
		for ki, k := range ktileNames {
			fmt.Fprintf(&t, "\t\tcase %d:\n\t\t\tswitch nv {\n", ki)
			maxV := isa.v
			if k == "IQ4XS" && isa.name == "AVX512" {
				maxV = iq4xsMaxV
			}
			for v := 1; v <= maxV; v++ {
				fmt.Fprintf(&t, "\t\t\tcase %d:\n\t\t\t\tktile%s%sV%d(a)\n\t\t\t\treturn\n", v, k, isa.name, v)
			}
			t.WriteString("\t\t\t}\n")
		}
		t.WriteString("\t\t}\n")
	}
	t.WriteString("\t}\n\tpanic(\"llama: no ktile kernel\")\n}\n")
	t.WriteString(`
// expSum calls the softmax numerator kernel.
func (ks *kernelSet) expSum(a *expArgs) {
	if ks.isa == isaAVX512 {
		expSumAVX512(a)
	} else {
		expSumAVX2(a)
	}
}

// silu calls the SwiGLU kernel.
func (ks *kernelSet) silu(a *siluArgs) {
	if ks.isa == isaAVX512 {
		siluAVX512(a)
	} else {
		siluAVX2(a)
	}
}

// narrowF16 calls the float32 → binary16 kernel: a.n is a multiple of
// ks.narrowWidth.
func (ks *kernelSet) narrowF16(a *narrowArgs) {
	if ks.isa == isaAVX512 {
		narrowF16AVX512(a)
	} else {
		narrowF16AVX2(a)
	}
}

// prefetchRows prefetches rows into L2 (prefetchRowsT1, for either
// instruction set).
func (ks *kernelSet) prefetchRows(a *prefetchArgs) { prefetchRowsT1(a) }
`)
	g.decl.WriteString(t.String())

	if err := os.WriteFile(*sOut, []byte(g.s.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	src, err := format.Source([]byte(g.decl.String()))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*goOut, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

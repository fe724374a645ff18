package main

import "fmt"

// q8KPerm offsets (iq4xs.go): the activations of the IQ4_XS kernels.
const (
	pbQS   = 0
	pbInit = 256 // [16]int32
	pbD    = 320
	pbSize = 384
)

// iq4xsLane is iq4xs.go's: the sub-block of each lane of the canonical
// IQ4_XS dot product.
var iq4xsLane = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

// iq4xsMaxV is the most activation rows of an AVX-512 IQ4_XS kernel call
// (kernelSet.kvecsIQ4XS): twice the other K-quant kernels', as its
// per-row work is small beside unpacking a block.
const iq4xsMaxV = 8

// iq4xsKernels writes the IQ4_XS kernels and their tables.
func (g *gen) iq4xsKernels() {
	for V := 1; V <= iq4xsMaxV; V++ {
		g.ktileIQ4XS512(V)
	}
	for V := 1; V <= 2; V++ {
		g.ktileIQ4XSAVX2(V)
	}
	// iq4xsPerm: the VPERMT2D indices that gather, from the 32 dwords of a
	// block's nibbles (sub-block j's 4 in dwords 4j…4j+3), dword c of each
	// lane's sub-block into lane L (c = 0, then 1: the first register; 2,
	// then 3: the second).
	for h := range 2 {
		for i := range 16 {
			c := 2*h + i/8
			fmt.Fprintf(&g.s, "DATA iq4xsPerm<>+%d(SB)/4, $%d\n", 64*h+4*i, 4*iq4xsLane[i%8]+c)
		}
	}
	fmt.Fprintf(&g.s, "GLOBL iq4xsPerm<>(SB), RODATA|NOPTR, $128\n")
	// iq4xsScaleShuf: VPSHUFB masks putting the scale byte of each lane's
	// sub-block in lane order (AVX-512: bytes 0–7), and twice (AVX2: bytes
	// 2L and 2L+1, for int16 pairs).
	for i := range 16 {
		fmt.Fprintf(&g.s, "DATA iq4xsScaleShuf<>+%d(SB)/1, $%d\n", i, iq4xsLane[i%8])
	}
	for i := range 16 {
		fmt.Fprintf(&g.s, "DATA iq4xsScaleShuf<>+%d(SB)/1, $%d\n", 16+i, iq4xsLane[i/2])
	}
	fmt.Fprintf(&g.s, "GLOBL iq4xsScaleShuf<>(SB), RODATA|NOPTR, $32\n")
}

// iq4xsScales unpacks the 8 six-bit sub-block scales of the IQ4_XS block
// at (R8)(R13*1) (ggml-common.h block_iq4_xs: scales_h uint16 at offset
// 2, scales_l [4]uint8 at 4), less 32, into the bytes of X<x> in lane
// order (iq4xsScaleShuf at offset shuf). In general registers the 8
// nibbles of scales_l are spread one per byte and the 8 two-bit fields of
// scales_h one per byte, shifted to bits 4–5, by three shift-or-mask
// steps each. It uses R9–R11.
func (g *gen) iq4xsScales(x, shuf int) {
	g.op("MOVWLZX 2(R8)(R13*1), R9") // scales_h
	g.op("MOVL 4(R8)(R13*1), R10")   // scales_l
	spread := func(r string, steps []struct {
		sh   int
		mask string
	}) {
		for _, s := range steps {
			g.op("MOVQ %s, R11", r)
			g.op("SHLQ $%d, R11", s.sh)
			g.op("ORQ R11, %s", r)
			g.op("MOVQ $%s, R11", s.mask)
			g.op("ANDQ R11, %s", r)
		}
	}
	type step = struct {
		sh   int
		mask string
	}
	spread("R10", []step{{16, "0x0000ffff0000ffff"}, {8, "0x00ff00ff00ff00ff"}, {4, "0x0f0f0f0f0f0f0f0f"}})
	spread("R9", []step{{24, "0x000000ff000000ff"}, {12, "0x000f000f000f000f"}, {6, "0x0303030303030303"}})
	g.op("SHLQ $4, R9")
	g.op("ORQ R9, R10")
	g.op("VMOVQ R10, X%d", x)
	g.op("VPSUBB q3Bias<>(SB), X%d, X%d", x, x)
	g.op("VPSHUFB iq4xsScaleShuf<>+%d(SB), X%d, X%d", shuf, x, x)
}

// iq4xsNext advances to the next block (weights by 136 bytes, activations
// by a q8KPerm) and loops.
func (g *gen) iq4xsNext(loop string) {
	g.op("ADDQ $136, R13")
	g.op("ADDQ $%d, R14", pbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
}

// ktileIQ4XS512 writes the AVX-512 VNNI IQ4_XS kernel: one weight row × V
// (≤ 8) q8KPerm activation rows, the canonical dot product of
// dotIQ4XSGo. Per block, two VPERMT2D gather the nibbles into the
// activations' order (a register per 8 values of each sub-block), VPSHUFB
// looks up the grid values plus 128 (unsigned, 1…241), and per activation
// row four VPDPBUSD add the 256 products u·x, 4 per int32 lane, to the
// start −128·Σx of each sub-block, which makes them Σ k·x exactly (at most
// 32·241·127 in magnitude before the start); the two halves of the
// register (the same 8 sub-blocks) are added, VPMULLD applies the scales
// less 32, and acc_L = fma(dx·d, float(isum_L), acc_L). Rows 0–3 have
// their pointers in registers, rows 4–7 are read from the argument block
// (AX) as used.
func (g *gen) ktileIQ4XS512(V int) {
	name := fmt.Sprintf("ktileIQ4XSAVX512V%d", V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one IQ4_XS row × %d Q8_K activation rows", V))
	pf := V <= prefetchMaxV
	g.ktilePrologue(min(V, 4), 136, pf)
	// row returns the base register of activation row v, loading it into
	// R15 for v ≥ 4.
	row := func(v int) string {
		if v < 4 {
			return xGPR[v]
		}
		g.op("MOVQ %d(AX), R15", ktX+8*v)
		return "R15"
	}
	// Registers: acc Y0–Y7; per row the lane sums Z8–Z15; the block's
	// unsigned values Z16–Z19, the gathered nibbles Z20–Z21; the scales
	// Y22, d Y23; scratch Y24–Y27; the gather indices Z28–Z29, the grid
	// plus 128 Z30, the nibble mask Z31.
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VPBROADCASTD R9, Z31")
	g.op("VBROADCASTI32X4 iq4nlTable<>+32(SB), Z30") // the grid + 128
	g.op("VMOVDQU32 iq4xsPerm<>+0(SB), Z28")
	g.op("VMOVDQU32 iq4xsPerm<>+64(SB), Z29")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(136)
	}
	// Z20 = dwords c = 0, 1 of each lane's sub-block, Z21 = c = 2, 3.
	g.op("VMOVDQU32 8(R8)(R13*1), Z20")
	g.op("VMOVDQA32 Z20, Z21")
	g.op("VPERMT2D 72(R8)(R13*1), Z28, Z20")
	g.op("VPERMT2D 72(R8)(R13*1), Z29, Z21")
	// Z16–Z19: values 0–7, 8–15 (low nibbles), 16–23, 24–31 (high) of
	// each sub-block, as the activations' bytes 0–63, …, 192–255.
	g.op("VPANDD Z31, Z20, Z16")
	g.op("VPANDD Z31, Z21, Z17")
	g.op("VPSRLW $4, Z20, Z18")
	g.op("VPANDD Z31, Z18, Z18")
	g.op("VPSRLW $4, Z21, Z19")
	g.op("VPANDD Z31, Z19, Z19")
	for i := range 4 {
		g.op("VPSHUFB Z%d, Z30, Z%d", 16+i, 16+i)
	}
	g.iq4xsScales(22, 0)
	g.op("VPMOVSXBD X22, Y22")
	g.op("VPBROADCASTW (R8)(R13*1), X23")
	g.op("VCVTPH2PS X23, Y23") // d
	for v := range V {
		g.op("VMOVDQU32 %d(%s)(R14*1), Z%d", pbInit, row(v), 8+v)
	}
	for i := range 4 {
		for v := range V {
			g.op("VPDPBUSD %d(%s)(R14*1), Z%d, Z%d", pbQS+64*i, row(v), 16+i, 8+v)
		}
	}
	for v := range V {
		s, t := fmt.Sprintf("Y%d", 8+v), fmt.Sprintf("Y%d", 24+v%4)
		g.op("VEXTRACTI64X4 $1, Z%d, %s", 8+v, t)
		g.op("VPADDD %s, %s, %s", t, s, s)
		g.op("VPMULLD Y22, %s, %s", s, s)
		g.op("VCVTDQ2PS %s, %s", s, s)
		g.op("VBROADCASTSS %d(%s)(R14*1), %s", pbD, row(v), t)
		g.op("VMULPS Y23, %s, %s", t, t) // dx·d
		g.op("VFMADD231PS %s, %s, %s", t, s, acc(v))
	}
	g.iq4xsNext(loop)
	g.ktileStore(V, acc, nil)
}

// ktileIQ4XSAVX2 writes the AVX2 IQ4_XS kernel: one weight row × V (≤ 2)
// q8KPerm activation rows, the canonical dot product of dotIQ4XSGo. Per
// block, the nibbles' 32 dwords (4 per sub-block) are transposed by two
// rounds of unpacking (VPUNPCKL/HDQ, VPUNPCKL/HQDQ) into 4 registers, each
// holding dword c of every sub-block in the lanes' order; per group of 4
// values the grid is looked up with VPSHUFB, VPMADDUBSW of |k| with the
// activations under k's sign (exact int16 pair sums, at most 2·127·127)
// and VPMADDWD with the lanes' scales (int16 pairs) give sc·(4 products)
// per int32 lane, added with VPADDD. It prefetches the next row as it
// goes.
func (g *gen) ktileIQ4XSAVX2(V int) {
	name := fmt.Sprintf("ktileIQ4XSAVX2V%d", V)
	g.text(name, fmt.Sprintf("AVX2, one IQ4_XS row × %d Q8_K activation rows", V))
	g.ktilePrologue(V, 136, true)
	// Registers: acc Y0–Y1, isum Y2–Y3, the nibble mask Y4, the grid Y5,
	// the scales Y6; the transposed nibbles Y9, Y11, Y12, Y13; scratch Y7,
	// Y8, Y10, Y14, Y15.
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) }
	xs := []string{"Y8", "Y10"}
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VMOVD R9, X4")
	g.op("VPBROADCASTD X4, Y4")
	g.op("VMOVDQU iq4nlTable<>+0(SB), Y5") // the grid, in both lanes
	loop := name + "_loop"
	g.label(loop)
	g.ktilePrefetch(136)
	g.iq4xsScales(6, 16)
	g.op("VPMOVSXBW X6, Y6")
	for v := range V {
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for i, y := range []string{"Y8", "Y9", "Y10", "Y11"} {
		g.op("VMOVDQU %d(R8)(R13*1), %s", 8+32*i, y) // sub-blocks 2i, 2i+1
	}
	g.op("VPUNPCKLDQ Y9, Y8, Y12")
	g.op("VPUNPCKHDQ Y9, Y8, Y8")
	g.op("VPUNPCKLDQ Y11, Y10, Y13")
	g.op("VPUNPCKHDQ Y11, Y10, Y10")
	g.op("VPUNPCKLQDQ Y13, Y12, Y9")  // c = 0
	g.op("VPUNPCKHQDQ Y13, Y12, Y11") // c = 1
	g.op("VPUNPCKLQDQ Y10, Y8, Y12")  // c = 2
	g.op("VPUNPCKHQDQ Y10, Y8, Y13")  // c = 3
	for q := range 8 {
		src := []string{"Y9", "Y11", "Y12", "Y13"}[q%4]
		if q < 4 {
			g.op("VPAND Y4, %s, Y14", src)
		} else {
			g.op("VPSRLW $4, %s, Y14", src)
			g.op("VPAND Y4, Y14, Y14")
		}
		g.op("VPSHUFB Y14, Y5, Y14") // k
		g.op("VPABSB Y14, Y15")
		for v := range V {
			g.op("VMOVDQU %d(%s)(R14*1), %s", pbQS+32*q, xGPR[v], xs[v])
			g.op("VPSIGNB Y14, %s, %s", xs[v], xs[v])
			g.op("VPMADDUBSW %s, Y15, %s", xs[v], xs[v])
			g.op("VPMADDWD Y6, %s, %s", xs[v], xs[v])
			g.op("VPADDD %s, %s, %s", xs[v], isum(v), isum(v))
		}
	}
	g.op("VPBROADCASTW (R8)(R13*1), X15")
	g.op("VCVTPH2PS X15, Y15") // d
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", pbD, xGPR[v])
		g.op("VMULPS Y15, Y14, Y14")
		g.op("VFMADD231PS Y14, %s, %s", isum(v), acc(v))
	}
	g.iq4xsNext(loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, nil)
}

package main

import "fmt"

// iq4xsKernels writes the IQ4_XS kernels.
func (g *gen) iq4xsKernels() {
	for V := 1; V <= 4; V++ {
		g.ktileIQ4XS512(V)
	}
	for V := 1; V <= 2; V++ {
		g.ktileIQ4XSAVX2(V)
	}
}

// iq4xsScales unpacks the 8 six-bit sub-block scales of the IQ4_XS block
// at (R8)(R13*1) (ggml-common.h block_iq4_xs: scales_h uint16 at offset
// 2, scales_l [4]uint8 at 4), less 32, into X<x> as int16 and both 128-bit
// lanes of dst (for VPSHUFB with ktShuf). In general registers the 8
// nibbles of scales_l are spread one per byte and the 8 two-bit fields of
// scales_h one per byte, shifted to bits 4–5, by three shift-or-mask
// steps each. It uses R9–R11.
func (g *gen) iq4xsScales(x int, dst string) {
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
	g.op("VPMOVSXBW X%d, X%d", x, x)
	g.op("VPERMQ $0x44, Y%d, %s", x, dst)
}

// ktileIQ4XS512 writes the AVX-512 VNNI IQ4_XS kernel: one weight row × V
// Q8_K activation rows, in the canonical order of dotIQ4XSGo. Per
// sub-block of 32 its 16 bytes go to both 128-bit lanes, the upper lane
// shifted to the high nibbles, so byte i is element i's index; VPSHUFB
// with the grid gives the int8 values k; VPMADDUBSW of |k| with the
// activation quants under k's sign (VPSIGNB, hence registers below 16)
// gives the exact k·x pair sums in int16 (at most 2·127·127), and VPDPWSSD
// with the scale less 32 (as int16) adds sc·(4 products) to each int32
// lane, as ktile512 does.
func (g *gen) ktileIQ4XS512(V int) {
	name := fmt.Sprintf("ktileIQ4XSAVX512V%d", V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one IQ4_XS row × %d Q8_K activation rows", V))
	pf := V <= prefetchMaxV
	g.ktilePrologue(V, 136, pf)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	isum := func(v int) string { return fmt.Sprintf("Y%d", 4+v) }
	isum2 := func(v int) string { return fmt.Sprintf("Y%d", 8+v) } // as ktile3512's
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VPBROADCASTD R9, Y31")
	g.op("VMOVDQU64 iq4nlTable<>+0(SB), Y30") // the grid, in both lanes
	// K1: the words of the upper 128-bit lane.
	g.op("MOVL $0xff00, R9")
	g.op("KMOVW R9, K1")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(136)
	}
	g.iq4xsScales(12, "Y29")
	g.op("VPBROADCASTW (R8)(R13*1), X28")
	g.op("VCVTPH2PS X28, Y28") // d
	for v := range V {
		g.op("VPXORD %s, %s, %s", isum(v), isum(v), isum(v))
		g.op("VPXORD %s, %s, %s", isum2(v), isum2(v), isum2(v))
	}
	for j := range 8 {
		g.op("VBROADCASTI32X4 %d(R8)(R13*1), Y16", 8+16*j)
		g.op("VPSRLW $4, Y16, K1, Y16")
		g.op("VPANDD Y31, Y16, Y16")
		g.op("VPSHUFB Y16, Y30, Y12") // k
		g.op("VPABSB Y12, Y13")
		g.op("VPSHUFB ktShuf<>+%d(SB), Y29, Y17", 32*j) // sc_j as int16 pairs
		for v := range V {
			g.op("VMOVDQU %d(%s)(R14*1), Y14", kbQS+32*j, xGPR[v])
			g.op("VPSIGNB Y12, Y14, Y14")
			g.op("VPMADDUBSW Y14, Y13, Y18")
			g.op("VPDPWSSD Y18, Y17, %s", []func(int) string{isum, isum2}[j%2](v))
		}
	}
	for v := range V {
		g.op("VPADDD %s, %s, %s", isum2(v), isum(v), isum(v))
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y25", kbD, xGPR[v])
		g.op("VMULPS Y28, Y25, Y26")
		g.op("VFMADD231PS Y26, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(136, loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, nil)
}

// ktileIQ4XSAVX2 writes the AVX2 IQ4_XS kernel: one weight row × V (≤ 2)
// Q8_K activation rows, the canonical result of dotIQ4XSGo as
// ktileIQ4XS512 computes it, in ggml's AVX2 order
// (ggml_vec_dot_iq4_xs_q8_K): per pair of sub-blocks 32 bytes of nibbles,
// split into low and high and regrouped per sub-block with VPERM2I128,
// the grid looked up with VPSHUFB, VPMADDUBSW of |k| with the signed
// activations and VPMADDWD with the scale, added with VPADDD. It
// prefetches the next row as it goes.
func (g *gen) ktileIQ4XSAVX2(V int) {
	name := fmt.Sprintf("ktileIQ4XSAVX2V%d", V)
	g.text(name, fmt.Sprintf("AVX2, one IQ4_XS row × %d Q8_K activation rows", V))
	g.ktilePrologue(V, 136, true)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y1
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) } // Y2–Y3
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
	g.iq4xsScales(6, "Y6")
	for v := range V {
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for jj := range 4 {
		g.op("VMOVDQU %d(R8)(R13*1), Y8", 8+32*jj)
		g.op("VPSRLW $4, Y8, Y9")
		g.op("VPAND Y4, Y8, Y8")
		g.op("VPAND Y4, Y9, Y9")
		g.op("VPERM2I128 $0x20, Y9, Y8, Y10") // sub-block 2jj: low nibbles, high nibbles
		g.op("VPERM2I128 $0x31, Y9, Y8, Y11") // sub-block 2jj+1
		for h, idx := range []string{"Y10", "Y11"} {
			j := 2*jj + h
			g.op("VPSHUFB %s, Y5, Y12", idx) // k
			g.op("VPABSB Y12, Y13")
			g.op("VPSHUFB ktShuf<>+%d(SB), Y6, Y7", 32*j)
			for v := range V {
				g.op("VMOVDQU %d(%s)(R14*1), Y14", kbQS+32*j, xGPR[v])
				g.op("VPSIGNB Y12, Y14, Y14")
				g.op("VPMADDUBSW Y14, Y13, Y14")
				g.op("VPMADDWD Y7, Y14, Y14")
				g.op("VPADDD Y14, %s, %s", isum(v), isum(v))
			}
		}
	}
	g.op("VPBROADCASTW (R8)(R13*1), X15")
	g.op("VCVTPH2PS X15, Y15") // d
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", kbD, xGPR[v])
		g.op("VMULPS Y15, Y14, Y14")
		g.op("VFMADD231PS Y14, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(136, loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, nil)
}

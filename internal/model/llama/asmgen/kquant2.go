package main

import "fmt"

// ktileNames are the Go-side names of the K-quant kernels' weight formats,
// in the order of their kind argument (package llama's ktileKinds).
var ktileNames = []string{"Q4K", "Q6K", "Q5K", "Q3K", "Q2K", "IQ4XS"}

// kbBsums is the offset of q8KBlock.bsums ([16]int32, kquant.go).
const kbBsums = 260

// kblock is the layout of a Q4_K or Q5_K block (ggml-common.h block_q4_K,
// block_q5_K: d, dmin, 12 scale bytes at offset 4).
type kblock struct {
	name, typ string
	bytes     int // per block of 256
	qs        int // offset of the nibbles
}

func kBlock(q5 bool) kblock {
	if q5 {
		return kblock{"Q5K", "Q5_K", 176, 48}
	}
	return kblock{"Q4K", "Q4_K", 144, 16}
}

// kquant2Kernels writes the Q5_K, Q3_K and Q2_K kernels.
func (g *gen) kquant2Kernels() {
	for V := 1; V <= 4; V++ {
		g.ktile512(V, true)
		g.ktile3512(V)
		g.ktile2512(V)
	}
	for V := 1; V <= 2; V++ {
		g.ktileAVX2(V, true)
		g.ktile3AVX2(V)
		g.ktile2AVX2(V)
	}
}

// shiftBit moves bit from of every byte of src to bit to (the other bits
// are left for the caller to mask) and returns the register holding the
// result: tmp, or src itself when from = to. Word shifts are enough: the
// bit stays within its byte.
func (g *gen) shiftBit(src, tmp string, from, to int) string {
	switch {
	case from > to:
		g.op("VPSRLW $%d, %s, %s", from-to, src, tmp)
	case from < to:
		g.op("VPSLLW $%d, %s, %s", to-from, src, tmp)
	default:
		return src
	}
	return tmp
}

// q3BiasTable writes q3Bias: 16 bytes of 32, subtracted from Q3_K's 6-bit
// scales.
func (g *gen) q3BiasTable() {
	for i := range 4 {
		fmt.Fprintf(&g.s, "DATA q3Bias<>+%d(SB)/4, $0x20202020\n", 4*i)
	}
	fmt.Fprintf(&g.s, "GLOBL q3Bias<>(SB), RODATA|NOPTR, $16\n")
}

// q3Scales unpacks the 16 six-bit scales of the Q3_K block at
// (R8)(R13*1) into X12 as bytes (0–63), as ggml's dequantize_row_q3_K
// does with kmask1 and kmask2: with u0, u1, u2 the scale bytes 0–3, 4–7,
// 8–11, scales 0–3 are (u0 & 0x0f0f0f0f) | ((u2 & 0x03030303) << 4),
// 4–7 (u1 & 0x0f…) | ((u2 >> 2 & 0x03…) << 4), 8–11 (u0 >> 4 & 0x0f…) |
// ((u2 >> 4 & 0x03…) << 4), 12–15 (u1 >> 4 & 0x0f…) | ((u2 >> 6 &
// 0x03…) << 4). It uses R9–R11, R15 and AX.
func (g *gen) q3Scales() {
	g.op("MOVL 96(R8)(R13*1), R9")   // u0
	g.op("MOVL 100(R8)(R13*1), R10") // u1
	g.op("MOVL 104(R8)(R13*1), R11") // u2
	// R15 = scales 0–7.
	g.op("MOVL R11, AX")
	g.op("ANDL $0x03030303, AX")
	g.op("SHLL $4, AX")
	g.op("MOVL R9, R15")
	g.op("ANDL $0x0f0f0f0f, R15")
	g.op("ORL AX, R15")
	g.op("MOVL R11, AX")
	g.op("SHRL $2, AX")
	g.op("ANDL $0x03030303, AX")
	g.op("SHLQ $36, AX")
	g.op("ORQ AX, R15")
	g.op("MOVL R10, AX")
	g.op("ANDL $0x0f0f0f0f, AX")
	g.op("SHLQ $32, AX")
	g.op("ORQ AX, R15")
	// R9 = scales 8–15.
	g.op("MOVL R11, AX")
	g.op("SHRL $4, AX")
	g.op("ANDL $0x03030303, AX")
	g.op("SHLL $4, AX")
	g.op("SHRL $4, R9")
	g.op("ANDL $0x0f0f0f0f, R9")
	g.op("ORL AX, R9")
	g.op("SHRL $6, R11")
	g.op("ANDL $0x03030303, R11")
	g.op("SHLQ $36, R11")
	g.op("ORQ R11, R9")
	g.op("SHRL $4, R10")
	g.op("ANDL $0x0f0f0f0f, R10")
	g.op("SHLQ $32, R10")
	g.op("ORQ R10, R9")
	g.op("VMOVQ R15, X12")
	g.op("VPINSRQ $1, R9, X12, X12")
}

// ktilePrologue loads a K-quant kernel's arguments: the weight row (R8),
// V activation rows (xGPR), the block count (R12), the next row for
// prefetching (DX, when pf), and zeroes the offsets R13 (weights) and R14
// (activations).
func (g *gen) ktilePrologue(V, blockBytes int, pf bool) {
	g.op("MOVQ a+0(FP), AX")
	g.op("MOVQ %d(AX), R8", ktW)
	for v := range V {
		g.op("MOVQ %d(AX), %s", ktX+8*v, xGPR[v])
	}
	g.op("MOVQ %d(AX), R12", ktNB)
	if pf {
		g.ktilePrefetchSetup(blockBytes)
	}
	g.op("XORQ R13, R13")
	g.op("XORQ R14, R14")
}

// ktileNext advances to the next block and loops.
func (g *gen) ktileNext(blockBytes int, loop string) {
	g.op("ADDQ $%d, R13", blockBytes)
	g.op("ADDQ $%d, R14", kbSize)
	g.op("DECQ R12")
	g.op("JNZ %s", loop)
}

// ktile3512 writes the AVX-512 VNNI Q3_K kernel: one weight row × V Q8_K
// activation rows, in the canonical order of dotQ3KGo. Per chunk of 32
// values the quants plus 4 (0–7: the two low bits from qs, the third from
// hmask) go through VPMADDUBSW with the activation quants, less
// VPMADDUBSW of 4·x — the exact q·x pair sums in int16 (at most 2·7·127)
// — and VPDPWSSD with the scales (less 32, as int16) of the chunk's two
// halves adds sc·(4 products) to each int32 lane, as ktile6512 does.
func (g *gen) ktile3512(V int) {
	name := fmt.Sprintf("ktileQ3KAVX512V%d", V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one Q3_K row × %d Q8_K activation rows", V))
	pf := V <= prefetchMaxV
	g.ktilePrologue(V, 110, pf)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	isum := func(v int) string { return fmt.Sprintf("Y%d", 4+v) }
	// isum2: the odd chunks' lane sums, added to isum at the block's end
	// (exact in int32), so that a block's VPDPWSSD form two chains of four.
	isum2 := func(v int) string { return fmt.Sprintf("Y%d", 8+v) }
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x03030303, R9")
	g.op("VPBROADCASTD R9, Y31")
	g.op("MOVL $0x04040404, R9")
	g.op("VPBROADCASTD R9, Y30")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(110)
	}
	// The 16 scales less 32 as int16: 0–7 in both 128-bit lanes of Y14,
	// 8–15 in both lanes of Y15, for VPSHUFB with q6Shuf.
	g.q3Scales()
	g.op("VPSUBB q3Bias<>(SB), X12, X12")
	g.op("VPMOVSXBW X12, Y12")
	g.op("VPERMQ $0x44, Y12, Y14")
	g.op("VPERMQ $0xee, Y12, Y15")
	g.op("VPBROADCASTW 108(R8)(R13*1), X13")
	g.op("VCVTPH2PS X13, Y13")         // d
	g.op("VMOVDQU64 (R8)(R13*1), Y18") // hmask
	for v := range V {
		g.op("VPXORD %s, %s, %s", isum(v), isum(v), isum(v))
		g.op("VPXORD %s, %s, %s", isum2(v), isum2(v), isum2(v))
	}
	for n := range 2 {
		g.op("VMOVDQU64 %d(R8)(R13*1), Y16", 32+32*n) // qs
		for j := range 4 {
			if j == 0 {
				g.op("VPANDD Y31, Y16, Y19")
			} else {
				g.op("VPSRLW $%d, Y16, Y19", 2*j)
				g.op("VPANDD Y31, Y19, Y19")
			}
			h := g.shiftBit("Y18", "Y20", 4*n+j, 2)
			g.op("VPTERNLOGD $0xf8, Y30, %s, Y19", h) // Y19 |= h & 4: q + 4
			g.op("VPSHUFB q6Shuf<>+%d(SB), %s, Y21", 32*j, []string{"Y14", "Y15"}[n])
			for v := range V {
				off := kbQS + 128*n + 32*j
				g.op("VPMADDUBSW %d(%s)(R14*1), Y19, Y23", off, xGPR[v])
				g.op("VPMADDUBSW %d(%s)(R14*1), Y30, Y24", off, xGPR[v])
				g.op("VPSUBW Y24, Y23, Y23")
				g.op("VPDPWSSD Y23, Y21, %s", []func(int) string{isum, isum2}[j%2](v))
			}
		}
	}
	for v := range V {
		g.op("VPADDD %s, %s, %s", isum2(v), isum(v), isum(v))
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y25", kbD, xGPR[v])
		g.op("VMULPS Y13, Y25, Y26")
		g.op("VFMADD231PS Y26, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(110, loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, nil)
}

// ktile3AVX2 writes the AVX2 Q3_K kernel: one weight row × V (≤ 2) Q8_K
// activation rows, the canonical result of dotQ3KGo as ktile3512
// computes it, with VPMADDWD and VPADDD in place of VPDPWSSD (as
// ktile6AVX2). It prefetches the next row as it goes.
func (g *gen) ktile3AVX2(V int) {
	name := fmt.Sprintf("ktileQ3KAVX2V%d", V)
	g.text(name, fmt.Sprintf("AVX2, one Q3_K row × %d Q8_K activation rows", V))
	g.ktilePrologue(V, 110, true)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y1
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) } // Y2–Y3
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	for _, c := range []struct {
		v   string
		reg int
	}{{"0x03030303", 4}, {"0x04040404", 5}} {
		g.op("MOVL $%s, R9", c.v)
		g.op("VMOVD R9, X%d", c.reg)
		g.op("VPBROADCASTD X%d, Y%d", c.reg, c.reg)
	}
	loop := name + "_loop"
	g.label(loop)
	g.ktilePrefetch(110)
	// Scales less 32 as int16: 0–7 in both lanes of Y6, 8–15 in Y7.
	g.q3Scales()
	g.op("VPSUBB q3Bias<>(SB), X12, X12")
	g.op("VPMOVSXBW X12, Y12")
	g.op("VPERMQ $0x44, Y12, Y6")
	g.op("VPERMQ $0xee, Y12, Y7")
	g.op("VMOVDQU (R8)(R13*1), Y9") // hmask
	for v := range V {
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for n := range 2 {
		g.op("VMOVDQU %d(R8)(R13*1), Y8", 32+32*n) // qs
		for j := range 4 {
			if j == 0 {
				g.op("VPAND Y4, Y8, Y11")
			} else {
				g.op("VPSRLW $%d, Y8, Y11", 2*j)
				g.op("VPAND Y4, Y11, Y11")
			}
			h := g.shiftBit("Y9", "Y10", 4*n+j, 2)
			g.op("VPAND Y5, %s, Y10", h)
			g.op("VPOR Y10, Y11, Y11") // q + 4
			g.op("VPSHUFB q6Shuf<>+%d(SB), %s, Y12", 32*j, []string{"Y6", "Y7"}[n])
			for v := range V {
				off := kbQS + 128*n + 32*j
				g.op("VPMADDUBSW %d(%s)(R14*1), Y11, Y13", off, xGPR[v])
				g.op("VPMADDUBSW %d(%s)(R14*1), Y5, Y14", off, xGPR[v])
				g.op("VPSUBW Y14, Y13, Y13")
				g.op("VPMADDWD Y12, Y13, Y13")
				g.op("VPADDD Y13, %s, %s", isum(v), isum(v))
			}
		}
	}
	g.op("VPBROADCASTW 108(R8)(R13*1), X15")
	g.op("VCVTPH2PS X15, Y15") // d
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", kbD, xGPR[v])
		g.op("VMULPS Y15, Y14, Y14")
		g.op("VFMADD231PS Y14, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(110, loop)
	g.op("MOVQ a+0(FP), AX")
	g.ktileStore(V, acc, nil)
}

// ktile2512 writes the AVX-512 VNNI Q2_K kernel: one weight row × V Q8_K
// activation rows, in the canonical order of dotQ2KGo. Per block the 16
// mins (as int16) meet the activations' 16 sums (q8KBlock.bsums narrowed
// to int16 with VPMOVDW: at most 16·128) in VPMADDWD, giving the 8 lanes'
// m·b pairs, and acc = fma(−(dx·dmin), float(pairs), acc); then per chunk
// of 32 VPMADDUBSW of the 2-bit quants with the activation quants and
// VPDPWSSD with the 4-bit scales of its two halves (as ktile6512), and acc
// = fma(dx·d, float(isum), acc).
func (g *gen) ktile2512(V int) {
	name := fmt.Sprintf("ktileQ2KAVX512V%d", V)
	g.text(name, fmt.Sprintf("AVX-512 VNNI, one Q2_K row × %d Q8_K activation rows", V))
	pf := V <= prefetchMaxV
	g.ktilePrologue(V, 84, pf)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }
	isum := func(v int) string { return fmt.Sprintf("Y%d", 4+v) }
	isum2 := func(v int) string { return fmt.Sprintf("Y%d", 8+v) } // as ktile3512's
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	g.op("MOVL $0x03030303, R9")
	g.op("VPBROADCASTD R9, Y31")
	g.op("MOVL $0x0f0f0f0f, R9")
	g.op("VPBROADCASTD R9, Y30")
	loop := name + "_loop"
	g.label(loop)
	if pf {
		g.ktilePrefetch(84)
	}
	// Scales as int16: 0–7 in both lanes of Y14, 8–15 in both of Y15; the
	// mins as int16 in Y12.
	g.op("VMOVDQU (R8)(R13*1), X12")
	g.op("VPANDD X30, X12, X15")
	g.op("VPMOVZXBW X15, Y15")
	g.op("VPERMQ $0x44, Y15, Y14")
	g.op("VPERMQ $0xee, Y15, Y15")
	g.op("VPSRLW $4, X12, X12")
	g.op("VPANDD X30, X12, X12")
	g.op("VPMOVZXBW X12, Y12")
	g.op("VPBROADCASTW 80(R8)(R13*1), X13")
	g.op("VCVTPH2PS X13, Y13") // d
	g.op("VPBROADCASTW 82(R8)(R13*1), X28")
	g.op("VCVTPH2PS X28, Y28") // dmin
	for v := range V {
		g.op("VMOVDQU32 %d(%s)(R14*1), Z24", kbBsums, xGPR[v])
		g.op("VPMOVDW Z24, Y24")
		g.op("VPMADDWD Y24, Y12, Y24")
		g.op("VCVTDQ2PS Y24, Y24")
		g.op("VBROADCASTSS %d(%s)(R14*1), Y25", kbD, xGPR[v])
		g.op("VMULPS Y28, Y25, Y26") // dx·dmin
		g.op("VFNMADD231PS Y26, Y24, %s", acc(v))
		g.op("VPXORD %s, %s, %s", isum(v), isum(v), isum(v))
		g.op("VPXORD %s, %s, %s", isum2(v), isum2(v), isum2(v))
	}
	for n := range 2 {
		g.op("VMOVDQU64 %d(R8)(R13*1), Y16", 16+32*n) // qs
		for j := range 4 {
			if j == 0 {
				g.op("VPANDD Y31, Y16, Y19")
			} else {
				g.op("VPSRLW $%d, Y16, Y19", 2*j)
				g.op("VPANDD Y31, Y19, Y19")
			}
			g.op("VPSHUFB q6Shuf<>+%d(SB), %s, Y21", 32*j, []string{"Y14", "Y15"}[n])
			for v := range V {
				g.op("VPMADDUBSW %d(%s)(R14*1), Y19, Y23", kbQS+128*n+32*j, xGPR[v])
				g.op("VPDPWSSD Y23, Y21, %s", []func(int) string{isum, isum2}[j%2](v))
			}
		}
	}
	for v := range V {
		g.op("VPADDD %s, %s, %s", isum2(v), isum(v), isum(v))
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y25", kbD, xGPR[v])
		g.op("VMULPS Y13, Y25, Y26")
		g.op("VFMADD231PS Y26, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(84, loop)
	g.ktileStore(V, acc, nil)
}

// ktile2AVX2 writes the AVX2 Q2_K kernel: one weight row × V (≤ 2) Q8_K
// activation rows, the canonical result of dotQ2KGo as ktile2512 computes
// it; the activations' sums are narrowed to int16 with VPACKSSDW (and
// VPERMQ to undo its lane interleave), and VPMADDWD with VPADDD stand in
// for VPDPWSSD. It prefetches the next row as it goes.
func (g *gen) ktile2AVX2(V int) {
	name := fmt.Sprintf("ktileQ2KAVX2V%d", V)
	g.text(name, fmt.Sprintf("AVX2, one Q2_K row × %d Q8_K activation rows", V))
	g.ktilePrologue(V, 84, true)
	acc := func(v int) string { return fmt.Sprintf("Y%d", v) }    // Y0–Y1
	isum := func(v int) string { return fmt.Sprintf("Y%d", 2+v) } // Y2–Y3
	for v := range V {
		g.op("VXORPS %s, %s, %s", acc(v), acc(v), acc(v))
	}
	for _, c := range []struct {
		v   string
		reg int
	}{{"0x03030303", 4}, {"0x0f0f0f0f", 5}} {
		g.op("MOVL $%s, R9", c.v)
		g.op("VMOVD R9, X%d", c.reg)
		g.op("VPBROADCASTD X%d, Y%d", c.reg, c.reg)
	}
	loop := name + "_loop"
	g.label(loop)
	g.ktilePrefetch(84)
	g.op("VMOVDQU (R8)(R13*1), X12")
	g.op("VPAND X5, X12, X13")
	g.op("VPMOVZXBW X13, Y13")
	g.op("VPERMQ $0x44, Y13, Y6") // scales 0–7, both lanes
	g.op("VPERMQ $0xee, Y13, Y7") // scales 8–15
	g.op("VPSRLW $4, X12, X12")
	g.op("VPAND X5, X12, X12")
	g.op("VPMOVZXBW X12, Y9") // mins
	g.op("VPBROADCASTW 82(R8)(R13*1), X15")
	g.op("VCVTPH2PS X15, Y15") // dmin
	for v := range V {
		g.op("VMOVDQU %d(%s)(R14*1), Y12", kbBsums, xGPR[v])
		g.op("VMOVDQU %d(%s)(R14*1), Y13", kbBsums+32, xGPR[v])
		g.op("VPACKSSDW Y13, Y12, Y12")
		g.op("VPERMQ $0xd8, Y12, Y12")
		g.op("VPMADDWD Y9, Y12, Y12")
		g.op("VCVTDQ2PS Y12, Y12")
		g.op("VBROADCASTSS %d(%s)(R14*1), Y13", kbD, xGPR[v])
		g.op("VMULPS Y15, Y13, Y13") // dx·dmin
		g.op("VFNMADD231PS Y13, Y12, %s", acc(v))
		g.op("VPXOR %s, %s, %s", isum(v), isum(v), isum(v))
	}
	for n := range 2 {
		g.op("VMOVDQU %d(R8)(R13*1), Y8", 16+32*n) // qs
		for j := range 4 {
			if j == 0 {
				g.op("VPAND Y4, Y8, Y10")
			} else {
				g.op("VPSRLW $%d, Y8, Y10", 2*j)
				g.op("VPAND Y4, Y10, Y10")
			}
			g.op("VPSHUFB q6Shuf<>+%d(SB), %s, Y11", 32*j, []string{"Y6", "Y7"}[n])
			for v := range V {
				g.op("VPMADDUBSW %d(%s)(R14*1), Y10, Y12", kbQS+128*n+32*j, xGPR[v])
				g.op("VPMADDWD Y11, Y12, Y12")
				g.op("VPADDD Y12, %s, %s", isum(v), isum(v))
			}
		}
	}
	g.op("VPBROADCASTW 80(R8)(R13*1), X15")
	g.op("VCVTPH2PS X15, Y15") // d
	for v := range V {
		g.op("VCVTDQ2PS %s, %s", isum(v), isum(v))
		g.op("VBROADCASTSS %d(%s)(R14*1), Y14", kbD, xGPR[v])
		g.op("VMULPS Y15, Y14, Y14")
		g.op("VFMADD231PS Y14, %s, %s", isum(v), acc(v))
	}
	g.ktileNext(84, loop)
	g.ktileStore(V, acc, nil)
}

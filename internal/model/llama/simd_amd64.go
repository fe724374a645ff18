//go:build amd64 && !purego

package llama

import "golang.org/x/sys/cpu"

// kernelSetFor returns the widest kernel set the CPU and OS support within
// limit (0 pure Go, 1 AVX2, 2 AVX-512): AVX-512 (F and VL; Skylake-SP, Ice
// Lake, Sapphire Rapids, Zen 4 and later), else AVX2 with FMA and F16C
// (Haswell, Zen and later), else nil (pure Go). Options.Kernels sets the limit. The
// integer kernels of the quantized weights use AVX-512 VNNI where the CPU
// has it (with AVX-512 BW), else AVX2.
func kernelSetFor(limit int) *kernelSet {
	// F16C (VCVTPH2PS: every AVX2 CPU has it) widens F16 rows and scales.
	avx2 := cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
	switch {
	case limit >= 2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL:
		ks := &kernelSet{name: "avx512", isa: isaAVX512, rows: 4, vecs: 6,
			tileDT: [4]bool{F32: true, BF16: true, F16: true}, pvDT: [4]bool{F32: true, BF16: true, F16: true},
			pvChunks: []int{4, 1}, pvMasked: true, anyN: true, expTail: true, siluWidth: 16, narrowWidth: 16}
		switch {
		case cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512BW: // Ice Lake, Sapphire Rapids, Zen 4 and later
			ks.qisa, ks.qrows, ks.qvecs, ks.kisa, ks.kvecs, ks.kvecsIQ4XS = isaAVX512, 4, 4, isaAVX512, 4, 8
		case avx2: // Skylake-SP: no VNNI
			ks.qisa, ks.qrows, ks.qvecs, ks.kisa, ks.kvecs, ks.kvecsIQ4XS = isaAVX2, 2, 2, isaAVX2, 2, 2
		}
		return ks
	case limit >= 1 && avx2:
		return &kernelSet{name: "avx2", isa: isaAVX2, rows: 2, vecs: 3,
			tileDT: [4]bool{F32: true, BF16: true, F16: true}, pvDT: [4]bool{F32: true, BF16: true, F16: true},
			pvChunks: []int{1}, siluWidth: 8, narrowWidth: 8, qisa: isaAVX2, qrows: 2, qvecs: 2,
			kisa: isaAVX2, kvecs: 2, kvecsIQ4XS: 2}
	}
	return nil
}

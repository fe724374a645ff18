package llama

import "os"

// kernelLimitFromEnv reads PDSERVE_LLAMA_KERNELS: "go" (0) forces the
// pure-Go kernels, "avx2" (1) allows at most AVX2; anything else, or unset,
// allows every instruction set the CPU has (2).
func kernelLimitFromEnv() int {
	switch os.Getenv("PDSERVE_LLAMA_KERNELS") {
	case "go":
		return 0
	case "avx2":
		return 1
	}
	return 2
}

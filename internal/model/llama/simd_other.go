//go:build !amd64 || purego

package llama

// detectKernels: no assembly on this platform (or in a purego build); the
// pure-Go kernels compute the same results.
func detectKernels() *kernelSet { return nil }

// kernelSetFor returns nil: there are no assembly kernels here.
func kernelSetFor(int) *kernelSet { return nil }

// The kernel calls are never reached: there is no kernel set.

func (ks *kernelSet) tile(DType, int, *tileArgs)  { panic("llama: no assembly kernels") }
func (ks *kernelSet) pv(DType, int, int, *pvArgs) { panic("llama: no assembly kernels") }
func (ks *kernelSet) expSum(*expArgs)             { panic("llama: no assembly kernels") }
func (ks *kernelSet) silu(*siluArgs)              { panic("llama: no assembly kernels") }

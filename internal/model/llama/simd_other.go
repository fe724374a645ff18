//go:build !amd64 || purego

package llama

// kernelSetFor returns nil: there are no assembly kernels on this platform
// (or in a purego build); the pure-Go kernels compute the same results.
func kernelSetFor(int) *kernelSet { return nil }

// The kernel calls are never reached: there is no kernel set.

func (ks *kernelSet) tile(DType, int, *tileArgs)  { panic("llama: no assembly kernels") }
func (ks *kernelSet) pv(DType, int, int, *pvArgs) { panic("llama: no assembly kernels") }
func (ks *kernelSet) expSum(*expArgs)             { panic("llama: no assembly kernels") }
func (ks *kernelSet) silu(*siluArgs)              { panic("llama: no assembly kernels") }
func (ks *kernelSet) narrowF16(*narrowArgs)       { panic("llama: no assembly kernels") }
func (ks *kernelSet) prefetchRows(*prefetchArgs)  { panic("llama: no assembly kernels") }
func (ks *kernelSet) qtile(int, int, *qtileArgs)  { panic("llama: no assembly kernels") }
func (ks *kernelSet) ktile(int, int, *ktileArgs)  { panic("llama: no assembly kernels") }

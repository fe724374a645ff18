//go:build !unix

package kvcache

// newSlab allocates n bytes for a pool's pages on the Go heap (the
// operating system still commits them as they are first written).
func newSlab(n int64) (slab []byte, release func() error, err error) {
	return make([]byte, n), func() error { return nil }, nil
}

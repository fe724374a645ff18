//go:build unix

package kvcache

import "syscall"

// newSlab maps n bytes of anonymous, private memory for a pool's pages,
// outside the Go heap: the operating system commits a page of it only when
// it is first written, and the garbage collector, which does not count it,
// paces itself by the heap the worker really allocates (a 2 GiB pool in the
// heap would let up to 2 GiB of garbage pile up before a collection).
// release unmaps it.
func newSlab(n int64) (slab []byte, release func() error, err error) {
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

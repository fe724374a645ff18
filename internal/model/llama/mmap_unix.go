//go:build unix

package llama

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps the first size bytes of f read-only (mmap(2), MAP_SHARED), so
// weights are paged in from the page cache on first touch and shared by every
// process and model instance that maps the same file. release unmaps them;
// the bytes must not be used afterwards.
func mapFile(f *os.File, size int64) (data []byte, release func() error, err error) {
	if size == 0 {
		return nil, func() error { return nil }, nil
	}
	if int64(int(size)) != size {
		return nil, nil, fmt.Errorf("%s: %d bytes do not fit in this platform's address space", f.Name(), size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

//go:build !unix

package llama

import (
	"fmt"
	"io"
	"os"
)

// mapFile reads the first size bytes of f into memory: the portable fallback
// for platforms without mmap(2). release drops the reference.
func mapFile(f *os.File, size int64) (data []byte, release func() error, err error) {
	if int64(int(size)) != size {
		return nil, nil, fmt.Errorf("%s: %d bytes do not fit in this platform's address space", f.Name(), size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return b, func() error { return nil }, nil
}

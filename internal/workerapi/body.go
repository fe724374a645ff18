package workerapi

import "io"

// ReadSized reads r to its end into a buffer of the announced size n (a
// Content-Length; < 0 or beyond 1 GiB: unknown), allocated once when the
// announcement is right and at most MaxSizedPrealloc, where io.ReadAll
// would grow a buffer from 512 bytes. Beyond MaxSizedPrealloc the buffer
// grows (doubling, up to n) only as the bytes arrive, so a claim of a
// large body that never comes costs no more than MaxSizedPrealloc. A body
// longer than announced is still read whole; one shorter is
// io.ErrUnexpectedEOF, with what it had.
func ReadSized(r io.Reader, n int64) ([]byte, error) {
	if n < 0 || n > 1<<30 {
		return io.ReadAll(r)
	}
	buf := make([]byte, 0, min(n, MaxSizedPrealloc))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= n {
				// Announced size reached: look for more (a longer body).
				var one [1]byte
				switch m, err := r.Read(one[:]); {
				case m == 1:
					more, err := io.ReadAll(r)
					return append(append(buf, one[0]), more...), err
				case err != nil && err != io.EOF:
					return buf, err
				case err == io.EOF:
					return buf, nil
				}
				continue
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), n))
			copy(grown, buf)
			buf = grown
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		switch {
		case err == io.EOF:
			if int64(len(buf)) < n {
				return buf, io.ErrUnexpectedEOF
			}
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
}

// MaxSizedPrealloc bounds the buffer ReadSized allocates for a body's
// announced size before its bytes arrive (1 MiB: a leg of a 128K-token
// prompt, at up to 7 bytes a token id, is under it).
const MaxSizedPrealloc = 1 << 20

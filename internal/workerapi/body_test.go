package workerapi

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadSized: a body of its announced size, longer, shorter (an
// error) or of unknown size is read as it is.
func TestReadSized(t *testing.T) {
	for _, tc := range []struct {
		body    string
		n       int64
		wantErr bool
	}{
		{"hello", 5, false}, {"hello", 3, false}, {"hello", -1, false}, {"", 0, false}, {"", -1, false},
		{"hel", 5, true}, {"", 2, true}, {"x", 1 << 40, false},
	} {
		got, err := ReadSized(strings.NewReader(tc.body), tc.n)
		if (err != nil) != tc.wantErr || string(got) != tc.body {
			t.Errorf("%q announced %d: %q, %v", tc.body, tc.n, got, err)
		}
	}
}

// TestReadSizedClaimCostsNoMoreThanItsBytes: a body announced far larger
// than it is gets a buffer of at most MaxSizedPrealloc, and one truly
// larger than that is read whole as its bytes arrive.
func TestReadSizedClaimCostsNoMoreThanItsBytes(t *testing.T) {
	got, err := ReadSized(strings.NewReader("{"), 64<<20)
	if err != io.ErrUnexpectedEOF || string(got) != "{" {
		t.Fatalf("1 byte announced as 64 MiB: %q, %v; want %q and io.ErrUnexpectedEOF", got, err, "{")
	}
	if c := cap(got); c > MaxSizedPrealloc {
		t.Fatalf("1 byte announced as 64 MiB took a buffer of %d bytes, want at most %d", c, MaxSizedPrealloc)
	}
	big := strings.Repeat("0123456789abcdef", 3*MaxSizedPrealloc/16+5)
	for _, n := range []int64{int64(len(big)), int64(len(big)) - 7, int64(len(big)) + 1} {
		got, err := ReadSized(iotest.HalfReader(strings.NewReader(big)), n)
		if wantErr := n > int64(len(big)); (err != nil) != wantErr || string(got) != big {
			t.Fatalf("%d bytes announced as %d: %d bytes, %v", len(big), n, len(got), err)
		}
	}
}

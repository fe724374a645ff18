package kvxfer

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false,
	"rewrite the valid-* entries of the fuzz seed corpus (testdata/fuzz/FuzzDecodeFrame) from sampleMessages")

const corpusDir = "testdata/fuzz/FuzzDecodeFrame"

// corpusEntry is the file format of a one-[]byte fuzz corpus entry.
func corpusEntry(b []byte) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b)
}

func readCorpusEntry(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	header, body, ok := strings.Cut(strings.TrimSpace(string(raw)), "\n")
	if !ok || header != "go test fuzz v1" || !strings.HasPrefix(body, "[]byte(") || !strings.HasSuffix(body, ")") {
		t.Fatalf("%s: not a one-[]byte corpus entry", path)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(body, "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(s)
}

// TestFuzzCorpus: the checked-in seed corpus follows the wire format of
// this version. Every valid-* entry is a stream of frames that all decode
// (one per sample message, and all of them in one stream), and every bad-*
// entry fails with one of the codec's documented errors. After a change to
// the wire format, regenerate the valid-* entries with
//
//	go test ./internal/kvxfer -run TestFuzzCorpus -rewrite
func TestFuzzCorpus(t *testing.T) {
	if *rewrite {
		old, err := filepath.Glob(filepath.Join(corpusDir, "valid-*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range old {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		var stream []byte
		for i, m := range sampleMessages() {
			f := mustFrame(t, m)
			stream = append(stream, f...)
			name := fmt.Sprintf("valid-%02d-%s", i, m.Type())
			if err := os.WriteFile(filepath.Join(corpusDir, name), corpusEntry(f), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(corpusDir, "valid-stream-all-types"), corpusEntry(stream), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	paths, err := filepath.Glob(filepath.Join(corpusDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var valid, bad int
	for _, p := range paths {
		name := filepath.Base(p)
		data := readCorpusEntry(t, p)
		fr := NewFrameReader(bytes.NewReader(data))
		var frames int
		var readErr error
		for {
			_, _, err := fr.ReadFrame(MaxHandshakeFrameBytes)
			if err == io.EOF {
				break
			}
			if err != nil {
				readErr = err
				break
			}
			frames++
		}
		switch {
		case strings.HasPrefix(name, "valid-"):
			valid++
			if readErr != nil || frames == 0 {
				t.Errorf("%s: %d frames, then %v (regenerate with -rewrite after a wire format change)", name, frames, readErr)
			}
		case strings.HasPrefix(name, "bad-"):
			bad++
			if readErr == nil || !(errors.Is(readErr, io.ErrUnexpectedEOF) || errors.Is(readErr, ErrMalformed) ||
				errors.Is(readErr, ErrFrameTooLarge) || errors.Is(readErr, ErrUnknownType)) {
				t.Errorf("%s: error %v, want a documented codec error", name, readErr)
			}
		default:
			t.Errorf("%s: corpus entries are named valid-* or bad-*", name)
		}
	}
	if want := len(sampleMessages()) + 1; valid != want || bad == 0 {
		t.Errorf("%d valid entries (want %d: one per sample message and the stream) and %d bad ones", valid, want, bad)
	}
}

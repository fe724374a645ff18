package tokenizer

import (
	"path/filepath"
	"testing"
)

// TestLoadMaybeGzipped loads the Llama 3 fixture from its gzipped files and
// the same files decompressed, and both encode alike.
func TestLoadMaybeGzipped(t *testing.T) {
	t.Parallel()
	a, err := LoadMaybeGzipped(filepath.Join("testdata", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadMaybeGzipped(fixtureDir(t, "llama3", nil))
	if err != nil {
		t.Fatal(err)
	}
	x, _ := a.Encode(`{"name": "Ada"}`, false)
	y, _ := b.Encode(`{"name": "Ada"}`, false)
	if len(x) == 0 || len(x) != len(y) || a.VocabSize() != b.VocabSize() {
		t.Fatalf("gzipped %v (%d), plain %v (%d)", x, a.VocabSize(), y, b.VocabSize())
	}
	if _, err := LoadMaybeGzipped(t.TempDir()); err == nil {
		t.Fatal("an empty directory loaded")
	}
}

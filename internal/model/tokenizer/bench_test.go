package tokenizer

import (
	"testing"
)

// longPrompt returns the ~10k-character prompt of the fixtures (prose,
// code, numbers, CJK and emoji).
func longPrompt(b *testing.B, name string) string {
	e := readExpected(b, name)
	s := e.Encode[len(e.Encode)-1].Text
	if len(s) < 10000 {
		b.Fatalf("the last corpus string has %d bytes, want the long prompt", len(s))
	}
	return s
}

// BenchmarkEncodeLongPrompt encodes the long prompt with a warm pre-token
// cache (the common case: words recur across requests).
func BenchmarkEncodeLongPrompt(b *testing.B) {
	for _, name := range models {
		b.Run(name, func(b *testing.B) {
			tok := loadShared(b, name)
			text := longPrompt(b, name)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeLongPromptNoCache encodes the long prompt with the
// pre-token cache disabled: every word goes through BPE.
func BenchmarkEncodeLongPromptNoCache(b *testing.B) {
	for _, name := range models {
		b.Run(name, func(b *testing.B) {
			tok, err := Load(fixtureDir(b, name, nil))
			if err != nil {
				b.Fatal(err)
			}
			tok.model.cache = nil
			text := longPrompt(b, name)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStreamDecode decodes the long prompt's ids one token at a time.
func BenchmarkStreamDecode(b *testing.B) {
	tok := loadShared(b, "llama3")
	ids, err := tok.Encode(longPrompt(b, "llama3"), false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		d := tok.NewDecoder()
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	}
}

// BenchmarkLoad loads the Llama 3 tokenizer (9 MB of tokenizer.json).
func BenchmarkLoad(b *testing.B) {
	dir := fixtureDir(b, "llama3", nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}

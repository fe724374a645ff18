package tokenizer

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

func TestEncodeMatchesTransformers(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadShared(t, name)
			for i, c := range readExpected(t, name).Encode {
				t.Run(caseName(i, c.Text), func(t *testing.T) {
					got, err := tok.Encode(c.Text, false)
					if err != nil {
						t.Fatal(err)
					}
					if !equalIDs(got, c.IDs) {
						t.Errorf("Encode(%q, false): %s", c.Text, firstDiff(tok, got, c.IDs))
					}
					got, err = tok.Encode(c.Text, true)
					if err != nil {
						t.Fatal(err)
					}
					if !equalIDs(got, c.IDsSpecial) {
						t.Errorf("Encode(%q, true): %s", c.Text, firstDiff(tok, got, c.IDsSpecial))
					}
				})
			}
		})
	}
}

func TestDecodeMatchesTransformers(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadShared(t, name)
			e := readExpected(t, name)
			for i, c := range e.Encode {
				if got := tok.Decode(c.IDs); got != c.Decoded {
					t.Errorf("%s: Decode(Encode(%q)) = %q, want %q", caseName(i, c.Text), c.Text, got, c.Decoded)
				}
			}
			for _, c := range e.Decode {
				if got := tok.Decode(c.IDs); got != c.Text {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, got, c.Text)
				}
			}
		})
	}
}

// TestRoundTrip checks decode(encode(s)) == s, after the tokenizer's
// normalizer (Qwen's NFC) for the corpus.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadShared(t, name)
			for i, c := range readExpected(t, name).Encode {
				ids, err := tok.Encode(c.Text, false)
				if err != nil {
					t.Fatal(err)
				}
				want := c.Text
				if tok.norm != nil {
					want = tok.norm.normalize(want)
				}
				if got := tok.Decode(ids); got != want {
					t.Errorf("%s: Decode(Encode(%q)) = %q", caseName(i, c.Text), c.Text, got)
				}
			}
		})
	}
}

// streamAll feeds ids one at a time to a new decoder, checking that every
// piece is whole UTF-8, and returns the text.
func streamAll(t *testing.T, tok *Tokenizer, ids []int32) string {
	t.Helper()
	d := tok.NewDecoder()
	var b strings.Builder
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Errorf("Add(%d) = %q: not valid UTF-8", id, s)
		}
		b.WriteString(s)
	}
	s := d.Flush()
	if !utf8.ValidString(s) {
		t.Errorf("Flush() = %q: not valid UTF-8", s)
	}
	b.WriteString(s)
	if s := d.Flush(); s != "" {
		t.Errorf("second Flush() = %q, want empty", s)
	}
	return b.String()
}

func TestStreamingDecoder(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadShared(t, name)
			e := readExpected(t, name)
			for i, c := range e.Encode {
				if got := streamAll(t, tok, c.IDs); got != c.Decoded {
					t.Errorf("%s: streamed %q, want %q", caseName(i, c.Text), got, c.Decoded)
				}
			}
			for _, c := range e.Decode {
				if got := streamAll(t, tok, c.IDs); got != c.Text {
					t.Errorf("stream %v = %q, want %q", c.IDs, got, c.Text)
				}
			}
		})
	}
}

func TestStreamingDecoderHoldsBackPartialCharacters(t *testing.T) {
	t.Parallel()
	tok := loadShared(t, "llama3")
	alpha := newByteAlphabet()
	byteID := func(b byte) int32 { return tok.model.vocab[string(alpha.toRune[b])] }
	d := tok.NewDecoder()
	globe := []byte("🌍")
	for i, b := range globe[:3] {
		if s := d.Add(byteID(b)); s != "" {
			t.Fatalf("after %d bytes of a 4-byte character, Add = %q, want nothing", i+1, s)
		}
	}
	if s := d.Add(byteID(globe[3])); s != "🌍" {
		t.Fatalf("last byte: Add = %q, want 🌍", s)
	}
	// An incomplete character followed by ASCII: U+FFFD, then the ASCII.
	d.Add(byteID(0xE4))
	if s := d.Add(byteID('a')); s != "\uFFFDa" {
		t.Fatalf("Add after a cut character = %q, want %q", s, "\uFFFDa")
	}
	// Held bytes at the end come out of Flush as one U+FFFD.
	d.Add(byteID(0xF0))
	d.Add(byteID(0x9F))
	if s := d.Flush(); s != "\uFFFD" {
		t.Fatalf("Flush = %q, want U+FFFD", s)
	}
	// Special tokens render as their content; out-of-range ids as nothing.
	if s := d.Add(128009); s != "<|eot_id|>" {
		t.Fatalf("Add(<|eot_id|>) = %q", s)
	}
	if s := d.Add(-1) + d.Add(int32(tok.VocabSize())); s != "" {
		t.Fatalf("out-of-range ids gave %q", s)
	}
}

func TestChatTemplateMatchesTransformers(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadShared(t, name)
			for i, c := range readExpected(t, name).Chat {
				msgs := make([]model.Message, len(c.Messages))
				for j, m := range c.Messages {
					msgs[j] = model.Message{Role: m.Role, Content: m.Content}
				}
				got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{})
				if err != nil {
					t.Errorf("conversation %d: %v", i, err)
					continue
				}
				if got != c.Text {
					t.Errorf("conversation %d:\n got  %q\n want %q", i, got, c.Text)
				}
				ids, err := tok.Encode(got, false)
				if err != nil {
					t.Fatal(err)
				}
				if !equalIDs(ids, c.IDs) {
					t.Errorf("conversation %d ids: %s", i, firstDiff(tok, ids, c.IDs))
				}
			}
		})
	}
}

// TestVariants loads fixtures with parts of tokenizer.json replaced (e.g.
// the TemplateProcessing post-processor of Meta's Llama 3 releases, which
// adds <|begin_of_text|>).
func TestVariants(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		for _, v := range readExpected(t, name).Variants {
			t.Run(name+"/"+v.Name, func(t *testing.T) {
				dir := fixtureDir(t, name, func(m map[string]json.RawMessage) {
					for k, raw := range v.Replace {
						m[k] = raw
					}
				})
				tok, err := Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range v.Encode {
					got, err := tok.Encode(c.Text, false)
					if err != nil {
						t.Fatal(err)
					}
					if !equalIDs(got, c.IDs) {
						t.Errorf("Encode(%q, false): %s", c.Text, firstDiff(tok, got, c.IDs))
					}
					got, _ = tok.Encode(c.Text, true)
					if !equalIDs(got, c.IDsSpecial) {
						t.Errorf("Encode(%q, true): %s", c.Text, firstDiff(tok, got, c.IDsSpecial))
					}
				}
			})
		}
	}
}

func TestAccessors(t *testing.T) {
	t.Parallel()
	llama := loadShared(t, "llama3")
	if got := llama.VocabSize(); got != 128256 {
		t.Errorf("llama3 VocabSize = %d, want 128256", got)
	}
	if id, ok := llama.BOS(); !ok || id != 128000 {
		t.Errorf("llama3 BOS = %d, %v; want 128000, true", id, ok)
	}
	if got := llama.EOS(); !equalIDs(got, []int32{128001}) {
		t.Errorf("llama3 EOS = %v, want [128001]", got)
	}
	for id, want := range map[int32]string{128009: "<|eot_id|>", 1070: "Ġthere", 0: "!", -1: "", 1 << 30: ""} {
		if got := llama.TokenString(id); got != want {
			t.Errorf("llama3 TokenString(%d) = %q, want %q", id, got, want)
		}
	}
	qwen := loadShared(t, "qwen3")
	if got := qwen.VocabSize(); got != 151669 {
		t.Errorf("qwen3 VocabSize = %d, want 151669", got)
	}
	if id, ok := qwen.BOS(); ok {
		t.Errorf("qwen3 BOS = %d, true; want none", id)
	}
	if got := qwen.EOS(); !equalIDs(got, []int32{151645}) {
		t.Errorf("qwen3 EOS = %v, want [151645] (<|im_end|>)", got)
	}
	// EOS is a copy.
	qwen.EOS()[0] = 7
	if got := qwen.EOS(); got[0] != 151645 {
		t.Errorf("EOS returned the tokenizer's own slice")
	}
}

func TestEncodeRejectsInvalidUTF8(t *testing.T) {
	t.Parallel()
	tok := loadShared(t, "llama3")
	_, err := tok.Encode("ok\xffno", false)
	if err == nil || !strings.Contains(err.Error(), "byte 2") {
		t.Fatalf("Encode(invalid UTF-8) error = %v, want one naming byte 2", err)
	}
}

func TestConcurrentEncode(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		tok := loadShared(t, name)
		cases := readExpected(t, name).Encode
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range cases {
					c := cases[(i+g*17)%len(cases)]
					got, err := tok.Encode(c.Text, false)
					if err != nil || !equalIDs(got, c.IDs) {
						t.Errorf("%s: concurrent Encode(%q) differs", name, c.Text)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
}

// TestCacheBounded checks that the pre-token cache never holds more than
// cacheCapacity entries.
func TestCacheBounded(t *testing.T) {
	t.Parallel()
	tok := loadShared(t, "qwen3")
	var b strings.Builder
	for i := 0; i < cacheCapacity+500; i++ {
		b.WriteString(" w")
		for n := i; n > 0; n /= 26 {
			b.WriteByte(byte('a' + n%26))
		}
	}
	text := b.String()
	want, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tok.model.cache); n > cacheCapacity {
		t.Fatalf("cache holds %d entries, more than %d", n, cacheCapacity)
	}
	got, _ := tok.Encode(text, false)
	if !equalIDs(got, want) {
		t.Fatal("second encode (partly cached) differs")
	}
}

// TestLongWords encodes single pre-tokens of tens of thousands of bytes
// (BPE merges are O(n log n) in the word length; a quadratic loop would
// stall here) and checks they round-trip.
func TestLongWords(t *testing.T) {
	t.Parallel()
	for _, name := range models {
		tok := loadShared(t, name)
		for _, s := range []string{
			strings.Repeat("a", 30000), strings.Repeat(" ", 30000), strings.Repeat("ab", 15000),
			strings.Repeat("🚀", 5000), strings.Repeat("1", 30000), strings.Repeat("<|", 5000),
		} {
			ids, err := tok.Encode(s, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Decode(ids); got != s {
				t.Errorf("%s: %q×%d does not round-trip", name, s[:2], len(s))
			}
		}
	}
}

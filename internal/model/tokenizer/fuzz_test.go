package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzEncode checks, for both real tokenizers, that Encode never panics,
// rejects invalid UTF-8, and that for valid UTF-8 without added-token text
// decoding the ids gives the (normalized) input back, whole or streamed.
func FuzzEncode(f *testing.F) {
	for _, name := range models {
		for _, c := range readExpected(f, name).Encode {
			if len(c.Text) < 200 {
				f.Add(c.Text)
			}
		}
	}
	f.Add("\xff\xfe")
	f.Add("<|eot_id|><|im_start|>")
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range models {
			tok := loadShared(t, name)
			ids, err := tok.Encode(s, false)
			if !utf8.ValidString(s) {
				if err == nil {
					t.Fatalf("%s: Encode accepted invalid UTF-8 %q", name, s)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", name, s, err)
			}
			withSpecial, err := tok.Encode(s, true)
			if err != nil || len(withSpecial) != len(ids)+len(tok.prefix)+len(tok.suffix) {
				t.Fatalf("%s: Encode(%q, true) = %v, %v; Encode(…, false) = %v", name, s, withSpecial, err, ids)
			}
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("%s: Encode(%q) gave id %d outside the vocabulary", name, s, id)
				}
			}
			if hasAddedToken(tok, s) {
				continue
			}
			want := s
			if tok.norm != nil {
				want = tok.norm.normalize(s)
			}
			if got := tok.Decode(ids); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", name, s, got)
			}
			d := tok.NewDecoder()
			var b strings.Builder
			for _, id := range ids {
				b.WriteString(d.Add(id))
			}
			b.WriteString(d.Flush())
			if b.String() != want {
				t.Fatalf("%s: streamed decode of Encode(%q) = %q", name, s, b.String())
			}
		}
	})
}

func hasAddedToken(tok *Tokenizer, s string) bool {
	for _, a := range tok.added.tokens {
		if strings.Contains(s, a.Content) {
			return true
		}
	}
	return false
}

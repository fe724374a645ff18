package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// gptRegexes are the patterns that gptPattern replaces.
var gptRegexes = []string{gpt2Regex, llama3Regex, qwen2Regex}

// patternPair is a GPT-2 family regex compiled both ways.
type patternPair struct {
	regex     string
	fast, ref pattern
}

// compiledPairs compiles gptRegexes with compilePattern (the fast
// matcher) and with regexp2 (the reference).
var compiledPairs = sync.OnceValue(func() []patternPair {
	var pairs []patternPair
	for _, regex := range gptRegexes {
		fast, err := compilePattern(nil, &regex)
		if err != nil {
			panic(err)
		}
		if _, ok := fast.(*gptPattern); !ok {
			panic("compilePattern(" + regex + ") is not the fast matcher")
		}
		pairs = append(pairs, patternPair{regex, fast, &regexPattern{re: regexp2.MustCompile(regex, regexp2.None)}})
	}
	return pairs
})

func checkGPTPattern(t testing.TB, s string) {
	t.Helper()
	for _, p := range compiledPairs() {
		regex := p.regex
		got := p.fast.appendMatches(nil, s)
		want := p.ref.appendMatches(nil, s)
		if !slices.Equal(got, want) {
			t.Fatalf("pattern %q on %q:\n got  %v %q\n want %v %q", regex, s, got, pieces(s, got), want, pieces(s, want))
		}
	}
}

func pieces(s string, spans []span) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, s[sp.start:sp.end])
	}
	return out
}

// alphabet holds the characters that tell the alternatives of the GPT-2
// family patterns apart: letters (ASCII, Latin, CJK, long s), numbers (Nd,
// Nl, No), white space (ASCII, NEL, NBSP, Unicode spaces, CR, LF), marks,
// symbols, apostrophes and the letters of contractions in both cases.
var alphabet = []string{
	"a", "Z", "s", "S", "t", "T", "r", "e", "E", "v", "m", "M", "l", "L", "d", "D", "é", "ß", "ſ", "中", "ǅ",
	"1", "7", "٣", "Ⅻ", "½", "²",
	" ", " ", " ", "\t", "\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u2009", "\u3000", "\u2028",
	"'", "'", "'s", "'T", "'re", "'LL", "'ve", "'d", "'M",
	"!", ".", "-", "_", "\"", "(", "😀", "\u0301", "\u200d", "\x00", "\x7f", "€",
}

func TestGPTPatternMatchesRegexp2(t *testing.T) {
	t.Parallel()
	corpus := []string{
		"", "a", " ", "  ", "   x", " \n", "\n ", "a \n\n b", "x  \t\r\n  y", "don't", "DON'T", "it'ſ",
		"12345678", " 123", "a1b22c333d4444", "hello, world!  ", "\u00a0word", "\u3000\u3000x", "'",
		"''s", "'ve'", "... \n", " !!\n\n", "\t!", "é\u0301x", "\u2028\n", "x\u0085y",
	}
	for _, s := range corpus {
		checkGPTPattern(t, s)
	}
	for _, name := range models {
		for _, c := range readExpected(t, name).Encode {
			checkGPTPattern(t, c.Text)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2)) // fixed seed: deterministic
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		for n := rng.IntN(12); n >= 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		checkGPTPattern(t, b.String())
	}
}

// FuzzGPTPattern compares the fast matcher with regexp2 on any valid UTF-8.
func FuzzGPTPattern(f *testing.F) {
	for _, s := range []string{"don't 123 \n\n  x", "A'LL  \t\r\n", "\u00a0\u3000 é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		checkGPTPattern(t, s)
	})
}

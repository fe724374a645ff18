package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// A pattern finds the non-overlapping matches of a Split pre-tokenizer's
// pattern, leftmost first, as Hugging Face tokenizers' Pattern::find_matches
// does (tokenizers/src/tokenizer/pattern.rs).
type pattern interface {
	// appendMatches appends the byte ranges [start, end) of the matches
	// in s, in order. Empty matches are not reported.
	appendMatches(dst []span, s string) []span
}

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// Regular expressions of the GPT-2 family, as written in tokenizer.json
// files. compilePattern recognises them and matches them with gptPattern,
// which is equivalent (checked against regexp2 by TestGPTPatternMatchesRegexp2
// and FuzzGPTPattern) and about ten times faster.
const (
	// gpt2Regex is the pattern of GPT-2, and of ByteLevel with use_regex
	// (tokenizers/src/pre_tokenizers/byte_level.rs).
	gpt2Regex = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// llama3Regex is the pattern of Llama 3 (and of tiktoken's cl100k_base).
	llama3Regex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Regex is the pattern of Qwen2, Qwen2.5 and Qwen3: Llama 3's with
	// single digits.
	qwen2Regex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// compilePattern compiles a Split pattern: {"String": s} matches s literally,
// {"Regex": r} the regular expression r. Hugging Face tokenizers uses
// Oniguruma; this package uses github.com/dlclark/regexp2 (.NET syntax, which
// shares Oniguruma's lookaround, \p{…} classes and Unicode \s) for patterns
// other than the GPT-2 family.
func compilePattern(literal, regex *string) (pattern, error) {
	switch {
	case literal != nil && regex != nil:
		return nil, fmt.Errorf("pattern has both String and Regex")
	case literal != nil:
		if *literal == "" {
			return nil, fmt.Errorf("pattern: empty String")
		}
		return literalPattern(*literal), nil
	case regex != nil:
		switch *regex {
		case gpt2Regex:
			return &gptPattern{}, nil
		case llama3Regex:
			return &gptPattern{llama: true, maxDigits: 3}, nil
		case qwen2Regex:
			return &gptPattern{llama: true, maxDigits: 1}, nil
		}
		re, err := regexp2.Compile(*regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("pattern: regex %q: %v", *regex, err)
		}
		return &regexPattern{re: re}, nil
	}
	return nil, fmt.Errorf("pattern has neither String nor Regex")
}

// literalPattern matches a fixed string.
type literalPattern string

func (p literalPattern) appendMatches(dst []span, s string) []span {
	off := 0
	for {
		i := strings.Index(s[off:], string(p))
		if i < 0 {
			return dst
		}
		dst = append(dst, span{off + i, off + i + len(p)})
		off += i + len(p)
	}
}

// regexPattern matches a regexp2 regular expression.
type regexPattern struct{ re *regexp2.Regexp }

func (p *regexPattern) appendMatches(dst []span, s string) []span {
	m, err := p.re.FindStringMatch(s)
	// regexp2 reports positions in runes; walk s once to turn them into
	// byte offsets.
	bytePos, runePos := 0, 0
	toByte := func(r int) int {
		for runePos < r && bytePos < len(s) {
			_, size := utf8.DecodeRuneInString(s[bytePos:])
			bytePos += size
			runePos++
		}
		return bytePos
	}
	for err == nil && m != nil {
		start := toByte(m.Index)
		end := toByte(m.Index + m.Length)
		if end > start {
			dst = append(dst, span{start, end})
		}
		m, err = p.re.FindNextMatch(m)
	}
	// Without a MatchTimeout, regexp2 returns no errors.
	return dst
}

// Character classes of the GPT-2 family patterns.
const (
	clsOther  = iota // [^\s\p{L}\p{N}]
	clsLetter        // \p{L}
	clsNumber        // \p{N}
	clsSpace         // \s: Unicode White_Space, as in Oniguruma and regexp2
)

// gptPattern matches gpt2Regex (llama false, maxDigits 0), llama3Regex
// (llama, maxDigits 3) or qwen2Regex (llama, maxDigits 1) without a regex
// engine. Each alternative is tried in order at each position, with the
// result a backtracking engine gives:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)   a contraction (case-insensitive if llama)
//	[^\r\n\p{L}\p{N}]?\p{L}+       llama: one optional non-letter, letters
//	 ?\p{L}+                       gpt2: optional space, letters
//	\p{N}{1,maxDigits} |  ?\p{N}+  digits
//	 ?[^\s\p{L}\p{N}]+[\r\n]*      other characters (llama: then newlines)
//	\s*[\r\n]+                     llama: spaces through the last newline
//	\s+(?!\S)                      spaces not followed by a non-space
//	\s+                            spaces
type gptPattern struct {
	llama     bool
	maxDigits int // 0: unbounded
}

// classify returns the character class and size of the rune at s[i:].
func classify(s string, i int) (cls, size int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return int(bmpClasses()[c]), 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	if r <= 0xFFFF {
		return int(bmpClasses()[r]), size
	}
	return classOf(r), size
}

func classOf(r rune) int {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// bmpClasses is the class of every rune of the Basic Multilingual Plane
// (64 KiB, built on first use, read-only after).
var bmpClasses = sync.OnceValue(func() *[0x10000]uint8 {
	t := new([0x10000]uint8)
	for r := range t {
		t[r] = uint8(classOf(rune(r)))
	}
	return t
})

func (p *gptPattern) appendMatches(dst []span, s string) []span {
	for i := 0; i < len(s); {
		end := p.matchAt(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

// matchAt returns the end of the match starting at i (every position of a
// non-empty string starts a match of these patterns).
func (p *gptPattern) matchAt(s string, i int) int {
	if s[i] == '\'' {
		if n := p.contraction(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	cls, size := classify(s, i)
	// Letters.
	if p.llama {
		if cls == clsLetter {
			return runOf(s, i, clsLetter)
		}
		if s[i] != '\r' && s[i] != '\n' && cls != clsNumber && i+size < len(s) {
			if next, _ := classify(s, i+size); next == clsLetter {
				return runOf(s, i+size, clsLetter)
			}
		}
	} else if end, ok := spaceThen(s, i, cls, size, clsLetter); ok {
		return end
	}
	// Digits.
	if p.maxDigits > 0 {
		if cls == clsNumber {
			j, n := i, 0
			for j < len(s) && n < p.maxDigits {
				c, sz := classify(s, j)
				if c != clsNumber {
					break
				}
				j += sz
				n++
			}
			return j
		}
	} else if end, ok := spaceThen(s, i, cls, size, clsNumber); ok {
		return end
	}
	// Other characters.
	if end, ok := spaceThen(s, i, cls, size, clsOther); ok {
		if p.llama {
			for end < len(s) && (s[end] == '\r' || s[end] == '\n') {
				end++
			}
		}
		return end
	}
	// White space: cls == clsSpace here.
	end := runOf(s, i, clsSpace)
	if p.llama {
		// \s*[\r\n]+ takes the spaces through the last newline of the run.
		// (No byte of a multi-byte character is '\r' or '\n'.)
		for j := end - 1; j >= i; j-- {
			if s[j] == '\r' || s[j] == '\n' {
				return j + 1
			}
		}
	}
	// \s+(?!\S): all the spaces if they end the text, else all but the
	// last (if that leaves any); else \s+.
	if end == len(s) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// spaceThen matches " ?X+" at i for the class X: an optional ASCII space and
// then a run of X.
func spaceThen(s string, i, cls, size, want int) (int, bool) {
	if cls == want {
		return runOf(s, i, want), true
	}
	if s[i] == ' ' && i+1 < len(s) {
		if next, _ := classify(s, i+1); next == want {
			return runOf(s, i+1, want), true
		}
	}
	return 0, false
}

// runOf returns the end of the run of characters of class cls from i.
func runOf(s string, i, cls int) int {
	for i < len(s) {
		c, size := classify(s, i)
		if c != cls {
			break
		}
		i += size
	}
	return i
}

// contraction returns the length of the contraction suffix ("s", "t", "re",
// "ve", "m", "ll", "d") that s starts with, or 0. In the llama patterns the
// group is case-insensitive for ASCII letters, as in regexp2 and
// transformers.js; Oniguruma (Hugging Face tokenizers) also folds U+017F
// (long s) to 's', so "'ſ" is one pre-token there and two here.
func (p *gptPattern) contraction(s string) int {
	if s == "" {
		return 0
	}
	fold := func(c byte) byte {
		if p.llama && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch fold(s[0]) {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(s) > 1 && fold(s[1]) == 'e' {
			return 2
		}
	case 'l':
		if len(s) > 1 && fold(s[1]) == 'l' {
			return 2
		}
	}
	return 0
}

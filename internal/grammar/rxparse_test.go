package grammar

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// rxEnds returns the positions j such that r matches s[i:j]: a direct
// reading of the Regex semantics, for tests.
func rxEnds(r *Regex, s string, i int) map[int]bool {
	out := map[int]bool{}
	switch r.Op {
	case OpNone:
	case OpEmpty:
		out[i] = true
	case OpClass:
		c, n := utf8.DecodeRuneInString(s[i:])
		if n == 0 || c == utf8.RuneError && n == 1 {
			break
		}
		for _, x := range r.Ranges {
			if c >= x.Lo && c <= x.Hi {
				out[i+n] = true
			}
		}
	case OpBytes:
		if i < len(s) {
			for _, x := range r.Ranges {
				if rune(s[i]) >= x.Lo && rune(s[i]) <= x.Hi {
					out[i+1] = true
				}
			}
		}
	case OpConcat:
		cur := map[int]bool{i: true}
		for _, sub := range r.Subs {
			next := map[int]bool{}
			for k := range cur {
				for j := range rxEnds(sub, s, k) {
					next[j] = true
				}
			}
			cur = next
		}
		out = cur
	case OpOr:
		for _, sub := range r.Subs {
			for j := range rxEnds(sub, s, i) {
				out[j] = true
			}
		}
	case OpAnd:
		for j := range rxEnds(r.Subs[0], s, i) {
			out[j] = true
		}
		for _, sub := range r.Subs[1:] {
			e := rxEnds(sub, s, i)
			for j := range out {
				if !e[j] {
					delete(out, j)
				}
			}
		}
	case OpNot:
		e := rxEnds(r.Subs[0], s, i)
		for j := i; j <= len(s); j++ {
			if !e[j] {
				out[j] = true
			}
		}
	case OpRepeat:
		cur := map[int]bool{i: true}
		seen := map[int]bool{}
		for k := 0; r.Max < 0 || k <= r.Max; k++ {
			if k >= r.Min {
				grew := false
				for j := range cur {
					if !out[j] {
						out[j] = true
						grew = true
					}
				}
				if r.Max < 0 && !grew && k > r.Min {
					break
				}
			}
			if len(cur) == 0 {
				break
			}
			next := map[int]bool{}
			for j := range cur {
				for e := range rxEnds(r.Subs[0], s, j) {
					if e > j || !seen[e] {
						next[e] = true
					}
				}
			}
			for j := range cur {
				seen[j] = true
			}
			cur = next
		}
	}
	return out
}

// rxMatches reports whether r matches all of s.
func rxMatches(r *Regex, s string) bool { return rxEnds(r, s, 0)[len(s)] }

func TestParseRegexMatches(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{`abc`, []string{"abc"}, []string{"", "ab", "abcd", "xabc"}},
		{`^abc$`, []string{"abc"}, []string{"abcabc", "ab"}},
		{`a|bc|`, []string{"a", "bc", ""}, []string{"b", "abc"}},
		{`a*b+c?`, []string{"b", "aabbb", "bc", "abc"}, []string{"", "ac", "bcc"}},
		{`a{2}`, []string{"aa"}, []string{"a", "aaa"}},
		{`a{2,}`, []string{"aa", "aaaaa"}, []string{"a"}},
		{`a{1,3}?b`, []string{"ab", "aaab"}, []string{"b", "aaaab"}},
		{`a*?b+?c??`, []string{"b", "aabc"}, []string{"acc"}},
		{`a{`, []string{"a{"}, []string{"a"}},
		{`a{,3}`, []string{"a{,3}"}, []string{"aaa"}},
		{`a{1,x}`, []string{"a{1,x}"}, []string{"a"}},
		{`x}]`, []string{"x}]"}, nil},
		{`\d\D\w\W`, []string{"1aZ!", "9 _-"}, []string{"a1Z!", "11a1", "١aZ!"}},
		{`\s+`, []string{" \t\n\r\v\f", "\u00a0\u2028\u2029\ufeff\u3000\u1680\u2005"}, []string{"x", "\u200b"}},
		{`\S`, []string{"x", "é"}, []string{" ", "\u00a0"}},
		{`\t\n\r\f\v\0`, []string{"\t\n\r\f\v\x00"}, nil},
		{`\x41\u00e9\u{1F600}\uD83D\uDE00`, []string{"Aé😀😀"}, nil},
		{`\cJ\cj`, []string{"\n\n"}, nil},
		{`\/\.\-\*\+\?\(\)\[\]\{\}\|\\\^\$`, []string{`/.-*+?()[]{}|\^$`}, nil},
		{`.`, []string{"a", "é", "😀", "\t"}, []string{"\n", "\r", "\u2028", "\u2029", "", "ab"}},
		{`[abc]`, []string{"a", "c"}, []string{"d", ""}},
		{`[a-cx-z0-9]+`, []string{"abz09"}, []string{"d"}},
		{`[^a-c]`, []string{"d", "\n", "é"}, []string{"a", "b"}},
		{`[]`, nil, []string{"", "a", "]"}},
		{`[^]`, []string{"a", "\n"}, []string{""}},
		{`[a-]`, []string{"a", "-"}, []string{"b"}},
		{`[-a]`, []string{"a", "-"}, []string{"b"}},
		{`[\d.]`, []string{"5", "."}, []string{"a"}},
		{`[\w-]+`, []string{"a-b_c"}, []string{"a b"}},
		{`[\d-z]`, []string{"1", "-", "z"}, []string{"y"}},
		{`[^\d\s]`, []string{"a"}, []string{"1", " "}},
		{`[\D]`, []string{"a"}, []string{"1"}},
		{`[\b]`, []string{"\b"}, []string{"b"}},
		{`[\]\\\-^]`, []string{"]", `\`, "-", "^"}, []string{"a"}},
		{`[\x41-\x43\u00e9]`, []string{"A", "C", "é"}, []string{"D"}},
		{`(a|b)(?:c|d)(?<name>e)`, []string{"ace", "bde"}, []string{"abe"}},
		{`(a(b(c)))*`, []string{"", "abcabc"}, []string{"ab"}},
		{`()`, []string{""}, []string{"a"}},
		{`a(?i:bC[d-e])f`, []string{"aBcdf", "abCEf"}, []string{"ABcdf", "abcdF"}},
		{`(?s:.).`, []string{"\na"}, []string{"a\n"}},
		{`(?i:x(?-i:y)z)`, []string{"XyZ"}, []string{"XYZ"}},
		{`(?is:A.)`, []string{"a\n"}, nil},
		{`\p{Lu}\p{Ll}\p{Nd}`, []string{"Aa1", "Éé٣"}, []string{"aa1", "AA1"}},
		{`\p{L}+`, []string{"héllo", "日本"}, []string{"a1"}},
		{`\p{Letter}\p{General_Category=Number}\p{gc=P}`, []string{"a1!"}, []string{"a1a"}},
		{`\p{Script=Greek}\P{L}`, []string{"α1"}, []string{"a1", "αa"}},
		{`\p{S}\p{Z}\p{N}\p{ASCII}`, []string{"+ 5a"}, []string{"a 5a"}},
		{`[\p{Lu}\d]+`, []string{"A1B"}, []string{"a"}},
		{`[^\P{Lu}]`, []string{"A"}, []string{"a"}},
		{`^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$`, []string{"(888)555-1212", "555-1212"}, []string{"(888)555-1212x", "55-1212"}},
		{`^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$`, []string{"a.b@c.de"}, []string{"a@b", "a@b.c"}},
	}
	for _, tt := range tests {
		r, err := ParseRegex(tt.pattern)
		if err != nil {
			t.Errorf("ParseRegex(%q): %v", tt.pattern, err)
			continue
		}
		for _, s := range tt.yes {
			if !rxMatches(r, s) {
				t.Errorf("ParseRegex(%q) = %v does not match %q", tt.pattern, r, s)
			}
		}
		for _, s := range tt.no {
			if rxMatches(r, s) {
				t.Errorf("ParseRegex(%q) = %v matches %q", tt.pattern, r, s)
			}
		}
	}
}

func TestParsePatternUnanchored(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{`abc`, []string{"abc", "xxabcxx", "\nabc\n"}, []string{"ab", "a\nbc"}},
		{`^abc`, []string{"abc", "abcx\n"}, []string{"xabc"}},
		{`abc$`, []string{"abc", "\nxabc"}, []string{"abcx"}},
		{`^abc$`, []string{"abc"}, []string{"abcabc", "xabc"}},
		{`^a|b$`, []string{"ax", "xb", "ab"}, []string{"xa", "bx"}},
		{`(^a|b)c`, []string{"acx", "xbc"}, []string{"xac"}},
		{`^(a|b)$`, []string{"a", "b"}, []string{"ab", ""}},
		{`^$`, []string{""}, []string{"a", "\n"}},
		{`^`, []string{"", "anything"}, nil},
		{``, []string{"", "x"}, nil},
		{`(^a)?b`, []string{"ab", "xbx", "b"}, []string{"ax"}},
		{`^\d+$`, []string{"123"}, []string{"12a", ""}},
		{`^^a$$`, []string{"a"}, []string{"aa"}},
	}
	for _, tt := range tests {
		r, err := ParsePattern(tt.pattern)
		if err != nil {
			t.Errorf("ParsePattern(%q): %v", tt.pattern, err)
			continue
		}
		for _, s := range tt.yes {
			if !rxMatches(r, s) {
				t.Errorf("ParsePattern(%q) = %v does not match %q", tt.pattern, r, s)
			}
		}
		for _, s := range tt.no {
			if rxMatches(r, s) {
				t.Errorf("ParsePattern(%q) = %v matches %q", tt.pattern, r, s)
			}
		}
	}
}

func TestParseRegexErrors(t *testing.T) {
	tests := []struct {
		pattern     string
		offset      string
		unsupported bool
		msg         string
	}{
		{`a(?=b)`, "offset 1", true, "lookahead (?=…) is not supported"},
		{`a(?!b)`, "offset 1", true, "negative lookahead"},
		{`(?<=a)b`, "offset 0", true, "lookbehind"},
		{`(?<!a)b`, "offset 0", true, "negative lookbehind"},
		{`(a)\1`, "offset 3", true, "backreference"},
		{`(?<n>a)\k<n>`, "offset 7", true, "named backreference"},
		{`a\bc`, "offset 1", true, "word boundary"},
		{`a\B`, "offset 1", true, "non-word-boundary"},
		{`a^b`, "offset 1", true, "^ after the start"},
		{`a$b`, "offset 1", true, "$ before the end"},
		{`x(^a|b)`, "offset 2", true, "^ after the start"},
		{`(^a)+`, "offset 4", true, "repeating a group"},
		{`(?i)a`, "offset 0", true, "group modifier"},
		{`(?m:a)`, "offset 0", true, "multiline"},
		{`(?ii:a)`, "offset 3", false, "repeated"},
		{`\p{Emoji}`, "offset 0", true, "Unicode property"},
		{`\p{scx=Latn}`, "offset 0", true, "Unicode property"},
		{`\01`, "offset 0", true, "octal"},
		{`a{1,10001}`, "offset 1", false, "above 10000"},
		{`a{10001}`, "offset 1", false, "above 10000"},
		{`a{3,2}`, "offset 1", false, "out of order"},
		{`*a`, "offset 0", false, "nothing to repeat"},
		{`a**`, "offset 2", false, "nothing to repeat"},
		{`a{2}{3}`, "offset 4", false, "nothing to repeat"},
		{`{2}`, "offset 0", false, "nothing to repeat"},
		{`^*`, "offset 1", false, "nothing to repeat"},
		{`(ab`, "offset 0", false, "unterminated group"},
		{`ab)`, "offset 2", false, "unmatched )"},
		{`[ab`, "offset 0", false, "unterminated character class"},
		{`[z-a]`, "offset 1", false, "range out of order"},
		{`ab\`, "offset 2", false, "at the end"},
		{`\q`, "offset 0", false, "unknown escape \\q"},
		{`\xZZ`, "offset 0", false, "\\x must be followed"},
		{`\u12`, "offset 0", false, "\\u must be followed"},
		{`\u{110000}`, "offset 0", false, "invalid \\u{…}"},
		{`\c1`, "offset 0", false, "\\c must be followed by a letter"},
		{`(?P<n>a)`, "offset 0", false, "Python"},
		{`日本(`, "offset 2", false, "unterminated group"},
		{strings.Repeat("(", 1001) + strings.Repeat(")", 1001), "offset 1000", false, "nested more than 1000"},
	}
	for _, tt := range tests {
		_, err := ParseRegex(tt.pattern)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("ParseRegex(%q) = %v, want an *Error", tt.pattern, err)
			continue
		}
		if e.Keyword != "regex" || e.Path != tt.offset || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("ParseRegex(%q) = %#v, want keyword regex, path %q, msg containing %q", tt.pattern, e, tt.offset, tt.msg)
		}
		if got := errors.Is(err, ErrUnsupported); got != tt.unsupported {
			t.Errorf("ParseRegex(%q): errors.Is(ErrUnsupported) = %v, want %v", tt.pattern, got, tt.unsupported)
		}
		if _, err := ParsePattern(tt.pattern); err == nil || err.(*Error).Keyword != "pattern" {
			t.Errorf("ParsePattern(%q) = %v, want an error with keyword pattern", tt.pattern, err)
		}
	}
}

func TestParseRegexExactMessage(t *testing.T) {
	_, err := ParsePattern(`foo(?=bar)`)
	want := "grammar: pattern: at offset 3: lookahead (?=…) is not supported"
	if err == nil || err.Error() != want {
		t.Fatalf("ParsePattern error = %v, want %q", err, want)
	}
}

// TestParseRegexAgainstRE2 compares, on random strings, patterns in the
// subset where ECMA-262 and Go's regexp agree.
func TestParseRegexAgainstRE2(t *testing.T) {
	patterns := []string{
		`(a|ab)(c|bcd)(d*)`, `a*b*a*`, `(a+|b)*`, `(ab|a)(bc|c)?`, `[a-c]{2,3}d?`,
		`(?:a|b){0,2}c*`, `a(b|c)*d+`, `([^a]b)+|a`, `\d+(\.\d*)?`, `[\w]{1,2}\W?`,
		`((a)|b)+c{1}`, `a?a?a?aaa`, `(a*)*b`, `(a|b|)+`, `[^\d]x|\dy`,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("abcdxy1.- ")
	for _, p := range patterns {
		r, err := ParseRegex(p)
		if err != nil {
			t.Fatalf("ParseRegex(%q): %v", p, err)
		}
		re := regexp.MustCompile(`^(?:` + p + `)$`)
		for range 300 {
			b := make([]byte, rng.IntN(7))
			for i := range b {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
			if got, want := rxMatches(r, string(b)), re.MatchString(string(b)); got != want {
				t.Errorf("pattern %q on %q: got %v, regexp says %v", p, b, got, want)
			}
		}
	}
}

func TestParseRegexCaseFold(t *testing.T) {
	n, err := parseRx(`[a-c]x\u00e9[^k]`, rxOptions{keyword: "lark", fold: true})
	if err != nil {
		t.Fatal(err)
	}
	r := n.m[0][0]
	for _, s := range []string{"AXÉz", "bxéZ", "cXé1"} {
		if !rxMatches(r, s) {
			t.Errorf("%v does not match %q", r, s)
		}
	}
	for _, s := range []string{"dxéz", "axek", "axéK", "axé\u212a"} {
		if rxMatches(r, s) {
			t.Errorf("%v matches %q", r, s)
		}
	}
	n, err = parseRx(`a.b`, rxOptions{keyword: "lark", dotAll: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rxMatches(n.m[0][0], "a\nb") {
		t.Errorf("with the s flag, . does not match a newline")
	}
}

// TestRegexThroughMatcher runs regexes through Compile and the matcher.
func TestRegexThroughMatcher(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{`^\d{3}-\d{4}$`, []string{"555-1212"}, []string{"5551212", "555-12123"}},
		{`(cat|dog)s?`, []string{"cat", "dogs"}, []string{"cats!", "bird"}},
		{`[\p{L}_][\p{L}\p{Nd}_]*`, []string{"été_2", "名前"}, []string{"2x", ""}},
		{`\s*\S+\s*`, []string{"\u3000x\u2028"}, []string{" ", "a b"}},
	}
	for _, tt := range tests {
		g, err := Compile(Spec{Kind: KindRegex, Source: tt.pattern})
		if err != nil {
			t.Fatalf("%q: %v", tt.pattern, err)
		}
		checkTexts(t, tt.pattern, g, tt.yes, tt.no)
	}
	r, err := ParsePattern(`^[a-z]+@|\.com$`)
	if err != nil {
		t.Fatal(err)
	}
	var b Builder
	s := b.NewRule("s")
	b.AddAlt(s, T(r))
	g, err := b.Grammar(s)
	if err != nil {
		t.Fatal(err)
	}
	checkTexts(t, "pattern", g, []string{"ab@x", "x\n.com", "a@.com"}, []string{"1a@", "x.comx"})
}

// FuzzParseRegex: any pattern gives a Regex or an *Error, never a panic.
func FuzzParseRegex(f *testing.F) {
	for _, s := range []string{`^a(b|c)*$`, `[\d-z]{2,3}?`, `\p{Lu}+(?i:x)`, `a{`, `(?<n>.)\u{1F600}`, `[^\s\S]`, `\cJ\x41`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, parse := range []func(string) (*Regex, error){ParseRegex, ParsePattern} {
			r, err := parse(s)
			if err != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("%q: error %v is not an *Error", s, err)
				}
				continue
			}
			if r == nil {
				t.Fatalf("%q: nil Regex without an error", s)
			}
		}
	})
}

func BenchmarkParsePattern(b *testing.B) {
	const email = `^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$`
	for b.Loop() {
		if _, err := ParsePattern(email); err != nil {
			b.Fatal(err)
		}
	}
}

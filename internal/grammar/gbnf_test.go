package grammar

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// checkTexts compiles nothing: it runs yes and no through g with the real
// matcher.
func checkTexts(t *testing.T, name string, g *Grammar, yes, no []string) {
	t.Helper()
	for _, s := range yes {
		ok, err := MatchString(g, s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !ok {
			t.Errorf("%s rejects %q", name, s)
		}
	}
	for _, s := range no {
		if ok, _ := MatchString(g, s); ok {
			t.Errorf("%s accepts %q", name, s)
		}
	}
}

// TestCompileGBNFExamples runs llama.cpp's example grammars
// (testdata/gbnf, from llama.cpp's grammars/ directory).
func TestCompileGBNFExamples(t *testing.T) {
	tests := []struct {
		file    string
		yes, no []string
	}{
		{"json.gbnf",
			[]string{`{}`, `{"a":1}`, `{ "a": [1, 2.5, -3e5, "x\n", true, null, {}], "b\"": {"c": false} }`, "{\n  \"k\": \"\\u00e9\"\n}", `{"é😀":"日本"}`},
			[]string{``, `[]`, `{"a"}`, `{"a":01}`, `{"a":"x` + "\n" + `"}`, `{"a":1,}`, `{'a':1}`, `{"a":"\x"}`}},
		{"json_arr.gbnf",
			[]string{"[\n]", "[\n{\"a\": 1},\n2]", "[\n \"x\"]"},
			[]string{"[]", "[\n] ", "[\n1,2]"}},
		{"chess.gbnf",
			[]string{"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8#\n12. e8=Q+ O-O\n"},
			[]string{"1. e4 e5\n", "1. e4\n2. d4 d5\n", "1. e9 e5\n2. Nf3 Nc6\n", "1. e4 e5\n0. Nf3 Nc6\n"}},
		{"arithmetic.gbnf",
			[]string{"1+2= 3\n", "(a +b) *c = x\n1=1\n", "x_1 /7 = (y)\n"},
			[]string{"1+2=3", "+1=2\n", "A=1\n", "1=2+3\n", "a + b=1\n"}},
		{"list.gbnf",
			[]string{"- milk\n", "- eggs\n- bread and butter\n"},
			[]string{"", "-\n", "- a\r\n", "- a\u2028b\n", "* a\n"}},
		{"name_age.gbnf", // llama.cpp's README: a JSON schema converted to GBNF
			[]string{nameAgeList(10, "Ann", "42"), nameAgeList(100, "B\\u00e9\\n", "150"), "[\n  " + nameAgeList(10, "x", "0")[1:]},
			[]string{nameAgeList(9, "Ann", "42"), nameAgeList(101, "Ann", "42"), nameAgeList(10, "Ann", "151"), nameAgeList(10, "", "1"), nameAgeList(10, strings.Repeat("n", 101), "1")}},
		{"japanese.gbnf",
			[]string{"こんにちは", "カタカナ 日本語\n漢字、"},
			[]string{"", "abc", "こんにちは ", "日本  語"}},
	}
	for _, tt := range tests {
		src, err := os.ReadFile("testdata/gbnf/" + tt.file)
		if err != nil {
			t.Fatal(err)
		}
		g, err := CompileGBNF(string(src))
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		checkTexts(t, tt.file, g, tt.yes, tt.no)
	}
}

func TestCompileGBNFSyntax(t *testing.T) {
	tests := []struct {
		src     string
		yes, no []string
	}{
		// Escapes in literals and classes.
		{`root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]"`, []string{"Aé😀\t\n\r\\\"[]"}, []string{"A"}},
		{`root ::= [\x41-\x43\]\[\\] [^a-z\n]`, []string{"AZ", "]1", "[é", `\!`}, []string{"Da", "Aa", "A\n"}},
		{`root ::= [a-] [-a]`, []string{"--", "aa"}, []string{"b-"}},
		// . is any code point, newlines included.
		{`root ::= "<" . ">"`, []string{"<a>", "<\n>", "<😀>"}, []string{"<>", "<ab>"}},
		// Repetitions: of a char, of a literal (as a whole), of a group.
		{`root ::= "ab"* "c"+ "d"?`, []string{"c", "ababccd"}, []string{"aabc", "", "abd"}},
		{`root ::= "a"{3}`, []string{"aaa"}, []string{"aa", "aaaa"}},
		{`root ::= "a"{2,}`, []string{"aa", "aaaaaaa"}, []string{"a"}},
		{`root ::= "a"{0,2} "b"`, []string{"b", "ab", "aab"}, []string{"aaab"}},
		{`root ::= ("x" | "yz"){ 1 , 3 }`, []string{"x", "yzx", "xxx"}, []string{"", "xxxx"}},
		{`root ::= "a"{0} "b"`, []string{"b"}, []string{"ab"}},
		{`root ::= "a"{1} "b"{0,}`, []string{"a", "abbb"}, []string{"b"}},
		{`root ::= "a"** "b"`, []string{"b", "aab"}, nil},
		// Empty literal, empty alternative, empty group.
		{`root ::= "" "a" | `, []string{"a", ""}, []string{"aa"}},
		{`root ::= () "a"`, []string{"a"}, nil},
		// Comments, newlines in parentheses and after |, CRLF line ends.
		{"# header\nroot ::= ( # open\n  \"a\"\n  | \"b\" # alt\n) x # tail\n\nx ::= \"c\" |\n  \"d\"\n", []string{"ac", "bd"}, []string{"a", "cd"}},
		{"root ::= a\r\na ::= \"x\"\r\n", []string{"x"}, nil},
		// Rule names with dashes, digits, underscores; use before definition.
		{"root ::= rule-1 rule_2\nrule-1 ::= \"1\"\nrule_2 ::= \"2\"", []string{"12"}, []string{"1"}},
		// Left and right recursion.
		{"root ::= root \"a\" | \"b\"", []string{"b", "baaa"}, []string{"ab"}},
		{"root ::= \"(\" root \")\" | ", []string{"", "((()))"}, []string{"(()"}},
	}
	for _, tt := range tests {
		g, err := CompileGBNF(tt.src)
		if err != nil {
			t.Errorf("CompileGBNF(%q): %v", tt.src, err)
			continue
		}
		checkTexts(t, tt.src, g, tt.yes, tt.no)
	}
}

func TestCompileGBNFErrors(t *testing.T) {
	tests := []struct {
		src         string
		path, msg   string
		unsupported bool
	}{
		{"root ::= a b\na ::= \"x\"\n", "1:12", `undefined rule "b"`, false},
		{"a ::= \"x\"\n", "", "no root rule", false},
		{"root ::= a\n\nb ::= \"y\" c", "1:10", `undefined rule "a"`, false},
		{"root ::= \"a\"\nroot ::= \"b\"", "2:1", "defined twice", false},
		{"root ::= \"abc", "1:10", "unterminated string", false},
		{"root ::= [abc", "1:10", "unterminated character class", false},
		{"root ::= [z-a]", "1:11", "range out of order", false},
		{"root ::= \"\\q\"", "1:11", `unknown escape \q`, false},
		{"root ::= \"\\x4\"", "1:11", `\x needs 2 hex digits`, false},
		{"root ::= \"a\"\n  \"b\"", "2:3", "expected a rule name", false},
		{"root = \"a\"", "1:6", "expected ::=", false},
		{"root ::= (\"a\"", "1:10", "unclosed (", false},
		{"root ::= (\"a\" ]", "1:15", "expected )", false},
		{"root ::= \"a\")", "1:13", "unmatched )", false},
		{"root ::= * \"a\"", "1:10", "nothing before it", false},
		{"root ::= \"a\"{x}", "1:14", "expected a number", false},
		{"root ::= \"a\"{1,2", "1:17", "expected } to close the { at 1:13", false},
		{"root ::= \"a\"{3,2}", "1:13", "below the minimum", false},
		{"root ::= \"a\"{0,10001}", "1:13", "above 10000", false},
		{"root ::= <think> \"a\"", "1:10", "token matches", true},
		{"root ::= " + strings.Repeat("(", 1001) + strings.Repeat(")", 1001), "1:1010", "nested more than 1000", false},
		{"root ::= !<[12]>*", "1:10", "token matches", true},
		{"root ::= \"日本\" ?? b", "1:18", `undefined rule "b"`, false},
	}
	for _, tt := range tests {
		_, err := CompileGBNF(tt.src)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("CompileGBNF(%q) = %v, want an *Error", tt.src, err)
			continue
		}
		if e.Keyword != "gbnf" || e.Path != tt.path || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("CompileGBNF(%q) = %q, want gbnf at %q with %q", tt.src, err, tt.path, tt.msg)
		}
		if errors.Is(err, ErrUnsupported) != tt.unsupported {
			t.Errorf("CompileGBNF(%q): errors.Is(ErrUnsupported) = %v", tt.src, !tt.unsupported)
		}
	}
}

// TestCompileGBNFSingleCharLexemes: every terminal is one code point, so
// greedy lexing cannot cut a text differently from the grammar (here a
// literal that is a prefix of a class run).
func TestCompileGBNFSingleCharLexemes(t *testing.T) {
	g, err := CompileGBNF(`root ::= [a-z]* "ab" [a-z]*`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range g.Rules {
		for _, a := range r.Alts {
			for _, s := range a {
				if s.Lex != nil && (s.Lex.Op != OpClass) {
					t.Errorf("rule %s has the lexeme %v, not a single code point", r.Name, s.Lex)
				}
			}
		}
	}
	checkTexts(t, "class*ab class*", g, []string{"ab", "xxabyy", "abab"}, []string{"a", "xyz"})
}

// TestCompileGBNFLargeRepeat: a {2,10000} repetition compiles to a grammar
// logarithmic in its count, and runs in time about linear in the text.
func TestCompileGBNFLargeRepeat(t *testing.T) {
	g, err := CompileGBNF(`root ::= [0-9]{2,10000} "."`)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(g.Rules); n > 100 {
		t.Errorf("%d rules for a count of 10000", n)
	}
	checkTexts(t, "{2,10000}", g, []string{"12.", strings.Repeat("7", 10000) + "."}, []string{"1.", strings.Repeat("7", 10001) + "."})
}

// TestRepeatSymsCounts checks every count range up to 20 (and a few large
// ones) against the lengths it must accept.
func TestRepeatSymsCounts(t *testing.T) {
	type span struct{ min, max int }
	var spans []span
	for min := 0; min <= 9; min++ {
		for max := min; max <= 20; max++ {
			spans = append(spans, span{min, max})
		}
		spans = append(spans, span{min, -1})
	}
	spans = append(spans, span{0, 100}, span{37, 64}, span{9, 99})
	for _, sp := range spans {
		var b Builder
		root := b.NewRule("root")
		syms := repeatSyms(&b, func() int { return b.NewRule("h") }, []Sym{T(Lit("a")), T(Lit("b"))}, sp.min, sp.max)
		b.AddAlt(root, append(syms, T(Lit(".")))...)
		g, err := b.Grammar(root)
		if err != nil {
			t.Fatal(err)
		}
		limit := sp.max + 2
		if sp.max < 0 {
			limit = sp.min + 4
		}
		for n := 0; n <= limit; n++ {
			want := n >= sp.min && (sp.max < 0 || n <= sp.max)
			got, err := MatchString(g, strings.Repeat("ab", n)+".")
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("{%d,%d}: %d repetitions: got %v, want %v", sp.min, sp.max, n, got, want)
			}
		}
	}
}

// FuzzCompileGBNF: any text gives a Grammar or an *Error, never a panic.
func FuzzCompileGBNF(f *testing.F) {
	for _, name := range []string{"json.gbnf", "chess.gbnf", "arithmetic.gbnf"} {
		src, err := os.ReadFile("testdata/gbnf/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	f.Add("root ::= (\"a\" | [^b-c]){2,5} x\nx ::= .*")
	f.Fuzz(func(t *testing.T, src string) {
		g, err := CompileGBNF(src)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		if g == nil || g.Rules[g.Start].Name != "root" {
			t.Fatalf("grammar without its root rule")
		}
	})
}

// nameAgeList is a JSON array of n {"name": name, "age": age} objects.
func nameAgeList(n int, name, age string) string {
	items := make([]string, n)
	for i := range items {
		items[i] = `{"name": "` + name + `", "age": ` + age + `}`
	}
	return "[" + strings.Join(items, ", ") + "]"
}

func BenchmarkCompileGBNFJSON(b *testing.B) {
	src, err := os.ReadFile("testdata/gbnf/json.gbnf")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := CompileGBNF(string(src)); err != nil {
			b.Fatal(err)
		}
	}
}

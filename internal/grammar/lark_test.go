package grammar

import (
	"errors"
	"strings"
	"testing"
)

// larkCalc is lark-parser's calculator example.
const larkCalc = `
?start: sum
?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub
?product: atom
    | product "*" atom  -> mul
    | product "/" atom  -> div
?atom: NUMBER           -> number
     | "-" atom         -> neg
     | NAME             -> var
     | "(" sum ")"

%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
`

// larkJSON is lark-parser's JSON example.
const larkJSON = `
?start: value
?value: object
      | array
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null

array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value

string : ESCAPED_STRING

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
`

func TestCompileLarkExamples(t *testing.T) {
	tests := []struct {
		name, src string
		yes, no   []string
	}{
		{"calc", larkCalc,
			[]string{"1", "1 + 2*3", "  -(a1 - 2.5e3) / x_y ", "a*b*c+d"},
			[]string{"", "1 +", "1 2", "(1", "1 ** 2", "1\n+2"}},
		{"json", larkJSON,
			[]string{`{}`, `[1, -2.5, "a\"b", true, null, {"k": [false]}]`, "\n{ \"a\" :\t1 }\n", `-1e5`},
			[]string{`{,}`, `[1,]`, `{"a"}`, `tru`, `"a` + "\n" + `b"`, `nulls`}},
		{"llguidance JSON_STRING", `
start: "q(" JSON_STRING ")"
JSON_CHAR: /(\\([\"\\\/bfnrt]|u[a-fA-F0-9]{4})|[^\"\\\x00-\x1F\x7F])/
JSON_STRING: "\"" JSON_CHAR* "\""
`,
			[]string{`q("")`, `q("a\n\u00e9 \"x\"")`, `q("日本")`},
			[]string{`q("a)`, `q("\q")`, `q ("")`, "q(\"\x01\")"}},
	}
	for _, tt := range tests {
		g, err := CompileLark(tt.src)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		checkTexts(t, tt.name, g, tt.yes, tt.no)
	}
}

func TestCompileLarkSyntax(t *testing.T) {
	tests := []struct {
		src     string
		yes, no []string
	}{
		// Terminals built from terminals, ranges and operators.
		{"start: SIGNED\nSIGNED: (\"+\"|\"-\")? INT\nINT: DIGIT+\nDIGIT: \"0\"..\"9\"", []string{"7", "-12", "+0"}, []string{"", "-", "1-"}},
		// Terminals are lexemes: greedy, with no skip inside.
		{"start: NAME NAME\nNAME: /[a-z]+/\n%ignore \" \"", []string{"ab cd", " ab  cd "}, []string{"abcd", "ab"}},
		// A rule over single characters is not a lexeme: skip between.
		{"start: name\nname: LETTER+\n%import common.LETTER\n%ignore \" \"", []string{"abc", "a b c"}, []string{""}},
		// String escapes (Lark's: unknown ones keep their backslash), i suffix.
		{`start: "a\tb\x41\u00e9\d" "select"i`, []string{"a\tbAé\\dSeLeCt", "a\tbAé\\dselect"}, []string{"a\tbAé\\dselec"}},
		// Python's named groups.
		{`start: /(?P<x>a|b)+/`, []string{"abba"}, []string{"c"}},
		// Regex flags.
		{`start: /ab[c-d]/i /x.y/s /^m$/`, []string{"ABdx\nym", "abCx.ym"}, []string{"abex.ym"}},
		// Repetitions: ~ n, ~ n..m, {n}, {n,}, {,m}, [ ].
		{`start: "a" ~ 2 "b" ~ 1..2 "c"{2} "d"{1,} "e"{,1} ["f"]`, []string{"aabccd", "aabbccdddef"}, []string{"abccd", "aabbbccd", "aabccdee"}},
		{"START: \"x\" ~ 2..3\nstart: START", []string{"xx", "xxx"}, []string{"x", "xxxx"}},
		// Newlines: inside brackets, before |; comments of both kinds.
		{"start: ( \"a\"\n   \"b\" ) // c1\n     | \"c\" # c2\n\n     | [\n \"d\" ]\n", []string{"ab", "c", "d", ""}, []string{"a"}},
		// Several %ignore make one Skip; empty alternatives; underscores, dashes.
		{"start: _item+\n_item: \"x\" | \n%ignore WS\n%ignore /#[^\\n]*/\n%import common (WS)", []string{"x x # c\n x", "", "#only"}, []string{"y"}},
		{"start: my-rule\nmy-rule: \"z\"", []string{"z"}, nil},
		// !rule and aliases are accepted.
		{"!start: \"a\" -> foo\n  | b->bar\nb: \"b\"", []string{"a", "b"}, nil},
		// Left and right recursion.
		{"start: start \"a\" | \"b\"", []string{"b", "baaa"}, []string{"ab"}},
	}
	for _, tt := range tests {
		g, err := CompileLark(tt.src)
		if err != nil {
			t.Errorf("CompileLark(%q): %v", tt.src, err)
			continue
		}
		checkTexts(t, tt.src, g, tt.yes, tt.no)
	}
}

// TestCompileLarkSkip: %ignore becomes the Grammar's Skip, several as
// alternatives.
func TestCompileLarkSkip(t *testing.T) {
	g, err := CompileLark("start: \"a\"\n%ignore \" \"\n%ignore \"\\t\"")
	if err != nil {
		t.Fatal(err)
	}
	if g.Skip == nil || !rxMatches(g.Skip, " ") || !rxMatches(g.Skip, "\t") || rxMatches(g.Skip, "x") {
		t.Errorf("Skip = %v, want \" \" | \"\\t\"", g.Skip)
	}
	g, err = CompileLark(`start: "a"`)
	if err != nil {
		t.Fatal(err)
	}
	if g.Skip != nil {
		t.Errorf("Skip = %v without %%ignore", g.Skip)
	}
}

func TestCompileLarkErrors(t *testing.T) {
	tests := []struct {
		src         string
		path, msg   string
		unsupported bool
	}{
		{`a: "x"`, "", "no start rule", false},
		{"start: a b\na: \"x\"", "1:10", "undefined rule b", false},
		{"start: A\n", "1:8", "undefined terminal A", false},
		{"start: A\nA: \"x\" A", "2:8", "terminal A is recursive", false},
		{"start: A\nA: \"x\" b\nb: \"y\"", "2:8", "cannot use the rule b", false},
		{"start: \"a\"\nstart: \"b\"", "2:1", "defined twice", false},
		{"start: \"abc", "1:8", "unterminated string", false},
		{"start: /abc", "1:8", "unterminated regex", false},
		{"start: /a(?=b)/", "1:10", "lookahead", true},
		{"start: \"a\"\nX: /a{3,2}/", "2:6", "out of order", false},
		{"start: /a/x", "1:11", "flag x", true},
		{`start: /"a*?"/`, "1:12", "lazy quantifier", true},
		{"start.2: \"a\"", "1:6", "priority", true},
		{"start: A\nA.2: \"a\"", "2:2", "priority", true},
		{"start{x}: \"a\"", "1:6", "template", true},
		{"start[lazy]: /.*/", "1:6", "lexeme option", true},
		{"start: %json {\"type\": \"object\"}", "1:8", "%json", true},
		{"%llguidance {}\nstart: \"a\"", "1:1", "%llguidance", true},
		{"start: <|eot|> \"a\"", "1:8", "special token", true},
		{"start: @sub", "1:8", "grammar reference", true},
		{"start: A\nA: /a*/ & ~/aa/", "2:9", "intersection", true},
		{"%import python (NAME)\nstart: NAME", "1:9", "%import from python", true},
		{"%import common.NOPE\nstart: \"a\"", "1:16", "common.NOPE", false},
		{"%declare X\nstart: \"a\"", "1:1", "%declare", true},
		{"start: \"a\" ~ 3..2", "1:12", "below the minimum", false},
		{"start: \"a\" ~ 10001", "1:14", "above 10000", false},
		{"start: \"a\" )", "1:12", "expected the end of the line", false},
		{"start: (\"a\"", "1:12", "expected ), found the end of the line", false},
		{"start: \"a\" $", "1:12", "unexpected character", false},
		{"start: \"ab\"..\"z\"", "1:8", "single characters", false},
		{"start: " + strings.Repeat("[", 1001) + strings.Repeat("]", 1001), "1:1008", "nested more than 1000", false},
	}
	for _, tt := range tests {
		_, err := CompileLark(tt.src)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("CompileLark(%q) = %v, want an *Error", tt.src, err)
			continue
		}
		if e.Keyword != "lark" || e.Path != tt.path || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("CompileLark(%q) = %q, want lark at %q with %q", tt.src, err, tt.path, tt.msg)
		}
		if errors.Is(err, ErrUnsupported) != tt.unsupported {
			t.Errorf("CompileLark(%q): errors.Is(ErrUnsupported) = %v", tt.src, !tt.unsupported)
		}
	}
}

// TestCompileLarkCommon compiles every common terminal and checks a few.
func TestCompileLarkCommon(t *testing.T) {
	tests := map[string]struct{ yes, no []string }{
		"WS":             {[]string{" \t\r\n\f"}, []string{"", "x"}},
		"NEWLINE":        {[]string{"\n", "\r\n\n"}, []string{"\r", ""}},
		"INT":            {[]string{"0", "123"}, []string{"-1", "1.0"}},
		"SIGNED_INT":     {[]string{"-1", "+2", "3"}, []string{"--1"}},
		"DECIMAL":        {[]string{"1.", ".5", "1.5"}, []string{"1", "."}},
		"FLOAT":          {[]string{"1e5", "1.5E-3", ".5"}, []string{"1", "e5"}},
		"NUMBER":         {[]string{"1", "1.5", "2e10"}, []string{"-1", ""}},
		"SIGNED_NUMBER":  {[]string{"-1", "+1.5e3"}, []string{"+-1"}},
		"ESCAPED_STRING": {[]string{`""`, `"a\"b"`, `"\\"`}, []string{`"a`, `"\"`, "\"a\nb\""}},
		"CNAME":          {[]string{"_a1", "Foo"}, []string{"1a", ""}},
		"WORD":           {[]string{"abc"}, []string{"ab1"}},
		"HEXDIGIT":       {[]string{"f", "A", "0"}, []string{"g"}},
		"C_COMMENT":      {[]string{"/* a */", "/***/", "/* * / */"}, []string{"/* a */ */", "/*/"}},
		"CPP_COMMENT":    {[]string{"// x"}, []string{"// x\n"}},
	}
	for name := range larkCommon {
		g, err := CompileLark("start: " + name + "\n%import common." + name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if tt, ok := tests[name]; ok {
			checkTexts(t, name, g, tt.yes, tt.no)
		}
	}
}

// FuzzCompileLark: any text gives a Grammar or an *Error, never a panic.
func FuzzCompileLark(f *testing.F) {
	f.Add(larkCalc)
	f.Add(larkJSON)
	f.Add("start: A ~ 2..3 [b]\nb: /x+/i | \"y\"{,2}\nA: \"a\"..\"c\"\n%ignore \" \"")
	f.Fuzz(func(t *testing.T, src string) {
		g, err := CompileLark(src)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		if g == nil || g.Rules[g.Start].Name != "start" {
			t.Fatalf("grammar without its start rule")
		}
	})
}

func BenchmarkCompileLarkJSON(b *testing.B) {
	for b.Loop() {
		if _, err := CompileLark(larkJSON); err != nil {
			b.Fatal(err)
		}
	}
}

package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/internal/grammar"
)

// countingCompile stands in for grammar.Compile: every spec compiles, and
// the specs it saw are recorded.
type countingCompile struct{ seen []grammar.Spec }

func (c *countingCompile) compile(s grammar.Spec) (*grammar.Grammar, error) {
	c.seen = append(c.seen, s)
	return nil, nil
}

// dialectParser is the test parser whose constraints all compile, so that
// the dialects' conversion is tested apart from the compilers.
func dialectParser() (*parser, *countingCompile) {
	p := testParser()
	cc := &countingCompile{}
	p.compiled = newCompileCache(16)
	p.compiled.compile = cc.compile
	return p, cc
}

const (
	schemaIn  = `{ "type": "object", "properties": { "b": {"type":"integer"}, "a": {"type": "string"} }, "required": ["b"] }`
	schemaOut = `{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}},"required":["b"]}`
)

// TestConstraintDialects: every dialect's field parses to its Spec, on
// both endpoints; schemas are compacted with their key order kept.
func TestConstraintDialects(t *testing.T) {
	schemaStr, _ := json.Marshal(schemaIn)
	json := grammar.Spec{Kind: grammar.KindJSONSchema, Source: schemaOut}
	for _, tc := range []struct {
		name, fields string
		want         grammar.Spec
	}{
		{"response_format text", `"response_format":{"type":"text"}`, grammar.Spec{}},
		{"response_format json_object", `"response_format":{"type":"json_object"}`, grammar.Spec{Kind: grammar.KindJSONObject}},
		{"response_format json_schema", `"response_format":{"type":"json_schema","json_schema":{"name":"Out_1-x","description":"d","strict":true,"schema":` + schemaIn + `}}`, json},
		{"response_format json_schema strict null", `"response_format":{"type":"json_schema","json_schema":{"name":"o","strict":null,"schema":` + schemaIn + `}}`, json},
		{"llama.cpp response_format json_object with schema", `"response_format":{"type":"json_object","schema":` + schemaIn + `}`, json},
		{"structured_outputs json", `"structured_outputs":{"json":` + schemaIn + `}`, json},
		{"structured_outputs json as a string", `"structured_outputs":{"json":` + string(schemaStr) + `}`, json},
		{"structured_outputs json_object", `"structured_outputs":{"json_object":true}`, grammar.Spec{Kind: grammar.KindJSONObject}},
		{"structured_outputs regex", `"structured_outputs":{"regex":"[a-z]+\\d"}`, grammar.Spec{Kind: grammar.KindRegex, Source: `[a-z]+\d`}},
		{"structured_outputs choice", `"structured_outputs":{"choice":["yes","no","<&>"]}`, grammar.Spec{Kind: grammar.KindChoice, Source: `["yes","no","\u003c\u0026\u003e"]`}},
		{"structured_outputs GBNF", `"structured_outputs":{"grammar":"root ::= \"a\" | \"b\""}`, grammar.Spec{Kind: grammar.KindGBNF, Source: `root ::= "a" | "b"`}},
		{"structured_outputs Lark", `"structured_outputs":{"grammar":"start: \"a\" | \"b\""}`, grammar.Spec{Kind: grammar.KindLark, Source: `start: "a" | "b"`}},
		{"structured_outputs other fields null", `"structured_outputs":{"regex":"a","json":null,"choice":null,"json_object":null,"whitespace_pattern":null}`, grammar.Spec{Kind: grammar.KindRegex, Source: "a"}},
		{"structured_outputs json_object false and a regex", `"structured_outputs":{"regex":"a","json_object":false}`, grammar.Spec{Kind: grammar.KindRegex, Source: "a"}},
		{"structured_outputs flexible whitespace", `"structured_outputs":{"json":` + schemaIn + `,"whitespace_pattern":"[ \\t\\n\\r]*"}`,
			grammar.Spec{Kind: grammar.KindJSONSchema, Source: schemaOut, FlexibleWhitespace: true}},
		{"structured_outputs whitespace as characters", `"structured_outputs":{"json_object":true,"whitespace_pattern":"[\r\n\t ]*"}`,
			grammar.Spec{Kind: grammar.KindJSONObject, FlexibleWhitespace: true}},
		{"structured_outputs compact", `"structured_outputs":{"json":` + schemaIn + `,"disable_any_whitespace":true,"disable_fallback":true,"disable_additional_properties":false}`, json},
		{"guided_json", `"guided_json":` + schemaIn, json},
		{"guided_json as a string", `"guided_json":` + string(schemaStr), json},
		{"guided_json flexible", `"guided_json":` + schemaIn + `,"guided_whitespace_pattern":"[\\n\\r\\t ]*","guided_decoding_backend":"xgrammar"`,
			grammar.Spec{Kind: grammar.KindJSONSchema, Source: schemaOut, FlexibleWhitespace: true}},
		{"guided_regex", `"guided_regex":"\\w+@\\w+\\.com"`, grammar.Spec{Kind: grammar.KindRegex, Source: `\w+@\w+\.com`}},
		{"guided_choice", `"guided_choice":["positive","negative"]`, grammar.Spec{Kind: grammar.KindChoice, Source: `["positive","negative"]`}},
		{"guided_grammar GBNF", `"guided_grammar":"root ::= [0-9]+"`, grammar.Spec{Kind: grammar.KindGBNF, Source: `root ::= [0-9]+`}},
		{"guided_grammar Lark", `"guided_grammar":"start: NUMBER\n%import common.NUMBER"`, grammar.Spec{Kind: grammar.KindLark, Source: "start: NUMBER\n%import common.NUMBER"}},
		{"llama.cpp json_schema", `"json_schema":` + schemaIn, json},
		{"llama.cpp grammar", `"grammar":"root ::= \"x\""`, grammar.Spec{Kind: grammar.KindGBNF, Source: `root ::= "x"`}},
		{"llama.cpp grammar is always GBNF", `"grammar":"start: \"x\""`, grammar.Spec{Kind: grammar.KindGBNF, Source: `start: "x"`}},
		{"a whitespace pattern alone", `"guided_whitespace_pattern":"\\s*"`, grammar.Spec{}},
	} {
		for _, ep := range []struct {
			name  string
			parse func(*parser) func(string) (*request, error)
			head  string
		}{
			{"completions", parseCompletionString, `"prompt":"hi"`},
			{"chat", parseChatString, `"messages":[{"role":"user","content":"hi"}]`},
		} {
			t.Run(tc.name+"/"+ep.name, func(t *testing.T) {
				p, cc := dialectParser()
				req, err := ep.parse(p)("{" + ep.head + "," + tc.fields + "}")
				if err != nil {
					t.Fatal(err)
				}
				if req.constraint != tc.want {
					t.Fatalf("constraint = %+v, want %+v", req.constraint, tc.want)
				}
				switch {
				case tc.want.IsZero() && len(cc.seen) != 0:
					t.Fatalf("compiled %+v for no constraint", cc.seen)
				case !tc.want.IsZero() && (len(cc.seen) != 1 || cc.seen[0] != tc.want):
					t.Fatalf("compiled %+v, want the constraint once", cc.seen)
				}
			})
		}
	}
}

// choiceList is a JSON array of n distinct strings.
func choiceList(n int) string {
	list := make([]string, n)
	for i := range list {
		list[i] = fmt.Sprint("c", i)
	}
	b, _ := json.Marshal(list)
	return string(b)
}

// TestChoiceLimit: a list of MaxChoiceList choices is taken.
func TestChoiceLimit(t *testing.T) {
	p, cc := dialectParser()
	if _, err := p.parseCompletion(strings.NewReader(`{"prompt":"hi","guided_choice":` + choiceList(MaxChoiceList) + `}`)); err != nil {
		t.Fatal(err)
	}
	if len(cc.seen) != 1 || cc.seen[0].Source != choiceList(MaxChoiceList) {
		t.Fatalf("compiled %d specs", len(cc.seen))
	}
}

// TestConstraintRejects: conflicting constraints, malformed dialects and
// unsupported options are 400s naming the field.
func TestConstraintRejects(t *testing.T) {
	const so = `{"prompt":"hi","structured_outputs":`
	const rf = `{"prompt":"hi","response_format":`
	long := strings.Repeat("x", MaxSchemaNameBytes+1)
	tooMany := choiceList(MaxChoiceList + 1)
	p, _ := dialectParser()
	checkBad(t, parseCompletionString(p), []badCase{
		{"guided_choice too long", `{"prompt":"hi","guided_choice":` + tooMany + `}`, 400, "guided_choice", "at most 4096 choices, got 4097"},
		{"structured_outputs.choice too long", so + `{"choice":` + tooMany + `}}`, 400, "structured_outputs.choice", "at most 4096 choices, got 4097"},
		{"two dialects", `{"prompt":"hi","response_format":{"type":"json_object"},"guided_regex":"a"}`, 400, "guided_regex",
			"response_format and guided_regex both constrain the output: send one"},
		{"vLLM and llama.cpp", `{"prompt":"hi","guided_json":{},"json_schema":{}}`, 400, "json_schema", "guided_json and json_schema both"},
		{"structured_outputs and guided_choice", so + `{"regex":"a"},"guided_choice":["a"]}`, 400, "guided_choice", "structured_outputs.regex and guided_choice both"},
		{"two inside structured_outputs", so + `{"json":{},"regex":"a"}}`, 400, "structured_outputs.regex",
			"structured_outputs.json and structured_outputs.regex both constrain the output"},
		{"json_object and choice", so + `{"json_object":true,"choice":["a"]}}`, 400, "structured_outputs.choice", "structured_outputs.json_object and structured_outputs.choice both"},
		{"structured_outputs empty", so + `{}}`, 400, "structured_outputs", "names no constraint"},
		{"structured_outputs json_object false alone", so + `{"json_object":false}}`, 400, "structured_outputs", "names no constraint"},
		{"structured_outputs not an object", so + `"json"}`, 400, "structured_outputs", "must be an object"},
		{"structured_outputs misspelt", so + `{"jsno":{}}}`, 400, "structured_outputs.jsno", `has no field "jsno"`},
		{"structured_outputs structural_tag", so + `{"structural_tag":"{}"}}`, 400, "structured_outputs.structural_tag", "not supported"},
		{"structured_outputs disable_additional_properties", so + `{"json":{},"disable_additional_properties":true}}`, 400,
			"structured_outputs.disable_additional_properties", "not supported"},
		{"structured_outputs flag not a boolean", so + `{"json":{},"disable_any_whitespace":"yes"}}`, 400, "structured_outputs.disable_any_whitespace", "must be a boolean"},
		{"structured_outputs two whitespace settings", so + `{"json":{},"disable_any_whitespace":true,"whitespace_pattern":"[ \\t\\n\\r]*"}}`, 400,
			"structured_outputs.whitespace_pattern", "both set the whitespace"},
		{"whitespace in two places", so + `{"json":{},"whitespace_pattern":"[ \\t\\n\\r]*"},"guided_whitespace_pattern":"[ \\t\\n\\r]*"}`, 400,
			"guided_whitespace_pattern", "guided_whitespace_pattern and structured_outputs.whitespace_pattern both set the whitespace"},
		{"whitespace pattern not JSON's", `{"prompt":"hi","guided_json":{},"guided_whitespace_pattern":"\\s*"}`, 400, "guided_whitespace_pattern", `"\\s*" is not supported`},
		{"whitespace pattern a subset", `{"prompt":"hi","guided_json":{},"guided_whitespace_pattern":"[\\n\\t ]*"}`, 400, "guided_whitespace_pattern", "not supported"},
		{"whitespace pattern with a regex", so + `{"regex":"a","whitespace_pattern":"[ \\t\\n\\r]*"}}`, 400, "structured_outputs.whitespace_pattern", "applies to JSON constraints only, not to a regex"},
		{"whitespace pattern not a string", `{"prompt":"hi","guided_json":{},"guided_whitespace_pattern":1}`, 400, "guided_whitespace_pattern", "must be a string"},
		{"response_format not an object", rf + `"json_object"}`, 400, "response_format", "must be an object"},
		{"response_format no type", rf + `{}}`, 400, "response_format.type", "must be one of"},
		{"response_format unknown type", rf + `{"type":"xml"}}`, 400, "response_format.type", `got "xml"`},
		{"response_format structural_tag", rf + `{"type":"structural_tag"}}`, 400, "response_format.type", "not supported"},
		{"response_format unknown field", rf + `{"type":"json_object","strict":true}}`, 400, "response_format.strict", `has no field "strict"`},
		{"json_schema missing", rf + `{"type":"json_schema"}}`, 400, "response_format.json_schema", "required"},
		{"json_schema on json_object", rf + `{"type":"json_object","json_schema":{"name":"a"}}}`, 400, "response_format.json_schema", `not "json_object"`},
		{"schema on json_schema", rf + `{"type":"json_schema","schema":{}}}`, 400, "response_format.schema", `not "json_schema"`},
		{"json_schema name missing", rf + `{"type":"json_schema","json_schema":{"schema":{}}}}`, 400, "response_format.json_schema.name", "required"},
		{"json_schema name with a space", rf + `{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}}`, 400, "response_format.json_schema.name", "a-z, A-Z, 0-9, _ and -"},
		{"json_schema name too long", rf + `{"type":"json_schema","json_schema":{"name":"` + long + `","schema":{}}}}`, 400, "response_format.json_schema.name", "1 to 64 characters"},
		{"json_schema name empty", rf + `{"type":"json_schema","json_schema":{"name":"","schema":{}}}}`, 400, "response_format.json_schema.name", "1 to 64"},
		{"json_schema schema missing", rf + `{"type":"json_schema","json_schema":{"name":"a"}}}`, 400, "response_format.json_schema.schema", "required"},
		{"json_schema schema an array", rf + `{"type":"json_schema","json_schema":{"name":"a","schema":[]}}}`, 400, "response_format.json_schema.schema", "must be a JSON Schema object, got array"},
		{"json_schema schema a string", rf + `{"type":"json_schema","json_schema":{"name":"a","schema":"{}"}}}`, 400, "response_format.json_schema.schema", "got string"},
		{"json_schema strict a string", rf + `{"type":"json_schema","json_schema":{"name":"a","schema":{},"strict":"yes"}}}`, 400, "response_format.json_schema.strict", "must be a boolean"},
		{"json_schema unknown field", rf + `{"type":"json_schema","json_schema":{"name":"a","schema":{},"schemas":{}}}}`, 400, "response_format.json_schema.schemas", "has no field"},
		{"guided_json a number", `{"prompt":"hi","guided_json":3}`, 400, "guided_json", "must be a JSON Schema object, got number"},
		{"guided_json a string without JSON", `{"prompt":"hi","guided_json":"{type: object}"}`, 400, "guided_json", "does not hold valid JSON"},
		{"guided_json a string holding an array", `{"prompt":"hi","guided_json":"[1]"}`, 400, "guided_json", "must be a JSON Schema object"},
		{"guided_regex a number", `{"prompt":"hi","guided_regex":5}`, 400, "guided_regex", "must be a string"},
		{"guided_choice empty", `{"prompt":"hi","guided_choice":[]}`, 400, "guided_choice", "at least one string"},
		{"guided_choice null", `{"prompt":"hi","guided_choice":["a",null]}`, 400, "guided_choice", "guided_choice[1] must be a string, got null"},
		{"guided_choice a string", `{"prompt":"hi","guided_choice":"a"}`, 400, "guided_choice", "must be an array of strings"},
		{"guided_grammar an object", `{"prompt":"hi","guided_grammar":{}}`, 400, "guided_grammar", "must be a string"},
		{"grammar an array", `{"prompt":"hi","grammar":["root ::= \"a\""]}`, 400, "grammar", "must be a string (a GBNF grammar)"},
		{"llama.cpp json_schema a string", `{"prompt":"hi","json_schema":"{}"}`, 400, "json_schema", "must be a JSON Schema object"},
		{"invalid UTF-8 in a regex", "{\"prompt\":\"hi\",\"guided_regex\":\"a\xff\"}", 400, "guided_regex", "not valid UTF-8"},
	})
	noTok, _ := dialectParser()
	noTok.tok = nil
	checkBad(t, parseCompletionString(noTok), []badCase{
		{"no tokenizer", `{"prompt":[1,2],"guided_choice":["a"]}`, 400, "guided_choice", "no tokenizer"},
	})
}

// TestConstraintCompileErrors: a constraint the compiler refuses is a 400
// naming the field that holds it and the compiler's keyword, position and
// reason; a feature the engine lacks carries code unsupported_parameter.
func TestConstraintCompileErrors(t *testing.T) {
	checkBad(t, parseCompletionString(testParser()), []badCase{
		{"lookbehind", `{"prompt":"hi","guided_regex":"(?<=a)b"}`, 400, "guided_regex",
			`guided_regex cannot be applied: "regex" at offset 0 — lookbehind (?<=…) is not supported`},
		{"unbalanced regex", `{"prompt":"hi","structured_outputs":{"regex":"(a"}}`, 400, "structured_outputs.regex", `structured_outputs.regex cannot be applied: "regex" at offset`},
		{"GBNF undefined rule", `{"prompt":"hi","guided_grammar":"root ::= \"a\"\nitem ::= root other"}`, 400, "guided_grammar",
			`guided_grammar cannot be applied: "gbnf" at 2:`},
		{"llama.cpp grammar read as GBNF", `{"prompt":"hi","grammar":"start: \"a\""}`, 400, "grammar", `grammar cannot be applied: "gbnf" at 1:`},
		{"Lark undefined rule", `{"prompt":"hi","structured_outputs":{"grammar":"start: item"}}`, 400, "structured_outputs.grammar",
			`structured_outputs.grammar cannot be applied: "lark" at 1:8 — undefined rule item`},
		{"huge choice", `{"prompt":"hi","guided_choice":["` + strings.Repeat("a", grammar.MaxSourceBytes) + `"]}`, 400, "guided_choice", "more than the limit"},
		// Constraints that compile but match no text (grammar.Grammar.Validate).
		{"empty class", `{"prompt":"hi","guided_regex":"[^\\s\\S]"}`, 400, "guided_regex", "guided_regex cannot be applied: the grammar matches no text"},
		{"endless rule", `{"prompt":"hi","guided_grammar":"root ::= root \"a\""}`, 400, "guided_grammar", "guided_grammar cannot be applied: the grammar matches no text"},
		{"minimum above maximum", `{"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"number","minimum":5,"maximum":1}}}}`,
			400, "response_format.json_schema.schema", "response_format.json_schema.schema cannot be applied: the grammar matches no text"},
		{"uuid in 10 characters", `{"prompt":"hi","structured_outputs":{"json":{"type":"string","format":"uuid","maxLength":10}}}`,
			400, "structured_outputs.json", "structured_outputs.json cannot be applied: the grammar matches no text"},
	})
	for _, tc := range []struct {
		body        string
		param, code string
	}{
		{`{"prompt":"hi","guided_regex":"(?<=a)b"}`, "guided_regex", CodeUnsupported},
		{`{"prompt":"hi","guided_regex":"(a"}`, "guided_regex", ""},
	} {
		_, err := testParser().parseCompletion(strings.NewReader(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Param != tc.param || e.Code != tc.code || e.Type != TypeInvalidRequest {
			t.Errorf("%s: %#v, want param %q code %q", tc.body, err, tc.param, tc.code)
		}
	}
}

// TestConstraintReachesEngine: the engine's request carries the constraint
// of a chat and of a completion request, and a refused one answers the
// OpenAI error body.
func TestConstraintReachesEngine(t *testing.T) {
	eng := newFakeEngine(chunksOf("yes", 3, "stop")...)
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"hi","guided_choice":["yes","no"]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	want := grammar.Spec{Kind: grammar.KindChoice, Source: `["yes","no"]`}
	if got := eng.lastReq(t).Constraint; got != want {
		t.Fatalf("engine got %+v, want %+v", got, want)
	}
	resp, body = post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"structured_outputs":{"regex":"(?!x)y"}}`)
	if resp.StatusCode != 400 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var eb struct {
		Error struct {
			Message, Type string
			Param, Code   *string
		}
	}
	if err := json.Unmarshal([]byte(body), &eb); err != nil {
		t.Fatal(err)
	}
	e := eb.Error
	if e.Type != TypeInvalidRequest || e.Param == nil || *e.Param != "structured_outputs.regex" || e.Code == nil || *e.Code != CodeUnsupported ||
		!strings.Contains(e.Message, "negative lookahead") {
		t.Fatalf("error body %s", body)
	}
}

// TestCompileCache: a constraint is compiled once however often it comes,
// failures included; the least recently used outcome goes first once the
// cache is full.
func TestCompileCache(t *testing.T) {
	calls := map[string]int{}
	bad := errors.New("bad")
	c := newCompileCache(2)
	c.compile = func(s grammar.Spec) (*grammar.Grammar, error) {
		calls[s.Source]++
		if s.Source == "bad" {
			return nil, bad
		}
		return nil, nil
	}
	spec := func(src string) grammar.Spec { return grammar.Spec{Kind: grammar.KindRegex, Source: src} }
	for range 3 {
		if err := c.check(spec("a")); err != nil {
			t.Fatal(err)
		}
		if err := c.check(spec("bad")); err != bad {
			t.Fatalf("bad: %v", err)
		}
	}
	if calls["a"] != 1 || calls["bad"] != 1 || c.len() != 2 {
		t.Fatalf("calls %v, %d held", calls, c.len())
	}
	// Touching "a" leaves "bad" the least recently used: "c" evicts it.
	_ = c.check(spec("a"))
	_ = c.check(spec("c"))
	_ = c.check(spec("a"))
	if calls["a"] != 1 || calls["c"] != 1 || c.len() != 2 {
		t.Fatalf("calls %v, %d held", calls, c.len())
	}
	_ = c.check(spec("bad"))
	if calls["bad"] != 2 {
		t.Fatalf("bad was not evicted: calls %v", calls)
	}
	// FlexibleWhitespace is part of the key.
	_ = c.check(grammar.Spec{Kind: grammar.KindRegex, Source: "bad", FlexibleWhitespace: true})
	if calls["bad"] != 3 {
		t.Fatalf("calls %v", calls)
	}
}

// TestIsJSONWhitespace: the spellings of JSON's whitespace pattern.
func TestIsJSONWhitespace(t *testing.T) {
	for pat, want := range map[string]bool{
		`[ \t\n\r]*`: true, "[ \t\n\r]*": true, `[\r\n\t ]*`: true, `[\ \t\n\r]*`: true,
		`[ \t\n]*`: false, `[ \t\n\r]+`: false, `[ \t\n\t]*`: false, `\s*`: false, `[ \t\n\r\f]*`: false, ``: false, `[ \t\n\r]`: false,
	} {
		if got := isJSONWhitespace(pat); got != want {
			t.Errorf("isJSONWhitespace(%q) = %v, want %v", pat, got, want)
		}
	}
}

// TestConstraintCompiles: valid constraints of every text dialect pass the
// real compilers, and the front end's cache holds each once.
func TestConstraintCompiles(t *testing.T) {
	p := testParser()
	p.compiled = newCompileCache(DefaultCompileCacheEntries)
	fields := []string{
		`"guided_regex":"[0-9]{3}-[a-z]+"`,
		`"structured_outputs":{"choice":["red","green"]}`,
		`"guided_grammar":"root ::= item (\",\" item)*\nitem ::= [a-z]+"`,
		`"structured_outputs":{"grammar":"start: item (\",\" item)*\nitem: /[a-z]+/"}`,
		`"grammar":"root ::= \"yes\" | \"no\""`,
	}
	for range 2 {
		for _, f := range fields {
			if _, err := p.parseCompletion(strings.NewReader(`{"prompt":"hi",` + f + `}`)); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
	if n := p.compiled.len(); n != len(fields) {
		t.Fatalf("the cache holds %d outcomes, want %d", n, len(fields))
	}
}

// TestCompileCacheConcurrent: requests check constraints at once (run with
// -race); each gets its own spec's outcome, and the cache stays bounded.
func TestCompileCacheConcurrent(t *testing.T) {
	c := newCompileCache(4)
	bad := errors.New("bad")
	c.compile = func(s grammar.Spec) (*grammar.Grammar, error) {
		if strings.HasPrefix(s.Source, "bad") {
			return nil, bad
		}
		return nil, nil
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				src := fmt.Sprintf("ok%d", (g+i)%6)
				if i%3 == 0 {
					src = fmt.Sprintf("bad%d", (g+i)%6)
				}
				if err := c.check(grammar.Spec{Kind: grammar.KindRegex, Source: src}); (err == bad) != strings.HasPrefix(src, "bad") {
					errs <- fmt.Sprintf("%s: %v", src, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := c.len(); n > 4 {
		t.Fatalf("%d outcomes held, bound 4", n)
	}
}

// TestAnyPropertyOrderOption: with APIOptions.AnyPropertyOrder the JSON
// dialects compile with members in any order; the others are unchanged.
func TestAnyPropertyOrderOption(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`, true},
		{`{"prompt":"hi","response_format":{"type":"json_object"}}`, true},
		{`{"prompt":"hi","guided_regex":"a+"}`, false},
	} {
		for _, anyOrder := range []bool{false, true} {
			p, _ := dialectParser()
			p.anyOrder = anyOrder
			req, err := p.parseCompletion(strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := req.constraint.AnyPropertyOrder; got != (anyOrder && c.want) {
				t.Errorf("%s with the option %v: AnyPropertyOrder %v", c.body, anyOrder, got)
			}
		}
	}
}

package openai

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/pdserve/pdserve/internal/grammar"
)

// This file turns the structured-output fields of every dialect a client
// may bring into one grammar.Spec:
//
//   - OpenAI's response_format: {"type":"text"} (none), {"type":"json_object"}
//     and {"type":"json_schema","json_schema":{"name","description","schema","strict"}};
//     llama.cpp's server also takes {"type":"json_object","schema":{…}}.
//   - vLLM's structured_outputs {json, regex, choice, grammar, json_object,
//     whitespace_pattern, disable_any_whitespace, disable_additional_properties,
//     disable_fallback, structural_tag} and the older guided_json,
//     guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern
//     and guided_decoding_backend.
//   - llama.cpp's grammar (GBNF) and json_schema.
//
// A request states at most one constraint; the front end compiles it once
// (compileCache) to refuse a bad one with a 400 naming the field, and sends
// the Spec on; workers compile it again for their vocabulary.

// MaxSchemaNameBytes is the longest response_format.json_schema.name
// (OpenAI's limit, 64 characters of [a-zA-Z0-9_-]).
const MaxSchemaNameBytes = 64

// schemaName is what OpenAI allows in response_format.json_schema.name.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// stated is one constraint found in a request: field names it for
// conflicts, param for compile errors (the field holding the source).
type stated struct {
	field, param string
	spec         grammar.Spec
}

// constraint returns the output constraint w states (the zero Spec if
// none), compiled once to check it. Errors are *Error: 400 naming the field
// at fault, with code unsupported_parameter for what pdserve does not
// implement.
func (p *parser) constraint(w *SamplingFields) (grammar.Spec, error) {
	var found []stated
	add := func(s stated) { found = append(found, s) }
	if !isNull(w.ResponseFormat) {
		s, ok, err := responseFormat(w.ResponseFormat)
		if err != nil {
			return grammar.Spec{}, err
		}
		if ok {
			add(s)
		}
	}
	var ws whitespace
	if !isNull(w.StructuredOutputs) {
		s, sw, err := structuredOutputs(w.StructuredOutputs)
		if err != nil {
			return grammar.Spec{}, err
		}
		add(s)
		ws = sw
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		conv func(name string, raw json.RawMessage) (grammar.Spec, error)
	}{
		{"guided_json", w.GuidedJSON, schemaOrText},
		{"guided_regex", w.GuidedRegex, regexSpec},
		{"guided_choice", w.GuidedChoice, choiceSpec},
		{"guided_grammar", w.GuidedGrammar, grammarSpec},
		{"json_schema", w.JSONSchema, schemaObject},
		{"grammar", w.Grammar, gbnfSpec},
	} {
		if isNull(f.raw) {
			continue
		}
		s, err := f.conv(f.name, f.raw)
		if err != nil {
			return grammar.Spec{}, err
		}
		add(stated{field: f.name, param: f.name, spec: s})
	}
	if !isNull(w.GuidedWhitespacePattern) {
		if ws.field != "" {
			return grammar.Spec{}, BadRequest("guided_whitespace_pattern", "guided_whitespace_pattern and %s both set the whitespace: send one", ws.field)
		}
		var pat string
		if err := json.Unmarshal(w.GuidedWhitespacePattern, &pat); err != nil {
			return grammar.Spec{}, BadRequest("guided_whitespace_pattern", "guided_whitespace_pattern must be a string")
		}
		ws = whitespace{field: "guided_whitespace_pattern", pattern: &pat}
	}
	switch len(found) {
	case 0:
		// A whitespace pattern or a backend alone tunes nothing.
		return grammar.Spec{}, nil
	case 1:
	default:
		return grammar.Spec{}, BadRequest(found[1].field, "%s and %s both constrain the output: send one", found[0].field, found[1].field)
	}
	c := found[0]
	if err := ws.apply(&c.spec); err != nil {
		return grammar.Spec{}, err
	}
	if p.anyOrder && (c.spec.Kind == grammar.KindJSONSchema || c.spec.Kind == grammar.KindJSONObject) {
		c.spec.AnyPropertyOrder = true
	}
	if p.tok == nil {
		return grammar.Spec{}, BadRequest(c.field, "this model has no tokenizer, so %s (structured output) is not available", c.field)
	}
	if err := p.compiled.check(c.spec); err != nil {
		return grammar.Spec{}, compileError(c.param, err)
	}
	return c.spec, nil
}

// constraintFields adds the constraint fields holding text to fields, the
// fields checkUTF8 names when a body is not valid UTF-8 (encoding/json
// would turn a bad byte of a regex or grammar into U+FFFD).
func constraintFields(w *SamplingFields, fields map[string]json.RawMessage) {
	for name, raw := range map[string]json.RawMessage{"response_format": w.ResponseFormat,
		"structured_outputs": w.StructuredOutputs, "guided_json": w.GuidedJSON, "guided_regex": w.GuidedRegex,
		"guided_choice": w.GuidedChoice, "guided_grammar": w.GuidedGrammar,
		"guided_whitespace_pattern": w.GuidedWhitespacePattern, "json_schema": w.JSONSchema, "grammar": w.Grammar} {
		if raw != nil {
			fields[name] = raw
		}
	}
}

// compileError is the 400 for a constraint in param that does not compile.
func compileError(param string, err error) *Error {
	var ge *grammar.Error
	if !errors.As(err, &ge) {
		return BadRequest(param, "%s cannot be applied: %v", param, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s cannot be applied: ", param)
	if ge.Keyword != "" {
		fmt.Fprintf(&b, "%q ", ge.Keyword)
	}
	if ge.Path != "" {
		fmt.Fprintf(&b, "at %s ", ge.Path)
	}
	if ge.Keyword != "" || ge.Path != "" {
		b.WriteString("— ")
	}
	b.WriteString(ge.Msg)
	e := BadRequest(param, "%s", b.String())
	if errors.Is(err, grammar.ErrUnsupported) {
		e.Code = CodeUnsupported
	}
	return e
}

// responseFormat converts response_format; ok is false for {"type":"text"}.
func responseFormat(raw json.RawMessage) (stated, bool, error) {
	const name = "response_format"
	obj, err := object(name, raw, "type", "json_schema", "schema")
	if err != nil {
		return stated{}, false, err
	}
	var typ string
	if err := json.Unmarshal(obj["type"], &typ); err != nil || isNull(obj["type"]) {
		return stated{}, false, BadRequest(name+".type", "response_format.type must be one of \"text\", \"json_object\" or \"json_schema\"")
	}
	if typ != "json_schema" && !isNull(obj["json_schema"]) {
		return stated{}, false, BadRequest(name+".json_schema", "response_format.json_schema goes with type \"json_schema\", not %q", typ)
	}
	if typ != "json_object" && !isNull(obj["schema"]) {
		return stated{}, false, BadRequest(name+".schema", "response_format.schema goes with type \"json_object\" (llama.cpp's form), not %q", typ)
	}
	switch typ {
	case "text":
		return stated{}, false, nil
	case "json_object":
		if !isNull(obj["schema"]) {
			s, err := schemaObject(name+".schema", obj["schema"])
			return stated{field: name, param: name + ".schema", spec: s}, true, err
		}
		return stated{field: name, param: name, spec: grammar.Spec{Kind: grammar.KindJSONObject}}, true, nil
	case "json_schema":
		s, err := jsonSchemaFormat(obj["json_schema"])
		return stated{field: name, param: name + ".json_schema.schema", spec: s}, true, err
	case "structural_tag":
		return stated{}, false, Unsupported(name+".type", "response_format type \"structural_tag\" is not supported")
	}
	return stated{}, false, BadRequest(name+".type", "response_format.type must be one of \"text\", \"json_object\" or \"json_schema\", got %q", typ)
}

// jsonSchemaFormat converts response_format.json_schema.
func jsonSchemaFormat(raw json.RawMessage) (grammar.Spec, error) {
	const name = "response_format.json_schema"
	if isNull(raw) {
		return grammar.Spec{}, BadRequest(name, "%s is required with type \"json_schema\"", name)
	}
	obj, err := object(name, raw, "name", "description", "schema", "strict")
	if err != nil {
		return grammar.Spec{}, err
	}
	var n string
	switch err := json.Unmarshal(obj["name"], &n); {
	case isNull(obj["name"]):
		return grammar.Spec{}, BadRequest(name+".name", "%s.name is required", name)
	case err != nil:
		return grammar.Spec{}, BadRequest(name+".name", "%s.name must be a string", name)
	case len(n) > MaxSchemaNameBytes || !schemaName.MatchString(n):
		return grammar.Spec{}, BadRequest(name+".name", "%s.name must be 1 to %d characters of a-z, A-Z, 0-9, _ and -, got %q", name, MaxSchemaNameBytes, n)
	}
	var desc string
	if err := json.Unmarshal(obj["description"], &desc); err != nil && !isNull(obj["description"]) {
		return grammar.Spec{}, BadRequest(name+".description", "%s.description must be a string", name)
	}
	var strict bool
	if err := json.Unmarshal(obj["strict"], &strict); err != nil && !isNull(obj["strict"]) {
		return grammar.Spec{}, BadRequest(name+".strict", "%s.strict must be a boolean", name)
	}
	if isNull(obj["schema"]) {
		return grammar.Spec{}, BadRequest(name+".schema", "%s.schema is required", name)
	}
	return schemaObject(name+".schema", obj["schema"])
}

// whitespace is a request's whitespace setting for JSON constraints: the
// field it came from ("" for none), and either a pattern or
// disable_any_whitespace.
type whitespace struct {
	field   string
	pattern *string
	compact bool
}

// jsonWhitespace matches the whitespace patterns that mean JSON's own
// whitespace (RFC 8259: space, tab, line feed, carriage return, any number
// of them), written as a character class in any order, with \t \n \r
// escapes or the characters themselves.
var jsonWhitespace = regexp.MustCompile(`^\[(?: |\t|\n|\r|\\t|\\n|\\r|\\ ){4}\]\*$`)

// isJSONWhitespace reports whether pat is a spelling of "[ \t\n\r]*".
func isJSONWhitespace(pat string) bool {
	if !jsonWhitespace.MatchString(pat) {
		return false
	}
	r := strings.NewReplacer(`\t`, "\t", `\n`, "\n", `\r`, "\r", `\ `, " ")
	set := r.Replace(pat[1 : len(pat)-2])
	return len(set) == 4 && strings.Contains(set, " ") && strings.Contains(set, "\t") &&
		strings.Contains(set, "\n") && strings.Contains(set, "\r")
}

// apply sets s's whitespace policy: compact JSON unless a pattern spelling
// JSON's whitespace asks for it between lexemes. Another pattern is
// refused (pdserve's JSON grammars know these two policies only), and so
// is a pattern with a constraint that is not JSON.
func (w whitespace) apply(s *grammar.Spec) error {
	if w.field == "" || w.compact {
		return nil
	}
	if s.Kind != grammar.KindJSONSchema && s.Kind != grammar.KindJSONObject {
		return BadRequest(w.field, "%s applies to JSON constraints only, not to a %s", w.field, s.Kind)
	}
	if !isJSONWhitespace(*w.pattern) {
		return Unsupported(w.field, `%s %q is not supported: JSON is compact (no whitespace outside strings) unless the pattern is JSON's whitespace, "[ \t\n\r]*"`, w.field, *w.pattern)
	}
	s.FlexibleWhitespace = true
	return nil
}

// structuredOutputs converts vLLM's structured_outputs object.
func structuredOutputs(raw json.RawMessage) (stated, whitespace, error) {
	const name = "structured_outputs"
	obj, err := object(name, raw, "json", "regex", "choice", "grammar", "json_object", "structural_tag",
		"whitespace_pattern", "disable_any_whitespace", "disable_additional_properties", "disable_fallback")
	if err != nil {
		return stated{}, whitespace{}, err
	}
	flag := func(key string) (bool, error) {
		var b bool
		if err := json.Unmarshal(obj[key], &b); err != nil && !isNull(obj[key]) {
			return false, BadRequest(name+"."+key, "%s.%s must be a boolean", name, key)
		}
		return b, nil
	}
	var ws whitespace
	compact, err := flag("disable_any_whitespace")
	if err != nil {
		return stated{}, ws, err
	}
	if compact {
		ws = whitespace{field: name + ".disable_any_whitespace", compact: true}
	}
	if !isNull(obj["whitespace_pattern"]) {
		var pat string
		if err := json.Unmarshal(obj["whitespace_pattern"], &pat); err != nil {
			return stated{}, ws, BadRequest(name+".whitespace_pattern", "%s.whitespace_pattern must be a string", name)
		}
		if compact {
			return stated{}, ws, BadRequest(name+".whitespace_pattern", "%s.whitespace_pattern and %s.disable_any_whitespace both set the whitespace: send one", name, name)
		}
		ws = whitespace{field: name + ".whitespace_pattern", pattern: &pat}
	}
	if noAdd, err := flag("disable_additional_properties"); err != nil {
		return stated{}, ws, err
	} else if noAdd {
		return stated{}, ws, Unsupported(name+".disable_additional_properties", "%s.disable_additional_properties is not supported: write \"additionalProperties\": false in the schema", name)
	}
	if _, err := flag("disable_fallback"); err != nil {
		return stated{}, ws, err
	}
	if !isNull(obj["structural_tag"]) {
		return stated{}, ws, Unsupported(name+".structural_tag", "%s.structural_tag is not supported", name)
	}
	jsonObject, err := flag("json_object")
	if err != nil {
		return stated{}, ws, err
	}
	var found []stated
	if jsonObject {
		found = append(found, stated{field: name + ".json_object", param: name + ".json_object",
			spec: grammar.Spec{Kind: grammar.KindJSONObject}})
	}
	for _, f := range []struct {
		key  string
		conv func(name string, raw json.RawMessage) (grammar.Spec, error)
	}{{"json", schemaOrText}, {"regex", regexSpec}, {"choice", choiceSpec}, {"grammar", grammarSpec}} {
		if isNull(obj[f.key]) {
			continue
		}
		field := name + "." + f.key
		s, err := f.conv(field, obj[f.key])
		if err != nil {
			return stated{}, ws, err
		}
		found = append(found, stated{field: field, param: field, spec: s})
	}
	switch len(found) {
	case 0:
		return stated{}, ws, BadRequest(name, "%s names no constraint: give one of json, regex, choice, grammar or json_object", name)
	case 1:
		return found[0], ws, nil
	}
	return stated{}, ws, BadRequest(found[1].field, "%s and %s both constrain the output: send one", found[0].field, found[1].field)
}

// object decodes raw, the value of field name, as a JSON object with the
// given keys only: another key is refused, so that a misspelt option is
// not silently dropped.
func object(name string, raw json.RawMessage, keys ...string) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if firstByte(raw) != '{' || json.Unmarshal(raw, &obj) != nil {
		return nil, BadRequest(name, "%s must be an object", name)
	}
	for k := range obj {
		known := false
		for _, want := range keys {
			known = known || k == want
		}
		if !known {
			return nil, BadRequest(name+"."+k, "%s has no field %q (it takes %s)", name, k, strings.Join(keys, ", "))
		}
	}
	return obj, nil
}

// schemaObject converts a JSON Schema given as an object (compacted: the
// worker's cache key does not depend on the client's indentation).
func schemaObject(name string, raw json.RawMessage) (grammar.Spec, error) {
	if firstByte(raw) != '{' {
		return grammar.Spec{}, BadRequest(name, "%s must be a JSON Schema object, got %s", name, jsonValueKind(string(bytes.TrimSpace(raw))))
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return grammar.Spec{}, BadRequest(name, "%s is not valid JSON: %v", name, err)
	}
	return grammar.Spec{Kind: grammar.KindJSONSchema, Source: b.String()}, nil
}

// schemaOrText converts vLLM's json and guided_json: a schema object, or a
// string holding one.
func schemaOrText(name string, raw json.RawMessage) (grammar.Spec, error) {
	if firstByte(raw) != '"' {
		return schemaObject(name, raw)
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return grammar.Spec{}, BadRequest(name, "%s must be a JSON Schema object or a string holding one", name)
	}
	if !json.Valid([]byte(text)) {
		return grammar.Spec{}, BadRequest(name, "%s is a string that does not hold valid JSON", name)
	}
	return schemaObject(name, json.RawMessage(text))
}

// regexSpec converts a regex (the JSON Schema pattern dialect, matched
// against the whole output).
func regexSpec(name string, raw json.RawMessage) (grammar.Spec, error) {
	var re string
	if err := json.Unmarshal(raw, &re); err != nil {
		return grammar.Spec{}, BadRequest(name, "%s must be a string (a regular expression)", name)
	}
	return grammar.Spec{Kind: grammar.KindRegex, Source: re}, nil
}

// MaxChoiceList bounds the entries of a list of choices (guided_choice,
// structured_outputs.choice). Each entry costs a worker about 3.4 KB of
// heap once compiled and bound to a vocabulary (measured: 60,000 entries
// took 200 MB), so 4,096 stay under 15 MB per distinct list.
const MaxChoiceList = 4096

// choiceSpec converts a list of choices: an array of 1 to MaxChoiceList
// strings.
func choiceSpec(name string, raw json.RawMessage) (grammar.Spec, error) {
	var list []*string
	if firstByte(raw) != '[' || json.Unmarshal(raw, &list) != nil {
		return grammar.Spec{}, BadRequest(name, "%s must be an array of strings", name)
	}
	if len(list) == 0 {
		return grammar.Spec{}, BadRequest(name, "%s must list at least one string", name)
	}
	if len(list) > MaxChoiceList {
		return grammar.Spec{}, BadRequest(name, "%s may list at most %d choices, got %d", name, MaxChoiceList, len(list))
	}
	out := make([]string, len(list))
	for i, s := range list {
		if s == nil {
			return grammar.Spec{}, BadRequest(name, "%s[%d] must be a string, got null", name, i)
		}
		out[i] = *s
	}
	src, err := json.Marshal(out)
	if err != nil {
		return grammar.Spec{}, BadRequest(name, "%s: %v", name, err)
	}
	return grammar.Spec{Kind: grammar.KindChoice, Source: string(src)}, nil
}

// grammarSpec converts vLLM's grammar text: GBNF (llama.cpp's, start rule
// root) if it defines a rule with "::=", else Lark (start rule start), as
// vLLM's backends take either.
func grammarSpec(name string, raw json.RawMessage) (grammar.Spec, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return grammar.Spec{}, BadRequest(name, "%s must be a string (a GBNF or Lark grammar)", name)
	}
	kind := grammar.KindLark
	if strings.Contains(text, "::=") {
		kind = grammar.KindGBNF
	}
	return grammar.Spec{Kind: kind, Source: text}, nil
}

// gbnfSpec converts llama.cpp's grammar field, always GBNF.
func gbnfSpec(name string, raw json.RawMessage) (grammar.Spec, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return grammar.Spec{}, BadRequest(name, "%s must be a string (a GBNF grammar)", name)
	}
	return grammar.Spec{Kind: grammar.KindGBNF, Source: text}, nil
}

// DefaultCompileCacheEntries bounds the front end's cache of compile
// outcomes (entries, each a digest and an error: a few hundred bytes).
const DefaultCompileCacheEntries = 1024

// compileCache remembers whether each recent constraint compiled (and
// validated: compileSpec), keyed by grammar.Spec.Digest, so that a client
// sending the same schema with every request pays for its compilation
// once. It keeps the outcome only,
// not the grammar (workers compile their own). Least recently used
// entries go first. Safe for concurrent use; a nil cache compiles every
// time.
type compileCache struct {
	mu      sync.Mutex
	max     int
	order   list.List // of *compiled, most recent first
	entries map[string]*list.Element
	compile func(grammar.Spec) (*grammar.Grammar, error)
}

type compiled struct {
	digest string
	err    error
}

// newCompileCache returns a cache of up to max outcomes of compileSpec.
func newCompileCache(max int) *compileCache {
	return &compileCache{max: max, entries: map[string]*list.Element{}, compile: compileSpec}
}

// compileSpec compiles s and checks what a worker checks when it binds the
// grammar to its vocabulary (grammar.Grammar.Validate: some text matches,
// the engine's bounds hold at the start), so that a constraint no text
// satisfies (a regex of an empty class, a rule that never ends, a number
// whose minimum exceeds its maximum) is refused by the front end, naming
// the request's field, not by the worker. Errors are grammar's *Error.
// It is bounded by grammar.CompileLimit (grammar.ErrCompileTime past it).
func compileSpec(s grammar.Spec) (*grammar.Grammar, error) {
	return grammar.Within(grammar.CompileLimit, func() (*grammar.Grammar, error) {
		g, err := grammar.Compile(s)
		if err != nil {
			return nil, err
		}
		if err := g.Validate(); err != nil {
			return nil, err
		}
		return g, nil
	})
}

// check compiles s (compileSpec), or recalls how it compiled, and returns
// its error.
func (c *compileCache) check(s grammar.Spec) error {
	if c == nil {
		_, err := compileSpec(s)
		return err
	}
	d := s.Digest()
	c.mu.Lock()
	if e, ok := c.entries[d]; ok {
		c.order.MoveToFront(e)
		err := e.Value.(*compiled).err
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	// Compiled outside the lock: another request's schema does not wait.
	// Two requests with the same new schema may both compile it.
	_, err := c.compile(s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[d]; !ok {
		c.entries[d] = c.order.PushFront(&compiled{digest: d, err: err})
		for c.order.Len() > c.max {
			last := c.order.Back()
			delete(c.entries, last.Value.(*compiled).digest)
			c.order.Remove(last)
		}
	}
	return err
}

// len is the number of outcomes held.
func (c *compileCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

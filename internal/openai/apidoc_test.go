package openai

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/outcome"
)

// requestFields lists the JSON fields of a request type, nested objects as
// "parent.child" and array elements as "parent[].child".
func requestFields(t reflect.Type, prefix string) []string {
	var out []string
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			out = append(out, requestFields(f.Type, prefix)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		full := name
		if prefix != "" {
			full = prefix + "." + name
		}
		out = append(out, full)
		if sub := requestFields(f.Type, full); len(sub) > 0 {
			out = append(out, sub...)
		}
	}
	return out
}

// TestAPIDocCoversEveryField: docs/api.md has a table row for every field
// the parser reads (and for the array parts of message content, which it
// decodes by hand), and every outcome code and front-end error code.
func TestAPIDocCoversEveryField(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var fields []string
	for _, typ := range []reflect.Type{reflect.TypeFor[CompletionRequest](), reflect.TypeFor[ChatCompletionRequest]()} {
		fields = append(fields, requestFields(typ, "")...)
	}
	fields = append(fields, requestFields(reflect.TypeFor[ContentPart](), "messages[].content[]")...)
	if len(fields) < 40 {
		t.Fatalf("found only %d fields: %v", len(fields), fields)
	}
	seen := map[string]bool{}
	for _, f := range fields {
		if seen[f] {
			continue
		}
		seen[f] = true
		if !strings.Contains(doc, "| `"+f+"` |") {
			t.Errorf("request field %q is not documented in docs/api.md (want a table row | `%s` |)", f, f)
		}
	}
	codes := []string{CodeModelNotFound, CodeContextLengthExceeded, CodeRequestTooLarge, CodeUnsupported,
		CodeInvalidRequest, CodeNotFound, CodeMethodNotAllowed, CodeRequestTimeout, CodeUnsupportedMediaType}
	for _, o := range outcome.All() {
		if o != outcome.OK {
			codes = append(codes, o.String())
		}
	}
	for _, c := range codes {
		if !strings.Contains(doc, "| `"+c+"`") {
			t.Errorf("error code %q is not in docs/api.md's error table", c)
		}
	}
}

// TestAPIDocJSONSchemaKeywords: docs/api.md lists a JSON Schema keyword as
// enforced or refused as the compiler treats it (a sample schema using the
// keyword compiles, or is refused as unsupported), and structured outputs
// document their known limits.
func TestAPIDocJSONSchemaKeywords(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	section := func(from, to string) string {
		_, rest, ok := strings.Cut(doc, from)
		if !ok {
			t.Fatalf("docs/api.md has no %q", from)
		}
		s, _, ok := strings.Cut(rest, to)
		if !ok {
			t.Fatalf("docs/api.md has no %q after %q", to, from)
		}
		return s
	}
	enforced := section("Enforced: ", "Refused, ")
	refused := section("Refused, ", "Regexes are")
	for _, tc := range []struct {
		keyword, schema string
		enforced        bool
	}{
		{"if", `{"if":{"type":"integer"},"then":{"minimum":0},"else":{"type":"string"}}`, true},
		{"uniqueItems", `{"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true}`, true},
		{"not", `{"not":{"type":"string"}}`, true},
		{"oneOf", `{"oneOf":[{"type":"integer"},{"minimum":3}]}`, true},
		{"multipleOf", `{"type":"integer","multipleOf":5}`, true},
		{"contains", `{"type":"array","contains":{"type":"integer"}}`, true},
		{"dependentRequired", `{"dependentRequired":{"a":["b"]}}`, true},
		{"propertyNames", `{"propertyNames":{"maxLength":3}}`, true},
		{"uniqueItems", `{"type":"array","items":{"type":"string"},"uniqueItems":true}`, false},
		{"minContains", `{"type":"array","contains":{"type":"integer"},"minContains":2}`, false},
		{"maxContains", `{"type":"array","contains":{"type":"integer"},"maxContains":2}`, false},
		{"unevaluatedProperties", `{"unevaluatedProperties":false}`, false},
		{"$dynamicRef", `{"$dynamicRef":"#a"}`, false},
		{"iri", `{"type":"string","format":"iri"}`, false},
	} {
		_, err := grammar.Compile(grammar.Spec{Kind: grammar.KindJSONSchema, Source: tc.schema})
		list, name := refused, "refused"
		if tc.enforced {
			list, name = enforced, "enforced"
			if err != nil {
				t.Errorf("%s: %v (the docs call %s enforced)", tc.schema, err, tc.keyword)
			}
		} else if !errors.Is(err, grammar.ErrUnsupported) {
			t.Errorf("%s: %v, want an unsupported keyword (the docs call %s refused)", tc.schema, err, tc.keyword)
		}
		if !strings.Contains(list, "`"+tc.keyword+"`") {
			t.Errorf("docs/api.md does not list `%s` as %s", tc.keyword, name)
		}
	}
	for _, limit := range []string{"may repeat a name", "`finish_reason: \"stop\"` does not by itself mean",
		"`ignore_eos` does not apply", "`allowed_token_ids` applies within the grammar's tokens",
		"are on each worker's `/metrics`"} {
		if !strings.Contains(strings.Join(strings.Fields(doc), " "), limit) {
			t.Errorf("docs/api.md does not say %q", limit)
		}
	}
}

package openai

import (
	"os"
	"reflect"
	"strings"
	"testing"

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

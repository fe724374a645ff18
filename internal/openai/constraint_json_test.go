package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestConstraintCompileErrorsJSONSchema: a schema the JSON Schema compiler
// refuses names the field, the keyword and where it is; an assertion the
// engine does not enforce carries code unsupported_parameter. Every JSON
// dialect compiles a valid schema, on both endpoints.
func TestConstraintCompileErrorsJSONSchema(t *testing.T) {
	checkBad(t, parseChatString(testParser()), []badCase{
		{"unenforced assertion", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"a",` +
			`"schema":{"type":"object","properties":{"x":{"type":"array","uniqueItems":true}}}}}}`, 400, "response_format.json_schema.schema",
			`response_format.json_schema.schema cannot be applied: "uniqueItems" at #/properties/x`},
		{"bad type", `{"messages":[{"role":"user","content":"hi"}],"guided_json":{"type":"strin"}}`, 400, "guided_json", `guided_json cannot be applied: "type"`},
	})
	_, err := testParser().parseCompletion(strings.NewReader(`{"prompt":"hi","json_schema":{"type":"array","uniqueItems":true}}`))
	var e *Error
	if !errors.As(err, &e) || e.Param != "json_schema" || e.Code != CodeUnsupported {
		t.Fatalf("uniqueItems: %v, want unsupported_parameter naming json_schema", err)
	}

	const schema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0}},"required":["name"]}`
	asString, _ := json.Marshal(schema)
	for _, fields := range []string{
		`"response_format":{"type":"json_object"}`,
		`"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":` + schema + `}}`,
		`"response_format":{"type":"json_object","schema":` + schema + `}`,
		`"structured_outputs":{"json":` + schema + `,"whitespace_pattern":"[ \\t\\n\\r]*"}`,
		`"structured_outputs":{"json_object":true}`,
		`"guided_json":` + string(asString),
		`"json_schema":` + schema,
	} {
		if _, err := testParser().parseCompletion(strings.NewReader(`{"prompt":"hi",` + fields + `}`)); err != nil {
			t.Errorf("completions, %s: %v", fields, err)
		}
		if _, err := testParser().parseChat(strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],` + fields + `}`)); err != nil {
			t.Errorf("chat, %s: %v", fields, err)
		}
	}
}

package openai

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestToolParametersShape: arguments are an object, so parameters are an
// object's schema: absent and {} mean none, a schema without a type gets
// "type": "object" if it has object keywords, anything else is refused
// naming the tool's parameters.
func TestToolParametersShape(t *testing.T) {
	for _, tc := range []struct{ params, want string }{
		{``, emptyParameters},
		{`,"parameters":{}`, emptyParameters},
		{`,"parameters":null`, emptyParameters},
		{`,"parameters":{"properties":{"a":{"type":"integer"}},"required":["a"]}`,
			`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`},
		{`,"parameters":{"type":"object","properties":{"a":{"type":"integer"}}}`, `{"type":"object","properties":{"a":{"type":"integer"}}}`},
	} {
		eng := newFakeEngine(chunksOf(`{}`, 5, "stop")...)
		srv := newServer(t, eng)
		body := `{"messages":[` + userHi + `],"tools":[` + timeTool + `,{"type":"function","function":{"name":"f"` + tc.params + `}}],` +
			`"tool_choice":{"type":"function","function":{"name":"f"}}}`
		resp, got := post(t, srv, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.params, resp.StatusCode, got)
		}
		if c := eng.lastReq(t).Constraint; c.Source != tc.want {
			t.Errorf("%s: constraint %s, want %s", tc.params, c.Source, tc.want)
		}
	}
	srv := newServer(t, newFakeEngine(chunksOf("x", 1, "stop")...))
	for _, params := range []string{
		`{"type":"string"}`, `{"type":["object","null"]}`, `{"anyOf":[{"type":"object"}]}`,
		`{"$ref":"#/$defs/A","$defs":{"A":{"type":"object"}}}`, `{"type":"integer","minimum":0}`, `[1]`, `"object"`,
	} {
		for _, choice := range []string{`"auto"`, `"required"`} {
			body := `{"messages":[` + userHi + `],"tools":[` + timeTool + `,{"type":"function","function":{"name":"f","parameters":` + params + `}}],"tool_choice":` + choice + `}`
			resp, got := post(t, srv, "/v1/chat/completions", body)
			var e struct{ Error Error }
			_ = json.Unmarshal([]byte(got), &e)
			if resp.StatusCode != http.StatusBadRequest || e.Error.Param != "tools[1].function.parameters" {
				t.Errorf("parameters %s, tool_choice %s: %d %s; want a 400 naming tools[1].function.parameters", params, choice, resp.StatusCode, got)
			}
		}
	}
}

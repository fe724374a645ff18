package openai

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/grammar"
)

// requiredSchema posts a chat request with tools and tool_choice
// "required" and returns the grammar its constraint compiles to.
func requiredSchema(t *testing.T, tools string) *grammar.Grammar {
	t.Helper()
	eng := newFakeEngine(chunksOf(`[{"name":"x","parameters":{}}]`, 5, "stop")...)
	srv := newServer(t, eng)
	resp, got := post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`],"tools":`+tools+`,"tool_choice":"required"}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	g, err := grammar.Compile(eng.lastReq(t).Constraint)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestToolRequiredRefs: a tool's local $refs point into its own
// parameters in the schema of tool_choice "required", which holds all the
// tools (a recursive "#" and pydantic's "#/$defs/…").
func TestToolRequiredRefs(t *testing.T) {
	const (
		tree = `{"type":"function","function":{"name":"tree","parameters":{"type":"object","properties":` +
			`{"v":{"type":"integer"},"child":{"$ref":"#"}},"required":["v"],"additionalProperties":false}}}`
		person = `{"type":"function","function":{"name":"person","parameters":{"$defs":{"Addr":{"type":"object",` +
			`"properties":{"street":{"type":"string"}},"required":["street"],"additionalProperties":false}},` +
			`"type":"object","properties":{"addr":{"$ref":"#/$defs/Addr"}},"required":["addr"],"additionalProperties":false}}}`
	)
	g := requiredSchema(t, `[`+timeTool+`,`+tree+`,`+person+`]`)
	for text, want := range map[string]bool{
		`[{"name":"tree","parameters":{"v":1,"child":{"v":2,"child":{"v":3}}}}]`:                          true,
		`[{"name":"tree","parameters":{"v":1,"child":[{"name":"tree","parameters":{"v":2}}]}}]`:           false,
		`[{"name":"person","parameters":{"addr":{"street":"Main"}}},{"name":"get_time","parameters":{}}]`: true,
		`[{"name":"person","parameters":{"addr":{"v":1}}}]`:                                               false,
	} {
		if ok, err := grammar.MatchString(g, text); err != nil || ok != want {
			t.Errorf("%s: match %v (%v), want %v", text, ok, err, want)
		}
	}
}

func TestRebaseRefs(t *testing.T) {
	const at = "/items/anyOf/3/properties/parameters"
	for _, tc := range []struct{ in, want string }{
		{`{"type":"object","properties":{"c":{"$ref":"#"}}}`,
			`{"type":"object","properties":{"c":{"$ref":"#/items/anyOf/3/properties/parameters"}}}`},
		// The pointer is kept as written (its escapes included).
		{`{"$defs":{"a/b~%":{"type":"integer"}},"properties":{"x":{"$ref":"#/$defs/a~1b~0%25"}}}`,
			`{"$defs":{"a/b~%":{"type":"integer"}},"properties":{"x":{"$ref":"#/items/anyOf/3/properties/parameters/$defs/a~1b~0%25"}}}`},
		// An anchor becomes the pointer of its schema, escaped.
		{`{"$defs":{"a/b~%":{"$anchor":"n","type":"integer"}},"properties":{"x":{"$ref":"#n"}}}`,
			`{"$defs":{"a/b~%":{"$anchor":"n","type":"integer"}},"properties":{"x":{"$ref":"#/items/anyOf/3/properties/parameters/$defs/a~1b~0%25"}}}`},
		// The parameters' own $id is this document.
		{`{"$id":"https://x.test/p","properties":{"x":{"$ref":"https://x.test/p#/properties/y"},"y":{"$ref":"https://x.test/p"}}}`,
			`{"$id":"https://x.test/p","properties":{"x":{"$ref":"#/items/anyOf/3/properties/parameters/properties/y"},"y":{"$ref":"#/items/anyOf/3/properties/parameters"}}}`},
		// Remote references, data and property names stay.
		{`{"properties":{"$ref":{"const":{"$ref":"#"}},"r":{"$ref":"https://x.test/s#/a"},"e":{"enum":[{"$ref":"#"}]}}}`,
			`{"properties":{"$ref":{"const":{"$ref":"#"}},"r":{"$ref":"https://x.test/s#/a"},"e":{"enum":[{"$ref":"#"}]}}}`},
		// Applicators, items as a list, and numbers as written.
		{`{"anyOf":[{"$ref":"#/$defs/a"}],"items":[{"$ref":"#"}],"maximum":1.50e3}`,
			`{"anyOf":[{"$ref":"#/items/anyOf/3/properties/parameters/$defs/a"}],"items":[{"$ref":"#/items/anyOf/3/properties/parameters"}],"maximum":1.50e3}`},
	} {
		got, err := rebaseRefs(json.RawMessage(tc.in), at)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
	if _, err := rebaseRefs(json.RawMessage(`{"properties":{"x":{"$ref":"#nowhere"}}}`), at); err == nil || !strings.Contains(err.Error(), "#nowhere") {
		t.Errorf("an anchor not declared: %v", err)
	}
}

// TestToolRequiredEscapedRefs: the references moved by rebaseRefs resolve
// in the compiler (escaped keys, anchors).
func TestToolRequiredEscapedRefs(t *testing.T) {
	const tool = `{"type":"function","function":{"name":"f","parameters":{"$defs":{"a/b~%":{"$anchor":"n","type":"integer"}},` +
		`"type":"object","properties":{"x":{"$ref":"#/$defs/a~1b~0%25"},"y":{"$ref":"#n"}},"required":["x","y"],"additionalProperties":false}}}`
	g := requiredSchema(t, `[`+timeTool+`,`+tool+`]`)
	for text, want := range map[string]bool{
		`[{"name":"f","parameters":{"x":1,"y":2}}]`:   true,
		`[{"name":"f","parameters":{"x":"1","y":2}}]`: false,
		`[{"name":"f","parameters":{"x":1,"y":"2"}}]`: false,
	} {
		if ok, err := grammar.MatchString(g, text); err != nil || ok != want {
			t.Errorf("%s: match %v (%v), want %v", text, ok, err, want)
		}
	}
}

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

// TestToolCompileErrorNamesTool: a tool's parameters that do not compile
// are named, with the path inside them.
func TestToolCompileErrorNamesTool(t *testing.T) {
	srv := newServer(t, newFakeEngine(chunksOf("x", 1, "stop")...))
	for _, choice := range []string{`"required"`, `{"type":"function","function":{"name":"f"}}`} {
		body := `{"messages":[` + userHi + `],"tools":[` + timeTool + `,{"type":"function","function":{"name":"f","parameters":` +
			`{"type":"object","properties":{"a":{"$ref":"#/$defs/Missing"}}}}}],"tool_choice":` + choice + `}`
		resp, got := post(t, srv, "/v1/chat/completions", body)
		var e struct{ Error Error }
		_ = json.Unmarshal([]byte(got), &e)
		if resp.StatusCode != http.StatusBadRequest || e.Error.Param != "tools[1].function.parameters" ||
			!strings.Contains(e.Error.Message, "#/properties/a/$ref") {
			t.Errorf("tool_choice %s: %d %s; want a 400 naming tools[1].function.parameters at #/properties/a/$ref", choice, resp.StatusCode, got)
		}
	}
}

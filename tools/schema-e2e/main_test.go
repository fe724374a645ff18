package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun drives the runner against a fake server that answers a valid
// object, an invalid one, a length-cut prefix and a 400, and checks the
// report's classes and the comparison with a second server.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	schema := `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`
	for _, name := range []string{"0.json", "1.json", "2.json", "3.json"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"schema":`+schema+`,"tests":[]}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	answers := map[int][2]string{0: {`{"a":1}`, "stop"}, 1: {`{"a":"x"}`, "stop"}, 2: {`{"a":`, "length"}}
	serve := func(alter bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				w.Write([]byte(`{"data":[{"id":"m"}]}`))
				return
			}
			var req struct {
				Seed           int `json:"seed"`
				ResponseFormat struct {
					JSONSchema struct {
						Schema json.RawMessage `json:"schema"`
					} `json:"json_schema"`
				} `json:"response_format"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.ResponseFormat.JSONSchema.Schema) == 0 {
				http.Error(w, "bad request", 500)
				return
			}
			a, ok := answers[req.Seed]
			if !ok {
				w.WriteHeader(400)
				w.Write([]byte(`{"error":{"message":"response_format.json_schema.schema cannot be applied: grammar: uniqueItems: at /: not supported"}}`))
				return
			}
			if alter && req.Seed == 0 {
				a[0] = `{"a":2}`
			}
			json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": map[string]any{"content": a[0]}, "finish_reason": a[1]}}})
		}))
	}
	a, b := serve(false), serve(true)
	defer a.Close()
	defer b.Close()
	r := &runner{url: a.URL, compare: b.URL, maxTokens: 16, client: a.Client()}
	rep, err := r.run(context.Background(), dir, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent != 3 || rep.Finished != 2 || rep.Valid != 1 || rep.Invalid != 1 || rep.Length != 1 || rep.Refused != 1 || rep.Differ != 1 {
		t.Fatalf("report %+v", rep)
	}
	if rep.RefusedBy["uniqueItems"] != 1 {
		t.Errorf("refusals by reason %v, want uniqueItems", rep.RefusedBy)
	}
	var out strings.Builder
	rep.print(&out)
	if !strings.Contains(out.String(), "valid 1, invalid 1") {
		t.Errorf("report text:\n%s", out.String())
	}
}

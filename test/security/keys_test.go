package security

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"

	"github.com/pdserve/pdserve/internal/testbin"
)

// TestAPIKeys: `pdserve up --api-key` refuses /v1 without a key or with a
// wrong one (401, the OpenAI error body, WWW-Authenticate), serves either
// key of the list (one from PDSERVE_API_KEY's comma-separated form), keeps
// /health, /livez and /metrics open, puts the admin API behind
// --admin-api-key, and counts the refusals.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	up := start(t, "up", "up", "--port", "0", "--api-key", "sk-first,sk-second", "--admin-api-key", "adm-key")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	c := http.DefaultClient

	for _, tc := range []struct{ key, wantAuth string }{{"", `Bearer realm="pdserve"`}, {"sk-wrong", `Bearer realm="pdserve", error="invalid_token"`}} {
		status, wa, body := do(t, c, "POST", base+"/v1/completions", tc.key, completion)
		if status != http.StatusUnauthorized || wa != tc.wantAuth {
			t.Fatalf("key %q: %d, WWW-Authenticate %q, want 401 %q", tc.key, status, wa, tc.wantAuth)
		}
		var e struct {
			Error struct {
				Type, Message string
				Code          *string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == nil || *e.Error.Code != "invalid_api_key" ||
			e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Fatalf("key %q: body %s, want an OpenAI error with code invalid_api_key", tc.key, body)
		}
	}
	for _, key := range []string{"sk-first", "sk-second"} {
		if status, _, body := do(t, c, "POST", base+"/v1/completions", key, completion); status != http.StatusOK {
			t.Fatalf("key %s: %d %s", key, status, body)
		}
	}
	if status, _, _ := do(t, c, "GET", base+"/v1/models", "", ""); status != http.StatusUnauthorized {
		t.Errorf("/v1/models without a key: %d, want 401", status)
	}
	for _, p := range []string{"/health", "/livez", "/metrics"} {
		if status, _, _ := do(t, c, "GET", base+p, "", ""); status != http.StatusOK {
			t.Errorf("%s without a key: %d, want 200", p, status)
		}
	}
	// The admin API takes the admin key only.
	for _, tc := range []struct {
		method, path, key string
		want              int
	}{
		{"GET", "/workers", "", 401}, {"GET", "/workers", "sk-first", 401}, {"GET", "/workers", "adm-key", 200},
		{"DELETE", "/workers/nobody", "sk-first", 401}, {"DELETE", "/workers/nobody", "adm-key", 404},
	} {
		if status, _, body := do(t, c, tc.method, base+tc.path, tc.key, ""); status != tc.want {
			t.Errorf("%s %s key %q: %d, want %d (%s)", tc.method, tc.path, tc.key, status, tc.want, body)
		}
	}
	if v := metric(t, c, base, `pdserve_api_answers_total{code="invalid_api_key",endpoint="completions",role="router",status_class="4xx"}`); v != 2 {
		t.Errorf("refused completions counted %v, want 2", v)
	}
}

// TestServeKeysFromEnvironment: PDSERVE_API_KEY (a list) sets the keys of
// `serve`; --metrics-require-key puts /metrics behind them; /health stays
// open; and the worker API on the same port is no way around the key.
func TestServeKeysFromEnvironment(t *testing.T) {
	t.Parallel()
	p, err := testbin.Start(t, pdserve.Path(t), "serve", []string{"PDSERVE_API_KEY=sk-env-1,sk-env-2"},
		append([]string{"serve", "--port", "0", "--metrics-require-key"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	base := waitLine(t, p, workerRE)
	waitLine(t, p, regexp.MustCompile(`^ready$`))
	defer stop(t, p)
	c := http.DefaultClient
	for _, tc := range []struct {
		method, path, key, body string
		want                    int
	}{
		{"POST", "/v1/completions", "", completion, 401},
		{"POST", "/v1/completions", "sk-env-2", completion, 200},
		{"GET", "/metrics", "", "", 401},
		{"GET", "/metrics", "sk-env-1", "", 200},
		{"GET", "/health", "", "", 200},
		{"POST", "/internal/v1/generate", "", `{"rid":"x","input_ids":[1,2],"max_tokens":2}`, 401},
	} {
		if status, _, body := do(t, c, tc.method, base+tc.path, tc.key, tc.body); status != tc.want {
			t.Errorf("%s %s key %q: %d, want %d (%s)", tc.method, tc.path, tc.key, status, tc.want, body)
		}
	}
}

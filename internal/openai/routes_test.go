package openai

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUnrouted: a path served for other methods gets 405 naming them in
// Allow; an unknown path gets the 404; the catch-all itself is not a
// method of any path.
func TestUnrouted(t *testing.T) {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }
	mux.HandleFunc("GET /health", ok)
	mux.HandleFunc("POST /abort", ok)
	mux.HandleFunc("GET /items/{id}", ok)
	mux.HandleFunc("DELETE /items/{id}", ok)
	mux.HandleFunc("/", Unrouted(mux, "no route for %s %s here"))
	for _, c := range []struct {
		method, path string
		status       int
		allow, body  string
	}{
		{"GET", "/health", 204, "", ""},
		{"HEAD", "/health", 204, "", ""},
		{"POST", "/health", 405, "GET", "Method POST is not allowed for /health"},
		{"GET", "/abort", 405, "POST", ""},
		{"POST", "/items/7", 405, "GET, DELETE", ""},
		{"GET", "/nope", 404, "", "no route for GET /nope here"},
		{"POST", "/", 404, "", "no route for POST / here"},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status || rec.Header().Get("Allow") != c.allow || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("%s %s: %d, Allow %q, %s; want %d, Allow %q, %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"),
				rec.Body.String(), c.status, c.allow, c.body)
		}
	}
}

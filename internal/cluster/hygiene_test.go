package cluster

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// TestHygiene: a chunked HTTP/1.1 request and any HTTP/1.0 request are
// answered with Connection: close, one with a Content-Length is not; a
// head over a bound, or a path that is not canonical, is refused before
// the handler with its status and code.
func TestHygiene(t *testing.T) {
	served := 0
	h := hygiene(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	lines := func(r *http.Request, n, size int) *http.Request {
		for range n {
			r.Header.Add("X-Filler", strings.Repeat("v", size))
		}
		return r
	}
	req := func(mod func(r *http.Request)) *http.Request {
		r := httptest.NewRequest("POST", "/v1/completions", strings.NewReader("{}"))
		if mod != nil {
			mod(r)
		}
		return r
	}
	for _, tc := range []struct {
		name      string
		r         *http.Request
		status    int
		close     bool
		wantServe bool
	}{
		{"content-length", req(nil), 200, false, true},
		{"chunked", req(func(r *http.Request) { r.TransferEncoding = []string{"chunked"}; r.ContentLength = -1 }), 200, true, true},
		{"HTTP/1.0", req(func(r *http.Request) { r.Proto, r.ProtoMinor = "HTTP/1.0", 0 }), 200, true, true},
		{"99 header lines, 31 KiB", lines(req(nil), 99, 310), 200, false, true},
		{"a line of 8 KiB + 1", lines(req(nil), 1, MaxHeaderLineBytes-len("X-Filler: ")+1), 431, false, false},
		{"101 header lines", lines(req(nil), 100, 1), 431, false, false},
		{"33 KiB", lines(req(nil), 5, 6700), 431, false, false},
		{"a path that is not canonical", req(func(r *http.Request) { r.URL.Path = "//internal/v1/info" }), 400, false, false},
		{"a path with ..", req(func(r *http.Request) { r.URL.Path = "/v1/../debug/requests" }), 400, false, false},
		{"a request line of 8 KiB + 1", req(func(r *http.Request) {
			r.RequestURI = "/" + strings.Repeat("a", MaxHeaderLineBytes-len("POST / HTTP/1.1")+1)
		}), 414, false, false},
	} {
		served = 0
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, tc.r)
		if rec.Code != tc.status || (rec.Header().Get("Connection") == "close") != tc.close || (served == 1) != tc.wantServe {
			t.Errorf("%s: %d, Connection %q, served %d; want %d, close %v, served %v", tc.name, rec.Code,
				rec.Header().Get("Connection"), served, tc.status, tc.close, tc.wantServe)
		}
	}
}

// TestHygieneCodesDocumented: docs/api.md's error table names the head's
// refusals.
func TestHygieneCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{CodeHeaderTooLarge, CodeURITooLong} {
		if !strings.Contains(string(b), "`"+c+"`") {
			t.Errorf("docs/api.md does not document the code %s", c)
		}
	}
}

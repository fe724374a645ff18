package openai

import (
	"net/http"
	"path"
	"strings"
)

// Routes serves the OpenAI API next to other routes: every path under /v1
// (and any path http.ServeMux would redirect, such as "//v1/x") goes
// straight to api, which answers unknown ones with a JSON 404, and the rest
// to other (a worker's API, /health, /metrics).
func Routes(api, other http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/v1" || strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "//") {
			api.ServeHTTP(w, r)
			return
		}
		other.ServeHTTP(w, r)
	})
}

// Unrouted answers a request that no pattern of mux took, where mux's
// catch-all "/" pattern serves it: 405 with an Allow header when mux serves
// the path for other methods, else a 404 whose message is notFound's
// (method and path are its arguments).
func Unrouted(mux *http.ServeMux, notFound string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			if m == r.Method || (m == http.MethodGet && r.Method == http.MethodHead) {
				continue
			}
			other := *r
			other.Method = m
			if _, pattern := mux.Handler(&other); pattern != "" && pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			WriteError(w, MethodNotAllowed(r.Method, r.URL.Path))
			return
		}
		WriteError(w, NotFound(notFound, r.Method, r.URL.Path))
	}
}

// CanonicalPaths answers a request whose path is not canonical (an empty
// segment, "." or "..") with a 400 naming the canonical path, as OpenAI
// error JSON, where http.ServeMux would redirect with an HTML body (which
// API clients do not follow for a POST) or answer 404.
func CanonicalPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p := req.URL.Path
		if c := cleanPath(p); c != p {
			WriteError(w, BadRequest("", "path %q is not canonical: use %q", p, c))
			return
		}
		h.ServeHTTP(w, req)
	})
}

// cleanPath is path.Clean keeping a trailing slash, as http.ServeMux
// cleans.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c
}

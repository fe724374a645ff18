package openai

import (
	"net/http"
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

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

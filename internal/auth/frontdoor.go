package auth

import (
	"fmt"
	"net/http"
	pathpkg "path"
	"strings"

	"github.com/pdserve/pdserve/internal/openai"
)

// Class is what a path of a front door is, for its key policy.
type Class int

// Path classes.
const (
	// ClassOpen: /health and /livez, never behind a key (probes).
	ClassOpen Class = iota
	// ClassAPI: the OpenAI API (/v1/*) and any path not named below.
	ClassAPI
	// ClassMetrics: /metrics and /discovery/prometheus.
	ClassMetrics
	// ClassAdmin: the router's admin API (/workers, /workers/...),
	// /debug/* and /planner (the fleet's workers, rates and throughputs).
	ClassAdmin
	// ClassInternal: a colocated worker's worker API (/internal/*).
	ClassInternal
)

// ClassOf is the class of a request path, cleaned first (as http.ServeMux
// cleans it before it routes), so no spelling of a path changes its class.
func ClassOf(p string) Class {
	path := p
	if strings.HasPrefix(p, "/") {
		path = pathpkg.Clean(p)
	}
	switch {
	case path == "/health" || path == "/livez":
		return ClassOpen
	case path == "/metrics" || path == "/discovery/prometheus":
		return ClassMetrics
	case under(path, "/workers") || under(path, "/debug") || under(path, "/planner"):
		return ClassAdmin
	case under(path, "/internal"):
		return ClassInternal
	}
	return ClassAPI
}

// under reports whether path is dir or below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// FrontDoor is the key policy of an OpenAI front door (the router, `serve`,
// `up`). An API key reaches the OpenAI API and nothing else:
//
//   - /health, /livez: open.
//   - /v1/* (and unknown paths): an API key when APIKeys has any.
//   - /metrics, /discovery/prometheus: open, unless MetricsRequireKey
//     (then an API or admin key).
//   - the admin API (/workers...), /debug/* and /planner: an admin key for every
//     method. Without AdminKeys but with APIKeys they are closed (401
//     without a key, 403 with one): /debug/requests lists every client's
//     requests, so no API key reads it. With no key at all, open.
//   - /internal/* (`serve`'s worker API, whose abort ends any request):
//     passed on untouched when InternalGuarded (the worker API's own
//     PeerAuth checks the fleet's secret or certificate), else as the
//     admin API.
//
// A refused request gets 401 (no key, or a wrong one) with
// WWW-Authenticate: Bearer and the OpenAI error body, code
// invalid_api_key, or 403 (code admin_api_key_required: an API key on a
// path only an admin key reaches, on a front door with none).
type FrontDoor struct {
	APIKeys           *Keys
	AdminKeys         *Keys
	MetricsRequireKey bool
	InternalGuarded   bool
	// OnReject, if set, is called for every refused request with its
	// path, status and code (the front end's answer counter).
	OnReject func(path string, status int, code string)
}

// Error codes of refused requests.
const (
	CodeInvalidAPIKey       = "invalid_api_key"
	CodeAdminAPIKeyRequired = "admin_api_key_required"
)

// Enabled reports whether the policy refuses anything.
func (p *FrontDoor) Enabled() bool {
	return p != nil && (p.APIKeys.Len() > 0 || p.AdminKeys.Len() > 0)
}

// Wrap returns next behind the policy. Without any key it returns next.
func (p *FrontDoor) Wrap(next http.Handler) http.Handler {
	if !p.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := p.check(r); e != nil {
			if e.Status == http.StatusUnauthorized {
				v := `Bearer realm="pdserve"`
				if _, ok := BearerToken(r); ok {
					v += `, error="invalid_token"`
				}
				w.Header().Set("WWW-Authenticate", v)
			}
			if p.OnReject != nil {
				p.OnReject(r.URL.Path, e.Status, e.Code)
			}
			openai.WriteError(w, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func unauthorized(format string, args ...any) *openai.Error {
	return &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeInvalidRequest,
		Code: CodeInvalidAPIKey, Message: fmt.Sprintf(format, args...)}
}

// capitalized returns what (the part of the API a refusal is about, "the
// API", "/debug") with its first letter upper-case, to start a sentence.
func capitalized(what string) string {
	if what != "" && 'a' <= what[0] && what[0] <= 'z' {
		return string(what[0]-'a'+'A') + what[1:]
	}
	return what
}

// check returns why r is refused, or nil.
func (p *FrontDoor) check(r *http.Request) *openai.Error {
	class := ClassOf(r.URL.Path)
	switch class {
	case ClassOpen:
		return nil
	case ClassAPI:
		if p.APIKeys.Len() == 0 {
			return nil
		}
		return p.need(r, "the API", p.APIKeys)
	case ClassMetrics:
		if !p.MetricsRequireKey {
			return nil
		}
		return p.need(r, r.URL.Path, p.APIKeys, p.AdminKeys)
	case ClassInternal:
		if p.InternalGuarded {
			return nil
		}
	}
	// ClassAdmin, and ClassInternal unguarded.
	what := "the admin API"
	switch {
	case under(pathpkg.Clean(r.URL.Path), "/debug"):
		what = "/debug"
	case class == ClassInternal:
		what = "the worker API"
	}
	if p.AdminKeys.Len() > 0 {
		return p.need(r, what, p.AdminKeys)
	}
	if _, ok := BearerToken(r); !ok {
		return unauthorized("You didn't provide an API key. %s needs an admin key (--admin-api-key) in an Authorization header: Authorization: Bearer YOUR_KEY.", capitalized(what))
	}
	return &openai.Error{Status: http.StatusForbidden, Type: openai.TypeInvalidRequest, Code: CodeAdminAPIKeyRequired,
		Message: capitalized(what) + " needs an admin key: this server has no --admin-api-key, and an API key reaches the OpenAI API only"}
}

// Admin reports whether r may read what only an admin reaches (the admin
// API, /debug/*): it carries an admin key, or the front door has no key at
// all. A nil FrontDoor is open. The router's /health names the workers it
// holds out, and why, to such requests only.
func (p *FrontDoor) Admin(r *http.Request) bool {
	if !p.Enabled() {
		return true
	}
	token, ok := BearerToken(r)
	return ok && p.AdminKeys.Match(token)
}

// need accepts r if it carries a key of one of sets.
func (p *FrontDoor) need(r *http.Request, what string, sets ...*Keys) *openai.Error {
	token, ok := BearerToken(r)
	if !ok {
		return unauthorized("You didn't provide an API key. %s needs one in an Authorization header: Authorization: Bearer YOUR_KEY.", capitalized(what))
	}
	matched := false
	for _, s := range sets {
		// Every set is compared, whatever matched first.
		if s.Match(token) {
			matched = true
		}
	}
	if !matched {
		return unauthorized("Incorrect API key provided for %s.", what)
	}
	return nil
}

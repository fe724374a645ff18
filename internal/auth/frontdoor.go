package auth

import (
	"fmt"
	"net/http"
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
	// ClassAdmin: the router's admin API (/workers, /workers/...) and
	// /debug/*.
	ClassAdmin
	// ClassInternal: a colocated worker's worker API (/internal/*).
	ClassInternal
)

// ClassOf is the class of a request path.
func ClassOf(path string) Class {
	switch {
	case path == "/health" || path == "/livez":
		return ClassOpen
	case path == "/metrics" || path == "/discovery/prometheus":
		return ClassMetrics
	case path == "/workers" || strings.HasPrefix(path, "/workers/") || strings.HasPrefix(path, "/debug/"):
		return ClassAdmin
	case strings.HasPrefix(path, "/internal/"):
		return ClassInternal
	}
	return ClassAPI
}

// FrontDoor is the key policy of an OpenAI front door (the router, `serve`):
//
//   - /health, /livez: open.
//   - /v1/* (and unknown paths): an API key when APIKeys has any.
//   - /metrics, /discovery/prometheus: open, unless MetricsRequireKey
//     (then an API or admin key).
//   - the admin API (/workers...) and /debug/*: with AdminKeys, an admin
//     key for every method; without AdminKeys but with APIKeys, an API key
//     for GET and HEAD and 403 for every other method (an inference key
//     does not change the fleet); with neither, open.
//   - /internal/* (`serve`'s worker API): passed on untouched when
//     InternalGuarded (the worker API's own PeerAuth checks it), else as
//     /v1/*, so an API key is never bypassed through the worker API.
//
// A refused request gets 401 (no key, or a wrong one) with
// WWW-Authenticate: Bearer and the OpenAI error body, code
// invalid_api_key, or 403 (code admin_api_key_required).
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

// check returns why r is refused, or nil.
func (p *FrontDoor) check(r *http.Request) *openai.Error {
	class := ClassOf(r.URL.Path)
	if class == ClassInternal {
		if p.InternalGuarded {
			return nil
		}
		class = ClassAPI
	}
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
	}
	// ClassAdmin
	switch {
	case p.AdminKeys.Len() > 0:
		return p.need(r, "the admin API", p.AdminKeys)
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		return &openai.Error{Status: http.StatusForbidden, Type: openai.TypeInvalidRequest, Code: CodeAdminAPIKeyRequired,
			Message: "changing the fleet through the admin API needs --admin-api-key on the router (an API key only reads it)"}
	}
	return p.need(r, "the admin API", p.APIKeys)
}

// need accepts r if it carries a key of one of sets.
func (p *FrontDoor) need(r *http.Request, what string, sets ...*Keys) *openai.Error {
	token, ok := BearerToken(r)
	if !ok {
		return unauthorized("You didn't provide an API key. %s needs one in an Authorization header: Authorization: Bearer YOUR_KEY.", what)
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

package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/registry"
)

// maxAdminBody bounds an admin API request body.
const maxAdminBody = 64 << 10

// AddBody is the body of POST /workers.
type AddBody struct {
	URL  string `json:"url"`
	Role string `json:"role"`
}

// AdminHandler serves the router's admin API on the set:
//
//	GET    /workers                 every worker and its state (and invalid registry entries)
//	POST   /workers                 {"url": …, "role": …}: list a worker (static registry only)
//	GET    /workers/{id}            one worker
//	DELETE /workers/{id}            unlist a worker (static registry only); its legs finish
//	POST   /workers/{id}/drain      send it no new request; its legs finish (?force=true: even the last ready worker of its role)
//	POST   /workers/{id}/resume     end an operator's drain
//
// An id may contain slashes (a pod's namespace/name/uid). Every answer is
// JSON; errors are OpenAI-shaped: 400 for a bad body, 404 for an unknown
// worker or route, 405 (with Allow) for a method the path does not take or
// a change the registry does not allow (workers of etcd or Kubernetes come
// and go through their registry), 409 for a drain that would leave a role
// without a ready worker or a resume of a worker that is not drained by an
// operator.
func (s *Set) AdminHandler() http.Handler { return http.HandlerFunc(s.serveAdmin) }

// methodNotAllowed answers 405 naming the methods path takes.
func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow, what string) {
	w.Header().Set("Allow", allow)
	openai.WriteError(w, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
		Message: fmt.Sprintf("%s is not allowed on %s (%s)", r.Method, r.URL.Path, what)})
}

func (s *Set) serveAdmin(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if p == "/workers" || p == "/workers/" {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.handleList(w, r)
		case http.MethodPost:
			s.handleAdd(w, r)
		default:
			methodNotAllowed(w, r, "GET, POST", "GET lists, POST adds")
		}
		return
	}
	rest, ok := strings.CutPrefix(p, "/workers/")
	if !ok {
		openai.WriteError(w, openai.NotFound("no route for %s %s", r.Method, p))
		return
	}
	if i := strings.LastIndexByte(rest, '/'); i > 0 {
		if id, action := rest[:i], rest[i+1:]; action == "drain" || action == "resume" {
			if r.Method != http.MethodPost {
				methodNotAllowed(w, r, "POST", "POST "+action+"s the worker")
				return
			}
			s.handleAction(w, r, id, action)
			return
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.handleGet(w, rest)
	case http.MethodDelete:
		s.handleDelete(w, rest)
	case http.MethodPost:
		if _, known := s.Get(rest); known {
			methodNotAllowed(w, r, "GET, DELETE", "POST /workers/{id}/drain or /resume acts on a worker")
			return
		}
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			openai.WriteError(w, openai.NotFound("no action %q on a worker (want drain or resume)", rest[i+1:]))
			return
		}
		openai.WriteError(w, openai.NotFound("no route for POST /workers/%s (want /workers/{id}/drain or /workers/{id}/resume)", rest))
	default:
		methodNotAllowed(w, r, "GET, DELETE", "GET shows the worker, DELETE unlists it")
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (s *Set) handleList(w http.ResponseWriter, _ *http.Request) {
	list := s.Statuses()
	if list == nil {
		list = []Status{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"registry": s.cfg.Registry.Name(), "registry_status": s.RegistryStatus(), "workers": list})
}

func (s *Set) static() (*registry.Static, *openai.Error) {
	st, ok := s.cfg.Registry.(*registry.Static)
	if !ok {
		return nil, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
			Message: "workers come and go through the " + s.cfg.Registry.Name() + " registry; the admin API adds and removes only static workers"}
	}
	return st, nil
}

func (s *Set) handleAdd(w http.ResponseWriter, r *http.Request) {
	st, e := s.static()
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	var b AddBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			openai.WriteError(w, openai.TooLarge(mb.Limit))
			return
		}
		openai.WriteError(w, openai.BadRequest("", "invalid JSON body: %v (want {\"url\": \"http://host:port\", \"role\": \"prefill|decode|colocated\"})", err))
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		openai.WriteError(w, openai.BadRequest("", "trailing data after the JSON object"))
		return
	}
	switch b.Role {
	case registry.RolePrefill, registry.RoleDecode, registry.RoleColocated:
	default:
		openai.WriteError(w, openai.BadRequest("role", "role %q: want prefill, decode or colocated", b.Role))
		return
	}
	entry, err := st.Add(b.Role, b.URL)
	if err != nil {
		if strings.Contains(err.Error(), "already listed") {
			openai.WriteError(w, &openai.Error{Status: http.StatusConflict, Type: openai.TypeInvalidRequest, Param: "url", Message: err.Error()})
			return
		}
		openai.WriteError(w, openai.BadRequest("url", "%v", err))
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": entry.ID, "url": entry.URL, "role": entry.Role})
}

func notFound(id string) *openai.Error {
	return openai.NotFound("no worker %q (GET /workers lists them)", id)
}

func (s *Set) handleGet(w http.ResponseWriter, id string) {
	wk, ok := s.Get(id)
	if !ok {
		for _, st := range s.Statuses() {
			if st.ID == id { // an invalid registry entry
				writeJSON(w, http.StatusOK, st)
				return
			}
		}
		openai.WriteError(w, notFound(id))
		return
	}
	st := wk.Status()
	if s.cfg.Describe != nil {
		st.Pairing = s.cfg.Describe(wk)
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Set) handleDelete(w http.ResponseWriter, id string) {
	st, e := s.static()
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	if !st.Remove(id) {
		openai.WriteError(w, notFound(id))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "removed": true})
}

func (s *Set) handleAction(w http.ResponseWriter, r *http.Request, id, action string) {
	var err error
	switch action {
	case "drain":
		force := false
		if v := r.URL.Query().Get("force"); v != "" {
			var perr error
			if force, perr = strconv.ParseBool(v); perr != nil {
				openai.WriteError(w, openai.BadRequest("force", "force=%q: want true or false", v))
				return
			}
		}
		err = s.Drain(id, force)
	default:
		err = s.Resume(id)
	}
	switch {
	case errors.Is(err, ErrUnknownWorker):
		openai.WriteError(w, notFound(id))
		return
	case errors.Is(err, ErrConflict):
		openai.WriteError(w, &openai.Error{Status: http.StatusConflict, Type: openai.TypeInvalidRequest, Message: err.Error()})
		return
	case err != nil:
		openai.WriteError(w, err)
		return
	}
	wk, _ := s.Get(id)
	writeJSON(w, http.StatusOK, wk.Status())
}

// SDTarget is one target group of Prometheus's HTTP service discovery
// (http_sd_configs): https://prometheus.io/docs/prometheus/latest/http_sd/.
type SDTarget struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// PrometheusSD serves the set's workers in Prometheus's http_sd format: one
// target group per worker (host:port of its API, which serves /metrics),
// with its role, id and state as __meta_pdserve_role, __meta_pdserve_worker_id
// and __meta_pdserve_state (for relabeling), so a scrape config follows the
// fleet — `pdserve up`'s random ports, etcd or Kubernetes membership —
// without being rewritten. Workers that left the set are not listed.
func (s *Set) PrometheusSD() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		out := []SDTarget{}
		for _, wk := range s.Workers("") {
			u, err := url.Parse(wk.URL())
			if err != nil {
				continue
			}
			// __meta_ labels are for relabeling only: the workers' series
			// carry their own role label, which a target label would clash with.
			labels := map[string]string{"__meta_pdserve_role": wk.Role(), "__meta_pdserve_worker_id": wk.ID(),
				"__meta_pdserve_state": wk.State().String(), "__scheme__": u.Scheme}
			out = append(out, SDTarget{Targets: []string{u.Host}, Labels: labels})
		}
		writeJSON(w, http.StatusOK, out)
	})
}

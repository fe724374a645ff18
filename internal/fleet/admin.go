package fleet

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
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
//	DELETE /workers/{id}            unlist a worker (static registry only); its legs finish
//	POST   /workers/{id}/drain      send it no new request; its legs finish
//	POST   /workers/{id}/resume     end an operator's drain
//
// Errors are OpenAI-shaped JSON: 400 for a bad body, 404 for an unknown
// worker, 405 for a change the registry does not allow (workers of etcd or
// Kubernetes come and go through their registry).
func (s *Set) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /workers", s.handleList)
	mux.HandleFunc("POST /workers", s.handleAdd)
	mux.HandleFunc("DELETE /workers/{id...}", s.handleDelete)
	mux.HandleFunc("POST /workers/{rest...}", s.handleAction)
	mux.HandleFunc("/workers", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
			Message: r.Method + " is not allowed on /workers (GET lists, POST adds)"})
	})
	return mux
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
	writeJSON(w, http.StatusOK, map[string]any{"registry": s.cfg.Registry.Name(), "workers": list})
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

func (s *Set) handleDelete(w http.ResponseWriter, r *http.Request) {
	st, e := s.static()
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	id := r.PathValue("id")
	if !st.Remove(id) {
		openai.WriteError(w, notFound(id))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "removed": true})
}

func (s *Set) handleAction(w http.ResponseWriter, r *http.Request) {
	rest := r.PathValue("rest")
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		openai.WriteError(w, openai.NotFound("no route for POST /workers/%s (want /workers/{id}/drain or /workers/{id}/resume)", rest))
		return
	}
	id, action := rest[:i], rest[i+1:]
	var ok bool
	switch action {
	case "drain":
		ok = s.Drain(id)
	case "resume":
		ok = s.Resume(id)
	default:
		openai.WriteError(w, openai.NotFound("no action %q on a worker (want drain or resume)", action))
		return
	}
	if !ok {
		openai.WriteError(w, notFound(id))
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

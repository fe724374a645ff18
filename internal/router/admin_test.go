package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/pdserve/pdserve/internal/openai"
)

// TestAdminAnswersAreJSON: through the router's whole handler, every
// answer under /workers is JSON — a wrong method (405 with Allow), an
// unknown worker (404), a path the mux would redirect (400 naming the
// canonical path) — and GET /workers/{id} shows one worker with the
// router's view of it.
func TestAdminAnswersAreJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		h := tr.r.Handler()
		for _, c := range []struct {
			method, path string
			status       int
			msg          string
		}{
			{"GET", "/workers/decode0", 200, ""},
			{"GET", "/workers/nope", 404, `no worker "nope"`},
			{"GET", "/workers/decode0/drain", 405, "GET is not allowed"},
			{"PUT", "/workers/decode0", 405, "PUT is not allowed"},
			{"POST", "/workers//decode0/drain", 400, `use "/workers/decode0/drain"`},
			{"GET", "/workers/../workers", 400, `use "/workers"`},
			{"POST", "/workers/decode0/drain", 409, "last ready decode worker"},
			{"POST", "/workers/decode0/resume", 409, "nothing to resume"},
		} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(c.method, "http://router"+c.path, nil))
			var v map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("%s %s: %d %q %q: not JSON", c.method, c.path, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
				continue
			}
			msg := ""
			if e, ok := v["error"].(map[string]any); ok {
				msg, _ = e["message"].(string)
			}
			if rec.Code != c.status || !strings.Contains(msg, c.msg) {
				t.Errorf("%s %s: %d %q, want %d containing %q", c.method, c.path, rec.Code, msg, c.status, c.msg)
			}
			if c.status == 200 {
				if v["id"] != "decode0" || v["state"] != "ready" || v["pairing"] == nil {
					t.Errorf("GET /workers/decode0: %v, want the worker with its pairing", v)
				}
			}
		}
	})
}

// TestNoWorkerAnswerHasRetryAfter: with no ready decode worker the 503
// no_worker answer carries Retry-After (the health interval: a worker may
// be ready at the next check), and says why without naming the worker.
func TestNoWorkerAnswerHasRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		tr.net.add(tr.decode[0].host, http.NotFoundHandler()) // every check fails from now on
		for range 3 {
			tr.r.CheckNow()
		}
		rec := httptest.NewRecorder()
		tr.r.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions",
			strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":2}`)))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no_worker") ||
			rec.Header().Get("Retry-After") != "2" {
			t.Fatalf("%d Retry-After %q %s; want 503 no_worker with Retry-After 2", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
		// The client learns how many workers are in which state, not where
		// they are or what their checks said.
		if b := rec.Body.String(); !strings.Contains(b, "1 worker: 1 not_ready") || strings.Contains(b, tr.decode[0].host) ||
			strings.Contains(b, "404") {
			t.Fatalf("503 body %s: want the count by state, without the worker's address or its check's error", b)
		}
	})
}

// TestUnpairableWorkerShowsWhy: a prefill worker whose KV page size no
// decode worker shares is listed, in GET /workers and /debug/workers, with
// why it gets no request; the compatible workers show no such reason.
func TestUnpairableWorkerShowsWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 1, 0, func(cfg *Config) {
			other := testFingerprint
			other.PageSize = 32
			fakeOf(cfg, "prefill1").setFingerprint(other)
		})
		defer tr.r.Close()
		for _, path := range []string{"/workers", "/debug/workers"} {
			rec := httptest.NewRecorder()
			tr.r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			var v struct {
				Workers []struct {
					ID      string `json:"id"`
					State   string `json:"state"`
					Pairing struct {
						NoPair string `json:"no_pair"`
					} `json:"pairing"`
				} `json:"workers"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, w := range v.Workers {
				got[w.ID] = w.Pairing.NoPair
			}
			want := map[string]string{"prefill0": "", "decode0": "", "prefill1": "no compatible decode: page_size 32 vs 16"}
			for id, why := range want {
				if got[id] != why {
					t.Errorf("%s: %s no_pair %q, want %q", path, id, got[id], why)
				}
			}
		}
	})
}

// TestPlannerOffSaysSo: GET /planner on a router without --planner is a
// 404 that says the planner is off and how to turn it on.
func TestPlannerOffSaysSo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, nil)
		defer tr.r.Close()
		rec := httptest.NewRecorder()
		tr.r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/planner", nil))
		if e := openai.DecodeError(rec.Code, rec.Body.Bytes()); rec.Code != 404 || !strings.Contains(e.Message, "--planner") {
			t.Fatalf("GET /planner without a planner: %d %s", rec.Code, rec.Body)
		}
	})
}

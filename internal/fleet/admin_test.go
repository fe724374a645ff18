package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/registry"
)

func call(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Body)
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s %s: answer is not JSON: %s", method, path, b)
	}
	return rec.Code, v
}

func errCode(v map[string]any) string {
	e, _ := v["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

func TestAdminAPI(t *testing.T) {
	f := newFakeWorkers()
	s, st, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	h := s.AdminHandler()
	ctx := context.Background()
	f.set("http://127.0.0.1:30001", decodeInfo("a"), nil)

	code, v := call(t, h, "POST", "/workers", `{"url":"http://127.0.0.1:30001","role":"decode"}`)
	if code != http.StatusCreated || v["id"] != "127.0.0.1:30001" {
		t.Fatalf("add: %d %v", code, v)
	}
	s.Reconcile(st.Snapshot())
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	code, v = call(t, h, "GET", "/workers", "")
	ws, _ := v["workers"].([]any)
	if code != http.StatusOK || len(ws) != 1 || ws[0].(map[string]any)["state"] != "ready" || v["registry"] != "static" {
		t.Fatalf("list: %d %v", code, v)
	}
	code, v = call(t, h, "GET", "/workers/127.0.0.1:30001", "")
	if code != http.StatusOK || v["id"] != "127.0.0.1:30001" || v["state"] != "ready" {
		t.Fatalf("get: %d %v", code, v)
	}
	code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/resume", "")
	if code != http.StatusConflict || !strings.Contains(errCode(v), "not drained by the admin API") {
		t.Fatalf("resume of a ready worker: %d %v, want 409", code, v)
	}
	code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/drain", "")
	if code != http.StatusConflict || !strings.Contains(errCode(v), "last ready decode worker") {
		t.Fatalf("drain of the last ready decode worker: %d %v, want 409", code, v)
	}
	if code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/drain?force=maybe", ""); code != http.StatusBadRequest {
		t.Fatalf("drain ?force=maybe: %d %v", code, v)
	}
	code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/drain?force=true", "")
	if code != http.StatusOK || v["state"] != "draining" || v["safe_to_delete"] != true {
		t.Fatalf("drain: %d %v", code, v)
	}
	if code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/drain", ""); code != http.StatusOK {
		t.Fatalf("drain of a draining worker: %d %v, want 200 (no-op)", code, v)
	}
	code, v = call(t, h, "POST", "/workers/127.0.0.1:30001/resume", "")
	if code != http.StatusOK || v["state"] != "pending" {
		t.Fatalf("resume: %d %v", code, v)
	}
	code, v = call(t, h, "DELETE", "/workers/127.0.0.1:30001", "")
	if code != http.StatusOK {
		t.Fatalf("delete: %d %v", code, v)
	}
	s.Reconcile(st.Snapshot())
	if _, v = call(t, h, "GET", "/workers", ""); len(v["workers"].([]any)) != 0 {
		t.Fatalf("after delete: %v", v)
	}

	for _, c := range []struct {
		method, path, body string
		status             int
		msg                string
	}{
		{"POST", "/workers", `{"url":"http://127.0.0.1:1"}`, 400, `role ""`},
		{"POST", "/workers", `{"url":"ftp://x","role":"decode"}`, 400, "want http://host:port"},
		{"POST", "/workers", `{"url":"http://127.0.0.1:70000","role":"decode"}`, 400, "port must be from 1 to 65535"},
		{"POST", "/workers", `not json`, 400, "invalid JSON body"},
		{"POST", "/workers", `{"url":"http://a:1","role":"decode","extra":1}`, 400, "unknown field"},
		{"POST", "/workers", `{"url":"http://a:1","role":"decode"} {}`, 400, "trailing data"},
		{"POST", "/workers", `{"url":"http://a:1","role":"decode","x":"` + strings.Repeat("a", maxAdminBody) + `"}`, 413, ""},
		{"DELETE", "/workers/nope", "", 404, `no worker "nope"`},
		{"POST", "/workers/nope/drain", "", 404, `no worker "nope"`},
		{"POST", "/workers/nope/explode", "", 404, `no action "explode"`},
		{"POST", "/workers/nope", "", 404, "want /workers/{id}/drain"},
		{"PUT", "/workers", "", 405, "PUT is not allowed"},
		{"GET", "/workers/nope", "", 404, `no worker "nope"`},
		{"GET", "/workers/nope/drain", "", 405, "GET is not allowed on /workers/nope/drain"},
		{"PUT", "/workers/nope", "", 405, "PUT is not allowed on /workers/nope"},
		{"POST", "/workers/nope/resume", "", 404, `no worker "nope"`},
	} {
		code, v := call(t, h, c.method, c.path, c.body)
		if code != c.status || !strings.Contains(errCode(v), c.msg) {
			t.Errorf("%s %s %.40s: %d %q, want %d containing %q", c.method, c.path, c.body, code, errCode(v), c.status, c.msg)
		}
	}
	code, v = call(t, h, "POST", "/workers", `{"url":"http://a:1","role":"decode"}`)
	if code != http.StatusCreated {
		t.Fatal(code, v)
	}
	if code, v = call(t, h, "POST", "/workers", `{"url":"http://a:1/","role":"decode"}`); code != http.StatusConflict {
		t.Errorf("duplicate add: %d %v", code, v)
	}
}

func TestAdminAPIRefusesChangesToDynamicRegistries(t *testing.T) {
	s, err := New(Config{Registry: fixedRegistry{}, Probe: newFakeWorkers().probe})
	if err != nil {
		t.Fatal(err)
	}
	h := s.AdminHandler()
	for _, c := range [][2]string{{"POST", "/workers"}, {"DELETE", "/workers/x"}} {
		code, v := call(t, h, c[0], c[1], `{"url":"http://a:1","role":"decode"}`)
		if code != http.StatusMethodNotAllowed || !strings.Contains(errCode(v), "through the etcd registry") {
			t.Errorf("%s %s: %d %v", c[0], c[1], code, v)
		}
	}
}

type fixedRegistry struct{}

func (fixedRegistry) Name() string { return "etcd" }
func (fixedRegistry) Run(ctx context.Context, update func(registry.Snapshot)) error {
	update(registry.Snapshot{})
	<-ctx.Done()
	return ctx.Err()
}

func TestPrometheusSD(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://10.0.0.1:30001", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://10.0.0.1:30001")}})
	rec := httptest.NewRecorder()
	s.PrometheusSD().ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/prometheus", nil))
	var got []SDTarget
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Targets[0] != "10.0.0.1:30001" || got[0].Labels["__meta_pdserve_role"] != "decode" ||
		got[0].Labels["__meta_pdserve_worker_id"] != "d1" || got[0].Labels["__scheme__"] != "http" {
		t.Fatalf("targets %+v", got)
	}
	s.Reconcile(registry.Snapshot{})
	rec = httptest.NewRecorder()
	s.PrometheusSD().ServeHTTP(rec, httptest.NewRequest("GET", "/discovery/prometheus", nil))
	if strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Fatalf("empty fleet: %s", rec.Body)
	}
}

// TestAdminAPISlashedIDsAndHeaders: ids with slashes (a pod's
// namespace/name/uid) work in every route; a 405 names the methods the path
// takes in Allow and is JSON; draining one of two ready workers of a role
// needs no force.
func TestAdminAPISlashedIDsAndHeaders(t *testing.T) {
	f := newFakeWorkers()
	s, err := New(Config{Registry: fixedRegistry{}, Probe: f.probe, ModelName: "m", Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))})
	if err != nil {
		t.Fatal(err)
	}
	f.set("http://10.0.0.1:30001", decodeInfo("a"), nil)
	f.set("http://10.0.0.2:30001", decodeInfo("b"), nil)
	s.Reconcile(snap(entry("ns/decode-a/uid-1", "decode", "http://10.0.0.1:30001"), entry("ns/decode-b/uid-2", "decode", "http://10.0.0.2:30001")))
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	h := s.AdminHandler()
	if code, v := call(t, h, "GET", "/workers/ns/decode-a/uid-1", ""); code != http.StatusOK || v["id"] != "ns/decode-a/uid-1" {
		t.Fatalf("get: %d %v", code, v)
	}
	if code, v := call(t, h, "POST", "/workers/ns/decode-a/uid-1/drain", ""); code != http.StatusOK || v["state"] != "draining" {
		t.Fatalf("drain one of two: %d %v", code, v)
	}
	if code, v := call(t, h, "POST", "/workers/ns/decode-b/uid-2/drain", ""); code != http.StatusConflict {
		t.Fatalf("drain of the other, now the last ready: %d %v", code, v)
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/workers/ns/decode-a/uid-1/resume", "POST"},
		{"POST", "/workers/ns/decode-a/uid-1", "GET, DELETE"},
		{"PATCH", "/workers", "GET, POST"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != c.allow ||
			rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d, Allow %q, Content-Type %q; want 405, Allow %q, JSON", c.method, c.path, rec.Code,
				rec.Header().Get("Allow"), rec.Header().Get("Content-Type"), c.allow)
		}
	}
}

// errRegistry never lists anything and reports an error, as an etcd the
// router cannot reach at start.
type errRegistry struct{}

func (errRegistry) Name() string { return "etcd" }
func (errRegistry) Run(ctx context.Context, _ func(registry.Snapshot)) error {
	<-ctx.Done()
	return ctx.Err()
}
func (errRegistry) LastError() (string, time.Time) {
	return "context deadline exceeded", time.Unix(900, 0)
}

// TestRegistryStatusInList: GET /workers says whether the registry has
// listed the fleet, when it last did, and its last error.
func TestRegistryStatusInList(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s, err := New(Config{Registry: errRegistry{}, Probe: newFakeWorkers().probe, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	h := s.AdminHandler()
	_, v := call(t, h, "GET", "/workers", "")
	st, _ := v["registry_status"].(map[string]any)
	if st["backend"] != "etcd" || st["synced"] != false || st["last_sync"] != nil || st["last_error"] != "context deadline exceeded" ||
		st["last_error_at"] == nil {
		t.Fatalf("before a snapshot: %v", st)
	}
	s.Reconcile(registry.Snapshot{})
	_, v = call(t, h, "GET", "/workers", "")
	st, _ = v["registry_status"].(map[string]any)
	ls, _ := st["last_sync"].(string)
	if at, err := time.Parse(time.RFC3339, ls); st["synced"] != true || err != nil || !at.Equal(time.Unix(1000, 0)) {
		t.Fatalf("after a snapshot: %v", st)
	}
}

package inspect

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/router"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCollectSkipsSilentWorkers: a worker that never answers (frozen) and
// one that fails are reported as errors, and do not hide the requests of a
// worker that answers, even when they come first in the router's list.
func TestCollectSkipsSilentWorkers(t *testing.T) {
	release := make(chan struct{})
	frozen := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer frozen.Close()
	defer close(release)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "loop not answering", http.StatusServiceUnavailable)
	}))
	defer failing.Close()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"role":"decode","requests":[{"rid":"r1","stage":"decoding","age_s":2,"in_stage_s":1}]}`))
	}))
	defer healthy.Close()
	rt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/debug/requests" {
			w.Write([]byte(`{"role":"router","requests":[{"rid":"r1","stage":"streaming","age_s":2.1,"in_stage_s":1}]}`))
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"workers": []router.WorkerStatus{
			{URL: frozen.URL, Role: "prefill"}, {URL: failing.URL, Role: "prefill"}, {URL: healthy.URL, Role: "decode"}}})
	}))
	defer rt.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	rep, err := Collect(ctx, http.DefaultClient, rt.URL)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 || rep.Rows[0].Role != "router" || rep.Rows[0].Worker != rt.URL ||
		rep.Rows[1].RID != "r1" || rep.Rows[1].Worker != healthy.URL {
		t.Errorf("rows %+v, want r1 from the router, then from the healthy worker (oldest first)", rep.Rows)
	}
	if len(rep.Errors) != 2 || !strings.Contains(strings.Join(rep.Errors, "\n"), frozen.URL) ||
		!strings.Contains(strings.Join(rep.Errors, "\n"), failing.URL) {
		t.Errorf("errors %q, want one for the frozen and one for the failing worker", rep.Errors)
	}
	http.DefaultClient.CloseIdleConnections()
}

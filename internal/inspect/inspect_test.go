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

// TestSummaryFilterAndDecodeProgress: the summary counts every row per
// stage; filters keep the rows asked for; a router row whose legs are
// running shows the decode leg's tokens; a lease deadline reads as a
// lease; an empty list is [] in JSON.
func TestSummaryFilterAndDecodeProgress(t *testing.T) {
	dec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"role":"decode","requests":[
			{"rid":"a","stage":"decoding","age_s":5,"in_stage_s":4,"output_tokens":37},
			{"rid":"b-g2","stage":"awaiting_kv","age_s":3,"in_stage_s":3,"deadline_left_s":2,"deadline_kind":"lease"},
			{"rid":"c","stage":"awaiting_kv","age_s":1,"in_stage_s":0.5,"stage_budget_s":0.8}]}`))
	}))
	defer dec.Close()
	rt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/debug/requests" {
			w.Write([]byte(`{"role":"router","requests":[
				{"rid":"a","stage":"legs","age_s":5.1,"in_stage_s":5.1,"last_event":"legs sent (gen 1)"},
				{"rid":"b","gen":2,"stage":"legs","age_s":3.1,"in_stage_s":1,"migrations":1}]}`))
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"workers": []router.WorkerStatus{{URL: dec.URL, Role: "decode"}}})
	}))
	defer rt.Close()
	rep, err := Collect(context.Background(), http.DefaultClient, rt.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer http.DefaultClient.CloseIdleConnections()
	want := []StageSummary{{"router", "legs", 2, 5.1, 0}, {"decode", "awaiting_kv", 2, 3, 1}, {"decode", "decoding", 1, 4, 0}}
	if len(rep.Summary) != len(want) {
		t.Fatalf("summary %+v", rep.Summary)
	}
	for i := range want {
		if rep.Summary[i] != want[i] {
			t.Errorf("summary[%d] %+v, want %+v", i, rep.Summary[i], want[i])
		}
	}
	for _, r := range rep.Rows {
		if r.Role == "router" && r.RID == "a" && (r.OutputTokens != 37 || !strings.Contains(r.LastEvent, "decode: decoding, 37 tokens so far")) {
			t.Errorf("router row of a: %+v", r)
		}
		if r.Role == "router" && r.RID == "b" && !strings.Contains(r.LastEvent, "awaiting_kv, 0 tokens") {
			t.Errorf("router row of b (gen 2): %+v", r)
		}
	}
	f := rep.Filter("awaiting_kv", time.Second, 0)
	if len(f.Rows) != 1 || f.Rows[0].RID != "b-g2" || len(f.Summary) != 3 {
		t.Errorf("filtered %+v", f.Rows)
	}
	if f := rep.Filter("", 0, 2); len(f.Rows) != 2 || f.Rows[0].RID != "a" {
		t.Errorf("limit 2: %+v", f.Rows)
	}
	var b strings.Builder
	if err := Print(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "lease 2s") || !strings.Contains(b.String(), "PAST HALF DEADLINE") ||
		!strings.Contains(b.String(), "live requests: router 2, decode 3;") || !strings.Contains(b.String(), "legs (migrated 1×)") {
		t.Errorf("printed (want the live count per role, not summed over the router and its workers):\n%s", b.String())
	}
	// The mark's legend only beside a count that has marked rows.
	if !strings.Contains(b.String(), "1 entries past half their stage deadline (!)") {
		t.Errorf("no legend beside the flagged count:\n%s", b.String())
	}
	b.Reset()
	if err := Print(&b, rep.Filter("nope", 0, 0)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "0 of them past half their stage deadline\n") {
		t.Errorf("a legend beside a count of 0:\n%s", b.String())
	}
	j, _ := json.Marshal(rep.Filter("nope", 0, 0))
	if !strings.Contains(string(j), `"requests":[]`) {
		t.Errorf("empty list in JSON: %s", j)
	}
}

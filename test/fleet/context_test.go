package fleet_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// post sends body to the router's path and returns the status and the
// answer.
func post(t *testing.T, hc *http.Client, url, body string) (int, string) {
	t.Helper()
	resp, err := hc.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// idsPrompt is a completion of a prompt of n token ids.
func idsPrompt(n, maxTokens int) string {
	return fmt.Sprintf(`{"model":"pdserve-sim","prompt":[%s],"max_tokens":%d}`, strings.TrimSuffix(strings.Repeat("7,", n), ","), maxTokens)
}

// TestSmallWorkerDoesNotCapTheFleet: a decode worker started with a
// 512-token context beside a prefill and a decode worker of 2,048 (the
// model's): /v1/models reports 2,048, /workers shows each worker's context
// and KV capacity, 1,000-token prompts are served by the large pair alone
// while short ones still reach the small worker, a chat request without
// max_tokens is served, a prompt longer than every context is a 400
// context_length_exceeded, and with the large decode worker drained a
// 1,000-token prompt is a 503 no_worker saying why (not a 400), served
// again once it resumes.
func TestSmallWorkerDoesNotCapTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	t.Parallel()
	ps := newProcs(t)
	p0 := ps.worker("prefill-0", "prefill")
	d0 := ps.worker("decode-0", "decode")
	small := ps.worker("decode-small", "decode", "--sim-context-len", "512")
	for _, n := range []*node{p0, d0, small} {
		ps.start(n)
	}
	rt := ps.router("--prefill", p0.url(), "--decode", urls(d0, small))
	ps.start(rt)
	hc := &http.Client{Timeout: 30 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0, small)...)

	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := getJSON(hc, rt.url()+"/v1/models", &models); err != nil || len(models.Data) != 1 || models.Data[0].MaxModelLen != 2048 {
		t.Fatalf("/v1/models: %+v (%v), want max_model_len 2048", models, err)
	}
	for _, n := range []*node{p0, d0, small} {
		st, _ := workerState(hc, rt.url(), n.url())
		want := 2048
		if n == small {
			want = 512
		}
		if st.ContextLen != want || st.KVCapacity < want {
			t.Errorf("/workers %s: context_len %d, kv_capacity_tokens %d; want %d and a pool that holds it", n.name, st.ContextLen, st.KVCapacity, want)
		}
	}

	chosen := func() float64 {
		return metricSum(t, hc, rt.url(), "pdserve_router_selections_total", `worker="`+small.url()+`"`)
	}
	before := chosen()
	for i := range 6 {
		if code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(1000, 8)); code != http.StatusOK {
			t.Fatalf("1,000-token prompt %d: %d %s", i, code, body)
		}
	}
	if n := chosen() - before; n != 0 {
		t.Errorf("the 512-token decode worker was chosen for %v of the 1,000-token prompts", n)
	}
	for i := range 10 {
		if code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(8, 8)); code != http.StatusOK {
			t.Fatalf("short prompt %d: %d %s", i, code, body)
		}
	}
	if chosen() == before {
		t.Errorf("the 512-token decode worker got none of 10 short prompts")
	}
	for i := range 4 {
		if code, body := post(t, hc, rt.url()+"/v1/chat/completions",
			`{"model":"pdserve-sim","messages":[{"role":"user","content":"tell me a story"}]}`); code != http.StatusOK {
			t.Fatalf("chat without max_tokens %d: %d %s", i, code, body)
		}
	}
	if code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(2100, 8)); code != http.StatusBadRequest ||
		!strings.Contains(body, "context_length_exceeded") || !strings.Contains(body, "2048") {
		t.Fatalf("a prompt longer than every context: %d %s, want 400 context_length_exceeded naming 2048", code, body)
	}

	// Only the small decode worker takes requests: a long prompt waits for
	// the large one.
	st, _ := workerState(hc, rt.url(), d0.url())
	if code, body := post(t, hc, rt.url()+"/workers/"+st.ID+"/drain", ""); code != http.StatusOK {
		t.Fatalf("drain %s: %d %s", d0.name, code, body)
	}
	code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(1000, 8))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no_worker") ||
		!strings.Contains(body, "serving a context of 512 tokens (this request needs 1008)") {
		t.Fatalf("a 1,000-token prompt with the large decode worker drained: %d %s, want 503 no_worker saying why", code, body)
	}
	if code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(8, 8)); code != http.StatusOK {
		t.Fatalf("a short prompt with the large decode worker drained: %d %s", code, body)
	}
	if code, body := post(t, hc, rt.url()+"/workers/"+st.ID+"/resume", ""); code != http.StatusOK {
		t.Fatalf("resume %s: %d %s", d0.name, code, body)
	}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0, small)...)
	if code, body := post(t, hc, rt.url()+"/v1/completions", idsPrompt(1000, 8)); code != http.StatusOK {
		t.Fatalf("a 1,000-token prompt after the resume: %d %s", code, body)
	}
	quiescent(t, hc, rt.url(), p0, d0, small)
}

package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/pdserve/pdserve/internal/workerapi"
)

// completion posts a /v1/completions request of a prompt of n token ids
// (max_tokens left out when maxTokens is 0) through h, and returns the
// status and the body.
func completion(h http.Handler, n, maxTokens int) (int, string) {
	ids := strings.TrimSuffix(strings.Repeat("1,", n), ",")
	body := `{"model":"m","prompt":[` + ids + `]`
	if maxTokens > 0 {
		body += fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body+"}")))
	return rec.Code, rec.Body.String()
}

// maxModelLen reads /v1/models' max_model_len through h.
func maxModelLen(t *testing.T, h http.Handler) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/models", nil))
	var v struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || len(v.Data) != 1 {
		t.Fatalf("/v1/models: %d %s (%v)", rec.Code, rec.Body, err)
	}
	return v.Data[0].MaxModelLen
}

// legSizes lists the prompt length and max_tokens of each leg w received.
func legSizes(w *fakeWorker) [][2]int {
	legs, _, _ := w.received()
	out := make([][2]int, len(legs))
	for i, l := range legs {
		out[i] = [2]int{len(l.InputIDs), l.MaxTokens}
	}
	return out
}

// TestContextPerWorker: in a fleet where one decode and one prefill worker
// serve a 1,024-token context and the others 8,192, the smaller workers do
// not cap the fleet: /v1/models says 8,192, a 2,000-token prompt is served
// by the larger workers only (a pair's context is the smaller of its two),
// short requests still use the small ones, a default max_tokens is cut to
// what the chosen pair's context leaves, /workers shows every worker's
// context and KV capacity, a request no pair could hold is a 400
// context_length_exceeded, and one only workers not ready now could hold is
// a 503 no_worker saying why.
func TestContextPerWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 3, 0, func(cfg *Config) {
			cfg.ContextLen = 8192
			for _, h := range []string{"prefill0", "decode1", "decode2"} {
				fakeOf(cfg, h).setContextLen(8192)
			}
			for _, h := range []string{"prefill1", "decode0"} {
				fakeOf(cfg, h).setContextLen(1024)
			}
			fakeOf(cfg, "decode0").reportLoad(workerapi.Load{PagesTotal: 64, PageSize: 16})
			fakeOf(cfg, "decode1").reportLoad(workerapi.Load{PagesTotal: 4096, PageSize: 16})
		})
		defer tr.r.Close()
		h := tr.r.Handler()
		if n := maxModelLen(t, h); n != 8192 {
			t.Fatalf("max_model_len %d, want 8192 (the larger workers' context)", n)
		}
		for i := range 6 {
			if code, body := completion(h, 2000, 8); code != http.StatusOK {
				t.Fatalf("2,000-token prompt %d: %d %s", i, code, body)
			}
			if code, body := completion(h, 3, 8); code != http.StatusOK {
				t.Fatalf("short prompt %d: %d %s", i, code, body)
			}
		}
		synctest.Wait() // a prefill leg may still be on its way when decode has answered
		for _, w := range []*fakeWorker{tr.decode[0], tr.prefill[1]} {
			for _, l := range legSizes(w) {
				if l[0]+l[1] > 1024 {
					t.Errorf("%s (context 1024) got a leg of %d + %d tokens", w.host, l[0], l[1])
				}
			}
		}
		if n := len(legSizes(tr.decode[0])); n == 0 {
			t.Errorf("the small decode worker got no short request")
		}
		long := 0
		for _, w := range []*fakeWorker{tr.decode[1], tr.decode[2]} {
			for _, l := range legSizes(w) {
				if l[0] == 2000 {
					long++
				}
			}
		}
		if long != 6 {
			t.Errorf("the large decode workers got %d of the 6 long prompts", long)
		}

		// A default max_tokens (16 for completions) is what the pair's
		// context leaves: 4 after 1,020 tokens on a pair with a small
		// worker, 16 on two large ones.
		before := len(legSizes(tr.decode[0]))
		for i := range 8 {
			if code, body := completion(h, 1020, 0); code != http.StatusOK {
				t.Fatalf("1,020-token prompt without max_tokens %d: %d %s", i, code, body)
			}
		}
		synctest.Wait()
		small := map[string]bool{} // the rids of legs on prefill1
		legs, _, _ := tr.prefill[1].received()
		for _, l := range legs {
			small[l.RID] = true
		}
		var cut []int
		for i, w := range tr.decode {
			legs, _, _ := w.received()
			for _, l := range legs {
				if len(l.InputIDs) != 1020 {
					continue
				}
				want := 16
				if i == 0 || small[l.RID] {
					want = 4
				}
				if l.MaxTokens != want {
					t.Errorf("%s: a 1,020-token prompt without max_tokens had max_tokens %d, want %d", w.host, l.MaxTokens, want)
				}
				cut = append(cut, l.MaxTokens)
			}
		}
		if len(legSizes(tr.decode[0])) == before || !slices.Contains(cut, 16) {
			t.Errorf("max_tokens of the requests without it: %v; want the small decode worker to take some", cut)
		}

		// No pair holds 8,190 + 8 tokens: the client's mistake.
		if code, body := completion(h, 8190, 8); code != http.StatusBadRequest || !strings.Contains(body, "context_length_exceeded") ||
			!strings.Contains(body, "8192") {
			t.Fatalf("a prompt too long for every worker: %d %s, want 400 context_length_exceeded naming 8192", code, body)
		}

		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/workers", nil))
		var v struct {
			Workers []struct {
				ID         string `json:"id"`
				ContextLen int    `json:"context_len"`
				KVCapacity int    `json:"kv_capacity_tokens"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		got := map[string][2]int{}
		for _, w := range v.Workers {
			got[w.ID] = [2]int{w.ContextLen, w.KVCapacity}
		}
		want := map[string][2]int{"prefill0": {8192, 0}, "prefill1": {1024, 0}, "decode0": {1024, 1024}, "decode1": {8192, 65536},
			"decode2": {8192, 0}}
		for id, cw := range want {
			if got[id] != cw {
				t.Errorf("/workers %s: context_len, kv_capacity_tokens %v, want %v", id, got[id], cw)
			}
		}

		// The large decode workers fail their checks: a long prompt waits
		// for them (503, why), a short one is still served, and the fleet's
		// context is still theirs.
		for _, w := range tr.decode[1:] {
			tr.net.add(w.host, http.NotFoundHandler())
		}
		for range 3 {
			tr.r.CheckNow()
		}
		code, body := completion(h, 2000, 8)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "no_worker") ||
			!strings.Contains(body, "1 serving a context of 1024 tokens (this request needs 2008)") || !strings.Contains(body, "2 not_ready") {
			t.Fatalf("a long prompt with only the small decode worker ready: %d %s, want 503 no_worker saying why", code, body)
		}
		if code, body := completion(h, 3, 8); code != http.StatusOK {
			t.Fatalf("a short prompt with only the small decode worker ready: %d %s", code, body)
		}
		if n := maxModelLen(t, h); n != 8192 {
			t.Fatalf("max_model_len %d with the large decode workers not ready, want 8192", n)
		}
	})
}

// TestContextPerColocatedWorker: a colocated fleet routes by context the
// same way.
func TestContextPerColocatedWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 0, 0, 2, func(cfg *Config) {
			cfg.ContextLen = 8192
			fakeOf(cfg, "colocated0").setContextLen(1024)
			fakeOf(cfg, "colocated1").setContextLen(8192)
		})
		defer tr.r.Close()
		h := tr.r.Handler()
		if n := maxModelLen(t, h); n != 8192 {
			t.Fatalf("max_model_len %d, want 8192", n)
		}
		for i := range 4 {
			if code, body := completion(h, 2000, 8); code != http.StatusOK {
				t.Fatalf("2,000-token prompt %d: %d %s", i, code, body)
			}
		}
		if n := len(legSizes(tr.colocated[0])); n != 0 {
			t.Errorf("the 1,024-token colocated worker got %d long prompts", n)
		}
		if code, body := completion(h, 8192, 8); code != http.StatusBadRequest || !strings.Contains(body, "context_length_exceeded") {
			t.Fatalf("a prompt too long for every worker: %d %s", code, body)
		}
	})
}

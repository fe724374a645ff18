package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/router"
)

// routerRequests is pdserve_router_requests_total{outcome, path} of c's
// router.
func routerRequests(t *testing.T, c *cluster.Cluster, outcome, path string) float64 {
	t.Helper()
	mfs, err := c.Router.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_router_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if l := labels(m); l["outcome"] == outcome && l["path"] == path {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// finishedOn is how many requests w finished, whatever their outcome.
func finishedOn(t *testing.T, w *cluster.WorkerServer) float64 {
	t.Helper()
	return counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "", "")
}

// TestLocalPrefill: with --disagg-min-prompt-tokens, a request whose
// prompt is shorter is served by the decode worker alone (the prefill
// worker never sees it; counted path="local"), a longer one goes through
// both workers (path="pd"), and every answer — greedy and seeded sampling —
// is the one an always-disaggregated deployment gives for the same request
// (invariant 5).
func TestLocalPrefill(t *testing.T) {
	t.Parallel()
	const minTokens = 64
	local := startPD(t, pdOptions{router: cluster.RouterTuning{DisaggMinPromptTokens: minTokens}})
	pd := startPD(t, pdOptions{})

	short := "Short prompts are prefilled where they decode."              // 47 tokens (the sim tokenizer: one a byte)
	long := strings.Repeat("A long prompt is worth a prefill worker. ", 7) // 287 tokens
	if len(short) >= minTokens || len(long) < router.LocalBoostCap*minTokens {
		t.Fatalf("prompt lengths %d and %d do not straddle the threshold", len(short), len(long))
	}
	type req struct {
		Prompt      string   `json:"prompt"`
		MaxTokens   int      `json:"max_tokens"`
		Temperature *float64 `json:"temperature,omitempty"`
		Seed        *int     `json:"seed,omitempty"`
		IgnoreEOS   bool     `json:"ignore_eos"`
		TokenIDs    bool     `json:"return_token_ids"`
		Stream      bool     `json:"stream,omitempty"`
	}
	cold, hot, seed := 0.0, 0.8, 11
	var reqs []req
	for _, p := range []string{short, long} {
		reqs = append(reqs,
			req{Prompt: p, MaxTokens: 24, IgnoreEOS: true, TokenIDs: true, Temperature: &cold},             // greedy
			req{Prompt: p, MaxTokens: 24, IgnoreEOS: true, TokenIDs: true, Temperature: &hot, Seed: &seed}) // seeded
	}
	answer := func(c *cluster.Cluster, r req) []int32 {
		t.Helper()
		status, body := postJSON(t, c.URL()+"/v1/completions", r)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, body)
		}
		out := decodeCompletion(t, body)
		if len(out.Choices) != 1 || len(out.Choices[0].TokenIDs) != r.MaxTokens {
			t.Fatalf("answer %s", body)
		}
		return out.Choices[0].TokenIDs
	}
	for i, r := range reqs {
		prefillBefore := finishedOn(t, local.Prefill[0])
		got, want := answer(local, r), answer(pd, r)
		if !slices.Equal(got, want) {
			t.Errorf("request %d (%d prompt tokens): per-request disaggregation answers %v, always disaggregated %v", i, len(r.Prompt), got, want)
		}
		isShort := len(r.Prompt) < minTokens
		if prefilled := finishedOn(t, local.Prefill[0]) - prefillBefore; isShort != (prefilled == 0) {
			t.Errorf("request %d (%d prompt tokens): the prefill worker finished %v requests", i, len(r.Prompt), prefilled)
		}
	}
	if l, p := routerRequests(t, local, "ok", "local"), routerRequests(t, local, "ok", "pd"); l != 2 || p != 2 {
		t.Errorf("pdserve_router_requests_total{outcome=ok}: local %v, pd %v; want 2 and 2", l, p)
	}
	if l, p := routerRequests(t, pd, "ok", "local"), routerRequests(t, pd, "ok", "pd"); l != 0 || p != 4 {
		t.Errorf("always disaggregated: local %v, pd %v; want 0 and 4", l, p)
	}

	// A streamed local request ends as a streamed PD one does.
	r := reqs[1]
	r.Stream = true
	status, body := postJSON(t, local.URL()+"/v1/completions", r)
	if status != http.StatusOK || !strings.Contains(string(body), "data: [DONE]") {
		t.Fatalf("streamed local request: %d %s", status, body)
	}
}

// TestLocalAbortFreesDecode: a client that goes away from a local request
// mid-stream ends it on the decode worker, whose pages return to zero
// (and the cleanup's quiescence check); the prefill worker never saw it.
func TestLocalAbortFreesDecode(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 5 * time.Millisecond},
		router: cluster.RouterTuning{DisaggMinPromptTokens: 64}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := longStream(t, ctx, c.URL())
	// While it streams, the router lists it on the decode worker alone.
	live := c.Router.Router.Requests()
	if len(live) != 1 {
		t.Fatalf("router lists %d requests: %+v", len(live), live)
	}
	ri, ok := c.Router.Router.Request(live[0].RID)
	if s := fmt.Sprintf("%+v", ri); !ok || ri.PeerAddr != c.Decode[0].URL || ri.Stage != "streaming" || !strings.Contains(s, "served locally") {
		t.Errorf("router's view of a local request: %s", s)
	}
	cancel()
	resp.Body.Close()
	d := c.Decode[0]
	waitFor(t, 5*time.Second, "decode aborted", func() (bool, string) {
		st, _ := d.Worker.Stats(time.Second)
		return st.Live == 0 && st.PagesUsed == 0, fmt.Sprintf("live %d pages %d", st.Live, st.PagesUsed)
	})
	waitFor(t, 5*time.Second, "abort counted", func() (bool, string) {
		n := routerRequests(t, c, "aborted_client", "local")
		return n == 1, fmt.Sprintf("aborted_client/local %v", n)
	})
	if n := counterValue(t, workerGatherer{d}, "pdserve_requests_finished_total", "outcome", "aborted_client"); n != 1 {
		t.Errorf("decode finished %v requests aborted_client, want 1", n)
	}
	if n := finishedOn(t, c.Prefill[0]); n != 0 {
		t.Errorf("prefill finished %v requests, want 0", n)
	}
}

// TestLocalThresholdFollowsPrefillBacklog: a prompt above
// --disagg-min-prompt-tokens goes local while the prefill worker has a
// longer prompt to get through first (the threshold rises by that backlog),
// and is disaggregated again once prefill is idle.
func TestLocalThresholdFollowsPrefillBacklog(t *testing.T) {
	t.Parallel()
	const minTokens = 64
	// A PD request's prompt stays on prefill (parked) until the gate opens;
	// its leg, in flight, is prefill's backlog.
	g, wrap := gated(lifecycle.RoleDecode, kvxfer.TypeRoomReady)
	c := startPD(t, pdOptions{wrap: wrap, router: cluster.RouterTuning{DisaggMinPromptTokens: minTokens}})
	backlog := strings.Repeat("b", 300)
	medium := fmt.Sprintf(`{"prompt":%q,"max_tokens":4,"temperature":0}`, strings.Repeat("m", 100))

	held := make(chan int, 1)
	go func() {
		status, _ := postJSON(t, c.URL()+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, backlog))
		held <- status
	}()
	waitFor(t, 5*time.Second, "a long prompt held on prefill", func() (bool, string) {
		s := stageOf(c.Prefill[0])
		return s[lifecycle.StageParked] == 1, fmt.Sprint(s)
	})
	// Threshold 64 + min(300, 3 × 64) = 256: the 100-token prompt is local.
	if status, body := postJSON(t, c.URL()+"/v1/completions", medium); status != http.StatusOK {
		t.Fatalf("medium prompt behind a busy prefill: %d %s", status, body)
	}
	if n := routerRequests(t, c, "ok", "local"); n != 1 {
		t.Fatalf("medium prompt behind a busy prefill: %v local requests, want 1", n)
	}
	g.Open()
	if status := <-held; status != http.StatusOK {
		t.Fatalf("the long prompt: %d", status)
	}
	// Prefill is idle again: the threshold is back to 64 once the router
	// sees it so (a load report asked for while the long prompt was still
	// counted there stands until the next one).
	waitFor(t, 5*time.Second, "the router sees prefill idle", func() (bool, string) {
		for _, w := range c.Router.Router.Workers() {
			if p, ok := w.Pairing.(router.Pairing); ok && w.Role == "prefill" {
				return p.Load.Tokens == 0, fmt.Sprintf("prefill load %+v", p.Load)
			}
		}
		return false, "no prefill worker listed"
	})
	if status, body := postJSON(t, c.URL()+"/v1/completions", medium); status != http.StatusOK {
		t.Fatalf("medium prompt, prefill idle: %d %s", status, body)
	}
	if l, p := routerRequests(t, c, "ok", "local"), routerRequests(t, c, "ok", "pd"); l != 1 || p != 2 {
		t.Fatalf("after prefill went idle: local %v, pd %v; want 1 and 2", l, p)
	}
}

// TestLocalWhenDecodeCachesThePrompt: with the cache_aware decode policy,
// a long prompt whose prefix the router already sent to a decode worker is
// served there alone — only its uncached tail counts, and decode computes
// only that (its prefix cache answers the rest) — with the answer an
// always-disaggregated deployment gives.
func TestLocalWhenDecodeCachesThePrompt(t *testing.T) {
	t.Parallel()
	rt := cluster.RouterTuning{DisaggMinPromptTokens: 64, DecodePolicy: router.PolicyCacheAware}
	local := startPD(t, pdOptions{router: rt})
	pd := startPD(t, pdOptions{})
	prefix := strings.Repeat("A shared system prompt, long enough to disaggregate. ", 6) // 318 tokens
	ask := func(c *cluster.Cluster, prompt string) completion {
		t.Helper()
		status, body := postJSON(t, c.URL()+"/v1/completions",
			fmt.Sprintf(`{"prompt":%q,"max_tokens":8,"temperature":0,"return_token_ids":true}`, prompt))
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, body)
		}
		return decodeCompletion(t, body)
	}
	first := ask(local, prefix+"First question?")
	if l, p := routerRequests(t, local, "ok", "local"), routerRequests(t, local, "ok", "pd"); l != 0 || p != 1 {
		t.Fatalf("first long prompt: local %v, pd %v; want 0 and 1", l, p)
	}
	if want := ask(pd, prefix+"First question?"); !slices.Equal(first.Choices[0].TokenIDs, want.Choices[0].TokenIDs) {
		t.Errorf("first: %v, always disaggregated %v", first.Choices[0].TokenIDs, want.Choices[0].TokenIDs)
	}
	second := ask(local, prefix+"Second one?")
	if l := routerRequests(t, local, "ok", "local"); l != 1 {
		t.Fatalf("the same prefix again: %v local requests, want 1", l)
	}
	if cachedTokens(second) < len(prefix)-64 {
		t.Errorf("the local request took %d prompt tokens from decode's cache, want most of the %d-token prefix", cachedTokens(second), len(prefix))
	}
	if want := ask(pd, prefix+"Second one?"); !slices.Equal(second.Choices[0].TokenIDs, want.Choices[0].TokenIDs) {
		t.Errorf("second: %v, always disaggregated %v", second.Choices[0].TokenIDs, want.Choices[0].TokenIDs)
	}
}

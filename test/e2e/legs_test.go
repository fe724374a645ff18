package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// TestPrefillRejectsAfterDispatch (scenario 1): the router dispatched both
// legs and prefill rejects the request (its pool can never hold it). The
// router could not know: the prefill worker sits behind a proxy that
// reports a larger context than it serves, as a worker restarted with other
// flags between health checks would. The client gets prefill's 400 within
// a second, and decode frees its pages (the cleanup check) at once.
func TestPrefillRejectsAfterDispatch(t *testing.T) {
	t.Parallel()
	pageBytes := int64(testGeometry.BytesPerToken() * 16)
	c := startPair(t, func(o *cluster.WorkerOptions) { o.KVCacheMemory = kvcache.MinPages * pageBytes }, nil)
	target, _ := url.Parse(c.Prefill[0].URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != workerapi.PathInfo {
			return nil
		}
		var info workerapi.Info
		if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
			return err
		}
		info.ContextLen = testContext
		b, _ := json.Marshal(info)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.ContentLength = int64(len(b))
		resp.Header.Set("Content-Length", fmt.Sprint(len(b)))
		return nil
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	m, _ := simFactory(sim.Config{})()
	r, err := cluster.StartRouter(cluster.RouterOptions{Addr: "127.0.0.1:0", Prefill: []string{front.URL},
		Decode: []string{c.Decode[0].URL}, Info: m.Info(), Tokenizer: m.Tokenizer(), HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	if err := cluster.WaitReady(context.Background(), r.Router, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	status, body := postJSON(t, r.URL+"/v1/completions", map[string]any{"prompt": strings.Repeat("p", 200), "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status != http.StatusBadRequest || e.Error == nil || !strings.Contains(e.Error.Message, "context length") {
		t.Fatalf("want prefill's 400 naming its context length, got %d %s", status, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("answer took %s", d)
	}
	// A request that fits still works.
	if status, body := postJSON(t, r.URL+"/v1/completions", map[string]any{"prompt": "short", "max_tokens": 4}); status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
}

// TestIncompatiblePairRefused: a prefill and a decode with different page
// sizes are never paired by the router (the client gets a 503 naming the
// mismatch), and a decode leg sent to that prefill anyway is refused at the
// KV handshake with the mismatch named — an error, not a hang — and ends
// with outcome peer_refused (not peer_lost: the same pair would be refused
// again), as decode counts it.
func TestIncompatiblePairRefused(t *testing.T) {
	t.Parallel()
	c := startPair(t, func(o *cluster.WorkerOptions) { o.Machine.PageSize = 32 }, nil)
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status != http.StatusServiceUnavailable || e.Error == nil || !strings.Contains(e.Error.Message, "page_size 32 vs 16") {
		t.Fatalf("want a 503 naming the page size mismatch, got %d %s", status, body)
	}
	start := time.Now()
	leg := workerapi.GenerateBody{RID: "direct", Room: kvxfer.NewRoom().String(), Gen: 1, InputIDs: []int32{104, 105},
		MaxTokens: 4, PrefillKVAddr: c.Prefill[0].Worker.KVAddr()}
	status, body = postWith(t, c.WorkerClient(), c.Decode[0].URL+workerapi.PathDecode, leg)
	if status != http.StatusBadGateway || !strings.Contains(string(body), "page_size 16 vs 32") {
		t.Fatalf("want 502 naming the mismatch from the handshake, got %d %s", status, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answer took %s", d)
	}
	var answer struct {
		Error struct {
			Code    string          `json:"code"`
			Outcome outcome.Outcome `json:"outcome"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatalf("decode's answer %s: %v", body, err)
	}
	if answer.Error.Code != "peer_refused" || answer.Error.Outcome != outcome.PeerRefused {
		t.Fatalf("decode's answer %s: want code and outcome peer_refused", body)
	}
	waitFor(t, 2*time.Second, "decode counted the refusal", func() (bool, string) {
		refused := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "peer_refused")
		lost := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "peer_lost")
		return refused == 1 && lost == 0, fmt.Sprintf("peer_refused %v, peer_lost %v", refused, lost)
	})
}

// TestPeerAbortTombstoneCounted (issue 18): an ABORT from decode for a
// room prefill holds no request for (here: decode's leg arrived alone, so
// its ROOM_OPEN waits as a pending open, then the leg is aborted) leaves a
// tombstone on prefill, and pdserve_peer_abort_tombstones_total shows it
// next to the tombstone gauge.
func TestPeerAbortTombstoneCounted(t *testing.T) {
	t.Parallel()
	c := startPair(t, nil, nil)
	p := workerGatherer{c.Prefill[0]}
	if n := counterValue(t, p, "pdserve_peer_abort_tombstones_total", "role", "prefill"); n != 0 {
		t.Fatalf("counted %v before any abort", n)
	}
	leg := workerapi.GenerateBody{RID: "alone", Room: kvxfer.NewRoom().String(), Gen: 1, InputIDs: []int32{104, 105},
		MaxTokens: 4, PrefillKVAddr: c.Prefill[0].Worker.KVAddr()}
	done := make(chan int, 1)
	go func() {
		status, _ := postWith(t, c.WorkerClient(), c.Decode[0].URL+workerapi.PathDecode, leg)
		done <- status
	}()
	waitFor(t, 5*time.Second, "decode's ROOM_OPEN pending on prefill", func() (bool, string) {
		st, _ := c.Prefill[0].Worker.Stats(time.Second)
		return st.PendingOpens == 1, fmt.Sprintf("pending opens %d", st.PendingOpens)
	})
	if status, body := postWith(t, c.WorkerClient(), c.Decode[0].URL+workerapi.PathAbort, workerapi.AbortBody{RID: "alone"}); status != http.StatusOK {
		t.Fatalf("abort: %d %s", status, body)
	}
	if status := <-done; status == http.StatusOK {
		t.Fatalf("the aborted leg answered %d", status)
	}
	waitFor(t, 5*time.Second, "prefill counted the tombstone", func() (bool, string) {
		n := counterValue(t, p, "pdserve_peer_abort_tombstones_total", "role", "prefill")
		tombs := counterValue(t, p, "pdserve_rooms", "kind", "tombstone")
		pending := counterValue(t, p, "pdserve_rooms", "kind", "pending_open")
		return n == 1 && tombs == 1 && pending == 0, fmt.Sprintf("counted %v, tombstones %v, pending opens %v", n, tombs, pending)
	})
}

// TestRouterShutdownAnswersInFlight: stopping the router answers every
// request in flight with an error (503, or an error event in a stream) and
// aborts its legs; the workers return to baseline.
func TestRouterShutdownAnswersInFlight(t *testing.T) {
	t.Parallel()
	slowDecode := func(o *cluster.WorkerOptions) {
		m, err := simFactory(sim.Config{DecodePerStep: 5 * time.Millisecond})()
		if err != nil {
			t.Fatal(err)
		}
		o.Model = m
	}
	c := startPair(t, nil, slowDecode) // its cleanup checks both workers drained
	results := make(chan string, 2)
	for _, stream := range []bool{false, true} {
		go func() {
			body := fmt.Sprintf(`{"prompt":"long","max_tokens":1500,"ignore_eos":true,"stream":%v}`, stream)
			resp, err := http.Post(c.URL()+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				results <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- fmt.Sprint(resp.StatusCode, " ", string(b))
		}()
	}
	waitFor(t, 5*time.Second, "both requests decoding", func() (bool, string) {
		st, _ := c.Decode[0].Worker.Stats(time.Second)
		return st.Live == 2, fmt.Sprint(st.Stages)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Router.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r := <-results
		if !strings.Contains(r, "shutting down") || !(strings.HasPrefix(r, "503 ") || strings.Contains(r, `"error"`)) {
			t.Fatalf("in-flight request got %s", r)
		}
	}
}

// TestRouterPlainMode: the router in front of two colocated workers (plain
// mode, for comparisons at equal worker count) spreads requests over both
// and gives the same answers as disaggregated serving.
func TestRouterPlainMode(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	plain, err := cluster.Up(context.Background(), cluster.Options{ColocatedWorkers: 2, NewModel: simFactory(sim.Config{}),
		Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20}, HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, plain.Workers()...)
		_ = plain.Shutdown(context.Background())
	})
	pd := startPD(t, pdOptions{})
	for i := range 6 {
		req := map[string]any{"prompt": fmt.Sprintf("plain %d", i), "max_tokens": 12, "seed": i, "temperature": 0.9,
			"return_token_ids": true}
		sp, bp := postJSON(t, plain.URL()+"/v1/completions", req)
		sd, bd := postJSON(t, pd.URL()+"/v1/completions", req)
		if sp != http.StatusOK || sd != http.StatusOK {
			t.Fatalf("plain %d %s; pd %d %s", sp, bp, sd, bd)
		}
		if a, b := decodeCompletion(t, bp).Choices[0].TokenIDs, decodeCompletion(t, bd).Choices[0].TokenIDs; fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("plain %v, pd %v", a, b)
		}
	}
	for _, w := range plain.Colocated {
		if n := counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "outcome", "ok"); n != 3 {
			t.Fatalf("colocated worker served %v requests, want 3 (round robin)", n)
		}
	}
}

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/worker"
)

// TestPrefillRejectsAfterDispatch: the router dispatched both legs, prefill
// rejects the request (its pool can never hold it); the client gets
// prefill's 400 within a second, and decode frees its pages (the cleanup
// check) without waiting for a timeout.
func TestPrefillRejectsAfterDispatch(t *testing.T) {
	pageBytes := int64(testGeometry.BytesPerToken() * 16)
	c := startPair(t, func(o *cluster.WorkerOptions) { o.KVCacheMemory = kvcache.MinPages * pageBytes }, nil)
	start := time.Now()
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("p", 200), "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status != http.StatusBadRequest || e.Error == nil || !strings.Contains(e.Error.Message, "KV pages") {
		t.Fatalf("want prefill's 400 naming its KV pages, got %d %s", status, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("answer took %s", d)
	}
	// A request that fits still works.
	if status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "short", "max_tokens": 4}); status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
}

// TestIncompatiblePairRefused: a prefill and a decode with different page
// sizes are never paired by the router (the client gets a 503 naming the
// mismatch), and a decode leg sent to that prefill anyway is refused at the
// KV handshake with the mismatch named — an error, not a hang.
func TestIncompatiblePairRefused(t *testing.T) {
	c := startPair(t, func(o *cluster.WorkerOptions) { o.Machine.PageSize = 32 }, nil)
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status != http.StatusServiceUnavailable || e.Error == nil || !strings.Contains(e.Error.Message, "page_size 32 vs 16") {
		t.Fatalf("want a 503 naming the page size mismatch, got %d %s", status, body)
	}
	start := time.Now()
	leg := worker.GenerateBody{RID: "direct", Room: kvxfer.NewRoom().String(), Gen: 1, InputIDs: []int32{104, 105},
		MaxTokens: 4, PrefillKVAddr: c.Prefill[0].Worker.KVAddr()}
	status, body = postJSON(t, c.Decode[0].URL+worker.PathDecode, leg)
	if status != http.StatusBadGateway || !strings.Contains(string(body), "page_size 16 vs 32") {
		t.Fatalf("want 502 naming the mismatch from the handshake, got %d %s", status, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answer took %s", d)
	}
}

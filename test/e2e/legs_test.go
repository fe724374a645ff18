package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
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
// sizes are refused at the KV handshake; the client gets an error naming
// the mismatch, not a hang.
func TestIncompatiblePairRefused(t *testing.T) {
	c := startPair(t, func(o *cluster.WorkerOptions) { o.Machine.PageSize = 32 }, nil)
	start := time.Now()
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status < 500 || e.Error == nil || !strings.Contains(e.Error.Message, "page_size 16 vs 32") {
		t.Fatalf("want a 5xx naming the page size mismatch, got %d %s", status, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answer took %s", d)
	}
}

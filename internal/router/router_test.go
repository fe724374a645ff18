package router

import (
	"net/http"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// closeRecorder is an http.RoundTripper that records CloseIdleConnections.
type closeRecorder struct {
	http.RoundTripper
	closed int
}

func (c *closeRecorder) CloseIdleConnections() { c.closed++ }

// TestCloseClosesIdleWorkerConnections: connections the router's pool
// dialed but never used look "new" to a worker's HTTP server, whose
// Shutdown waits up to 5 s for them; Close must hand them back so that
// `pdserve up` stops at once after a burst of load.
func TestCloseClosesIdleWorkerConnections(t *testing.T) {
	rec := &closeRecorder{RoundTripper: http.DefaultTransport}
	r, err := New(Config{Prefill: []string{"http://127.0.0.1:1"}, Decode: []string{"http://127.0.0.1:2"},
		ModelName: "m", ContextLen: 16, Client: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if rec.closed != 1 {
		t.Fatalf("CloseIdleConnections called %d times, want 1", rec.closed)
	}
}

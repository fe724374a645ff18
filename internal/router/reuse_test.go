package router

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// TestFinishedLegKeepsConnection: a colocated worker on a real socket sends
// its last line, and ends its response only after the router has returned
// that line (as a worker whose chunked terminator trails the last line). The
// router reads the response to its end before it lets the leg go, so every
// request of a sequence comes on the one kept-alive connection; hung up at
// the last line instead, each request would cost the worker a new one.
func TestFinishedLegKeepsConnection(t *testing.T) {
	var (
		mu      sync.Mutex
		remotes []string
	)
	release := make(chan struct{}, 1) // lets the current leg end its response
	w := &fakeWorker{role: workerapi.RoleColocated}
	w.leg = func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, lw *legWriter) {
		lw.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
		lw.line(workerapi.StreamLine{TokenIDs: []int32{11}, Logprobs: []float32{-1}, FinishReason: "length"})
		lw.rw.(http.Flusher).Flush()
		<-release
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == workerapi.PathGenerate {
			mu.Lock()
			remotes = append(remotes, r.RemoteAddr)
			mu.Unlock()
		}
		w.ServeHTTP(rw, r)
	}))
	srv.Start()
	defer srv.Close()
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	r, err := New(Config{ModelName: "m", ContextLen: 64, Client: &http.Client{Transport: tr},
		Registerer: prometheus.NewRegistry(), Colocated: []string{srv.URL},
		HealthInterval: time.Hour, LoadInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	defer r.Close()
	if ok, why := r.Serving(); !ok {
		t.Fatalf("router not serving: %s", why)
	}
	const n = 5
	for i := range n {
		st, err := r.Generate(context.Background(), &openai.GenerateRequest{RID: "r" + string(rune('0'+i)),
			InputIDs: []int32{1, 2, 3}, MaxTokens: 2, Sampling: model.SamplingParams{TopP: 1}})
		if err != nil {
			t.Fatal(err)
		}
		for {
			c, err := st.Recv()
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if c.FinishReason != "" {
				break
			}
		}
		release <- struct{}{} // the response ends after the last line was returned
		st.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(remotes) != n {
		t.Fatalf("%d legs reached the worker, want %d", len(remotes), n)
	}
	for i, a := range remotes {
		if a != remotes[0] {
			t.Errorf("leg %d came from %s, leg 0 from %s: the connection was not reused", i, a, remotes[0])
		}
	}
}

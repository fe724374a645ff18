package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
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
	srv, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == workerapi.PathGenerate {
			mu.Lock()
			remotes = append(remotes, r.RemoteAddr)
			mu.Unlock()
		}
		w.ServeHTTP(rw, r)
	}))
	r, _ := socketRouter(t, srv.URL)
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
		if st.(openai.Ender).Ended() {
			t.Fatal("the leg reads as ended before its worker ended the response")
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

// TestLegEndedWithItsLastLine: a worker that sends its last line with the
// end of its response (as pdserve's workers do) leaves the router's stream
// ended at the last chunk (openai.Ender), so the front end need not flush
// the client's last event on its own; the connection is reused.
func TestLegEndedWithItsLastLine(t *testing.T) {
	w := &fakeWorker{role: workerapi.RoleColocated}
	w.leg = func(_ context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, lw *legWriter) {
		lw.line(workerapi.StreamLine{TokenIDs: []int32{10}, Logprobs: []float32{-1}})
		lw.rw.(http.Flusher).Flush()
		lw.line(workerapi.StreamLine{TokenIDs: []int32{11}, Logprobs: []float32{-1}, FinishReason: "length"})
	}
	srv, conns := newCountingServer(t, w)
	r, _ := socketRouter(t, srv.URL)
	for i := range 3 {
		st, oerr := r.Generate(context.Background(), &openai.GenerateRequest{RID: fmt.Sprintf("r%d", i),
			InputIDs: []int32{1, 2, 3}, MaxTokens: 2, Sampling: model.SamplingParams{TopP: 1}})
		if oerr != nil {
			t.Fatal(oerr)
		}
		var got []int32
		for {
			c, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, tk := range c.Tokens {
				got = append(got, tk.ID)
			}
			if c.FinishReason != "" {
				break
			}
		}
		if !slices.Equal(got, []int32{10, 11}) {
			t.Fatalf("tokens %v", got)
		}
		if !st.(openai.Ender).Ended() {
			t.Fatal("the leg's end came with its last line, but the stream does not read as ended")
		}
		st.Close()
	}
	if n := conns.n.Load(); n != 1 {
		t.Fatalf("%d connections for 3 legs, want 1", n)
	}
}

// TestLegWithoutAnswerIsStreamBroken: a worker that takes a leg and dies
// before it answers (a non-streamed leg's answer comes only at its end) is
// a worker that broke off, not one that could not be reached; the
// transport's error says the request was sent (ErrNoAnswer).
func TestLegWithoutAnswerIsStreamBroken(t *testing.T) {
	w := &fakeWorker{role: workerapi.RoleColocated}
	srv, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == workerapi.PathGenerate {
			_, _ = io.Copy(io.Discard, r.Body)
			c, _, err := http.NewResponseController(rw).Hijack()
			if err == nil {
				c.Close() // the worker dies with the request
			}
			return
		}
		w.ServeHTTP(rw, r)
	}))
	r, tr := socketRouter(t, srv.URL)
	st, oerr := r.Generate(context.Background(), &openai.GenerateRequest{RID: "r", InputIDs: []int32{1, 2, 3},
		MaxTokens: 2, Sampling: model.SamplingParams{TopP: 1}, Buffered: true})
	if oerr != nil {
		t.Fatal(oerr)
	}
	defer st.Close()
	_, err := st.Recv()
	var e *workerapi.Error
	if !errors.As(err, &e) || e.Outcome != outcome.WorkerStreamBroken {
		t.Fatalf("a worker that died with the leg: %v, want worker_stream_broken", err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+workerapi.PathGenerate, strings.NewReader("{}"))
	if _, err := (&http.Client{Transport: tr}).Do(req); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("transport error %v, want ErrNoAnswer", err)
	}
}

// socketRouter starts a plain router on the colocated worker at url, over
// real sockets through the router's own transport; the test's cleanup
// closes it (before the worker's server, registered earlier).
func socketRouter(t *testing.T, url string) (*Router, *Transport) {
	t.Helper()
	tr := NewTransport()
	r, err := New(Config{ModelName: "m", ContextLen: 64, Client: &http.Client{Transport: tr},
		Registerer: prometheus.NewRegistry(), Colocated: []string{url},
		HealthInterval: time.Hour, LoadInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	t.Cleanup(func() {
		r.Close()
		tr.CloseIdleConnections()
	})
	return r, tr
}

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

func getHealth(t *testing.T, h http.Handler, path string) (int, workerapi.Health, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	var hl workerapi.Health
	_ = json.Unmarshal(rec.Body.Bytes(), &hl)
	return rec.Code, hl, rec.Header().Get("Retry-After")
}

// TestDrainFinishesAdmittedRefusesNew: a draining worker refuses new
// requests with 503 draining and Retry-After, finishes the one it admitted,
// answers /health 503 "draining" and /livez 200, and Drain returns once
// nothing is left.
func TestDrainFinishesAdmittedRefusesNew(t *testing.T) {
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32},
		ContextLen: 256, DecodePerStep: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Model: m, Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
	h := w.Handler(nil)
	if code, hl, _ := getHealth(t, h, workerapi.PathHealth); code != http.StatusOK || hl.Status != workerapi.HealthOK || hl.Instance != w.Instance() {
		t.Fatalf("health before drain: %d %+v", code, hl)
	}
	ctx := context.Background()
	req := &openai.GenerateRequest{RID: "r1", InputIDs: []int32{1, 2, 3}, MaxTokens: 20, IgnoreEOS: true,
		Sampling: model.SamplingParams{TopP: 1}}
	s, err := w.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Recv(); err != nil { // admitted and decoding
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- w.Drain(ctx) }()
	// New requests are refused once the drain is applied.
	var refused error
	for i := 0; refused == nil && i < 1000; i++ {
		s2, err := w.Generate(ctx, &openai.GenerateRequest{RID: fmt.Sprintf("new-%d", i),
			InputIDs: []int32{1}, MaxTokens: 1, Sampling: model.SamplingParams{TopP: 1}})
		if err != nil {
			t.Fatal(err)
		}
		_, refused = s2.Recv()
		s2.Close()
	}
	var we *workerapi.Error
	if !errors.As(refused, &we) || we.Outcome != outcome.Draining || we.Status != http.StatusServiceUnavailable ||
		we.OpenAI().RetryAfter <= 0 {
		t.Fatalf("new request while draining: %v", refused)
	}
	if code, hl, ra := getHealth(t, h, workerapi.PathHealth); code != http.StatusServiceUnavailable || hl.Status != workerapi.HealthDraining || ra != "1" || hl.Live != 1 {
		t.Fatalf("health while draining: %d %+v retry-after %q", code, hl, ra)
	}
	if code, _, _ := getHealth(t, h, workerapi.PathLive); code != http.StatusOK {
		t.Fatalf("livez while draining: %d", code)
	}
	n := 1
	for {
		c, err := s.Recv()
		if err != nil {
			t.Fatalf("admitted request failed while draining: %v", err)
		}
		n += len(c.Tokens)
		if c.FinishReason != "" {
			break
		}
	}
	if n != 20 {
		t.Fatalf("admitted request got %d tokens, want 20", n)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return once the admitted request ended")
	}
}

// TestDrainTimeout: Drain returns ctx's error when what it admitted does not
// end in time; Shutdown then fails it.
func TestDrainTimeout(t *testing.T) {
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32},
		ContextLen: 4096, DecodePerStep: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Model: m, Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	s, err := w.Generate(context.Background(), &openai.GenerateRequest{RID: "long", InputIDs: []int32{1}, MaxTokens: 2000,
		IgnoreEOS: true, Sampling: model.SamplingParams{TopP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain: %v", err)
	}
	if err := w.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := s.Recv()
		if err != nil {
			var we *workerapi.Error
			if !errors.As(err, &we) || we.Outcome != outcome.Shutdown {
				t.Fatalf("after shutdown: %v", err)
			}
			return
		}
	}
}

// TestStoppedWorkerAnswersDraining: once Shutdown stopped the worker's loop,
// /health answers 503 "draining", not "loop not answering": a router still
// checking it while the process stops sees a worker going away, not a
// stuck one to warn about.
func TestStoppedWorkerAnswersDraining(t *testing.T) {
	w := startSim(t, 256)
	if err := w.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, hl, _ := getHealth(t, w.Handler(nil), workerapi.PathHealth); code != http.StatusServiceUnavailable || hl.Status != workerapi.HealthDraining {
		t.Fatalf("health after Shutdown: %d %+v, want 503 draining", code, hl)
	}
}

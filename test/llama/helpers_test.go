package llama_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
)

// factory loads dir once and returns a cluster.ModelFactory of clones
// sharing its weights, as `pdserve --model DIR` does. Every instance is
// closed at cleanup, after the servers (registered later) have shut down.
func factory(t *testing.T, dir string, opts llama.Options) (cluster.ModelFactory, *llama.Model) {
	t.Helper()
	base, err := llama.Load(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	made := []*llama.Model{base}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range made {
			if err := m.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return func() (model.Model, error) {
		m, err := base.Clone()
		if err != nil {
			return nil, err
		}
		mu.Lock()
		made = append(made, m)
		mu.Unlock()
		return m, nil
	}, base
}

// machine is the lifecycle config of test workers: the default deadlines
// and heartbeat (a CPU model saturates the cores, and CI machines are shared:
// a sub-second heartbeat could declare a busy peer dead), and prompts
// prefilled in chunks of at most chunk tokens.
func machine(chunk int) lifecycle.Config {
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.MaxPrefillTokens = chunk
	return mc
}

// startServe starts one colocated worker (`pdserve serve`) on newModel.
func startServe(t *testing.T, newModel cluster.ModelFactory, mc lifecycle.Config) *cluster.WorkerServer {
	t.Helper()
	m, err := newModel()
	if err != nil {
		t.Fatal(err)
	}
	mc.Role = lifecycle.RoleColocated
	s, err := cluster.StartWorker(cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

// startPD starts a router with one prefill and one decode worker (`pdserve
// up`) on newModel.
func startPD(t *testing.T, newModel cluster.ModelFactory, mc lifecycle.Config) *cluster.Cluster {
	t.Helper()
	return startPDWith(t, newModel, mc, cluster.RouterTuning{})
}

// startPDWith is startPD with the router tuned by rt.
func startPDWith(t *testing.T, newModel cluster.ModelFactory, mc lifecycle.Config, rt cluster.RouterTuning) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: newModel, Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 256 << 20},
		HealthInterval: 100 * time.Millisecond, Router: cluster.RouterOptions{RouterTuning: rt}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return c
}

// completionRequest is the body of a /v1/completions request with a
// token-id prompt.
type completionRequest struct {
	Prompt         []int32 `json:"prompt"`
	MaxTokens      int     `json:"max_tokens"`
	Temperature    float64 `json:"temperature"`
	Seed           *int    `json:"seed,omitempty"`
	IgnoreEOS      bool    `json:"ignore_eos"`
	ReturnTokenIDs bool    `json:"return_token_ids"`
}

// complete posts a completion request to base (a server's URL) and returns
// the generated token ids.
func complete(base string, req completionRequest) ([]int32, error) {
	req.ReturnTokenIDs = true
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	var out struct {
		Choices []struct {
			TokenIDs     []int32 `json:"token_ids"`
			FinishReason string  `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%v: %s", err, body)
	}
	if len(out.Choices) != 1 {
		return nil, fmt.Errorf("%d choices: %s", len(out.Choices), body)
	}
	return out.Choices[0].TokenIDs, nil
}

// completeAll sends every request at once (so the workers batch them) and
// returns the outputs in order.
func completeAll(t *testing.T, base string, reqs []completionRequest) [][]int32 {
	t.Helper()
	outs := make([][]int32, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = complete(base, reqs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return outs
}

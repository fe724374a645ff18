package llama_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/openai/openaitest"
)

// killAfter is an openai.Engine around a cluster's router that, once a
// request's stream returned after tokens, shuts down the worker serving
// it (its decode worker, or its colocated one), once: the worker fails
// its live requests, and the router continues them elsewhere.
type killAfter struct {
	c     *cluster.Cluster
	after int
	once  sync.Once
	t     *testing.T
}

func (k *killAfter) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	st, err := k.c.Router.Router.Generate(ctx, g)
	if err != nil {
		return nil, err
	}
	return &killStream{Stream: st, k: k, rid: g.RID}, nil
}

type killStream struct {
	openai.Stream
	k   *killAfter
	rid string
	n   int
}

func (s *killStream) Recv() (openai.Chunk, error) {
	c, err := s.Stream.Recv()
	s.n += len(c.Tokens)
	if err == nil && s.n >= s.k.after && c.FinishReason == "" {
		s.k.once.Do(func() { s.k.kill(s.rid) })
	}
	return c, err
}

// kill shuts down the worker that serves rid now: the last worker of the
// router's "prefill → decode" peers (the colocated one in plain mode).
func (k *killAfter) kill(rid string) {
	info, ok := k.c.Router.Router.Request(rid)
	if !ok {
		k.t.Errorf("request %s not tracked by the router", rid)
		return
	}
	url := info.PeerAddr
	if i := strings.LastIndex(url, "→ "); i >= 0 {
		url = url[i+len("→ "):]
	}
	for _, w := range k.c.Workers() {
		if w.URL == url {
			// It fails its live requests and waits for their answers to be
			// written (a line each, which the socket takes unread).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.Shutdown(ctx); err != nil {
				k.t.Errorf("shutdown of %s: %v", url, err)
			}
			return
		}
	}
	k.t.Errorf("no worker at %q (peers %q)", url, info.PeerAddr)
}

// paced is a model whose decode steps take at least step longer: the
// stand-in for a bigger model, so that a worker shut down after some of a
// request's output is still generating it.
type paced struct {
	model.Model
	step time.Duration
}

func (p paced) Forward(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput, out []model.SeqOutput) error {
	t := time.NewTimer(p.step)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Model.Forward(ctx, pool, seqs, out)
}

// migrations sums the router's pdserve_router_migrations_total.
func migrations(t *testing.T, c *cluster.Cluster) float64 {
	t.Helper()
	mfs, err := c.Router.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "pdserve_router_migrations_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestMigrationExactOnStories260K: on the real model (stories260K), a
// request whose decode worker (PD) or colocated worker (plain mode) shuts
// down after some of its output reached the client is continued on the
// other one, and its whole output — token ids, logprobs and top logprobs —
// equals a colocated worker's uninterrupted run, bit for bit: greedy and
// seeded sampling, with penalties and min_tokens, n = 3 (continued choice
// by choice), prefix cache on and off.
// The continuation's prefill recomputes the output so far in one chunked
// forward where the first run decoded it a token at a time: exactness
// rests on the kernels giving the same bits for any chunking and batch.
func TestMigrationExactOnStories260K(t *testing.T) {
	t.Parallel()
	refs := llamatest.References(t)
	newModel, _ := factory(t, llamatest.Stories260K(t), llama.Options{})
	maxTokens := 40
	if raceEnabled {
		maxTokens = 16
	}
	cases := []openai.GenerateRequest{
		{Sampling: model.SamplingParams{TopP: 1, TopLogprobs: 2}},
		{MinTokens: maxTokens - 2, Sampling: model.SamplingParams{Temperature: 0.9, TopP: 0.95, Seed: 11, TopLogprobs: 3,
			FrequencyPenalty: 0.5, PresencePenalty: 0.3, RepetitionPenalty: 1.1}},
		{Sampling: model.SamplingParams{Temperature: 1.2, TopP: 1, TopK: 20, Seed: 12345}},
		{N: 3, Sampling: model.SamplingParams{Temperature: 0.8, TopP: 1, Seed: 99, TopLogprobs: 1, PresencePenalty: 0.4}},
	}
	for _, mode := range []string{"pd", "plain"} {
		for _, prefix := range []bool{false, true} {
			mc := machine(16)
			mc.PrefixCache = prefix
			co := startServe(t, newModel, mc)
			for i, g := range cases {
				t.Run(fmt.Sprintf("%s/prefix=%v/case%d", mode, prefix, i), func(t *testing.T) {
					g.RID, g.InputIDs, g.MaxTokens, g.IgnoreEOS = fmt.Sprintf("m%d", i), refs[i%len(refs)].Tokens, maxTokens, true
					slow := func() (model.Model, error) {
						m, err := newModel()
						return paced{Model: m, step: 2 * time.Millisecond}, err
					}
					opts := cluster.Options{PrefillWorkers: 1, DecodeWorkers: 2, NewModel: slow,
						Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20}, HealthInterval: 100 * time.Millisecond}
					if mode == "plain" {
						opts.PrefillWorkers, opts.DecodeWorkers, opts.ColocatedWorkers = 0, 0, 2
					}
					c, err := cluster.Up(context.Background(), opts)
					if err != nil {
						t.Fatal(err)
					}
					defer func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if err := c.Shutdown(ctx); err != nil {
							t.Errorf("shutdown: %v", err)
						}
					}()
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					want, err := openaitest.Run(ctx, co.Worker, g)
					if err != nil {
						t.Fatalf("colocated: %v", err)
					}
					got, err := openaitest.Run(ctx, &killAfter{c: c, after: maxTokens / 3, t: t}, g)
					if err != nil {
						t.Fatalf("with its worker shut down mid-stream: %v", err)
					}
					if d := cmp.Diff(want, got); d != "" {
						t.Fatalf("the continued output differs from the uninterrupted one (-uninterrupted +continued):\n%s", d)
					}
					if n := migrations(t, c); n != 1 {
						t.Fatalf("%v migrations, want 1", n)
					}
				})
			}
		}
	}
}

package bench

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// TestAgainstPDServe benchmarks a real in-process pdserve (router + 1
// prefill + 1 decode worker, the simulated model with a small KV shape):
// 30 requests, all successful, with the token counts asked for and sane
// latencies and throughput.
func TestAgainstPDServe(t *testing.T) {
	geo := kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvcache.BF16}
	// Design defaults (1 s heartbeat): a loaded test machine must not
	// expire leases.
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.PrefixCache = true // on, as `pdserve up` has it by default
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: func() (model.Model, error) {
			return sim.New(sim.Config{Geometry: geo, ContextLen: 2048})
		},
		Worker:         cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20},
		HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()

	// Multi-turn chat against the real front end: every turn's history
	// (with the answers the model gave) is a valid conversation, and each
	// turn's prompt holds the previous one and a new 48-token message.
	t.Run("multi-turn", func(t *testing.T) {
		cfg := Config{BaseURL: c.URL(), Endpoint: EndpointChat, NumPrompts: 4, MultiTurn: 3, Rates: []Rate{InfRate()},
			Seed: 2, Dataset: DatasetRandom, RandomInputLen: 48, RandomOutputLen: 8, IgnoreEOS: true, ReturnTokenIDs: true,
			Timeout: 2 * time.Minute}
		rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
		if err != nil {
			t.Fatal(err)
		}
		s := rep.Runs[0].Summary
		if s.Succeeded != 12 || len(s.Turns) != 3 {
			t.Fatalf("succeeded %d (%v), turns %+v", s.Succeeded, s.Errors, s.Turns)
		}
		recs := rep.Runs[0].Records
		for i, r := range recs {
			if r.Turn > 1 && r.InputTokens < recs[i-1].InputTokens+48 {
				t.Errorf("conversation %d turn %d: %d prompt tokens after %d", r.Conversation, r.Turn, r.InputTokens, recs[i-1].InputTokens)
			}
		}
	})
	// A trace replay, one request after another in trace order: every
	// request finds cached exactly the prompt tokens of its leading blocks
	// that an earlier request of the trace had (whole pages: the blocks
	// are 4 pages), and no more.
	t.Run("trace", func(t *testing.T) {
		const bs = 64
		lines := []string{
			traceLineJSON(0, 3*bs+9, 4, 1, 2, 3, 4),
			traceLineJSON(10, 2*bs+20, 3, 1, 2, 5),
			traceLineJSON(20, bs+30, 5, 6, 7),
			traceLineJSON(30, 4*bs, 2, 1, 2, 3, 8),
			traceLineJSON(40, 2*bs+1, 3, 6, 9, 10),
			traceLineJSON(50, 3*bs, 4, 11, 2, 3),
			traceLineJSON(60, 5*bs+3, 6, 1, 2, 3, 8, 12, 13),
		}
		path := writeTrace(t, lines...)
		recs, err := ParseTrace(strings.NewReader(strings.Join(lines, "\n")), "t", bs)
		if err != nil {
			t.Fatal(err)
		}
		want := repeatedTokens(recs, bs)
		finished := make(chan struct{}, 2*len(lines))
		tr := &http.Transport{MaxIdleConnsPerHost: 16}
		t.Cleanup(tr.CloseIdleConnections)
		cfg := Config{BaseURL: c.URL(), Endpoint: EndpointCompletions, Dataset: DatasetTrace, TracePath: path,
			TraceBlockSize: bs, TraceTimeScale: 1, Seed: 5, Warmup: 1, IgnoreEOS: true, ReturnTokenIDs: true,
			Timeout: 2 * time.Minute}
		var out bytes.Buffer
		rep, err := Run(context.Background(), Options{Config: cfg, Out: &out,
			Client: &http.Client{Transport: finishTransport{RoundTripper: tr, finished: finished}},
			// A fake clock moves only when the run sleeps, so it sleeps
			// (and waits for the request before) at every increasing
			// timestamp however long the requests take.
			Clock: &inOrderClock{Clock: newFakeClock(), warmup: 1, finished: finished}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("\n%s", out.String())
		s := rep.Runs[0].Summary
		if s.Succeeded != len(lines) {
			t.Fatalf("succeeded %d of %d: %v", s.Succeeded, len(lines), s.Errors)
		}
		for i, r := range rep.Runs[0].Records {
			if r.InputTokens != recs[i].InputLength || r.OutputTokens != recs[i].OutputLength || !r.CachedReported || r.CachedTokens != want[i] {
				t.Errorf("request %d: %d prompt, %d output, %d cached tokens (reported %v); want %d, %d, %d",
					i, r.InputTokens, r.OutputTokens, r.CachedTokens, r.CachedReported, recs[i].InputLength, recs[i].OutputLength, want[i])
			}
		}
		if s.Cache == nil || s.Cache.OfOracle == nil || *s.Cache.OfOracle != 1 || s.Trace == nil || s.Trace.RepeatedBlocks != 2+0+3+1+0+4 {
			t.Errorf("cache %+v, trace %+v: want every repeated block found", s.Cache, s.Trace)
		}
	})
	for _, ep := range []Endpoint{EndpointCompletions, EndpointChat} {
		t.Run(string(ep), func(t *testing.T) {
			cfg := Config{BaseURL: c.URL(), Endpoint: ep, NumPrompts: 30, Rates: []Rate{200}, MaxConcurrency: 8,
				Seed: 1, Warmup: 2, Dataset: DatasetRandom, RandomInputLen: 64, RandomOutputLen: 16,
				IgnoreEOS: true, ReturnTokenIDs: true, Timeout: 2 * time.Minute, SLOTTFT: 20 * time.Second}
			var out bytes.Buffer
			rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
			if err != nil {
				t.Fatal(err)
			}
			s := rep.Runs[0].Summary
			t.Logf("\n%s", out.String())
			if s.Succeeded != 30 || s.Failed != 0 || !hasRow(out.String(), "Successful requests", "30") {
				t.Fatalf("succeeded %d, failed %d (%v), want 30 and 0", s.Succeeded, s.Failed, s.Errors)
			}
			if rep.Config.Model != sim.DefaultName {
				t.Errorf("model %q, want %q from /v1/models", rep.Config.Model, sim.DefaultName)
			}
			// The simulated model has a byte tokenizer and no BOS: a
			// completion prompt is exactly its 64 bytes; a chat prompt adds
			// the chat template.
			if ep == EndpointCompletions && s.InputTokens != 30*64 {
				t.Errorf("input tokens %d, want %d", s.InputTokens, 30*64)
			}
			if ep == EndpointChat && s.InputTokens <= 30*64 {
				t.Errorf("input tokens %d, want more than the %d prompt bytes", s.InputTokens, 30*64)
			}
			if s.OutputTokens != 30*16 {
				t.Errorf("output tokens %d, want %d (ignore_eos)", s.OutputTokens, 30*16)
			}
			for _, r := range rep.Runs[0].Records {
				if !r.UsageReported || r.TTFT <= 0 || r.TTFT > r.E2E || !r.HasTPOT {
					t.Fatalf("record %+v", r)
				}
			}
			if s.TTFT.Count != 30 || s.TTFT.Median <= 0 || s.TTFT.Median > 20000 || s.TTFT.P99 < s.TTFT.Median {
				t.Errorf("TTFT %+v: want 30 values, median in (0, 20 s]", s.TTFT)
			}
			if s.E2E.Median < s.TTFT.Median || s.Duration <= 0 {
				t.Errorf("E2E %+v, duration %v s", s.E2E, s.Duration)
			}
			// 30 requests arriving at 200/s take at least the last arrival
			// time, so the throughput cannot beat the offered load by much.
			last := rep.Runs[0].Records[29].Arrival.Seconds()
			if s.RequestThroughput <= 0 || s.RequestThroughput > 30/last ||
				!approx(s.OutputThroughput, 16*s.RequestThroughput) {
				t.Errorf("throughput %.2f req/s, %.2f tok/s (last arrival at %.3f s)", s.RequestThroughput, s.OutputThroughput, last)
			}
			if s.Goodput == nil || s.Goodput.Requests != 30 {
				t.Errorf("goodput %+v, want every request within a 20 s TTFT", s.Goodput)
			}
		})
	}
}

package worker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/tcp"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

func testSim(t *testing.T, decodeStep time.Duration) model.Model {
	t.Helper()
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32},
		ContextLen: 256, DecodePerStep: decodeStep})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitFor polls cond every millisecond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoadAndQueueBound: a worker reports its load (live requests, the
// queue MaxQueued bounds, the prompt tokens it holds, its limits) on
// /internal/v1/load, and refuses a request beyond its queue bound with
// overloaded (429 with Retry-After) while the admitted ones go on.
func TestLoadAndQueueBound(t *testing.T) {
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.MaxRunning, mc.MaxQueued = 1, 1
	w, err := New(Config{Model: testSim(t, 5*time.Millisecond), Machine: mc, KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w.Start()
	defer w.Shutdown(context.Background())
	h := w.Handler(nil)
	ctx := context.Background()
	gen := func(rid string, prompt int) openai.Stream {
		s, err := w.Generate(ctx, &openai.GenerateRequest{RID: rid, InputIDs: make([]int32, prompt), MaxTokens: 40,
			IgnoreEOS: true, Sampling: model.SamplingParams{TopP: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	running := gen("running", 3)
	defer running.Close()
	if _, err := running.Recv(); err != nil {
		t.Fatal(err)
	}
	queued := gen("queued", 5) // MaxRunning 1: it waits
	defer queued.Close()
	var load workerapi.Health
	waitFor(t, "the second request to queue", func() bool {
		_, load, _ = getHealth(t, h, workerapi.PathLoad)
		return load.Queued == 1
	})
	if load.Live != 2 || load.PromptTokens != 8 || load.MaxRunning != 1 || load.MaxQueued != 1 || load.PageSize != mc.PageSize ||
		load.PagesTotal == 0 || load.Status != workerapi.HealthOK {
		t.Fatalf("load %+v, want 2 live, 1 queued, 8 prompt tokens, the limits", load)
	}
	over := gen("over", 2)
	defer over.Close()
	_, err = over.Recv()
	var we *workerapi.Error
	if !errors.As(err, &we) || we.Outcome != outcome.Overloaded || we.Status != http.StatusTooManyRequests ||
		we.OpenAI().RetryAfter != workerapi.OverloadRetryAfter || !strings.Contains(we.Message, "--max-queued-requests 1") {
		t.Fatalf("request beyond the queue bound: %v", err)
	}
	for _, s := range []openai.Stream{running, queued} {
		for {
			c, err := s.Recv()
			if err != nil {
				t.Fatalf("admitted request failed: %v", err)
			}
			if c.FinishReason != "" {
				break
			}
		}
	}
	waitFor(t, "the load to drop", func() bool {
		_, load, _ = getHealth(t, h, workerapi.PathLoad)
		return load.Live == 0
	})
	if load.PromptTokens != 0 || load.Queued != 0 {
		t.Fatalf("load after the requests ended: %+v", load)
	}
	// Two requests of 40 tokens, one at a time (MaxRunning 1): at least 78
	// decode forwards of the 5 ms step, every prompt token computed once.
	if load.ForwardSeconds < 0.39 || load.ForwardSeconds > time.Since(start).Seconds() || load.PromptTokensComputed != 8 {
		t.Fatalf("forward time %.3f s (want ≥ 0.39 s, ≤ the %s the test ran), prompt tokens computed %d (want 8)",
			load.ForwardSeconds, time.Since(start), load.PromptTokensComputed)
	}
}

// TestDecodeReportsKVPaths: asked about prefill KV addresses, a decode
// worker dials them and its first answer says how each went: up, refused
// (with the refusal's reason: another internal secret) or unreachable; without
// the query it lists every path it knows.
func TestDecodeReportsKVPaths(t *testing.T) {
	m := testSim(t, 0)
	mc := lifecycle.DefaultConfig(lifecycle.RoleDecode)
	fp := FingerprintOf(m.Info(), mc.PageSize)
	prefill := func(auth string) string {
		b := tcp.New(tcp.Config{Fingerprint: fp, Secret: []byte(auth)})
		t.Cleanup(func() { b.Close() })
		addr, err := b.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
	good, wrongAuth := prefill("secret"), prefill("other")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	w, err := New(Config{Model: m, Machine: mc, KVCacheMemory: 1 << 20,
		Backend: func(h kvxfer.Handler, fp kvxfer.Fingerprint, bufs DataBuffers) (kvxfer.Backend, error) {
			return tcp.New(tcp.Config{Fingerprint: fp, Secret: []byte("secret"), Handler: h}), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
	h := w.Handler(nil)
	code, hl, _ := getHealth(t, h, workerapi.PathHealth+"?kv_peers="+good+","+wrongAuth+","+closed)
	if code != http.StatusOK || len(hl.KVPaths) != 3 {
		t.Fatalf("health: %d %+v", code, hl)
	}
	want := map[string][2]string{good: {workerapi.KVPathUp, ""}, wrongAuth: {workerapi.KVPathRefused, "auth"},
		closed: {workerapi.KVPathUnreachable, ""}}
	for _, p := range hl.KVPaths {
		if w := want[p.Addr]; p.State != w[0] || p.Refusal != w[1] {
			t.Errorf("path %s: %+v, want state %s refusal %q", p.Addr, p, w[0], w[1])
		}
		switch p.Addr {
		case wrongAuth:
			if !strings.Contains(p.Reason, kvxfer.RefusalTextAuth) {
				t.Errorf("refused path's reason %q", p.Reason)
			}
		case closed:
			if !strings.Contains(p.Reason, "refused") { // ECONNREFUSED
				t.Errorf("unreachable path's reason %q", p.Reason)
			}
		}
	}
	if _, all, _ := getHealth(t, h, workerapi.PathHealth); len(all.KVPaths) != 3 {
		t.Errorf("health without a query lists %d paths, want the 3 known", len(all.KVPaths))
	}
	if code, _, _ := getHealth(t, h, workerapi.PathHealth+"?kv_peers=nonsense"); code != http.StatusBadRequest {
		t.Errorf("a malformed kv_peers: %d, want 400", code)
	}
}

// TestTTFTAndE2ECountAlike: a request aborted after its first token is in
// the E2E histogram as it is in TTFT's, so the two counts agree; one
// rejected before any token is in neither.
func TestTTFTAndE2ECountAlike(t *testing.T) {
	reg := prometheus.NewRegistry()
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.MaxQueued = 1
	w, err := New(Config{Model: testSim(t, 5*time.Millisecond), Machine: mc, KVCacheMemory: 1 << 20, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
	ctx := context.Background()
	s, err := w.Generate(ctx, &openai.GenerateRequest{RID: "aborted", InputIDs: []int32{1, 2}, MaxTokens: 100, IgnoreEOS: true,
		Sampling: model.SamplingParams{TopP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Close() // the client goes away after its first token
	counts := func() (ttft, e2e uint64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "pdserve_time_to_first_token_seconds":
				ttft = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			case "pdserve_e2e_request_latency_seconds":
				e2e = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		return ttft, e2e
	}
	waitFor(t, "the aborted request's end", func() bool { _, e := counts(); return e == 1 })
	if ttft, e2e := counts(); ttft != 1 || e2e != 1 {
		t.Fatalf("TTFT count %d, E2E count %d after an abort, want 1 and 1", ttft, e2e)
	}
}

// TestQueuedForCapacity: the reported queue counts what waits for pages,
// and what waits for a batch slot beyond those free: not what the next
// forward takes anyway, nor prefill's bootstrap.
func TestQueuedForCapacity(t *testing.T) {
	type st = map[lifecycle.Stage]int
	for _, c := range []struct {
		role   lifecycle.Role
		stages st
		maxRun int
		want   int
	}{
		{lifecycle.RolePrefill, st{lifecycle.StageBootstrap: 9, lifecycle.StageWaiting: 3, lifecycle.StagePrefilling: 1}, 256, 0},
		{lifecycle.RolePrefill, st{lifecycle.StageWaiting: 6, lifecycle.StagePrefilling: 2}, 4, 4},
		{lifecycle.RoleDecode, st{lifecycle.StagePrealloc: 2, lifecycle.StageQueued: 5, lifecycle.StageDecoding: 4,
			lifecycle.StagePreempted: 1, lifecycle.StageAwaitingKV: 7}, 6, 3 + 3},
		{lifecycle.RoleDecode, st{lifecycle.StageQueued: 5, lifecycle.StageDecoding: 1}, 256, 0},
		{lifecycle.RoleColocated, st{lifecycle.StageWaiting: 5, lifecycle.StagePrefilling: 1, lifecycle.StageDecoding: 2,
			lifecycle.StagePreempted: 1}, 4, 1 + 4},
	} {
		if got := queuedForCapacity(c.role, c.stages, c.maxRun); got != c.want {
			t.Errorf("%s %v max_running %d: %d, want %d", c.role, c.stages, c.maxRun, got, c.want)
		}
	}
}

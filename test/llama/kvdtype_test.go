package llama_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestSyntheticKVDTypePD serves qwen3Narrow with its KV cache in f32, bf16
// and f16, colocated and disaggregated, and checks for each dtype that the
// PD answers to the 20 random greedy and sampled prompts of
// checkPDEqualsColocated equal the colocated ones token for token, and
// that the decode worker received exactly half the KV bytes in a 2-byte
// dtype that it received in f32 for the same prompts
// (pdserve_kv_transfer_bytes_total counts page bytes: the pages travel in
// the stored dtype). Under the race detector the model has 1 layer and
// generates fewer tokens.
func TestSyntheticKVDTypePD(t *testing.T) {
	t.Parallel()
	spec := qwen3Narrow()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	dir := spec.WriteT(t)
	reqs := mixedRequests(spec.Vocab, maxTokens)
	received := map[kvcache.DType]float64{}
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			newModel, base := factory(t, dir, llama.Options{Name: "qwen3-shaped", KVDType: dt})
			if g := base.Info().Geometry.DType; g != dt {
				t.Fatalf("KV dtype %v, want %v", g, dt)
			}
			mc := machine(32)
			colocated := completeAll(t, startServe(t, newModel, mc).URL, reqs)
			c := startPD(t, newModel, mc)
			pd := completeAll(t, c.URL(), reqs)
			comparePD(t, reqs, colocated, pd, maxTokens)
			received[dt] = kvBytesReceived(t, c.Decode[0])
		})
	}
	f32 := received[kvcache.F32]
	if f32 == 0 {
		t.Fatalf("decode received no KV bytes in f32 (%v)", received)
	}
	for _, dt := range []kvcache.DType{kvcache.BF16, kvcache.F16} {
		r := received[dt] / f32
		t.Logf("KV bytes received by decode: %v %.0f, f32 %.0f (%.4f×)", dt, received[dt], f32, r)
		if 2*received[dt] != f32 {
			t.Errorf("%v: decode received %.0f KV bytes, %.4f× f32's %.0f; want ½", dt, received[dt], r, f32)
		}
	}
}

// kvBytesReceived reads a decode worker's
// pdserve_kv_transfer_bytes_total{direction="received"}.
func kvBytesReceived(t *testing.T, s *cluster.WorkerServer) float64 {
	t.Helper()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_kv_transfer_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "direction" && l.GetValue() == "received" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSyntheticKVDTypePrefixCache runs the prefix-cache conversations of
// TestSyntheticSmolLM2PrefixCache on qwen3Narrow with an f16 KV cache:
// pages kept by the cache, and taken from it by decode after a transfer,
// hold the same f16 bits prefill computed. Under the race detector the
// model has 1 layer and generates fewer tokens.
func TestSyntheticKVDTypePrefixCache(t *testing.T) {
	t.Parallel()
	spec := qwen3Narrow()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	checkPrefixCache(t, spec.WriteT(t), llama.Options{Name: "qwen3-shaped", KVDType: kvcache.F16}, spec.Vocab, maxTokens)
}

// TestKVDTypeMismatchNotPaired: a prefill worker with an f16 KV cache and
// a decode worker with an f32 one (the same weights otherwise) are never
// paired: GET /workers says why, naming the dtypes, and a request is
// refused with 503 instead of moving KV the decode worker would misread.
func TestKVDTypeMismatchNotPaired(t *testing.T) {
	t.Parallel()
	spec := qwen3Narrow()
	dir := spec.WriteT(t)
	newF16, _ := factory(t, dir, llama.Options{Name: "qwen3-shaped", KVDType: kvcache.F16})
	newF32, _ := factory(t, dir, llama.Options{Name: "qwen3-shaped", KVDType: kvcache.F32})
	// cluster.Up builds the prefill worker's model first, then the decode
	// worker's, then the router's description of the model.
	calls := 0
	newModel := func() (model.Model, error) {
		calls++
		if calls == 1 {
			return newF16()
		}
		return newF32()
	}
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: newModel, Worker: cluster.WorkerOptions{Machine: machine(32), KVCacheMemory: 64 << 20},
		HealthInterval: 100 * time.Millisecond})
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
	if p, d := c.Prefill[0].Worker.Fingerprint(), c.Decode[0].Worker.Fingerprint(); p.DType != "f16" || d.DType != "f32" {
		t.Fatalf("fingerprints %+v and %+v, want dtypes f16 and f32", p, d)
	}
	resp, err := http.Get(c.URL() + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Workers []struct {
			Role    string `json:"role"`
			Pairing struct {
				NoPair string `json:"no_pair"`
			} `json:"pairing"`
		} `json:"workers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"prefill": "no compatible decode: dtype f16 vs f32", "decode": "no compatible prefill: dtype f32 vs f16"}
	for _, w := range v.Workers {
		if w.Pairing.NoPair != want[w.Role] {
			t.Errorf("%s worker: no_pair %q, want %q", w.Role, w.Pairing.NoPair, want[w.Role])
		}
	}
	if len(v.Workers) != 2 {
		t.Errorf("GET /workers lists %d workers, want 2", len(v.Workers))
	}
	_, err = complete(c.URL(), completionRequest{Prompt: []int32{1, 2, 3, 4}, MaxTokens: 2, IgnoreEOS: true})
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("a request to the mismatched pair: %v, want a 503", err)
	}
	if n := kvBytesReceived(t, c.Decode[0]); n != 0 {
		t.Errorf("decode received %v KV bytes from a prefill worker of another dtype", n)
	}
}

// TestStories260KF16KV runs the stories260K reference sequences through a
// prefill/decode pair with an F16 KV cache (llama.DefaultKVDType, what
// `pdserve up --model` uses) and checks every greedy continuation (up to 48
// tokens) against llama.cpp's, computed with an F32 KV cache.
func TestStories260KF16KV(t *testing.T) {
	t.Parallel()
	refs := llamatest.References(t)
	newModel, _ := factory(t, llamatest.Stories260K(t), llama.Options{KVDType: llama.DefaultKVDType})
	c := startPD(t, newModel, machine(64))
	checkGreedy(t, refs, completeAll(t, c.URL(), storiesRequests(refs)))
}

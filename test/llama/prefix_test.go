package llama_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestSyntheticSmolLM2PrefixCache: on the SmolLM2-shaped checkpoint,
// two-turn conversations that share a system prompt (the second turn
// resends the first prompt and its answer), greedy and seeded, give the
// same tokens through a colocated worker and a PD pair that both keep a
// prefix cache as through a colocated worker without one (invariant 5 with
// the cache). The cached worker computes the later turns from their first
// uncached page, decode takes the first turn's pages (prompt and output)
// from its own cache, and no transfer fails its checksum: the KV decode
// kept is bit for bit what prefill computes.
func TestSyntheticSmolLM2PrefixCache(t *testing.T) {
	t.Parallel()
	spec := llamatest.SmolLM2135M()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, spec.Vocab, maxTokens = 2, 8192, 4
	}
	checkPrefixCache(t, spec.WriteT(t), llama.Options{Name: "smollm2-shaped"}, spec.Vocab, maxTokens)
}

// checkPrefixCache runs the conversations of TestSyntheticSmolLM2PrefixCache
// on the model at path (loaded with opts; vocab tokens).
func checkPrefixCache(t *testing.T, path string, opts llama.Options, vocab, maxTokens int) {
	t.Helper()
	newModel, _ := factory(t, path, opts)
	mc := machine(32)
	plain := startServe(t, newModel, mc)
	mc.PrefixCache = true
	cached := startServe(t, newModel, mc)
	pd := startPD(t, newModel, mc)
	rng := rand.New(rand.NewPCG(21, 21))
	toks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1 + rng.IntN(vocab-1))
		}
		return out
	}
	system := toks(40)
	for c := range 6 {
		prompt := slices.Concat(system, toks(3+rng.IntN(12)))
		for turn := range 2 {
			req := completionRequest{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true}
			if c%2 == 1 {
				seed := 10*c + turn
				req.Temperature, req.Seed = 0.9, &seed
			}
			var outs [3][]int32
			for i, s := range []string{plain.URL, cached.URL, pd.URL()} {
				out, err := complete(s, req)
				if err != nil {
					t.Fatalf("conversation %d turn %d: %v", c, turn, err)
				}
				outs[i] = out
			}
			if len(outs[0]) != maxTokens || !equal(outs[0], outs[1]) || !equal(outs[0], outs[2]) {
				t.Fatalf("conversation %d turn %d (%d tokens): without a cache %v, colocated with %v, PD with %v",
					c, turn, len(prompt), outs[0], outs[1], outs[2])
			}
			prompt = slices.Concat(prompt, outs[0], toks(2+rng.IntN(6)))
		}
	}
	for _, w := range []struct {
		name string
		s    *cluster.WorkerServer
	}{{"colocated", cached}, {"prefill", pd.Prefill[0]}, {"decode", pd.Decode[0]}} {
		st, ok := w.s.Worker.Stats(10e9)
		if !ok {
			t.Fatalf("%s: loop did not answer", w.name)
		}
		if st.Counters.PrefixHitTokens == 0 {
			t.Errorf("%s: no prefix cache hit", w.name)
		}
		t.Logf("%s: %d of %d tokens hit", w.name, st.Counters.PrefixHitTokens, st.Counters.PrefixQueriedTokens)
	}
	st, _ := pd.Decode[0].Worker.Stats(10e9)
	if n := st.Counters.FramesDropped["wrong_binding"]; n != 0 {
		t.Errorf("decode refused %d bindings", n)
	}
	if n := failedTransfers(t, pd.Decode[0]); n != 0 {
		t.Errorf("%v transfers failed on decode: its cached KV is not what prefill computed", n)
	}
}

// failedTransfers reads pdserve_requests_finished_total{outcome="failed_transfer"}.
func failedTransfers(t *testing.T, s *cluster.WorkerServer) float64 {
	t.Helper()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_requests_finished_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "failed_transfer" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

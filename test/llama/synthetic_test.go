package llama_test

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestSyntheticSmolLM2PD serves a checkpoint with SmolLM2-135M's shape
// (bf16, tied, GQA 9/3; random weights) colocated and disaggregated, and
// checks both give identical tokens for 20 prompts sent at once — 10 greedy,
// 10 sampled with seeds (invariant 5, "same answer"). Under the race
// detector (which slows the Go widening and sampling loops ~10×) the model
// has 2 layers instead of 30 and 8192 tokens instead of 49152, and
// generates fewer tokens.
func TestSyntheticSmolLM2PD(t *testing.T) {
	t.Parallel()
	spec := llamatest.SmolLM2135M()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, spec.Vocab, maxTokens = 2, 8192, 4
	}
	dir := spec.WriteT(t)
	newModel, base := factory(t, dir, llama.Options{Name: "smollm2-shaped"})
	if g := base.Info().Geometry; g.Layers != spec.Layers || g.KVHeads != 3 || g.HeadDim != 64 {
		t.Fatalf("geometry %+v", g)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

// TestSyntheticQwen3PD does the same on a GGUF file of llama.cpp's qwen3
// architecture: qwen3Narrow (Qwen3-0.6B's heads: 16 and 8 KV of 128,
// per-head q/k norms; random weights) written by WriteGGUF as Q4_K_M and
// loaded from the file, as `pdserve up --model FILE.gguf` does. Under the
// race detector it has 1 layer and generates fewer tokens.
func TestSyntheticQwen3PD(t *testing.T) {
	t.Parallel()
	spec := qwen3Narrow()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	path := filepath.Join(t.TempDir(), "qwen3-shaped-q4_k_m.gguf")
	if _, err := llama.WriteGGUF(spec.WriteT(t), path, llama.FileQ4_KM); err != nil {
		t.Fatal(err)
	}
	newModel, base := factory(t, path, llama.Options{Name: "qwen3-shaped"})
	if c := base.Config(); !c.QKNorm || c.HeadDim != 128 || c.Heads != 16 || c.KVHeads != 8 || c.Layers != spec.Layers {
		t.Fatalf("config %+v", c)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

// TestSyntheticGemma2PD does the same on a GGUF file of llama.cpp's gemma2
// architecture: llamatest.Gemma2Shaped (gemma-2-2b's layers: 8 heads and
// 4 KV heads of 256, post-norms, GeGLU, soft-capped scores; random
// weights) written as Q4_K_M. Its final soft-capping is lowered from 30 to
// 1, which keeps every logit within ±1: the next-token distribution is then
// nearly flat, so a KV entry that arrived wrong would change the sampled
// and greedy tokens rather than be drowned by the one token this random
// model otherwise predicts with p ≈ 0.999. Its sliding window is 16
// positions (in the even layers), so that most prompts and answers cross
// it.
func TestSyntheticGemma2PD(t *testing.T) {
	t.Parallel()
	spec := llamatest.Gemma2Shaped()
	spec.FinalSoftcap, spec.SlidingWindow = 1, 16
	// gemma-2-2b's heads (8 and 4 KV of 256) on a narrower model: whether
	// PD answers as colocated does depends on the layout, not the width.
	spec.Hidden, spec.Intermediate, spec.Vocab = 512, 1024, 4096
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	path := filepath.Join(t.TempDir(), "gemma2-shaped-q4_k_m.gguf")
	if _, err := llama.WriteGGUF(spec.WriteT(t), path, llama.FileQ4_KM); err != nil {
		t.Fatal(err)
	}
	newModel, base := factory(t, path, llama.Options{Name: "gemma2-shaped"})
	if c := base.Config(); !c.PostNorms || c.HeadDim != 256 || c.FinalSoftcap != 1 || c.AttnSoftcap != 50 || c.SlidingWindow != 16 ||
		len(c.SlidingLayers) != spec.Layers || !c.SlidingLayers[0] || base.Info().ContextLen != spec.MaxPositions {
		t.Fatalf("config %+v, context %d", c, base.Info().ContextLen)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

// qwen3Narrow is llamatest.Qwen3Shaped narrowed for the PD tests: its
// heads (16 and 8 KV of 128, q four times as wide as the hidden size here)
// and q/k norms on a 512-wide model of 2 layers and 4096 tokens, written
// and served in a fraction of the time (whether PD answers as colocated
// does depends on the layout, not the width).
func qwen3Narrow() llamatest.Spec {
	spec := llamatest.Qwen3Shaped()
	spec.Hidden, spec.Intermediate, spec.Vocab, spec.Layers = 512, 1024, 4096, 2
	return spec
}

// checkPDEqualsColocated sends 20 prompts at once (4 to 43 random tokens
// of a vocab-token vocabulary; 10 greedy, 10 sampled with seeds) to a
// colocated worker and to a prefill/decode pair on newModel, prompts longer
// than 32 tokens prefilled in chunks, and checks that every answer has
// maxTokens tokens and is identical in both.
func checkPDEqualsColocated(t *testing.T, newModel cluster.ModelFactory, vocab, maxTokens int) {
	t.Helper()
	reqs := mixedRequests(vocab, maxTokens)
	mc := machine(32) // prompts longer than 32 tokens are prefilled in chunks
	colocated := completeAll(t, startServe(t, newModel, mc).URL, reqs)
	pd := completeAll(t, startPD(t, newModel, mc).URL(), reqs)
	comparePD(t, reqs, colocated, pd, maxTokens)
}

// TestSyntheticSmolLM2Local serves the SmolLM2-shaped checkpoint with
// per-request disaggregation (--disagg-min-prompt-tokens 24: of the 20
// prompts of 4 to 43 tokens, sent at once, the shorter are prefilled by the
// decode worker itself beside the decodes it runs, the longer by the prefill
// worker unless its backlog raised the threshold) and checks every answer
// equals the colocated one.
func TestSyntheticSmolLM2Local(t *testing.T) {
	t.Parallel()
	spec := llamatest.SmolLM2135M()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, spec.Vocab, maxTokens = 2, 8192, 4
	}
	newModel, _ := factory(t, spec.WriteT(t), llama.Options{Name: "smollm2-shaped"})
	reqs := mixedRequests(spec.Vocab, maxTokens)
	mc := machine(32)
	colocated := completeAll(t, startServe(t, newModel, mc).URL, reqs)
	c := startPDWith(t, newModel, mc, cluster.RouterTuning{DisaggMinPromptTokens: 24})
	mixed := completeAll(t, c.URL(), reqs)
	comparePD(t, reqs, colocated, mixed, maxTokens)
	short := 0
	for _, r := range reqs {
		if len(r.Prompt) < 24 {
			short++
		}
	}
	if short == 0 || short == len(reqs) {
		t.Fatalf("%d of %d prompts are short: both paths must be taken", short, len(reqs))
	}
	// Sent at once, a long prompt may find prefill busy and go local too
	// (the threshold rises up to 4 × 24 tokens).
	if n := routerPath(t, c, "local"); n < float64(short) {
		t.Errorf("%v requests served locally, want at least the %d short ones", n, short)
	}
}

// routerPath is the router's ok answers counted under path.
func routerPath(t *testing.T, c *cluster.Cluster, path string) float64 {
	t.Helper()
	mfs, err := c.Router.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_router_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			if have["outcome"] == "ok" && have["path"] == path {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// mixedRequests are 20 completion requests of 4 to 43 random tokens of a
// vocab-token vocabulary, maxTokens each, ignoring EOS: the even ones
// greedy, the odd ones sampled at temperature 0.9 with their index as seed.
func mixedRequests(vocab, maxTokens int) []completionRequest {
	rng := rand.New(rand.NewPCG(20, 20))
	reqs := make([]completionRequest, 20)
	for i := range reqs {
		prompt := make([]int32, 4+rng.IntN(40))
		for j := range prompt {
			prompt[j] = int32(1 + rng.IntN(vocab-1))
		}
		reqs[i] = completionRequest{Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true}
		if i%2 == 1 {
			seed := i
			reqs[i].Temperature, reqs[i].Seed = 0.9, &seed
		}
	}
	return reqs
}

// comparePD checks that every colocated answer has maxTokens tokens and
// that the PD answer is the same.
func comparePD(t *testing.T, reqs []completionRequest, colocated, pd [][]int32, maxTokens int) {
	t.Helper()
	for i := range reqs {
		if len(colocated[i]) != maxTokens || !equal(colocated[i], pd[i]) {
			t.Errorf("prompt %d (%d tokens, temperature %v): colocated %v, PD %v",
				i, len(reqs[i].Prompt), reqs[i].Temperature, colocated[i], pd[i])
		}
	}
}

package llama_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestSyntheticGemma3PD does what TestSyntheticGemma2PD does on a GGUF file
// of llama.cpp's gemma3 architecture: llamatest.Gemma3Shaped's heads (4
// and 1 KV of 256, per-head q/k norms, post-norms, GeGLU) on a 512-wide
// model of 6 layers — five with a sliding window of 16 positions, so that
// most prompts and answers cross it, and RoPE base 10000, one global with
// base 1e6 — written as Q4_K_M. Under the race detector it has 2 layers
// (sliding_window_pattern 2: one of each) and generates fewer tokens.
func TestSyntheticGemma3PD(t *testing.T) {
	t.Parallel()
	spec := gemma3Narrow()
	wantSliding := []bool{true, true, true, true, true, false}
	maxTokens := 8
	if raceEnabled {
		spec.Layers, spec.SlidingPattern, maxTokens = 2, 2, 4
		wantSliding = []bool{true, false}
	}
	path := filepath.Join(t.TempDir(), "gemma3-shaped-q4_k_m.gguf")
	if _, err := llama.WriteGGUF(spec.WriteT(t), path, llama.FileQ4_KM); err != nil {
		t.Fatal(err)
	}
	newModel, base := factory(t, path, llama.Options{Name: "gemma3-shaped"})
	if c := base.Config(); !c.PostNorms || !c.QKNorm || c.HeadDim != 256 || c.SlidingWindow != 16 || c.RopeThetaLocal != 10000 ||
		c.RopeTheta != 1e6 || !slices.Equal(c.SlidingLayers, wantSliding) || base.Info().ContextLen != spec.MaxPositions {
		t.Fatalf("config %+v, context %d", c, base.Info().ContextLen)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

// TestSyntheticPhi3PD does the same on a GGUF file of llama.cpp's phi3
// architecture (fused attn_qkv, ffn_up holding gate and up):
// llamatest.Phi3Shaped's heads of 96 on a 768-wide model (8 heads) of 2
// layers, written as Q4_K_M. Under the race detector it has 1 layer and
// generates fewer tokens.
func TestSyntheticPhi3PD(t *testing.T) {
	t.Parallel()
	spec := phi3Narrow()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	path := filepath.Join(t.TempDir(), "phi3-shaped-q4_k_m.gguf")
	if _, err := llama.WriteGGUF(spec.WriteT(t), path, llama.FileQ4_KM); err != nil {
		t.Fatal(err)
	}
	newModel, base := factory(t, path, llama.Options{Name: "phi3-shaped"})
	if c := base.Config(); c.Architecture != "Phi3ForCausalLM" || c.HeadDim != 96 || c.Heads != 8 || c.Layers != spec.Layers {
		t.Fatalf("config %+v", c)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

// gemma3Narrow is llamatest.Gemma3Shaped at a width the process test serves
// quickly, with a 16-position sliding window its requests cross.
func gemma3Narrow() llamatest.Spec {
	s := llamatest.Gemma3Shaped()
	s.Hidden, s.Intermediate, s.Vocab, s.SlidingWindow = 512, 1024, 4096, 16
	return s
}

// phi3Narrow is llamatest.Phi3Shaped at a width the process test serves
// quickly.
func phi3Narrow() llamatest.Spec {
	s := llamatest.Phi3Shaped()
	s.Hidden, s.Heads, s.KVHeads, s.Intermediate, s.Vocab = 768, 8, 8, 1024, 4096
	return s
}

package llama_test

import (
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// qwen3MoENarrow is llamatest.Qwen3MoEShaped narrowed for the PD tests:
// its heads (16 and 4 KV of 128, per-head q/k norms) and its experts (16,
// 2 per token) on a 512-wide model of 2 layers with experts 256 wide and a
// 4096-token vocabulary (whether PD answers as colocated depends on the
// layout and the routing, not the width).
func qwen3MoENarrow() llamatest.Spec {
	spec := llamatest.Qwen3MoEShaped()
	spec.Hidden, spec.ExpertIntermediate, spec.Vocab, spec.Layers = 512, 256, 4096, 2
	return spec
}

// mixtralNarrow is llamatest.MixtralShaped narrowed as qwen3MoENarrow: its
// heads (16 and 4 KV of 64) and experts (8, 2 per token, each 512 wide) on
// a 512-wide model of 2 layers with a 4096-token vocabulary.
func mixtralNarrow() llamatest.Spec {
	spec := llamatest.MixtralShaped()
	spec.Hidden, spec.Intermediate, spec.Vocab, spec.Layers = 512, 512, 4096, 2
	return spec
}

// TestSyntheticQwen3MoEPD serves a GGUF file of llama.cpp's qwen3moe
// architecture (qwen3MoENarrow written by WriteGGUF as Q4_K_M, loaded from
// the file as `pdserve up --model FILE.gguf` does) colocated and
// disaggregated, and checks both give identical tokens for 20 prompts sent
// at once, 10 greedy and 10 sampled with seeds: the experts a token is
// routed to, and so its KV, must not depend on which other tokens share
// its batch. Under the race detector it has 1 layer and generates fewer tokens.
func TestSyntheticQwen3MoEPD(t *testing.T) {
	t.Parallel()
	spec := qwen3MoENarrow()
	maxTokens := 8
	if raceEnabled {
		spec.Layers, maxTokens = 1, 4
	}
	path := filepath.Join(t.TempDir(), "qwen3moe-shaped-q4_k_m.gguf")
	if _, err := llama.WriteGGUF(spec.WriteT(t), path, llama.FileQ4_KM); err != nil {
		t.Fatal(err)
	}
	newModel, base := factory(t, path, llama.Options{Name: "qwen3moe-shaped"})
	if c := base.Config(); !c.QKNorm || c.Experts != 16 || c.ExpertsUsed != 2 || c.ExpertIntermediate != 256 || !c.NormTopK || c.Layers != spec.Layers {
		t.Fatalf("config %+v", c)
	}
	checkPDEqualsColocated(t, newModel, spec.Vocab, maxTokens)
}

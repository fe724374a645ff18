package llama_test

import (
	"os/exec"
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
	spec := llamatest.Gemma3Shaped()
	spec.Hidden, spec.Intermediate, spec.Vocab, spec.SlidingWindow = 512, 1024, 4096, 16
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
// layers, written as Q4_K_M. Under the race detector it generates fewer
// tokens.
func TestSyntheticPhi3PD(t *testing.T) {
	t.Parallel()
	spec := llamatest.Phi3Shaped()
	spec.Hidden, spec.Heads, spec.KVHeads, spec.Intermediate, spec.Vocab = 768, 8, 8, 1024, 4096
	maxTokens := 8
	if raceEnabled {
		maxTokens = 4
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

// TestGemma3Phi3GGUFProcess does what TestQwen3GGUFProcess does on gemma3
// and phi3 files: `pdserve convert gguf --type q4_k_m` of the checkpoints
// of TestSyntheticGemma3PD and TestSyntheticPhi3PD, then `pdserve serve` and
// `pdserve up --model FILE.gguf`, and the disaggregated answers to 20
// greedy and seeded sampled requests equal the colocated ones.
func TestGemma3Phi3GGUFProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := pdserve.Path(t)
	gemma3 := llamatest.Gemma3Shaped()
	gemma3.Hidden, gemma3.Intermediate, gemma3.Vocab, gemma3.SlidingWindow = 512, 1024, 4096, 16
	phi3 := llamatest.Phi3Shaped()
	phi3.Hidden, phi3.Heads, phi3.KVHeads, phi3.Intermediate, phi3.Vocab = 768, 8, 8, 1024, 4096
	for name, spec := range map[string]llamatest.Spec{"gemma3": gemma3, "phi3": phi3} {
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			ckpt := filepath.Join(tmp, name+"-shaped")
			if err := spec.Write(ckpt); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(tmp, name+"-shaped-q4_k_m.gguf")
			if conv, err := exec.Command(bin, "convert", "gguf", ckpt, file, "--type", "q4_k_m").CombinedOutput(); err != nil {
				t.Fatalf("convert: %v\n%s", err, conv)
			}
			const maxTokens = 8
			reqs := mixedRequests(spec.Vocab, maxTokens)
			answers := map[string][][]int32{}
			for _, c := range serverCommands {
				t.Run(c.name, func(t *testing.T) {
					args := append(slices.Clone(c.args), "--model", file, "--chunked-prefill-size", "32")
					answers[c.name] = completeAll(t, runServer(t, bin, c.re, args...), reqs)
				})
			}
			if len(answers) == 2 {
				comparePD(t, reqs, answers["serve"], answers["up"], maxTokens)
			}
		})
	}
}

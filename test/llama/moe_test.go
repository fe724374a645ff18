package llama_test

import (
	"os/exec"
	"path/filepath"
	"slices"
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

// TestSyntheticQwen3MoEPD serves a GGUF file of llama.cpp's qwen3moe
// architecture (qwen3MoENarrow written by WriteGGUF as Q4_K_M, loaded from
// the file as `pdserve up --model FILE.gguf` does) colocated and
// disaggregated, and checks both give identical tokens for 20 prompts sent
// at once, 10 greedy and 10 sampled with seeds: the experts a token is
// routed to, and so its KV, must not depend on which other tokens share
// its batch. Under the race detector it generates fewer tokens.
func TestSyntheticQwen3MoEPD(t *testing.T) {
	t.Parallel()
	spec := qwen3MoENarrow()
	maxTokens := 8
	if raceEnabled {
		maxTokens = 4
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

// TestQwen3MoEGGUFProcess runs the binary on a qwen3moe file as a user
// would: `pdserve convert gguf --type q4_k_m` of a Qwen3-MoE checkpoint in
// Hugging Face's layout (qwen3MoENarrow: mlp.gate and
// mlp.experts.E.{gate,up,down}_proj), then `pdserve serve` and `pdserve up`
// on the file, and checks over HTTP that the disaggregated answers to 20
// greedy and seeded sampled requests equal the colocated ones token for
// token.
func TestQwen3MoEGGUFProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	tmp := t.TempDir()
	bin := pdserve.Path(t)
	spec := qwen3MoENarrow()
	ckpt := filepath.Join(tmp, "qwen3moe-shaped")
	if err := spec.Write(ckpt); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "qwen3moe-shaped-q4_k_m.gguf")
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
}

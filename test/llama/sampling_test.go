package llama_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/openai/openaitest"
)

// TestSyntheticSmolLM2Sampling: on the SmolLM2-shaped checkpoint, a PD pair
// and a colocated worker give the same answer, token for token and logprob
// for logprob, for requests with several choices, top logprobs (raw and
// processed), prompt logprobs, penalties and logit bias, and the prompt
// alone; prompt logprobs under PD are those of ForwardLogits (the model's
// distribution at each position).
func TestSyntheticSmolLM2Sampling(t *testing.T) {
	t.Parallel()
	spec := llamatest.SmolLM2135M()
	maxTokens := 6
	if raceEnabled {
		spec.Layers, spec.Vocab, maxTokens = 2, 8192, 3
	}
	dir := spec.WriteT(t)
	newModel, base := factory(t, dir, llama.Options{Name: "smollm2-shaped"})
	mc := machine(32)
	mc.PrefixCache = true
	co := startServe(t, newModel, mc)
	pd := startPD(t, newModel, mc)
	rng := rand.New(rand.NewPCG(5, 17))
	toks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1 + rng.IntN(spec.Vocab-1))
		}
		return out
	}
	cases := []openai.GenerateRequest{
		{N: 4, Sampling: model.SamplingParams{Temperature: 0.8, TopP: 0.95, TopLogprobs: 5}},
		{N: 2, Sampling: model.SamplingParams{Temperature: 0, TopP: 1, TopLogprobs: 3, LogprobsMode: model.LogprobsProcessed,
			PresencePenalty: 0.6, FrequencyPenalty: 0.4, RepetitionPenalty: 1.2}},
		{ScorePrompt: true, PromptTopLogprobs: 2, Sampling: model.SamplingParams{Temperature: 1, TopP: 1, MinP: 0.1, TopLogprobs: 1,
			LogitBias: []model.LogitBias{{ID: 7, Bias: 3}}}},
		{ScorePrompt: true, PromptTopLogprobs: 1, Sampling: model.SamplingParams{TopP: 1}}, // the prompt alone
	}
	for i, g := range cases {
		g.RID, g.InputIDs, g.MaxTokens, g.IgnoreEOS = fmt.Sprintf("s%d", i), toks(20+rng.IntN(40)), maxTokens, true
		g.Sampling.Seed = rng.Uint64()
		if i == len(cases)-1 {
			g.MaxTokens = 0
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		a, err := openaitest.Run(ctx, pd.Router.Router, g)
		if err != nil {
			t.Fatalf("case %d on PD: %v", i, err)
		}
		c, err := openaitest.Run(ctx, co.Worker, g)
		cancel()
		if err != nil {
			t.Fatalf("case %d colocated: %v", i, err)
		}
		if d := cmp.Diff(c, a); d != "" {
			t.Fatalf("case %d: PD differs from colocated (-colocated +PD):\n%s", i, d)
		}
		for ch := range max(1, g.N) {
			if len(a.Tokens[ch]) != g.MaxTokens {
				t.Fatalf("case %d choice %d: %d tokens, want %d", i, ch, len(a.Tokens[ch]), g.MaxTokens)
			}
		}
		if g.ScorePrompt {
			checkPromptLogprobs(t, base, g.InputIDs, a.Prompt)
		}
	}
}

// checkPromptLogprobs compares prompt logprobs with the log-softmax of the
// model's own logits at each position (ForwardLogits, in float64).
func checkPromptLogprobs(t *testing.T, m *llama.Model, prompt []int32, got []model.PositionLogprobs) {
	t.Helper()
	if len(got) != len(prompt) {
		t.Fatalf("%d prompt logprobs for %d tokens", len(got), len(prompt))
	}
	pool := newPool(t, m, 16)
	logits, err := m.ForwardLogits(context.Background(), pool, []model.SeqInput{{Pages: alloc(t, pool, len(prompt)), Tokens: prompt}})
	if err != nil {
		t.Fatal(err)
	}
	V := m.Info().VocabSize
	for j := 1; j < len(prompt); j++ {
		want := logSoftmax(logits[0][(j-1)*V : j*V])
		p := got[j]
		if p.Token.ID != prompt[j] || math.Abs(float64(p.Token.Logprob)-want[prompt[j]]) > 1e-5 {
			t.Fatalf("position %d: %+v, want token %d with logprob %v", j, p.Token, prompt[j], want[prompt[j]])
		}
		for _, alt := range p.Top {
			if math.Abs(float64(alt.Logprob)-want[alt.ID]) > 1e-5 {
				t.Fatalf("position %d: top %+v, want logprob %v", j, alt, want[alt.ID])
			}
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/openai/openaitest"
)

// runEngine runs g on engine e to its end.
func runEngine(t *testing.T, e openai.Engine, g openai.GenerateRequest) openaitest.Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := openaitest.Run(ctx, e, g)
	if err != nil {
		t.Fatalf("%s (n %d, max_tokens %d, prompt logprobs %v/%d, %+v): %v", g.RID, g.N, g.MaxTokens, g.ScorePrompt,
			g.PromptTopLogprobs, g.Sampling, err)
	}
	return a
}

// TestEngineChoicesAndLogprobsPDEqualsColocated: the router's engine over a
// prefill/decode pair and a colocated worker's give the same answer, token
// for token and logprob for logprob, for requests with several choices,
// top logprobs in both modes, prompt logprobs, penalties, logit bias and
// the prompt alone (max_tokens 0); the n choices are distinct, and the
// same seed gives the same choices.
func TestEngineChoicesAndLogprobsPDEqualsColocated(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	rng := rand.New(rand.NewPCG(7, 25))
	prompt := func(n int) []int32 {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32('a' + rng.IntN(26))
		}
		return ids
	}
	for i := range 30 {
		g := openai.GenerateRequest{RID: fmt.Sprintf("e%02d", i), InputIDs: prompt(1 + rng.IntN(200)), MaxTokens: 1 + rng.IntN(24),
			N: []int{1, 1, 2, 4, 8}[rng.IntN(5)], IgnoreEOS: rng.IntN(2) == 0,
			Sampling: model.SamplingParams{Temperature: []float32{0, 0.7, 1, 1.5}[rng.IntN(4)], TopP: 1, Seed: rng.Uint64(),
				TopLogprobs: []int{0, 1, 5, 20}[rng.IntN(4)], LogprobsMode: model.LogprobsMode(rng.IntN(2))}}
		switch rng.IntN(4) {
		case 0:
			g.Sampling.PresencePenalty, g.Sampling.FrequencyPenalty, g.Sampling.RepetitionPenalty = 0.5, 0.8, 1.3
		case 1:
			g.Sampling.LogitBias = []model.LogitBias{{ID: 'e', Bias: 5}, {ID: sim.EOS, Bias: -100}}
			g.Sampling.MinP = 0.05
		}
		if rng.IntN(3) == 0 {
			g.ScorePrompt, g.PromptTopLogprobs = true, rng.IntN(4)
		}
		if rng.IntN(8) == 0 {
			g.MaxTokens, g.N, g.ScorePrompt = 0, 1, true
		}
		a, c := runEngine(t, pd.Router.Router, g), runEngine(t, co.Worker, g)
		if d := cmp.Diff(c, a); d != "" {
			t.Fatalf("request %d (n %d, max_tokens %d, %+v): PD differs from colocated (-colocated +PD):\n%s", i, g.N, g.MaxTokens, g.Sampling, d)
		}
		if g.MaxTokens == 0 {
			if len(a.Tokens[0]) != 0 || a.Finish[0] != "length" || len(a.Prompt) != len(g.InputIDs) {
				t.Fatalf("request %d: the prompt alone answered %+v", i, a)
			}
			continue
		}
		if g.ScorePrompt && (len(a.Prompt) != len(g.InputIDs) || len(g.InputIDs) > 1 && a.Prompt[1].Token.ID != g.InputIDs[1]) {
			t.Fatalf("request %d: prompt logprobs %+v", i, a.Prompt)
		}
		for ch, toks := range a.Tokens {
			for _, tk := range toks {
				if len(tk.Top) != g.Sampling.TopLogprobs {
					t.Fatalf("request %d choice %d: %d top logprobs, want %d", i, ch, len(tk.Top), g.Sampling.TopLogprobs)
				}
			}
		}
		if g.N > 1 && g.Sampling.Temperature > 0 && g.MaxTokens > 4 {
			distinct := map[string]bool{}
			for c := range a.Tokens {
				distinct[fmt.Sprint(a.IDs(c))] = true
			}
			if len(distinct) < 2 {
				t.Fatalf("request %d: %d sampled choices are all the same: %v", i, g.N, a.Tokens)
			}
		}
		// The same request again, on the same pair: the same answer.
		g.RID += "-again"
		if b := runEngine(t, pd.Router.Router, g); !cmp.Equal(a.Tokens, b.Tokens) {
			t.Fatalf("request %d again differs: %s", i, cmp.Diff(a.Tokens, b.Tokens))
		}
	}
}

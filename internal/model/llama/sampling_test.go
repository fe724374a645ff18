package llama_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/model/modeltest"
)

// samplingRequests give prompts every sampling field.
func samplingRequests(prompts [][]int32) []modeltest.Request {
	ps := []model.SamplingParams{
		{Temperature: 1, TopP: 0.9, Seed: 1, TopLogprobs: 5, RepetitionPenalty: 1.3, FrequencyPenalty: 0.5, PresencePenalty: 0.4},
		{Temperature: 0, TopLogprobs: 3, LogprobsMode: model.LogprobsProcessed, LogitBias: []model.LogitBias{{ID: 4, Bias: 1.5}, {ID: 50, Bias: -2}}, BadWords: [][]int32{{7, 8}, {9}}},
		{Temperature: 0.7, TopK: 8, MinP: 0.05, Seed: 9, TopLogprobs: 20, LogprobsMode: model.LogprobsProcessed, AllowedTokenIDs: []int32{3, 4, 5, 6, 10, 20, 30, 40, 50, 60}},
		{Temperature: 1.2, TopP: 1, Seed: 4, FrequencyPenalty: -0.5},
	}
	var reqs []modeltest.Request
	for i, p := range prompts {
		reqs = append(reqs, modeltest.Request{Prompt: p, Sampling: ps[i%len(ps)], Forks: []int{1, 4, 0, 3}[i%4], ScoreTop: []int{2, 0, 5, 1}[i%4], Steps: 6})
	}
	return reqs
}

// TestSamplingFieldsBatchInvariant checks that scores, forks, penalties and
// top logprobs do not depend on the batch, the chunking or the thread
// count; the batched prefill scores more rows than one classifier block.
func TestSamplingFieldsBatchInvariant(t *testing.T) {
	dir := llamatest.Tiny().WriteT(t)
	rng := rand.New(rand.NewPCG(7, 8))
	var prompts [][]int32
	for _, n := range []int{90, 17, 120, 64} {
		prompts = append(prompts, randomTokens(rng, n, 97))
	}
	reqs := samplingRequests(prompts)
	solo := load(t, dir, llama.Options{Threads: 1})
	want := modeltest.Run(t, solo, newPool(t, solo, 8, 64), reqs, 0, false)
	for i, r := range want {
		if len(r.Scores) != len(reqs[i].Prompt) || len(r.Samples) != reqs[i].Steps+1 {
			t.Fatalf("request %d: %d scores, %d samples", i, len(r.Scores), len(r.Samples))
		}
		if f := reqs[i].Forks; f > 1 && len(r.Samples[0].Forks) != f-1 {
			t.Fatalf("request %d: %d forks, want %d", i, len(r.Samples[0].Forks), f-1)
		}
		if n := reqs[i].Sampling.TopLogprobs; len(r.Samples[1].Top) != n {
			t.Fatalf("request %d: %d top logprobs, want %d", i, len(r.Samples[1].Top), n)
		}
	}
	for _, threads := range []int{1, 3} {
		m := load(t, dir, llama.Options{Threads: threads})
		for _, tc := range []struct {
			name    string
			chunk   int
			batched bool
		}{{"batched", 0, true}, {"chunked", 13, false}, {"batched and chunked", 40, true}} {
			got := modeltest.Run(t, m, newPool(t, m, 8, 64), reqs, tc.chunk, tc.batched)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%d threads, %s differs (-alone +%s):\n%s", threads, tc.name, tc.name, diff)
			}
		}
	}
}

// TestScoresMatchLogits checks prompt scores against ForwardLogits: the
// target's logprob (to float32 rounding: the sum of exponentials is the
// kernels'), its rank and the top alternatives; the greedy token after
// each prefix is the top one; and scores are the same bits on every kernel
// set.
func TestScoresMatchLogits(t *testing.T) {
	spec := llamatest.Tiny()
	dir := spec.WriteT(t)
	rng := rand.New(rand.NewPCG(1, 9))
	prompt := randomTokens(rng, 40, 97)
	score := make([]int32, len(prompt))
	for j := range score {
		score[j] = -1
		if j+1 < len(prompt) {
			score[j] = prompt[j+1]
		}
	}
	score[len(prompt)-1] = 5 // scored and sampled
	var first []model.PositionLogprobs
	for _, k := range llama.KernelChoices {
		m, err := llama.Load(dir, llama.Options{Kernels: k})
		if err != nil {
			if k == llama.KernelsAVX512 || k == llama.KernelsAVX2 {
				continue
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		p := newPool(t, m, 8, 32)
		out := make([]model.SeqOutput, 1)
		in := model.SeqInput{Pages: alloc(t, p, p.PagesFor(len(prompt))), Tokens: prompt, Sample: true, Sampling: greedy, Score: score, ScoreTop: 4}
		if err := m.Forward(context.Background(), p, []model.SeqInput{in}, out); err != nil {
			t.Fatal(err)
		}
		if first != nil {
			if diff := cmp.Diff(first, out[0].Scores); diff != "" {
				t.Fatalf("kernels %s: scores differ from auto's:\n%s", k, diff)
			}
			continue
		}
		first = out[0].Scores
		lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: alloc(t, p, p.PagesFor(len(prompt))), Tokens: prompt}})
		if err != nil {
			t.Fatal(err)
		}
		V := spec.Vocab
		var sc model.SampleScratch
		for j, s := range out[0].Scores {
			row := lg[0][j*V : (j+1)*V]
			want := model.ScorePosition(row, score[j], make([]model.TokenLogprob, 4), &sc)
			if s.Token.ID != want.Token.ID || s.Rank != want.Rank || len(s.Top) != 4 {
				t.Fatalf("position %d: %+v, want %+v", j, s, want)
			}
			close := func(a, b float32) bool { return math.Abs(float64(a-b)) <= 2e-6*max(1, math.Abs(float64(b))) }
			if !close(s.Token.Logprob, want.Token.Logprob) {
				t.Fatalf("position %d: logprob %v, want %v", j, s.Token.Logprob, want.Token.Logprob)
			}
			for i := range s.Top {
				if s.Top[i].ID != want.Top[i].ID || !close(s.Top[i].Logprob, want.Top[i].Logprob) {
					t.Fatalf("position %d: top %v, want %v", j, s.Top, want.Top)
				}
			}
			if g, _ := model.Sample(row, greedy, 0, nil); g != s.Top[0].ID {
				t.Fatalf("position %d: greedy %d, top %d", j, g, s.Top[0].ID)
			}
		}
		if last := out[0].Scores[len(prompt)-1]; last.Top[0].ID != out[0].Token {
			t.Fatalf("sampled %d at the scored last position, top %+v", out[0].Token, last.Top)
		}
	}
}

// TestScoresWithoutSampling checks a prefill chunk that only scores (no
// sample): out holds its scores and a zero token.
func TestScoresWithoutSampling(t *testing.T) {
	m := load(t, llamatest.Tiny().WriteT(t), llama.Options{})
	p := newPool(t, m, 8, 8)
	out := make([]model.SeqOutput, 2)
	in := []model.SeqInput{
		{Pages: alloc(t, p, 1), Tokens: []int32{1, 2, 3}, Score: []int32{-1, 3, 4}},
		{Pages: alloc(t, p, 1), Tokens: []int32{1, 2}, Sample: true, Sampling: greedy},
	}
	if err := m.Forward(context.Background(), p, in, out); err != nil {
		t.Fatal(err)
	}
	if s := out[0].Scores; len(s) != 3 || !cmp.Equal(s[0], model.PositionLogprobs{}) || s[1].Token.ID != 3 || s[2].Token.ID != 4 || out[0].Token != 0 || s[1].Top != nil {
		t.Fatalf("scores %+v, token %d", s, out[0].Token)
	}
	if out[1].Scores != nil {
		t.Fatalf("a sequence that did not ask got scores %+v", out[1].Scores)
	}
}

package sim

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/modeltest"
)

// samplingRequests use every sampling field.
func samplingRequests(prompts [][]int32) []modeltest.Request {
	letters := func(s string) []int32 {
		var ids []int32
		for _, c := range []byte(s) {
			ids = append(ids, int32(c))
		}
		return ids
	}
	ps := []model.SamplingParams{
		{Temperature: 1, TopP: 0.9, Seed: 1, TopLogprobs: 5, RepetitionPenalty: 1.3, FrequencyPenalty: 0.5, PresencePenalty: 0.4},
		{Temperature: 0, TopLogprobs: 3, LogprobsMode: model.LogprobsProcessed, LogitBias: []model.LogitBias{{ID: 'a', Bias: 1.5}, {ID: 'e', Bias: -2}}, BadWords: [][]int32{letters("th"), {'z'}}},
		{Temperature: 0.7, TopK: 8, MinP: 0.05, Seed: 9, TopLogprobs: 20, LogprobsMode: model.LogprobsProcessed, AllowedTokenIDs: letters("abcdefghij .")},
		{Temperature: 1.2, TopP: 1, Seed: 4, FrequencyPenalty: -0.5},
	}
	var reqs []modeltest.Request
	for i, p := range prompts {
		reqs = append(reqs, modeltest.Request{Prompt: p, Sampling: ps[i%len(ps)], Forks: []int{1, 4, 0, 3}[i%4], ScoreTop: []int{2, 0, 5, 1}[i%4], Steps: 12})
	}
	return reqs
}

// TestSamplingFieldsBatchInvariant checks that scores, forks, penalties and
// top logprobs do not depend on the batch or the chunking.
func TestSamplingFieldsBatchInvariant(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	var prompts [][]int32
	for _, s := range []string{"one", "a second prompt", "xy", "the fourth prompt, longest of all of them"} {
		prompts = append(prompts, tokensOf(t, m, s))
	}
	reqs := samplingRequests(prompts)
	want := modeltest.Run(t, m, newPool(t, geoSmall, 4, 64), reqs, 0, false)
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
	for _, tc := range []struct {
		name    string
		chunk   int
		batched bool
	}{{"batched", 0, true}, {"chunked", 3, false}, {"batched and chunked", 5, true}} {
		got := modeltest.Run(t, m, newPool(t, geoSmall, 4, 64), reqs, tc.chunk, tc.batched)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s differs (-alone +%s):\n%s", tc.name, tc.name, diff)
		}
	}
}

// TestScoresAreDecodeLogits checks that the scores of a prompt are of the
// logits a decode step at each position samples from: the greedy token
// after each prefix is Top[0] (Top[1] when Top[0] is EOS, which a first
// output token never is), with the same logprob, and the target's
// logprob and rank are those of those logits.
func TestScoresAreDecodeLogits(t *testing.T) {
	m := newModel(t, Config{Geometry: geoOdd})
	prompt := tokensOf(t, m, "score every position of this prompt")
	p := newPool(t, geoOdd, 4, 256)
	res := modeltest.Run(t, m, p, []modeltest.Request{{Prompt: prompt, Sampling: greedy, ScoreTop: 3}}, 7, false)[0]
	for j, s := range res.Scores {
		if j == len(prompt)-1 {
			if !cmp.Equal(s, model.PositionLogprobs{}) {
				t.Fatalf("last position scored: %+v", s)
			}
			continue
		}
		if s.Token.ID != prompt[j+1] || len(s.Top) != 3 {
			t.Fatalf("position %d: %+v", j, s)
		}
		pages := alloc(t, p, p.PagesFor(j+1))
		got := prefill(t, m, p, pages, prompt[:j+1], nil, greedy)
		top := s.Top[0]
		if top.ID == EOS { // never drawn at output step 0: the next best is
			top = s.Top[1]
		}
		if got.Token != top.ID || got.Logprob != top.Logprob {
			t.Fatalf("position %d: greedy after the prefix %+v, scores' top %+v", j, got, s.Top)
		}
		logits := logitsOfSeq(m, p, pages, j+1)
		var z float64
		for _, l := range logits {
			z += math.Exp(float64(l))
		}
		if want := float64(logits[s.Token.ID]) - math.Log(z); math.Abs(float64(s.Token.Logprob)-want) > 1e-5 {
			t.Fatalf("position %d: logprob %v, want %v", j, s.Token.Logprob, want)
		}
		rank := 1
		for id, l := range logits {
			if l > logits[s.Token.ID] || (l == logits[s.Token.ID] && int32(id) < s.Token.ID) {
				rank++
			}
		}
		if int(s.Rank) != rank {
			t.Fatalf("position %d: rank %d, want %d", j, s.Rank, rank)
		}
	}
	// The last prompt position is the one sampled; scoring it gives the
	// sampled distribution too.
	pages := alloc(t, p, p.PagesFor(len(prompt)))
	score := make([]int32, len(prompt))
	for j := range score {
		score[j] = -1
	}
	score[len(score)-1] = 'a'
	out := make([]model.SeqOutput, 1)
	in := model.SeqInput{Pages: pages, Tokens: prompt, Sample: true, Sampling: greedy, Score: score, ScoreTop: 1}
	if err := m.Forward(context.Background(), p, []model.SeqInput{in}, out); err != nil {
		t.Fatal(err)
	}
	last := out[0].Scores[len(prompt)-1]
	if last.Top[0].ID != out[0].Token || last.Top[0].Logprob != out[0].Logprob || slices.ContainsFunc(out[0].Scores[:len(prompt)-1], func(s model.PositionLogprobs) bool {
		return !cmp.Equal(s, model.PositionLogprobs{})
	}) {
		t.Fatalf("sampled %d/%v, scores %+v", out[0].Token, out[0].Logprob, out[0].Scores)
	}
}

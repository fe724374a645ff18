package model

import (
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// TestBatchCheckSamplingFields checks the refusals of forks, prompt-score
// and sampling token-id fields, and that valid ones pass.
func TestBatchCheckSamplingFields(t *testing.T) {
	g := kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 4, DType: kvcache.F32}
	pool, err := kvcache.NewPool(g, 4, int64(8*4*g.BytesPerToken()))
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := pool.Alloc(2)
	info := Info{Geometry: g, ContextLen: 8, VocabSize: 10}
	base := func(f func(s *SeqInput)) SeqInput {
		s := SeqInput{Pages: pages, Tokens: []int32{1, 2, 3}, Sample: true}
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		seq  SeqInput
		want string // "" for valid
	}{
		{"valid", base(func(s *SeqInput) {
			s.Forks, s.Score, s.ScoreTop = MaxForks, []int32{2, 3, -1}, MaxLogprobs
			s.Sampling = SamplingParams{TopLogprobs: 20, LogitBias: []LogitBias{{9, 1}}, AllowedTokenIDs: []int32{0, 9}, BadWords: [][]int32{{9, 0}}}
		}), ""},
		{"forks", base(func(s *SeqInput) { s.Forks = MaxForks + 1 }), "forks must be in [0, 128], got 129"},
		{"negative forks", base(func(s *SeqInput) { s.Forks = -1 }), "forks must be in"},
		{"score top", base(func(s *SeqInput) { s.ScoreTop = MaxLogprobs + 1 }), "score top must be in [0, 1024], got 1025"},
		{"score length", base(func(s *SeqInput) { s.Score = []int32{1} }), "1 score targets for 3 tokens"},
		{"score target", base(func(s *SeqInput) { s.Score = []int32{1, 10, -1} }), "score target 10 at index 1 is neither -1 nor in [0, 10)"},
		{"score target below -1", base(func(s *SeqInput) { s.Score = []int32{-2, 1, -1} }), "score target -2 at index 0"},
		{"scores without sampling", base(func(s *SeqInput) { s.Sample, s.Score = false, []int32{1, 2, 3} }), ""},
		{"logit bias id", base(func(s *SeqInput) { s.Sampling.LogitBias = []LogitBias{{10, 1}} }), "sampling names token 10, outside the vocabulary [0, 10)"},
		{"allowed id", base(func(s *SeqInput) { s.Sampling.AllowedTokenIDs = []int32{3, 12} }), "sampling names token 12"},
		{"bad word id", base(func(s *SeqInput) { s.Sampling.BadWords = [][]int32{{3, 11}} }), "sampling names token 11"},
		{"invalid min_p", base(func(s *SeqInput) { s.Sampling.MinP = 2 }), "min_p must be in [0, 1]"},
		{"ids of a sequence that does not sample are not read", base(func(s *SeqInput) {
			s.Sample, s.Sampling.LogitBias = false, []LogitBias{{10, 1}}
		}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := NewBatchCheck(pool.Total()).Check(pool, info, []SeqInput{tc.seq}, 1)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			case err != nil && !strings.HasPrefix(err.Error(), "seq 0: "):
				t.Fatalf("error %q does not name the sequence", err)
			}
		})
	}
}

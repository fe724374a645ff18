// Package modeltest runs sequences through a model.Model the way a worker
// does — chunked prefill with prompt scores, forks at the first sampled
// step, decode steps with their history — for the models' tests.
package modeltest

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// Request is one sequence for Run: a prompt scored at every position with
// ScoreTop alternatives, Forks choices drawn at its first step, then Steps
// decode steps of fork 0 with its output as history.
type Request struct {
	Prompt   []int32
	Sampling model.SamplingParams
	Forks    int
	ScoreTop int
	Steps    int
}

// Result is what a request got: its prompt scores (all chunks
// concatenated) and every sampled output (their Scores cleared).
type Result struct {
	Scores  []model.PositionLogprobs
	Samples []model.SeqOutput
}

// Run runs reqs on m in pool, prefilling in chunks of chunk tokens (0:
// whole), all unfinished sequences in one batch per step if batched, else
// one Forward per sequence. It fails t if the pool cannot hold them or a
// Forward fails.
func Run(t testing.TB, m model.Model, pool *kvcache.Pool, reqs []Request, chunk int, batched bool) []Result {
	t.Helper()
	type state struct {
		pages  []kvcache.PageID
		pos    int
		output []int32
		done   bool
	}
	st := make([]state, len(reqs))
	for i, r := range reqs {
		pages, ok := pool.Alloc(pool.PagesFor(len(r.Prompt) + r.Steps + 1))
		if !ok {
			t.Fatal("pool exhausted")
		}
		st[i].pages = pages
	}
	res := make([]Result, len(reqs))
	next := func(i int) model.SeqInput {
		r, s := &reqs[i], &st[i]
		in := model.SeqInput{Pages: s.pages, Pos: s.pos, Sampling: r.Sampling, Prompt: r.Prompt, Output: s.output, Step: len(s.output)}
		if s.pos < len(r.Prompt) {
			n := len(r.Prompt) - s.pos
			if chunk > 0 {
				n = min(n, chunk)
			}
			in.Tokens = r.Prompt[s.pos : s.pos+n]
			in.Score, in.ScoreTop = make([]int32, n), r.ScoreTop
			for j := range n {
				in.Score[j] = -1
				if p := s.pos + j + 1; p < len(r.Prompt) {
					in.Score[j] = r.Prompt[p]
				}
			}
			in.Sample = s.pos+n == len(r.Prompt)
			in.Output = nil
		} else {
			in.Tokens = s.output[len(s.output)-1:]
			in.Sample = true
		}
		if in.Sample && len(s.output) == 0 {
			in.Forks = r.Forks
		}
		return in
	}
	record := func(i int, in *model.SeqInput, out model.SeqOutput) {
		r, s := &reqs[i], &st[i]
		res[i].Scores = append(res[i].Scores, out.Scores...)
		s.pos += len(in.Tokens)
		if in.Sample {
			out.Scores = nil
			res[i].Samples = append(res[i].Samples, out)
			s.output = append(s.output, out.Token)
			s.done = len(s.output) > r.Steps
		}
	}
	for {
		var idx []int
		var seqs []model.SeqInput
		for i := range reqs {
			if !st[i].done {
				idx = append(idx, i)
				seqs = append(seqs, next(i))
			}
		}
		if len(idx) == 0 {
			return res
		}
		if !batched {
			idx, seqs = idx[:1], seqs[:1]
		}
		out := make([]model.SeqOutput, len(seqs))
		if err := m.Forward(context.Background(), pool, seqs, out); err != nil {
			t.Fatal(err)
		}
		for k, i := range idx {
			record(i, &seqs[k], out[k])
		}
	}
}

package sim

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// BenchmarkPrefill512 prefills a 512-token prompt at the default geometry
// (128 KiB of KV per token) and samples the first token.
func BenchmarkPrefill512(b *testing.B) {
	const n = 512
	m := newModel(b, DefaultConfig())
	p := newPool(b, m.Info().Geometry, 16, n/16)
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32('a' + i%26)
	}
	seqs := []model.SeqInput{{Pages: alloc(b, p, n/16), Tokens: toks, Sample: true, Sampling: greedy}}
	out := make([]model.SeqOutput, 1)
	for b.Loop() {
		if err := m.Forward(context.Background(), p, seqs, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.SetBytes(int64(n * p.Geometry().BytesPerToken()))
}

// BenchmarkDecode16 runs decode steps of 16 sequences with 128 tokens of
// context each at the default geometry. Every step rewrites position 128 of
// each sequence and samples after it.
func BenchmarkDecode16(b *testing.B) {
	const seqsN, ctx = 16, 128
	m := newModel(b, DefaultConfig())
	p := newPool(b, m.Info().Geometry, 16, seqsN*(ctx/16+1))
	seqs := make([]model.SeqInput, seqsN)
	out := make([]model.SeqOutput, seqsN)
	for i := range seqs {
		pages := alloc(b, p, ctx/16+1)
		prompt := make([]int32, ctx)
		for j := range prompt {
			prompt[j] = int32('a' + (i+j)%26)
		}
		first := prefill(b, m, p, pages, prompt, nil, greedy)
		seqs[i] = model.SeqInput{Pages: pages, Pos: ctx, Tokens: []int32{first.Token}, Sample: true,
			Sampling: model.SamplingParams{Temperature: 0.8, TopP: 0.95, Seed: uint64(i)}, Step: 1}
	}
	for b.Loop() {
		if err := m.Forward(context.Background(), p, seqs, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*seqsN), "ns/token")
}

// BenchmarkRehashToken hashes the bytes of one token's slot at the default
// geometry, the cost a decode worker pays once per token received over the KV
// channel.
func BenchmarkRehashToken(b *testing.B) {
	m := newModel(b, DefaultConfig())
	p := newPool(b, m.Info().Geometry, 16, kvcache.MinPages)
	m.writeSlot(p, 0, 3, 'q', 3)
	var sink uint64
	for b.Loop() {
		sink += m.readSlot(p, 0, 3)
	}
	_ = sink
	b.SetBytes(int64(p.Geometry().BytesPerToken()))
}

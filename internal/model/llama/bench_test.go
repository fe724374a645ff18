package llama_test

import (
	"context"
	"encoding/binary"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// benchKernels is Options.Kernels for the benchmarks (go test … -args
// -kernels avx2).
var benchKernels = flag.String("kernels", llama.KernelsAuto, "benchmarks: matrix kernels ("+strings.Join(llama.KernelChoices, ", ")+")")

// benchModel is the model BenchmarkSmolLM2 loads (go test … -args -model
// FILE.gguf): a checkpoint directory or a GGUF file, of the SmolLM2-135M
// shape or another (tools/llamacpp-bench -arch qwen3 passes a
// llamatest.Qwen3Shaped file); "" means $PDSERVE_SMOLLM2_DIR or a freshly
// written SmolLM2-135M-shaped checkpoint.
var benchModel = flag.String("model", "", "BenchmarkSmolLM2: a checkpoint directory or GGUF file (default: a SmolLM2-135M-shaped checkpoint)")

// benchKVDType is the KV cache dtype of BenchmarkSmolLM2 (go test … -args
// -kv-dtype bf16).
var benchKVDType = flag.String("kv-dtype", "f32", "BenchmarkSmolLM2: KV cache element type (f32, bf16, f16)")

// processCPU is the CPU time the process has used so far (0 where unknown).
var processCPU = llama.ProcessCPU

// report records tokens per second of wall time, and CPU milliseconds per
// token (all threads): on a shared machine the second is the steadier one.
func report(b *testing.B, tokens int, wall, cpu time.Duration) {
	b.ReportMetric(float64(tokens)/wall.Seconds(), "tok/s")
	if cpu > 0 {
		b.ReportMetric(cpu.Seconds()*1e3/float64(tokens), "cpu-ms/tok")
	}
}

// BenchmarkSmolLM2 measures the SmolLM2-135M shape (bf16 weights; F32 KV,
// or -kv-dtype's) with random weights: decode at batch 1 and 16 with 128
// tokens of context (at batch 16 also with 20 top logprobs per token,
// decode-batch16-top20, and with 1024 tokens of context,
// decode-batch16-ctx1024: see decodeLong), and prefill of a 512-token prompt (prefill-512-score also scores every
// prompt position with one alternative: prompt_logprobs 1). Each reports
// tok/s (generated or prompt tokens per second of Forward time). The checkpoint is written once
// (~270 MB in a temporary directory), or read from $PDSERVE_SMOLLM2_DIR if
// set (a directory written by llamatest.SmolLM2135M().Write, as the
// llama.cpp comparison in tools/llamacpp-bench does), or -model (a
// directory or a GGUF file of any shape, e.g. one written by pdserve
// convert gguf; prompts are drawn from its vocabulary); -kernels chooses
// the kernels, -kv-dtype the KV cache's element type.
//
//	go test -run '^$' -bench SmolLM2 -benchtime 20x ./internal/model/llama/ [-args -kernels avx2 -model m.gguf -kv-dtype bf16]
func BenchmarkSmolLM2(b *testing.B) {
	spec := llamatest.SmolLM2135M()
	dir := *benchModel
	if dir == "" {
		dir = os.Getenv("PDSERVE_SMOLLM2_DIR")
	}
	if dir == "" {
		dir = spec.WriteT(b)
	}
	kvdt, err := kvcache.ParseDType(*benchKVDType)
	if err != nil {
		b.Fatal(err)
	}
	m, err := llama.Load(dir, llama.Options{Kernels: *benchKernels, KVDType: kvdt})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	vocab := m.Info().VocabSize
	b.Logf("weights %d MB, GOMAXPROCS threads, %s kernels, %s KV", m.WeightBytes()>>20, m.Kernels(), kvdt)
	const ctxLen = 128
	rng := rand.New(rand.NewPCG(1, 1))
	decode := func(b *testing.B, batch int, sampling model.SamplingParams) {
		pool, err := kvcache.NewPool(m.Info().Geometry, 16, int64(batch)*640*int64(m.Info().Geometry.BytesPerToken()))
		if err != nil {
			b.Fatal(err)
		}
		seqs := make([]model.SeqInput, batch)
		for i := range seqs {
			pages, ok := pool.Alloc(pool.PagesFor(512))
			if !ok {
				b.Fatal("pool exhausted")
			}
			seqs[i] = model.SeqInput{Pages: pages, Tokens: randomTokens(rng, ctxLen, vocab), Sample: true, Sampling: sampling}
		}
		out := make([]model.SeqOutput, batch)
		if err := m.Forward(context.Background(), pool, seqs, out); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start, cpu0 := time.Now(), processCPU()
		for n := range b.N {
			for i := range seqs {
				seqs[i].Pos = ctxLen + n%(512-ctxLen)
				seqs[i].Tokens = []int32{out[i].Token}
			}
			if err := m.Forward(context.Background(), pool, seqs, out); err != nil {
				b.Fatal(err)
			}
		}
		report(b, b.N*batch, time.Since(start), processCPU()-cpu0)
	}
	top20 := greedy
	top20.TopLogprobs = 20
	b.Run("decode-batch1", func(b *testing.B) { decode(b, 1, greedy) })
	b.Run("decode-batch16", func(b *testing.B) { decode(b, 16, greedy) })
	b.Run("decode-batch16-top20", func(b *testing.B) { decode(b, 16, top20) })
	b.Run("decode-batch16-ctx1024", func(b *testing.B) { decodeLong(b, m, 16, 1024) })
	prefill := func(b *testing.B, score bool) {
		pool, err := kvcache.NewPool(m.Info().Geometry, 16, 640*int64(m.Info().Geometry.BytesPerToken()))
		if err != nil {
			b.Fatal(err)
		}
		pages, _ := pool.Alloc(pool.PagesFor(512))
		in := []model.SeqInput{{Pages: pages, Tokens: randomTokens(rng, 512, vocab), Sample: true, Sampling: greedy}}
		if score { // each position's target is the next prompt token
			in[0].Score, in[0].ScoreTop = make([]int32, 512), 1
			copy(in[0].Score, in[0].Tokens[1:])
			in[0].Score[511] = -1
		}
		out := make([]model.SeqOutput, 1)
		b.ResetTimer()
		start, cpu0 := time.Now(), processCPU()
		for range b.N {
			if err := m.Forward(context.Background(), pool, in, out); err != nil {
				b.Fatal(err)
			}
		}
		report(b, b.N*512, time.Since(start), processCPU()-cpu0)
	}
	b.Run("prefill-512", func(b *testing.B) { prefill(b, false) })
	b.Run("prefill-512-score", func(b *testing.B) { prefill(b, true) })
}

// decodeLong times decode steps of batch sequences with ctxLen tokens of
// context each: the regime where reading the KV cache costs as much as
// reading the weights (SmolLM2-135M's KV is 45 KiB per token in F32, so
// 16 × 1024 tokens are 720 MiB against 270 MB of weights). The context is
// not prefilled: every page holds random K and V (normal, σ 0.5, rounded
// to the pool's dtype), which costs attention what computed KV does.
func decodeLong(b *testing.B, m *llama.Model, batch, ctxLen int) {
	const steps = 64 // positions ctxLen … ctxLen+steps-1, then again
	geo := m.Info().Geometry
	pool, err := kvcache.NewPool(geo, 16, int64(batch)*int64(ctxLen+steps)*int64(geo.BytesPerToken()))
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	seqs := make([]model.SeqInput, batch)
	for i := range seqs {
		pages, ok := pool.Alloc(pool.PagesFor(ctxLen + steps))
		if !ok {
			b.Fatal("pool exhausted")
		}
		for _, pg := range pages {
			for li := range geo.Layers {
				for kv := range 2 {
					fillKV(rng, geo.DType, pool.Segment(pg, li, kv))
				}
			}
		}
		seqs[i] = model.SeqInput{Pages: pages, Pos: ctxLen, Tokens: randomTokens(rng, 1, m.Info().VocabSize), Sample: true, Sampling: greedy}
	}
	out := make([]model.SeqOutput, batch)
	if err := m.Forward(context.Background(), pool, seqs, out); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	for n := range b.N {
		for i := range seqs {
			seqs[i].Pos = ctxLen + n%steps
			seqs[i].Tokens = []int32{out[i].Token}
		}
		if err := m.Forward(context.Background(), pool, seqs, out); err != nil {
			b.Fatal(err)
		}
	}
	report(b, b.N*batch, time.Since(start), processCPU()-cpu0)
}

// fillKV writes normal values (σ 0.5) in dtype dt over seg.
func fillKV(rng *rand.Rand, dt kvcache.DType, seg []byte) {
	for i := 0; i+dt.Size() <= len(seg); i += dt.Size() {
		v := float32(rng.NormFloat64() * 0.5)
		switch dt {
		case kvcache.F32:
			binary.LittleEndian.PutUint32(seg[i:], math.Float32bits(v))
		case kvcache.BF16:
			binary.LittleEndian.PutUint16(seg[i:], llama.F32ToBF16(v))
		case kvcache.F16:
			binary.LittleEndian.PutUint16(seg[i:], llama.F32ToF16(v))
		}
	}
}

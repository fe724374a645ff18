package sim

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// Geometries for tests: small ones keep the tests fast; the odd ones take
// the byte-hashing path of fillSeg (slot bytes not a multiple of 8).
var (
	geoSmall = kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8, DType: kvcache.F16} // 32-byte slots
	geoOdd   = kvcache.Geometry{Layers: 3, KVHeads: 1, HeadDim: 3, DType: kvcache.F16} // 6-byte slots
	geoOdd2  = kvcache.Geometry{Layers: 1, KVHeads: 3, HeadDim: 5, DType: kvcache.F32} // 60-byte slots
)

func newModel(t testing.TB, cfg Config) *Model {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newPool(t testing.TB, geo kvcache.Geometry, pageSize, pages int) *kvcache.Pool {
	t.Helper()
	p, err := kvcache.NewPool(geo, pageSize, int64(pages)*int64(pageSize*geo.BytesPerToken()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func alloc(t testing.TB, p *kvcache.Pool, n int) []kvcache.PageID {
	t.Helper()
	ids, ok := p.Alloc(n)
	if !ok {
		t.Fatalf("cannot allocate %d pages (%d free)", n, p.FreeCount())
	}
	return ids
}

// scribble fills pages with random bytes (stale data of earlier owners) and
// marks them written.
func scribble(p *kvcache.Pool, ids []kvcache.PageID, seed byte) {
	var key [32]byte
	key[0] = seed
	r := rand.NewChaCha8(key)
	for _, id := range ids {
		_, _ = r.Read(p.Page(id))
		p.MarkWritten(id)
	}
}

// prefill writes prompt in chunks of the given sizes (the rest in one last
// chunk) and samples the first token after it.
func prefill(t testing.TB, m *Model, p *kvcache.Pool, pages []kvcache.PageID, prompt []int32,
	chunks []int, sp model.SamplingParams) model.SeqOutput {
	t.Helper()
	pos := 0
	var out [1]model.SeqOutput
	for pos < len(prompt) {
		n := len(prompt) - pos
		if len(chunks) > 0 {
			n, chunks = min(chunks[0], n), chunks[1:]
		}
		last := pos+n == len(prompt)
		seq := model.SeqInput{Pages: pages, Pos: pos, Tokens: prompt[pos : pos+n], Sample: last, Sampling: sp}
		if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, out[:]); err != nil {
			t.Fatalf("prefill chunk at %d: %v", pos, err)
		}
		pos += n
	}
	return out[0]
}

// decode continues a sequence whose positions 0…pos-1 are in pages and whose
// last sampled output (step 0 at pos) is first, for steps more tokens,
// ignoring EOS. It returns the outputs of steps 1…steps.
func decode(t testing.TB, m *Model, p *kvcache.Pool, pages []kvcache.PageID, pos int, first model.SeqOutput,
	sp model.SamplingParams, steps int) []model.SeqOutput {
	t.Helper()
	var outs []model.SeqOutput
	last := first
	var out [1]model.SeqOutput
	for step := 1; step <= steps; step++ {
		seq := model.SeqInput{Pages: pages, Pos: pos, Tokens: []int32{last.Token}, Sample: true, Sampling: sp, Step: step}
		if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, out[:]); err != nil {
			t.Fatalf("decode step %d: %v", step, err)
		}
		last = out[0]
		outs = append(outs, last)
		pos++
	}
	return outs
}

// generate prefills prompt (in chunks) and decodes steps more tokens in a
// fresh region of pool, returning every output from step 0.
func generate(t testing.TB, m *Model, p *kvcache.Pool, prompt []int32, chunks []int,
	sp model.SamplingParams, steps int) []model.SeqOutput {
	t.Helper()
	pages := alloc(t, p, p.PagesFor(len(prompt)+steps))
	first := prefill(t, m, p, pages, prompt, chunks, sp)
	return append([]model.SeqOutput{first}, decode(t, m, p, pages, len(prompt), first, sp, steps)...)
}

func tokensOf(t testing.TB, m *Model, text string) []int32 {
	t.Helper()
	ids, err := m.Tokenizer().Encode(text, true)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

var greedy = model.SamplingParams{Temperature: 0, TopP: 1}

// digestOfSeq is D for the first n positions of pages, as Forward computes it.
func digestOfSeq(m *Model, p *kvcache.Pool, pages []kvcache.PageID, n int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seqDigest(p, m.cacheFor(p), pages, n)
}

// logitsOfSeq are the logits for the first n positions of pages.
func logitsOfSeq(m *Model, p *kvcache.Pool, pages []kvcache.PageID, n int) []float32 {
	d := digestOfSeq(m, p, pages, n)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fillLogits(d)
	return append([]float32(nil), m.logits...)
}

package llama_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

var greedy = model.SamplingParams{TopP: 1}

func load(t *testing.T, dir string, opts llama.Options) *llama.Model {
	t.Helper()
	m, err := llama.Load(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func newPool(t *testing.T, m *llama.Model, pageSize, pages int) *kvcache.Pool {
	t.Helper()
	g := m.Info().Geometry
	p, err := kvcache.NewPool(g, pageSize, int64(pages*pageSize*g.BytesPerToken()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func alloc(t *testing.T, p *kvcache.Pool, n int) []kvcache.PageID {
	t.Helper()
	ids, ok := p.Alloc(n)
	if !ok {
		t.Fatal("pool exhausted")
	}
	return ids
}

// TestForwardRejects checks that every malformed batch is refused before
// anything is written, like the simulated model.
func TestForwardRejects(t *testing.T) {
	m := load(t, llamatest.Tiny().WriteT(t), llama.Options{ContextLen: 64})
	p := newPool(t, m, 4, 16)
	pg := alloc(t, p, 16)
	other, err := kvcache.NewPool(kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvcache.BF16}, 4, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	toks := func(n int) []int32 { return make([]int32, n) }
	ok := model.SeqInput{Pages: pg[:1], Tokens: toks(4), Sample: true, Sampling: greedy}
	for _, tc := range []struct {
		name string
		pool *kvcache.Pool
		seqs []model.SeqInput
		out  int
		want string
	}{
		{name: "nil pool", seqs: []model.SeqInput{ok}, want: "nil pool"},
		{name: "pool geometry", pool: other, seqs: []model.SeqInput{ok}, want: "does not match the model's"},
		{name: "outputs", pool: p, seqs: []model.SeqInput{ok}, out: 2, want: "2 outputs for 1 sequences"},
		{name: "negative pos", pool: p, seqs: []model.SeqInput{{Pages: pg[:2], Pos: -1, Tokens: toks(2)}}, want: "seq 0: negative position -1"},
		{name: "no tokens", pool: p, seqs: []model.SeqInput{ok, {Pages: pg[1:2], Pos: 1}}, want: "seq 1: no tokens"},
		{name: "context length", pool: p, seqs: []model.SeqInput{{Pages: pg, Pos: 60, Tokens: toks(5)}},
			want: "seq 0: position 60 + 5 tokens = 65 exceeds the context length 64"},
		{name: "negative token", pool: p, seqs: []model.SeqInput{{Pages: pg[:1], Tokens: []int32{1, -1}}},
			want: "token -1 at index 1 out of range [0, 97)"},
		{name: "token past vocab", pool: p, seqs: []model.SeqInput{{Pages: pg[:1], Tokens: []int32{97}}},
			want: "token 97 at index 0 out of range"},
		{name: "too few pages", pool: p, seqs: []model.SeqInput{{Pages: pg[:2], Pos: 6, Tokens: toks(3)}},
			want: "2 pages hold 8 tokens; positions 0…8 need 3"},
		{name: "page outside pool", pool: p, seqs: []model.SeqInput{{Pages: []kvcache.PageID{pg[0], 16}, Pos: 4, Tokens: toks(1)}},
			want: "page 16 outside the pool's pages [0, 16)"},
		{name: "negative page", pool: p, seqs: []model.SeqInput{{Pages: []kvcache.PageID{-1}, Tokens: toks(1)}},
			want: "page -1 outside"},
		{name: "page twice in a sequence", pool: p, seqs: []model.SeqInput{{Pages: []kvcache.PageID{pg[0], pg[0]}, Pos: 4, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 0: page %d listed twice", pg[0])},
		{name: "page written by two sequences", pool: p, seqs: []model.SeqInput{
			{Pages: pg[:2], Pos: 4, Tokens: toks(1)}, {Pages: []kvcache.PageID{pg[2], pg[1]}, Pos: 5, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 1: page %d is also written by seq 0", pg[1])},
		{name: "page read by one and written by another", pool: p, seqs: []model.SeqInput{
			{Pages: pg[3:5], Pos: 4, Tokens: toks(1)}, {Pages: pg[:1], Tokens: toks(2)}, {Pages: pg[0:2], Pos: 4, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 2: reads page %d that seq 1 writes", pg[0])},
		{name: "negative temperature", pool: p, seqs: []model.SeqInput{{Pages: pg[:1], Tokens: toks(1), Sample: true,
			Sampling: model.SamplingParams{Temperature: -1, TopP: 1}}}, want: "seq 0: temperature must be in [0, 100]"},
		{name: "NaN top_p", pool: p, seqs: []model.SeqInput{ok, {Pages: pg[1:2], Tokens: toks(1), Sample: true,
			Sampling: model.SamplingParams{Temperature: 1, TopP: float32(math.NaN())}}}, want: "seq 1: top_p must be in (0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.out
			if n == 0 {
				n = len(tc.seqs)
			}
			before := make([][]byte, 16)
			for i := range before {
				before[i] = append([]byte(nil), p.Page(kvcache.PageID(i))...)
			}
			out := make([]model.SeqOutput, n)
			err := m.Forward(context.Background(), tc.pool, tc.seqs, out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Forward = %v, want an error containing %q", err, tc.want)
			}
			for i := range before {
				if !bytes.Equal(before[i], p.Page(kvcache.PageID(i))) {
					t.Fatalf("a rejected Forward changed page %d", i)
				}
			}
			for i := range out {
				if !reflect.DeepEqual(out[i], model.SeqOutput{}) {
					t.Fatalf("a rejected Forward wrote out[%d] = %+v", i, out[i])
				}
			}
		})
	}
	if err := m.Forward(context.Background(), p, nil, nil); err != nil {
		t.Errorf("empty batch: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Forward(ctx, p, []model.SeqInput{ok}, make([]model.SeqOutput, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Forward = %v, want context.Canceled", err)
	}
}

// step is one sequence's part of a scheduled batch: tokens [from, to).
type step struct{ seq, from, to int }

// runSchedule runs the batches of schedule (chunks of seqs, each batch one
// ForwardLogits) through m on a fresh pool of 4-token pages and checks every
// logit, bit for bit, against want (each sequence's logits [len, vocab]
// computed alone and whole); what names m's configuration in a failure. It
// returns the pool and each sequence's pages.
func runSchedule(t *testing.T, m *llama.Model, seqs [][]int32, schedule [][]step, want [][]float32, what string) (*kvcache.Pool, [][]kvcache.PageID) {
	t.Helper()
	p := newPool(t, m, 4, 64)
	pages := make([][]kvcache.PageID, len(seqs))
	for i, s := range seqs {
		pages[i] = alloc(t, p, p.PagesFor(len(s)))
	}
	for bi, batch := range schedule {
		var in []model.SeqInput
		for _, st := range batch {
			in = append(in, model.SeqInput{Pages: pages[st.seq], Pos: st.from, Tokens: seqs[st.seq][st.from:st.to]})
		}
		lg, err := m.ForwardLogits(context.Background(), p, in)
		if err != nil {
			t.Fatal(err)
		}
		for j, st := range batch {
			V := len(want[st.seq]) / len(seqs[st.seq])
			for k, v := range lg[j] {
				if w := want[st.seq][st.from*V+k]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("%s, batch %d seq %d: logit %d at position %d = %v, alone %v", what, bi, st.seq, k%V, st.from+k/V, v, w)
				}
			}
		}
	}
	return p, pages
}

// TestBatchInvariance runs three sequences through a schedule that mixes
// prefill chunks, one-token decode steps and sequences of different
// lengths in the same batches, on 1 and 3 threads, and checks every logit is
// bit-identical to the sequence prefilled alone and whole.
func TestBatchInvariance(t *testing.T) {
	dir := llamatest.Tiny().WriteT(t)
	rng := rand.New(rand.NewPCG(3, 4))
	seqs := [][]int32{randomTokens(rng, 23, 97), randomTokens(rng, 9, 97), randomTokens(rng, 31, 97)}
	solo := load(t, dir, llama.Options{Threads: 1})
	sp := newPool(t, solo, 4, 64)
	want := make([][]float32, len(seqs))
	for i, s := range seqs {
		lg, err := solo.ForwardLogits(context.Background(), sp, []model.SeqInput{{Pages: alloc(t, sp, sp.PagesFor(len(s))), Tokens: s}})
		if err != nil {
			t.Fatal(err)
		}
		want[i] = lg[0]
	}
	schedule := [][]step{
		{{0, 0, 5}, {1, 0, 8}},
		{{0, 5, 6}, {1, 8, 9}, {2, 0, 13}},
		{{2, 13, 14}, {0, 6, 23}},
		{{2, 14, 30}},
		{{2, 30, 31}},
	}
	for _, threads := range []int{1, 3} {
		runSchedule(t, load(t, dir, llama.Options{Threads: threads}), seqs, schedule, want, fmt.Sprintf("threads %d", threads))
	}
}

// TestSampleMatchesLogits checks Forward's greedy token and log-prob against
// ForwardLogits, and that seeded sampling is reproducible.
func TestSampleMatchesLogits(t *testing.T) {
	m := load(t, llamatest.Tiny().WriteT(t), llama.Options{})
	p := newPool(t, m, 8, 16)
	toks := []int32{1, 5, 9, 33, 2, 70}
	lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: alloc(t, p, 1), Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	last := lg[0][5*97:]
	wantTok, wantLP := model.Sample(last, greedy, 0, nil)
	out := make([]model.SeqOutput, 2)
	sampled := model.SamplingParams{Temperature: 0.8, TopP: 0.9, TopK: 20, Seed: 42}
	in := []model.SeqInput{
		{Pages: alloc(t, p, 1), Tokens: toks, Sample: true, Sampling: greedy},
		{Pages: alloc(t, p, 1), Tokens: toks, Sample: true, Sampling: sampled, Step: 3},
	}
	if err := m.Forward(context.Background(), p, in, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Token != wantTok || out[0].Logprob != wantLP {
		t.Errorf("greedy Forward = %+v, want token %d logprob %v", out[0], wantTok, wantLP)
	}
	if tok, lp := model.Sample(last, sampled, 3, nil); out[1].Token != tok || out[1].Logprob != lp {
		t.Errorf("sampled Forward = %+v, want token %d logprob %v", out[1], tok, lp)
	}
}

// TestCloneAndClose checks that clones share weights and compute the same,
// that the weights outlive the instance they were loaded with, and that a
// closed instance refuses work.
func TestCloneAndClose(t *testing.T) {
	m, err := llama.Load(llamatest.Tiny().WriteT(t), llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	if m.Info().Digest != c.Info().Digest {
		t.Error("clone has another digest")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Clone(); err == nil {
		t.Error("Clone of a closed model succeeded")
	}
	p := newPool(t, c, 4, 8)
	out := make([]model.SeqOutput, 1)
	in := []model.SeqInput{{Pages: alloc(t, p, 1), Tokens: []int32{1, 2}, Sample: true, Sampling: greedy}}
	if err := c.Forward(context.Background(), p, in, out); err != nil {
		t.Fatalf("clone after the original closed: %v", err)
	}
	if err := m.Forward(context.Background(), p, in, out); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Forward on a closed model = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// cancelAfter is a context whose Err turns to context.Canceled after n calls:
// a deterministic way to end a Forward between layers.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// TestForwardCancelledMidway ends a Forward after its first layer: it
// returns context.Canceled, leaves outputs unset, stops its goroutines
// (TestMain checks for leaks) and still marks the pages it wrote.
func TestForwardCancelledMidway(t *testing.T) {
	m := load(t, llamatest.Tiny().WriteT(t), llama.Options{Threads: 3})
	p := newPool(t, m, 4, 8)
	pages := alloc(t, p, 2)
	out := []model.SeqOutput{{Token: -1}}
	in := []model.SeqInput{{Pages: pages, Tokens: []int32{1, 2, 3, 4, 5, 6}, Sample: true, Sampling: greedy}}
	v0 := p.Version(pages[0])
	ctx := &cancelAfter{Context: context.Background(), n: 2} // Forward's check, layer 0's check
	if err := m.Forward(ctx, p, in, out); !errors.Is(err, context.Canceled) {
		t.Fatalf("Forward = %v, want context.Canceled", err)
	}
	if out[0].Token != -1 {
		t.Errorf("a cancelled Forward wrote out = %+v", out[0])
	}
	if p.Version(pages[0]) == v0 {
		t.Error("a cancelled Forward wrote page bytes without MarkWritten")
	}
	// The instance still works.
	if err := m.Forward(context.Background(), p, in, out); err != nil || out[0].Token < 0 {
		t.Fatalf("Forward after a cancelled one = %v, %+v", err, out[0])
	}
}

// TestForwardAllocs checks that a decode step allocates little once the
// buffers have grown: the parallel loops' descriptors only (a few hundred
// bytes per layer), no activations — per layer 5 parallel loops of one job
// each, and a mixture-of-experts layer up to five more (the router's, the
// gather, the experts' two, the combine); plus the team.
func TestForwardAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, c := range []struct {
		name     string
		spec     llamatest.Spec
		perLayer int
	}{{"dense", llamatest.Tiny(), 12}, {"moe", llamatest.TinyMoE(), 17}} {
		t.Run(c.name, func(t *testing.T) {
			m := load(t, c.spec.WriteT(t), llama.Options{Threads: 2})
			p := newPool(t, m, 16, 8)
			pages := alloc(t, p, 4)
			in := []model.SeqInput{{Pages: pages, Tokens: []int32{1, 2, 3}, Sample: true, Sampling: greedy}}
			out := make([]model.SeqOutput, 1)
			ctx := context.Background()
			if err := m.Forward(ctx, p, in, out); err != nil {
				t.Fatal(err)
			}
			in[0].Pos, in[0].Tokens = 3, []int32{out[0].Token}
			allocs := testing.AllocsPerRun(20, func() {
				if err := m.Forward(ctx, p, in, out); err != nil {
					t.Fatal(err)
				}
			})
			if limit := float64(c.perLayer*m.Config().Layers + 20); allocs > limit {
				t.Errorf("a decode step allocates %v times, want at most %v", allocs, limit)
			}
			t.Logf("%v allocations per decode step", allocs)
		})
	}
}

// TestKernelsOption loads the same checkpoint with every kernel choice the
// CPU supports and checks that the model reports the choice and computes
// bit-identical logits; an unknown choice is refused.
func TestKernelsOption(t *testing.T) {
	spec := llamatest.Tiny()
	spec.DType = llama.BF16
	dir := spec.WriteT(t)
	toks := []int32{1, 5, 9, 33, 2, 70, 11, 12, 13, 14, 15, 16, 17}
	var want []float32
	for _, k := range llama.KernelChoices {
		m, err := llama.Load(dir, llama.Options{Kernels: k})
		if err != nil {
			if k == llama.KernelsAVX512 || k == llama.KernelsAVX2 {
				t.Logf("%s: %v", k, err)
				continue
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		if k != llama.KernelsAuto && m.Kernels() != k {
			t.Errorf("Kernels %q: the model uses %q", k, m.Kernels())
		}
		p := newPool(t, m, 8, 4)
		lg, err := m.ForwardLogits(context.Background(), p, []model.SeqInput{{Pages: alloc(t, p, 2), Tokens: toks}})
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = lg[0]
			continue
		}
		for i := range want {
			if math.Float32bits(lg[0][i]) != math.Float32bits(want[i]) {
				t.Fatalf("kernels %s: logit %d = %v, auto %v", k, i, lg[0][i], want[i])
			}
		}
	}
	wantLoadError(t, dir, llama.Options{Kernels: "sse9"}, `unknown kernels "sse9"`, "auto, avx512, avx2, go")
}

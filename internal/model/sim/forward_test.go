package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// poolState is a copy of every page's bytes and version.
type poolState struct {
	bytes    []byte
	versions []uint64
}

func snapshot(p *kvcache.Pool) poolState {
	var s poolState
	for id := range kvcache.PageID(p.Total()) {
		s.bytes = append(s.bytes, p.Page(id)...)
		s.versions = append(s.versions, p.Version(id))
	}
	return s
}

func (s poolState) equal(o poolState) bool {
	return bytes.Equal(s.bytes, o.bytes) && slices.Equal(s.versions, o.versions)
}

func TestForwardRejects(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall, ContextLen: 64})
	p := newPool(t, geoSmall, 4, 16)
	pg := alloc(t, p, 16)
	scribble(p, pg, 7)
	toks := func(n int) []int32 { return make([]int32, n) }
	ok := model.SeqInput{Pages: pg[:1], Tokens: toks(4), Sample: true, Sampling: greedy}
	for _, tc := range []struct {
		name string
		pool *kvcache.Pool
		seqs []model.SeqInput
		out  int // len(out); -1 means len(seqs)
		want string
	}{
		{name: "nil pool", pool: nil, seqs: []model.SeqInput{ok}, want: "nil pool"},
		{name: "pool geometry", pool: newPool(t, geoOdd, 4, 4), seqs: []model.SeqInput{ok}, want: "does not match the model's"},
		{name: "outputs", seqs: []model.SeqInput{ok}, out: 2, want: "2 outputs for 1 sequences"},
		{name: "negative pos", seqs: []model.SeqInput{{Pages: pg[:2], Pos: -1, Tokens: toks(2)}}, want: "seq 0: negative position -1"},
		{name: "no tokens", seqs: []model.SeqInput{ok, {Pages: pg[1:2], Pos: 1}}, want: "seq 1: no tokens"},
		{name: "context length", seqs: []model.SeqInput{{Pages: pg, Pos: 60, Tokens: toks(5)}},
			want: "seq 0: position 60 + 5 tokens = 65 exceeds the context length 64"},
		{name: "negative token", seqs: []model.SeqInput{{Pages: pg[:1], Tokens: []int32{1, -1}}},
			want: "token -1 at index 1 out of range [0, 257)"},
		{name: "token past EOS", seqs: []model.SeqInput{{Pages: pg[:1], Tokens: []int32{257}}},
			want: "token 257 at index 0 out of range"},
		{name: "too few pages", seqs: []model.SeqInput{{Pages: pg[:2], Pos: 6, Tokens: toks(3)}},
			want: "2 pages hold 8 tokens; positions 0…8 need 3"},
		{name: "page outside pool", seqs: []model.SeqInput{{Pages: []kvcache.PageID{pg[0], 16}, Pos: 4, Tokens: toks(1)}},
			want: "page 16 outside the pool's pages [0, 16)"},
		{name: "negative page", seqs: []model.SeqInput{{Pages: []kvcache.PageID{-1}, Tokens: toks(1)}},
			want: "page -1 outside"},
		{name: "page twice in a sequence", seqs: []model.SeqInput{{Pages: []kvcache.PageID{pg[0], pg[0]}, Pos: 4, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 0: page %d listed twice", pg[0])},
		{name: "page written by two sequences", seqs: []model.SeqInput{
			{Pages: pg[:2], Pos: 4, Tokens: toks(1)}, {Pages: []kvcache.PageID{pg[2], pg[1]}, Pos: 5, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 1: page %d is also written by seq 0", pg[1])},
		{name: "page read by one and written by another", seqs: []model.SeqInput{
			{Pages: pg[3:5], Pos: 4, Tokens: toks(1)}, {Pages: pg[:1], Tokens: toks(2)}, {Pages: pg[0:2], Pos: 4, Tokens: toks(1)}},
			want: fmt.Sprintf("seq 2: reads page %d that seq 1 writes", pg[0])},
		{name: "negative temperature", seqs: []model.SeqInput{{Pages: pg[:1], Tokens: toks(1), Sample: true,
			Sampling: model.SamplingParams{Temperature: -1, TopP: 1}}}, want: "seq 0: temperature must be in [0, 100]"},
		{name: "NaN top_p", seqs: []model.SeqInput{ok, {Pages: pg[1:2], Tokens: toks(1), Sample: true,
			Sampling: model.SamplingParams{Temperature: 1, TopP: float32(math.NaN())}}}, want: "seq 1: top_p must be in (0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := p
			if tc.name == "nil pool" || tc.pool != nil {
				pool = tc.pool
			}
			n := tc.out
			if n == 0 {
				n = len(tc.seqs)
			}
			before := snapshot(p)
			out := make([]model.SeqOutput, n)
			err := m.Forward(context.Background(), pool, tc.seqs, out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Forward = %v, want an error containing %q", err, tc.want)
			}
			if !snapshot(p).equal(before) {
				t.Error("a rejected Forward changed the pool")
			}
			if !cmp.Equal(out, make([]model.SeqOutput, n)) {
				t.Errorf("a rejected Forward wrote outputs %v", out)
			}
		})
	}
}

func TestForwardAccepts(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	p := newPool(t, geoSmall, 4, 16)
	pg := alloc(t, p, 16)
	prefill(t, m, p, pg[:2], tokensOf(t, m, "shared!!"), nil, greedy)
	for _, tc := range []struct {
		name string
		seqs []model.SeqInput
	}{
		{"top_p 0 reads as 1", []model.SeqInput{{Pages: pg[2:3], Tokens: []int32{1}, Sample: true,
			Sampling: model.SamplingParams{Temperature: 1}}}},
		{"sampling params of a non-sampling sequence are not checked", []model.SeqInput{{Pages: pg[2:3], Tokens: []int32{1},
			Sampling: model.SamplingParams{Temperature: -1}}}},
		{"spare pages", []model.SeqInput{{Pages: pg[2:9], Tokens: []int32{1}}}},
		{"read-only prefix pages shared", []model.SeqInput{
			{Pages: []kvcache.PageID{pg[0], pg[1], pg[2]}, Pos: 8, Tokens: []int32{'a'}, Sample: true, Sampling: greedy},
			{Pages: []kvcache.PageID{pg[0], pg[1], pg[3]}, Pos: 8, Tokens: []int32{'b'}, Sample: true, Sampling: greedy}}},
		{"EOS as input", []model.SeqInput{{Pages: pg[4:5], Tokens: []int32{EOS}, Sample: true, Sampling: greedy}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]model.SeqOutput, len(tc.seqs))
			for i := range out {
				out[i] = model.SeqOutput{Token: -5, Logprob: 1}
			}
			if err := m.Forward(context.Background(), p, tc.seqs, out); err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.seqs {
				if !s.Sample && !reflect.DeepEqual(out[i], model.SeqOutput{}) {
					t.Errorf("out[%d] = %+v for a non-sampling sequence, want zero", i, out[i])
				}
				if s.Sample && (out[i].Token < 0 || out[i].Token >= VocabSize) {
					t.Errorf("out[%d] = %+v", i, out[i])
				}
			}
		})
	}
	if err := m.Forward(context.Background(), p, nil, nil); err != nil {
		t.Errorf("empty batch: %v", err)
	}
}

// A batch gives each sequence what it gets alone.
func TestBatchEqualsAlone(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	prompts := []string{"one", "a second prompt", "x", "the fourth prompt, longest of all"}
	sps := []model.SamplingParams{greedy, {Temperature: 1, TopP: 0.9, Seed: 1}, {Temperature: 0.5, TopK: 5, TopP: 1, Seed: 2}, greedy}
	const steps = 25
	var want [][]model.SeqOutput
	for i, s := range prompts {
		want = append(want, generate(t, m, newPool(t, geoSmall, 4, 32), tokensOf(t, m, s), nil, sps[i], steps))
	}

	p := newPool(t, geoSmall, 4, 64)
	seqs := make([]model.SeqInput, len(prompts))
	for i, s := range prompts {
		toks := tokensOf(t, m, s)
		seqs[i] = model.SeqInput{Pages: alloc(t, p, p.PagesFor(len(toks)+steps)), Tokens: toks, Sample: true, Sampling: sps[i]}
	}
	got := make([][]model.SeqOutput, len(prompts))
	out := make([]model.SeqOutput, len(seqs))
	for step := 0; step <= steps; step++ {
		if err := m.Forward(context.Background(), p, seqs, out); err != nil {
			t.Fatal(err)
		}
		for i := range seqs {
			got[i] = append(got[i], out[i])
			seqs[i].Pos += len(seqs[i].Tokens)
			seqs[i].Tokens = []int32{out[i].Token}
			seqs[i].Step++
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batched outputs differ (-alone +batched):\n%s", diff)
	}
}

func TestSamplingSeeds(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	prompt := tokensOf(t, m, "sample me")
	run := func(sp model.SamplingParams) []model.SeqOutput {
		return generate(t, m, newPool(t, geoSmall, 8, 8), prompt, nil, sp, 30)
	}
	sp := model.SamplingParams{Temperature: 1, TopP: 1, Seed: 1}
	a, b := run(sp), run(sp)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different outputs:\n%s", diff)
	}
	sp.Seed = 2
	if c := run(sp); cmp.Equal(a, c) {
		t.Error("seeds 1 and 2 gave the same 31 tokens")
	}
	if g := run(greedy); cmp.Equal(a, g) {
		t.Error("temperature 1 gave the greedy sequence")
	}
	for i, o := range a {
		if !strings.ContainsRune(textTokens, rune(o.Token)) && o.Token != EOS {
			t.Errorf("output %d: token %d is not a text token or EOS", i, o.Token)
		}
		if lp := float64(o.Logprob); math.IsNaN(lp) || math.IsInf(lp, 0) || lp > 0 {
			t.Errorf("output %d: logprob %v", i, lp)
		}
	}
}

// Greedy outputs stop at EOS after about 30 tokens on average (EOS is one of
// 31 equally likely candidates once the first MinOutput tokens are out).
func TestGreedyLength(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	p := newPool(t, geoSmall, 16, 64)
	pages := alloc(t, p, 64)
	const prompts, limit = 300, 500
	total, shortest := 0, limit
	for i := range prompts {
		prompt := tokensOf(t, m, fmt.Sprintf("prompt number %d", i))
		out := prefill(t, m, p, pages, prompt, nil, greedy)
		n := 0
		var o [1]model.SeqOutput
		for pos := len(prompt); out.Token != EOS && n < limit; pos++ {
			n++
			seq := model.SeqInput{Pages: pages, Pos: pos, Tokens: []int32{out.Token}, Sample: true, Sampling: greedy, Step: n}
			if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, o[:]); err != nil {
				t.Fatal(err)
			}
			out = o[0]
		}
		total += n
		shortest = min(shortest, n)
	}
	t.Logf("mean greedy length %.1f", float64(total)/prompts)
	if shortest < MinOutput {
		t.Errorf("a greedy output ended after %d tokens, want at least %d", shortest, MinOutput)
	}
	if mean := float64(total) / prompts; mean < 20 || mean > 45 {
		t.Errorf("mean greedy length %.1f tokens, want about 30", mean)
	}
}

// sleepRecorder is an injected Config.Sleep that records durations.
type sleepRecorder struct {
	calls []time.Duration
	err   error
}

func (r *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	r.calls = append(r.calls, d)
	return r.err
}

func TestLatency(t *testing.T) {
	const pre, dec = 3 * time.Millisecond, 20 * time.Millisecond
	tok := func(n int) []int32 { return make([]int32, n) }
	for _, tc := range []struct {
		name     string
		pre, dec time.Duration
		seqs     func(pg []kvcache.PageID) []model.SeqInput
		want     []time.Duration
	}{
		{"prefill", pre, dec, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:3], Tokens: tok(10)}, {Pages: pg[3:4], Tokens: tok(2)}}
		}, []time.Duration{12 * pre}},
		{"one-token prompt is prefill", pre, dec, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:1], Tokens: tok(1)}}
		}, []time.Duration{pre}},
		{"decode batch", pre, dec, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:2], Pos: 4, Tokens: tok(1)}, {Pages: pg[2:4], Pos: 7, Tokens: tok(1)}}
		}, []time.Duration{dec}},
		{"chunked prefill with decode", pre, dec, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:3], Pos: 4, Tokens: tok(5)}, {Pages: pg[3:5], Pos: 4, Tokens: tok(1)}}
		}, []time.Duration{5*pre + dec}},
		{"no latency configured", 0, 0, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:3], Tokens: tok(10)}, {Pages: pg[3:5], Pos: 4, Tokens: tok(1)}}
		}, nil},
		{"decode only configured, prefill batch", 0, dec, func(pg []kvcache.PageID) []model.SeqInput {
			return []model.SeqInput{{Pages: pg[:3], Tokens: tok(10)}}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec sleepRecorder
			m := newModel(t, Config{Geometry: geoSmall, PrefillPerToken: tc.pre, DecodePerStep: tc.dec, Sleep: rec.sleep})
			p := newPool(t, geoSmall, 4, 8)
			seqs := tc.seqs(alloc(t, p, 8))
			if got := m.StepLatency(seqs); got != sum(tc.want) {
				t.Errorf("StepLatency = %v, want %v", got, sum(tc.want))
			}
			if err := m.Forward(context.Background(), p, seqs, make([]model.SeqOutput, len(seqs))); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, rec.calls); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
		})
	}
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}

// A Sleep that fails (ctx done) makes Forward return its error having written
// nothing; a done ctx is reported before any work.
func TestLatencyCancel(t *testing.T) {
	rec := sleepRecorder{err: context.DeadlineExceeded}
	m := newModel(t, Config{Geometry: geoSmall, PrefillPerToken: time.Millisecond, Sleep: rec.sleep})
	p := newPool(t, geoSmall, 4, 4)
	seqs := []model.SeqInput{{Pages: alloc(t, p, 1), Tokens: []int32{1, 2}, Sample: true, Sampling: greedy}}
	before := snapshot(p)
	out := make([]model.SeqOutput, 1)
	if err := m.Forward(context.Background(), p, seqs, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Forward = %v, want the Sleep's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Forward(ctx, p, seqs, out); !errors.Is(err, context.Canceled) {
		t.Errorf("Forward with a done ctx = %v, want context.Canceled", err)
	}
	if !snapshot(p).equal(before) {
		t.Error("a cancelled Forward wrote pages")
	}
	if len(rec.calls) != 1 {
		t.Errorf("Sleep called %d times, want 1 (not for a done ctx)", len(rec.calls))
	}
}

// The default Sleep is a real timer that honours ctx (run on synctest's fake
// clock).
func TestTimerSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newModel(t, Config{Geometry: geoSmall, PrefillPerToken: time.Millisecond, DecodePerStep: 40 * time.Millisecond})
		p := newPool(t, geoSmall, 4, 4)
		pg := alloc(t, p, 4)
		start := time.Now()
		seqs := []model.SeqInput{{Pages: pg[:3], Tokens: make([]int32, 10)}}
		if err := m.Forward(context.Background(), p, seqs, make([]model.SeqOutput, 1)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Errorf("prefill of 10 tokens took %v, want 10ms", d)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Millisecond)
		defer cancel()
		start = time.Now()
		before := snapshot(p)
		seqs = []model.SeqInput{{Pages: pg[:3], Pos: 10, Tokens: []int32{1}}}
		if err := m.Forward(ctx, p, seqs, make([]model.SeqOutput, 1)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Forward = %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 15*time.Millisecond {
			t.Errorf("cancelled decode returned after %v, want 15ms", d)
		}
		if !snapshot(p).equal(before) {
			t.Error("a cancelled Forward wrote pages")
		}
	})
}

// EOS is never drawn at output steps 0…MinOutput−1, whatever the sampling
// (greedy, random, n > 1 forks, a bias that makes EOS all but certain), and
// is drawn again from step MinOutput on.
func TestNoEOSInFirstOutputs(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	p := newPool(t, geoSmall, 16, 64)
	pages := alloc(t, p, 8)
	for _, tc := range []struct {
		name  string
		sp    model.SamplingParams
		forks int
	}{
		{"greedy", greedy, 0},
		{"temperature 1", model.SamplingParams{Temperature: 1, TopP: 1, Seed: 5}, 0},
		{"forks", model.SamplingParams{Temperature: 1, TopP: 1, Seed: 9}, 4},
		{"EOS biased up", model.SamplingParams{Temperature: 1, TopP: 1, Seed: 3,
			LogitBias: []model.LogitBias{{ID: EOS, Bias: 100}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eosAt := make([]int, MinOutput+1) // step → draws of EOS there
			for i := range 200 {
				toks := tokensOf(t, m, fmt.Sprintf("early %d", i))
				pos := 0
				for step := range MinOutput + 1 {
					seq := model.SeqInput{Pages: pages, Pos: pos, Tokens: toks, Sample: true, Sampling: tc.sp, Step: step}
					if step == 0 {
						seq.Forks = tc.forks
					}
					var o [1]model.SeqOutput
					if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, o[:]); err != nil {
						t.Fatal(err)
					}
					for _, d := range append([]model.SeqOutput{o[0]}, o[0].Forks...) {
						if d.Token == EOS {
							eosAt[step]++
						}
					}
					pos += len(toks)
					toks = []int32{'a'} // the next step's input, whatever was drawn
				}
			}
			for step := range MinOutput {
				if eosAt[step] > 0 {
					t.Errorf("EOS drawn %d times at output step %d, want never before step %d", eosAt[step], step, MinOutput)
				}
			}
			if tc.name == "EOS biased up" && eosAt[MinOutput] < 190 {
				t.Errorf("EOS biased up drawn %d times of 200 at step %d, want nearly always", eosAt[MinOutput], MinOutput)
			}
		})
	}
}

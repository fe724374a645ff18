package llama_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// TestKVDTypeInvariance runs TestBatchInvariance's schedule (prefill
// chunks, decode steps and sequences of different lengths in the same
// batches) with a BF16 and an F16 KV cache, on every kernel choice the CPU
// has and on 1 and 3 threads, and checks every logit is bit-identical to
// the sequence prefilled alone and whole with the pure-Go kernels, and
// every KV page byte-identical: the pages a prefill worker sends are the
// pages a colocated worker would have written. The 2-byte caches hold
// exactly half the bytes of an F32 one.
func TestKVDTypeInvariance(t *testing.T) {
	spec := llamatest.Tiny()
	spec.DType = llama.BF16
	dir := spec.WriteT(t)
	rng := rand.New(rand.NewPCG(30, 30))
	seqs := [][]int32{randomTokens(rng, 23, 97), randomTokens(rng, 9, 97), randomTokens(rng, 31, 97)}
	schedule := [][]step{
		{{0, 0, 5}, {1, 0, 8}},
		{{0, 5, 6}, {1, 8, 9}, {2, 0, 13}},
		{{2, 13, 14}, {0, 6, 23}},
		{{2, 14, 30}},
		{{2, 30, 31}},
	}
	f32 := load(t, dir, llama.Options{}).Info().Geometry.BytesPerToken()
	for _, dt := range []kvcache.DType{kvcache.BF16, kvcache.F16} {
		solo := load(t, dir, llama.Options{KVDType: dt, Kernels: llama.KernelsGo, Threads: 1})
		if g := solo.Info().Geometry; g.DType != dt || 2*g.BytesPerToken() != f32 {
			t.Fatalf("%v: geometry %+v, %d bytes per token; want %v and half of f32's %d", dt, g, g.BytesPerToken(), dt, f32)
		}
		sp := newPool(t, solo, 4, 64)
		want := make([][]float32, len(seqs))
		wantKV := make([][]byte, len(seqs)) // every page of the sequence, in order
		for i, s := range seqs {
			pages := alloc(t, sp, sp.PagesFor(len(s)))
			lg, err := solo.ForwardLogits(context.Background(), sp, []model.SeqInput{{Pages: pages, Tokens: s}})
			if err != nil {
				t.Fatal(err)
			}
			want[i], wantKV[i] = lg[0], pageBytes(sp, pages)
		}
		for _, k := range []string{llama.KernelsGo, llama.KernelsAVX2, llama.KernelsAVX512} {
			for _, threads := range []int{1, 3} {
				m, err := llama.Load(dir, llama.Options{KVDType: dt, Kernels: k, Threads: threads})
				if err != nil {
					t.Logf("%s: %v", k, err) // not on this CPU
					break
				}
				t.Cleanup(func() { _ = m.Close() })
				p, pages := runSchedule(t, m, seqs, schedule, want, fmt.Sprintf("%v KV, %s kernels, %d threads", dt, k, threads))
				for i := range seqs {
					if !bytes.Equal(pageBytes(p, pages[i]), wantKV[i]) {
						t.Fatalf("%v KV, %s kernels, %d threads: seq %d's pages differ from those it wrote alone", dt, k, threads, i)
					}
				}
			}
		}
	}
}

// pageBytes is the concatenation of pages' bytes.
func pageBytes(p *kvcache.Pool, pages []kvcache.PageID) []byte {
	var out []byte
	for _, id := range pages {
		out = append(out, p.Page(id)...)
	}
	return out
}

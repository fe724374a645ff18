package sim

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// The digest recorded when the model writes a slot equals the digest of the
// slot's bytes, for every layout path of fillSeg.
func TestWrittenDigestMatchesBytes(t *testing.T) {
	for _, geo := range []kvcache.Geometry{geoSmall, geoOdd, geoOdd2, DefaultGeometry(),
		{Layers: 1, KVHeads: 1, HeadDim: 1, DType: kvcache.F16}} {
		t.Run(fmt.Sprintf("%+v", geo), func(t *testing.T) {
			m := newModel(t, Config{Geometry: geo})
			p := newPool(t, geo, 4, 4)
			for i, tc := range []struct {
				tok int32
				pos int
			}{{0, 0}, {'a', 1}, {EOS, 2}, {255, 8191}} {
				id := kvcache.PageID(i % 4)
				s := i % 4
				written := m.writeSlot(p, id, s, tc.tok, tc.pos)
				if read := m.readSlot(p, id, s); read != written {
					t.Errorf("token %d at %d: written digest %x, bytes hash to %x", tc.tok, tc.pos, written, read)
				}
			}
		})
	}
}

// KV bytes are a function of (token, position, layer, k|v) only: the same
// token at the same position gives the same bytes in any pool, page and slot,
// and a different token or position gives different bytes in every segment.
func TestKVBytesDeterministic(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	a, b := newPool(t, geoSmall, 4, 4), newPool(t, geoSmall, 8, 4)
	sb := a.SlotBytes()
	slotBytes := func(p *kvcache.Pool, id kvcache.PageID, s, layer, kv int) []byte {
		return p.Segment(id, layer, kv)[s*sb : (s+1)*sb]
	}
	m.writeSlot(a, 1, 2, 'x', 10)
	m.writeSlot(b, 3, 7, 'x', 10)
	m.writeSlot(b, 0, 0, 'y', 10)
	m.writeSlot(b, 0, 1, 'x', 11)
	for layer := range geoSmall.Layers {
		for kv := range 2 {
			ref := slotBytes(a, 1, 2, layer, kv)
			if got := slotBytes(b, 3, 7, layer, kv); !bytes.Equal(got, ref) {
				t.Errorf("layer %d kv %d: same (token, pos) gave different bytes", layer, kv)
			}
			if got := slotBytes(b, 0, 0, layer, kv); bytes.Equal(got, ref) {
				t.Errorf("layer %d kv %d: another token gave the same bytes", layer, kv)
			}
			if got := slotBytes(b, 0, 1, layer, kv); bytes.Equal(got, ref) {
				t.Errorf("layer %d kv %d: another position gave the same bytes", layer, kv)
			}
			for l2 := range geoSmall.Layers {
				for kv2 := range 2 {
					if (l2 != layer || kv2 != kv) && bytes.Equal(slotBytes(a, 1, 2, l2, kv2), ref) {
						t.Errorf("segments (%d,%d) and (%d,%d) hold the same bytes", layer, kv, l2, kv2)
					}
				}
			}
		}
	}
}

// One changed byte always changes a segment's digest contribution.
func TestHashSegDetectsEveryByte(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{6, 32, 60, 256} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		h := hashSeg(buf, 5)
		for i := range buf {
			for _, delta := range []byte{1, 0x80, 0xff} {
				buf[i] ^= delta
				if hashSeg(buf, 5) == h {
					t.Errorf("len %d: flipping byte %d by %#x kept the digest", n, i, delta)
				}
				buf[i] ^= delta
			}
		}
		// Swapping two different words changes it too (position weights).
		if n >= 16 && !bytes.Equal(buf[:8], buf[8:16]) {
			sw := append(append(append([]byte(nil), buf[8:16]...), buf[:8]...), buf[16:]...)
			if hashSeg(sw, 5) == h {
				t.Errorf("len %d: swapping words kept the digest", n)
			}
		}
	}
}

// The same prompt and sampling give the same outputs whether the prompt is
// prefilled at once or in chunks, with any page size, in any pages, and after
// the prompt's pages were copied byte for byte into other page ids of another
// pool (PD disaggregation), with the same model or with a fresh one (another
// worker).
func TestSameOutputAcrossLayouts(t *testing.T) {
	for _, g := range []struct {
		geo   kvcache.Geometry
		steps int
	}{{geoSmall, 40}, {geoOdd2, 40}, {DefaultGeometry(), 8}} {
		geo, steps := g.geo, g.steps
		for _, sp := range []model.SamplingParams{greedy, {Temperature: 0.9, TopP: 0.95, Seed: 42}} {
			t.Run(fmt.Sprintf("%d-layers/temp-%v", geo.Layers, sp.Temperature), func(t *testing.T) {
				m := newModel(t, Config{Geometry: geo})
				prompt := tokensOf(t, m, "the quick brown fox jumps over the lazy dog")
				ref := generate(t, m, newPool(t, geo, 16, 8), prompt, nil, sp, steps)

				for _, tc := range []struct {
					name     string
					pageSize int
					chunks   []int
				}{
					{"chunks of 1", 16, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
						1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
					{"chunks 5, 16, 7", 16, []int{5, 16, 7}},
					{"page size 5", 5, nil},
					{"page size 1, chunks of 10", 1, []int{10, 10, 10, 10}},
				} {
					p := newPool(t, geo, tc.pageSize, 2*(len(prompt)+steps+1)/tc.pageSize+4)
					scribble(p, alloc(t, p, 3), 9) // later sequences get higher ids
					got := generate(t, m, p, prompt, tc.chunks, sp, steps)
					if diff := cmp.Diff(ref, got); diff != "" {
						t.Errorf("%s: outputs differ (-whole +chunked):\n%s", tc.name, diff)
					}
				}

				// PD: prefill on A, copy the prompt's pages to other ids of B
				// (full of stale bytes), decode on B.
				a := newPool(t, geo, 16, 8)
				aPages := alloc(t, a, a.PagesFor(len(prompt)+steps))
				first := prefill(t, m, a, aPages, prompt, []int{20}, sp)
				onA := decode(t, m, a, aPages, len(prompt), first, sp, steps)
				if diff := cmp.Diff(ref, append([]model.SeqOutput{first}, onA...)); diff != "" {
					t.Fatalf("decode on A differs from reference:\n%s", diff)
				}
				for _, fresh := range []bool{false, true} {
					b := newPool(t, geo, 16, 12)
					scribble(b, alloc(t, b, 3), 1)
					bPages := alloc(t, b, b.PagesFor(len(prompt)+steps))
					scribble(b, bPages, 2)
					for k := range a.PagesFor(len(prompt)) {
						copy(b.Page(bPages[k]), a.Page(aPages[k]))
						b.MarkWritten(bPages[k])
					}
					mb := m
					if fresh {
						mb = newModel(t, Config{Geometry: geo})
					}
					onB := decode(t, mb, b, bPages, len(prompt), first, sp, steps)
					if diff := cmp.Diff(onA, onB); diff != "" {
						t.Errorf("fresh model %v: decode on B differs from decode on A (-A +B):\n%s", fresh, diff)
					}
				}
			})
		}
	}
}

// Changing one byte of a filled slot changes D and the logits; restoring it
// restores them. Most of the time the greedy token changes too.
func TestCorruptionChangesOutput(t *testing.T) {
	for _, geo := range []kvcache.Geometry{geoSmall, geoOdd} {
		t.Run(fmt.Sprintf("%+v", geo), func(t *testing.T) {
			m := newModel(t, Config{Geometry: geo})
			p := newPool(t, geo, 16, 4)
			prompt := tokensOf(t, m, "a prompt of a few pages, forty bytes long")
			n := len(prompt)
			pages := alloc(t, p, p.PagesFor(n))
			first := prefill(t, m, p, pages, prompt, nil, greedy)
			d0 := digestOfSeq(m, p, pages, n)
			l0 := logitsOfSeq(m, p, pages, n)
			r := rand.New(rand.NewPCG(3, 4))
			const trials = 100
			changed := 0
			for trial := range trials {
				pos := r.IntN(n)
				layer, kv := r.IntN(geo.Layers), r.IntN(2)
				id, s := pages[pos/p.PageSize()], pos%p.PageSize()
				b := p.Segment(id, layer, kv)[s*p.SlotBytes()+r.IntN(p.SlotBytes()):]
				delta := byte(1 + r.IntN(255))
				b[0] ^= delta
				p.MarkWritten(id)
				if d := digestOfSeq(m, p, pages, n); d == d0 {
					t.Fatalf("trial %d: corrupting position %d layer %d kv %d kept D", trial, pos, layer, kv)
				}
				if l := logitsOfSeq(m, p, pages, n); slices.Equal(l, l0) {
					t.Fatalf("trial %d: corrupting position %d kept the logits", trial, pos)
				}
				// Through Forward: re-run the last token (rewriting only
				// position n-1) and sample greedily.
				if pos < n-1 {
					var out [1]model.SeqOutput
					seq := model.SeqInput{Pages: pages, Pos: n - 1, Tokens: prompt[n-1:], Sample: true, Sampling: greedy}
					if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, out[:]); err != nil {
						t.Fatal(err)
					}
					if reflect.DeepEqual(out[0], first) {
						t.Errorf("trial %d: corrupting position %d kept the output %+v", trial, pos, first)
					}
					if out[0].Token != first.Token {
						changed++
					}
				} else {
					changed++ // counted as changed: D differs, checked above
				}
				b[0] ^= delta
				p.MarkWritten(id)
				if d := digestOfSeq(m, p, pages, n); d != d0 {
					t.Fatalf("trial %d: restoring the byte did not restore D", trial)
				}
			}
			if changed < trials*3/4 {
				t.Errorf("greedy token changed in %d of %d trials, want most", changed, trials)
			}
		})
	}
}

// A lost (zeroed) or misplaced (swapped) page changes D.
func TestLostOrMisplacedPageChangesDigest(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	p := newPool(t, geoSmall, 8, 8)
	prompt := tokensOf(t, m, "twenty-four bytes long!!")
	pages := alloc(t, p, 3)
	prefill(t, m, p, pages, prompt, nil, greedy)
	d0 := digestOfSeq(m, p, pages, len(prompt))

	swapped := []kvcache.PageID{pages[1], pages[0], pages[2]}
	if digestOfSeq(m, p, swapped, len(prompt)) == d0 {
		t.Error("swapping two pages kept D")
	}
	if digestOfSeq(m, p, pages, len(prompt)) != d0 {
		t.Error("D after reading swapped pages differs for the right order")
	}
	clear(p.Page(pages[1]))
	p.MarkWritten(pages[1])
	if digestOfSeq(m, p, pages, len(prompt)) == d0 {
		t.Error("zeroing a page kept D")
	}
}

// Bytes of unfilled slots (positions ≥ n) never change the output.
func TestStaleUnfilledSlotsIgnored(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	prompt := tokensOf(t, m, "nineteen bytes long")
	const steps = 20
	ref := generate(t, m, newPool(t, geoSmall, 8, 8), prompt, nil, greedy, steps)

	p := newPool(t, geoSmall, 8, 8)
	pages := alloc(t, p, p.PagesFor(len(prompt)+steps))
	scribble(p, pages, 5)
	first := prefill(t, m, p, pages, prompt, nil, greedy)
	got := []model.SeqOutput{first}
	var out [1]model.SeqOutput
	for step := 1; step <= steps; step++ {
		// Fresh garbage in every slot past the filled ones, every step.
		pos := len(prompt) + step - 1
		for k := pos / 8; k < len(pages); k++ {
			for layer := range geoSmall.Layers {
				for kv := range 2 {
					seg := p.Segment(pages[k], layer, kv)
					from := 0
					if k == pos/8 {
						from = (pos%8 + 1) * p.SlotBytes()
					}
					for i := from; i < len(seg); i++ {
						seg[i] = byte(step*31 + i)
					}
				}
			}
			p.MarkWritten(pages[k])
		}
		seq := model.SeqInput{Pages: pages, Pos: pos, Tokens: []int32{got[step-1].Token}, Sample: true, Sampling: greedy, Step: step}
		if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, out[:]); err != nil {
			t.Fatal(err)
		}
		got = append(got, out[0])
	}
	if diff := cmp.Diff(ref, got); diff != "" {
		t.Errorf("stale bytes changed the output (-clean +stale):\n%s", diff)
	}
}

// Pages freed by one sequence and reused by the next (same ids, stale bytes
// and cached digests of the old owner) give the same outputs as fresh pages.
func TestReusedPages(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	second := tokensOf(t, m, "short")
	ref := generate(t, m, newPool(t, geoSmall, 4, 16), second, nil, greedy, 30)

	p := newPool(t, geoSmall, 4, 16)
	pages := alloc(t, p, 16)
	prefill(t, m, p, pages, tokensOf(t, m, "a much longer first prompt that fills many pages."), nil, greedy)
	if err := p.Free(pages); err != nil {
		t.Fatal(err)
	}
	got := generate(t, m, p, second, []int{2}, greedy, 30)
	if diff := cmp.Diff(ref, got); diff != "" {
		t.Errorf("reused pages changed the output (-fresh +reused):\n%s", diff)
	}
}

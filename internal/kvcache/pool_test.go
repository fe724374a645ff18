package kvcache

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func TestAllocatorAccounting(t *testing.T) {
	a := NewAllocator(64)
	rng := rand.New(rand.NewPCG(1, 2))
	owned := map[PageID]bool{}
	var held [][]PageID
	for i := 0; i < 5000; i++ {
		if rng.IntN(2) == 0 || len(held) == 0 {
			n := rng.IntN(10)
			free := a.FreeCount()
			ids, ok := a.Alloc(n)
			if ok != (n <= free) {
				t.Fatalf("Alloc(%d) with %d free: ok=%v", n, free, ok)
			}
			if !ok {
				if a.FreeCount() != free {
					t.Fatal("a failed Alloc took pages")
				}
				continue
			}
			for _, id := range ids {
				if owned[id] {
					t.Fatalf("page %d handed out twice", id)
				}
				owned[id] = true
			}
			held = append(held, ids)
		} else {
			k := rng.IntN(len(held))
			if err := a.Free(held[k]); err != nil {
				t.Fatal(err)
			}
			for _, id := range held[k] {
				delete(owned, id)
			}
			held = append(held[:k], held[k+1:]...)
		}
		if a.Used()+a.FreeCount() != a.Total() || a.Used() != len(owned) {
			t.Fatalf("used %d + free %d != total %d (owned %d)", a.Used(), a.FreeCount(), a.Total(), len(owned))
		}
	}
}

func TestFreeRejectsBadPages(t *testing.T) {
	a := NewAllocator(8)
	ids, _ := a.Alloc(3)
	for _, bad := range [][]PageID{{ids[0], ids[0]}, {7}, {-1}, {8}} {
		if err := a.Free(bad); !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("Free(%v) = %v, want ErrNotAllocated", bad, err)
		}
		if a.Used() != 3 {
			t.Fatalf("a rejected Free changed the accounting: used %d", a.Used())
		}
	}
	if err := a.Free(ids); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(ids); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("double free: %v", err)
	}
}

func TestPoolLayout(t *testing.T) {
	g := Geometry{Layers: 3, KVHeads: 2, HeadDim: 4, DType: BF16}
	if g.BytesPerToken() != 3*2*2*4*2 {
		t.Fatalf("bytes per token %d", g.BytesPerToken())
	}
	p, err := NewPool(g, 4, int64(g.BytesPerToken()*4*10))
	if err != nil {
		t.Fatal(err)
	}
	if p.Total() != 10 || p.PageBytes() != g.BytesPerToken()*4 || p.PagesFor(9) != 3 || p.PagesFor(8) != 2 {
		t.Fatalf("total %d page bytes %d", p.Total(), p.PageBytes())
	}
	// Segments tile the page without overlap, in [layer][k|v] order.
	page := p.Page(3)
	for i := range page {
		page[i] = 0
	}
	n := 0
	for l := 0; l < g.Layers; l++ {
		for kv := 0; kv < 2; kv++ {
			seg := p.Segment(3, l, kv)
			if len(seg) != 4*p.SlotBytes() {
				t.Fatalf("segment size %d", len(seg))
			}
			for i := range seg {
				if seg[i] != 0 {
					t.Fatalf("segments overlap at layer %d kv %d", l, kv)
				}
				seg[i] = 1
				n++
			}
		}
	}
	if n != len(page) {
		t.Fatalf("segments cover %d of %d bytes", n, len(page))
	}
	if _, err := NewPool(g, 4, 10); err == nil {
		t.Fatal("a pool of less than MinPages pages was built")
	}
	if _, err := NewPool(Geometry{}, 4, 1<<20); err == nil {
		t.Fatal("an invalid geometry was accepted")
	}
}

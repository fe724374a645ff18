package kvcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func key(chain, page int) Key {
	var k Key
	binary.LittleEndian.PutUint64(k[:], uint64(chain))
	binary.LittleEndian.PutUint64(k[8:], uint64(page))
	return k
}

func chainKeys(chain, n int) []Key {
	ks := make([]Key, n)
	for i := range ks {
		ks[i] = key(chain, i)
	}
	return ks
}

func TestCacheMatchSharesAndEvictsLRU(t *testing.T) {
	c := NewCache(NewAllocator(8), true)
	a, _ := c.Alloc(3)
	for i, id := range a {
		if !c.Publish(id, key(1, i)) {
			t.Fatalf("Publish(%d) refused", id)
		}
	}
	if got := c.Match(chainKeys(1, 5), 5); !slices.Equal(got, a) {
		t.Fatalf("Match = %v, want %v", got, a)
	}
	if c.Refs(a[0]) != 2 || c.Used() != 3 || c.Cached() != 0 {
		t.Fatalf("refs %d used %d cached %d", c.Refs(a[0]), c.Used(), c.Cached())
	}
	if got := c.Match(chainKeys(1, 3), 2); len(got) != 2 {
		t.Fatalf("Match capped at 2 = %v", got)
	}
	if err := c.Release(a); err != nil { // first holder
		t.Fatal(err)
	}
	if err := c.Release(a); err != nil { // second holder
		t.Fatal(err)
	}
	if err := c.Release(a[:2]); err != nil { // third (capped) holder
		t.Fatal(err)
	}
	if c.Used() != 0 || c.Cached() != 3 || c.FreeCount() != 8 {
		t.Fatalf("after release: used %d cached %d available %d", c.Used(), c.Cached(), c.FreeCount())
	}
	if err := c.Release(a[:1]); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("release of a cached page = %v, want ErrNotAllocated", err)
	}
	// a[2] lost its last reference first, then a[0], then a[1]: a[2] and
	// a[0] are the oldest and go first.
	b, ok := c.Alloc(7)
	if !ok || c.Evictions() != 2 || c.Cached() != 1 {
		t.Fatalf("Alloc(7): ok %v, evictions %d, cached %d", ok, c.Evictions(), c.Cached())
	}
	if _, idx := c.Indexed(a[1]); !idx {
		t.Fatal("the most recently used cached page was evicted")
	}
	if got := c.Match(chainKeys(1, 3), 3); len(got) != 0 {
		t.Fatalf("Match after evicting page 0 of the chain = %v, want none", got)
	}
	if _, ok := c.Alloc(2); ok {
		t.Fatal("Alloc beyond free + cached succeeded")
	}
	if err := c.Release(b); err != nil {
		t.Fatal(err)
	}
}

func TestCachePublishRefusals(t *testing.T) {
	c := NewCache(NewAllocator(4), true)
	ids, _ := c.Alloc(2)
	if !c.Publish(ids[0], key(1, 0)) || c.Publish(ids[0], key(1, 1)) {
		t.Fatal("a page was indexed twice")
	}
	if c.Publish(ids[1], key(1, 0)) {
		t.Fatal("a second page took an indexed key")
	}
	if err := c.Release(ids); err != nil {
		t.Fatal(err)
	}
	if c.Cached() != 1 || c.alloc.FreeCount() != 3 {
		t.Fatalf("cached %d free %d: the duplicate should be freed", c.Cached(), c.alloc.FreeCount())
	}
	if c.Publish(ids[1], key(2, 0)) {
		t.Fatal("a free page was indexed")
	}
	off := NewCache(NewAllocator(4), false)
	ids, _ = off.Alloc(1)
	if off.Publish(ids[0], key(1, 0)) || len(off.Match(chainKeys(1, 1), 1)) != 0 {
		t.Fatal("a disabled cache shared a page")
	}
}

func TestCacheForget(t *testing.T) {
	c := NewCache(NewAllocator(4), true)
	ids, _ := c.Alloc(1)
	c.Publish(ids[0], key(1, 0))
	other := c.Match(chainKeys(1, 1), 1)
	c.Forget(ids[0])
	if got := c.Match(chainKeys(1, 1), 1); len(got) != 0 {
		t.Fatalf("a forgotten page matched: %v", got)
	}
	if err := c.Release(ids); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(other); err != nil {
		t.Fatal(err)
	}
	if c.Used() != 0 || c.Cached() != 0 || c.FreeCount() != 4 {
		t.Fatalf("a forgotten page was kept: used %d cached %d", c.Used(), c.Cached())
	}
}

func TestCacheReleaseRejectsBadPages(t *testing.T) {
	c := NewCache(NewAllocator(8), true)
	ids, _ := c.Alloc(3)
	for _, bad := range [][]PageID{{ids[0], ids[0]}, {7}, {-1}, {8}, {ids[1], 5}} {
		if err := c.Release(bad); !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("Release(%v) = %v, want ErrNotAllocated", bad, err)
		}
		if c.Used() != 3 || c.Refs(ids[0]) != 1 || c.Refs(ids[1]) != 1 {
			t.Fatalf("a rejected Release changed the accounting: used %d", c.Used())
		}
	}
}

// TestCacheModel runs random operations against the cache and a plain
// model of it (per-page holders, an index, an LRU list) and checks after
// every step that they agree: reference counts, the index, which page an
// allocation evicts, and free + used + cached == total. It also checks what
// the lifecycle relies on: a page handed out by Alloc is held by no one
// else, and a page reached through Match is one a holder published.
func TestCacheModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		const total = 24
		c := NewCache(NewAllocator(total), seed%5 != 0)
		type holder struct{ pages []PageID }
		var holders []*holder
		refs := map[PageID]int{}
		index := map[Key]PageID{}
		keyOf := map[PageID]Key{}
		var lru []PageID // cached pages, oldest first
		check := func(step int) {
			t.Helper()
			used, cached := 0, 0
			for id := range PageID(total) {
				if c.Refs(id) != refs[id] {
					t.Fatalf("seed %d step %d: page %d refs %d, model %d", seed, step, id, c.Refs(id), refs[id])
				}
				k, idx := c.Indexed(id)
				mk, midx := keyOf[id]
				if idx != midx || (idx && k != mk) {
					t.Fatalf("seed %d step %d: page %d indexed %v, model %v", seed, step, id, idx, midx)
				}
				if refs[id] > 0 {
					used++
				} else if idx {
					cached++
				}
			}
			if c.Used() != used || c.Cached() != cached || len(lru) != cached ||
				c.alloc.FreeCount()+used+cached != total {
				t.Fatalf("seed %d step %d: used %d cached %d free %d (model used %d cached %d lru %d)",
					seed, step, c.Used(), c.Cached(), c.alloc.FreeCount(), used, cached, len(lru))
			}
		}
		for step := range 3000 {
			switch op := rng.IntN(10); {
			case op < 3: // a new holder: match a chain, allocate the rest
				chain, n := rng.IntN(4), 1+rng.IntN(6)
				keys := chainKeys(chain, n)
				got := c.Match(keys, n)
				if !c.Enabled() && len(got) > 0 {
					t.Fatalf("seed %d: disabled cache matched", seed)
				}
				for i, id := range got {
					if index[keys[i]] != id {
						t.Fatalf("seed %d step %d: matched page %d for key %d, model has %d", seed, step, id, i, index[keys[i]])
					}
					if refs[id] == 0 {
						lru = slices.DeleteFunc(lru, func(p PageID) bool { return p == id })
					}
					refs[id]++
				}
				if len(got) < n && c.Enabled() {
					if _, ok := index[keys[len(got)]]; ok {
						t.Fatalf("seed %d step %d: match stopped at an indexed key", seed, step)
					}
				}
				want := n - len(got)
				avail := total - len(refs)
				for id, r := range refs {
					if r == 0 {
						t.Fatalf("model kept page %d at 0 refs", id)
					}
				}
				free := total - len(refs) - len(lru)
				ids, ok := c.Alloc(want)
				if ok != (want <= avail) {
					t.Fatalf("seed %d step %d: Alloc(%d) ok=%v with %d available", seed, step, want, ok, avail)
				}
				if !ok {
					if len(got) > 0 {
						if err := c.Release(got); err != nil {
							t.Fatal(err)
						}
						for _, id := range got {
							refs[id]--
							if refs[id] == 0 {
								delete(refs, id)
								lru = append(lru, id)
							}
						}
					}
					break
				}
				for evict := want - free; evict > 0; evict-- {
					id := lru[0]
					lru = lru[1:]
					delete(index, keyOf[id])
					delete(keyOf, id)
				}
				for _, id := range ids {
					if refs[id] != 0 {
						t.Fatalf("seed %d step %d: Alloc handed out page %d held %d times", seed, step, id, refs[id])
					}
					refs[id] = 1
				}
				holders = append(holders, &holder{pages: append(got, ids...)})
			case op < 6 && len(holders) > 0: // publish one of a holder's pages
				h := holders[rng.IntN(len(holders))]
				i := rng.IntN(len(h.pages))
				id := h.pages[i]
				k := key(100+rng.IntN(3), rng.IntN(6))
				_, had := keyOf[id]
				_, taken := index[k]
				ok := c.Publish(id, k)
				if ok != (c.Enabled() && !had && !taken) {
					t.Fatalf("seed %d step %d: Publish = %v (indexed %v, key taken %v)", seed, step, ok, had, taken)
				}
				if ok {
					index[k], keyOf[id] = id, k
				}
			case len(holders) > 0: // a holder ends
				k := rng.IntN(len(holders))
				h := holders[k]
				holders = slices.Delete(holders, k, k+1)
				if err := c.Release(h.pages); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				for _, id := range h.pages {
					refs[id]--
					if refs[id] == 0 {
						delete(refs, id)
						if _, idx := keyOf[id]; idx {
							lru = append(lru, id)
						}
					}
				}
				// Releasing them again must fail, and change nothing, once
				// any of them has no holder left.
				anyFree := false
				for _, id := range h.pages {
					anyFree = anyFree || refs[id] == 0
				}
				if anyFree {
					if err := c.Release(h.pages); !errors.Is(err, ErrNotAllocated) {
						t.Fatalf("seed %d step %d: a double release = %v, want ErrNotAllocated", seed, step, err)
					}
				}
			}
			check(step)
		}
		for _, h := range holders {
			if err := c.Release(h.pages); err != nil {
				t.Fatal(err)
			}
		}
		if c.Used() != 0 || c.FreeCount() != total {
			t.Fatalf("seed %d: after every release used %d, available %d", seed, c.Used(), c.FreeCount())
		}
	}
}

// BenchmarkCacheRequest is the cache's cost per request of 32 pages
// (512 tokens at the default page size): a match of its chain, an
// allocation of what missed, publishing the new full pages, the release.
// hit=0 is a workload with no sharing, hit=half one whose first 16 pages
// are always cached.
func BenchmarkCacheRequest(b *testing.B) {
	for _, tc := range []struct {
		name   string
		shared int
	}{{"hit=0", 0}, {"hit=half", 16}} {
		b.Run(tc.name, func(b *testing.B) {
			c := NewCache(NewAllocator(4096), true)
			keys := make([]Key, 32)
			for i := 0; b.Loop(); i++ {
				for j := range keys {
					chain := i
					if j < tc.shared {
						chain = -1
					}
					keys[j] = key(chain, j)
				}
				got := c.Match(keys, len(keys))
				ids, ok := c.Alloc(len(keys) - len(got))
				if !ok {
					b.Fatal("pool exhausted")
				}
				for j, id := range ids {
					c.Publish(id, keys[len(got)+j])
				}
				if err := c.Release(append(got, ids...)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestCacheShare(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		c := NewCache(NewAllocator(4), enabled)
		a, _ := c.Alloc(2)
		if err := c.Share(a); err != nil {
			t.Fatal(err)
		}
		if c.Refs(a[0]) != 2 || c.Used() != 2 {
			t.Fatalf("enabled=%v: refs %d used %d after Share", enabled, c.Refs(a[0]), c.Used())
		}
		if err := c.Release(a); err != nil {
			t.Fatal(err)
		}
		if c.Used() != 2 || c.FreeCount() != 2 {
			t.Fatalf("enabled=%v: one holder left, used %d free %d", enabled, c.Used(), c.FreeCount())
		}
		if err := c.Release(a); err != nil {
			t.Fatal(err)
		}
		if c.Used() != 0 || c.FreeCount() != 4 {
			t.Fatalf("enabled=%v: no holder left, used %d free %d", enabled, c.Used(), c.FreeCount())
		}
		if err := c.Share(a[:1]); !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("enabled=%v: Share of a free page = %v, want ErrNotAllocated", enabled, err)
		}
		if err := c.Share([]PageID{-1}); !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("enabled=%v: Share of page -1 = %v", enabled, err)
		}
	}
}

// TestCacheClone: a clone encodes as its cache does, and changing either
// never changes the other: the same calls on both give the same pages.
func TestCacheClone(t *testing.T) {
	c := NewCache(NewAllocator(6), true)
	a, _ := c.Alloc(3)
	c.Publish(a[0], Key{1})
	c.Publish(a[1], Key{2})
	if err := c.Release(a[:2]); err != nil { // two cached pages in LRU order
		t.Fatal(err)
	}
	d := c.Clone()
	if !bytes.Equal(c.AppendState(nil), d.AppendState(nil)) {
		t.Fatalf("a clone encodes differently")
	}
	before := d.AppendState(nil)
	got, _ := c.Alloc(4) // evicts a cached page in c only
	if !bytes.Equal(d.AppendState(nil), before) {
		t.Fatalf("allocating in the cache changed its clone")
	}
	if d.Cached() != 2 || c.Cached() != 1 {
		t.Fatalf("cached pages: clone %d, cache %d; want 2 and 1", d.Cached(), c.Cached())
	}
	again, _ := d.Alloc(4)
	if !slices.Equal(got, again) {
		t.Fatalf("the same allocation gave %v in the cache and %v in its clone", got, again)
	}
	if m := d.Match([]Key{{1}}, 1); len(m) != 0 { // evicted in the clone too, oldest first
		t.Fatalf("the clone matched an evicted page: %v", m)
	}
}

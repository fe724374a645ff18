package kvcache

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
)

// Key names the KV of one full page: the chained hash of the model
// fingerprint and every token up to the end of the page (kvxfer.PageHash,
// whose bytes it is; kvcache does not depend on the transfer package).
type Key [16]byte

// none marks the end of the LRU list and a page with no LRU links.
const none PageID = -1

// Cache is a paged prefix cache over an Allocator (SGLang's RadixAttention
// and vLLM's automatic prefix caching, with vLLM's flat hash index: a full
// page is found by the chained hash of its tokens, so a longest-prefix
// match walks the request's chain page by page).
//
// Every page is in one of three states:
//
//   - free: on the allocator's free list;
//   - used: referenced by at least one request (refs > 0), indexed or not;
//   - cached: unreferenced but indexed, kept in LRU order and evicted (its
//     index entry dropped, the page freed) only when an allocation finds no
//     free page.
//
// free + used + cached == total at all times. A page enters the index only
// through Publish, by a holder that knows its KV is complete; Match hands
// out references to indexed pages, which are never written again (only full
// pages are indexed: a sequence writes its partial tail page, which is
// private). Release drops one reference per id; the last one frees an
// unindexed page and parks an indexed one in the LRU.
//
// With the cache disabled (NewCache(a, false)) Publish indexes nothing and
// Match finds nothing, so every page is private and Release frees it: the
// plain allocator's behaviour.
//
// Not safe for concurrent use, except Used, Cached, Total and Evictions,
// which any goroutine may read.
type Cache struct {
	alloc   *Allocator
	enabled bool
	refs    []int32
	// key and indexed: the page's index entry, if any (index[key[p]] == p).
	key     []Key
	indexed []bool
	index   map[Key]PageID
	// prev, next: the LRU list of cached pages, oldest at head.
	prev, next []PageID
	head, tail PageID
	// stamp and epoch find a page repeated in one Release in O(len(ids)).
	stamp []uint64
	epoch uint64

	used      atomic.Int64 // pages with refs > 0
	cached    atomic.Int64 // indexed pages with refs == 0
	evictions atomic.Uint64
}

// NewCache returns a cache over a, whose pages must all be free. enabled
// false makes it a plain reference-counted allocator that never shares.
func NewCache(a *Allocator, enabled bool) *Cache {
	n := a.Total()
	c := &Cache{alloc: a, enabled: enabled, refs: make([]int32, n), key: make([]Key, n),
		indexed: make([]bool, n), index: make(map[Key]PageID), prev: make([]PageID, n),
		next: make([]PageID, n), stamp: make([]uint64, n), head: none, tail: none}
	for i := range n {
		c.prev[i], c.next[i] = none, none
	}
	return c
}

// Enabled reports whether the cache shares pages.
func (c *Cache) Enabled() bool { return c.enabled }

// Total is the number of pages; safe from any goroutine.
func (c *Cache) Total() int { return c.alloc.Total() }

// Used is the number of referenced pages; safe from any goroutine.
func (c *Cache) Used() int { return int(c.used.Load()) }

// Cached is the number of unreferenced indexed pages (evictable); safe from
// any goroutine.
func (c *Cache) Cached() int { return int(c.cached.Load()) }

// Evictions counts cached pages evicted to make room since the cache was
// made; safe from any goroutine.
func (c *Cache) Evictions() uint64 { return c.evictions.Load() }

// FreeCount is the number of pages an allocation can take: free plus
// cached. Only for the owning goroutine.
func (c *Cache) FreeCount() int { return c.alloc.FreeCount() + int(c.cached.Load()) }

// Refs is the reference count of page id (0 for a free or cached page).
func (c *Cache) Refs(id PageID) int { return int(c.refs[id]) }

// Indexed reports whether page id is in the index, and under which key.
func (c *Cache) Indexed(id PageID) (Key, bool) { return c.key[id], c.indexed[id] }

// Alloc takes n private pages, each with one reference, all or nothing:
// free pages first, then cached pages evicted oldest first. It returns
// false, and changes nothing, when free + cached < n.
func (c *Cache) Alloc(n int) ([]PageID, bool) {
	if n < 0 || n > c.FreeCount() {
		return nil, false
	}
	for short := n - c.alloc.FreeCount(); short > 0; short-- {
		c.evict(c.head)
	}
	ids, ok := c.alloc.Alloc(n)
	if !ok {
		panic("kvcache: free list short after eviction")
	}
	for _, id := range ids {
		c.refs[id] = 1
	}
	c.used.Add(int64(n))
	return ids, true
}

// evict drops the cached page id from the LRU and the index and frees it.
func (c *Cache) evict(id PageID) {
	c.unlink(id)
	delete(c.index, c.key[id])
	c.indexed[id], c.key[id] = false, Key{}
	c.cached.Add(-1)
	c.evictions.Add(1)
	c.alloc.release([]PageID{id})
}

func (c *Cache) unlink(id PageID) {
	p, n := c.prev[id], c.next[id]
	if p == none {
		c.head = n
	} else {
		c.next[p] = n
	}
	if n == none {
		c.tail = p
	} else {
		c.prev[n] = p
	}
	c.prev[id], c.next[id] = none, none
}

func (c *Cache) pushTail(id PageID) {
	c.prev[id], c.next[id] = c.tail, none
	if c.tail == none {
		c.head = id
	} else {
		c.next[c.tail] = id
	}
	c.tail = id
}

// Match returns the pages of the longest indexed prefix of keys (page i of
// the result holds the KV named by keys[i]), at most max of them, and takes
// a reference on each. Keys must be one chain (keys[i] chains on
// keys[i-1]): a match stops at the first key not indexed. The pages are
// shared: the caller reads them and must never write them.
func (c *Cache) Match(keys []Key, max int) []PageID {
	if !c.enabled {
		return nil
	}
	var out []PageID
	for _, k := range keys[:min(len(keys), max)] {
		id, ok := c.index[k]
		if !ok {
			break
		}
		if c.refs[id] == 0 {
			c.unlink(id)
			c.cached.Add(-1)
			c.used.Add(1)
		}
		c.refs[id]++
		out = append(out, id)
	}
	return out
}

// Share takes one more reference on each of ids, pages the caller holds
// (so none is free or only cached): another holder reads them too, as the
// forks of a request with n > 1 share its prompt's full pages, and each
// holder releases its own reference. Whether the cache is enabled does not
// matter. It returns an error wrapping ErrNotAllocated, and changes
// nothing, if any id is out of range or unreferenced.
func (c *Cache) Share(ids []PageID) error {
	for _, id := range ids {
		if id < 0 || int(id) >= len(c.refs) || c.refs[id] <= 0 {
			return fmt.Errorf("%w: page %d", ErrNotAllocated, id)
		}
	}
	for _, id := range ids {
		c.refs[id]++
	}
	return nil
}

// Publish indexes page id under key k: its KV is complete, and nothing will
// write it again. The caller must hold a reference to id. It returns false,
// and indexes nothing, when the cache is disabled, the page is already
// indexed, or another page holds k (the first copy stays; this one stays
// private and is freed on its last release).
func (c *Cache) Publish(id PageID, k Key) bool {
	if !c.enabled || c.refs[id] <= 0 || c.indexed[id] {
		return false
	}
	if _, dup := c.index[k]; dup {
		return false
	}
	c.index[k] = id
	c.key[id], c.indexed[id] = k, true
	return true
}

// Forget drops page id from the index, if it is there: its KV is known to
// be wrong (a checksum over it failed), so no one may match it again. The
// caller must hold a reference; the page is freed on its last release.
func (c *Cache) Forget(id PageID) {
	if c.refs[id] <= 0 || !c.indexed[id] {
		return
	}
	delete(c.index, c.key[id])
	c.indexed[id], c.key[id] = false, Key{}
}

// Release drops one reference on each of ids. The last reference frees an
// unindexed page and makes an indexed one cached (most recently used). If
// any id is out of range, unreferenced, or repeated, Release returns an
// error wrapping ErrNotAllocated and changes nothing, so a double release
// can never free a page another holder still uses.
func (c *Cache) Release(ids []PageID) error {
	c.epoch++ // this call's marks
	for _, id := range ids {
		if id < 0 || int(id) >= len(c.refs) || c.refs[id] <= 0 {
			return fmt.Errorf("%w: page %d", ErrNotAllocated, id)
		}
		if c.stamp[id] == c.epoch {
			return fmt.Errorf("%w: page %d released twice in one call", ErrNotAllocated, id)
		}
		c.stamp[id] = c.epoch
	}
	var free []PageID
	for _, id := range ids {
		c.refs[id]--
		if c.refs[id] > 0 {
			continue
		}
		c.used.Add(-1)
		if c.indexed[id] {
			c.pushTail(id)
			c.cached.Add(1)
			continue
		}
		free = append(free, id)
	}
	c.alloc.release(free)
	return nil
}

// Clone returns an independent deep copy of c over a copy of its
// allocator: the same pages free (in the same order), referenced, indexed
// and cached (in the same LRU order). Changing one never changes the
// other. The lifecycle model checker copies machines this way to explore
// their states.
func (c *Cache) Clone() *Cache {
	d := &Cache{
		alloc:   c.alloc.clone(),
		enabled: c.enabled,
		refs:    append([]int32(nil), c.refs...),
		key:     append([]Key(nil), c.key...),
		indexed: append([]bool(nil), c.indexed...),
		index:   make(map[Key]PageID, len(c.index)),
		prev:    append([]PageID(nil), c.prev...),
		next:    append([]PageID(nil), c.next...),
		head:    c.head,
		tail:    c.tail,
		stamp:   make([]uint64, len(c.stamp)),
	}
	for k, id := range c.index {
		d.index[k] = id
	}
	d.used.Store(c.used.Load())
	d.cached.Store(c.cached.Load())
	d.evictions.Store(c.evictions.Load())
	return d
}

// AppendState appends to b an encoding of everything that decides what c
// does next: each page's references and index key, the allocator's free
// list in the order it hands pages out, and the LRU order of the cached
// pages. Two caches with equal encodings behave the same under every
// sequence of calls; counters (Evictions) are left out. It is the cache's
// part of the lifecycle model checker's state hash.
func (c *Cache) AppendState(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(c.refs)))
	for id, r := range c.refs {
		b = binary.AppendVarint(b, int64(r))
		if c.indexed[id] {
			b = append(b, 1)
			b = append(b, c.key[id][:]...)
		} else {
			b = append(b, 0)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(c.alloc.free)))
	for _, id := range c.alloc.free {
		b = binary.AppendUvarint(b, uint64(id))
	}
	for id := c.head; id != none; id = c.next[id] {
		b = binary.AppendUvarint(b, uint64(id)+1)
	}
	return append(b, 0) // the LRU list's end
}

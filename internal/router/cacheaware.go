package router

import (
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pdserve/pdserve/internal/fleet"
)

// PolicyCacheAware takes the candidate with the lowest estimated cost
// Weight × uncached prompt tokens + Load.Tokens, where the uncached tokens
// are those of the request's prompt not in the prefix the router last sent
// to that worker (its own record of what it routed; see cacheAware), ties
// in turn. For a prefill worker Load.Tokens is the prompt tokens it has to
// compute before this one, so the cost estimates the tokens computed
// before the request's first token; for a decode worker it is the tokens
// its requests may hold, so the cost weighs the KV a hit need not receive
// against the KV the worker already holds.
const PolicyCacheAware = "cache_aware"

// Defaults of CacheAwareConfig.
const (
	// DefaultCacheAwareWeight is one: an uncached prompt token costs as
	// much as a prompt token waiting on the worker (both are computed
	// before the request's first token).
	DefaultCacheAwareWeight = 1.0
	// DefaultCacheAwareMaxPages bounds each worker's record, in pages:
	// 262,144 pages (4 Mi tokens at 16 tokens a page, more than a worker's
	// KV pool usually holds), about 12 MiB per worker at most.
	DefaultCacheAwareMaxPages = 1 << 18
	// DefaultCacheAwareTTL is how long a recorded page is believed cached
	// without being routed again: 5 min (SGLang's router evicts its trees
	// every 120 s down to --max-tree-size; a worker's own LRU keeps a page
	// as long as the pool does not need it).
	DefaultCacheAwareTTL = 5 * time.Minute
	// defaultPageSize is a worker's page size, in tokens, while its KV
	// fingerprint is not known (as the load estimate assumes).
	defaultPageSize = 16
)

// CacheAwareConfig tunes the cache_aware policy.
type CacheAwareConfig struct {
	// Weight is w of the cost w × uncached tokens + load tokens (≥ 0; 0 is
	// DefaultCacheAwareWeight, so a config left empty gets the default).
	Weight float64
	// MaxPages bounds each worker's record, in pages (0:
	// DefaultCacheAwareMaxPages); the worker's reported KV pool size
	// bounds it too, whichever is smaller.
	MaxPages int
	// TTL is how long a recorded page counts as cached without being sent
	// to the worker again (0: DefaultCacheAwareTTL).
	TTL time.Duration
}

// withDefaults returns c with its zero fields set to the defaults.
func (c CacheAwareConfig) withDefaults() CacheAwareConfig {
	if c.Weight == 0 {
		c.Weight = DefaultCacheAwareWeight
	}
	if c.MaxPages == 0 {
		c.MaxPages = DefaultCacheAwareMaxPages
	}
	if c.TTL == 0 {
		c.TTL = DefaultCacheAwareTTL
	}
	return c
}

// Validate reports a negative or non-finite weight, negative bounds.
func (c CacheAwareConfig) Validate() error {
	switch {
	case c.Weight < 0 || math.IsInf(c.Weight, 0) || math.IsNaN(c.Weight):
		return fmt.Errorf("cache-aware weight %v: want a finite number ≥ 0", c.Weight)
	case c.MaxPages < 0:
		return fmt.Errorf("cache-aware max pages %d: want ≥ 0 (0: %d)", c.MaxPages, DefaultCacheAwareMaxPages)
	case c.TTL < 0:
		return fmt.Errorf("cache-aware TTL %v: want ≥ 0 (0: %v)", c.TTL, DefaultCacheAwareTTL)
	}
	return nil
}

// cacheAware is the cache_aware policy. Its view of the workers' prefix
// caches is its own record of what it routed: per worker, the chained
// hashes of the full prompt pages of the requests it sent there, in LRU
// order, bounded by the worker's KV pool (the most it can cache), by
// MaxPages and by TTL. It does not see a worker's evictions, so the match
// is an estimate; a wrong one costs a slower request, never a wrong
// answer (the worker computes what it does not hold).
type cacheAware struct {
	cfg  CacheAwareConfig
	seed maphash.Seed
	now  func() time.Time
	// capacity returns the worker's KV pool size in pages (0: unknown).
	capacity func(w *fleet.Worker) int
	// observe sees each placed leg's prompt and matched tokens.
	observe func(prompt, matched int)
	next    atomic.Uint64

	mu      sync.RWMutex
	records map[*fleet.Worker]*pageRecord
}

func newCacheAware(d policyDeps) *cacheAware {
	now := d.now
	if now == nil {
		now = time.Now
	}
	capacity := d.capacity
	if capacity == nil {
		capacity = func(*fleet.Worker) int { return 0 }
	}
	observe := d.matched
	if observe == nil {
		observe = func(int, int) {}
	}
	return &cacheAware{cfg: d.cacheAware.withDefaults(), seed: d.seed, now: now, capacity: capacity, observe: observe,
		records: map[*fleet.Worker]*pageRecord{}}
}

func (*cacheAware) Name() string { return PolicyCacheAware }

// Pick takes the lowest w × uncached + Load.Tokens, the candidates in turn
// on equal costs (so an idle fleet shares new prefixes as round robin).
func (p *cacheAware) Pick(req *PickRequest, cands []Candidate) int {
	n := len(cands)
	start := int(p.next.Add(1) % uint64(n))
	if req == nil {
		return start
	}
	now := p.now().UnixNano()
	ttl := int64(p.cfg.TTL)
	best, bestCost := start, math.Inf(1)
	for i := range n {
		j := (start + i) % n
		c := &cands[j]
		cost := p.cfg.Weight*float64(len(req.InputIDs)-p.matched(req, c.Worker, now, ttl)) + float64(c.Load.Tokens)
		if cost < bestCost-scoreEpsilon {
			best, bestCost = j, cost
		}
	}
	return best
}

// matched returns the prompt tokens of req that w is believed to hold: its
// recorded full pages from the first, at most len(InputIDs)−1 (the last
// prompt token is always computed, for its logits).
func (p *cacheAware) matched(req *PickRequest, w *fleet.Worker, now, ttl int64) int {
	p.mu.RLock()
	rec := p.records[w]
	p.mu.RUnlock()
	if rec == nil {
		return 0
	}
	ps := pageSizeOf(w)
	pages := rec.match(req.pageHashes(p.seed, ps), now, ttl)
	return min(pages*ps, max(len(req.InputIDs)-1, 0))
}

// Chosen counts the prompt tokens w is believed to hold for req (the
// metrics) and records req's full prompt pages as cached on w (the most
// recent).
func (p *cacheAware) Chosen(req *PickRequest, w *fleet.Worker) {
	if req == nil {
		return
	}
	now := p.now().UnixNano()
	p.observe(len(req.InputIDs), p.matched(req, w, now, int64(p.cfg.TTL)))
	hs := req.pageHashes(p.seed, pageSizeOf(w))
	if len(hs) == 0 {
		return
	}
	p.mu.RLock()
	rec := p.records[w]
	p.mu.RUnlock()
	if rec == nil {
		p.mu.Lock()
		// A worker is removed before Forget is called: one seen removed
		// here gets no new record (else a Chosen racing the Forget of a
		// leaving worker would keep its record for good).
		if rec = p.records[w]; rec == nil && w.State() != fleet.StateRemoved {
			rec = newPageRecord()
			p.records[w] = rec
		}
		p.mu.Unlock()
		if rec == nil {
			return
		}
	}
	limit := p.cfg.MaxPages
	if c := p.capacity(w); c > 0 {
		limit = min(limit, c)
	}
	rec.add(hs, now, int64(p.cfg.TTL), limit)
}

// Forget drops w's record.
func (p *cacheAware) Forget(w *fleet.Worker) {
	p.mu.Lock()
	delete(p.records, w)
	p.mu.Unlock()
}

// pages returns the number of pages recorded for w (for tests).
func (p *cacheAware) pages(w *fleet.Worker) int {
	p.mu.RLock()
	rec := p.records[w]
	p.mu.RUnlock()
	if rec == nil {
		return 0
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.index)
}

// pageSizeOf is w's KV page size in tokens, from its fingerprint.
func pageSizeOf(w *fleet.Worker) int {
	if ps := w.Info().Fingerprint.PageSize; ps > 0 {
		return ps
	}
	return defaultPageSize
}

// pageHashes memoizes a request's chained page hashes for one seed and
// page size: the decode and prefill picks of a pair (same page size, as
// their fingerprints match) and Chosen hash the prompt once. A PickRequest
// is used by one goroutine at a time.
type pageHashes struct {
	seed     maphash.Seed
	pageSize int
	h        []uint64
}

// pageHashes returns the chained hashes of the full pages of req's prompt
// with pageSize tokens a page: page i's key is H(key of page i−1, its token
// ids), the first page's previous key being the page size (the worker's
// prefix cache chains its keys the same way, so equal keys mean an equal
// prefix up to the page's end). H mixes the previous key into maphash of
// the page's ids under seed: 64 bits, enough for a routing hint (a
// collision misroutes, it never changes an answer). The keys live only in
// this process, so the ids are hashed in the machine's byte order.
func (req *PickRequest) pageHashes(seed maphash.Seed, pageSize int) []uint64 {
	m := &req.hashes
	if m.h != nil && m.pageSize == pageSize && m.seed == seed {
		return m.h
	}
	n := len(req.InputIDs) / pageSize
	hs := make([]uint64, n)
	prev := uint64(pageSize)
	for i := range n {
		page := req.InputIDs[i*pageSize : (i+1)*pageSize]
		h := maphash.Bytes(seed, unsafe.Slice((*byte)(unsafe.Pointer(&page[0])), 4*pageSize))
		prev = mix64(prev*0x9e3779b97f4a7c15 ^ h)
		hs[i] = prev
	}
	*m = pageHashes{seed: seed, pageSize: pageSize, h: hs}
	return hs
}

// mix64 is the finalizer of MurmurHash3 (Appleby; fmix64): every input bit
// affects every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9e34a7c8f85
	x ^= x >> 33
	return x
}

// pageRecord is one worker's recorded pages: a map from page key to a node
// of a doubly linked LRU list kept in a slice (node 0 is the list's head
// sentinel: next is the most recent, prev the least).
type pageRecord struct {
	mu    sync.Mutex
	index map[uint64]int32
	nodes []lruNode
	free  []int32
}

// lruNode is one recorded page: its key and when it was last routed (Unix
// nanoseconds).
type lruNode struct {
	key        uint64
	at         int64
	prev, next int32
}

func newPageRecord() *pageRecord {
	return &pageRecord{index: map[uint64]int32{}, nodes: []lruNode{{}}}
}

// match returns how many of hs, from the first, are recorded and younger
// than ttl at now. A record is prefix-closed for each chain of keys: add
// makes a page more recent than every deeper page of its prompt, so a page
// is evicted (by the bound or the TTL) only after the deeper ones; match
// can therefore binary-search the first page missing, log₂ of the prompt's
// pages lookups.
func (r *pageRecord) match(hs []uint64, now, ttl int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Invariant: hs[:lo] are held, hs[hi:] are not.
	lo, hi := 0, len(hs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if n, ok := r.index[hs[mid]]; ok && now-r.nodes[n].at <= ttl {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// add records hs as routed at now, the deepest page first, so that the
// first page is the most recent and eviction from the LRU end drops a
// prefix's deepest pages before its first ones (as a worker's cache does:
// a page is evictable only once no longer page depends on it). Then it
// evicts the least recent pages beyond limit and those older than ttl.
func (r *pageRecord) add(hs []uint64, now, ttl int64, limit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(hs) - 1; i >= 0; i-- {
		n, ok := r.index[hs[i]]
		if ok {
			r.unlink(n)
		} else {
			n = r.alloc()
			r.nodes[n].key = hs[i]
			r.index[hs[i]] = n
		}
		r.nodes[n].at = now
		r.pushFront(n)
	}
	for len(r.index) > limit || (len(r.index) > 0 && now-r.nodes[r.nodes[0].prev].at > ttl) {
		t := r.nodes[0].prev
		r.unlink(t)
		delete(r.index, r.nodes[t].key)
		r.free = append(r.free, t)
	}
}

func (r *pageRecord) alloc() int32 {
	if k := len(r.free); k > 0 {
		n := r.free[k-1]
		r.free = r.free[:k-1]
		return n
	}
	r.nodes = append(r.nodes, lruNode{})
	return int32(len(r.nodes) - 1)
}

func (r *pageRecord) unlink(n int32) {
	p, x := r.nodes[n].prev, r.nodes[n].next
	r.nodes[p].next, r.nodes[x].prev = x, p
}

func (r *pageRecord) pushFront(n int32) {
	h := r.nodes[0].next
	r.nodes[n].prev, r.nodes[n].next = 0, h
	r.nodes[h].prev, r.nodes[0].next = n, n
}

// kvPages is w's KV pool size in pages as its last load report gave it (0
// before one).
func (r *Router) kvPages(w *fleet.Worker) int {
	ws := r.state(w)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if !ws.rep.haveStatic {
		return 0
	}
	return ws.rep.pagesTotal
}

package kvcache

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// DType is the element type of the KV cache.
type DType uint8

// KV cache element types.
const (
	F32  DType = iota + 1 // IEEE 754 binary32, 4 bytes
	F16                   // IEEE 754 binary16, 2 bytes
	BF16                  // bfloat16, 2 bytes
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// String returns the lowercase name used in flags and fingerprints.
func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType parses "f32", "f16" or "bf16".
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "float32":
		return F32, nil
	case "f16", "float16":
		return F16, nil
	case "bf16", "bfloat16":
		return BF16, nil
	}
	return 0, fmt.Errorf("unknown KV dtype %q (want f32, f16 or bf16)", s)
}

// Geometry is the shape of a model's KV cache for one token:
// [Layers, 2 (k and v), KVHeads, HeadDim] elements of DType.
type Geometry struct {
	Layers  int
	KVHeads int
	HeadDim int
	DType   DType
}

// BytesPerToken is Layers × 2 × KVHeads × HeadDim × DType.Size(). For the
// Llama-3-8B shape (32 × 2 × 8 × 128 × 2 bytes) it is 131072 (128 KiB).
func (g Geometry) BytesPerToken() int {
	return g.Layers * 2 * g.KVHeads * g.HeadDim * g.DType.Size()
}

// Limits on a geometry: far beyond any real model, low enough that sizes
// computed from them cannot overflow.
const (
	MaxLayers  = 1024
	MaxKVHeads = 1024
	MaxHeadDim = 4096
	// MaxPageSize is the largest page, in tokens.
	MaxPageSize = 4096
	// MaxPages bounds a pool's page count (its free list is one slice).
	MaxPages = 1 << 24
)

// Validate reports a geometry with a dimension out of range or an unknown
// dtype.
func (g Geometry) Validate() error {
	if g.Layers <= 0 || g.KVHeads <= 0 || g.HeadDim <= 0 || g.DType.Size() == 0 ||
		g.Layers > MaxLayers || g.KVHeads > MaxKVHeads || g.HeadDim > MaxHeadDim {
		return fmt.Errorf("invalid KV geometry: layers=%d kv_heads=%d head_dim=%d dtype=%s (limits: %d layers, %d KV heads, head dim %d)",
			g.Layers, g.KVHeads, g.HeadDim, g.DType, MaxLayers, MaxKVHeads, MaxHeadDim)
	}
	return nil
}

// PageID names one page of a pool, 0 ≤ id < Total.
type PageID int32

// ErrNotAllocated is returned by Free for a page that is not allocated.
var ErrNotAllocated = errors.New("kvcache: page not allocated")

// Allocator hands out page ids from a free list. used + free == total always.
type Allocator struct {
	total     int
	free      []PageID // stack; the next page handed out is free[len-1]
	allocated []bool
	used      atomic.Int64
}

// NewAllocator returns an allocator over pages 0..total-1, all free.
func NewAllocator(total int) *Allocator {
	a := &Allocator{total: total, free: make([]PageID, total), allocated: make([]bool, total)}
	for i := range total {
		// Hand out low ids first: pages are reused promptly, which keeps the
		// touched part of a large pool small.
		a.free[i] = PageID(total - 1 - i)
	}
	return a
}

// Alloc takes n pages, all or nothing. It returns false, and takes nothing,
// when fewer than n pages are free. Alloc(0) returns an empty slice and true.
func (a *Allocator) Alloc(n int) ([]PageID, bool) {
	if n < 0 || n > len(a.free) {
		return nil, false
	}
	ids := make([]PageID, n)
	for i := range n {
		id := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		a.allocated[id] = true
		ids[i] = id
	}
	a.used.Add(int64(n))
	return ids, true
}

// Free returns pages to the free list. If any id is out of range or not
// allocated, Free returns an error wrapping ErrNotAllocated and frees nothing.
func (a *Allocator) Free(ids []PageID) error {
	seen := make(map[PageID]bool, len(ids))
	for _, id := range ids {
		if id < 0 || int(id) >= a.total || !a.allocated[id] || seen[id] {
			return fmt.Errorf("%w: page %d", ErrNotAllocated, id)
		}
		seen[id] = true
	}
	a.release(ids)
	return nil
}

// release returns ids, which the caller knows are allocated and distinct,
// to the free list (the Cache's path: its reference counts checked them).
func (a *Allocator) release(ids []PageID) {
	for _, id := range ids {
		if !a.allocated[id] {
			panic(fmt.Sprintf("kvcache: page %d released while free", id))
		}
		a.allocated[id] = false
		a.free = append(a.free, id)
	}
	a.used.Add(-int64(len(ids)))
}

// Free pages right now. Only for the owning goroutine.
func (a *Allocator) FreeCount() int { return len(a.free) }

// Used is the number of allocated pages; safe from any goroutine.
func (a *Allocator) Used() int { return int(a.used.Load()) }

// Total is the number of pages; safe from any goroutine.
func (a *Allocator) Total() int { return a.total }

// Pool is an Allocator plus the bytes of its pages.
type Pool struct {
	*Allocator
	geo       Geometry
	pageSize  int
	pageBytes int
	slab      []byte
	version   []uint64
	release   func() error // unmaps slab
	cleanup   runtime.Cleanup
	closeOnce sync.Once
}

// MinPages is the smallest pool NewPool builds.
const MinPages = 4

// NewPool sizes a pool to hold as many pages of pageSize tokens as fit in
// memoryBytes. It returns an error for an invalid geometry, a pageSize < 1,
// or a budget smaller than MinPages pages.
//
// The slab is mapped at once outside the Go heap (see newSlab) and the
// operating system backs it lazily, so an idle pool costs address space,
// not resident memory: a page is committed when it is first written, and
// the allocator hands out low page ids first, so a pool commits about as
// much as its peak use. NewPool returns an error if the memory cannot be
// mapped. Close releases it.
func NewPool(geo Geometry, pageSize int, memoryBytes int64) (*Pool, error) {
	if err := geo.Validate(); err != nil {
		return nil, err
	}
	if pageSize < 1 || pageSize > MaxPageSize {
		return nil, fmt.Errorf("page size must be between 1 and %d tokens, got %d", MaxPageSize, pageSize)
	}
	pageBytes := geo.BytesPerToken() * pageSize
	pages := memoryBytes / int64(pageBytes)
	if pages < MinPages {
		return nil, fmt.Errorf("KV cache memory %d bytes holds %d pages of %d bytes; need at least %d",
			memoryBytes, pages, pageBytes, MinPages)
	}
	if pages > MaxPages {
		return nil, fmt.Errorf("KV cache memory %d bytes makes %d pages of %d bytes; at most %d pages (use larger pages or less memory)",
			memoryBytes, pages, pageBytes, MaxPages)
	}
	slab, release, err := newSlab(int64(pageBytes) * pages)
	if err != nil {
		return nil, fmt.Errorf("KV cache memory of %d bytes: %w", int64(pageBytes)*pages, err)
	}
	p := &Pool{
		Allocator: NewAllocator(int(pages)),
		geo:       geo,
		pageSize:  pageSize,
		pageBytes: pageBytes,
		slab:      slab,
		version:   make([]uint64, pages),
	}
	// A pool nobody closed releases its memory once unreachable (then
	// nothing can reach its pages either).
	p.cleanup = runtime.AddCleanup(p, func(release func() error) { _ = release() }, release)
	p.release = release
	return p, nil
}

// Close releases the pool's page memory. Nothing may use the pool or a
// page slice taken from it afterwards (the worker closes its pool once its
// loop, forward and I/O goroutines have stopped). It is idempotent.
func (p *Pool) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.cleanup.Stop()
		p.slab = nil
		err = p.release()
	})
	return err
}

// Geometry is the per-token KV shape.
func (p *Pool) Geometry() Geometry { return p.geo }

// PageSize is the number of tokens per page.
func (p *Pool) PageSize() int { return p.pageSize }

// PageBytes is the size of one page: PageSize × Geometry.BytesPerToken().
func (p *Pool) PageBytes() int { return p.pageBytes }

// PagesFor is the number of pages that hold n tokens: ceil(n / PageSize).
func (p *Pool) PagesFor(n int) int { return (n + p.pageSize - 1) / p.pageSize }

// Page returns the bytes of page id. The caller must own the page. A writer
// must call MarkWritten afterwards.
func (p *Pool) Page(id PageID) []byte {
	off := int64(id) * int64(p.pageBytes)
	return p.slab[off : off+int64(p.pageBytes) : off+int64(p.pageBytes)]
}

// Segment returns the K (kv=0) or V (kv=1) entries of one layer of a page:
// [PageSize, KVHeads, HeadDim] elements.
func (p *Pool) Segment(id PageID, layer, kv int) []byte {
	seg := p.pageSize * p.geo.KVHeads * p.geo.HeadDim * p.geo.DType.Size()
	page := p.Page(id)
	off := (layer*2 + kv) * seg
	return page[off : off+seg : off+seg]
}

// SlotBytes is the size of one token's entry in one segment:
// KVHeads × HeadDim × DType.Size().
func (p *Pool) SlotBytes() int { return p.geo.KVHeads * p.geo.HeadDim * p.geo.DType.Size() }

// MarkWritten records that the bytes of page id changed, so caches keyed by
// Version (such as the simulated model's digests) are recomputed.
func (p *Pool) MarkWritten(id PageID) { p.version[id]++ }

// Version counts writes to page id (see MarkWritten).
func (p *Pool) Version(id PageID) uint64 { return p.version[id] }

// clone returns an independent copy of a.
func (a *Allocator) clone() *Allocator {
	d := &Allocator{total: a.total, free: append([]PageID(nil), a.free...),
		allocated: append([]bool(nil), a.allocated...)}
	d.used.Store(a.used.Load())
	return d
}

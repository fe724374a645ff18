// Package kvcache is the paged KV pool of a worker.
//
// # Overview
//
// A [Pool] is one slab of memory cut into pages. A page holds the KV cache of
// PageSize consecutive tokens of one sequence for every layer. Its layout is
//
//	[layer][k|v][slot][kv_heads][head_dim]   (element type Geometry.DType)
//
// so the K (or V) entries of one layer for all slots of a page are contiguous,
// which is what an attention kernel reads. A sequence of n tokens owns
// ceil(n/PageSize) pages; token t lives in page t/PageSize at slot t%PageSize.
//
// The [Allocator] is the pure accounting part (a free list of page ids with
// used + free == total at all times). The request lifecycle machine owns it;
// the worker shell and the model own the bytes.
//
// A [Cache] is the prefix cache over an Allocator: pages with reference
// counts, full pages indexed by the chained hash of their tokens, unreferenced
// indexed pages kept and evicted least recently used only when an allocation
// needs them. Its accounting tells free, used (referenced) and cached
// (unreferenced, indexed) pages apart.
//
// # Concurrency
//
// Allocator and Pool are not safe for concurrent use, with one exception:
// [Allocator.Used] and [Allocator.Total] may be read from any goroutine. A
// worker touches both only from its loop goroutine.
//
// # Ownership
//
// Through the Allocator, a page belongs to exactly one request between Alloc
// and Free; through a Cache, to every holder of a reference, and a shared
// (indexed) page is never written. Free of a page
// that is not allocated returns an error and changes nothing, so a double free
// can never hand one page to two owners.
package kvcache

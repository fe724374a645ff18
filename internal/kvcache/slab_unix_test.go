//go:build unix

package kvcache

import (
	"runtime"
	"testing"
)

// TestPoolOutsideHeap: a pool's pages are not Go heap, so a large pool
// neither counts toward the garbage collector's pacing nor is committed
// until written; its pages read zero until written, keep what is written,
// and Close (idempotent) releases them.
func TestPoolOutsideHeap(t *testing.T) {
	geo := Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: BF16}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p, err := NewPool(geo, 16, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 64<<20 {
		t.Fatalf("a 1 GiB pool grew the Go heap by %d bytes", grown)
	}
	last := PageID(p.Total() - 1)
	for _, id := range []PageID{0, last} {
		pg := p.Page(id)
		if pg[0] != 0 || pg[len(pg)-1] != 0 {
			t.Fatalf("page %d not zero before it is written", id)
		}
		pg[0], pg[len(pg)-1] = 7, 9
	}
	if pg := p.Page(last); pg[0] != 7 || pg[len(pg)-1] != 9 {
		t.Fatal("page lost what was written")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

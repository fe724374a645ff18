package model

import (
	"fmt"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// AliasCheck finds pages a batch must not share, for a Model's Forward
// validation: a page listed twice among the pages covering one sequence,
// and a page written by one sequence and covered by another. Pages only
// read may be shared between sequences (a common prefix). It costs
// O(pages covered) per batch, with per-page epoch stamps reused from batch
// to batch instead of maps. One AliasCheck serves one pool; it is not safe
// for concurrent use.
type AliasCheck struct {
	stamp  []uint64 // by page id: epoch of the last visit
	wstamp []uint64 // by page id: batch epoch in which a sequence writes it
	wowner []int32  // by page id: that sequence
	epoch  uint64
}

// NewAliasCheck returns an AliasCheck for a pool of pages pages.
func NewAliasCheck(pages int) *AliasCheck {
	return &AliasCheck{stamp: make([]uint64, pages), wstamp: make([]uint64, pages), wowner: make([]int32, pages)}
}

// Check reports the first aliasing in seqs as an error "seq I: …" naming
// the page and the other sequence. Each sequence covers its first
// pool.PagesFor(Pos+len(Tokens)) pages and writes those from Pos/PageSize
// on. Page ids must be below the pool's page count (checked before).
func (c *AliasCheck) Check(pool *kvcache.Pool, seqs []SeqInput) error {
	ps := pool.PageSize()
	c.epoch++
	batch := c.epoch
	for i := range seqs {
		s := &seqs[i]
		c.epoch++
		covered := s.Pages[:pool.PagesFor(s.Pos+len(s.Tokens))]
		for _, id := range covered {
			if c.stamp[id] == c.epoch {
				return fmt.Errorf("seq %d: page %d listed twice", i, id)
			}
			c.stamp[id] = c.epoch
		}
		for _, id := range covered[s.Pos/ps:] {
			if c.wstamp[id] == batch {
				return fmt.Errorf("seq %d: page %d is also written by seq %d", i, id, c.wowner[id])
			}
			c.wstamp[id] = batch
			c.wowner[id] = int32(i)
		}
	}
	for i := range seqs {
		s := &seqs[i]
		for _, id := range s.Pages[:s.Pos/ps] {
			if c.wstamp[id] == batch && int(c.wowner[id]) != i {
				return fmt.Errorf("seq %d: reads page %d that seq %d writes", i, id, c.wowner[id])
			}
		}
	}
	return nil
}

package model

import (
	"errors"
	"fmt"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// BatchCheck validates a Forward call for a Model, without touching page
// bytes: the pool, the outputs, every sequence's positions, tokens, pages
// and sampling parameters, and the pages a batch must not share — a page
// listed twice among the pages covering one sequence, or written by one
// sequence and covered by another (pages only read may be shared: a common
// prefix). The aliasing part costs O(pages covered) per batch, with
// per-page epoch stamps reused from batch to batch instead of maps. One
// BatchCheck serves one pool; it is not safe for concurrent use.
type BatchCheck struct {
	stamp  []uint64 // by page id: epoch of the last visit
	wstamp []uint64 // by page id: batch epoch in which a sequence writes it
	wowner []int32  // by page id: that sequence
	epoch  uint64
}

// NewBatchCheck returns a BatchCheck for a pool of pages pages.
func NewBatchCheck(pages int) *BatchCheck {
	return &BatchCheck{stamp: make([]uint64, pages), wstamp: make([]uint64, pages), wowner: make([]int32, pages)}
}

// Check validates a batch of seqs with nOut outputs on pool for a model
// with info's geometry, context length and vocabulary: besides positions,
// tokens and pages, a sequence's Forks (0…MaxForks), ScoreTop
// (0…MaxLogprobs) and Score (nil, or one target per token, each −1 or in
// the vocabulary), and for a sampling sequence its parameters (Validate,
// TopP 0 read as 1), the token ids they name (in the vocabulary) and its
// Mask (nil or ⌈vocabulary/64⌉ words). A
// sequence's error
// reads "seq I: …"; the caller prefixes its package. Each sequence covers
// its first pool.PagesFor(Pos+len(Tokens)) pages and writes those from
// Pos/PageSize on.
func (c *BatchCheck) Check(pool *kvcache.Pool, info Info, seqs []SeqInput, nOut int) error {
	if pool == nil {
		return errors.New("nil pool")
	}
	if g := pool.Geometry(); g != info.Geometry {
		return fmt.Errorf("pool KV geometry %+v does not match the model's %+v", g, info.Geometry)
	}
	if nOut != len(seqs) {
		return fmt.Errorf("%d outputs for %d sequences", nOut, len(seqs))
	}
	total, V := pool.Total(), info.VocabSize
	for i := range seqs {
		s := &seqs[i]
		switch {
		case s.Pos < 0:
			return seqErr(i, "negative position %d", s.Pos)
		case len(s.Tokens) == 0:
			return seqErr(i, "no tokens")
		case s.Pos+len(s.Tokens) > info.ContextLen:
			return seqErr(i, "position %d + %d tokens = %d exceeds the context length %d",
				s.Pos, len(s.Tokens), s.Pos+len(s.Tokens), info.ContextLen)
		}
		for j, t := range s.Tokens {
			if t < 0 || int(t) >= V {
				return seqErr(i, "token %d at index %d out of range [0, %d)", t, j, V)
			}
		}
		n := s.Pos + len(s.Tokens)
		if need := pool.PagesFor(n); len(s.Pages) < need {
			return seqErr(i, "%d pages hold %d tokens; positions 0…%d need %d",
				len(s.Pages), len(s.Pages)*pool.PageSize(), n-1, need)
		}
		for _, id := range s.Pages[:pool.PagesFor(n)] {
			if id < 0 || int(id) >= total {
				return seqErr(i, "page %d outside the pool's pages [0, %d)", id, total)
			}
		}
		if err := checkScores(s, V); err != nil {
			return seqErr(i, "%v", err)
		}
		if s.Sample {
			p := s.Sampling
			if p.TopP == 0 {
				p.TopP = 1
			}
			if err := p.Validate(); err != nil {
				return seqErr(i, "%v", err)
			}
			bad := int32(-1)
			p.TokenIDs(func(id int32) bool {
				if int(id) >= V {
					bad = id
					return false
				}
				return true
			})
			if bad >= 0 {
				return seqErr(i, "sampling names token %d, outside the vocabulary [0, %d)", bad, V)
			}
			if s.Mask != nil && len(s.Mask) != (V+63)/64 {
				return seqErr(i, "mask of %d words for a vocabulary of %d tokens (want %d)", len(s.Mask), V, (V+63)/64)
			}
		}
	}
	return c.aliasing(pool, seqs)
}

// checkScores validates s's forks and prompt-logprob fields for a
// vocabulary of V tokens.
func checkScores(s *SeqInput, V int) error {
	switch {
	case s.Forks < 0 || s.Forks > MaxForks:
		return fmt.Errorf("forks must be in [0, %d], got %d", MaxForks, s.Forks)
	case s.ScoreTop < 0 || s.ScoreTop > MaxLogprobs:
		return fmt.Errorf("score top must be in [0, %d], got %d", MaxLogprobs, s.ScoreTop)
	case s.Score != nil && len(s.Score) != len(s.Tokens):
		return fmt.Errorf("%d score targets for %d tokens", len(s.Score), len(s.Tokens))
	}
	for j, t := range s.Score {
		if t < -1 || int(t) >= V {
			return fmt.Errorf("score target %d at index %d is neither -1 nor in [0, %d)", t, j, V)
		}
	}
	return nil
}

func seqErr(i int, format string, args ...any) error {
	return fmt.Errorf("seq %d: %s", i, fmt.Sprintf(format, args...))
}

// aliasing reports the first page shared against the rules, naming the
// page and the other sequence. Page ids are below the pool's page count
// (checked before).
func (c *BatchCheck) aliasing(pool *kvcache.Pool, seqs []SeqInput) error {
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

package lifecycle

import (
	"fmt"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
)

// The prefix cache (Config.PrefixCache; docs/architecture.md, "With a
// prefix cache").
//
// The machine's pages live in a kvcache.Cache: a request holds one
// reference to each of its pages, and a full page whose KV is complete is
// published under the chained hash of the tokens up to its end
// (kvxfer.ChainPage, rooted at the fingerprint's kvxfer.ChainSeed). A
// request that starts computing (prefill, colocated, and decode or
// colocated after a preemption) first takes references to the longest
// published prefix of its tokens and computes only from the first token not
// covered, so the forward never writes a matched page; the match stops one
// page short of the end when the last token would fall in it, since the
// last token is always computed (its logits are sampled, or the next
// decode step needs the positions before it). Decode matches its prompt's
// full pages when it admits the room, tells prefill in ROOM_READY, and
// receives only the others; KV_DONE still binds and checksums all P pages
// as decode will use them, so a wrong decode-side page fails the transfer.
//
// What is published, and when:
//
//   - prefill: a bound request's full prompt pages when the forward that
//     completes them finishes (an unbound, optimistic request's once
//     ROOM_OPEN binds it): KV that no one else will write;
//   - decode: the prompt's received full pages only once KV_DONE is
//     verified and acknowledged, and at the end every full page of prompt
//     and output whose KV is complete;
//   - colocated: full pages as their forward completes them, and at the end
//     as decode.
//
// Only full pages are shared, and a request writes only from its first
// uncached token on, into pages it allocated: the page a decode step
// writes is the sequence's tail, never full before the step, so never
// published; a published page is never written again.

// chainTo extends r's chain (the page hashes of its tokens: the prompt,
// then the output so far) to n full pages of toks, which must start with
// the tokens the chain already covers, and returns it.
func (m *Machine) chainTo(r *req, toks []int32, n int) []kvxfer.PageHash {
	ps := m.cfg.PageSize
	for i := len(r.chain); i < n; i++ {
		parent := m.seed
		if i > 0 {
			parent = r.chain[i-1]
		}
		r.chain = append(r.chain, kvxfer.ChainPage(parent, toks[i*ps:(i+1)*ps]))
	}
	return r.chain[:n]
}

// seqTokens is r's tokens whose KV a decoding request's pages may hold: the
// prompt and the output so far.
func (r *req) seqTokens() []int32 {
	if len(r.outputs) == 0 {
		return r.InputIDs
	}
	out := make([]int32, 0, len(r.InputIDs)+len(r.outputs))
	out = append(out, r.InputIDs...)
	return append(out, r.outputs...)
}

// keysOf converts page hashes to the cache's keys (the same 16 bytes).
func keysOf(hs []kvxfer.PageHash) []kvcache.Key {
	ks := make([]kvcache.Key, len(hs))
	for i, h := range hs {
		ks[i] = kvcache.Key(h)
	}
	return ks
}

// matchPrefix takes references to the longest cached prefix of toks, at
// most limit pages.
func (m *Machine) matchPrefix(r *req, toks []int32, limit int) []kvcache.PageID {
	if !m.cache.Enabled() || limit <= 0 {
		return nil
	}
	return m.cache.Match(keysOf(m.chainTo(r, toks, limit)), limit)
}

// countQuery counts one lookup of toks in the prefix cache that found hit
// pages, for an admission that went ahead.
func (m *Machine) countQuery(toks []int32, hit int) {
	if m.cache.Enabled() {
		m.counters.PrefixQueriedTokens += uint64(len(toks))
		m.counters.PrefixHitTokens += uint64(hit * m.cfg.PageSize)
	}
}

// computeLimit is how many pages of k tokens to be computed the cache may
// supply: every full page before the one that holds the last token.
func (m *Machine) computeLimit(k int) int { return (k - 1) / m.cfg.PageSize }

// publish indexes r's pages [from, to), whose KV (of r's chain) is
// complete.
func (m *Machine) publish(r *req, toks []int32, from, to int) {
	if !m.cache.Enabled() || to <= from {
		return
	}
	hs := m.chainTo(r, toks, to)
	for i := from; i < to; i++ {
		m.cache.Publish(r.pages[i], kvcache.Key(hs[i]))
	}
}

// publishPrefill indexes prefill request r's full prompt pages [from, to)
// under the hashes recorded with them (what was computed into them).
func (m *Machine) publishPrefill(r *req, from, to int) {
	if !m.cache.Enabled() || r.opt.unbound {
		return
	}
	to = min(to, len(r.InputIDs)/m.cfg.PageSize)
	for i := from; i < to; i++ {
		m.cache.Publish(r.pages[i], kvcache.Key(m.pageHash[r.pages[i]]))
	}
}

// validTokens is how many of r's tokens (prompt, then output) have their
// KV complete in r's pages, on decode and colocated workers: none before
// decode verified the transfer (a local request has no transfer), what
// prefilling computed, and while
// decoding every token but the last output (the next step writes it).
func (m *Machine) validTokens(r *req) int {
	if m.cfg.Role == RoleDecode && !r.ackSent && !r.Room.IsZero() {
		return 0
	}
	switch r.stage {
	case StagePrefilling:
		return r.computed
	case StageQueued, StageDecoding:
		return len(r.InputIDs) + len(r.outputs) - 1
	}
	return 0
}

// publishAtEnd indexes the full pages of decode or colocated request r,
// ending now, whose KV is complete: prompt and output stay in the cache.
func (m *Machine) publishAtEnd(r *req) {
	if m.cfg.Role == RolePrefill || !m.cache.Enabled() || len(r.pages) == 0 {
		return
	}
	n := min(m.validTokens(r)/m.cfg.PageSize, len(r.pages))
	m.publish(r, r.seqTokens(), 0, n)
}

// startComputing sets r, just admitted with hit pages from the cache, to
// compute from the first token they do not cover.
func (m *Machine) startComputing(r *req, hit int) {
	r.computed = hit * m.cfg.PageSize
	if len(r.outputs) == 0 {
		r.cachedTokens = r.computed
	}
}

// fromCache and heldByDecode describe cache hits in a request's history
// (nothing when there are none).
func fromCache(hit int) string {
	if hit == 0 {
		return ""
	}
	return fmt.Sprintf(", %d from the prefix cache", hit)
}

func heldByDecode(pages int) string {
	if pages == 0 {
		return ""
	}
	return fmt.Sprintf(" (decode holds %d pages from its prefix cache)", pages)
}

// allocPages allocates n private pages (evicting cached ones if it must);
// a page new to its holder carries no recorded hash.
func (m *Machine) allocPages(n int) ([]kvcache.PageID, bool) {
	ids, ok := m.cache.Alloc(n)
	if ok && m.pageHash != nil {
		for _, p := range ids {
			m.pageHash[p] = kvxfer.PageHash{}
		}
	}
	return ids, ok
}

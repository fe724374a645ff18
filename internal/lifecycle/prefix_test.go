package lifecycle

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// pump runs the world's nodes until every one of them finalized want
// requests: frames and page I/O delivered at once, one forward per round.
func pump(t *testing.T, w *world, want int, nodes ...*node) {
	t.Helper()
	for step := 0; ; step++ {
		done := true
		for _, n := range nodes {
			done = done && len(n.finals) >= want && n.batch == nil && len(n.io) == 0 && len(n.inbox) == 0
		}
		if done {
			return
		}
		if step > 100_000 {
			t.Fatalf("stuck after %d rounds", step)
		}
		w.now = w.now.Add(5 * time.Millisecond)
		for _, n := range nodes {
			if len(n.inbox) > 0 {
				w.deliver(n, len(n.inbox))
			}
			if len(n.io) > 0 {
				w.runIO(n, len(n.io))
			}
			if n.batch != nil {
				w.batchDone(n, nil)
			}
			w.schedule(n)
		}
	}
}

// TestColocatedPrefixCacheSameAnswer: a colocated worker with the prefix
// cache gives every request the answer it gets without one, on workloads
// that share prefixes (common starts, next turns of earlier requests),
// with requests arriving while others run and pools so small that
// requests are preempted and cached pages evicted. The checks of every
// step (checkLegal, and no write into a page another request holds or the
// cache indexes) run throughout.
func TestColocatedPrefixCacheSameAnswer(t *testing.T) {
	var hits, evictions, preemptions uint64
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			var reqs []Request
			for i := range 24 {
				q := Request{RID: fmt.Sprintf("c%d-r%d", seed, i), InputIDs: tokens(1 + rng.IntN(20)),
					MaxTokens: 1 + rng.IntN(10), Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: rng.IntN(2) == 0}
				reqs = append(reqs, q)
			}
			want := sharePrefixes(t, rng, reqs, 40)
			w := newWorld(t)
			cfg := testConfig(RoleColocated)
			cfg.PrefixCache = true
			pages := 14 + rng.IntN(20) // 13 pages hold the longest request
			c := w.addNode(cfg, pages, 0)
			next := 0
			for step := 0; len(c.finals) < len(reqs); step++ {
				if step > 100_000 {
					t.Fatalf("stuck: %d of %d done", len(c.finals), len(reqs))
				}
				w.now = w.now.Add(5 * time.Millisecond)
				for next < len(reqs) && rng.IntN(3) == 0 {
					w.arrive(c, reqs[next])
					next++
				}
				if c.batch != nil {
					w.batchDone(c, nil)
				}
				w.schedule(c)
				if c.batch == nil && next < len(reqs) {
					w.arrive(c, reqs[next])
					next++
				}
			}
			for _, q := range reqs {
				f := c.finals[q.RID]
				if f.Outcome != outcome.OK {
					t.Fatalf("%s ended %s: %s", q.RID, f.Outcome, f.Err)
				}
				if !slices.Equal(c.emitted[q.RID], want[q.RID]) {
					t.Fatalf("%s: with the cache %v, without %v", q.RID, c.emitted[q.RID], want[q.RID])
				}
				if f.CachedTokens < 0 || f.CachedTokens >= len(q.InputIDs) || f.CachedTokens%cfg.PageSize != 0 {
					t.Fatalf("%s: %d cached tokens of a %d-token prompt", q.RID, f.CachedTokens, len(q.InputIDs))
				}
			}
			st := c.m.Stats(w.now)
			if st.PagesUsed != 0 || st.PagesCached > pages {
				t.Fatalf("after the run: %d pages used, %d cached of %d", st.PagesUsed, st.PagesCached, pages)
			}
			hits += st.Counters.PrefixHitTokens
			evictions += st.Counters.PrefixEvictions
			preemptions += st.Counters.Preemptions
		})
	}
	t.Logf("hit tokens %d, evictions %d, preemptions %d", hits, evictions, preemptions)
	if hits == 0 || evictions == 0 || preemptions == 0 {
		t.Fatalf("hit tokens %d, evictions %d, preemptions %d: a path went untested", hits, evictions, preemptions)
	}
}

// TestPrefixCacheSkipsCachedPages follows one multi-turn conversation
// through a prefill and a decode worker with the cache: the second turn
// (the first turn's prompt and answer, then more) is computed on prefill
// from its first uncached page only, decode states in ROOM_READY the pages
// it kept from the first turn (prompt and generated), prefill sends only
// the pages after them, KV_DONE still covers every page, and
// cached_tokens is what prefill did not compute.
func TestPrefixCacheSkipsCachedPages(t *testing.T) {
	cfgP, cfgD := testConfig(RolePrefill), testConfig(RoleDecode)
	cfgP.PrefixCache, cfgD.PrefixCache = true, true
	w := newWorld(t)
	P, D := w.addNode(cfgP, 32, 0), w.addNode(cfgD, 32, 0)
	w.connect()
	var chunks []kvxfer.KVChunk
	var readies []kvxfer.RoomReady
	var dones []kvxfer.KVDone
	var forwards []RunBatch
	w.onFrame = func(to *node, msg kvxfer.Message) {
		switch x := msg.(type) {
		case kvxfer.KVChunk:
			chunks = append(chunks, x)
		case kvxfer.RoomReady:
			readies = append(readies, x)
		case kvxfer.KVDone:
			dones = append(dones, x)
		}
	}
	w.onBatch = func(n *node, b RunBatch) {
		if n == P {
			forwards = append(forwards, b)
		}
	}
	turn := func(i int, prompt []int32) Request {
		q := Request{RID: fmt.Sprintf("t%d", i), Room: room(i), Gen: 1, InputIDs: prompt, MaxTokens: 9,
			Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: true}
		qd := q
		qd.Peer = w.peerOf(D)
		w.arrive(P, q)
		w.arrive(D, qd)
		return q
	}
	q1 := turn(1, tokens(10)) // pages of 4: 2 full prompt pages, 1 partial
	pump(t, w, 1, P, D)
	out1 := D.emitted[q1.RID]
	if len(out1) != 9 || D.finals[q1.RID].Outcome != outcome.OK || D.finals[q1.RID].CachedTokens != 0 {
		t.Fatalf("turn 1: %v, %+v", out1, D.finals[q1.RID])
	}
	chunks, readies, dones, forwards = nil, nil, nil, nil
	// Turn 2: 10 + 9 + 3 = 22 tokens. Prefill holds the first turn's 2
	// full prompt pages; decode the first turn's 4 full pages (its KV of
	// 18 tokens: the prompt and every output but the last).
	p2 := slices.Concat(q1.InputIDs, out1, []int32{7, 8, 9})
	q2 := turn(2, p2)
	pump(t, w, 2, P, D)
	if f := D.finals[q2.RID]; f.Outcome != outcome.OK {
		t.Fatalf("turn 2 ended %s: %s", f.Outcome, f.Err)
	}
	if len(readies) != 1 || readies[0].CachedPages != 4 {
		t.Fatalf("ROOM_READY %+v, want 4 cached pages", readies)
	}
	for _, c := range chunks {
		if c.FirstPage < 4 {
			t.Fatalf("prefill sent page %d, which decode holds", c.FirstPage)
		}
	}
	if len(dones) != 1 || dones[0].NPages != 6 || dones[0].CachedTokens != 8 {
		t.Fatalf("KV_DONE %+v, want 6 pages with 8 cached tokens", dones)
	}
	if len(forwards) == 0 || forwards[0].Seqs[0].Input.Pos != 8 || forwards[0].PrefillTokens != 14 {
		t.Fatalf("prefill's first forward of turn 2: %+v, want 14 tokens from position 8", forwards)
	}
	if a, b := P.finals[q1.RID].SentPages, P.finals[q2.RID].SentPages; a != 3 || b != 2 {
		t.Fatalf("prefill sent %d pages of turn 1 and %d of turn 2, want 3 and 2", a, b)
	}
	if f := D.finals[q2.RID]; f.CachedTokens != 8 || P.finals[q2.RID].CachedTokens != 8 {
		t.Fatalf("cached tokens: decode %d, prefill %d; want prefill's 8", f.CachedTokens, P.finals[q2.RID].CachedTokens)
	}
	// The same answer as colocated serving without a cache.
	want := reference(t, []Request{q1, q2})
	if !slices.Equal(D.emitted[q2.RID], want[q2.RID]) {
		t.Fatalf("turn 2 with the cache %v, without %v", D.emitted[q2.RID], want[q2.RID])
	}
	for _, n := range []*node{P, D} {
		if st := n.m.Stats(w.now); st.PagesUsed != 0 || st.PagesCached == 0 {
			t.Fatalf("%s: %d pages used, %d cached after the run", n.name, st.PagesUsed, st.PagesCached)
		}
	}
}

// TestCorruptCachedPageCaught: a decode-side cached page that no longer
// holds the KV prefill computed (bit rot, a bookkeeping bug) fails the
// transfer's checksum, which covers the cached prefix too: the request
// ends failed_transfer and nothing is decoded from it. The cached pages
// are dropped from the index, so the next request with that prompt
// receives every page and succeeds.
func TestCorruptCachedPageCaught(t *testing.T) {
	cfgP, cfgD := testConfig(RolePrefill), testConfig(RoleDecode)
	cfgP.PrefixCache, cfgD.PrefixCache = true, true
	w := newWorld(t)
	P, D := w.addNode(cfgP, 32, 0), w.addNode(cfgD, 32, 0)
	w.connect()
	send := func(i int) Request {
		q := Request{RID: fmt.Sprintf("q%d", i), Room: room(i), Gen: 1, InputIDs: tokens(13), MaxTokens: 2,
			Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: true}
		qd := q
		qd.Peer = w.peerOf(D)
		w.arrive(P, q)
		w.arrive(D, qd)
		return q
	}
	send(1)
	pump(t, w, 1, P, D)
	if D.m.Stats(w.now).PagesCached != 3 {
		t.Fatalf("decode caches %d pages, want the prompt's 3 full ones", D.m.Stats(w.now).PagesCached)
	}
	// Flip one byte of every cached page.
	for p := range D.data {
		if _, idx := D.m.cache.Indexed(p); idx {
			d := slices.Clone(D.data[p])
			d[0] ^= 1
			D.data[p] = d
		}
	}
	q := send(2)
	pump(t, w, 2, P, D)
	f := D.finals[q.RID]
	if f.Outcome != outcome.FailedTransfer || len(D.emitted[q.RID]) != 0 {
		t.Fatalf("with a corrupt cached page decode ended %s (%s) and emitted %v", f.Outcome, f.Err, D.emitted[q.RID])
	}
	if st := D.m.Stats(w.now); st.PagesUsed != 0 || st.PagesCached != 0 {
		t.Fatalf("decode holds %d pages, caches %d", st.PagesUsed, st.PagesCached)
	}
	q = send(3)
	pump(t, w, 3, P, D)
	if f := D.finals[q.RID]; f.Outcome != outcome.OK || len(D.emitted[q.RID]) != 2 {
		t.Fatalf("after the corrupt pages were dropped: %s (%s), emitted %v", f.Outcome, f.Err, D.emitted[q.RID])
	}
}

package router

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// policyWorkers returns n checked decode workers of a fleet whose KV
// fingerprint has pageSize tokens a page.
func policyWorkers(t testing.TB, n, pageSize int) []*fleet.Worker {
	t.Helper()
	st, err := registry.NewStatic(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	probe := func(context.Context, registry.Entry) (fleet.Info, error) {
		return fleet.Info{Role: "decode", Model: "m", Fingerprint: kvxfer.Fingerprint{Model: "m", PageSize: pageSize}}, nil
	}
	s, err := fleet.New(fleet.Config{Registry: st, Probe: probe, ModelName: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var snap registry.Snapshot
	for i := range n {
		snap.Entries = append(snap.Entries, registry.Entry{ID: fmt.Sprintf("d%d", i), Role: "decode",
			URL: fmt.Sprintf("http://d%d", i), Source: "test"})
	}
	s.Reconcile(snap)
	s.CheckAll(context.Background())
	ws := s.Workers("decode")
	if len(ws) != n {
		t.Fatalf("%d workers, want %d", len(ws), n)
	}
	for _, w := range ws {
		if w.Info().Fingerprint.PageSize != pageSize {
			t.Fatalf("worker %s not checked: %+v", w.URL(), w.Info())
		}
	}
	return ws
}

// testCacheAware is a cache_aware policy on a clock the test moves.
type testCacheAware struct {
	*cacheAware
	mu  sync.Mutex
	at  time.Time
	cap map[*fleet.Worker]int
}

func newTestCacheAware(cfg CacheAwareConfig) *testCacheAware {
	tp := &testCacheAware{at: time.Unix(1000, 0), cap: map[*fleet.Worker]int{}}
	tp.cacheAware = newCacheAware(policyDeps{seed: maphash.MakeSeed(), cacheAware: cfg,
		now: func() time.Time {
			tp.mu.Lock()
			defer tp.mu.Unlock()
			return tp.at
		},
		capacity: func(w *fleet.Worker) int {
			tp.mu.Lock()
			defer tp.mu.Unlock()
			return tp.cap[w]
		}})
	return tp
}

func (tp *testCacheAware) advance(d time.Duration) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.at = tp.at.Add(d)
}

// place picks a worker for req among ws (with the given load tokens),
// records the choice as the router does and returns the index chosen.
func (tp *testCacheAware) place(req *PickRequest, ws []*fleet.Worker, tokens ...int) int {
	cands := make([]Candidate, len(ws))
	for i, w := range ws {
		cands[i] = Candidate{Worker: w}
		if i < len(tokens) {
			cands[i].Load.Tokens = tokens[i]
		}
	}
	i := tp.Pick(req, cands)
	tp.Chosen(req, ws[i])
	return i
}

// prompt returns prefix followed by n random token ids from rng.
func prompt(rng *rand.Rand, prefix []int32, n int) []int32 {
	out := append([]int32(nil), prefix...)
	for range n {
		out = append(out, rng.Int32N(32000))
	}
	return out
}

// TestCacheAwarePrefersPrefixHolder: once a prefix went to a worker, the
// requests that share it go there too while the loads are close, and a
// new prefix goes to the less loaded worker.
func TestCacheAwarePrefersPrefixHolder(t *testing.T) {
	ws := policyWorkers(t, 3, 16)
	p := newTestCacheAware(CacheAwareConfig{})
	rng := rand.New(rand.NewPCG(1, 2))
	sys := prompt(rng, nil, 2048)
	first := p.place(&PickRequest{InputIDs: prompt(rng, sys, 128)}, ws)
	if got := p.pages(ws[first]); got != (2048+128)/16 {
		t.Fatalf("recorded %d pages, want %d", got, (2048+128)/16)
	}
	for i := range 20 {
		// The holder has a little more load (up to a full prompt's worth
		// less than the prefix saves).
		tokens := []int{0, 0, 0}
		tokens[first] = 1500
		if got := p.place(&PickRequest{InputIDs: prompt(rng, sys, 128)}, ws, tokens...); got != first {
			t.Fatalf("request %d went to worker %d, want the prefix's holder %d", i, got, first)
		}
	}
	// A request that shares only half the prefix still prefers the holder.
	half := prompt(rng, sys[:1024], 1000)
	if got := p.place(&PickRequest{InputIDs: half}, ws); got != first {
		t.Fatalf("half-prefix request went to %d, want %d", got, first)
	}
	// Other prefixes: with equal loads, the first worker of the rotation
	// that does not hold them; with one worker idle, that one.
	other := prompt(rng, nil, 2048)
	tokens := []int{5000, 5000, 5000}
	tokens[(first+1)%3] = 0
	if got := p.place(&PickRequest{InputIDs: other}, ws, tokens...); got != (first+1)%3 {
		t.Fatalf("new prefix went to %d, want the idle worker %d", got, (first+1)%3)
	}
}

// TestCacheAwareFallsBackToLoad: when the holder's load exceeds the
// others' by more than the prefix is worth (w × its tokens), the request
// goes to the least loaded worker; a higher weight moves that point.
func TestCacheAwareFallsBackToLoad(t *testing.T) {
	ws := policyWorkers(t, 2, 16)
	rng := rand.New(rand.NewPCG(3, 4))
	sys := prompt(rng, nil, 2048)
	for _, tc := range []struct {
		weight      float64
		holderLoad  int
		wantHolder  bool
		description string
	}{
		{1, 2000, true, "2,000 tokens of load < 2,048 cached tokens"},
		{1, 2100, false, "2,100 tokens of load > 2,048 cached tokens"},
		{1, 100_000, false, "large imbalance"},
		{4, 8000, true, "w=4: 8,000 tokens of load < 4 × 2,048"},
		{4, 8300, false, "w=4: 8,300 tokens of load > 4 × 2,048"},
	} {
		p := newTestCacheAware(CacheAwareConfig{Weight: tc.weight})
		holder := p.place(&PickRequest{InputIDs: prompt(rng, sys, 64)}, ws)
		tokens := []int{0, 0}
		tokens[holder] = tc.holderLoad
		got := p.place(&PickRequest{InputIDs: prompt(rng, sys, 64)}, ws, tokens...)
		if (got == holder) != tc.wantHolder {
			t.Errorf("%s: went to %d, holder %d, want holder %v", tc.description, got, holder, tc.wantHolder)
		}
	}
}

// TestCacheAwareEvicts: a worker's record holds at most the smaller of
// MaxPages and the worker's KV pool, drops the least recently routed
// prefix first and its deepest pages before its first, and forgets pages
// older than the TTL.
func TestCacheAwareEvicts(t *testing.T) {
	ws := policyWorkers(t, 2, 16)
	rng := rand.New(rand.NewPCG(5, 6))
	p := newTestCacheAware(CacheAwareConfig{MaxPages: 300, TTL: time.Minute})
	w := ws[0]
	a, b := prompt(rng, nil, 160*16), prompt(rng, nil, 160*16)
	p.Chosen(&PickRequest{InputIDs: a}, w)
	p.advance(time.Second)
	p.Chosen(&PickRequest{InputIDs: b}, w)
	if got := p.pages(w); got != 300 {
		t.Fatalf("%d pages recorded, want the bound 300", got)
	}
	now, ttl := p.now().UnixNano(), int64(time.Minute)
	if got := p.matched(&PickRequest{InputIDs: b}, w, now, ttl); got != len(b)-1 {
		t.Errorf("the recent prompt matches %d tokens, want %d", got, len(b)-1)
	}
	// a lost its deepest 20 pages, its first 140 remain.
	if got := p.matched(&PickRequest{InputIDs: a}, w, now, ttl); got != 140*16 {
		t.Errorf("the older prompt matches %d tokens, want %d", got, 140*16)
	}
	// The worker's KV pool (100 pages) bounds the record below MaxPages.
	p.mu.Lock()
	p.cap[w] = 100
	p.mu.Unlock()
	p.Chosen(&PickRequest{InputIDs: b[:16*10]}, w)
	if got := p.pages(w); got != 100 {
		t.Fatalf("%d pages recorded, want the KV pool's 100", got)
	}
	// Past the TTL nothing counts, and the next record drops the old pages.
	p.advance(2 * time.Minute)
	now = p.now().UnixNano()
	if got := p.matched(&PickRequest{InputIDs: b}, w, now, ttl); got != 0 {
		t.Errorf("after the TTL the prompt matches %d tokens, want 0", got)
	}
	c := prompt(rng, nil, 5*16)
	p.Chosen(&PickRequest{InputIDs: c}, w)
	if got := p.pages(w); got != 5 {
		t.Errorf("%d pages recorded after the TTL, want only the new 5", got)
	}
}

// TestCacheAwareForgets: a worker that left keeps no record, and a
// request is no longer drawn to it.
func TestCacheAwareForgets(t *testing.T) {
	ws := policyWorkers(t, 2, 16)
	rng := rand.New(rand.NewPCG(7, 8))
	p := newTestCacheAware(CacheAwareConfig{})
	req := &PickRequest{InputIDs: prompt(rng, nil, 1024)}
	p.Chosen(req, ws[1])
	if p.pages(ws[1]) != 64 {
		t.Fatalf("%d pages, want 64", p.pages(ws[1]))
	}
	p.Forget(ws[1])
	if p.pages(ws[1]) != 0 || len(p.records) != 0 {
		t.Fatalf("after Forget: %d pages, %d records", p.pages(ws[1]), len(p.records))
	}
	now := p.now().UnixNano()
	if got := p.matched(&PickRequest{InputIDs: req.InputIDs}, ws[1], now, int64(time.Hour)); got != 0 {
		t.Fatalf("matched %d tokens on a forgotten worker", got)
	}
}

// TestCacheAwarePageHashes: the keys chain (a page's key depends on every
// token before it), cover full pages only, and depend on the page size.
func TestCacheAwarePageHashes(t *testing.T) {
	seed := maphash.MakeSeed()
	ids := make([]int32, 70)
	for i := range ids {
		ids[i] = int32(i)
	}
	a := (&PickRequest{InputIDs: ids}).pageHashes(seed, 16)
	if len(a) != 4 {
		t.Fatalf("%d keys for 70 tokens of 16-token pages, want 4", len(a))
	}
	changed := append([]int32(nil), ids...)
	changed[3] = 9999
	b := (&PickRequest{InputIDs: changed}).pageHashes(seed, 16)
	for i := range a {
		if a[i] == b[i] {
			t.Errorf("page %d's key ignores a change in page 0", i)
		}
	}
	tail := append([]int32(nil), ids...)
	tail[40] = 9999
	c := (&PickRequest{InputIDs: tail}).pageHashes(seed, 16)
	if a[0] != c[0] || a[1] != c[1] || a[2] == c[2] || a[3] == c[3] {
		t.Errorf("a change in page 2 must change keys 2 and 3 only: %x vs %x", a, c)
	}
	d := (&PickRequest{InputIDs: ids}).pageHashes(seed, 32)
	if len(d) != 2 || d[0] == a[0] || d[0] == a[1] {
		t.Errorf("32-token pages: keys %x", d)
	}
	short := (&PickRequest{InputIDs: ids[:15]}).pageHashes(seed, 16)
	if len(short) != 0 {
		t.Errorf("a prompt shorter than a page has %d keys", len(short))
	}
}

// TestCacheAwareConcurrent: picks, records and forgets from many
// goroutines (run with -race) keep every record within its bound.
func TestCacheAwareConcurrent(t *testing.T) {
	ws := policyWorkers(t, 4, 16)
	p := newTestCacheAware(CacheAwareConfig{MaxPages: 500})
	var prefixes [][]int32
	rng := rand.New(rand.NewPCG(9, 10))
	for range 8 {
		prefixes = append(prefixes, prompt(rng, nil, 512))
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for i := range 300 {
				req := &PickRequest{InputIDs: prompt(rng, prefixes[rng.IntN(len(prefixes))], rng.IntN(200))}
				p.place(req, ws, rng.IntN(3000), rng.IntN(3000), rng.IntN(3000), rng.IntN(3000))
				if g == 0 && i%50 == 0 {
					p.Forget(ws[rng.IntN(len(ws))])
				}
				if g == 1 && i%40 == 0 {
					p.advance(time.Second)
				}
			}
		})
	}
	wg.Wait()
	for _, w := range ws {
		if n := p.pages(w); n > 500 {
			t.Errorf("%s: %d pages, over the bound 500", w.URL(), n)
		}
	}
}

// BenchmarkCacheAwarePick is one pick among 4 decode workers of a
// 2,048-token prompt whose 2,048 tokens one of them holds (128 pages of
// 16 tokens) and two others the first half: for a new request (hashing
// its 128 pages included) and with its keys already computed.
func BenchmarkCacheAwarePick(b *testing.B) {
	ws := policyWorkers(b, 4, 16)
	p := newTestCacheAware(CacheAwareConfig{})
	rng := rand.New(rand.NewPCG(1, 1))
	ids := prompt(rng, nil, 2048)
	p.Chosen(&PickRequest{InputIDs: ids}, ws[2])
	for _, w := range ws[:2] {
		p.Chosen(&PickRequest{InputIDs: prompt(rng, ids[:1024], 1024)}, w)
	}
	cands := make([]Candidate, len(ws))
	for i, w := range ws {
		cands[i] = Candidate{Worker: w, Load: Load{Tokens: 100 * i}}
	}
	b.Run("new_request", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := PickRequest{InputIDs: ids}
			if got := p.Pick(&req, cands); got != 2 {
				b.Fatalf("picked %d, want the holder 2", got)
			}
		}
	})
	// The keys already computed (the second leg of a pair): the matches
	// alone.
	b.Run("keys_computed", func(b *testing.B) {
		req := PickRequest{InputIDs: ids}
		b.ReportAllocs()
		for b.Loop() {
			if got := p.Pick(&req, cands); got != 2 {
				b.Fatalf("picked %d, want the holder 2", got)
			}
		}
	})
}

// TestCacheAwareThroughRouter: with cache_aware on both roles and one
// request at a time, every request of a prefix group goes to the prefill
// and the decode worker its group's first request went to, the groups
// spread over both workers of each role, the metrics count the prompt
// and matched tokens, and a worker that leaves the fleet is forgotten.
func TestCacheAwareThroughRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 2, 2, 0, func(c *Config) {
			withPolicy(PolicyCacheAware)(c)
			c.ContextLen = 4096
		})
		defer tr.r.Close()
		rng := rand.New(rand.NewPCG(12, 13))
		var prefixes [][]int32
		for range 4 {
			prefixes = append(prefixes, prompt(rng, nil, 256))
		}
		group := map[string]int{}
		for i := range 40 {
			rid := fmt.Sprintf("r%d", i)
			g := i % 4
			group[rid] = g
			st, err := tr.r.Generate(t.Context(), &openai.GenerateRequest{RID: rid, InputIDs: prompt(rng, prefixes[g], 40),
				MaxTokens: 3, Sampling: model.SamplingParams{TopP: 1}})
			if err != nil {
				t.Fatal(err)
			}
			for {
				c, err := st.Recv()
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if c.FinishReason != "" {
					break
				}
			}
			st.Close()
			synctest.Wait() // the legs end: the next pick sees idle workers
		}
		for _, role := range [][]*fakeWorker{tr.prefill, tr.decode} {
			holder := map[int]string{}
			for _, w := range role {
				legs, _, _ := w.received()
				if len(legs) == 0 {
					t.Errorf("%s got no leg", w.host)
				}
				for _, l := range legs {
					g := group[strings.Split(l.RID, "-g")[0]]
					if h, ok := holder[g]; ok && h != w.host {
						t.Errorf("group %d on %s and %s", g, h, w.host)
					}
					holder[g] = w.host
				}
			}
		}
		// Each role's legs: 40 prompts of 296 tokens; the 36 after their
		// group's first match its 256-token prefix (16 pages) and no
		// more (the suffixes are random).
		for _, role := range []string{"prefill", "decode"} {
			q := counter(t, tr.reg, "pdserve_router_prefix_queried_tokens_total", "role", role)
			m := counter(t, tr.reg, "pdserve_router_prefix_matched_tokens_total", "role", role)
			if q != 40*296 || m != 36*256 {
				t.Errorf("%s: queried %v, matched %v tokens; want %d and %d", role, q, m, 40*296, 36*256)
			}
		}
		pol := tr.r.policyFor(workerapi.RolePrefill).(*cacheAware)
		w := tr.r.Fleet().Workers("prefill")[0]
		if pol.pages(w) == 0 {
			t.Fatalf("no pages recorded for %s", w.URL())
		}
		if !tr.r.Fleet().Registry().(*registry.Static).Remove(w.ID()) {
			t.Fatalf("%s not removed", w.ID())
		}
		for range 50 {
			if pol.pages(w) == 0 {
				break
			}
			advance(time.Second)
		}
		if n := pol.pages(w); n != 0 {
			t.Errorf("%d pages still recorded for the removed %s", n, w.URL())
		}
	})
}

package e2e

import (
	"context"
	"fmt"
	"hash"
	"hash/crc32"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// startColocated starts one colocated worker with the prefix cache on or
// off and a pool of memory bytes.
func startColocated(t *testing.T, cache bool, memory int64) *cluster.WorkerServer {
	t.Helper()
	m, err := simFactory(sim.Config{})()
	if err != nil {
		t.Fatal(err)
	}
	mc := testMachine()
	mc.Role = lifecycle.RoleColocated
	mc.PrefixCache = cache
	s, err := cluster.StartWorker(cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: memory})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

func cachedTokens(c completion) int {
	if d := c.Usage.PromptTokensDetails; d != nil {
		return d.CachedTokens
	}
	return -1
}

// TestPrefixCacheSameAnswer is invariant 5 with the prefix cache: multi-turn
// conversations that share system prompts, each turn resending the
// history, greedy and seeded sampling, served at once by a PD pair and a
// colocated worker that both have the cache, in pools small enough that
// cached pages are evicted and requests preempted, give exactly the tokens
// a colocated worker without a cache gives. usage reports the prompt tokens
// the serving side did not compute: none without the cache, a whole number
// of pages below the prompt with it, and some on every later turn.
func TestPrefixCacheSameAnswer(t *testing.T) {
	t.Parallel()
	pageBytes := int64(testGeometry.BytesPerToken() * 16)
	mc := testMachine()
	mc.PrefixCache = true
	pd := startPD(t, pdOptions{machine: &mc, memory: 30 * pageBytes, router: noAdmission()})
	co := startColocated(t, true, 30*pageBytes)
	plain := startColocated(t, false, 64<<20)
	rng := rand.New(rand.NewPCG(13, 1))
	const letters = "abcdefghijklmnopqrstuvwxyz ,."
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(letters[rng.IntN(len(letters))])
		}
		return b.String()
	}
	systems := []string{text(150), text(170)}
	const convs, turns = 8, 3
	type conv struct {
		system string
		users  []string
		params []map[string]any
	}
	cs := make([]conv, convs)
	for i := range cs {
		cs[i].system = systems[i%len(systems)]
		for k := range turns {
			cs[i].users = append(cs[i].users, text(10+rng.IntN(20)))
			p := map[string]any{"max_tokens": 40 + rng.IntN(20), "ignore_eos": true, "return_token_ids": true}
			if (i+k)%2 == 1 {
				p["temperature"], p["seed"] = 0.8, rng.Uint64()>>1
			} else {
				p["temperature"] = 0
			}
			cs[i].params = append(cs[i].params, p)
		}
	}
	var mu sync.Mutex
	var errs []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			history := c.system
			for k := range turns {
				prompt := history + c.users[k]
				req := map[string]any{"prompt": prompt}
				for key, v := range c.params[k] {
					req[key] = v
				}
				var got [3]completion
				for j, url := range []string{plain.URL, pd.URL(), co.URL} {
					status, body := postJSON(t, url+"/v1/completions", req)
					if status != http.StatusOK {
						fail("conversation %d turn %d on %s: %d %s", i, k, url, status, body)
						return
					}
					got[j] = decodeCompletion(t, body)
				}
				want := got[0].Choices[0].TokenIDs
				for j, name := range []string{"PD", "colocated"} {
					if g := got[j+1].Choices[0].TokenIDs; !slices.Equal(g, want) {
						fail("conversation %d turn %d: %s with the cache %v, without %v", i, k, name, g, want)
					}
				}
				if n := cachedTokens(got[0]); n != 0 {
					fail("conversation %d turn %d: %d cached tokens without a cache", i, k, n)
				}
				for j, name := range []string{"PD", "colocated"} {
					n := cachedTokens(got[j+1])
					if n < 0 || n%16 != 0 || n >= len(prompt) {
						fail("conversation %d turn %d: %s reports %d cached tokens of %d", i, k, name, n, len(prompt))
					}
				}
				history = prompt + got[0].Choices[0].Text
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n"))
	}
	for _, w := range []struct {
		name string
		g    gatherer
	}{{"prefill", workerGatherer{pd.Prefill[0]}}, {"decode", workerGatherer{pd.Decode[0]}}, {"colocated", workerGatherer{co}}} {
		hits := counterValue(t, w.g, "pdserve_prefix_cache_hits_total", "", "")
		queries := counterValue(t, w.g, "pdserve_prefix_cache_queries_total", "", "")
		evictions := counterValue(t, w.g, "pdserve_prefix_cache_evictions_total", "", "")
		t.Logf("%s: %v of %v tokens hit, %v pages evicted", w.name, hits, queries, evictions)
		if hits == 0 || queries < hits {
			t.Errorf("%s: prefix cache hits %v of %v queried tokens", w.name, hits, queries)
		}
		if w.name != "prefill" && evictions == 0 {
			t.Errorf("%s evicted nothing: the pool was not small enough to test eviction", w.name)
		}
	}
	pre := counterValue(t, workerGatherer{pd.Decode[0]}, "pdserve_preemptions_total", "", "") +
		counterValue(t, workerGatherer{co}, "pdserve_preemptions_total", "", "")
	if pre == 0 {
		t.Errorf("no request was preempted: the pools were not small enough to test preemption with the cache")
	}
	if n := counterValue(t, workerGatherer{plain}, "pdserve_prefix_cache_hits_total", "", ""); n != 0 {
		t.Errorf("a worker without the cache counted %v hits", n)
	}
}

// TestCachedTokensRepeatedPrompt: the second time a prompt comes, PD and
// colocated both report the prompt's full pages but the one holding its
// last token as cached (the last token is always computed), and decode
// received none of those pages again.
func TestCachedTokensRepeatedPrompt(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	mc.PrefixCache = true
	pd := startPD(t, pdOptions{machine: &mc})
	co := startColocated(t, true, 64<<20)
	prompt := strings.Repeat("the quick brown fox. ", 10) // 210 tokens: 13 full pages and 2 tokens
	req := map[string]any{"prompt": prompt, "max_tokens": 5, "ignore_eos": true}
	for _, url := range []string{pd.URL(), co.URL} {
		var first []int32
		for round := range 2 {
			status, body := postJSON(t, url+"/v1/completions", req)
			if status != http.StatusOK {
				t.Fatalf("%s round %d: %d %s", url, round, status, body)
			}
			c := decodeCompletion(t, body)
			want := 0
			if round == 1 {
				want = 13 * 16
			}
			if n := cachedTokens(c); n != want {
				t.Fatalf("%s round %d: cached_tokens %d, want %d", url, round, n, want)
			}
			if round == 0 {
				first = c.Choices[0].TokenIDs
			} else if !slices.Equal(first, c.Choices[0].TokenIDs) {
				t.Fatalf("%s: the repeated prompt decoded %v, first %v", url, c.Choices[0].TokenIDs, first)
			}
		}
	}
	// Decode's second admission found all 13 full prompt pages.
	if n := counterValue(t, workerGatherer{pd.Decode[0]}, "pdserve_prefix_cache_hits_total", "", ""); n != 13*16 {
		t.Fatalf("decode hit %v tokens, want %d", n, 13*16)
	}
}

// poisonFirst corrupts the KV of the first room a prefill worker sends and
// gives its KV_DONE the checksum of the corrupted bytes, so decode accepts
// it: decode then holds, and caches, pages whose KV is not what prefill
// computes (a stand-in for a decode-side page gone bad after it was
// verified).
type poisonFirst struct {
	kvxfer.Backend
	mu   sync.Mutex
	room kvxfer.RoomGen
	crc  hash.Hash32
	done bool
}

func (p *poisonFirst) Send(peer kvxfer.PeerID, m kvxfer.Message) error {
	p.mu.Lock()
	switch x := m.(type) {
	case kvxfer.KVChunk:
		if !p.done && (p.crc == nil || x.RoomGen == p.room) {
			if p.crc == nil {
				p.room, p.crc = x.RoomGen, crc32.New(crc32.MakeTable(crc32.Castagnoli))
			}
			data := slices.Clone(x.Data)
			for i := 0; i < len(data); i += 97 {
				data[i] ^= 0x20
			}
			p.crc.Write(data)
			x.Data = data
			m = x
		}
	case kvxfer.KVDone:
		if !p.done && p.crc != nil && x.RoomGen == p.room {
			x.Checksum, p.done = p.crc.Sum32(), true
			m = x
		}
	}
	p.mu.Unlock()
	return p.Backend.Send(peer, m)
}

// TestCorruptCachedPageCaughtE2E: a decode-side cached page whose bytes are
// not prefill's KV (here: the first request's KV, poisoned on the way with
// a checksum to match, so decode verified and cached it) is caught when the
// next request with that prompt uses it: prefill sends only the page decode
// lacks, but KV_DONE's checksum covers every prompt page as decode will use
// them, so the transfer fails (failed_transfer) before anything is decoded
// from it; decode drops the pages from its cache, and the router's retry
// receives every page and answers what colocated serving answers.
func TestCorruptCachedPageCaughtE2E(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{wrap: func(role lifecycle.Role, _ int, b kvxfer.Backend) kvxfer.Backend {
		if role == lifecycle.RolePrefill {
			return &poisonFirst{Backend: b}
		}
		return b
	}})
	co := startColocated(t, false, 64<<20)
	req := map[string]any{"prompt": strings.Repeat("poison the cache ", 12), "max_tokens": 6, "ignore_eos": true,
		"seed": 3, "temperature": 0.7, "return_token_ids": true} // 204 tokens: 12 full pages
	if status, body := postJSON(t, c.URL()+"/v1/completions", req); status != http.StatusOK {
		t.Fatalf("first request: %d %s", status, body)
	}
	if got := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "failed_transfer"); got != 0 {
		t.Fatalf("the poisoned transfer failed (%v): the test did not get a bad page into decode's cache", got)
	}
	status, body := postJSON(t, c.URL()+"/v1/completions", req)
	_, want := postJSON(t, co.URL+"/v1/completions", req)
	if status != http.StatusOK || !slices.Equal(decodeCompletion(t, body).Choices[0].TokenIDs, decodeCompletion(t, want).Choices[0].TokenIDs) {
		t.Fatalf("second request: %d %s, colocated %s", status, body, want)
	}
	waitFor(t, 2*time.Second, "the attempt on the bad cached pages counted", func() (bool, string) {
		got := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "failed_transfer")
		return got == 1, fmt.Sprintf("decode counted %v failed transfers, want 1", got)
	})
	if got := counterValue(t, routerAsWorker(c), "pdserve_router_retries_total", "", ""); got != 1 {
		t.Fatalf("router retries %v, want 1", got)
	}
	if hits := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_prefix_cache_hits_total", "", ""); hits != 12*16 {
		t.Fatalf("decode hit %v tokens, want the 12 bad pages once (the retry finds none)", hits)
	}
}

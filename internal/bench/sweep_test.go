package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
)

// sweepPrompts runs cfg against a fresh fake server (with its fake prefix
// cache, or srv when not nil) and returns the prompts each rate sent,
// sorted, and the report.
func sweepPrompts(t *testing.T, cfg Config) ([][]string, *Report, string) {
	t.Helper()
	var mu sync.Mutex
	var sent []string
	srv := fakeServerWith(t, fakeOptions{onRequest: func(fr *fakeRequest) {
		mu.Lock()
		sent = append(sent, fr.full)
		mu.Unlock()
	}})
	cfg.BaseURL = srv.URL
	var out bytes.Buffer
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	per := cfg.NumPrompts * max(cfg.MultiTurn, 1)
	if len(sent) != per*len(cfg.Rates) {
		t.Fatalf("%d requests, want %d", len(sent), per*len(cfg.Rates))
	}
	var rates [][]string
	for i := range cfg.Rates {
		// The rates run one after the other: rate i's requests are the
		// i-th block of per requests.
		ps := slices.Clone(sent[i*per : (i+1)*per])
		slices.Sort(ps)
		rates = append(rates, ps)
	}
	return rates, rep, out.String()
}

// TestSweepDrawsFreshPrompts: each rate of a sweep sends prompts of its
// own, derived from the seed (a second run with the same seed sends the
// same prompts rate by rate); ReusePrompts sends every rate the first
// rate's prompts, and the later rates then find them cached.
func TestSweepDrawsFreshPrompts(t *testing.T) {
	cfg := testConfig("")
	cfg.Model, cfg.NumPrompts, cfg.Rates, cfg.Seed = "m", 8, []Rate{InfRate(), 5000, InfRate()}, 11
	cfg.RandomInputLen = 64

	fresh, rep, _ := sweepPrompts(t, cfg)
	for i := 1; i < len(fresh); i++ {
		for _, p := range fresh[i] {
			if slices.Contains(fresh[0], p) {
				t.Fatalf("rate %d resends a prompt of rate 0: %q", i, p)
			}
		}
		if c := rep.Runs[i].Summary.Cache; c == nil || c.HitRate > 0.1 {
			t.Errorf("rate %d: cache %+v, want fresh prompts to find (almost) nothing cached", i, c)
		}
	}

	again, _, _ := sweepPrompts(t, cfg)
	if !slices.EqualFunc(fresh, again, slices.Equal) {
		t.Errorf("the same seed sent other prompts:\n%q\n%q", fresh, again)
	}
	other := cfg
	other.Seed = 12
	diff, _, _ := sweepPrompts(t, other)
	if slices.Equal(diff[0], fresh[0]) || slices.Equal(diff[1], fresh[1]) {
		t.Error("another seed sent the same prompts")
	}

	reuse := cfg
	reuse.ReusePrompts = true
	same, rep, out := sweepPrompts(t, reuse)
	if !slices.Equal(same[0], fresh[0]) {
		t.Error("the first rate's prompts depend on ReusePrompts")
	}
	for i := 1; i < len(same); i++ {
		if !slices.Equal(same[i], same[0]) {
			t.Errorf("ReusePrompts: rate %d sent other prompts than rate 0", i)
		}
		s := rep.Runs[i].Summary
		if s.Cache == nil || s.Cache.HitRate < 0.5 || s.CacheWarning != "" {
			t.Errorf("ReusePrompts: rate %d cache %+v, warning %q; want a warm cache, on purpose (no warning)", i, s.Cache, s.CacheWarning)
		}
	}
	if !hasRow(out, "Seed", "11 (prompts reused across rates)") {
		t.Errorf("the summary does not say the prompts are reused:\n%s", out)
	}
}

// TestSweepSharedPrefixOracle: without ReusePrompts every rate of a
// shared-prefix sweep starts from prefixes not sent before, so each gets
// the oracle hit rate; with it only the first does.
func TestSweepSharedPrefixOracle(t *testing.T) {
	cfg := testConfig("")
	cfg.Model, cfg.NumPrompts, cfg.Rates, cfg.Seed = "m", 12, []Rate{InfRate(), InfRate()}, 3
	cfg.Dataset, cfg.NumPrefixes, cfg.SharedPrefixLen, cfg.SuffixLen = DatasetSharedPrefix, 3, 64, 8
	fresh, rep, _ := sweepPrompts(t, cfg)
	if slices.Equal(fresh[0], fresh[1]) {
		t.Error("the two rates sent the same shared-prefix prompts")
	}
	for i, run := range rep.Runs {
		if c := run.Summary.Cache; c == nil || c.OracleHitRate == nil || run.Summary.CacheWarning != "" {
			t.Errorf("rate %d: cache %+v, warning %q; want an oracle and no warning (shared prefixes)", i, c, run.Summary.CacheWarning)
		}
	}
	cfg.ReusePrompts = true
	_, rep, _ = sweepPrompts(t, cfg)
	if c := rep.Runs[1].Summary.Cache; c == nil || c.OracleHitRate != nil {
		t.Errorf("ReusePrompts: the second rate's cache %+v has an oracle (its caches are warm)", c)
	}
}

// TestCacheWarning: a server that reports most prompt tokens cached on a
// random dataset (here: the same seed run twice against one server's
// prefix cache) gets a warning in the summary, the sweep table and the
// report; the first, cold run and a shared-prefix dataset get none.
func TestCacheWarning(t *testing.T) {
	srv := fakeServer(t)
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.Rates, cfg.Seed = "m", 8, []Rate{InfRate(), InfRate()}, 21
	cfg.RandomInputLen = 64
	run := func(cfg Config) (*Report, string) {
		t.Helper()
		var out bytes.Buffer
		rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
		if err != nil {
			t.Fatal(err)
		}
		return rep, out.String()
	}
	rep, out := run(cfg)
	for i, r := range rep.Runs {
		if r.Summary.CacheWarning != "" {
			t.Errorf("cold run, rate %d: warning %q (hit rate %.2f)", i, r.Summary.CacheWarning, r.Summary.Cache.HitRate)
		}
	}
	if strings.Contains(out, "Warning:") || strings.Contains(out, "(!)") {
		t.Errorf("cold run warns:\n%s", out)
	}

	rep, out = run(cfg) // the same prompts again: the fake cache holds them
	for i, r := range rep.Runs {
		s := r.Summary
		if s.Cache == nil || s.Cache.HitRate <= UnexpectedHitRate {
			t.Fatalf("rate %d: cache %+v, want a hit rate above %v", i, s.Cache, UnexpectedHitRate)
		}
		if !strings.Contains(s.CacheWarning, "warm prefix cache") || !strings.Contains(s.CacheWarning, "seed 21") {
			t.Errorf("rate %d: warning %q", i, s.CacheWarning)
		}
	}
	if strings.Count(out, "Warning: the server reports") != 2 || !strings.Contains(out, "(!)") {
		t.Errorf("the summaries and the sweep table do not warn:\n%s", out)
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rep); err != nil || !strings.Contains(js.String(), `"cache_warning": "the server reports`) {
		t.Errorf("the JSON report lacks the warning: %v", err)
	}

	// Shared prefixes are hits by design.
	sp := cfg
	sp.Dataset, sp.NumPrefixes, sp.SharedPrefixLen, sp.SuffixLen = DatasetSharedPrefix, 1, 64, 8
	run(sp)
	rep, _ = run(sp)
	if s := rep.Runs[0].Summary; s.Cache == nil || s.Cache.HitRate <= UnexpectedHitRate || s.CacheWarning != "" {
		t.Errorf("shared-prefix: cache %+v, warning %q; want hits and no warning", s.Cache, s.CacheWarning)
	}
}

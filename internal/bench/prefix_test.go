package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// sharedPrefixConfig is a shared-prefix config against url.
func sharedPrefixConfig(url string, n, groups, prefixLen, suffixLen int) Config {
	cfg := testConfig(url)
	cfg.Dataset, cfg.NumPrompts = DatasetSharedPrefix, n
	cfg.NumPrefixes, cfg.SharedPrefixLen, cfg.SuffixLen, cfg.RandomOutputLen = groups, prefixLen, suffixLen, 8
	return cfg
}

// TestSharedPrefixDataset: every prompt is its group's prefix followed by
// a suffix of its own, lengths exact in bytes (the simulated model's
// tokens), the groups of sizes differing by at most one, the prefixes
// distinct, the order shuffled, and the same seed gives the same prompts.
func TestSharedPrefixDataset(t *testing.T) {
	cfg := sharedPrefixConfig("http://x", 50, 4, 200, 30)
	cfg.Seed = 7
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ps, err := BuildDataset(&cfg, cfg.NumPrompts, streamDataset)
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[int]string{}
	sizes := map[int]int{}
	suffixes := map[string]bool{}
	inOrder := true
	for i, p := range ps {
		if len(p.Text) != 230 || p.InputLen != 230 || p.OutputLen != 8 {
			t.Fatalf("prompt %d: %d bytes, planned %d, output %d; want 230, 230, 8", i, len(p.Text), p.InputLen, p.OutputLen)
		}
		if p.Group < 0 || p.Group >= 4 {
			t.Fatalf("prompt %d in group %d", i, p.Group)
		}
		inOrder = inOrder && p.Group == i%4
		pre, suf := p.Text[:200], p.Text[200:]
		if old, ok := prefixes[p.Group]; ok && old != pre {
			t.Fatalf("prompt %d: group %d has two prefixes", i, p.Group)
		}
		prefixes[p.Group] = pre
		sizes[p.Group]++
		if suffixes[suf] {
			t.Fatalf("prompt %d repeats a suffix %q", i, suf)
		}
		suffixes[suf] = true
		if suf[0] != ' ' {
			t.Errorf("prompt %d: the suffix %q does not start a word", i, suf)
		}
	}
	for g := range 4 {
		if sizes[g] != 12 && sizes[g] != 13 {
			t.Errorf("group %d has %d prompts, want 12 or 13 of 50", g, sizes[g])
		}
		for h := range g {
			if prefixes[g][:16] == prefixes[h][:16] {
				t.Errorf("groups %d and %d share their first page", g, h)
			}
		}
	}
	if inOrder {
		t.Error("the prompts are not shuffled")
	}
	again, _ := BuildDataset(&cfg, cfg.NumPrompts, streamDataset)
	if !reflect.DeepEqual(ps, again) {
		t.Error("the same seed gave other prompts")
	}
	cfg.Seed = 8
	other, _ := BuildDataset(&cfg, cfg.NumPrompts, streamDataset)
	if other[0].Text == ps[0].Text {
		t.Error("another seed gave the same prompts")
	}
	// The other datasets have no groups.
	r := testConfig("http://x")
	rp, _ := BuildDataset(&r, 3, streamDataset)
	if rp[0].Group != -1 {
		t.Errorf("random prompt in group %d, want -1", rp[0].Group)
	}

	for _, tc := range []struct {
		mod  func(c *Config)
		want string
	}{
		{func(c *Config) { c.SharedPrefixLen = 0 }, "shared-prefix lengths"},
		{func(c *Config) { c.SuffixLen = 0 }, "shared-prefix lengths"},
		{func(c *Config) { c.NumPrefixes = 0 }, "number of prefixes"},
		{func(c *Config) { c.MultiTurn = -1 }, "multi-turn"},
		{func(c *Config) { c.MultiTurn = MaxTurns + 1 }, "multi-turn"},
		{func(c *Config) { c.Dataset = "sharegpt" }, "shared-prefix"},
	} {
		c := sharedPrefixConfig("http://x", 50, 4, 200, 30)
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", c, err, tc.want)
		}
	}
}

// TestOracleHitRate: every prompt but its group's first hits its prefix.
func TestOracleHitRate(t *testing.T) {
	ps := []Prompt{{InputLen: 110, Group: 0}, {InputLen: 110, Group: 1}, {InputLen: 110, Group: 0},
		{InputLen: 110, Group: 0}, {InputLen: 110, Group: 1}}
	got, ok := OracleHitRate(ps, 100)
	if want := 300.0 / 550; !ok || math.Abs(got-want) > 1e-12 {
		t.Errorf("oracle %v %v, want %v", got, ok, want)
	}
	if _, ok := OracleHitRate([]Prompt{{InputLen: 5, Group: -1}}, 100); ok {
		t.Error("an oracle for prompts without groups")
	}
	// 16 groups of 2,048 tokens + 128, 1,000 prompts.
	cfg := sharedPrefixConfig("http://x", 1000, 16, 2048, 128)
	big, _ := BuildDataset(&cfg, 1000, streamDataset)
	got, _ = OracleHitRate(big, 2048)
	if want := float64(1000-16) * 2048 / (1000 * 2176); math.Abs(got-want) > 1e-12 {
		t.Errorf("oracle %v, want %v", got, want)
	}
}

// TestCacheReport: cached tokens come from usage.prompt_tokens_details
// and are summed, rated and printed next to the goodput, with the oracle
// for the shared-prefix dataset; one server (the fake's prefix cache) is a
// perfect placement, so it reaches the oracle but for page rounding. A
// server that does not send the field gets "not reported".
func TestCacheReport(t *testing.T) {
	srv := fakeServer(t)
	cfg := sharedPrefixConfig(srv.URL, 40, 4, 160, 20)
	cfg.Warmup, cfg.MaxConcurrency = 0, 1 // in order: each group's first request misses
	var out bytes.Buffer
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Runs[0].Summary
	c := s.Cache
	if c == nil || c.Reported != 40 || c.PromptTokens != 40*180 {
		t.Fatalf("cache stats %+v, want 40 requests of 180 prompt tokens", c)
	}
	// The fake caches full 16-byte pages: 160 of each prefix, for the 36
	// requests after their group's first; a suffix never matches past its
	// first bytes (it starts with a space, then random words).
	sum := 0
	for _, r := range rep.Runs[0].Records {
		if !r.CachedReported || r.CachedTokens%16 != 0 || r.CachedTokens > 176 {
			t.Fatalf("record %+v", r)
		}
		sum += r.CachedTokens
	}
	if sum != c.CachedTokens || c.CachedTokens < 36*160 {
		t.Fatalf("cached tokens %d (records %d), want at least %d", c.CachedTokens, sum, 36*160)
	}
	if !approx(c.HitRate, float64(c.CachedTokens)/float64(40*180)) {
		t.Errorf("hit rate %v", c.HitRate)
	}
	oracle := 36.0 * 160 / (40 * 180)
	if c.OracleHitRate == nil || !approx(*c.OracleHitRate, oracle) || c.OfOracle == nil || !approx(*c.OfOracle, c.HitRate/oracle) {
		t.Fatalf("oracle %v of oracle %v, want %v", c.OracleHitRate, c.OfOracle, oracle)
	}
	text := out.String()
	for _, row := range [][2]string{
		{"Cached prompt tokens", fmt.Sprint(c.CachedTokens)},
		{"Prefix cache hit rate (%)", fmt.Sprintf("%.2f", 100*c.HitRate)},
		{"Oracle hit rate (%)", fmt.Sprintf("%.2f", 100*oracle)},
		{"Hit rate of oracle (%)", fmt.Sprintf("%.2f", 100*c.HitRate/oracle)},
	} {
		if !hasRow(text, row[0], row[1]) {
			t.Errorf("no row %q: %q in\n%s", row[0], row[1], text)
		}
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Runs []struct {
			Summary struct {
				Cache struct {
					Cached   int     `json:"cached_tokens"`
					OfOracle float64 `json:"hit_rate_of_oracle"`
				} `json:"prefix_cache"`
			} `json:"summary"`
			Requests []struct {
				Cached *int `json:"cached_tokens"`
			} `json:"requests"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(js.Bytes(), &parsed); err != nil {
		t.Fatal(err)
	}
	if run := parsed.Runs[0]; run.Summary.Cache.Cached != c.CachedTokens || run.Requests[0].Cached == nil ||
		!approx(run.Summary.Cache.OfOracle, *c.OfOracle) {
		t.Errorf("JSON report: %+v", run)
	}

	// Without the field.
	plain := fakeServerWith(t, fakeOptions{noCachedField: true})
	cfg = testConfig(plain.URL)
	out.Reset()
	rep, err = Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Runs[0].Summary.Cache != nil || !hasRow(out.String(), "Prefix cache hit rate (%)", "not reported") {
		t.Errorf("cache %+v without the field:\n%s", rep.Runs[0].Summary.Cache, out.String())
	}
}

// TestMultiTurn: each turn resends its conversation's history, the
// previous prompts and the answers the server actually streamed, plus the
// next prompt; a conversation's turns go in order, one at a time;
// conversations interleave; the summary has TTFT and cached tokens per
// turn, and the history's tokens hit the fake's prefix cache.
func TestMultiTurn(t *testing.T) {
	for _, ep := range []Endpoint{EndpointCompletions, EndpointChat} {
		t.Run(string(ep), func(t *testing.T) {
			var mu sync.Mutex
			var got []*fakeRequest
			srv := fakeServerWith(t, fakeOptions{onRequest: func(fr *fakeRequest) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, fr)
			}})
			const convs, turns = 3, 4
			cfg := testConfig(srv.URL)
			cfg.Endpoint, cfg.NumPrompts, cfg.MultiTurn, cfg.Warmup = ep, convs, turns, 0
			cfg.RandomInputLen, cfg.RandomOutputLen = 40, 5
			var out bytes.Buffer
			rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
			if err != nil {
				t.Fatal(err)
			}
			recs := rep.Runs[0].Records
			if len(recs) != convs*turns || len(got) != convs*turns {
				t.Fatalf("%d records, %d requests, want %d", len(recs), len(got), convs*turns)
			}
			prompts, _ := BuildDataset(&cfg, convs*turns, streamDataset)
			// The answer to a prompt of n bytes (the fake's letters).
			answer := func(n int) string {
				b := make([]byte, 5)
				for i := range b {
					b[i] = byte('a' + (n+i)%26)
				}
				return string(b)
			}
			byFull := map[string]*fakeRequest{}
			for _, fr := range got {
				byFull[fr.full] = fr
			}
			for c := range convs {
				history, prev := "", ""
				var msgs []fakeMessage
				for k := range turns {
					r := recs[c*turns+k]
					p := prompts[c*turns+k]
					if !r.Success || r.Conversation != c || r.Turn != k+1 {
						t.Fatalf("record %d: %+v", c*turns+k, r)
					}
					full := history + p.Text
					fr := byFull[full]
					if fr == nil {
						t.Fatalf("conversation %d turn %d: no request with the history and prompt %q", c, k+1, full)
					}
					msgs = append(msgs, fakeMessage{"user", p.Text})
					if ep == EndpointChat && !reflect.DeepEqual(fr.messages, msgs) {
						t.Fatalf("conversation %d turn %d: messages %v, want %v", c, k+1, fr.messages, msgs)
					}
					if r.InputTokens != len(full) {
						t.Errorf("conversation %d turn %d: %d input tokens, want %d", c, k+1, r.InputTokens, len(full))
					}
					// The previous turn's prompt is cached, in full pages.
					if k > 0 && r.CachedTokens < len(prev)/16*16 {
						t.Errorf("conversation %d turn %d: %d cached tokens, want at least %d", c, k+1, r.CachedTokens, len(prev)/16*16)
					}
					a := answer(len(full))
					msgs = append(msgs, fakeMessage{"assistant", a})
					history, prev = full+a, full
				}
			}
			// A conversation's next turn is sent after its previous ended.
			for i, r := range recs {
				if r.Turn > 1 && r.Sent < recs[i-1].Sent+recs[i-1].E2E {
					t.Errorf("record %d sent at %v, before turn %d ended", i, r.Sent, r.Turn-1)
				}
			}
			s := rep.Runs[0].Summary
			if len(s.Turns) != turns {
				t.Fatalf("turn summaries %+v", s.Turns)
			}
			for k, ts := range s.Turns {
				if ts.Turn != k+1 || ts.Succeeded != convs || ts.TTFT.Count != convs || ts.CacheReported != convs {
					t.Errorf("turn %d: %+v", k+1, ts)
				}
				if k > 0 && (ts.HitRate <= 0 || ts.InputTokens <= s.Turns[k-1].InputTokens) {
					t.Errorf("turn %d: hit rate %v, %d prompt tokens after %d", k+1, ts.HitRate, ts.InputTokens, s.Turns[k-1].InputTokens)
				}
			}
			if s.Turns[0].CachedTokens != 0 {
				t.Errorf("first turns hit %d cached tokens", s.Turns[0].CachedTokens)
			}
			if !strings.Contains(out.String(), "Multi-turn") {
				t.Errorf("no per-turn table:\n%s", out.String())
			}
		})
	}
}

// TestMultiTurnStopsAfterFailure: after a failed turn, the conversation's
// later turns are not sent.
func TestMultiTurnStopsAfterFailure(t *testing.T) {
	srv := fakeServer(t)
	path := writeJSONL(t, []string{"ok one", "http500 two", "ok three"}, 2)
	cfg := testConfig(srv.URL)
	cfg.Dataset, cfg.DatasetPath, cfg.NumPrompts, cfg.MultiTurn, cfg.Warmup = DatasetJSONL, path, 1, 3, 0
	cfg.Endpoint = EndpointChat // the fake acts on the last message's first word
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
	if err != nil {
		t.Fatal(err)
	}
	recs := rep.Runs[0].Records
	if !recs[0].Success || recs[1].Success || recs[2].ErrorType != ErrPreviousTurn {
		t.Fatalf("records %+v", recs)
	}
	if s := rep.Runs[0].Summary; s.Succeeded != 1 || s.Failed != 2 || s.Turns[2].Failed != 1 {
		t.Errorf("summary %+v", s)
	}
}

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
)

// traceLineJSON is one line of a test trace.
func traceLineJSON(ts int64, in, out int, ids ...int64) string {
	b, _ := json.Marshal(map[string]any{"timestamp": ts, "input_length": in, "output_length": out, "hash_ids": ids})
	return string(b)
}

// writeTrace writes lines to a temp file and returns its path.
func writeTrace(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestParseTrace reads good lines (blank lines skipped, unknown fields
// ignored, hash_ids optional) and refuses each kind of bad line with the
// file name and the line number.
func TestParseTrace(t *testing.T) {
	good := strings.Join([]string{
		`{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [7, 8, 9]}`,
		``,
		`{"timestamp": 5, "input_length": 4, "output_length": 1, "hash_ids": [7], "session_id": "x"}`,
		`  {"timestamp": 5, "input_length": 12, "output_length": 2}  `,
	}, "\n")
	recs, err := ParseTrace(strings.NewReader(good), "t.jsonl", 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceRecord{
		{Timestamp: 0, InputLength: 10, OutputLength: 3, HashIDs: []int64{7, 8, 9}, Line: 1},
		{Timestamp: 5, InputLength: 4, OutputLength: 1, HashIDs: []int64{7}, Line: 3},
		{Timestamp: 5, InputLength: 12, OutputLength: 2, Line: 4},
	}
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i := range want {
		if r := recs[i]; r.Timestamp != want[i].Timestamp || r.InputLength != want[i].InputLength ||
			r.OutputLength != want[i].OutputLength || !slices.Equal(r.HashIDs, want[i].HashIDs) ||
			(r.HashIDs == nil) != (want[i].HashIDs == nil) || r.Line != want[i].Line {
			t.Errorf("record %d: %+v, want %+v", i, r, want[i])
		}
	}

	ok := `{"timestamp": 100, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]}`
	cases := []struct {
		name, line, want string
	}{
		{"not JSON", `{"timestamp": 1,`, "t.jsonl:2: malformed request"},
		{"an array", `[1, 2]`, "t.jsonl:2: malformed request"},
		{"two values", ok + ` {}`, "t.jsonl:2: more than one JSON value"},
		{"no timestamp", `{"input_length": 8, "output_length": 2}`, `t.jsonl:2: missing "timestamp"`},
		{"fractional timestamp", `{"timestamp": 100.5, "input_length": 8, "output_length": 2}`, "t.jsonl:2: timestamp 100.5"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 8, "output_length": 2}`, "t.jsonl:2: timestamp -1"},
		{"decreasing timestamp", `{"timestamp": 99, "input_length": 8, "output_length": 2}`, "t.jsonl:2: timestamp 99 ms is before the previous request's 100 ms"},
		{"no input length", `{"timestamp": 100, "output_length": 2}`, `t.jsonl:2: "input_length" must be between 1 and 10000000 tokens, got none`},
		{"zero input length", `{"timestamp": 100, "input_length": 0, "output_length": 2}`, `"input_length" must be between 1`},
		{"string input length", `{"timestamp": 100, "input_length": "8", "output_length": 2}`, "t.jsonl:2: malformed request"},
		{"huge output length", `{"timestamp": 100, "input_length": 8, "output_length": 10000001}`, `t.jsonl:2: "output_length" must be between 1`},
		{"too few hash ids", `{"timestamp": 100, "input_length": 9, "output_length": 2, "hash_ids": [1, 2]}`, `t.jsonl:2: 2 "hash_ids" for 9 input tokens: want 3`},
		{"too many hash ids", `{"timestamp": 100, "input_length": 4, "output_length": 2, "hash_ids": [1, 2]}`, `t.jsonl:2: 2 "hash_ids" for 4 input tokens: want 1`},
		{"line too long", `{"timestamp": 100, "input_length": 8, "output_length": 2, "pad": "` + strings.Repeat("x", MaxTraceLineBytes) + `"}`, "t.jsonl:2: line longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(ok+"\n"+tc.line+"\n"), "t.jsonl", 4)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := ParseTrace(strings.NewReader("\n\n"), "t.jsonl", 4); err == nil || !strings.Contains(err.Error(), "t.jsonl: no requests") {
		t.Errorf("empty trace: %v", err)
	}
	if _, err := ParseTrace(strings.NewReader(ok), "t.jsonl", 0); err == nil || !strings.Contains(err.Error(), "block size") {
		t.Errorf("block size 0: %v", err)
	}
}

// TestTracePrompt: a prompt is exactly input_length bytes; block k is a
// function of hash_ids[k] alone (for a seed and stream), so two records
// sharing ids share those blocks and a record's last block is a prefix of
// the full block of the same id; distinct ids give distinct blocks, and
// another seed or stream other blocks.
func TestTracePrompt(t *testing.T) {
	const bs = 64
	recs := []TraceRecord{
		{InputLength: 3*bs + 10, OutputLength: 5, HashIDs: []int64{1, 2, 3, 4}},
		{InputLength: 2*bs + 1, OutputLength: 7, HashIDs: []int64{1, 2, 5}},
		{InputLength: 3 * bs, OutputLength: 1, HashIDs: []int64{9, 2, 3}},
		{InputLength: bs / 2, OutputLength: 1, HashIDs: []int64{4}},
		{InputLength: 2 * bs, OutputLength: 1, Line: 7},
		{InputLength: 2 * bs, OutputLength: 1, Line: 8},
	}
	text := make([]string, len(recs))
	for i := range recs {
		p := TracePrompt(&recs[i], bs, 11, streamDataset)
		text[i] = p.message()
		if len(text[i]) != recs[i].InputLength || p.InputLen != recs[i].InputLength || p.OutputLen != recs[i].OutputLength || p.Group != -1 {
			t.Fatalf("record %d: %d bytes, planned %d, output %d; want %d bytes and output %d",
				i, len(text[i]), p.InputLen, p.OutputLen, recs[i].InputLength, recs[i].OutputLength)
		}
		if p.FullText() != text[i] || text[i] != p.message() {
			t.Fatalf("record %d: the prompt is not the same each time it is built", i)
		}
	}
	block := func(i, k int) string { return text[i][k*bs : min((k+1)*bs, len(text[i]))] }
	// Shared ids: equal blocks, whatever the position of the rest.
	if block(0, 0) != block(1, 0) || block(0, 1) != block(1, 1) {
		t.Error("records 0 and 1 share ids 1 and 2 but not their blocks")
	}
	if block(2, 1) != block(0, 1) || block(2, 2) != block(0, 2) {
		t.Error("ids 2 and 3 after another first block are not the same blocks")
	}
	// A cut last block is the start of the same id's full block.
	if !strings.HasPrefix(block(3, 0), block(0, 3)) || len(block(0, 3)) != 10 || len(block(3, 0)) != bs/2 {
		t.Error("id 4 cut to 10 bytes is not the start of the same id cut to 32")
	}
	// Distinct ids: distinct blocks (and distinct first 16 bytes, a page
	// of a prefix cache).
	blocks := map[string]string{}
	for i, r := range recs[:3] {
		for k, id := range r.HashIDs {
			b := block(i, k)
			if len(b) < bs {
				continue
			}
			key := fmt.Sprint(id)
			for other, ob := range blocks {
				if other != key && ob[:16] == b[:16] {
					t.Errorf("ids %s and %s start with the same 16 bytes", key, other)
				}
			}
			blocks[key] = b
		}
	}
	// Records without hash ids: blocks of their own.
	if text[4] == text[5] || text[4][:16] == text[5][:16] || text[4][:bs] == text[4][bs:] {
		t.Error("records without hash ids share blocks")
	}
	// Another seed or another stream: other text for the same ids.
	p := TracePrompt(&recs[0], bs, 12, streamDataset)
	if p.message()[:bs] == text[0][:bs] {
		t.Error("another seed gave the same block")
	}
	p = TracePrompt(&recs[0], bs, 11, streamWarmup)
	if p.message()[:bs] == text[0][:bs] {
		t.Error("the warmup stream gave the measured run's block")
	}
}

// TestTraceStats: the trace's figures on a small trace worked out by
// hand.
func TestTraceStats(t *testing.T) {
	const bs = 10
	tr := &Trace{Path: "x", BlockSize: bs, TimeScale: 4, Records: []TraceRecord{
		{Timestamp: 1000, InputLength: 25, OutputLength: 4, HashIDs: []int64{1, 2, 3}}, // 3 new blocks
		{Timestamp: 3000, InputLength: 28, OutputLength: 6, HashIDs: []int64{1, 2, 4}}, // 1, 2 repeated: 20 tokens
		{Timestamp: 5000, InputLength: 15, OutputLength: 2, HashIDs: []int64{5, 2}},    // 2 repeated but not a prefix: none
		{Timestamp: 9000, InputLength: 30, OutputLength: 8, HashIDs: []int64{1, 2, 3}}, // all 3: 30 tokens
		{Timestamp: 9000, InputLength: 12, OutputLength: 0, HashIDs: nil},              // no ids: 2 own blocks
		{Timestamp: 9000, InputLength: 9, OutputLength: 10, HashIDs: []int64{1}},       // 1 repeated, cut: 9 tokens
	}}
	s := tr.Stats()
	in := 25 + 28 + 15 + 30 + 12 + 9
	want := TraceStats{File: "x", Requests: 6, FirstTimestampMS: 1000, Span: 8, ReplaySpan: 2, TimeScale: 4,
		OfferedRate: 5.0 / 2, MeanInput: float64(in) / 6, MeanOutput: 30.0 / 6, BlockSize: bs,
		Blocks: 3 + 3 + 2 + 3 + 2 + 1, RepeatedBlocks: 2 + 3 + 1,
		RepeatedBlockFraction: 6.0 / 14, RepeatedTokenFraction: float64(20+30+9) / float64(in)}
	if s != want {
		t.Errorf("stats\n%+v, want\n%+v", s, want)
	}
	if off := tr.Offsets(); !slices.Equal(off, []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second,
		2 * time.Second, 2 * time.Second}) {
		t.Errorf("offsets at time scale 4: %v", off)
	}
}

// TestSelectTrace keeps the window [start, start+duration) of the trace's
// time from its first request, capped at limit requests.
func TestSelectTrace(t *testing.T) {
	var recs []TraceRecord
	for i := range 10 {
		recs = append(recs, TraceRecord{Timestamp: int64(500 + 1000*i), InputLength: 1, OutputLength: 1, Line: i + 1})
	}
	lines := func(rs []TraceRecord) []int {
		var out []int
		for _, r := range rs {
			out = append(out, r.Line)
		}
		return out
	}
	cases := []struct {
		start, dur time.Duration
		limit      int
		want       []int
	}{
		{0, 0, 0, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{0, 0, 3, []int{1, 2, 3}},
		{2 * time.Second, 3 * time.Second, 0, []int{3, 4, 5}},
		{2500 * time.Millisecond, 0, 2, []int{4, 5}},
		{9 * time.Second, time.Hour, 0, []int{10}},
	}
	for _, tc := range cases {
		got, err := SelectTrace(recs, tc.start, tc.dur, tc.limit)
		if err != nil || !slices.Equal(lines(got), tc.want) {
			t.Errorf("start %v, duration %v, limit %d: %v (%v), want lines %v", tc.start, tc.dur, tc.limit, lines(got), err, tc.want)
		}
	}
	if _, err := SelectTrace(recs, 10*time.Second, 0, 0); err == nil || !strings.Contains(err.Error(), "no request") {
		t.Errorf("a window past the end: %v", err)
	}
}

// traceConfig is a trace replay of path against url.
func traceConfig(url, path string, blockSize int, scale float64) Config {
	cfg := testConfig(url)
	cfg.Dataset, cfg.TracePath, cfg.TraceBlockSize, cfg.TraceTimeScale = DatasetTrace, path, blockSize, scale
	cfg.Rates, cfg.NumPrompts, cfg.Model, cfg.Seed = nil, 0, "m", 3
	return cfg
}

// inOrderClock is a Clock whose k-th Sleep (before the measured request
// k+1 of a trace with increasing timestamps) first waits until the server
// finished the warmup requests and requests 0..k, so the server sees the
// requests one after another, in trace order.
type inOrderClock struct {
	Clock
	warmup   int
	finished chan struct{} // one value per request the server finished
	done     int           // values received
	sleeps   int
}

func (c *inOrderClock) Sleep(ctx context.Context, d time.Duration) error {
	want := c.warmup + c.sleeps + 1
	c.sleeps++
	deadline := time.After(30 * time.Second)
	for c.done < want {
		select {
		case <-c.finished:
			c.done++
		case <-deadline:
			return fmt.Errorf("the server finished %d requests, want %d (sleep %v)", c.done, want, d)
		}
	}
	return c.Clock.Sleep(ctx, d)
}

// TestTraceReplaySchedule replays a trace on a fake clock at time scale 2:
// each request is sent at half its timestamp's offset from the first one,
// with the trace's lengths and the prompt of its hash ids, and the
// summary shows the trace's figures and the fake server's prefix-cache
// hits against the trace's oracle.
func TestTraceReplaySchedule(t *testing.T) {
	const bs = 32 // 2 pages of the fake server
	var mu sync.Mutex
	got := map[int][]string{} // max_tokens -> prompts
	fake := fakeServerWith(t, fakeOptions{onRequest: func(fr *fakeRequest) {
		mu.Lock()
		defer mu.Unlock()
		got[fr.maxTokens] = append(got[fr.maxTokens], fr.prompt)
	}})
	finished := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fake.Config.Handler.ServeHTTP(w, r)
		if r.Method == http.MethodPost {
			finished <- struct{}{}
		}
	}))
	t.Cleanup(srv.Close)
	path := writeTrace(t,
		traceLineJSON(1000, 2*bs+5, 11, 1, 2, 3),
		traceLineJSON(1400, 2*bs+7, 12, 1, 2, 4),
		traceLineJSON(1401, bs+1, 13, 5, 6),
		traceLineJSON(3000, 3*bs, 14, 1, 2, 8),
		traceLineJSON(7001, 2*bs, 15, 5, 7),
	)
	cfg := traceConfig(srv.URL, path, bs, 2)
	cfg.Warmup = 1
	fc := newFakeClock()
	clock := &inOrderClock{Clock: fc, warmup: 1, finished: finished}
	var out bytes.Buffer
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: clock, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	wantOff := []time.Duration{0, 200 * time.Millisecond, 200500 * time.Microsecond, 1000 * time.Millisecond, 3000500 * time.Microsecond}
	recs := rep.Runs[0].Records
	if len(recs) != 5 || len(rep.Runs) != 1 {
		t.Fatalf("%d runs, %d records, want 1 and 5", len(rep.Runs), len(recs))
	}
	for i, r := range recs {
		if !r.Success || r.Arrival != wantOff[i] || r.Sent != wantOff[i] || r.PlannedOutputTokens != 11+i {
			t.Errorf("request %d: arrival %v, sent %v, max_tokens %d, success %v; want %v, %v, %d",
				i, r.Arrival, r.Sent, r.PlannedOutputTokens, r.Success, wantOff[i], wantOff[i], 11+i)
		}
	}
	var slept time.Duration
	for _, d := range fc.slept() {
		slept += d
	}
	if slept != wantOff[4] {
		t.Errorf("slept %v in all, want the last offset %v", slept, wantOff[4])
	}
	// The prompts: the trace's lengths, shared blocks equal. Warmup is
	// one request for the first record with blocks of its own, so
	// max_tokens 11 is seen twice.
	mu.Lock()
	first := got[11]
	p := [5]string{}
	for i := range 5 {
		ps := got[11+i]
		p[i] = ps[len(ps)-1]
	}
	mu.Unlock()
	if len(first) != 2 || first[0][:bs] == first[1][:bs] {
		t.Fatalf("max_tokens 11 was seen %d times, want the warmup and the measured request with other blocks", len(first))
	}
	for i, n := range []int{2*bs + 5, 2*bs + 7, bs + 1, 3 * bs, 2 * bs} {
		if len(p[i]) != n {
			t.Errorf("request %d: %d prompt bytes, want %d", i, len(p[i]), n)
		}
	}
	if p[0][:2*bs] != p[1][:2*bs] || p[0][:2*bs] != p[3][:2*bs] || p[2][:bs] != p[4][:bs] || p[0][:bs] == p[2][:bs] {
		t.Error("the prompts do not share the blocks their hash ids share")
	}
	s := rep.Runs[0].Summary
	ts := s.Trace
	if ts == nil || ts.Requests != 5 || ts.Span != 6.001 || ts.ReplaySpan != 3.0005 || ts.TimeScale != 2 || ts.RepeatedBlocks != 5 {
		t.Fatalf("trace stats %+v", ts)
	}
	// The fake caches whole 16-byte pages of the longest common prefix
	// with any earlier prompt (here the shared blocks exactly, which are
	// whole pages), as the oracle counts: blocks 1, 2 of requests 1 and 3,
	// block 5 of request 4.
	oracle := float64(2*bs+2*bs+bs) / float64(2*bs+5+2*bs+7+bs+1+3*bs+2*bs)
	if s.Cache == nil || s.Cache.OracleHitRate == nil || math.Abs(*s.Cache.OracleHitRate-oracle) > 1e-12 ||
		s.Cache.CachedTokens != 5*bs || s.Cache.OfOracle == nil || math.Abs(*s.Cache.OfOracle-1) > 1e-12 {
		t.Errorf("cache %+v, want %d cached tokens and oracle %.4f", s.Cache, 5*bs, oracle)
	}
	for _, row := range []string{"Trace requests", "Replay span (s)", "Tokens in repeated blocks (%)", "Oracle hit rate (%)"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("the summary lacks %q:\n%s", row, out.String())
		}
	}
	if !hasRow(out.String(), "Request rate (req/s)", "trace, mean 1.33 (time scale 2)") {
		t.Errorf("the summary's rate row:\n%s", out.String())
	}

	// --num-prompts caps the replay; the JSON report carries the trace.
	cfg.NumPrompts = 2
	cfg.BaseURL = fake.URL
	rep, err = Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rep.Runs[0].Records); n != 2 {
		t.Errorf("%d requests with a cap of 2", n)
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"trace": "` + path + `"`, `"trace_time_scale": 2`, `"repeated_token_fraction"`} {
		if !strings.Contains(js.String(), want) {
			t.Errorf("the JSON report lacks %s", want)
		}
	}
}

// TestTraceConfig: what a trace replay needs and refuses.
func TestTraceConfig(t *testing.T) {
	base := traceConfig("http://x", "t.jsonl", 0, 0)
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"no file", func(c *Config) { c.TracePath = "" }, "needs a trace file"},
		{"a rate", func(c *Config) { c.Rates = []Rate{4} }, "does not apply to a trace replay"},
		{"negative scale", func(c *Config) { c.TraceTimeScale = -1 }, "time scale"},
		{"NaN scale", func(c *Config) { c.TraceTimeScale = math.NaN() }, "time scale"},
		{"negative start", func(c *Config) { c.TraceStart = -time.Second }, "start and duration"},
		{"negative block", func(c *Config) { c.TraceBlockSize = -1 }, "block size"},
		{"multi-turn", func(c *Config) { c.MultiTurn = 2 }, "multi-turn"},
		{"negative cap", func(c *Config) { c.NumPrompts = -1 }, "number of prompts"},
		{"a trace file for another dataset", func(c *Config) { c.Dataset, c.Rates = DatasetRandom, []Rate{1} }, "trace file is given"},
	}
	for _, tc := range cases {
		c := base
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A malformed file fails the run, naming the file and line.
	path := writeTrace(t, traceLineJSON(0, 4, 1, 1), `{"timestamp": 1}`)
	c := traceConfig("http://127.0.0.1:1", path, 4, 1)
	_, err := Run(context.Background(), Options{Config: c, Client: testClient(t), Clock: newFakeClock()})
	if err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Errorf("run on a malformed trace: %v", err)
	}
	// A time scale that stretches a minute of trace past a week is refused
	// before anything is sent.
	path = writeTrace(t, traceLineJSON(0, 4, 1, 1), traceLineJSON(60000, 4, 1, 2))
	c = traceConfig("http://127.0.0.1:1", path, 4, 1)
	c.TraceTimeScale = 1e-300
	_, err = Run(context.Background(), Options{Config: c, Client: testClient(t), Clock: newFakeClock()})
	if err == nil || !strings.Contains(err.Error(), "more than the 168h0m0s a replay may take") {
		t.Errorf("run at time scale 1e-300: %v", err)
	}
}

// finishTransport signals on finished when the body of a POST's answer is
// closed: the request is over for the client.
type finishTransport struct {
	http.RoundTripper
	finished chan<- struct{}
}

func (t finishTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(r)
	if err != nil || r.Method != http.MethodPost {
		return resp, err
	}
	resp.Body = &signalBody{ReadCloser: resp.Body, finished: t.finished}
	return resp, nil
}

type signalBody struct {
	io.ReadCloser
	once     sync.Once
	finished chan<- struct{}
}

func (b *signalBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.finished <- struct{}{} })
	return err
}

// repeatedTokens returns, for each record, the prompt tokens in its
// leading blocks whose hash ids an earlier record had (what a prefix cache
// holding everything would find).
func repeatedTokens(recs []TraceRecord, bs int) []int {
	seen := map[int64]bool{}
	out := make([]int, len(recs))
	for i, r := range recs {
		for k, id := range r.HashIDs {
			if !seen[id] {
				break
			}
			out[i] += min(bs, r.InputLength-k*bs)
		}
		for _, id := range r.HashIDs {
			seen[id] = true
		}
	}
	return out
}

// TestTracePlots: a trace replay adds TTFT over time (one point per
// successful request at its arrival, the objective as a line) and the
// fraction within the SLO per window of arrivals.
func TestTracePlots(t *testing.T) {
	s := time.Second
	ok := func(arr, ttft time.Duration) Record {
		return Record{Arrival: arr, Success: true, TTFT: ttft, E2E: ttft}
	}
	recs := []Record{
		ok(0, 100*time.Millisecond), ok(s, 3*s), // window 0 (0-2 s): 1 of 2
		ok(5*s, 100*time.Millisecond), {Arrival: 5 * s, ErrorType: ErrHTTP}, ok(5*s, 3*s), // window 2: 1 of 3
		ok(7*s, 100*time.Millisecond), // window 3 (the last arrival): 1 of 1
	}
	slo := SLO{TTFT: s}
	got := sloOverTime(recs, slo, 4) // windows of 7/4 s
	w := 7 * s / 4
	want := plotter.XYs{{X: (w / 2).Seconds(), Y: 0.5}, {X: (2*w + w/2).Seconds(), Y: 1.0 / 3}, {X: (3*w + w/2).Seconds(), Y: 1}}
	if !slices.Equal(got, want) {
		t.Errorf("SLO over time %v, want %v", got, want)
	}
	if one := sloOverTime(recs[:1], slo, 4); len(one) != 1 || one[0].Y != 1 {
		t.Errorf("one request at 0: %v", one)
	}

	run := RunResult{Records: recs, Summary: Summary{Trace: &TraceStats{Requests: len(recs)}}}
	var errs []error
	charts := map[string]*chart{}
	for _, c := range buildPlots(&Report{Config: Config{SLOTTFT: s}, Runs: []RunResult{run}}, &errs) {
		charts[c.file] = c.chart
	}
	if len(errs) > 0 || charts["ttft_over_time.png"] == nil || charts["slo_over_time.png"] == nil {
		t.Fatalf("plots %v, errors %v", charts, errs)
	}
	if pts := charts["ttft_over_time.png"].series["TTFT of a request"]; len(pts) != 5 || pts[1] != (plotter.XY{X: 1, Y: 3000}) {
		t.Errorf("TTFT over time %v, want the 5 successful requests", pts)
	}
	if obj := charts["ttft_over_time.png"].series["TTFT objective"]; len(obj) != 2 || obj[0].Y != 1000 || obj[1].X != 7 {
		t.Errorf("TTFT objective %v", obj)
	}
	// 40 windows of 0.175 s: the requests at 0, 1, 5 and 7 s fall in 4.
	if pts := charts["slo_over_time.png"].series["fraction of the window's arrivals"]; len(pts) != 4 ||
		pts[0].Y != 1 || pts[1].Y != 0 || pts[2].Y != 1.0/3 || pts[3].Y != 1 {
		t.Errorf("SLO over time %v", pts)
	}
	// No SLO: no SLO plot; not a trace: no over-time plot.
	charts = map[string]*chart{}
	for _, c := range buildPlots(&Report{Runs: []RunResult{run}}, &errs) {
		charts[c.file] = c.chart
	}
	if charts["slo_over_time.png"] != nil || charts["ttft_over_time.png"] == nil {
		t.Errorf("without an SLO: %v", charts)
	}
	run.Summary.Trace = nil
	for _, c := range buildPlots(&Report{Runs: []RunResult{run}}, &errs) {
		if strings.Contains(c.file, "over_time") {
			t.Errorf("%s for a run that is not a trace replay", c.file)
		}
	}
}

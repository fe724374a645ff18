package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gonum.org/v1/plot/vg"
)

// mixedPrompts are one request of every behaviour of the fake server (and
// several successes); see fakeServer.
var mixedKinds = []string{"ok", "ok", "ok", "ok", "ok", "pairs", "pairs", "http500", "http500", "http429",
	"close", "eof", "errevent", "numcode", "badjson"}

func mixedPrompts() []string {
	out := make([]string, len(mixedKinds))
	for i, k := range mixedKinds {
		out[i] = fmt.Sprintf("%s prompt number %d", k, i)
	}
	return out
}

func TestRunAgainstFakeServer(t *testing.T) {
	wantErrors := map[string]int{
		"http_500:server_error":            2,
		ErrStreamClosed:                    2,
		"stream_error:engine_failed":       1,
		"stream_error:InternalServerError": 1,
		ErrBadResponse:                     1,
	}
	for _, tc := range []struct {
		endpoint Endpoint
		tokenIDs bool
		// pairsTokens: output tokens counted for a "pairs" request (4
		// tokens in 2 events, no usage): exact with token ids, one per
		// event without.
		pairsTokens int
	}{
		{EndpointCompletions, true, 4},
		{EndpointChat, false, 2},
	} {
		t.Run(string(tc.endpoint), func(t *testing.T) {
			srv := fakeServer(t)
			prompts := mixedPrompts()
			cfg := testConfig(srv.URL + "/v1/") // a trailing /v1/ is accepted
			cfg.Endpoint, cfg.ReturnTokenIDs = tc.endpoint, tc.tokenIDs
			cfg.Dataset, cfg.DatasetPath, cfg.NumPrompts = DatasetJSONL, writeJSONL(t, prompts, 4), len(prompts)
			cfg.SLOTTFT = time.Minute
			var out, progress bytes.Buffer
			rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out, Progress: &progress})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Config.Model != "fake-model" {
				t.Errorf("model %q, want the first of /v1/models", rep.Config.Model)
			}
			s := rep.Runs[0].Summary
			// The 429 is shed, not failed.
			if s.Requests != 15 || s.Succeeded != 7 || s.Failed != 7 || s.Shed != 1 {
				t.Errorf("requests %d, succeeded %d, failed %d, shed %d; want 15, 7, 7, 1", s.Requests, s.Succeeded, s.Failed, s.Shed)
			}
			if d := cmp.Diff(wantErrors, s.Errors); d != "" {
				t.Errorf("errors by type (-want +got):\n%s", d)
			}
			wantIn := 0
			for i, k := range mixedKinds {
				if k == "ok" || k == "pairs" {
					wantIn += len(prompts[i]) // usage, or the planned length (bytes)
				}
			}
			if s.InputTokens != wantIn || s.OutputTokens != 5*4+2*tc.pairsTokens {
				t.Errorf("tokens in %d out %d, want %d and %d", s.InputTokens, s.OutputTokens, wantIn, 5*4+2*tc.pairsTokens)
			}
			// ok: 4 events, 3 gaps; pairs: 2 events, 1 gap.
			if s.TTFT.Count != 7 || s.TPOT.Count != 7 || s.ITL.Count != 5*3+2*1 {
				t.Errorf("counts: TTFT %d TPOT %d ITL %d; want 7, 7, 17", s.TTFT.Count, s.TPOT.Count, s.ITL.Count)
			}
			if s.Goodput == nil || s.Goodput.Requests != 7 || !approx(s.Goodput.Fraction, 7.0/15) {
				t.Errorf("goodput %+v, want the 7 successes", s.Goodput)
			}
			for i, r := range rep.Runs[0].Records {
				ok := mixedKinds[i] == "ok" || mixedKinds[i] == "pairs"
				if r.Index != i || r.Success != ok || (ok && (r.TTFT <= 0 || r.E2E < r.TTFT)) {
					t.Errorf("record %d (%s): %+v", i, mixedKinds[i], r)
				}
				if r.UsageReported != (mixedKinds[i] == "ok") {
					t.Errorf("record %d (%s): usage reported %v", i, mixedKinds[i], r.UsageReported)
				}
			}
			text := out.String()
			for _, want := range [][2]string{{"Successful requests", "7"}, {"Failed requests", "7"},
				{"Shed requests (429)", "1"}, {"Shed fraction (%)", "6.67"}, {"Requests meeting the SLO", "7"}, {"Goodput fraction (%)", "46.67"},
				{"Model", "fake-model"}, {"Request rate (req/s)", "inf"}} {
				if !hasRow(text, want[0], want[1]) {
					t.Errorf("summary lacks %q: %q:\n%s", want[0], want[1], text)
				}
			}
			for _, want := range []string{"Serving Benchmark Result", "Median TTFT (ms):", "P99 E2E (ms):", "P90 ITL (ms):", "Mean TPOT (ms):"} {
				if !strings.Contains(text, want) {
					t.Errorf("summary lacks %q:\n%s", want, text)
				}
			}
			if !strings.Contains(progress.String(), "15/15") {
				t.Errorf("progress bar did not reach 15/15: %q", progress.String())
			}

			// The JSON report parses and carries config, summary and records.
			var buf bytes.Buffer
			if err := WriteJSON(&buf, rep); err != nil {
				t.Fatal(err)
			}
			var got struct {
				Config struct {
					Model        string  `json:"model"`
					RequestRates []Rate  `json:"request_rates"`
					SLOTTFT      float64 `json:"slo_ttft_ms"`
				} `json:"config"`
				Runs []struct {
					Summary  Summary `json:"summary"`
					Requests []struct {
						Index     int       `json:"index"`
						Success   bool      `json:"success"`
						ErrorType string    `json:"error_type"`
						TTFT      float64   `json:"ttft_ms"`
						TPOT      *float64  `json:"tpot_ms"`
						ITL       []float64 `json:"itl_ms"`
						MeetsSLO  *bool     `json:"meets_slo"`
					} `json:"requests"`
				} `json:"runs"`
			}
			if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
				t.Fatalf("JSON report: %v\n%s", err, buf.String())
			}
			if got.Config.Model != "fake-model" || len(got.Config.RequestRates) != 1 || !got.Config.RequestRates[0].IsInf() ||
				got.Config.SLOTTFT != 60000 {
				t.Errorf("config %+v", got.Config)
			}
			if len(got.Runs) != 1 || len(got.Runs[0].Requests) != 15 || got.Runs[0].Summary.Succeeded != 7 ||
				!got.Runs[0].Summary.Rate.IsInf() || got.Runs[0].Summary.Errors[ErrBadResponse] != 1 {
				t.Fatalf("runs %+v", got.Runs)
			}
			for i, r := range got.Runs[0].Requests {
				rec := rep.Runs[0].Records[i]
				if r.Index != i || r.Success != rec.Success || r.ErrorType != rec.ErrorType ||
					r.MeetsSLO == nil || *r.MeetsSLO != rec.Success || (r.TPOT != nil) != rec.HasTPOT ||
					len(r.ITL) != len(rec.ITL) || !approx(r.TTFT, ms(rec.TTFT)) {
					t.Errorf("JSON request %d: %+v, record %+v", i, r, rec)
				}
			}
		})
	}
}

func TestRequestTimeout(t *testing.T) {
	srv := fakeServer(t)
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.Dataset, cfg.NumPrompts = "m", DatasetJSONL, 2
	cfg.DatasetPath = writeJSONL(t, []string{"hang forever", "ok fine"}, 3)
	cfg.Timeout = 200 * time.Millisecond
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Runs[0].Summary
	if s.Succeeded != 1 || s.Errors[ErrTimeout] != 1 {
		t.Fatalf("succeeded %d, errors %v; want 1 and one timeout", s.Succeeded, s.Errors)
	}
	if r := rep.Runs[0].Records[0]; r.TTFT <= 0 || r.E2E < cfg.Timeout {
		t.Errorf("the timed-out request keeps its TTFT and ends after the timeout: %+v", r)
	}
}

func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	cfg := testConfig(url)
	cfg.Model, cfg.NumPrompts = "m", 3
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Runs[0].Summary; s.Failed != 3 || s.Errors[ErrTransport] != 3 {
		t.Fatalf("failed %d, errors %v; want 3 transport errors", s.Failed, s.Errors)
	}
	// Without a model name, listing the models fails the run.
	cfg.Model = ""
	if _, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)}); err == nil ||
		!strings.Contains(err.Error(), "listing models") {
		t.Fatalf("got %v, want a model listing error", err)
	}
}

func TestWarmupAllFailedStops(t *testing.T) {
	srv := fakeServer(t)
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.Dataset, cfg.Warmup = "m", DatasetJSONL, 2
	cfg.DatasetPath = writeJSONL(t, []string{"http500 always"}, 3)
	_, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
	if err == nil || !strings.Contains(err.Error(), "warmup: all 2 requests failed") ||
		!strings.Contains(err.Error(), "http_500:server_error") {
		t.Fatalf("got %v, want the warmup to fail with the first error", err)
	}
}

// TestCancelStopsTheRun cancels a run while two requests hang on the
// server: Run must return promptly with context.Canceled.
func TestCancelStopsTheRun(t *testing.T) {
	arrived := make(chan struct{}, 20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fr, ok := parseFake(w, r)
		if !ok {
			return
		}
		s := startSSE(w, fr)
		s.tokens(1)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	defer srv.Close()
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.MaxConcurrency = "m", 20, 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	client := testClient(t)
	go func() {
		rep, err := Run(ctx, Options{Config: cfg, Client: client})
		done <- result{rep, err}
	}()
	<-arrived
	<-arrived
	cancel()
	res := <-done
	if !errors.Is(res.err, context.Canceled) || res.rep == nil || len(res.rep.Runs) != 0 {
		t.Fatalf("got %+v, want context.Canceled and no completed run", res)
	}
}

func TestRequestBody(t *testing.T) {
	for _, ep := range []Endpoint{EndpointCompletions, EndpointChat} {
		cfg := testConfig("http://x")
		cfg.Endpoint, cfg.Model = ep, "m"
		q := &requester{cfg: &cfg}
		b, err := q.body(Prompt{Text: "hello <world>", OutputLen: 7})
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		for k, v := range fields {
			if v == nil {
				t.Errorf("%s: field %q is null", ep, k)
			}
		}
		want := map[string]any{"model": "m", "stream": true, "ignore_eos": true, "return_token_ids": true,
			"temperature": 0.0, "n": 1.0, "stream_options": map[string]any{"include_usage": true}}
		if ep == EndpointChat {
			want["max_completion_tokens"] = 7.0
			want["messages"] = []any{map[string]any{"role": "user", "content": "hello <world>"}}
		} else {
			want["max_tokens"] = 7.0
			want["prompt"] = "hello <world>"
		}
		for k, v := range want {
			if d := cmp.Diff(v, fields[k]); d != "" {
				t.Errorf("%s: field %q (-want +got):\n%s", ep, k, d)
			}
		}
	}
}

// TestRequestBodyResponseFormat: Config.ResponseFormat is sent as every
// request's response_format, as given, on both endpoints, beside the
// fields the benchmark always sets.
func TestRequestBodyResponseFormat(t *testing.T) {
	const rf = `{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}`
	for _, ep := range []Endpoint{EndpointCompletions, EndpointChat} {
		cfg := testConfig("http://x")
		cfg.Endpoint, cfg.ResponseFormat = ep, json.RawMessage(rf)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		q := &requester{cfg: &cfg}
		b, err := q.body(Prompt{Text: "hi", OutputLen: 5})
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		var got, want any
		if err := json.Unmarshal(fields["response_format"], &got); err != nil {
			t.Fatalf("%s: response_format %s: %v", ep, fields["response_format"], err)
		}
		if err := json.Unmarshal([]byte(rf), &want); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: response_format (-want +got):\n%s", ep, d)
		}
		if string(fields["ignore_eos"]) != "true" || string(fields["stream"]) != "true" {
			t.Errorf("%s: ignore_eos %s, stream %s", ep, fields["ignore_eos"], fields["stream"])
		}
		// The report's config records it.
		cj, err := json.Marshal(cfg.toJSON())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(cj), `"response_format":`+rf) {
			t.Errorf("%s: report config %s lacks response_format", ep, cj)
		}
	}
	// Without it, no response_format is sent.
	cfg := testConfig("http://x")
	q := &requester{cfg: &cfg}
	b, err := q.body(Prompt{Text: "hi", OutputLen: 5})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "response_format") {
		t.Errorf("body without a response format: %s", b)
	}
}

// TestStreamParsing feeds the client hand-written streams.
func TestStreamParsing(t *testing.T) {
	tok := `{"choices":[{"index":0,"text":"ab","token_ids":[1,2]}]}`
	usage := `{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`
	cases := []struct {
		name    string
		body    string
		ctype   string
		errType string
		out     int
	}{
		{"comments, CRLF, no space after data:", ": hi\r\n\r\ndata:" + tok + "\r\n\r\nevent: x\r\ndata: " + tok + "\r\n\r\ndata: [DONE]\r\n\r\n", "", "", 4},
		{"usage wins over counting", "data: " + tok + "\n\ndata: " + usage + "\n\ndata: [DONE]\n\n", "", "", 5},
		{"last event without a blank line", "data: " + tok + "\n\ndata: [DONE]", "", "", 2},
		{"ends without DONE", "data: " + tok + "\n\n", "", ErrStreamClosed, 0},
		{"not a stream", `{"choices":[]}`, "application/json", ErrBadResponse, 0},
		{"line over the limit", "data: " + strings.Repeat("x", MaxEventBytes+1) + "\n\n", "", ErrBadResponse, 0},
		{"error event with null error is not an error", "data: " + `{"choices":[{"text":"a"}],"error":null}` + "\n\ndata: [DONE]\n\n", "", "", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ct := c.ctype
				if ct == "" {
					ct = "text/event-stream; charset=utf-8"
				}
				w.Header().Set("Content-Type", ct)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			cfg := testConfig(srv.URL)
			cfg.Model = "m"
			q := &requester{client: testClient(t), clock: SystemClock{}, cfg: &cfg, url: srv.URL + "/v1/completions"}
			r := q.do(context.Background(), Prompt{Text: "p", InputLen: 1, OutputLen: 5})
			if r.ErrorType != c.errType || r.Success != (c.errType == "") {
				t.Fatalf("error type %q (%s), want %q", r.ErrorType, r.Error, c.errType)
			}
			if c.errType == "" && r.OutputTokens != c.out {
				t.Fatalf("output tokens %d, want %d", r.OutputTokens, c.out)
			}
		})
	}
}

func TestPlots(t *testing.T) {
	srv := fakeServer(t)
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.Rates = "m", 20, []Rate{1000, 2000, InfRate()}
	cfg.SLOTTFT, cfg.SLOTPOT = time.Second, time.Second
	var out bytes.Buffer
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Request rate sweep") {
		t.Errorf("a sweep prints a sweep table:\n%s", out.String())
	}
	dir := filepath.Join(t.TempDir(), "plots")
	paths, err := writePlots(dir, rep, 4*vg.Inch, 3*vg.Inch) // small: quicker under -race
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		c, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || c.Width < 100 || c.Height < 100 {
			t.Errorf("%s: not a PNG plot: %v %+v", p, err, c)
		}
	}
	want := []string{"e2e_cdf.png", "goodput_vs_rate.png", "itl_cdf.png", "tpot_cdf.png", "ttft_cdf.png", "ttft_p90_vs_rate.png"}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("plots %v, want %v", names, want)
	}

	// One rate: only the CDFs.
	rep.Runs = rep.Runs[:1]
	paths, err = writePlots(t.TempDir(), rep, 4*vg.Inch, 3*vg.Inch)
	if err != nil || len(paths) != 4 {
		t.Errorf("one rate: %v %v, want the 4 CDFs", paths, err)
	}
}

// hasRow reports whether the summary table text has the row "label: value".
func hasRow(text, label, value string) bool {
	for line := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(line, label+":"); ok && strings.TrimSpace(rest) == value {
			return true
		}
	}
	return false
}

// TestShedAndRetryAfter: a 429 is counted as shed, apart from failures and
// next to goodput; with HonorRetryAfter a request shed with Retry-After is
// resent after that delay (its latencies counting from the first send),
// up to MaxShedRetries times, and a 429 without Retry-After is shed at once.
func TestShedAndRetryAfter(t *testing.T) {
	for _, honor := range []bool{false, true} {
		t.Run(fmt.Sprintf("honor=%v", honor), func(t *testing.T) {
			srv := fakeServer(t)
			prompts := []string{"shedonce a", "shed b", "http429 c", "ok d"}
			cfg := testConfig(srv.URL)
			cfg.Dataset, cfg.DatasetPath, cfg.NumPrompts = DatasetJSONL, writeJSONL(t, prompts, 4), len(prompts)
			cfg.HonorRetryAfter, cfg.SLOTTFT = honor, time.Minute
			cfg.Rates = []Rate{InfRate()}
			cfg.MaxConcurrency = 1
			clock := newFakeClock()
			rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			s := rep.Runs[0].Summary
			recs := rep.Runs[0].Records
			wantShed, wantOK := 3, 1
			if honor {
				wantShed, wantOK = 2, 2
			}
			if s.Shed != wantShed || s.Succeeded != wantOK || s.Failed != 0 || s.Goodput.Requests != wantOK {
				t.Fatalf("shed %d ok %d failed %d goodput %d; want %d, %d, 0, %d", s.Shed, s.Succeeded, s.Failed,
					s.Goodput.Requests, wantShed, wantOK, wantOK)
			}
			if r := recs[0]; honor != (r.Success && r.Resent == 1 && r.TTFT >= time.Second) {
				t.Errorf("shed once: %+v", r)
			}
			if r := recs[1]; !r.Shed || r.RetryAfter != time.Second || (honor && r.Resent != MaxShedRetries) || (!honor && r.Resent != 0) {
				t.Errorf("always shed: %+v", r)
			}
			if r := recs[2]; !r.Shed || r.Resent != 0 || r.RetryAfter != 0 {
				t.Errorf("429 without Retry-After: %+v", r)
			}
		})
	}
}

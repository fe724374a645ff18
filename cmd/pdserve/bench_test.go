package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestBenchUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"zero rate", nil, []string{"bench", "--request-rate", "0"}, "--request-rate"},
		{"bad rate in a sweep", nil, []string{"bench", "--request-rate", "1,fast"}, "fast"},
		{"bad endpoint", nil, []string{"bench", "--endpoint", "embeddings"}, "endpoint"},
		{"jsonl without a path", nil, []string{"bench", "--dataset", "jsonl"}, "dataset path"},
		{"no prompts", nil, []string{"bench", "--num-prompts", "0"}, "number of prompts"},
		{"bad ratio", nil, []string{"bench", "--random-range-ratio", "1.5"}, "range ratio"},
		{"bad env", map[string]string{"PDSERVE_SLO_TTFT": "soon"}, []string{"bench"}, "PDSERVE_SLO_TTFT"},
		{"extra argument", nil, []string{"bench", "now"}, "now"},
		{"no prefixes", nil, []string{"bench", "--dataset", "shared-prefix", "--num-prefixes", "0"}, "number of prefixes"},
		{"empty suffix", nil, []string{"bench", "--dataset", "shared-prefix", "--gsp-question-len", "0"}, "shared-prefix lengths"},
		{"negative turns", nil, []string{"bench", "--multi-turn", "-2"}, "multi-turn"},
		{"missing response format file", nil, []string{"bench", "--response-format", "/nonexistent/rf.json"}, "--response-format"},
		{"trace with a request rate", nil, []string{"bench", "--trace", "t.jsonl", "--request-rate", "4"}, "--trace-time-scale, not --request-rate"},
		{"trace with another dataset", nil, []string{"bench", "--trace", "t.jsonl", "--dataset", "random"}, "--dataset random"},
		{"zero time scale", nil, []string{"bench", "--trace", "t.jsonl", "--trace-time-scale", "0"}, "--trace-time-scale must be a positive"},
		{"time scale without a trace", nil, []string{"bench", "--trace-time-scale", "2"}, "--trace-time-scale needs --trace"},
		{"trace window without a trace", nil, []string{"bench", "--trace-start", "1m"}, "--trace-start needs --trace"},
		{"trace dataset without a file", nil, []string{"bench", "--dataset", "trace"}, "--dataset trace needs --trace"},
		{"negative trace block", nil, []string{"bench", "--trace", "t.jsonl", "--trace-block-size", "-1"}, "trace block size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runArgs(t, tc.env, tc.args...)
			if code != 2 || !strings.Contains(out+errOut, tc.want) {
				t.Fatalf("exit %d (want 2), output %q %q, want it to mention %q", code, out, errOut, tc.want)
			}
		})
	}
}

// fakeOpenAI streams max_tokens one-byte tokens for every completion and
// lists one model; a prompt starting with "fail" gets a 500.
func fakeOpenAI(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m1","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt    string `json:"prompt"`
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m1" {
			http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		if strings.HasPrefix(req.Prompt, "fail") {
			http.Error(w, `{"error":{"message":"boom","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for range req.MaxTokens {
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", len(req.Prompt), req.MaxTokens)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func runLive(t *testing.T, e map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, env(e), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBenchCommand(t *testing.T) {
	srv := fakeOpenAI(t)
	dir := t.TempDir()
	outPath, plotDir := filepath.Join(dir, "r.json"), filepath.Join(dir, "plots")
	code, out, errOut := runLive(t, map[string]string{"PDSERVE_NUM_PROMPTS": "12"}, "bench", "--base-url", srv.URL,
		"--request-rate", "500,1000", "--random-input-len", "32", "--random-output-len", "5", "--warmup", "1",
		"--slo-ttft", "10s", "--output", outPath, "--plot", plotDir, "--progress=false")
	if code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	for _, want := range []string{`Successful requests:\s+12\n`, "Request rate sweep", `Goodput \(req/s\):`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Config struct {
			Model     string `json:"model"`
			IgnoreEOS bool   `json:"ignore_eos"`
		} `json:"config"`
		Runs []struct {
			Summary struct {
				Succeeded    int `json:"succeeded"`
				OutputTokens int `json:"output_tokens"`
			} `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Config.Model != "m1" || !rep.Config.IgnoreEOS || len(rep.Runs) != 2 ||
		rep.Runs[1].Summary.Succeeded != 12 || rep.Runs[1].Summary.OutputTokens != 60 {
		t.Fatalf("report %+v", rep)
	}
	for _, f := range []string{"ttft_cdf.png", "e2e_cdf.png", "goodput_vs_rate.png", "ttft_p90_vs_rate.png"} {
		if _, err := os.Stat(filepath.Join(plotDir, f)); err != nil {
			t.Errorf("plot: %v", err)
		}
	}

	// shared-prefix under SGLang's flag names, as conversations of 2 turns.
	code, out, errOut = runLive(t, nil, "bench", "--base-url", srv.URL, "--model", "m1", "--dataset", "shared-prefix",
		"--gsp-num-groups", "3", "--gsp-system-prompt-len", "64", "--gsp-question-len", "8", "--gsp-output-len", "4",
		"--multi-turn", "2", "--num-prompts", "6", "--warmup", "0", "--output", outPath, "--progress=false")
	if code != 0 || !regexp.MustCompile(`Successful requests:\s+12\n`).MatchString(out) || !strings.Contains(out, "Multi-turn") {
		t.Fatalf("shared-prefix: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	b, _ = os.ReadFile(outPath)
	var sp struct {
		Config struct {
			Dataset   string `json:"dataset"`
			Prefix    int    `json:"shared_prefix_len"`
			Groups    int    `json:"num_prefixes"`
			Suffix    int    `json:"suffix_len"`
			Output    int    `json:"random_output_len"`
			MultiTurn int    `json:"multi_turn"`
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &sp); err != nil {
		t.Fatal(err)
	}
	if c := sp.Config; c.Dataset != "shared-prefix" || c.Prefix != 64 || c.Groups != 3 || c.Suffix != 8 || c.Output != 4 || c.MultiTurn != 2 {
		t.Errorf("shared-prefix config %+v", c)
	}

	// jsonl: ignore_eos defaults to off; a failing server fails the command.
	path := filepath.Join(dir, "p.jsonl")
	if err := os.WriteFile(path, []byte(`{"prompt": "fail please", "output_len": 3}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runLive(t, nil, "bench", "--base-url", srv.URL, "--model", "m1", "--dataset", "jsonl",
		"--dataset-path", path, "--num-prompts", "3", "--warmup", "0", "--output", outPath, "--progress=false")
	if code != 1 || !strings.Contains(errOut, "every request failed") || !strings.Contains(out, "http_500:server_error:") {
		t.Fatalf("exit %d (want 1)\nstdout %s\nstderr %s", code, out, errOut)
	}
	b, _ = os.ReadFile(outPath)
	if !strings.Contains(string(b), `"ignore_eos": false`) {
		t.Errorf("jsonl must default to ignore_eos false:\n%.400s", b)
	}
}

// TestBenchTrace replays a trace through the command: every request of
// the window, the trace's figures in the summary and the report; a
// malformed line fails the command with the file and line.
func TestBenchTrace(t *testing.T) {
	srv := fakeOpenAI(t)
	dir := t.TempDir()
	path, outPath := filepath.Join(dir, "trace.jsonl"), filepath.Join(dir, "r.json")
	trace := `{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 30, "input_length": 12, "output_length": 4, "hash_ids": [1, 3]}
{"timestamp": 50, "input_length": 5, "output_length": 2, "hash_ids": [4]}
{"timestamp": 90000, "input_length": 5, "output_length": 2, "hash_ids": [5]}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runLive(t, nil, "bench", "--base-url", srv.URL, "--trace", path, "--trace-block-size", "10",
		"--trace-time-scale", "10", "--trace-duration", "1s", "--warmup", "0", "--output", outPath, "--progress=false")
	if code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	for _, want := range []string{`Successful requests:\s+3\n`, `Trace requests:\s+3\n`, `Dataset:\s+trace\n`,
		`Total input tokens:\s+37\n`, `Total generated tokens:\s+9\n`, `Repeated blocks \(%\):\s+20.00\n`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Config struct {
			Dataset   string  `json:"dataset"`
			Trace     string  `json:"trace"`
			TimeScale float64 `json:"trace_time_scale"`
			IgnoreEOS bool    `json:"ignore_eos"`
		} `json:"config"`
		Runs []struct {
			Summary struct {
				Trace struct {
					Requests   int     `json:"requests"`
					ReplaySpan float64 `json:"replay_span_s"`
				} `json:"trace"`
			} `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if c := rep.Config; c.Dataset != "trace" || c.Trace != path || c.TimeScale != 10 || !c.IgnoreEOS || len(rep.Runs) != 1 ||
		rep.Runs[0].Summary.Trace.Requests != 3 || rep.Runs[0].Summary.Trace.ReplaySpan != 0.005 {
		t.Fatalf("report %+v", rep)
	}

	if err := os.WriteFile(path, []byte(trace+`{"timestamp": 1, "input_length": 5, "output_length": 2}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runLive(t, nil, "bench", "--base-url", srv.URL, "--trace", path, "--trace-block-size", "10", "--progress=false")
	if code != 1 || !strings.Contains(errOut, path+":5: timestamp 1 ms is before") {
		t.Fatalf("decreasing timestamp: exit %d (want 1)\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// TestBenchSeed: without --seed each run draws a seed of its own (shown in
// the summary and the report), so a second run does not resend the first
// one's prompts; --seed fixes it and --reuse-prompts is passed on.
func TestBenchSeed(t *testing.T) {
	srv := fakeOpenAI(t)
	outPath := filepath.Join(t.TempDir(), "r.json")
	report := func(args ...string) (seed uint64, reuse bool, stdout string) {
		t.Helper()
		args = append([]string{"bench", "--base-url", srv.URL, "--num-prompts", "3", "--request-rate", "inf,inf",
			"--random-input-len", "8", "--random-output-len", "2", "--warmup", "0", "--output", outPath, "--progress=false"}, args...)
		code, out, errOut := runLive(t, nil, args...)
		if code != 0 {
			t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
		}
		b, err := os.ReadFile(outPath)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Config struct {
				Seed  uint64 `json:"seed"`
				Reuse bool   `json:"reuse_prompts"`
			} `json:"config"`
		}
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Config.Seed, rep.Config.Reuse, out
	}
	s1, reuse, out := report()
	s2, _, _ := report()
	if s1 == s2 || reuse {
		t.Errorf("two runs without --seed: seeds %d and %d (want different), reuse %v", s1, s2, reuse)
	}
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^Seed:\s+%d$`, s1)).MatchString(out) {
		t.Errorf("the summary does not show seed %d:\n%s", s1, out)
	}
	s, reuse, out := report("--seed", "7", "--reuse-prompts")
	if s != 7 || !reuse || !regexp.MustCompile(`(?m)^Seed:\s+7 \(prompts reused across rates\)$`).MatchString(out) {
		t.Errorf("--seed 7 --reuse-prompts: seed %d, reuse %v\n%s", s, reuse, out)
	}
}

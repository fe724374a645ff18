package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/bench"
)

func newBenchCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg        bench.Config
		endpoint   string
		dataset    string
		rates      []string
		outputPath string
		plotDir    string
		progress   bool
		apiKey     string
		rfPath     string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark an OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput and goodput",
		Long: `Sends --num-prompts streamed requests to an OpenAI-compatible server (pdserve,
vLLM, SGLang, ...) with Poisson arrivals at --request-rate requests/s ("inf"
sends them all at once; "1,2,4,8" runs a sweep, one run per rate), at most
--max-concurrency in flight, and prints a summary per rate: mean, median, p90
and p99 of TTFT (time to first token), TPOT (time per output token after the
first), ITL (gaps between streamed events) and E2E latency; request and token
throughput; failures by type; and goodput, the requests/s that met both
--slo-ttft and --slo-tpot.

Datasets: random (prompts of --random-input-len tokens asking for
--random-output-len, lengths uniform in [len*(1-r), len*(1+r)] with
r = --random-range-ratio), conversation (a built-in synthetic ShareGPT-like
lognormal length distribution: prompt median 155 tokens, sigma 1.1; output
median 135, sigma 0.9; filtered like vLLM's ShareGPT loader; means about 217
and 198 tokens), jsonl
(--dataset-path, lines {"prompt": "...", "output_len": N}) and shared-prefix
(--num-prefixes prefixes of --shared-prefix-len tokens, each prompt one of
them and --suffix-len unique tokens; SGLang's generated-shared-prefix).
Each rate of a sweep draws fresh prompts, and so does each run unless --seed
is given (the rates' prompts derive from the seed, so a run with the same
--seed sends the same prompts rate by rate): a sweep measures prefill, not a
prefix cache warmed by the previous rate. --reuse-prompts sends every rate
the first rate's prompts, to measure a warm cache on purpose. The summary
warns when the server reports more than 50% of the prompt tokens cached on
a random or conversation dataset (whose prompts share no prefix).

Prompts are built for about one token per byte (exact for the simulated
model); token counts come from the server's usage, cached prompt tokens from
usage.prompt_tokens_details.cached_tokens (shown with the prefix-cache hit
rate and, for shared-prefix, the hit rate a perfect placement would get).

--multi-turn N makes each of --num-prompts a conversation of N turns: turn k
sends the history (earlier prompts and the server's answers) and a new
message; conversations start at the Poisson arrivals and interleave; TTFT and
cache hits are also shown per turn.

--response-format FILE adds the response_format object in FILE to every
request: a run with it and one without, with the same --seed, measure what
constrained decoding costs (compare output tokens/s: a grammar may end an
output with EOS before max_tokens, whatever --ignore-eos says).

--trace FILE replays a Mooncake FAST'25 trace (kvcache-ai/Mooncake,
FAST25-release/traces/*.jsonl; lines {"timestamp": ms, "input_length": N,
"output_length": N, "hash_ids": [...]}): request i is sent at its timestamp
minus the first one's, divided by --trace-time-scale (2 = twice as fast),
asking for output_length tokens; its prompt is exactly input_length tokens
of the simulated model (one per byte), block k of --trace-block-size tokens
a text derived from hash_ids[k] and the seed, so equal ids are equal blocks
and the server's prefix cache sees the sharing the trace has. --trace-start
and --trace-duration select a window of the trace's time, --num-prompts caps
the requests (default with --trace: all of the window). The summary adds the
trace's figures (span, mean lengths, the share of prompt blocks repeated
from an earlier request, and the tokens in them as the oracle hit rate: the
best a prefix cache could do). Timestamps must not decrease; a malformed
line is reported with its file and line number.

Exits 1 when every measured request failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			cfg.Endpoint = bench.Endpoint(endpoint)
			cfg.Dataset = bench.DatasetKind(dataset)
			if cfg.TracePath != "" {
				if fs.Changed("dataset") && cfg.Dataset != bench.DatasetTrace {
					return usagef("--trace replays a trace: it does not go with --dataset %s", dataset)
				}
				if fs.Changed("request-rate") {
					return usagef("--trace replays the trace's timestamps: use --trace-time-scale, not --request-rate")
				}
				cfg.Dataset = bench.DatasetTrace
				if !(cfg.TraceTimeScale > 0) || math.IsInf(cfg.TraceTimeScale, 1) {
					return usagef("--trace-time-scale must be a positive number, got %v", cfg.TraceTimeScale)
				}
				if !fs.Changed("num-prompts") {
					cfg.NumPrompts = 0 // the whole trace
				}
			} else {
				for _, f := range []string{"trace-time-scale", "trace-start", "trace-duration", "trace-block-size"} {
					if fs.Changed(f) {
						return usagef("--%s needs --trace FILE", f)
					}
				}
				r, err := bench.ParseRates(rates)
				if err != nil {
					return usagef("--request-rate: %v", err)
				}
				cfg.Rates = r
			}
			if !fs.Changed("ignore-eos") {
				cfg.IgnoreEOS = cfg.Dataset != bench.DatasetJSONL
			}
			if !fs.Changed("min-tokens") {
				cfg.MinTokens = cfg.MultiTurn > 1
			}
			if cfg.Dataset == bench.DatasetTrace && cfg.TracePath == "" {
				return usagef("--dataset trace needs --trace FILE")
			}
			if rfPath != "" {
				rf, err := os.ReadFile(rfPath)
				if err != nil {
					return usagef("--response-format: %v", err)
				}
				cfg.ResponseFormat = rf
			}
			if !fs.Changed("seed") {
				// A fresh seed each run: a second run does not resend the
				// first one's prompts to a warm cache.
				cfg.Seed = rand.Uint64()
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConns = 0
			tr.MaxIdleConnsPerHost = 4096
			tr.DisableCompression = true
			defer tr.CloseIdleConnections()
			o := bench.Options{Config: cfg, Client: &http.Client{Transport: bearer(apiKey, cfg.BaseURL, tr)}, Clock: bench.SystemClock{}, Out: stdout}
			if progress {
				o.Progress = stderr
			}
			rep, runErr := bench.Run(cmd.Context(), o)
			if rep == nil || len(rep.Runs) == 0 {
				return runErr
			}
			if err := writeOutputs(rep, outputPath, plotDir, stderr); err != nil {
				return errors.Join(runErr, err)
			}
			if runErr != nil {
				return runErr
			}
			for _, run := range rep.Runs {
				if run.Summary.Succeeded > 0 {
					return nil
				}
			}
			return errors.New("bench: every request failed")
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.BaseURL, "base-url", "http://127.0.0.1:8000", "base URL of the OpenAI-compatible server")
	fs.StringVar(&endpoint, "endpoint", string(bench.EndpointCompletions), "API to call: completions or chat")
	fs.StringVar(&cfg.Model, "model", "", "model name to send (default: the first model GET /v1/models lists)")
	fs.IntVar(&cfg.NumPrompts, "num-prompts", 1000, "measured requests per request rate")
	fs.StringSliceVar(&rates, "request-rate", []string{"inf"}, `requests/s with Poisson arrivals, "inf" for all at once; a comma-separated list runs a sweep`)
	fs.IntVar(&cfg.MaxConcurrency, "max-concurrency", 0, "most requests in flight (0: no cap); a request arriving at the cap waits for a slot")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the prompts and the arrival times; each rate of a sweep draws its own prompts from it (default: a fresh seed each run, shown in the summary and --output)")
	fs.BoolVar(&cfg.ReusePrompts, "reuse-prompts", false, "send every rate of a sweep the first rate's prompts, to measure a warm prefix cache on purpose")
	fs.IntVar(&cfg.Warmup, "warmup", 1, "requests sent before the measured runs and not counted (all failing aborts the benchmark)")
	fs.StringVar(&dataset, "dataset", string(bench.DatasetRandom), "prompts: random, conversation, jsonl or shared-prefix (a trace replay: --trace FILE)")
	fs.IntVar(&cfg.RandomInputLen, "random-input-len", 1024, "random dataset: prompt length, tokens")
	fs.IntVar(&cfg.RandomOutputLen, "random-output-len", 128, "random dataset: output length (max_tokens), tokens; also for jsonl records without output_len")
	fs.Float64Var(&cfg.RandomRangeRatio, "random-range-ratio", 0, "random dataset: lengths uniform in [len*(1-r), len*(1+r)], r in [0, 1)")
	fs.StringVar(&cfg.DatasetPath, "dataset-path", "", `jsonl dataset: file of {"prompt": "...", "output_len": N} lines`)
	fs.IntVar(&cfg.SharedPrefixLen, "shared-prefix-len", 2048, "shared-prefix dataset: tokens of each shared prefix (SGLang: --gsp-system-prompt-len)")
	fs.IntVar(&cfg.NumPrefixes, "num-prefixes", 16, "shared-prefix dataset: number of prefixes, the prompts spread evenly over them (SGLang: --gsp-num-groups)")
	fs.IntVar(&cfg.SuffixLen, "suffix-len", 128, "shared-prefix dataset: unique tokens after the prefix (SGLang: --gsp-question-len); the output length is --random-output-len")
	fs.IntVar(&cfg.MultiTurn, "multi-turn", 0, "turns per conversation: --num-prompts conversations, turn k resends the history (earlier prompts and the answers streamed) plus the next prompt of the dataset, once turn k-1 ended (0 or 1: single requests)")
	// SGLang bench_serving's names of the shared-prefix flags.
	fs.IntVar(&cfg.SharedPrefixLen, "gsp-system-prompt-len", 2048, "same as --shared-prefix-len")
	fs.IntVar(&cfg.NumPrefixes, "gsp-num-groups", 16, "same as --num-prefixes")
	fs.IntVar(&cfg.SuffixLen, "gsp-question-len", 128, "same as --suffix-len")
	fs.IntVar(&cfg.RandomOutputLen, "gsp-output-len", 128, "same as --random-output-len")
	fs.DurationVar(&cfg.SLOTTFT, "slo-ttft", 0, "goodput objective on time to first token, e.g. 500ms (0: none)")
	fs.DurationVar(&cfg.SLOTPOT, "slo-tpot", 0, "goodput objective on time per output token, e.g. 50ms (0: none)")
	fs.StringVar(&outputPath, "output", "", "write config, summaries and per-request records as JSON to this file")
	fs.StringVar(&plotDir, "plot", "", "write PNG plots (latency CDFs with p50/p90/p99 marked; throughput, goodput and TTFT percentiles vs rate for a sweep, inf at the right edge; for --trace, TTFT and the fraction within the SLO over the replay) into this directory")
	fs.BoolVar(&cfg.IgnoreEOS, "ignore-eos", true, "send ignore_eos so outputs have the requested length (off with --dataset jsonl unless given)")
	fs.BoolVar(&cfg.MinTokens, "min-tokens", false, "send min_tokens = max_tokens so no EOS is drawn inside an output and a resent history is what the model produced (vLLM/SGLang/pdserve extension; default true with --multi-turn)")
	fs.StringVar(&rfPath, "response-format", "", `JSON file holding a response_format object (e.g. {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}) added to every request, to measure constrained decoding`)
	fs.BoolVar(&cfg.ReturnTokenIDs, "return-token-ids", true, "send return_token_ids so streamed tokens are counted exactly (vLLM/pdserve extension)")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "per-request timeout, from sending to the end of the stream")
	fs.BoolVar(&cfg.HonorRetryAfter, "honor-retry-after", false, "resend a request the server sheds (429 with Retry-After) after that delay, within --timeout; off, a 429 counts as shed at once (reported next to goodput)")
	fs.StringVar(&cfg.TracePath, "trace", "", "replay this Mooncake FAST'25 trace (JSONL: timestamp ms, input_length, output_length, hash_ids) at its own timestamps instead of a dataset and a request rate")
	fs.Float64Var(&cfg.TraceTimeScale, "trace-time-scale", 1, "--trace: divide the trace's arrival offsets by this (2 replays twice as fast, 0.5 at half speed)")
	fs.DurationVar(&cfg.TraceStart, "trace-start", 0, "--trace: skip the requests that arrive less than this after the trace's first one (trace time, before scaling)")
	fs.DurationVar(&cfg.TraceDuration, "trace-duration", 0, "--trace: replay only the requests arriving within this much trace time after --trace-start (0: to the end)")
	fs.IntVar(&cfg.TraceBlockSize, "trace-block-size", bench.DefaultTraceBlockSize, "--trace: prompt tokens per hash id (the Mooncake traces use 512)")
	fs.BoolVar(&progress, "progress", true, "show a progress bar on stderr")
	fs.StringVar(&apiKey, "api-key", "", "API key sent as Authorization: Bearer (PDSERVE_API_KEY; an https --base-url trusts the system's CAs, or SSL_CERT_FILE)")
	return cmd
}

// writeOutputs writes the JSON report and the plots that were asked for.
func writeOutputs(rep *bench.Report, outputPath, plotDir string, stderr io.Writer) error {
	var errs []error
	if outputPath != "" {
		if err := writeJSONFile(outputPath, rep); err != nil {
			errs = append(errs, err)
		} else {
			fmt.Fprintf(stderr, "bench: wrote %s\n", outputPath)
		}
	}
	if plotDir != "" {
		paths, err := bench.WritePlots(plotDir, rep)
		if err != nil {
			errs = append(errs, err)
		}
		for _, p := range paths {
			fmt.Fprintf(stderr, "bench: wrote %s\n", p)
		}
	}
	return errors.Join(errs...)
}

func writeJSONFile(path string, rep *bench.Report) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return bench.WriteJSON(f, rep)
}

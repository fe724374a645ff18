// Package bench is pdserve's serving benchmark (`pdserve bench`): it sends
// streamed requests to any OpenAI-compatible server at a chosen request rate
// and reports latency and throughput, in the spirit of SGLang's
// bench_serving and `vllm bench serve`.
//
// # Overview
//
// [Run] takes a [Config] and the things it must not create itself: an
// *http.Client, a [Clock] (time and sleeping, so tests can drive arrivals on
// a fake clock), and writers for the summary and the progress bar. For each
// request rate of the config it sends Config.NumPrompts requests whose
// arrival times form a Poisson process (exponential inter-arrival times drawn
// from a generator seeded by Config.Seed; rate inf sends them all at once),
// holding at most Config.MaxConcurrency in flight, and measures every request
// from its stream:
//
//   - TTFT: from sending the request to the first stream event that carries
//     output (text or token ids);
//   - ITL: every gap between two consecutive events that carry output (an
//     event carrying several tokens is one gap, as in vLLM);
//   - TPOT: (E2E − TTFT) / (output tokens − 1), for requests with at least
//     two output tokens; when a server coalesces tokens into events, ITL is
//     about TPOT × the tokens per event, which the summary reports
//     (Summary.TokensPerEvent) and explains;
//   - E2E: from sending the request to the end of its stream;
//   - tokens: prompt and output tokens from the usage of the last event
//     (stream_options.include_usage), else the planned prompt length and the
//     counted output tokens.
//
// [Summarize] turns the records of one rate into a [Summary]: mean, median,
// p90 and p99 of each latency (percentiles interpolate linearly between
// ranks, like numpy's default), throughput, failures by type, and goodput
// (requests per second that met both latency SLOs). [WriteJSON] and
// [WritePlots] export a [Report].
//
// Datasets ([BuildDataset]): "random" (prompts of a given length, lengths
// uniform in [len·(1−r), len·(1+r)]), "conversation" (a built-in synthetic
// ShareGPT-like length distribution, see [ConversationLengths]), "jsonl"
// (records {"prompt": ..., "output_len": N} from a file), "shared-prefix"
// ([SharedPrefixPrompts]) and "trace".
//
// Trace replay ("trace", Config.TracePath): a Mooncake FAST'25 trace
// ([ParseTrace]) is one run whose arrivals are the trace's timestamps
// relative to the first one replayed, divided by Config.TraceTimeScale
// ([Trace.Offsets]); no Poisson draw. Each request asks for the trace's
// output_length tokens with a prompt of exactly input_length bytes whose
// blocks are derived from the trace's hash ids ([TracePrompt]): equal ids
// are equal blocks, so a server's prefix cache sees the sharing the trace
// has. The summary adds the trace's own figures ([TraceStats]), its share
// of prompt tokens in blocks an earlier request had standing as the oracle
// hit rate. Prompt texts are built when each request is sent, so a long
// trace is not held in memory as text.
//
// Each rate of a sweep draws its prompts from an RNG stream of its own
// derived from Config.Seed ([RateStream]), so no rate resends the prompts
// of another to a prefix cache they warmed, and the same seed gives the
// same prompts rate by rate (a JSONL file gives its records to every rate).
// Config.ReusePrompts sends every rate the first rate's prompts instead, to
// measure a warm cache on purpose. When the server reports more than
// [UnexpectedHitRate] of the prompt tokens cached on a dataset whose
// prompts share no prefix (random or conversation, single requests),
// Summary.CacheWarning says so and the summary prints it.
//
// # Concurrency
//
// Run starts one goroutine per request at its arrival time and waits for all
// of them before it returns; nothing outlives Run. Records are written by
// their own request's goroutine into distinct slice elements and read only
// after all have finished. The Clock must be safe for concurrent use.
//
// # Ownership
//
// Run does not close the http.Client's idle connections or the writers; the
// caller owns them. A failed request never fails the run: it becomes a
// record with an error type. Run returns an error only for a bad config, a
// dataset that cannot be built, a model name that cannot be discovered, a
// warmup in which every request failed, or a cancelled context.
package bench

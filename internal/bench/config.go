package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Endpoint selects the OpenAI API a benchmark calls.
type Endpoint string

// The endpoints.
const (
	// EndpointCompletions is POST /v1/completions with a text prompt.
	EndpointCompletions Endpoint = "completions"
	// EndpointChat is POST /v1/chat/completions with the prompt as one user
	// message.
	EndpointChat Endpoint = "chat"
)

// Path is the URL path of the endpoint under the base URL.
func (e Endpoint) Path() string {
	if e == EndpointChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// DatasetKind names a source of prompts.
type DatasetKind string

// The datasets.
const (
	// DatasetRandom: prompts of Config.RandomInputLen tokens asking for
	// Config.RandomOutputLen tokens, both spread by Config.RandomRangeRatio.
	DatasetRandom DatasetKind = "random"
	// DatasetConversation: the built-in synthetic ShareGPT-like length
	// distribution (see ConversationLengths).
	DatasetConversation DatasetKind = "conversation"
	// DatasetJSONL: records {"prompt": "...", "output_len": N}, one per line,
	// from Config.DatasetPath.
	DatasetJSONL DatasetKind = "jsonl"
	// DatasetSharedPrefix: Config.NumPrefixes groups, each a prefix of
	// Config.SharedPrefixLen tokens shared by its prompts (a system prompt,
	// a few-shot template), each prompt the prefix and a unique suffix of
	// Config.SuffixLen tokens, asking for Config.RandomOutputLen tokens
	// (SGLang bench_serving's generated-shared-prefix dataset).
	DatasetSharedPrefix DatasetKind = "shared-prefix"
	// DatasetTrace: a Mooncake FAST'25 trace from Config.TracePath, replayed
	// at its own timestamps (see ParseTrace and TracePrompt).
	DatasetTrace DatasetKind = "trace"
)

// Rate is a request rate in requests per second; +Inf (InfRate) sends
// every request at once.
type Rate float64

// InfRate returns the rate that sends every request at time zero.
func InfRate() Rate { return Rate(math.Inf(1)) }

// IsInf reports whether r sends every request at once.
func (r Rate) IsInf() bool { return math.IsInf(float64(r), 1) }

// String returns "inf" or the rate as a decimal number.
func (r Rate) String() string {
	if r.IsInf() {
		return "inf"
	}
	return strconv.FormatFloat(float64(r), 'g', -1, 64)
}

// MarshalJSON writes a finite rate as a number and Inf as the string "inf"
// (JSON has no infinity).
func (r Rate) MarshalJSON() ([]byte, error) {
	if r.IsInf() {
		return []byte(`"inf"`), nil
	}
	if math.IsNaN(float64(r)) || math.IsInf(float64(r), -1) {
		return nil, fmt.Errorf("bench: invalid rate %v", float64(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		v, err := ParseRate(s)
		if err != nil {
			return err
		}
		*r = v
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("bench: rate: %w", err)
	}
	*r = Rate(f)
	return nil
}

// ParseRate parses "inf" or a positive number of requests per second.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "inf") {
		return InfRate(), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("request rate %q: want a positive number of requests/s or inf", s)
	}
	return Rate(f), nil
}

// ParseRates parses a list of rates; each element may itself be a
// comma-separated list ("1,2,4,8").
func ParseRates(list []string) ([]Rate, error) {
	var out []Rate
	for _, v := range list {
		for p := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(p) == "" {
				continue
			}
			r, err := ParseRate(p)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no request rate given")
	}
	return out, nil
}

// Config is one benchmark: where to send, what, how fast, and what counts
// as good.
type Config struct {
	// BaseURL is the server's base URL, e.g. http://127.0.0.1:8000 (a
	// trailing "/v1" is accepted and ignored).
	BaseURL string
	// Endpoint is the API to call.
	Endpoint Endpoint
	// Model is the model name sent; "" asks GET /v1/models and takes the
	// first model.
	Model string
	// NumPrompts is the number of measured requests per rate.
	NumPrompts int
	// Rates are the request rates to run, in order (one run each).
	Rates []Rate
	// MaxConcurrency caps the requests in flight; 0 means no cap. A request
	// that arrives while the cap is reached waits for a free slot, and its
	// latencies are measured from when it is sent.
	MaxConcurrency int
	// Seed seeds the dataset and the arrival times. Each rate of a sweep
	// draws its prompts from a stream of its own derived from Seed (see
	// RateStream), so the same Seed gives the same prompts rate by rate and
	// no rate resends another's.
	Seed uint64
	// ReusePrompts sends every rate the first rate's prompts, so the rates
	// after the first measure a warm prefix cache on purpose.
	ReusePrompts bool
	// Warmup is the number of requests sent (with the same concurrency cap,
	// all at once) before the first rate and not counted.
	Warmup int

	// Dataset selects the prompts.
	Dataset DatasetKind
	// RandomInputLen is the mean prompt length of the random dataset, in
	// tokens (bytes for the simulated model).
	RandomInputLen int
	// RandomOutputLen is the mean max_tokens of the random dataset, and of
	// jsonl records that give no output_len, in tokens.
	RandomOutputLen int
	// RandomRangeRatio r in [0, 1) spreads random lengths uniformly over
	// [len·(1−r), len·(1+r)] (vLLM's convention; the mean stays len).
	RandomRangeRatio float64
	// DatasetPath is the JSONL file of the jsonl dataset.
	DatasetPath string
	// SharedPrefixLen, NumPrefixes and SuffixLen shape the shared-prefix
	// dataset: NumPrefixes prefixes of SharedPrefixLen tokens, each prompt
	// one of them (in turn, then shuffled) followed by SuffixLen unique
	// tokens.
	SharedPrefixLen, NumPrefixes, SuffixLen int
	// MultiTurn > 1 makes each of the NumPrompts prompts a conversation of
	// MultiTurn turns: turn k sends the conversation's history (the
	// previous user messages and the answers the server gave) and a new
	// user message, the next prompt of the dataset; it is sent when turn
	// k−1's answer ended. Conversations start at the run's arrival times
	// and interleave. 0 or 1: single requests.
	MultiTurn int

	// TracePath is the trace file of the trace dataset (JSONL lines
	// {"timestamp": ms, "input_length": N, "output_length": N,
	// "hash_ids": [...]}, see ParseTrace). A trace replay is one run: the
	// trace is the schedule, so Rates must be empty, and NumPrompts caps
	// the requests replayed (0: every request of the window).
	TracePath string
	// TraceTimeScale divides the trace's arrival offsets: 2 replays it
	// twice as fast, 0.5 at half speed; 0 means 1.
	TraceTimeScale float64
	// TraceStart skips the requests that arrive less than TraceStart
	// after the trace's first one; TraceDuration, if positive, replays
	// only those that arrive before TraceStart + TraceDuration. Both are
	// in the trace's time, before TraceTimeScale.
	TraceStart, TraceDuration time.Duration
	// TraceBlockSize is the prompt tokens per hash id; 0 means
	// DefaultTraceBlockSize.
	TraceBlockSize int

	// SLOTTFT is the time-to-first-token objective for goodput; 0 means none.
	SLOTTFT time.Duration
	// SLOTPOT is the time-per-output-token objective for goodput; 0 means
	// none.
	SLOTPOT time.Duration

	// IgnoreEOS sends ignore_eos (vLLM extension) so each request produces
	// exactly its max_tokens.
	IgnoreEOS bool
	// MinTokens sends min_tokens = max_tokens (vLLM extension): no EOS or
	// stop token is drawn within the output, so every output token has
	// text and a multi-turn history resends exactly the tokens the model
	// produced (with only ignore_eos, an EOS drawn mid-answer has no text
	// and the resent history differs from what the server cached).
	MinTokens bool
	// ReturnTokenIDs sends return_token_ids (vLLM extension), so output
	// tokens are counted exactly even without usage.
	ReturnTokenIDs bool
	// ResponseFormat, when not empty, is a JSON object sent as every
	// request's response_format (OpenAI's {"type": "json_schema", …} or
	// {"type": "json_object"}; pdserve takes it on both endpoints), to
	// measure constrained decoding against the same prompts without it.
	ResponseFormat json.RawMessage
	// Timeout bounds each request from sending to the end of its stream.
	Timeout time.Duration
	// HonorRetryAfter resends a request the server shed (429 with
	// Retry-After) once that delay has passed, up to MaxShedRetries times
	// and within Timeout; its latencies then count from the first send.
	// Off, a 429 is recorded as shed at once.
	HonorRetryAfter bool
}

// MaxShedRetries bounds how often one request is resent after a 429 when
// Config.HonorRetryAfter is set.
const MaxShedRetries = 10

// Limits on a config.
const (
	// MaxPrompts is the largest NumPrompts (and Warmup) accepted.
	MaxPrompts = 10_000_000
	// MaxTokensPerRequest bounds RandomInputLen·(1+r) and the output length
	// of any request, in tokens.
	MaxTokensPerRequest = 10_000_000
	// MaxPrefixes bounds NumPrefixes.
	MaxPrefixes = 100_000
	// MaxTurns bounds MultiTurn.
	MaxTurns = 1000
)

// datasetNames lists the datasets for error messages.
const datasetNames = "random, conversation, jsonl, shared-prefix or trace"

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.BaseURL == "" || !(strings.HasPrefix(c.BaseURL, "http://") || strings.HasPrefix(c.BaseURL, "https://")) {
		bad("base URL %q: want http://host:port or https://host:port", c.BaseURL)
	}
	if c.Endpoint != EndpointCompletions && c.Endpoint != EndpointChat {
		bad("endpoint %q: want completions or chat", c.Endpoint)
	}
	trace := c.Dataset == DatasetTrace
	switch {
	case trace && (c.NumPrompts < 0 || c.NumPrompts > MaxPrompts):
		bad("number of prompts of a trace replay must be between 0 (the whole trace) and %d, got %d", MaxPrompts, c.NumPrompts)
	case !trace && (c.NumPrompts < 1 || c.NumPrompts > MaxPrompts):
		bad("number of prompts must be between 1 and %d, got %d", MaxPrompts, c.NumPrompts)
	}
	switch {
	case trace && len(c.Rates) > 0:
		bad("a request rate does not apply to a trace replay: the trace's timestamps are the schedule (scale them with the time scale)")
	case !trace && len(c.Rates) == 0:
		bad("no request rate given")
	}
	for _, r := range c.Rates {
		if !(r > 0) {
			bad("request rate %v: want a positive number of requests/s or inf", float64(r))
		}
	}
	if c.MaxConcurrency < 0 {
		bad("max concurrency must not be negative (0 means no cap), got %d", c.MaxConcurrency)
	}
	if c.Warmup < 0 || c.Warmup > MaxPrompts {
		bad("warmup must be between 0 and %d, got %d", MaxPrompts, c.Warmup)
	}
	switch c.Dataset {
	case DatasetRandom:
		if c.RandomInputLen < 1 {
			bad("random input length must be at least 1 token, got %d", c.RandomInputLen)
		}
		if !(c.RandomRangeRatio >= 0 && c.RandomRangeRatio < 1) {
			bad("random range ratio must be in [0, 1), got %v", c.RandomRangeRatio)
		} else if float64(c.RandomInputLen)*(1+c.RandomRangeRatio) > MaxTokensPerRequest ||
			float64(c.RandomOutputLen)*(1+c.RandomRangeRatio) > MaxTokensPerRequest {
			bad("random lengths must stay under %d tokens", MaxTokensPerRequest)
		}
	case DatasetConversation:
	case DatasetJSONL:
		if c.DatasetPath == "" {
			bad("the jsonl dataset needs a dataset path")
		}
	case DatasetSharedPrefix:
		if c.SharedPrefixLen < 1 || c.SuffixLen < 1 || c.SharedPrefixLen+c.SuffixLen > MaxTokensPerRequest {
			bad("shared-prefix lengths must be at least 1 token each and at most %d in all, got prefix %d, suffix %d",
				MaxTokensPerRequest, c.SharedPrefixLen, c.SuffixLen)
		}
		if c.NumPrefixes < 1 || c.NumPrefixes > MaxPrefixes {
			bad("number of prefixes must be between 1 and %d, got %d", MaxPrefixes, c.NumPrefixes)
		}
	case DatasetTrace:
		if c.TracePath == "" {
			bad("the trace dataset needs a trace file")
		}
		if !(c.TraceTimeScale >= 0) || math.IsInf(c.TraceTimeScale, 1) {
			bad("trace time scale must be a positive number (0 means 1), got %v", c.TraceTimeScale)
		}
		if c.TraceStart < 0 || c.TraceDuration < 0 {
			bad("trace start and duration must not be negative, got %v and %v", c.TraceStart, c.TraceDuration)
		}
		if c.TraceBlockSize < 0 || c.TraceBlockSize > MaxTokensPerRequest {
			bad("trace block size must be between 1 and %d tokens (0: %d), got %d", MaxTokensPerRequest, DefaultTraceBlockSize, c.TraceBlockSize)
		}
		if c.MultiTurn > 1 {
			bad("multi-turn does not apply to a trace replay: each trace line is one request (its shared prefixes are in hash_ids)")
		}
	default:
		bad("dataset %q: want %s", c.Dataset, datasetNames)
	}
	if !trace && c.TracePath != "" {
		bad("a trace file is given for the %s dataset: a trace replay is the trace dataset", c.Dataset)
	}
	if c.MultiTurn < 0 || c.MultiTurn > MaxTurns {
		bad("multi-turn must be between 0 and %d turns, got %d", MaxTurns, c.MultiTurn)
	} else if c.MultiTurn > 1 && c.NumPrompts*c.MultiTurn > MaxPrompts {
		bad("%d conversations of %d turns are over %d requests", c.NumPrompts, c.MultiTurn, MaxPrompts)
	}
	if c.Dataset != DatasetConversation && !trace && (c.RandomOutputLen < 1 || c.RandomOutputLen > MaxTokensPerRequest) {
		bad("random output length must be between 1 and %d tokens, got %d", MaxTokensPerRequest, c.RandomOutputLen)
	}
	if c.SLOTTFT < 0 || c.SLOTPOT < 0 {
		bad("SLOs must not be negative (0 means none)")
	}
	if c.Timeout <= 0 {
		bad("request timeout must be positive, got %v", c.Timeout)
	}
	if len(c.ResponseFormat) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(c.ResponseFormat, &obj); err != nil || obj == nil {
			bad("response_format must be a JSON object, got %.40q", c.ResponseFormat)
		}
	}
	return errors.Join(errs...)
}

// traceTimeScale is TraceTimeScale, 0 meaning 1.
func (c *Config) traceTimeScale() float64 {
	if c.TraceTimeScale == 0 {
		return 1
	}
	return c.TraceTimeScale
}

// traceBlockSize is TraceBlockSize, 0 meaning DefaultTraceBlockSize.
func (c *Config) traceBlockSize() int {
	if c.TraceBlockSize == 0 {
		return DefaultTraceBlockSize
	}
	return c.TraceBlockSize
}

// baseURL returns BaseURL without trailing slashes and without a trailing
// "/v1".
func (c *Config) baseURL() string {
	u := strings.TrimRight(c.BaseURL, "/")
	u = strings.TrimSuffix(u, "/v1")
	return strings.TrimRight(u, "/")
}

// configJSON is the config as written to the JSON report, durations in
// milliseconds.
type configJSON struct {
	BaseURL          string          `json:"base_url"`
	Endpoint         Endpoint        `json:"endpoint"`
	Model            string          `json:"model"`
	NumPrompts       int             `json:"num_prompts"`
	RequestRates     []Rate          `json:"request_rates"`
	MaxConcurrency   int             `json:"max_concurrency"`
	Seed             uint64          `json:"seed"`
	ReusePrompts     bool            `json:"reuse_prompts,omitempty"`
	Warmup           int             `json:"warmup"`
	Dataset          DatasetKind     `json:"dataset"`
	RandomInputLen   int             `json:"random_input_len,omitempty"`
	RandomOutputLen  int             `json:"random_output_len,omitempty"`
	RandomRangeRatio float64         `json:"random_range_ratio"`
	DatasetPath      string          `json:"dataset_path,omitempty"`
	SharedPrefixLen  int             `json:"shared_prefix_len,omitempty"`
	NumPrefixes      int             `json:"num_prefixes,omitempty"`
	SuffixLen        int             `json:"suffix_len,omitempty"`
	MultiTurn        int             `json:"multi_turn,omitempty"`
	TracePath        string          `json:"trace,omitempty"`
	TraceTimeScale   float64         `json:"trace_time_scale,omitempty"`
	TraceStartS      float64         `json:"trace_start_s,omitempty"`
	TraceDurationS   float64         `json:"trace_duration_s,omitempty"`
	TraceBlockSize   int             `json:"trace_block_size,omitempty"`
	SLOTTFTMS        float64         `json:"slo_ttft_ms,omitempty"`
	SLOTPOTMS        float64         `json:"slo_tpot_ms,omitempty"`
	IgnoreEOS        bool            `json:"ignore_eos"`
	MinTokens        bool            `json:"min_tokens,omitempty"`
	ReturnTokenIDs   bool            `json:"return_token_ids"`
	ResponseFormat   json.RawMessage `json:"response_format,omitempty"`
	HonorRetryAfter  bool            `json:"honor_retry_after"`
	TimeoutS         float64         `json:"timeout_s"`
}

func (c *Config) toJSON() configJSON {
	j := configJSON{BaseURL: c.BaseURL, Endpoint: c.Endpoint, Model: c.Model, NumPrompts: c.NumPrompts,
		RequestRates: c.Rates, MaxConcurrency: c.MaxConcurrency, Seed: c.Seed, ReusePrompts: c.ReusePrompts, Warmup: c.Warmup,
		Dataset: c.Dataset, RandomInputLen: c.RandomInputLen, RandomOutputLen: c.RandomOutputLen,
		RandomRangeRatio: c.RandomRangeRatio, DatasetPath: c.DatasetPath,
		SharedPrefixLen: c.SharedPrefixLen, NumPrefixes: c.NumPrefixes, SuffixLen: c.SuffixLen, MultiTurn: c.MultiTurn,
		SLOTTFTMS: ms(c.SLOTTFT), SLOTPOTMS: ms(c.SLOTPOT), IgnoreEOS: c.IgnoreEOS,
		MinTokens: c.MinTokens, ReturnTokenIDs: c.ReturnTokenIDs, ResponseFormat: c.ResponseFormat, HonorRetryAfter: c.HonorRetryAfter, TimeoutS: c.Timeout.Seconds()}
	if c.Dataset == DatasetTrace {
		j.TracePath, j.TraceTimeScale, j.TraceBlockSize = c.TracePath, c.traceTimeScale(), c.traceBlockSize()
		j.TraceStartS, j.TraceDurationS = c.TraceStart.Seconds(), c.TraceDuration.Seconds()
	}
	return j
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// Prompt is one request of a dataset.
type Prompt struct {
	// Text is the prompt (the user message for the chat endpoint); empty
	// for a trace prompt, whose text is built when it is sent (see
	// TracePrompt).
	Text string
	// InputLen is the planned prompt length in tokens: the byte length of
	// Text (exact for the simulated model's byte tokenizer; real tokenizers
	// give fewer tokens). It is reported only when the server sends no usage.
	InputLen int
	// OutputLen is the max_tokens of the request.
	OutputLen int
	// Group is the shared-prefix dataset's prefix group in
	// [0, NumPrefixes), −1 for other datasets.
	Group int
	// History is the conversation before Text, oldest first (multi-turn
	// runs; nil otherwise).
	History []Turn
	// trace builds the text of a trace prompt (nil otherwise).
	trace *traceText
}

// message returns the prompt's text without its history: Text, or the
// text a trace prompt builds.
func (p *Prompt) message() string {
	if p.trace != nil {
		return p.trace.build()
	}
	return p.Text
}

// FullText is the prompt as the completions endpoint sends it: the
// history's messages and Text, concatenated.
func (p *Prompt) FullText() string {
	if len(p.History) == 0 {
		return p.message()
	}
	var b strings.Builder
	for _, t := range p.History {
		b.WriteString(t.User)
		b.WriteString(t.Assistant)
	}
	b.WriteString(p.message())
	return b.String()
}

// Turn is one exchange of a conversation: the user's message and the
// answer the server streamed.
type Turn struct {
	User, Assistant string
}

// RNG streams derived from Config.Seed, so that the prompts do not depend
// on the number of warmup requests and the arrivals not on the dataset.
const (
	streamDataset  = 1
	streamArrivals = 2
	streamWarmup   = 3
)

// streamRates is the first of the RNG streams of the rates after the
// first (see RateStream); the fixed streams above stay below it.
const streamRates = 1 << 32

// RateStream is the RNG stream the prompts of rate i (0-based, in the order
// run) are drawn from: the first rate's is streamDataset, each later rate's
// one of its own, so the rates of a sweep send different prompts, the same
// for a given seed.
func RateStream(i int) uint64 {
	if i <= 0 {
		return streamDataset
	}
	return streamRates + uint64(i)
}

func newRNG(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// MaxJSONLLineBytes bounds one record of a JSONL dataset, in bytes.
const MaxJSONLLineBytes = 16 << 20

// BuildDataset returns n prompts of the config's dataset. Random and
// conversation prompts are drawn from RNG stream `stream` of cfg.Seed; a
// JSONL file gives its records in file order, starting over at the first
// when it has fewer than n, and so does a trace (the window and number
// of requests cfg selects; see LoadTrace), its blocks drawn for cfg.Seed
// and stream.
func BuildDataset(cfg *Config, n int, stream uint64) ([]Prompt, error) {
	if n <= 0 {
		return nil, nil
	}
	rng := newRNG(cfg.Seed, stream)
	out := make([]Prompt, n)
	if cfg.Dataset != DatasetSharedPrefix {
		defer func() {
			for i := range out {
				out[i].Group = -1
			}
		}()
	}
	switch cfg.Dataset {
	case DatasetSharedPrefix:
		SharedPrefixPrompts(rng, out, cfg.NumPrefixes, cfg.SharedPrefixLen, cfg.SuffixLen, cfg.RandomOutputLen)
	case DatasetRandom:
		for i := range out {
			in := spreadLen(rng, cfg.RandomInputLen, cfg.RandomRangeRatio)
			out[i] = Prompt{Text: RandomText(rng, in), InputLen: in,
				OutputLen: spreadLen(rng, cfg.RandomOutputLen, cfg.RandomRangeRatio)}
		}
	case DatasetConversation:
		for i := range out {
			in, o := ConversationLengths(rng)
			out[i] = Prompt{Text: RandomText(rng, in), InputLen: in, OutputLen: o}
		}
	case DatasetJSONL:
		f, err := os.Open(cfg.DatasetPath)
		if err != nil {
			return nil, fmt.Errorf("dataset: %w", err)
		}
		defer f.Close()
		recs, err := LoadJSONL(f, n, cfg.RandomOutputLen)
		if err != nil {
			return nil, fmt.Errorf("dataset %s: %w", cfg.DatasetPath, err)
		}
		for i := range out {
			out[i] = recs[i%len(recs)]
		}
	case DatasetTrace:
		tr, err := LoadTrace(cfg)
		if err != nil {
			return nil, err
		}
		out = tr.Prompts(n, cfg.Seed, stream)
	default:
		return nil, fmt.Errorf("dataset %q: want %s", cfg.Dataset, datasetNames)
	}
	return out, nil
}

// SharedPrefixPrompts fills out with prompts of the shared-prefix dataset
// drawn from rng: groups prefixes of prefixLen tokens (random words), the
// prompts assigned to them in turn (prompt i to group i mod groups, so the
// groups differ in size by at most one) and then shuffled, each prompt its
// group's prefix followed by suffixLen unique tokens (a space, then random
// words), asking for outputLen tokens. Lengths are exact in bytes (the
// simulated model's tokens).
func SharedPrefixPrompts(rng *rand.Rand, out []Prompt, groups, prefixLen, suffixLen, outputLen int) {
	prefixes := make([]string, groups)
	for g := range prefixes {
		prefixes[g] = RandomText(rng, prefixLen)
	}
	for i, j := range rng.Perm(len(out)) {
		g := j % groups
		out[i] = Prompt{Text: prefixes[g] + " " + RandomText(rng, suffixLen-1), InputLen: prefixLen + suffixLen,
			OutputLen: outputLen, Group: g}
	}
}

// OracleHitRate is the prefix-cache hit rate a perfect placement of prompts
// would get from cold caches: every prompt but the first of its group
// finds its group's prefix cached (each prefix computed once, on the
// worker every prompt of its group is sent to), so the rate is the
// prefixes' tokens of those prompts over all prompt tokens, in planned
// tokens. It ignores page rounding (a worker caches full pages only, so it
// can do up to a page per prompt less) and reports (0, false) for prompts
// without groups.
func OracleHitRate(prompts []Prompt, prefixLen int) (float64, bool) {
	seen := map[int]bool{}
	hit, total := 0, 0
	for i := range prompts {
		p := &prompts[i]
		if p.Group < 0 {
			return 0, false
		}
		total += p.InputLen
		if seen[p.Group] {
			hit += min(prefixLen, p.InputLen)
		}
		seen[p.Group] = true
	}
	if total == 0 {
		return 0, false
	}
	return float64(hit) / float64(total), true
}

// spreadLen draws a length uniformly from the integers in
// [⌊n·(1−r)⌋, ⌊n·(1+r)⌋], at least 1 (vLLM's --random-range-ratio
// convention: the mean stays n).
func spreadLen(rng *rand.Rand, n int, r float64) int {
	lo := int(math.Floor(float64(n) * (1 - r)))
	hi := int(math.Floor(float64(n) * (1 + r)))
	lo = max(lo, 1)
	hi = max(hi, lo)
	return lo + rng.IntN(hi-lo+1)
}

// Parameters of the conversation dataset (see ConversationLengths), in
// tokens.
const (
	// ConvInputMedian and ConvInputSigma: prompt lengths are lognormal with
	// this median and this σ of the log.
	ConvInputMedian = 155.0
	ConvInputSigma  = 1.1
	// ConvOutputMedian and ConvOutputSigma: output lengths likewise.
	ConvOutputMedian = 135.0
	ConvOutputSigma  = 0.9
	// ConvMinLen, ConvMaxInput and ConvMaxTotal: the filter vLLM applies to
	// ShareGPT; a draw outside it is drawn again.
	ConvMinLen   = 4
	ConvMaxInput = 1024
	ConvMaxTotal = 2048
)

// ConversationLengths draws one (prompt, output) length pair of the
// built-in conversation dataset, in tokens. It is synthetic, ShareGPT-like:
// independent lognormal prompt (median ConvInputMedian, σ ConvInputSigma)
// and output (median ConvOutputMedian, σ ConvOutputSigma) lengths, redrawn
// until both are at least ConvMinLen, the prompt at most ConvMaxInput and
// the sum at most ConvMaxTotal (the filter vLLM's benchmark applies to
// ShareGPT). After the filter the means are about 217 prompt and 198 output
// tokens (medians 146 and 135, p90 512 and 424), in the range usually
// reported for filtered ShareGPT with a Llama tokenizer (roughly 200 of
// each per request). The parameters are chosen by hand for such means and a
// long right tail; they are not fitted to the data set.
func ConversationLengths(rng *rand.Rand) (in, out int) {
	for {
		in = int(math.Round(ConvInputMedian * math.Exp(ConvInputSigma*rng.NormFloat64())))
		out = int(math.Round(ConvOutputMedian * math.Exp(ConvOutputSigma*rng.NormFloat64())))
		if in >= ConvMinLen && out >= ConvMinLen && in <= ConvMaxInput && in+out <= ConvMaxTotal {
			return in, out
		}
	}
}

// wordList is the vocabulary of RandomText: lowercase ASCII, so every byte
// is one token of the simulated model and text never splits a UTF-8
// sequence.
const wordList = "the of and to in is that for it as was with be by on not he this are or " +
	"his from at which but have an had they you were their one all we can her has there " +
	"been if more when will would who so no time cache page token model server request " +
	"prefill decode stream latency river mountain garden window question answer story " +
	"number light music table paper"

// RandomText returns exactly n bytes of space-separated lowercase words
// drawn from rng (a word may be cut at the end).
func RandomText(rng *rand.Rand, n int) string {
	if n <= 0 {
		return ""
	}
	words := strings.Fields(wordList)
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// jsonlRecord is one line of a JSONL dataset.
type jsonlRecord struct {
	Prompt    *string `json:"prompt"`
	OutputLen *int    `json:"output_len"`
}

// LoadJSONL reads up to limit records {"prompt": "...", "output_len": N}
// from r, one JSON object per line (blank lines are skipped). A record
// without output_len (or with 0) asks for defaultOutputLen tokens. Each
// line may hold at most MaxJSONLLineBytes bytes. It fails on a malformed
// record (naming its line) and when r holds no record.
func LoadJSONL(r io.Reader, limit, defaultOutputLen int) ([]Prompt, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxJSONLLineBytes)
	var out []Prompt
	line := 0
	for len(out) < limit && sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec jsonlRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if rec.Prompt == nil || *rec.Prompt == "" {
			return nil, fmt.Errorf("line %d: want a non-empty \"prompt\" string", line)
		}
		o := defaultOutputLen
		if rec.OutputLen != nil && *rec.OutputLen != 0 {
			o = *rec.OutputLen
		}
		if o < 1 || o > MaxTokensPerRequest {
			return nil, fmt.Errorf("line %d: output_len must be between 1 and %d, got %d", line, MaxTokensPerRequest, o)
		}
		out = append(out, Prompt{Text: *rec.Prompt, InputLen: len(*rec.Prompt), OutputLen: o, Group: -1})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, MaxJSONLLineBytes)
		}
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no records")
	}
	return out, nil
}

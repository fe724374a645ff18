package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"
)

// Trace replay: the Mooncake FAST'25 traces (kvcache-ai/Mooncake,
// FAST25-release/traces/*.jsonl; the same format is read by Dynamo's
// aiperf as "mooncake_trace") are JSONL files, one request a line:
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
//
// timestamp is the arrival time in milliseconds, input_length and
// output_length are tokens, and hash_ids names each block of
// DefaultTraceBlockSize prompt tokens: equal ids are equal blocks (with
// equal prefixes, the ids being remapped chained block hashes), which is
// how the trace shows shared prefixes.

// Limits on a trace file.
const (
	// MaxTraceBytes bounds a trace file, in bytes (the largest FAST'25
	// trace is about 6 MB).
	MaxTraceBytes = 1 << 30
	// MaxTraceLineBytes bounds one line of a trace, in bytes (a line of
	// the FAST'25 traces is at most a few KiB).
	MaxTraceLineBytes = 1 << 20
	// DefaultTraceBlockSize is the tokens per hash id of the Mooncake
	// traces (their README: "The block size is 512 tokens").
	DefaultTraceBlockSize = 512
	// MaxTraceTimestampMS bounds a timestamp, in milliseconds (a year).
	MaxTraceTimestampMS = 365 * 24 * 3600 * 1000
)

// TraceRecord is one request of a trace.
type TraceRecord struct {
	// Timestamp is the arrival time, in milliseconds of the trace's clock.
	Timestamp int64
	// InputLength is the prompt length, in tokens.
	InputLength int
	// OutputLength is the max_tokens of the request.
	OutputLength int
	// HashIDs names the prompt's blocks, one per block of the trace's
	// block size, the last one possibly partial; nil when the line had
	// none (every block is then the request's own).
	HashIDs []int64
	// Line is the record's line in its file (1-based).
	Line int
}

// traceLine is a line of a trace as read. Other fields are ignored.
type traceLine struct {
	Timestamp    *json.Number `json:"timestamp"`
	InputLength  *int         `json:"input_length"`
	OutputLength *int         `json:"output_length"`
	HashIDs      *[]int64     `json:"hash_ids"`
}

// ParseTrace reads a trace from r: one JSON object a line with the fields
// timestamp (milliseconds, a non-negative integer), input_length and
// output_length (tokens, at least 1, at most MaxTokensPerRequest) and
// hash_ids (optional: one id per blockSize tokens of the prompt, so
// exactly ⌈input_length/blockSize⌉ of them). Blank lines are skipped,
// other fields ignored. Timestamps must not decrease: the trace is the
// schedule, and a trace out of order is refused rather than silently
// reordered (which would change which request shares a block with an
// earlier one). Every error names name (the file) and the line. It reads
// at most MaxTraceBytes, each line at most MaxTraceLineBytes, and fails
// when r holds no record.
func ParseTrace(r io.Reader, name string, blockSize int) ([]TraceRecord, error) {
	if blockSize < 1 || blockSize > MaxTokensPerRequest {
		return nil, fmt.Errorf("%s: block size must be between 1 and %d tokens, got %d", name, MaxTokensPerRequest, blockSize)
	}
	lr := &io.LimitedReader{R: r, N: MaxTraceBytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 64<<10), MaxTraceLineBytes)
	var out []TraceRecord
	line := 0
	var last int64
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) >= MaxPrompts {
			return nil, fmt.Errorf("%s:%d: more than %d requests", name, line, MaxPrompts)
		}
		rec, err := parseTraceLine(b, blockSize)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if len(out) > 0 && rec.Timestamp < last {
			return nil, fmt.Errorf("%s:%d: timestamp %d ms is before the previous request's %d ms: a trace must list its requests in arrival order",
				name, line, rec.Timestamp, last)
		}
		last = rec.Timestamp
		rec.Line = line
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s:%d: line longer than %d bytes", name, line+1, MaxTraceLineBytes)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxTraceBytes)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests", name)
	}
	return out, nil
}

// parseTraceLine parses and checks one non-blank line.
func parseTraceLine(b []byte, blockSize int) (TraceRecord, error) {
	var l traceLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&l); err != nil {
		return TraceRecord{}, fmt.Errorf("malformed request: %w", err)
	}
	if dec.More() {
		return TraceRecord{}, errors.New("more than one JSON value on the line")
	}
	if l.Timestamp == nil {
		return TraceRecord{}, errors.New(`missing "timestamp" (milliseconds)`)
	}
	ts, err := l.Timestamp.Int64()
	if err != nil || ts < 0 || ts > MaxTraceTimestampMS {
		return TraceRecord{}, fmt.Errorf("timestamp %s: want an integer number of milliseconds in [0, %d]", l.Timestamp, int64(MaxTraceTimestampMS))
	}
	if l.InputLength == nil || *l.InputLength < 1 || *l.InputLength > MaxTokensPerRequest {
		return TraceRecord{}, fmt.Errorf(`"input_length" must be between 1 and %d tokens, got %s`, MaxTokensPerRequest, intOrMissing(l.InputLength))
	}
	if l.OutputLength == nil || *l.OutputLength < 1 || *l.OutputLength > MaxTokensPerRequest {
		return TraceRecord{}, fmt.Errorf(`"output_length" must be between 1 and %d tokens, got %s`, MaxTokensPerRequest, intOrMissing(l.OutputLength))
	}
	rec := TraceRecord{Timestamp: ts, InputLength: *l.InputLength, OutputLength: *l.OutputLength}
	if l.HashIDs != nil {
		want := (rec.InputLength + blockSize - 1) / blockSize
		if got := len(*l.HashIDs); got != want {
			return TraceRecord{}, fmt.Errorf(`%d "hash_ids" for %d input tokens: want %d, one per block of %d tokens (is the block size right?)`,
				got, rec.InputLength, want, blockSize)
		}
		rec.HashIDs = *l.HashIDs
	}
	return rec, nil
}

func intOrMissing(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// Trace is the part of a trace a benchmark replays.
type Trace struct {
	// Path is the file it was read from.
	Path string
	// Records are the requests replayed, in arrival order.
	Records []TraceRecord
	// BlockSize is the tokens per hash id.
	BlockSize int
	// TimeScale divides the trace's arrival offsets.
	TimeScale float64
}

// SelectTrace returns the records of recs (in arrival order) that arrive
// in the window [start, start+duration) measured from the first record's
// timestamp (duration 0: to the end), at most limit of them (0: no
// limit). It fails when the window holds no record.
func SelectTrace(recs []TraceRecord, start, duration time.Duration, limit int) ([]TraceRecord, error) {
	if len(recs) == 0 {
		return nil, errors.New("the trace has no requests")
	}
	t0 := recs[0].Timestamp
	lo := t0 + start.Milliseconds()
	var out []TraceRecord
	for _, r := range recs {
		if r.Timestamp < lo {
			continue
		}
		if duration > 0 && r.Timestamp >= lo+duration.Milliseconds() {
			break
		}
		if limit > 0 && len(out) >= limit {
			break
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no request of the trace arrives from %v to %v after its first one", start, start+duration)
	}
	return out, nil
}

// LoadTrace reads cfg.TracePath (see ParseTrace) and keeps the window and
// the number of requests cfg asks for (see SelectTrace).
func LoadTrace(cfg *Config) (*Trace, error) {
	f, err := os.Open(cfg.TracePath)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > MaxTraceBytes {
		return nil, fmt.Errorf("trace %s: %d bytes, more than the %d a trace may hold", cfg.TracePath, fi.Size(), int64(MaxTraceBytes))
	}
	bs := cfg.traceBlockSize()
	recs, err := ParseTrace(f, cfg.TracePath, bs)
	if err != nil {
		return nil, fmt.Errorf("trace %w", err)
	}
	sel, err := SelectTrace(recs, cfg.TraceStart, cfg.TraceDuration, cfg.NumPrompts)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", cfg.TracePath, err)
	}
	t := &Trace{Path: cfg.TracePath, Records: sel, BlockSize: bs, TimeScale: cfg.traceTimeScale()}
	if n := len(sel); n > 1 {
		span := float64(sel[n-1].Timestamp-sel[0].Timestamp) * float64(time.Millisecond) / t.TimeScale
		if span > float64(MaxReplay) {
			return nil, fmt.Errorf("trace %s: replayed at time scale %g it would last %.3g s, more than the %s a replay may take",
				cfg.TracePath, t.TimeScale, span/float64(time.Second), MaxReplay)
		}
	}
	return t, nil
}

// MaxReplay bounds how long a trace replay may take (its span divided by
// the time scale): a scale far below 1 is a mistake, not a plan.
const MaxReplay = 7 * 24 * time.Hour

// Offsets returns the arrival offsets of the records from the run's
// start: each record's timestamp minus the first one's, divided by the
// time scale (scale 2 replays twice as fast). The first request arrives
// at 0.
func (t *Trace) Offsets() []time.Duration {
	out := make([]time.Duration, len(t.Records))
	if len(t.Records) == 0 {
		return out
	}
	t0 := t.Records[0].Timestamp
	for i, r := range t.Records {
		out[i] = time.Duration(float64(r.Timestamp-t0) * float64(time.Millisecond) / t.TimeScale)
	}
	return out
}

// Prompts returns n prompts built from the records (the records in turn,
// starting over when n is larger; n ≤ 0 means one per record), their
// blocks drawn for seed and RNG stream (see TracePrompt).
func (t *Trace) Prompts(n int, seed, stream uint64) []Prompt {
	if n <= 0 {
		n = len(t.Records)
	}
	out := make([]Prompt, n)
	for i := range out {
		out[i] = TracePrompt(&t.Records[i%len(t.Records)], t.BlockSize, seed, stream)
	}
	return out
}

// traceText is the text of a trace prompt, built when the request is
// sent: a long trace's prompts would not fit in memory all at once (the
// FAST'25 conversation trace is 145 M tokens).
type traceText struct {
	hashIDs      []int64
	inputLen     int
	blockSize    int
	seed, stream uint64
	// own is the salt of the request's own blocks when hashIDs is nil.
	own uint64
}

// build returns the prompt: block i is traceBlock(hashIDs[i]), the last
// one cut so the prompt has exactly inputLen bytes.
func (tt *traceText) build() string {
	b := make([]byte, 0, tt.inputLen)
	for i := 0; len(b) < tt.inputLen; i++ {
		var blk string
		if tt.hashIDs != nil {
			blk = traceBlock(tt.seed, tt.stream, tt.hashIDs[i], tt.blockSize)
		} else {
			blk = ownBlock(tt.seed, tt.stream, tt.own, i, tt.blockSize)
		}
		b = append(b, blk[:min(len(blk), tt.inputLen-len(b))]...)
	}
	return string(b)
}

// TracePrompt is the prompt of one trace record: exactly rec.InputLength
// bytes (tokens of the simulated model's byte tokenizer), block i being a
// deterministic text of blockSize bytes derived from (seed, stream,
// rec.HashIDs[i]) — the same id gives the same block, so a server's
// prefix cache sees the sharing the trace has — and the last block cut to
// the prompt's length. A record without hash ids gets blocks of its own
// (derived from its line). max_tokens is rec.OutputLength. The text is
// built when the request is sent (Prompt.message).
func TracePrompt(rec *TraceRecord, blockSize int, seed, stream uint64) Prompt {
	return Prompt{InputLen: rec.InputLength, OutputLen: rec.OutputLength, Group: -1,
		trace: &traceText{hashIDs: rec.HashIDs, inputLen: rec.InputLength, blockSize: blockSize,
			seed: seed, stream: stream, own: uint64(rec.Line)}}
}

// streamTraceBlocks and streamTraceOwn salt the RNG of trace blocks named
// by a hash id and of a record's own blocks, apart from each other.
const (
	streamTraceBlocks = 0x7472616365626c6b // "traceblk"
	streamTraceOwn    = 0x74726163656f776e // "traceown"
)

// traceBlock is the text of the block named id: blockSize bytes of
// RandomText from an RNG seeded by (seed, stream, id), distinct ids giving
// distinct RNG sequences.
func traceBlock(seed, stream uint64, id int64, blockSize int) string {
	rng := rand.New(rand.NewPCG(seed^mix64(stream^streamTraceBlocks), mix64(uint64(id))))
	return RandomText(rng, blockSize)
}

// ownBlock is block i of the record salted own, which has no hash ids.
func ownBlock(seed, stream, own uint64, i, blockSize int) string {
	rng := rand.New(rand.NewPCG(seed^mix64(stream^streamTraceOwn^mix64(own)), mix64(uint64(i))))
	return RandomText(rng, blockSize)
}

// mix64 is SplitMix64's finalizer (Steele, Lea and Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014): a bijection
// of uint64 that spreads nearby values apart.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// TraceStats are a replayed trace's own figures.
type TraceStats struct {
	// File is the trace file.
	File string `json:"file"`
	// Requests is the number of requests replayed.
	Requests int `json:"requests"`
	// FirstTimestampMS is the trace timestamp of the first request
	// replayed, in milliseconds.
	FirstTimestampMS int64 `json:"first_timestamp_ms"`
	// Span is from the first request's timestamp to the last one's, in
	// seconds of the trace; ReplaySpan is the same divided by TimeScale,
	// the span of the replay's arrivals.
	Span       float64 `json:"span_s"`
	ReplaySpan float64 `json:"replay_span_s"`
	// TimeScale divides the trace's arrival offsets.
	TimeScale float64 `json:"time_scale"`
	// OfferedRate is the mean arrival rate of the replay, requests per
	// second: (Requests − 1) / ReplaySpan (0 for a single request or a
	// zero span).
	OfferedRate float64 `json:"offered_rate"`
	// MeanInput and MeanOutput are the mean input_length and
	// output_length, in tokens.
	MeanInput  float64 `json:"mean_input_tokens"`
	MeanOutput float64 `json:"mean_output_tokens"`
	// BlockSize is the tokens per hash id.
	BlockSize int `json:"block_size"`
	// Blocks counts the prompts' blocks, RepeatedBlocks those that a
	// prefix cache could hold when the request arrives: the leading blocks
	// of a prompt whose hash ids an earlier request of the replay also had.
	Blocks         int `json:"blocks"`
	RepeatedBlocks int `json:"repeated_blocks"`
	// RepeatedBlockFraction is RepeatedBlocks / Blocks.
	RepeatedBlockFraction float64 `json:"repeated_block_fraction"`
	// RepeatedTokenFraction is the prompt tokens in repeated blocks over
	// all prompt tokens: the best prefix-cache hit rate possible on the
	// replay from cold caches (one cache that holds everything; the
	// summary shows it as the oracle hit rate).
	RepeatedTokenFraction float64 `json:"repeated_token_fraction"`
}

// Stats computes the trace's own figures.
func (t *Trace) Stats() TraceStats {
	s := TraceStats{File: t.Path, Requests: len(t.Records), TimeScale: t.TimeScale, BlockSize: t.BlockSize}
	if len(t.Records) == 0 {
		return s
	}
	first, last := t.Records[0].Timestamp, t.Records[len(t.Records)-1].Timestamp
	s.FirstTimestampMS = first
	s.Span = float64(last-first) / 1000
	s.ReplaySpan = s.Span / t.TimeScale
	if s.ReplaySpan > 0 {
		s.OfferedRate = float64(len(t.Records)-1) / s.ReplaySpan
	}
	seen := map[int64]bool{}
	var in, out, repTokens int
	for _, r := range t.Records {
		in += r.InputLength
		out += r.OutputLength
		nb := (r.InputLength + t.BlockSize - 1) / t.BlockSize
		s.Blocks += nb
		if r.HashIDs == nil {
			continue
		}
		for i, id := range r.HashIDs {
			if !seen[id] {
				break
			}
			s.RepeatedBlocks++
			repTokens += min(t.BlockSize, r.InputLength-i*t.BlockSize)
		}
		for _, id := range r.HashIDs {
			seen[id] = true
		}
	}
	n := float64(len(t.Records))
	s.MeanInput, s.MeanOutput = float64(in)/n, float64(out)/n
	if s.Blocks > 0 {
		s.RepeatedBlockFraction = float64(s.RepeatedBlocks) / float64(s.Blocks)
	}
	if in > 0 {
		s.RepeatedTokenFraction = float64(repTokens) / float64(in)
	}
	return s
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/openai"
)

// Error types of a failed request (Record.ErrorType). HTTP errors and
// stream error events are qualified as "<type>_<status>:<code>" and
// "<type>:<code>", the code being the OpenAI error code, else its type.
const (
	// ErrHTTP: the server answered with a status other than 200.
	ErrHTTP = "http"
	// ErrTransport: the request could not be sent or no answer came
	// (connection refused, reset before the headers).
	ErrTransport = "transport"
	// ErrTimeout: Config.Timeout passed before the stream ended.
	ErrTimeout = "timeout"
	// ErrStream: the stream carried an error event.
	ErrStream = "stream_error"
	// ErrStreamClosed: the stream ended (or the connection broke) before
	// "data: [DONE]".
	ErrStreamClosed = "stream_closed"
	// ErrBadResponse: the answer is not an OpenAI event stream (wrong
	// content type, malformed event, an event or body over the size limits).
	ErrBadResponse = "bad_response"
	// ErrCanceled: the benchmark was cancelled while the request ran.
	ErrCanceled = "canceled"
)

// Size limits on what is read from the server.
const (
	// MaxEventBytes bounds one line of an event stream, in bytes (the first
	// event may carry all prompt token ids).
	MaxEventBytes = 16 << 20
	// MaxStreamBytes bounds one response stream, in bytes.
	MaxStreamBytes = 1 << 30
	// MaxErrorBodyBytes bounds the body read from an error answer, in bytes.
	MaxErrorBodyBytes = 64 << 10
	// maxDrainBytes bounds what is read after "data: [DONE]" so the
	// connection can be reused.
	maxDrainBytes = 64 << 10
)

// Record is the measurement of one request. Durations are from the moment
// the request was sent.
type Record struct {
	// Index is the request's position in its run (0-based).
	Index int
	// Arrival is the planned arrival time, from the start of the run.
	Arrival time.Duration
	// Sent is when the request was actually sent, from the start of the
	// run (later than Arrival when it waited for a concurrency slot).
	Sent time.Duration
	// Success: a 200 answer whose stream ended with "data: [DONE]" and
	// carried no error event.
	Success bool
	// ErrorType is "" on success, else one of the Err* constants, qualified
	// for HTTP errors and stream error events (e.g. "http_503:server_error").
	ErrorType string
	// Error is the error message ("" on success).
	Error string
	// InputTokens is the prompt length in tokens: usage.prompt_tokens, or
	// the planned length when the server sent no usage.
	InputTokens int
	// OutputTokens is usage.completion_tokens, or the tokens counted in the
	// stream when the server sent no usage.
	OutputTokens int
	// PlannedOutputTokens is the max_tokens sent.
	PlannedOutputTokens int
	// UsageReported tells whether the token counts came from usage.
	UsageReported bool
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: prompt
	// tokens the server did not compute because its prefix cache held
	// them (OpenAI's field); CachedReported tells whether the server sent
	// it.
	CachedTokens   int
	CachedReported bool
	// Conversation and Turn place a multi-turn request: its conversation
	// (0-based) and its turn in it (1-based); Turn is 0 outside multi-turn
	// runs.
	Conversation, Turn int
	// answer is the streamed output text (multi-turn runs only: the next
	// turn resends it).
	answer string
	// TTFT is the time to the first event carrying output; a successful
	// request without output has TTFT = E2E.
	TTFT time.Duration
	// E2E is the time to the end of the stream ("data: [DONE]"), or to the
	// failure.
	E2E time.Duration
	// TPOT is (E2E − TTFT)/(OutputTokens − 1); 0 with fewer than 2 output
	// tokens (HasTPOT false).
	TPOT time.Duration
	// HasTPOT tells whether TPOT is defined.
	HasTPOT bool
	// ITL are the gaps between consecutive events carrying output.
	ITL []time.Duration
	// Shed: the server answered 429 (it sheds load), and the request was
	// not resent or every resend was shed too. It is not a failure: it is
	// counted apart (Summary.Shed).
	Shed bool
	// RetryAfter is the last 429's Retry-After (0 when it sent none).
	RetryAfter time.Duration
	// Resent counts the times the request was resent after a 429
	// (Config.HonorRetryAfter).
	Resent int
}

// retryAfter reads a Retry-After header: delay-seconds (RFC 9110 §10.2.3);
// an HTTP date or garbage is 0.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 24*3600 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// TPOT returns the time per output token after the first,
// (e2e − ttft)/(outputTokens − 1), and false when outputTokens < 2.
func TPOT(e2e, ttft time.Duration, outputTokens int) (time.Duration, bool) {
	if outputTokens < 2 {
		return 0, false
	}
	return (e2e - ttft) / time.Duration(outputTokens-1), true
}

// requester sends one benchmark request and measures its stream.
type requester struct {
	client *http.Client
	clock  Clock
	cfg    *Config
	url    string
	// keepAnswer collects each answer's text (Record.answer).
	keepAnswer bool
}

// body returns the JSON request body for p: always streamed with usage,
// greedy, n = 1, max_tokens = p.OutputLen, and Config.ResponseFormat as
// response_format when set. It is built from pdserve's own
// wire types, and the fields they leave null are then dropped, so that
// servers that reject null for a field they type strictly (vLLM's "n") or
// do not know a field get only what the benchmark sets.
func (q *requester) body(p Prompt) ([]byte, error) {
	maxTokens, n, temp, topP := openai.Int(p.OutputLen), openai.Int(1), 0.0, 1.0
	prompt, err := json.Marshal(p.message())
	if err != nil {
		return nil, err
	}
	sf := openai.SamplingFields{Model: q.cfg.Model, Temperature: &temp, TopP: &topP, N: &n,
		IgnoreEOS: q.cfg.IgnoreEOS, Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true},
		ReturnTokenIDs: q.cfg.ReturnTokenIDs, ResponseFormat: q.cfg.ResponseFormat}
	if q.cfg.MinTokens {
		sf.MinTokens = &maxTokens
	}
	var req any
	if q.cfg.Endpoint == EndpointChat {
		msgs := make([]openai.ChatMessage, 0, 2*len(p.History)+1)
		for _, t := range p.History {
			u, err := json.Marshal(t.User)
			if err != nil {
				return nil, err
			}
			a, err := json.Marshal(t.Assistant)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, openai.ChatMessage{Role: "user", Content: u}, openai.ChatMessage{Role: "assistant", Content: a})
		}
		req = openai.ChatCompletionRequest{SamplingFields: sf, MaxCompletionTokens: &maxTokens,
			Messages: append(msgs, openai.ChatMessage{Role: "user", Content: prompt})}
	} else {
		if len(p.History) > 0 {
			if prompt, err = json.Marshal(p.FullText()); err != nil {
				return nil, err
			}
		}
		sf.MaxTokens = &maxTokens
		req = openai.CompletionRequest{SamplingFields: sf, Prompt: prompt}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	for k, v := range fields {
		if string(v) == "null" {
			delete(fields, k)
		}
	}
	return json.Marshal(fields)
}

// errorCode names an OpenAI error by its code, else its type.
func errorCode(e *openai.Error) string {
	if e.Code != "" {
		return e.Code
	}
	if e.Type != "" {
		return e.Type
	}
	return "unknown"
}

// completionEvent and chatEvent are one event of a completions or chat
// completions stream: the wire chunk type of the endpoint plus the error
// member of an error event (kept raw: servers differ in the type of its
// code).
type completionEvent struct {
	openai.CompletionResponse
	Usage *eventUsage     `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type chatEvent struct {
	openai.ChatCompletionChunk
	Usage *eventUsage     `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// eventUsage is a stream's usage with OpenAI's prompt_tokens_details
// (cached_tokens: prompt tokens served from the prefix cache).
type eventUsage struct {
	openai.Usage
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// parsedEvent is what the measurement needs from one event.
type parsedEvent struct {
	tokens int           // output tokens carried
	text   string        // output text carried (when keepAnswer)
	usage  *eventUsage   // nil if none
	err    *openai.Error // an error event
}

func (q *requester) parse(data []byte) (parsedEvent, error) {
	var ev parsedEvent
	var rawErr json.RawMessage
	if q.cfg.Endpoint == EndpointChat {
		var c chatEvent
		if err := json.Unmarshal(data, &c); err != nil {
			return ev, err
		}
		rawErr, ev.usage = c.Error, c.Usage
		for _, ch := range c.Choices {
			switch {
			case len(ch.TokenIDs) > 0:
				ev.tokens += len(ch.TokenIDs)
			case ch.Delta.Content != nil && *ch.Delta.Content != "":
				ev.tokens++
			}
			if q.keepAnswer && ch.Delta.Content != nil {
				ev.text += *ch.Delta.Content
			}
		}
	} else {
		var c completionEvent
		if err := json.Unmarshal(data, &c); err != nil {
			return ev, err
		}
		rawErr, ev.usage = c.Error, c.Usage
		for _, ch := range c.Choices {
			switch {
			case len(ch.TokenIDs) > 0:
				ev.tokens += len(ch.TokenIDs)
			case ch.Text != "":
				ev.tokens++
			}
			if q.keepAnswer {
				ev.text += ch.Text
			}
		}
	}
	if len(rawErr) > 0 && !bytes.Equal(rawErr, []byte("null")) {
		ev.err = openai.DecodeError(http.StatusOK, data)
	}
	return ev, nil
}

// limitedReader reads at most n bytes of r and then fails with
// errTooLarge (instead of io.LimitedReader's silent EOF).
type limitedReader struct {
	r io.Reader
	n int64
}

var errTooLarge = errors.New("response stream over the size limit")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// do sends p and measures its stream. It never fails: a failure is a Record
// with an ErrorType.
func (q *requester) do(ctx context.Context, p Prompt) Record {
	rec := Record{PlannedOutputTokens: p.OutputLen, InputTokens: p.InputLen}
	var answer strings.Builder
	body, err := q.body(p)
	if err != nil {
		rec.ErrorType, rec.Error = ErrBadResponse, "encoding the request: "+err.Error()
		return rec
	}
	// start precedes the timeout's deadline, so a timed-out request's E2E
	// is never below Config.Timeout.
	start := q.clock.Now()
	rctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	newReq := func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, q.url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		return req, nil
	}

	fail := func(typ string, err error) Record {
		rec.E2E = q.clock.Now().Sub(start)
		switch {
		case ctx.Err() != nil:
			typ = ErrCanceled
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			typ, err = ErrTimeout, fmt.Errorf("no end of stream within %v: %w", q.cfg.Timeout, err)
		}
		rec.ErrorType, rec.Error = typ, err.Error()
		return rec
	}
	var resp *http.Response
	for {
		req, err := newReq()
		if err != nil {
			return fail(ErrTransport, err)
		}
		if resp, err = q.client.Do(req); err != nil {
			return fail(ErrTransport, err)
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			break
		}
		// Shed: resend after Retry-After if asked to and the request's
		// timeout leaves room, else record it as shed.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBodyBytes))
		resp.Body.Close()
		rec.RetryAfter = retryAfter(resp.Header)
		if q.cfg.HonorRetryAfter && rec.RetryAfter > 0 && rec.Resent < MaxShedRetries &&
			q.clock.Now().Add(rec.RetryAfter).Before(start.Add(q.cfg.Timeout)) {
			rec.Resent++
			if err := q.clock.Sleep(rctx, rec.RetryAfter); err != nil {
				return fail(ErrTransport, err)
			}
			continue
		}
		e := openai.DecodeError(resp.StatusCode, b)
		rec.Shed = true
		return fail(ErrHTTP+"_"+strconv.Itoa(resp.StatusCode)+":"+errorCode(e), errors.New(e.Message))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBodyBytes))
		e := openai.DecodeError(resp.StatusCode, b)
		return fail(ErrHTTP+"_"+strconv.Itoa(resp.StatusCode)+":"+errorCode(e), errors.New(e.Message))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return fail(ErrBadResponse, fmt.Errorf("content type %q, want text/event-stream", ct))
	}

	lr := &limitedReader{r: resp.Body, n: MaxStreamBytes}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), MaxEventBytes)
	var (
		data      []byte // data of the event being read
		hasData   bool
		last      time.Time
		counted   int
		gotOutput bool
		usage     *eventUsage
		done      bool
	)
	// dispatch handles one complete event; it returns a non-nil Record to
	// end the request.
	dispatch := func() *Record {
		now := q.clock.Now()
		d := data
		data, hasData = data[:0], false
		if string(bytes.TrimSpace(d)) == "[DONE]" {
			rec.E2E = now.Sub(start)
			done = true
			return nil
		}
		ev, err := q.parse(d)
		if err != nil {
			r := fail(ErrBadResponse, fmt.Errorf("malformed event: %w", err))
			return &r
		}
		if ev.err != nil {
			r := fail(ErrStream+":"+errorCode(ev.err), errors.New(ev.err.Message))
			return &r
		}
		if ev.usage != nil {
			usage = ev.usage
		}
		answer.WriteString(ev.text)
		if ev.tokens > 0 {
			if !gotOutput {
				rec.TTFT, gotOutput = now.Sub(start), true
			} else {
				rec.ITL = append(rec.ITL, now.Sub(last))
			}
			last = now
			counted += ev.tokens
		}
		return nil
	}
	for !done && sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 { // end of an event
			if hasData {
				if r := dispatch(); r != nil {
					return *r
				}
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) != "data" {
			continue // comments, event:, id:, retry:
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		if hasData {
			data = append(data, '\n')
		}
		data, hasData = append(data, value...), true
	}
	if !done && sc.Err() == nil && hasData { // a last event without its blank line
		if r := dispatch(); r != nil {
			return *r
		}
	}
	if !done {
		err := sc.Err()
		switch {
		case err == nil:
			return fail(ErrStreamClosed, errors.New("the stream ended without data: [DONE]"))
		case errors.Is(err, bufio.ErrTooLong):
			return fail(ErrBadResponse, fmt.Errorf("an event line is longer than %d bytes", MaxEventBytes))
		case errors.Is(err, errTooLarge):
			return fail(ErrBadResponse, fmt.Errorf("the stream is longer than %d bytes", MaxStreamBytes))
		}
		return fail(ErrStreamClosed, err)
	}
	// Let the connection be reused: read the end of the chunked body.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))

	rec.Success = true
	rec.OutputTokens = counted
	if usage != nil {
		rec.UsageReported = true
		rec.InputTokens, rec.OutputTokens = usage.PromptTokens, usage.CompletionTokens
		if d := usage.PromptTokensDetails; d != nil {
			rec.CachedTokens, rec.CachedReported = d.CachedTokens, true
		}
	}
	rec.answer = answer.String()
	if !gotOutput {
		rec.TTFT = rec.E2E
	}
	rec.TPOT, rec.HasTPOT = TPOT(rec.E2E, rec.TTFT, rec.OutputTokens)
	return rec
}

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// behaviour is what a client does with its request.
type behaviour int

const (
	// behaveNormal reads the whole answer.
	behaveNormal behaviour = iota
	// behaveDisconnect goes away DisconnectAfter after sending, whatever
	// it has received by then.
	behaveDisconnect
	// behaveAbortStream streams and goes away after AbortAfter tokens.
	behaveAbortStream
)

// String names the behaviour.
func (b behaviour) String() string {
	return [...]string{"normal", "disconnect", "abort-stream"}[b]
}

// reqSpec is one client request, drawn from the seed before the run.
type reqSpec struct {
	N           int // index in the run
	Chat        bool
	Stream      bool
	System      string // chat: a system message ("" for none)
	Prompt      string
	MaxTokens   int
	Seed        int64
	Temperature float64
	TopP        float64
	IgnoreEOS   bool
	Stop        []string
	// Choices is the request's n (0: not sent, one choice).
	Choices   int
	Behaviour behaviour
	// DisconnectAfter is when a behaveDisconnect client goes away.
	DisconnectAfter time.Duration
	// AbortAfter is the tokens a behaveAbortStream client reads.
	AbortAfter int
	// Think is the client's pause before sending, to pace the load.
	Think time.Duration
}

// path is the OpenAI endpoint of the request.
func (s *reqSpec) path() string {
	if s.Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// body is the request's JSON body; stream overrides s.Stream (the
// reference is asked without streaming).
func (s *reqSpec) body(stream bool) []byte {
	m := map[string]any{
		"max_tokens": s.MaxTokens, "seed": s.Seed, "temperature": s.Temperature, "top_p": s.TopP,
		"ignore_eos": s.IgnoreEOS, "return_token_ids": true, "stream": stream,
	}
	if len(s.Stop) > 0 {
		m["stop"] = s.Stop
	}
	if s.Choices > 0 {
		m["n"] = s.Choices
	}
	if s.Chat {
		var msgs []map[string]string
		if s.System != "" {
			msgs = append(msgs, map[string]string{"role": "system", "content": s.System})
		}
		m["messages"] = append(msgs, map[string]string{"role": "user", "content": s.Prompt})
	} else {
		m["prompt"] = s.Prompt
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // plain maps of strings and numbers always encode
	}
	return b
}

// String describes the request for failure messages.
func (s *reqSpec) String() string {
	return fmt.Sprintf("request #%d (%s, stream=%v, behaviour=%s, prompt %d bytes, max_tokens %d, n %d, seed %d, temperature %v, top_p %v, ignore_eos %v, stop %q)",
		s.N, s.path(), s.Stream, s.Behaviour, len(s.Prompt), s.MaxTokens, max(1, s.Choices), s.Seed, s.Temperature, s.TopP, s.IgnoreEOS, s.Stop)
}

// genOptions shape the random requests.
type genOptions struct {
	// MaxPrompt and MaxTokens bound prompt bytes and max_tokens.
	MaxPrompt, MaxTokens int
	// PDisconnect and PAbort are the shares of disconnecting and
	// mid-stream aborting clients.
	PDisconnect, PAbort float64
	// MaxThink bounds a client's pause before each request.
	MaxThink time.Duration
}

const promptLetters = "abcdefghijklmnopqrstuvwxyz ,.'ABCDEFGHIJ0123456789\n"

// genRequests draws n requests from rng.
func genRequests(rng *rand.Rand, n int, o genOptions) []*reqSpec {
	out := make([]*reqSpec, n)
	for i := range out {
		s := &reqSpec{N: i, Chat: rng.IntN(2) == 0, Stream: rng.IntN(2) == 0}
		// Prompt length: mostly short, some long (several KV chunks).
		var plen int
		switch x := rng.Float64(); {
		case x < 0.6:
			plen = 1 + rng.IntN(min(64, o.MaxPrompt))
		case x < 0.9:
			plen = 1 + rng.IntN(min(300, o.MaxPrompt))
		default:
			plen = 1 + rng.IntN(o.MaxPrompt)
		}
		var b strings.Builder
		for range plen {
			b.WriteByte(promptLetters[rng.IntN(len(promptLetters))])
		}
		s.Prompt = b.String()
		if s.Chat && rng.IntN(3) == 0 {
			s.System = "be brief"
		}
		s.MaxTokens = 1 + rng.IntN(o.MaxTokens)
		s.Seed = rng.Int64N(1 << 40)
		s.Temperature = []float64{0, 0.5, 1, 1.3}[rng.IntN(4)]
		s.TopP = []float64{1, 0.9, 0.5}[rng.IntN(3)]
		s.IgnoreEOS = rng.IntN(2) == 0
		if rng.IntN(10) == 0 {
			s.Stop = []string{string(promptLetters[rng.IntN(26)])}
		}
		if rng.IntN(6) == 0 {
			// Several choices: forks on decode over shared prompt pages.
			s.Choices = 2 + rng.IntN(3)
		}
		switch x := rng.Float64(); {
		case x < o.PDisconnect:
			s.Behaviour = behaveDisconnect
			s.DisconnectAfter = time.Duration(rng.Int64N(int64(500 * time.Millisecond)))
		case x < o.PDisconnect+o.PAbort:
			s.Behaviour = behaveAbortStream
			s.Stream = true
			s.AbortAfter = 1 + rng.IntN(max(1, s.MaxTokens))
		}
		if o.MaxThink > 0 {
			s.Think = time.Duration(rng.Int64N(int64(o.MaxThink)))
		}
		out[i] = s
	}
	return out
}

// resultKind is how a client request ended.
type resultKind int

const (
	resOK         resultKind = iota
	resError                 // an HTTP error answer
	resStreamErr             // an error event after output started
	resDisconnect            // the client went away (behaveDisconnect)
	resAborted               // the client went away mid-stream (behaveAbortStream)
	resNoAnswer              // no answer within the bound: a liveness violation
	resBroken                // anything else: a transport error, a malformed answer
)

// result is the outcome of one client request.
type result struct {
	Spec    *reqSpec
	Kind    resultKind
	Status  int
	Code    string
	Message string
	// TokenIDs are the output tokens received of each choice (all of them
	// for resOK, a prefix otherwise), Finish the finish reasons.
	TokenIDs map[int][]int32
	Finish   map[int]string
	ID       string
	Elapsed  time.Duration
	// Diag is the workers' state when a liveness bound was exceeded.
	Diag string
	// Pause is how long the client waits before its next request: the
	// answer's Retry-After, capped by client.maxPause (0: none).
	Pause time.Duration
}

// label is the result's row in the summary.
func (r *result) label() string {
	switch r.Kind {
	case resOK:
		return "ok"
	case resError:
		return fmt.Sprintf("error %d %s", r.Status, r.Code)
	case resStreamErr:
		return fmt.Sprintf("error mid-stream %s", r.Code)
	case resDisconnect:
		return "client disconnected before the end"
	case resAborted:
		return "client aborted mid-stream"
	case resNoAnswer:
		return "NO ANSWER within the bound"
	}
	return "BROKEN: " + r.Message
}

var (
	errDisconnect = errors.New("chaos client disconnects")
	errAbort      = errors.New("chaos client aborts mid-stream")
	errLiveness   = errors.New("no answer within the liveness bound")
)

// wireError is the OpenAI error object.
type wireError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Code    *string `json:"code"`
}

// wireAnswer is the part of a (chat) completion, stream event or error
// answer the tests read.
type wireAnswer struct {
	ID      string `json:"id"`
	Choices []struct {
		Index        int     `json:"index"`
		TokenIDs     []int32 `json:"token_ids"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *wireError `json:"error"`
}

// code is the error's code, or its type when it has none.
func (e *wireError) code() string {
	if e.Code != nil {
		return *e.Code
	}
	return e.Type
}

// client sends the chaos requests over its own connection pool.
type client struct {
	hc *http.Client
	// maxPause caps the pause after an answer with Retry-After (a 503
	// no_worker or draining, a 429) before the client's next request; 0
	// does not pause. A real client waits out the header (OpenAI's SDKs
	// do); one that does not turns a moment without a ready worker into
	// hundreds of instant 503s, and ends a run before its chaos schedule
	// has struck every stage.
	maxPause time.Duration
}

// newClient returns a client with its own connection pool.
func newClient() *client {
	return &client{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}}}
}

// close drops the pool's idle connections (their goroutines).
func (c *client) close() { c.hc.CloseIdleConnections() }

// do sends s to base and reads the answer as s's behaviour says. bound is
// the liveness bound; onLate, if set, is called once the bound passes
// without an answer and returns diagnostics.
func (c *client) do(base string, s *reqSpec, bound time.Duration, onLate func() string) (res result) {
	res.Spec = s
	res.TokenIDs, res.Finish = map[int][]int32{}, map[int]string{}
	choices := max(1, s.Choices)
	start := time.Now()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var diag atomic.Pointer[string]
	late := time.AfterFunc(bound, func() {
		if onLate != nil {
			d := onLate()
			diag.Store(&d)
		}
		cancel(errLiveness)
	})
	defer late.Stop()
	if s.Behaviour == behaveDisconnect {
		t := time.AfterFunc(s.DisconnectAfter, func() { cancel(errDisconnect) })
		defer t.Stop()
	}
	defer func() {
		res.Elapsed = time.Since(start)
		if d := diag.Load(); d != nil {
			res.Diag = *d
		}
	}()
	fail := func(err error) result {
		switch context.Cause(ctx) {
		case errDisconnect:
			res.Kind = resDisconnect
		case errAbort:
			res.Kind = resAborted
		case errLiveness:
			res.Kind, res.Message = resNoAnswer, err.Error()
		default:
			res.Kind, res.Message = resBroken, err.Error()
		}
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+s.path(), bytes.NewReader(s.body(s.Stream)))
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		res.Pause = min(time.Duration(secs)*time.Second, c.maxPause)
	}
	if resp.StatusCode != http.StatusOK || !s.Stream {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return fail(err)
		}
		var a wireAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			res.Kind, res.Message = resBroken, fmt.Sprintf("status %d, bad JSON %q: %v", resp.StatusCode, body, err)
			return res
		}
		switch {
		case resp.StatusCode != http.StatusOK && a.Error != nil:
			res.Kind, res.Code, res.Message = resError, a.Error.code(), a.Error.Message
		case resp.StatusCode == http.StatusOK && len(a.Choices) == choices:
			res.Kind, res.ID = resOK, a.ID
			for i, ch := range a.Choices {
				if ch.Index != i || ch.FinishReason == nil {
					res.Kind, res.Message = resBroken, fmt.Sprintf("choice %d of %q", i, body)
					return res
				}
				res.TokenIDs[i], res.Finish[i] = ch.TokenIDs, *ch.FinishReason
			}
		default:
			res.Kind, res.Message = resBroken, fmt.Sprintf("status %d, unexpected answer %q", resp.StatusCode, body)
		}
		return res
	}
	// An event stream: "data: <json>" events, then "data: [DONE]".
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var a wireAnswer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			res.Kind, res.Message = resBroken, fmt.Sprintf("bad stream event %q: %v", data, err)
			return res
		}
		if a.Error != nil {
			res.Kind, res.Code, res.Message = resStreamErr, a.Error.code(), a.Error.Message
			continue
		}
		if res.ID == "" {
			res.ID = a.ID
		}
		for _, ch := range a.Choices {
			if ch.Index < 0 || ch.Index >= choices {
				res.Kind, res.Message = resBroken, fmt.Sprintf("stream event of choice %d: %q", ch.Index, data)
				return res
			}
			res.TokenIDs[ch.Index] = append(res.TokenIDs[ch.Index], ch.TokenIDs...)
			if ch.FinishReason != nil {
				res.Finish[ch.Index] = *ch.FinishReason
			}
		}
		if s.Behaviour == behaveAbortStream && len(res.Finish) < choices && len(res.TokenIDs[0]) >= s.AbortAfter {
			cancel(errAbort)
			res.Kind = resAborted
			return res
		}
	}
	if err := sc.Err(); err != nil {
		return fail(err)
	}
	switch {
	case !done && ctx.Err() != nil:
		return fail(context.Cause(ctx))
	case !done:
		res.Kind, res.Message = resBroken, "event stream ended without [DONE]"
	case res.Kind == resStreamErr:
	case len(res.Finish) != choices:
		res.Kind, res.Message = resBroken, fmt.Sprintf("event stream ended with %d of %d choices finished", len(res.Finish), choices)
	default:
		res.Kind = resOK
	}
	return res
}

// runClients runs specs with n concurrent clients, in order of index, and
// returns the results by index. do runs one request.
func runClients(specs []*reqSpec, n int, do func(*reqSpec) result) []result {
	results := make([]result, len(specs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(specs) {
					return
				}
				if d := specs[i].Think; d > 0 {
					time.Sleep(d) // pacing drawn from the seed, not a wait for state
				}
				results[i] = do(specs[i])
				if d := results[i].Pause; d > 0 {
					time.Sleep(d) // a client's back-off after Retry-After, not a wait for state
				}
			}
		})
	}
	wg.Wait()
	return results
}

// probeAttempts is how often a fault-free probe after the chaos is tried:
// on a starved machine even a quiet KV connection can miss its heartbeats
// once, but a deployment that did not recover fails every attempt.
const probeAttempts = 3

// tally counts results by label and reports through fail each one that
// got no answer within bound (liveness) or a broken answer; it returns the
// counts and the slowest answer.
func tally(results []result, bound time.Duration, fail func(format string, args ...any)) (*counts, time.Duration) {
	labels := newCounts()
	var maxElapsed time.Duration
	for i := range results {
		r := &results[i]
		labels.add(r.label(), 1)
		maxElapsed = max(maxElapsed, r.Elapsed)
		switch r.Kind {
		case resNoAnswer:
			fail("liveness: %s got no answer within %s\nworkers then:\n%s", r.Spec, bound, r.Diag)
		case resBroken:
			fail("%s: broken answer after %s: %s", r.Spec, r.Elapsed.Round(time.Millisecond), r.Message)
		}
	}
	return labels, maxElapsed
}

// retryOK runs do until it succeeds, at most probeAttempts times, and
// returns the last result.
func retryOK(do func() result) result {
	var r result
	for range probeAttempts {
		if r = do(); r.Kind == resOK {
			break
		}
	}
	return r
}

// reference is the colocated worker's answer to every request, asked
// without streaming and without faults.
type reference struct {
	c    *client
	base string
	mu   sync.Mutex
	memo map[int]result
}

// newReference asks the colocated worker at base through c.
func newReference(c *client, base string) *reference {
	return &reference{c: c, base: base, memo: make(map[int]result)}
}

// get returns the reference answer to s.
func (r *reference) get(s *reqSpec) (result, error) {
	r.mu.Lock()
	res, ok := r.memo[s.N]
	r.mu.Unlock()
	if ok {
		return res, nil
	}
	ref := *s
	ref.Stream, ref.Behaviour = false, behaveNormal
	res = r.c.do(r.base, &ref, time.Minute, nil)
	if res.Kind != resOK {
		return res, fmt.Errorf("reference worker answered %s: %s", res.label(), res.Message)
	}
	r.mu.Lock()
	r.memo[s.N] = res
	r.mu.Unlock()
	return res, nil
}

// sameAnswer compares every result that carries output tokens with the
// reference: all of them for a success, a prefix for a request that ended
// early. It returns the counts compared and the mismatches.
func sameAnswer(ref *reference, results []result, parallel int) (full, prefix int, mismatches []string) {
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(results) {
					return
				}
				r := &results[i]
				if r.Kind != resOK && len(r.TokenIDs) == 0 {
					continue
				}
				want, err := ref.get(r.Spec)
				mu.Lock()
				switch {
				case err != nil:
					mismatches = append(mismatches, fmt.Sprintf("%s: %v", r.Spec, err))
				case r.Kind == resOK:
					full++
					for c := range max(1, r.Spec.Choices) {
						if !slices.Equal(r.TokenIDs[c], want.TokenIDs[c]) || r.Finish[c] != want.Finish[c] {
							mismatches = append(mismatches, fmt.Sprintf("%s (id %s) choice %d: got tokens %v finish %q, colocated %v finish %q",
								r.Spec, r.ID, c, r.TokenIDs[c], r.Finish[c], want.TokenIDs[c], want.Finish[c]))
						}
					}
				default:
					prefix++
					for c, got := range r.TokenIDs {
						if w := want.TokenIDs[c]; len(got) > len(w) || !slices.Equal(got, w[:len(got)]) {
							mismatches = append(mismatches, fmt.Sprintf("%s (id %s, %s) choice %d: received tokens %v are not a prefix of colocated %v",
								r.Spec, r.ID, r.label(), c, got, w))
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return full, prefix, mismatches
}

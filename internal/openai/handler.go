package openai

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	randv2 "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

// DefaultMaxBodyBytes is the default limit on a request body (4 MiB).
const DefaultMaxBodyBytes = 4 << 20

// DefaultIOTimeout is the default deadline for reading a request body and for
// each write to the client.
const DefaultIOTimeout = 30 * time.Second

// Config configures NewHandler.
type Config struct {
	// ModelName is the served model's name (required). Requests naming
	// another model get 404 model_not_found; requests without "model" are
	// served.
	ModelName string
	// Tokenizer encodes prompts and decodes output. It may be nil: then
	// only token-id prompts on /v1/completions work, text prompts, chat and
	// stop strings get a 400, and responses carry no text (use
	// return_token_ids).
	Tokenizer model.Tokenizer
	// ContextLen is the model's context length in tokens (required, ≥ 1):
	// prompt + max_tokens may not exceed it.
	ContextLen int
	// ContextNow, if set, returns the context length to apply now (the
	// router: the largest a pair of its workers offers); ContextLen stays
	// the upper bound. It is /v1/models' max_model_len, the bound of
	// prompt + max_tokens, and what a default max_tokens fills (see
	// GenerateRequest.MaxTokensDefault).
	ContextNow func() int
	// VocabSize, if positive, bounds the token ids a prompt may carry
	// (0 ≤ id < VocabSize); 0 leaves that check to the engine.
	VocabSize int
	// APIOptions are the server's choices of what the API offers.
	APIOptions
	// EOS lists the model's end-of-sequence token ids. The engine stops at
	// them; the front end only keeps them out of the output text.
	EOS []int32
	// MaxBodyBytes limits a request body (default DefaultMaxBodyBytes);
	// larger bodies get 413.
	MaxBodyBytes int64
	// Engine runs the requests (required).
	Engine Engine
	// Logger receives one line per failed request (and per finished
	// request at debug level); default: discard.
	Logger *slog.Logger
	// Now gives the "created" time of responses and of the model card;
	// default time.Now. Network deadlines always use the wall clock.
	Now func() time.Time
	// NewRID mints request ids; default 32 random hex characters.
	NewRID func() string
	// IOTimeout is the deadline for reading a request body and for each
	// write to the client (default DefaultIOTimeout; negative: none), so a
	// client that stops reading cannot pin a request.
	IOTimeout time.Duration
	// OnAnswer, if set, is called once per request when it has been
	// answered, with its endpoint (EndpointCompletions, EndpointChat,
	// EndpointModels or EndpointOther), the HTTP status (499 when the
	// client went away before an answer) and the error code ("" on
	// success; the code of the error event for a stream that failed
	// after its 200), so that every answer — rejections included — can be
	// counted.
	OnAnswer func(endpoint string, status int, code string)
	// Admit, if set, is asked before a generation request's body is read
	// (before parsing, tokenizing and templating): an error it returns is
	// the answer (e.g. the engine's 429 when it is overloaded), so that a
	// request that will be refused costs little. The engine must still
	// refuse what it cannot serve; Admit only answers earlier.
	Admit func() error
	// OnRefuse, if set, is called for a generation request the front end
	// answers with e before the engine took it (a malformed header or
	// body, Admit's refusal), with its id and when it arrived, so the
	// engine can account for it as for the requests it takes (a trace's
	// span: ctx carries the client's trace context).
	OnRefuse func(ctx context.Context, rid string, received time.Time, e *Error)
}

// APIOptions are a server's choices of what its OpenAI API offers
// (command-line flags, the same on the router and a colocated worker).
type APIOptions struct {
	// MaxLogprobs bounds logprobs, top_logprobs and prompt_logprobs
	// (vLLM's --max-logprobs): 0 means DefaultMaxLogprobs; at most
	// model.MaxLogprobs.
	MaxLogprobs int
	// LogprobsMode is the distribution logprobs are of (vLLM's
	// --logprobs-mode): the model's by default.
	LogprobsMode model.LogprobsMode
	// TrustRequestChatTemplate accepts a chat request's chat_template
	// (vLLM's --trust-request-chat-template). A template is a program the
	// server runs, with no bound on its time or memory: without this flag
	// the field is refused.
	TrustRequestChatTemplate bool
	// ToolCallParser parses the calls of tool_choice auto out of the
	// model's text (vLLM's --tool-call-parser): one of ToolCallParsers,
	// "none" (the text is content), or "auto" or "" (chosen from the chat
	// template, ToolCallParserFor).
	ToolCallParser string
	// ReasoningParser splits reasoning off chat answers into
	// reasoning_content (vLLM's --reasoning-parser): one of
	// ReasoningParsers, or "" or "none" (off).
	ReasoningParser string
	// AnyPropertyOrder lets the members of JSON objects constrained by a
	// JSON Schema come in any order (grammar.Spec.AnyPropertyOrder);
	// by default they come in the schema's order, as llguidance documents
	// and OpenAI's strict mode writes them.
	AnyPropertyOrder bool
}

// HeaderRequestID is the header that carries a request's id: a client's
// X-Request-Id is the request's id end to end (the router's and workers'
// logs and /debug/requests, the response's id "cmpl-<id>"), and every answer
// carries the id back in it, the one minted when the client sent none.
const HeaderRequestID = "X-Request-Id"

// MaxRequestIDBytes bounds a client's X-Request-Id: the router appends up to
// 16 bytes ("-g<gen>", "-c<choice>") within workerapi's 256-byte rid bound.
const MaxRequestIDBytes = 128

// requestID validates a client's X-Request-Id: 1 to MaxRequestIDBytes of
// letters, digits and ._:@+=~- (no space, no slash: it names a path of
// /debug/requests).
func requestID(id string) error {
	if id == "" || len(id) > MaxRequestIDBytes {
		return fmt.Errorf("X-Request-Id must be 1 to %d bytes, got %d", MaxRequestIDBytes, len(id))
	}
	if id == "." || id == ".." {
		return fmt.Errorf("X-Request-Id %q would name no request in /debug/requests/{id}", id)
	}
	for i, c := range id {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("._:@+=~-", c)) {
			return fmt.Errorf("X-Request-Id may hold letters, digits and ._:@+=~- only, got %q at byte %d", c, i)
		}
	}
	return nil
}

// Server-Timing metric names of an answer (W3C Server Timing, durations in
// milliseconds), the server's share of the request's latency as the front
// end saw it, so a client sees a router's overhead without a tracer:
//
//   - admit: the early admission check, before the body is read;
//   - parse: reading, validating and tokenizing the body;
//   - pick: the engine taking the request (a router's admission and pair
//     pick, its legs sent; a worker's queueing of it);
//   - legs: from then to the answer's first byte (streamed: the first
//     output; otherwise the whole answer): the workers' time.
const (
	ServerTimingAdmit = "admit"
	ServerTimingParse = "parse"
	ServerTimingPick  = "pick"
	ServerTimingLegs  = "legs"
)

// serverTiming is when the front end reached each step of a request, for
// its Server-Timing header.
type serverTiming struct {
	received, admitted, parsed, picked time.Time
}

// header is the Server-Timing value of an answer whose first byte goes
// out at now.
func (st *serverTiming) header(now time.Time) string {
	ms := func(from, to time.Time) string {
		if from.IsZero() || to.IsZero() {
			return "0.000"
		}
		return strconv.FormatFloat(float64(to.Sub(from).Microseconds())/1000, 'f', 3, 64)
	}
	return ServerTimingAdmit + ";dur=" + ms(st.received, st.admitted) + ", " + ServerTimingParse + ";dur=" + ms(st.admitted, st.parsed) +
		", " + ServerTimingPick + ";dur=" + ms(st.parsed, st.picked) + ", " + ServerTimingLegs + ";dur=" + ms(st.picked, now)
}

// ServerTimingShed is the Server-Timing metric name of a 429 answer: the
// time from the front end receiving the request to writing the 429, in
// milliseconds (W3C Server Timing), e.g. `shed;dur=0.153`.
const ServerTimingShed = "shed"

// Endpoints as OnAnswer names them.
const (
	EndpointCompletions = "completions"
	EndpointChat        = "chat.completions"
	EndpointModels      = "models"
	EndpointOther       = "other"
)

// answerWriter records the status and error code of an answer for
// Config.OnAnswer.
type answerWriter struct {
	http.ResponseWriter
	status int
	code   string
}

func (a *answerWriter) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *answerWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines).
func (a *answerWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func (a *answerWriter) noteCode(code string) {
	if a.code == "" {
		a.code = code
	}
}

// noteCode records an error code on w, if w records answers.
func noteCode(w http.ResponseWriter, code string) {
	if a, ok := w.(*answerWriter); ok {
		a.noteCode(code)
	}
}

// EndpointOf is the endpoint of a request path as OnAnswer names it.
func EndpointOf(path string) string { return endpointOf(path) }

func endpointOf(path string) string {
	switch {
	case path == "/v1/completions":
		return EndpointCompletions
	case path == "/v1/chat/completions":
		return EndpointChat
	case path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"):
		return EndpointModels
	}
	return EndpointOther
}

// handler is the http.Handler returned by NewHandler.
type handler struct {
	cfg     Config
	parser  parser
	log     *slog.Logger
	created int64 // of the model card
}

// NewHandler returns the OpenAI front end over cfg.Engine:
//
//	POST /v1/completions
//	POST /v1/chat/completions
//	GET  /v1/models
//	GET  /v1/models/{id}
//
// Any other path gets a 404 and a wrong method a 405, both with an OpenAI
// error body. It panics if cfg.Engine is nil, cfg.ModelName is empty or
// cfg.ContextLen < 1, cfg.MaxLogprobs is out of range or a parser unknown
// (APIOptions.CheckParsers) (programming errors).
func NewHandler(cfg Config) http.Handler {
	return newHandler(cfg, randv2.Uint64)
}

func newHandler(cfg Config, newSeed func() uint64) *handler {
	switch {
	case cfg.Engine == nil:
		panic("openai: Config.Engine is nil")
	case cfg.ModelName == "":
		panic("openai: Config.ModelName is empty")
	case cfg.ContextLen < 1:
		panic("openai: Config.ContextLen < 1")
	case cfg.MaxLogprobs < 0 || cfg.MaxLogprobs > model.MaxLogprobs:
		panic("openai: Config.MaxLogprobs out of range")
	case cfg.CheckParsers() != nil:
		panic("openai: " + cfg.CheckParsers().Error())
	}
	if cfg.MaxLogprobs == 0 {
		cfg.MaxLogprobs = DefaultMaxLogprobs
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewRID == nil {
		cfg.NewRID = randomRID
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	return &handler{
		cfg: cfg,
		parser: parser{modelName: cfg.ModelName, tok: cfg.Tokenizer, contextLen: cfg.ContextLen, contextNow: cfg.ContextNow,
			newSeed: newSeed, vocabSize: cfg.VocabSize, maxLogprobs: cfg.MaxLogprobs, logprobsMode: cfg.LogprobsMode,
			trustTemplate: cfg.TrustRequestChatTemplate, compiled: newCompileCache(DefaultCompileCacheEntries),
			toolParser: cfg.ToolCallParser, reasoningParser: cfg.ReasoningParser, anyOrder: cfg.AnyPropertyOrder},
		log:     cfg.Logger,
		created: cfg.Now().Unix(),
	}
}

// contextLen is the context length in force now.
func (h *handler) contextLen() int {
	if h.cfg.ContextNow != nil {
		if c := h.cfg.ContextNow(); c > 0 && c < h.cfg.ContextLen {
			return c
		}
	}
	return h.cfg.ContextLen
}

// randomRID returns 128 random bits as 32 hex characters.
func randomRID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// ServeHTTP routes by path. Model ids may contain "/", so /v1/models/{id}
// takes the rest of the path.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if h.cfg.OnAnswer != nil {
		aw := &answerWriter{ResponseWriter: w}
		w = aw
		defer func() {
			status := aw.status
			if status == 0 {
				status = StatusClientClosedRequest
			}
			h.cfg.OnAnswer(endpointOf(path), status, aw.code)
		}()
	}
	allow := func(method string) bool {
		if r.Method == method {
			return true
		}
		w.Header().Set("Allow", method)
		WriteError(w, MethodNotAllowed(r.Method, path))
		return false
	}
	switch {
	case path == "/v1/completions":
		if allow(http.MethodPost) {
			h.generate(w, r, false)
		}
	case path == "/v1/chat/completions":
		if allow(http.MethodPost) {
			h.generate(w, r, true)
		}
	case path == "/v1/models":
		if allow(http.MethodGet) {
			writeJSON(w, http.StatusOK, ModelList{Object: "list", Data: []ModelCard{h.card()}})
		}
	case strings.HasPrefix(path, "/v1/models/"):
		if allow(http.MethodGet) {
			if id := strings.TrimPrefix(path, "/v1/models/"); id != h.cfg.ModelName {
				WriteError(w, ModelNotFound(id))
				return
			}
			writeJSON(w, http.StatusOK, h.card())
		}
	default:
		WriteError(w, NotFound("Invalid URL (%s %s)", r.Method, path))
	}
}

func (h *handler) card() ModelCard {
	return ModelCard{ID: h.cfg.ModelName, Object: "model", Created: h.created, OwnedBy: "pdserve",
		MaxModelLen: h.contextLen()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(marshalJSON(v))
}

// generate serves one completion or chat completion request.
func (h *handler) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	received := time.Now() // for Server-Timing (the wall clock's monotonic reading)
	arrived := h.cfg.Now()
	ctx := r.Context()
	rc := http.NewResponseController(w)
	endpoint := "completions"
	if chat {
		endpoint = "chat.completions"
	}

	// Read and validate the body, under a size limit and a deadline.
	if h.cfg.IOTimeout > 0 {
		_ = rc.SetReadDeadline(time.Now().Add(h.cfg.IOTimeout))
		// Write deadlines are set before each write; clear the last one
		// so that it does not outlive this request on a kept-alive
		// connection.
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	// A refusal before or after the body is read keeps the connection:
	// net/http discards what is left of a small body (under the read
	// deadline) before it reads the next request, as vLLM's server keeps
	// it. Only a body that could not be read (too large, too slow) closes
	// it.
	// Every answer carries the request's id: the client's, or one minted
	// (also for a malformed one, which is refused).
	rid := r.Header.Get(HeaderRequestID)
	badID := error(nil)
	if rid == "" {
		rid = h.cfg.NewRID()
	} else if badID = requestID(rid); badID != nil {
		rid = h.cfg.NewRID()
	}
	w.Header().Set(HeaderRequestID, rid)
	// refuse answers a request the engine never took.
	refuse := func(err error) {
		e := ToError(err)
		if h.cfg.OnRefuse != nil {
			h.cfg.OnRefuse(ctx, rid, received, e)
		}
		h.failTimed(w, endpoint, rid, e, received)
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		refuse(&Error{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
			Code:    CodeUnsupportedMediaType,
			Message: fmt.Sprintf("Content-Encoding %q is not supported: send the request body uncompressed", ce)})
		return
	}
	if ct := r.Header.Get("Content-Type"); !jsonContentType(ct) {
		refuse(&Error{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
			Code:    CodeUnsupportedMediaType,
			Message: fmt.Sprintf("Content-Type %q is not supported: send the request body as application/json", ct)})
		return
	}
	if badID != nil {
		refuse(BadRequest(HeaderRequestID, "%v", badID))
		return
	}
	if h.cfg.Admit != nil {
		if err := h.cfg.Admit(); err != nil {
			refuse(err)
			return
		}
	}
	timing := serverTiming{received: received, admitted: time.Now()}
	body := http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes)
	var (
		req *request
		err error
	)
	if chat {
		req, err = h.parser.parseChat(body)
	} else {
		req, err = h.parser.parseCompletion(body)
	}
	if err != nil {
		// Keep the read deadline: net/http discards what is left of the
		// body after the answer, and a client that stopped sending must
		// not hold the connection. A body that could not be read closes
		// it.
		if st := ToError(err).Status; st == http.StatusRequestTimeout || st == http.StatusRequestEntityTooLarge {
			w.Header().Set("Connection", "close")
		}
		refuse(err)
		return
	}
	if h.cfg.IOTimeout > 0 {
		// The body is read: the deadline has done its job. (net/http
		// watches the connection for the client going away from here on.)
		_ = rc.SetReadDeadline(time.Time{})
	}

	timing.parsed = time.Now()
	gr := &GenerateRequest{
		RID:               rid,
		InputIDs:          req.promptIDs,
		MaxTokens:         req.maxTokens,
		MaxTokensDefault:  req.maxTokensDefault,
		ScorePrompt:       req.scorePrompt,
		PromptTopLogprobs: req.promptTop,
		Priority:          req.priority,
		Timeout:           req.timeout,
		Sampling:          req.sampling,
		StopTokenIDs:      req.stopTokenIDs,
		IgnoreEOS:         req.ignoreEOS,
		MinTokens:         req.minTokens,
		Constraint:        req.constraint,
		Buffered:          !req.stream && len(req.stop) == 0,
		Arrived:           arrived,
	}
	if req.bestOf > 1 {
		gr.N = req.bestOf
	}
	stream, err := h.cfg.Engine.Generate(ctx, gr)
	if err == nil && stream == nil {
		err = Internal("the engine returned no stream")
	}
	if err != nil {
		if stream != nil {
			stream.Close() // the contract says no stream with an error; release it anyway
		}
		h.failTimed(w, endpoint, rid, err, received)
		return
	}
	defer stream.Close()
	timing.picked = time.Now()

	rs := &response{
		h: h, req: req, rid: rid, created: h.cfg.Now().Unix(), received: received, timing: &timing,
		outs:  make([]*output, max(1, req.bestOf)),
		posts: make([]*chatPost, max(1, req.bestOf)),
	}
	for i := range rs.outs {
		rs.outs[i] = newOutput(h.cfg.Tokenizer, req, h.cfg.EOS)
		rs.posts[i] = newChatPost(req)
	}
	var outcome string
	if req.stream {
		outcome = rs.stream(ctx, w, rc, stream)
	} else {
		outcome = rs.collect(ctx, w, rc, stream)
	}
	h.log.Debug("request ended", "rid", rid, "endpoint", endpoint, "outcome", outcome,
		"prompt_tokens", len(req.promptIDs), "completion_tokens", rs.completionTokens(rs.outs))
}

// fail writes err as an error answer and logs it.
func (h *handler) fail(w http.ResponseWriter, endpoint, rid string, err error) {
	e := ToError(err)
	h.logError(endpoint, rid, e, "before output")
	WriteError(w, e)
}

// failTimed is fail for an answer that may be a 429: that one carries the
// time since received as Server-Timing (ServerTimingShed).
func (h *handler) failTimed(w http.ResponseWriter, endpoint, rid string, err error, received time.Time) {
	e := ToError(err)
	if e.Status == http.StatusTooManyRequests {
		ms := float64(time.Since(received).Microseconds()) / 1000
		w.Header().Set("Server-Timing", ServerTimingShed+";dur="+strconv.FormatFloat(ms, 'f', 3, 64))
	}
	h.fail(w, endpoint, rid, e)
}

func (h *handler) logError(endpoint, rid string, e *Error, when string) {
	level := slog.LevelDebug
	if e.Status >= 500 {
		level = slog.LevelWarn
	}
	attrs := []any{"endpoint", endpoint, "status", e.Status, "type", e.Type, "message", e.Message, "when", when}
	if rid != "" { // refused before a request id was minted: none to show
		attrs = append([]any{"rid", rid}, attrs...)
	}
	h.log.Log(context.Background(), level, "request failed", attrs...)
}

// response is the state of one request's answer.
type response struct {
	h       *handler
	req     *request
	rid     string
	created int64
	// outs holds each choice's output (req.bestOf of them); posts their
	// streams' reasoning and tool-call parsing (nil: text only).
	outs     []*output
	posts    []*chatPost
	received time.Time // when the front end got the request (Server-Timing)
	timing   *serverTiming
	// prompt holds the prompt's logprobs (req.scorePrompt), from the
	// engine's first chunk.
	prompt []model.PositionLogprobs
	// cached is the prompt tokens the engine's prefix cache saved.
	cached int
	// stopCalled: Stream.Stop was called.
	stopCalled bool
}

// finished reports whether every choice has finished.
func (rs *response) finished() bool {
	for _, o := range rs.outs {
		if !o.finished {
			return false
		}
	}
	return true
}

// recv reads the next chunk into its choice's output and returns the
// choice's index. It tells the engine when a stop string ended a choice:
// Stop once every choice has finished, StopChoice for one of several that
// still run.
func (rs *response) recv(ctx context.Context, stream Stream) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		err = Internal("the engine ended the stream before every choice finished")
	}
	if err != nil {
		return 0, err
	}
	if c.Index < 0 || c.Index >= len(rs.outs) {
		return 0, Internal("the engine sent choice %d of a request with %d", c.Index, len(rs.outs))
	}
	if c.PromptLogprobs != nil && rs.prompt == nil {
		if len(c.PromptLogprobs) != len(rs.req.promptIDs) {
			return 0, Internal("the engine sent %d prompt logprobs for %d prompt tokens", len(c.PromptLogprobs), len(rs.req.promptIDs))
		}
		rs.prompt = c.PromptLogprobs
	}
	if rs.req.scorePrompt && rs.prompt == nil {
		return 0, Internal("the engine sent no prompt logprobs")
	}
	rs.cached = max(rs.cached, c.CachedTokens)
	o := rs.outs[c.Index]
	wasFinished := o.finished
	o.add(c)
	switch {
	case rs.stopCalled:
	case rs.finished():
		// A choice the front end ended may still run in the engine,
		// unless StopChoice ended it there.
		for _, o := range rs.outs {
			if o.stopped && !o.choiceStopped {
				rs.stopCalled = true
				stream.Stop()
				break
			}
		}
	case !wasFinished && o.finished && o.stopped:
		if cs, ok := stream.(ChoiceStopper); ok {
			cs.StopChoice(c.Index)
			o.choiceStopped = true
		}
	}
	return c.Index, nil
}

// completionTokens counts the output tokens of outs.
func (rs *response) completionTokens(outs []*output) int {
	n := 0
	for _, o := range outs {
		n += len(o.ids)
	}
	return n
}

// usage counts the prompt once and the output tokens of the choices
// returned.
func (rs *response) usage(outs []*output) *Usage {
	p, c := len(rs.req.promptIDs), rs.completionTokens(outs)
	return &Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: min(rs.cached, p)}}
}

// continuousUsage is the usage so far for a chunk when the client asked
// for it in every chunk (vLLM's stream_options.continuous_usage_stats),
// else nil.
func (rs *response) continuousUsage() *Usage {
	if !rs.req.continuousUsage {
		return nil
	}
	return rs.usage(rs.outs)
}

func (rs *response) endpoint() string {
	if rs.req.chat {
		return "chat.completions"
	}
	return "completions"
}

// tokenIDs returns ids for a token_ids field: non-nil (so it is sent, even
// empty) only with return_token_ids.
func (rs *response) tokenIDs(ids []int32) []int32 {
	if !rs.req.returnTokenIDs {
		return nil
	}
	if ids == nil {
		return []int32{}
	}
	return ids
}

// best returns the choices to answer with: all of them, or with best_of
// the n with the highest cumulative logprob (ties by index), best first.
func (rs *response) best() []*output {
	if len(rs.outs) == rs.req.n {
		return rs.outs
	}
	outs := slices.Clone(rs.outs)
	slices.SortStableFunc(outs, func(a, b *output) int { return cmp.Compare(b.cum, a.cum) })
	return outs[:rs.req.n]
}

// collect answers a request that is not streamed: one JSON body once the
// output is finished. It returns the outcome for the log.
func (rs *response) collect(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, stream Stream) string {
	for !rs.finished() {
		if _, err := rs.recv(ctx, stream); err != nil {
			if ctx.Err() != nil {
				return "client gone"
			}
			rs.h.failTimed(w, rs.endpoint(), rs.rid, err, rs.received)
			return "error"
		}
	}
	outs := rs.best()
	var body any
	if rs.req.chat {
		r := ChatCompletionResponse{
			ID: "chatcmpl-" + rs.rid, Object: "chat.completion", Created: rs.created, Model: rs.h.cfg.ModelName,
			Choices:        make([]ChatChoice, len(outs)),
			Usage:          rs.usage(outs),
			PromptTokenIDs: rs.tokenIDs(rs.req.promptIDs),
			PromptLogprobs: rs.promptLogprobs(),
		}
		for i, o := range outs {
			text, ids := o.all()
			msg, finish := rs.chatMessage(text, o.finish)
			r.Choices[i] = ChatChoice{Index: i, FinishReason: finish, TokenIDs: rs.tokenIDs(ids),
				Message: msg, Logprobs: rs.chatLogprobs(o.toks)}
		}
		body = r
	} else {
		r := CompletionResponse{
			ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created, Model: rs.h.cfg.ModelName,
			Choices: make([]CompletionChoice, len(outs)),
			Usage:   rs.usage(outs),
		}
		for i, o := range outs {
			text, ids := o.all()
			finish := o.finish
			r.Choices[i] = CompletionChoice{Index: i, Text: rs.req.echoText + text, FinishReason: &finish,
				PromptTokenIDs: rs.tokenIDs(rs.req.promptIDs), TokenIDs: rs.tokenIDs(ids),
				Logprobs: rs.completionLogprobs(o, o.toks, true), PromptLogprobs: rs.promptLogprobs()}
		}
		body = r
	}
	rs.h.setWriteDeadline(rc)
	w.Header().Set("Server-Timing", rs.timing.header(time.Now()))
	writeJSON(w, http.StatusOK, body)
	return outs[0].finish
}

func (h *handler) setWriteDeadline(rc *http.ResponseController) {
	if h.cfg.IOTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(h.cfg.IOTimeout))
	}
}

// stream answers a streamed request with Server-Sent Events. The headers are
// sent with the first chunk of output, so an error before any output is an
// ordinary error answer. It returns the outcome for the log.
func (rs *response) stream(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, stream Stream) string {
	sse := sseWriter{w: w, rc: rc, h: rs.h, timing: rs.timing}
	pending, _ := stream.(Pender)
	// gone is the outcome when the client went away; after the 200 the
	// answer is counted with the code aborted_client (before it, as a 499).
	gone := func() string {
		if sse.started {
			noteCode(w, CodeAbortedClient)
		}
		return "client gone"
	}
	for !rs.finished() {
		idx, err := rs.recv(ctx, stream)
		if err != nil {
			if ctx.Err() != nil {
				return gone()
			}
			if !sse.started {
				rs.h.failTimed(w, rs.endpoint(), rs.rid, err, rs.received)
				return "error"
			}
			// Output started: one error event, then [DONE] (as vLLM).
			e := ToError(err)
			rs.h.logError(rs.endpoint(), rs.rid, e, "during output")
			noteCode(w, codeOf(e))
			if sse.send(e.Body()) == nil {
				_ = sse.done(true)
			}
			return "error"
		}
		if !sse.started {
			sse.start()
			if rs.req.chat {
				// The assistant's role opens every choice (as OpenAI and
				// vLLM stream it), before any content.
				for i := range rs.outs {
					empty := ""
					open := ChatDelta{Role: "assistant", Content: &empty}
					if rs.req.tools.constrained() {
						open.Content = nil // the answer is calls: its content stays null
					}
					first := ChatCompletionChunk{
						ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
						Model:   rs.h.cfg.ModelName,
						Choices: []ChatChunkChoice{{Index: i, Delta: open}},
					}
					if i == 0 {
						first.PromptTokenIDs = rs.tokenIDs(rs.req.promptIDs)
					}
					if sse.event(first, i == len(rs.outs)-1) != nil {
						return gone()
					}
				}
			}
		}
		o := rs.outs[idx]
		if o.finSent {
			continue // a choice the front end ended: its later tokens are dropped
		}
		text, ids, toks := o.take()
		// A chat choice's text may hold reasoning and tool calls (posts).
		var reasoning string
		var pieces []ToolCallDelta
		post := rs.posts[idx]
		if post != nil {
			reasoning, text, pieces = post.feed(text, o.finished)
		}
		first := !o.firstSent
		if first {
			text = rs.req.echoText + text
		}
		if text == "" && reasoning == "" && len(pieces) == 0 && !o.finished && !(first && rs.req.echo && rs.req.logprobs) &&
			(len(ids) == 0 || (!rs.req.returnTokenIDs && !rs.req.logprobs)) {
			continue
		}
		o.firstSent = true
		var finish *string
		if o.finished {
			f := post.finish(o.finish)
			finish = &f
			o.finSent = true
		}
		var ev any
		if rs.req.chat {
			delta := ChatDelta{}
			if text != "" {
				delta.Content = &text
			}
			if reasoning != "" {
				delta.ReasoningContent = &reasoning
			}
			var lp *ChatLogprobs
			if len(toks) > 0 {
				lp = rs.chatLogprobs(toks)
			}
			if len(pieces) > 0 {
				// The content so far, then the calls' pieces, then the
				// finish reason.
				if err := rs.sendPieces(&sse, idx, delta, lp, ids, pieces, finish); err != nil {
					return gone()
				}
				continue
			}
			ev = ChatCompletionChunk{
				ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
				Model:   rs.h.cfg.ModelName,
				Choices: []ChatChunkChoice{{Index: idx, Delta: delta, Logprobs: lp, FinishReason: finish, TokenIDs: rs.tokenIDs(ids)}},
				Usage:   rs.continuousUsage(),
			}
		} else {
			choice := CompletionChoice{Index: idx, Text: text, FinishReason: finish, TokenIDs: rs.tokenIDs(ids),
				Logprobs: rs.completionLogprobs(o, toks, first)}
			if first {
				choice.PromptTokenIDs = rs.tokenIDs(rs.req.promptIDs)
			}
			ev = CompletionResponse{
				ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []CompletionChoice{choice}, Usage: rs.continuousUsage(),
			}
		}
		// Flush unless more output is already waiting (it follows at once)
		// or the stream is over (usage and [DONE] follow at once).
		flush := !rs.finished() && (pending == nil || !pending.Pending())
		if sse.event(ev, flush) != nil {
			return gone()
		}
	}
	if rs.req.includeUsage {
		var ev any
		if rs.req.chat {
			ev = ChatCompletionChunk{ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []ChatChunkChoice{}, Usage: rs.usage(rs.outs)}
		} else {
			ev = CompletionResponse{ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []CompletionChoice{}, Usage: rs.usage(rs.outs)}
		}
		if sse.event(ev, false) != nil { // [DONE] follows and flushes
			return gone()
		}
	}
	// The last write: flushed unless the stream's source has ended, in
	// which case the handler returns at once and the server sends it with
	// the response's end.
	ender, _ := stream.(Ender)
	if sse.done(ender == nil || !ender.Ended()) != nil {
		return gone()
	}
	return rs.outs[0].finish
}

// tokenString is how a logprob names token id: its bytes as text, or
// "token_id:N" with return_tokens_as_token_ids or without a tokenizer.
func (rs *response) tokenString(id int32) string {
	tok := rs.h.cfg.Tokenizer
	if rs.req.tokensAsIDs || tok == nil {
		return "token_id:" + strconv.FormatInt(int64(id), 10)
	}
	return string(tok.TokenBytes(id))
}

// tokenBytes is a chat logprob's bytes: the token's bytes (which may be
// part of a UTF-8 character), or nil without a tokenizer.
func (rs *response) tokenBytes(id int32) []int {
	tok := rs.h.cfg.Tokenizer
	if tok == nil {
		return nil
	}
	bs := tok.TokenBytes(id)
	out := make([]int, len(bs))
	for i, c := range bs {
		out[i] = int(c)
	}
	return out
}

// completionLogprobs is a completion choice's logprobs for toks (nil
// unless the request asked for logprobs); withPrompt puts the prompt's
// tokens first (echo). The text offsets continue from o's.
func (rs *response) completionLogprobs(o *output, toks []Token, withPrompt bool) *CompletionLogprobs {
	if !rs.req.logprobs {
		return nil
	}
	l := &CompletionLogprobs{TextOffset: []int{}, TokenLogprobs: []float32{}, Tokens: []string{}, TopLogprobs: []TopLogprobs{}}
	add := func(id int32, lp float32, top []model.TokenLogprob, first bool) {
		s := rs.tokenString(id)
		l.TextOffset = append(l.TextOffset, o.offset)
		o.offset += utf8.RuneCountInString(s)
		l.Tokens = append(l.Tokens, s)
		if first {
			l.TokenLogprobs = append(l.TokenLogprobs, float32(math.NaN()))
			l.TopLogprobs = append(l.TopLogprobs, nil)
			return
		}
		l.TokenLogprobs = append(l.TokenLogprobs, lp)
		top = top[:min(len(top), rs.req.sampling.TopLogprobs)]
		t := make(TopLogprobs, 0, len(top)+1)
		listed := false
		for _, a := range top {
			t = append(t, StringLogprob{Token: rs.tokenString(a.ID), Logprob: a.Logprob})
			listed = listed || a.ID == id
		}
		if !listed {
			t = append(t, StringLogprob{Token: s, Logprob: lp})
		}
		l.TopLogprobs = append(l.TopLogprobs, t)
	}
	if withPrompt && rs.req.echo && rs.prompt != nil {
		k := rs.req.sampling.TopLogprobs
		for j, id := range rs.req.promptIDs {
			p := rs.prompt[j]
			add(id, p.Token.Logprob, p.Top[:min(k, len(p.Top))], j == 0)
		}
	}
	for _, t := range toks {
		add(t.ID, t.Logprob, t.Top, false)
	}
	return l
}

// chatLogprobs is a chat choice's logprobs for toks (nil unless the
// request asked for logprobs).
func (rs *response) chatLogprobs(toks []Token) *ChatLogprobs {
	if !rs.req.logprobs {
		return nil
	}
	l := &ChatLogprobs{Content: make([]ChatTokenLogprob, len(toks))}
	for i, t := range toks {
		top := make([]ChatTopLogprob, min(len(t.Top), rs.req.sampling.TopLogprobs))
		for j, a := range t.Top[:len(top)] {
			top[j] = ChatTopLogprob{Token: rs.tokenString(a.ID), Logprob: a.Logprob, Bytes: rs.tokenBytes(a.ID)}
		}
		l.Content[i] = ChatTokenLogprob{Token: rs.tokenString(t.ID), Logprob: t.Logprob, Bytes: rs.tokenBytes(t.ID), TopLogprobs: top}
	}
	return l
}

// promptLogprobs is vLLM's prompt_logprobs (nil unless asked for).
func (rs *response) promptLogprobs() PromptLogprobs {
	if !rs.req.promptLogprobs || rs.prompt == nil {
		return nil
	}
	out := make(PromptLogprobs, len(rs.req.promptIDs))
	for j := 1; j < len(out); j++ {
		p := rs.prompt[j]
		pos := []PromptLogprob{{ID: p.Token.ID, Logprob: p.Token.Logprob, Rank: p.Rank, DecodedToken: rs.tokenString(p.Token.ID)}}
		for r, a := range p.Top[:min(rs.req.promptLogprobsTop, len(p.Top))] {
			if a.ID != p.Token.ID {
				pos = append(pos, PromptLogprob{ID: a.ID, Logprob: a.Logprob, Rank: int32(r + 1), DecodedToken: rs.tokenString(a.ID)})
			}
		}
		out[j] = pos
	}
	return out
}

// sseWriter writes Server-Sent Events, one "data: <json>\n\n" per event,
// flushed at once.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	h       *handler
	started bool
	buf     []byte    // the event being written, reused
	armed   time.Time // when the write deadline was last set
	timing  *serverTiming
}

// start sends the status and headers of the event stream.
func (s *sseWriter) start() {
	hd := s.w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no") // ask proxies (nginx) not to buffer
	if s.timing != nil {
		hd.Set("Server-Timing", s.timing.header(time.Now()))
	}
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

// send writes v as one event and flushes it; an error means the client is
// gone.
func (s *sseWriter) send(v any) error {
	return s.event(v, true)
}

// event writes v as one event, flushed only if flush is set (else it goes
// with the next flushed one).
func (s *sseWriter) event(v any, flush bool) error {
	buf := appendEvent(append(s.buf[:0], "data: "...), v)
	s.buf = append(buf, "\n\n"...)
	return s.write(flush)
}

// done writes the final "data: [DONE]" event, flushed if flush is set.
func (s *sseWriter) done(flush bool) error {
	s.buf = append(s.buf[:0], "data: [DONE]\n\n"...)
	return s.write(flush)
}

// write sends the event in s.buf.
func (s *sseWriter) write(flush bool) error {
	// The write deadline is moved at most once a second: a client that
	// stops reading is still cut within IOTimeout and a second.
	if now := time.Now(); s.h.cfg.IOTimeout > 0 && now.Sub(s.armed) >= time.Second {
		s.armed = now
		_ = s.rc.SetWriteDeadline(now.Add(s.h.cfg.IOTimeout))
	}
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// jsonContentType reports whether a request with Content-Type ct is read as
// JSON: application/json, in any case and with any parameters (the body
// must be UTF-8 whatever its charset says), as vLLM's OpenAI server takes
// only that; or no Content-Type at all, which vLLM refuses but which is
// unambiguous here.
func jsonContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	randv2 "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

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
	// ContextNow, if set, returns the context length to apply now (e.g.
	// the smallest of the workers'); ContextLen stays the upper bound.
	ContextNow func() int
	// VocabSize, if positive, bounds the token ids a prompt may carry
	// (0 ≤ id < VocabSize); 0 leaves that check to the engine.
	VocabSize int
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
// cfg.ContextLen < 1 (programming errors).
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
			newSeed: newSeed, vocabSize: cfg.VocabSize},
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
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		h.fail(w, endpoint, "", &Error{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
			Code:    CodeUnsupportedMediaType,
			Message: fmt.Sprintf("Content-Encoding %q is not supported: send the request body uncompressed", ce)})
		return
	}
	if ct := r.Header.Get("Content-Type"); !jsonContentType(ct) {
		h.fail(w, endpoint, "", &Error{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
			Code:    CodeUnsupportedMediaType,
			Message: fmt.Sprintf("Content-Type %q is not supported: send the request body as application/json", ct)})
		return
	}
	if h.cfg.Admit != nil {
		if err := h.cfg.Admit(); err != nil {
			h.failTimed(w, endpoint, "", err, received)
			return
		}
	}
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
		h.fail(w, endpoint, "", err)
		return
	}
	if h.cfg.IOTimeout > 0 {
		// The body is read: the deadline has done its job. (net/http
		// watches the connection for the client going away from here on.)
		_ = rc.SetReadDeadline(time.Time{})
	}

	rid := h.cfg.NewRID()
	gr := &GenerateRequest{
		RID:          rid,
		InputIDs:     req.promptIDs,
		MaxTokens:    req.maxTokens,
		Sampling:     req.sampling,
		StopTokenIDs: req.stopTokenIDs,
		IgnoreEOS:    req.ignoreEOS,
		MinTokens:    req.minTokens,
		Buffered:     !req.stream && len(req.stop) == 0,
		Arrived:      arrived,
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

	rs := &response{
		h: h, req: req, rid: rid, created: h.cfg.Now().Unix(), received: received,
		out: newOutput(h.cfg.Tokenizer, req, h.cfg.EOS),
	}
	var outcome string
	if req.stream {
		outcome = rs.stream(ctx, w, rc, stream)
	} else {
		outcome = rs.collect(ctx, w, rc, stream)
	}
	h.log.Debug("request ended", "rid", rid, "endpoint", endpoint, "outcome", outcome,
		"prompt_tokens", len(req.promptIDs), "completion_tokens", len(rs.out.ids))
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
	h        *handler
	req      *request
	rid      string
	created  int64
	out      *output
	received time.Time // when the front end got the request (Server-Timing)
}

// recv reads the next chunk into the output, and tells the engine to stop
// when a stop string ended the output.
func (rs *response) recv(ctx context.Context, stream Stream) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		err = Internal("the engine ended the stream without a finish reason")
	}
	if err != nil {
		return err
	}
	if rs.out.add(c) && rs.out.stopped {
		stream.Stop()
	}
	return nil
}

func (rs *response) usage() *Usage {
	p, c := len(rs.req.promptIDs), len(rs.out.ids)
	return &Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: min(rs.out.cached, p)}}
}

// continuousUsage is the usage so far for a chunk when the client asked
// for it in every chunk (vLLM's stream_options.continuous_usage_stats),
// else nil.
func (rs *response) continuousUsage() *Usage {
	if !rs.req.continuousUsage {
		return nil
	}
	return rs.usage()
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

// collect answers a request that is not streamed: one JSON body once the
// output is finished. It returns the outcome for the log.
func (rs *response) collect(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, stream Stream) string {
	for !rs.out.finished {
		if err := rs.recv(ctx, stream); err != nil {
			if ctx.Err() != nil {
				return "client gone"
			}
			rs.h.failTimed(w, rs.endpoint(), rs.rid, err, rs.received)
			return "error"
		}
	}
	text, ids := rs.out.all()
	finish := rs.out.finish
	var body any
	if rs.req.chat {
		body = ChatCompletionResponse{
			ID: "chatcmpl-" + rs.rid, Object: "chat.completion", Created: rs.created, Model: rs.h.cfg.ModelName,
			Choices: []ChatChoice{{
				Message:      ChatResponseMessage{Role: "assistant", Content: text},
				FinishReason: finish,
				TokenIDs:     rs.tokenIDs(ids),
			}},
			Usage:          rs.usage(),
			PromptTokenIDs: rs.tokenIDs(rs.req.promptIDs),
		}
	} else {
		body = CompletionResponse{
			ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created, Model: rs.h.cfg.ModelName,
			Choices: []CompletionChoice{{
				Text:           text,
				FinishReason:   &finish,
				PromptTokenIDs: rs.tokenIDs(rs.req.promptIDs),
				TokenIDs:       rs.tokenIDs(ids),
			}},
			Usage: rs.usage(),
		}
	}
	rs.h.setWriteDeadline(rc)
	writeJSON(w, http.StatusOK, body)
	return finish
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
	sse := sseWriter{w: w, rc: rc, h: rs.h}
	pending, _ := stream.(Pender)
	promptSent := false
	// gone is the outcome when the client went away; after the 200 the
	// answer is counted with the code aborted_client (before it, as a 499).
	gone := func() string {
		if sse.started {
			noteCode(w, CodeAbortedClient)
		}
		return "client gone"
	}
	for !rs.out.finished {
		if err := rs.recv(ctx, stream); err != nil {
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
				empty := ""
				first := ChatCompletionChunk{
					ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
					Model:          rs.h.cfg.ModelName,
					Choices:        []ChatChunkChoice{{Delta: ChatDelta{Role: "assistant", Content: &empty}}},
					PromptTokenIDs: rs.tokenIDs(rs.req.promptIDs),
				}
				promptSent = true
				if sse.send(first) != nil {
					return gone()
				}
			}
		}
		text, ids := rs.out.take()
		if text == "" && !rs.out.finished && (len(ids) == 0 || !rs.req.returnTokenIDs) {
			continue
		}
		var finish *string
		if rs.out.finished {
			f := rs.out.finish
			finish = &f
		}
		var ev any
		if rs.req.chat {
			delta := ChatDelta{}
			if text != "" {
				delta.Content = &text
			}
			ev = ChatCompletionChunk{
				ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
				Model:   rs.h.cfg.ModelName,
				Choices: []ChatChunkChoice{{Delta: delta, FinishReason: finish, TokenIDs: rs.tokenIDs(ids)}},
				Usage:   rs.continuousUsage(),
			}
		} else {
			choice := CompletionChoice{Text: text, FinishReason: finish, TokenIDs: rs.tokenIDs(ids)}
			if !promptSent {
				choice.PromptTokenIDs = rs.tokenIDs(rs.req.promptIDs)
				promptSent = true
			}
			ev = CompletionResponse{
				ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []CompletionChoice{choice}, Usage: rs.continuousUsage(),
			}
		}
		// Flush unless more output is already waiting (it follows at once)
		// or the stream is over (usage and [DONE] follow at once).
		flush := !rs.out.finished && (pending == nil || !pending.Pending())
		if sse.event(ev, flush) != nil {
			return gone()
		}
	}
	if rs.req.includeUsage {
		var ev any
		if rs.req.chat {
			ev = ChatCompletionChunk{ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []ChatChunkChoice{}, Usage: rs.usage()}
		} else {
			ev = CompletionResponse{ID: "cmpl-" + rs.rid, Object: "text_completion", Created: rs.created,
				Model: rs.h.cfg.ModelName, Choices: []CompletionChoice{}, Usage: rs.usage()}
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
	return rs.out.finish
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
}

// start sends the status and headers of the event stream.
func (s *sseWriter) start() {
	hd := s.w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no") // ask proxies (nginx) not to buffer
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

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Worker API paths.
const (
	PathPrefill  = "/internal/v1/prefill"
	PathDecode   = "/internal/v1/decode"
	PathGenerate = "/internal/v1/generate"
	PathAbort    = "/internal/v1/abort"
	PathInfo     = "/internal/v1/info"
)

// GenerateBody is the body of /internal/v1/prefill, /internal/v1/decode and
// /internal/v1/generate: one request leg, with token ids.
type GenerateBody struct {
	RID string `json:"rid"`
	// Room (32 hex digits) and Gen identify the KV rendezvous (PD legs only).
	Room      string  `json:"room,omitempty"`
	Gen       uint32  `json:"gen,omitempty"`
	InputIDs  []int32 `json:"input_ids"`
	MaxTokens int     `json:"max_tokens"`
	// Sampling parameters; Temperature 0 is greedy, TopP 0 means 1.
	Temperature  float32 `json:"temperature"`
	TopP         float32 `json:"top_p,omitempty"`
	TopK         int     `json:"top_k,omitempty"`
	Seed         uint64  `json:"seed"`
	StopTokenIDs []int32 `json:"stop_token_ids,omitempty"`
	IgnoreEOS    bool    `json:"ignore_eos,omitempty"`
	// PrefillKVAddr is the prefill worker's KV channel address (decode leg).
	PrefillKVAddr string `json:"prefill_kv_addr,omitempty"`
	// TimeoutMS caps the request on this worker, in milliseconds (0: the
	// worker's --max-request-time).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Buffered asks a decode or colocated leg to send its tokens in one line
	// at the end rather than as they come (the caller reads them only then).
	Buffered bool `json:"buffered,omitempty"`
}

// PrefillResult is the 200 answer of /internal/v1/prefill, sent once the
// decode worker acknowledged the KV.
type PrefillResult struct {
	RID          string  `json:"rid"`
	PromptTokens int     `json:"prompt_tokens"`
	FirstToken   int32   `json:"first_token"`
	FirstLogprob float32 `json:"first_logprob"`
}

// StreamLine is one line of the NDJSON stream of /internal/v1/decode and
// /internal/v1/generate. Lines carry tokens; the last line carries
// FinishReason (with usage) or Error.
type StreamLine struct {
	TokenIDs     []int32             `json:"token_ids,omitempty"`
	Logprobs     []float32           `json:"logprobs,omitempty"`
	FinishReason string              `json:"finish_reason,omitempty"`
	PromptTokens int                 `json:"prompt_tokens,omitempty"`
	OutputTokens int                 `json:"completion_tokens,omitempty"`
	Error        *openai.ErrorObject `json:"error,omitempty"`
	Status       int                 `json:"status,omitempty"`
}

// AbortBody is the body of /internal/v1/abort: by RID, or by Room (and Gen,
// 0 = any). Reason is "client" (default), "stop" or "peer".
type AbortBody struct {
	RID    string `json:"rid,omitempty"`
	Room   string `json:"room,omitempty"`
	Gen    uint32 `json:"gen,omitempty"`
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// maxAbortBody bounds an abort request's body; maxRIDBytes a request id.
const (
	maxAbortBody = 64 << 10
	maxRIDBytes  = 256
)

// Info is the answer of /internal/v1/info.
type Info struct {
	Role        string             `json:"role"`
	Model       string             `json:"model"`
	KVPort      int                `json:"kv_port,omitempty"`
	KVAddr      string             `json:"kv_addr,omitempty"`
	Fingerprint kvxfer.Fingerprint `json:"fingerprint"`
	ContextLen  int                `json:"context_len"`
	VocabSize   int                `json:"vocab_size"`
}

// OutcomeError maps a terminal outcome to the HTTP status and OpenAI error
// the caller sees; the outcome is carried in the error's code.
func OutcomeError(o outcome.Outcome, msg string) *openai.Error {
	status := http.StatusInternalServerError
	typ := openai.TypeServer
	switch o {
	case outcome.RejectedInvalid, outcome.RejectedCapacity:
		status, typ = http.StatusBadRequest, openai.TypeInvalidRequest
	case outcome.AbortedClient:
		status, typ = openai.StatusClientClosedRequest, openai.TypeInvalidRequest
	case outcome.TimeoutQueue, outcome.Shutdown:
		status = http.StatusServiceUnavailable
	case outcome.TimeoutBootstrap, outcome.TimeoutKVHold, outcome.TimeoutTransfer,
		outcome.TimeoutRequest:
		status = http.StatusGatewayTimeout
	case outcome.AbortedPeer, outcome.LeaseExpired, outcome.PeerLost,
		outcome.FailedTransfer:
		status = http.StatusBadGateway
	}
	return &openai.Error{Status: status, Type: typ, Message: msg, Code: o.String()}
}

func finalError(f *lifecycle.Finalize) *openai.Error {
	return OutcomeError(f.Outcome, fmt.Sprintf("%s: %s", f.Outcome, f.Err))
}

// Handler returns the worker HTTP API: the role's leg endpoint(s), abort,
// info, /health, /metrics (gathered from gatherer) and /debug/requests.
func (w *Worker) Handler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	switch w.role {
	case lifecycle.RolePrefill:
		mux.HandleFunc("POST "+PathPrefill, w.handlePrefill)
	case lifecycle.RoleDecode:
		mux.HandleFunc("POST "+PathDecode, w.handleStream)
	case lifecycle.RoleColocated:
		mux.HandleFunc("POST "+PathGenerate, w.handleStream)
	}
	mux.HandleFunc("POST "+PathAbort, w.handleAbort)
	mux.HandleFunc("GET "+PathInfo, w.handleInfo)
	mux.HandleFunc("GET /health", w.handleHealth)
	mux.HandleFunc("GET /debug/requests", w.handleRequests)
	mux.HandleFunc("GET /debug/requests/{rid}", w.handleRequest)
	if gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		openai.WriteError(rw, openai.NotFound("no route for %s %s on a %s worker", r.Method, r.URL.Path, w.role))
	})
	return mux
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(rw, err)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(append(b, '\n'))
}

// bodyReadTimeout bounds reading a worker API request body.
const bodyReadTimeout = 30 * time.Second

// readBody decodes a JSON body of at most limit bytes within
// bodyReadTimeout. On error the connection is marked to close, with the
// read deadline left in place, so a client that stopped sending cannot hold
// it.
func (w *Worker) readBody(rw http.ResponseWriter, r *http.Request, v any, limit int64) error {
	rc := http.NewResponseController(rw)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body := http.MaxBytesReader(rw, r.Body, limit)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the object")
		}
	}
	if err != nil {
		rw.Header().Set("Connection", "close")
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return openai.TooLarge(mb.Limit)
		}
		return openai.BadRequest("", "invalid JSON body: %v", err)
	}
	_ = rc.SetReadDeadline(time.Time{})
	return nil
}

// request converts a leg body into a machine request; decode legs get their
// KV connection here.
func (w *Worker) request(b *GenerateBody) (lifecycle.Request, error) {
	if len(b.RID) > maxRIDBytes {
		return lifecycle.Request{}, openai.BadRequest("rid", "rid is limited to %d bytes", maxRIDBytes)
	}
	q := lifecycle.Request{
		RID: b.RID, Gen: b.Gen, InputIDs: b.InputIDs, MaxTokens: b.MaxTokens,
		Sampling:     model.SamplingParams{Temperature: b.Temperature, TopP: b.TopP, TopK: b.TopK, Seed: b.Seed},
		StopTokenIDs: b.StopTokenIDs, IgnoreEOS: b.IgnoreEOS,
		Timeout: time.Duration(b.TimeoutMS) * time.Millisecond,
	}
	if q.Sampling.TopP == 0 {
		q.Sampling.TopP = 1
	}
	if w.role == lifecycle.RolePrefill {
		q.MaxTokens = 1
	}
	if w.role != lifecycle.RoleColocated {
		room, err := kvxfer.ParseRoom(b.Room)
		if err != nil {
			return q, openai.BadRequest("room", "%v", err)
		}
		q.Room = room
		if q.Gen == 0 {
			q.Gen = 1
		}
	}
	if w.role == lifecycle.RoleDecode {
		if b.PrefillKVAddr == "" {
			return q, openai.BadRequest("prefill_kv_addr", "decode leg needs prefill_kv_addr")
		}
		q.PeerAddr = b.PrefillKVAddr
		q.Peer = w.backend.Connect(b.PrefillKVAddr)
	}
	return q, nil
}

// submit posts an arrival and returns its waiter.
func (w *Worker) submit(q lifecycle.Request) *waiter {
	wt := newWaiter()
	w.mbox.post(item{ev: lifecycle.Arrive{Req: q}, waiter: wt})
	return wt
}

// abortOnExit aborts rid as the client's if the handler returns before the
// request ended (the caller disconnected).
func (w *Worker) abortClient(rid string) {
	w.post(lifecycle.AbortRequest{RID: rid, Reason: lifecycle.AbortClient, Detail: "caller disconnected"})
}

// arriveLeg reads a leg's body and submits it; on bad input it answers the
// error itself and returns ok false.
func (w *Worker) arriveLeg(rw http.ResponseWriter, r *http.Request) (lifecycle.Request, *waiter, bool) {
	q, wt, _, ok := w.arriveStreamLeg(rw, r)
	return q, wt, ok
}

// arriveStreamLeg is arriveLeg that also reports the leg's Buffered flag.
func (w *Worker) arriveStreamLeg(rw http.ResponseWriter, r *http.Request) (lifecycle.Request, *waiter, bool, bool) {
	var b GenerateBody
	if err := w.readBody(rw, r, &b, w.cfg.MaxBodyBytes); err != nil {
		openai.WriteError(rw, err)
		return lifecycle.Request{}, nil, false, false
	}
	q, err := w.request(&b)
	if err != nil {
		openai.WriteError(rw, err)
		return lifecycle.Request{}, nil, false, false
	}
	return q, w.submit(q), b.Buffered, true
}

func (w *Worker) handlePrefill(rw http.ResponseWriter, r *http.Request) {
	q, wt, ok := w.arriveLeg(rw, r)
	if !ok {
		return
	}
	fin, err := wt.wait(r.Context())
	if err != nil {
		w.abortClient(q.RID)
		return
	}
	if fin.Outcome != outcome.OK {
		openai.WriteError(rw, finalError(fin))
		return
	}
	writeJSON(rw, http.StatusOK, PrefillResult{RID: q.RID, PromptTokens: fin.PromptTokens,
		FirstToken: fin.FirstToken.Token, FirstLogprob: fin.FirstToken.Logprob})
}

// handleStream serves a decode or colocated leg as NDJSON. The status line
// waits for the first token or the end, so an early rejection is an
// ordinary error answer.
func (w *Worker) handleStream(rw http.ResponseWriter, r *http.Request) {
	q, wt, buffered, ok := w.arriveStreamLeg(rw, r)
	if !ok {
		return
	}
	ctx := r.Context()
	rc := http.NewResponseController(rw)
	enc := json.NewEncoder(rw)
	started := false
	var held []model.SeqOutput // a buffered leg's tokens, until the end
	for {
		toks, fin, err := wt.next(ctx)
		if err != nil {
			w.abortClient(q.RID)
			return
		}
		if buffered {
			held = append(held, toks...)
			if fin == nil {
				continue
			}
			toks = held
		}
		if !started {
			if fin != nil && len(toks) == 0 && fin.Outcome != outcome.OK {
				openai.WriteError(rw, finalError(fin))
				return
			}
			rw.Header().Set("Content-Type", "application/x-ndjson")
			rw.WriteHeader(http.StatusOK)
			started = true
		}
		var line StreamLine
		for _, t := range toks {
			line.TokenIDs = append(line.TokenIDs, t.Token)
			line.Logprobs = append(line.Logprobs, t.Logprob)
		}
		if fin != nil {
			line.PromptTokens, line.OutputTokens = fin.PromptTokens, fin.OutputTokens
			if fin.Outcome == outcome.OK {
				line.FinishReason = fin.FinishReason
			} else {
				e := finalError(fin)
				body := e.Body()
				line.Error, line.Status = &body.Error, e.Status
			}
		}
		if err := enc.Encode(line); err != nil {
			w.abortClient(q.RID)
			return
		}
		_ = rc.Flush()
		if fin != nil {
			return
		}
	}
}

func (w *Worker) handleAbort(rw http.ResponseWriter, r *http.Request) {
	var b AbortBody
	if err := w.readBody(rw, r, &b, maxAbortBody); err != nil {
		openai.WriteError(rw, err)
		return
	}
	if len(b.RID) > maxRIDBytes || len(b.Detail) > 4096 {
		openai.WriteError(rw, openai.BadRequest("rid", "rid is limited to %d bytes and detail to 4096", maxRIDBytes))
		return
	}
	a := lifecycle.AbortRequest{RID: b.RID, Gen: b.Gen, Detail: b.Detail}
	if b.Room != "" {
		room, err := kvxfer.ParseRoom(b.Room)
		if err != nil {
			openai.WriteError(rw, openai.BadRequest("room", "%v", err))
			return
		}
		a.Room = room
	}
	if a.RID == "" && a.Room.IsZero() {
		openai.WriteError(rw, openai.BadRequest("rid", "abort needs rid or room"))
		return
	}
	switch b.Reason {
	case "", "client":
		a.Reason = lifecycle.AbortClient
	case "stop":
		a.Reason = lifecycle.AbortStop
	case "peer":
		a.Reason = lifecycle.AbortPeerLeg
	default:
		openai.WriteError(rw, openai.BadRequest("reason", "reason must be client, stop or peer, got %q", b.Reason))
		return
	}
	// The abort is applied on the loop before we answer, so a caller that
	// saw 200 knows the worker has it (a tombstone if the request is unknown).
	if !w.query(5*time.Second, func() { w.step(a) }) {
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer within 5s; the abort is queued and will still be applied"))
		return
	}
	writeJSON(rw, http.StatusOK, map[string]bool{"ok": true})
}

func (w *Worker) handleInfo(rw http.ResponseWriter, _ *http.Request) {
	info := Info{Role: w.role.String(), Model: w.info.Name, Fingerprint: w.Fingerprint(),
		ContextLen: w.info.ContextLen, VocabSize: w.info.VocabSize, KVAddr: w.kvAddr}
	if i := strings.LastIndexByte(w.kvAddr, ':'); i >= 0 {
		fmt.Sscanf(w.kvAddr[i+1:], "%d", &info.KVPort)
	}
	writeJSON(rw, http.StatusOK, info)
}

func (w *Worker) handleHealth(rw http.ResponseWriter, _ *http.Request) {
	if !w.query(2*time.Second, func() {}) {
		writeJSON(rw, http.StatusServiceUnavailable, map[string]string{"status": "loop not answering"})
		return
	}
	writeJSON(rw, http.StatusOK, map[string]string{"status": "ok", "role": w.role.String()})
}

func (w *Worker) handleRequests(rw http.ResponseWriter, _ *http.Request) {
	list, ok := w.Requests(5 * time.Second)
	if !ok {
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer"))
		return
	}
	writeJSON(rw, http.StatusOK, map[string]any{"role": w.role.String(), "requests": list})
}

func (w *Worker) handleRequest(rw http.ResponseWriter, r *http.Request) {
	ri, found, ok := w.Request(r.PathValue("rid"), 5*time.Second)
	switch {
	case !ok:
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer"))
	case !found:
		openai.WriteError(rw, openai.NotFound("no live request %q on this worker", r.PathValue("rid")))
	default:
		writeJSON(rw, http.StatusOK, ri)
	}
}

// ---- in-process engine for a colocated worker ----

// Generate implements openai.Engine for a colocated worker: the request runs
// on this worker, without HTTP.
func (w *Worker) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	if w.role != lifecycle.RoleColocated {
		return nil, openai.Internal("Generate needs a colocated worker, this one is %s", w.role)
	}
	q := lifecycle.Request{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens, Sampling: g.Sampling,
		StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS}
	return &localStream{w: w, rid: g.RID, ctx: ctx, wt: w.submit(q)}, nil
}

type localStream struct {
	w        *Worker
	rid      string
	ctx      context.Context
	wt       *waiter
	finished bool
	stopped  bool
	pending  *lifecycle.Finalize
}

func (s *localStream) Recv() (openai.Chunk, error) {
	if s.pending != nil {
		fin := s.pending
		s.pending = nil
		s.finished = true
		if fin.Outcome != outcome.OK {
			return openai.Chunk{}, finalError(fin)
		}
		return openai.Chunk{FinishReason: fin.FinishReason}, nil
	}
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	toks, fin, err := s.wt.next(s.ctx)
	if err != nil {
		return openai.Chunk{}, err
	}
	c := openai.Chunk{Tokens: make([]openai.Token, len(toks))}
	for i, t := range toks {
		c.Tokens[i] = openai.Token{ID: t.Token, Logprob: t.Logprob}
	}
	if fin != nil {
		if fin.Outcome != outcome.OK && len(toks) > 0 {
			s.pending = fin // deliver the tokens, then the error
			return c, nil
		}
		s.finished = true
		if fin.Outcome != outcome.OK {
			return openai.Chunk{}, finalError(fin)
		}
		c.FinishReason = fin.FinishReason
	}
	return c, nil
}

func (s *localStream) Stop() {
	if !s.finished && !s.stopped {
		s.stopped = true
		s.w.post(lifecycle.AbortRequest{RID: s.rid, Reason: lifecycle.AbortStop})
	}
}

func (s *localStream) Close() {
	if !s.finished && !s.stopped {
		s.w.abortClient(s.rid)
	}
}

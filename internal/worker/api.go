package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// finalError is the error answer of a request that ended with f.
func finalError(f *lifecycle.Finalize) *workerapi.Error {
	return workerapi.OutcomeError(f.Outcome, f.Err, f.Cause)
}

// apiRole is a machine role as the worker API names it.
func apiRole(r lifecycle.Role) workerapi.Role {
	switch r {
	case lifecycle.RolePrefill:
		return workerapi.RolePrefill
	case lifecycle.RoleDecode:
		return workerapi.RoleDecode
	case lifecycle.RoleColocated:
		return workerapi.RoleColocated
	}
	return workerapi.RoleNone
}

// MinWireLogprob is the lowest logprob a worker sends: −∞ (a token the
// processed distribution excludes) and anything below go out as −9999, as
// vLLM's server clamps them (JSON has no infinity).
const MinWireLogprob = -9999

// wireLogprob is lp as sent.
func wireLogprob(lp float32) float32 {
	if !(lp >= MinWireLogprob) { // −∞, NaN and below
		return MinWireLogprob
	}
	return lp
}

func wireTop(top []model.TokenLogprob) []model.TokenLogprob {
	if top == nil {
		return nil
	}
	out := make([]model.TokenLogprob, len(top))
	for i, t := range top {
		out[i] = model.TokenLogprob{ID: t.ID, Logprob: wireLogprob(t.Logprob)}
	}
	return out
}

func wirePrompt(ps []model.PositionLogprobs) []model.PositionLogprobs {
	if ps == nil {
		return nil
	}
	out := make([]model.PositionLogprobs, len(ps))
	for i, p := range ps {
		out[i] = model.PositionLogprobs{Token: model.TokenLogprob{ID: p.Token.ID, Logprob: wireLogprob(p.Token.Logprob)},
			Rank: p.Rank, Top: wireTop(p.Top)}
	}
	return out
}

// lineWriter turns a request's output into stream lines. lastEnded is the
// last choice whose end went out (a request with n > 1).
type lineWriter struct {
	lastEnded int
}

// lines returns the stream lines of pieces, and, once the request ended
// (fin non-nil), of its end: one line per run of one choice's tokens, a
// choice's end (n > 1) as a line with More, and last the line with the
// finish reason and usage or the error (which carries the tokens that
// came just before it). With merge, every choice's tokens go in one line
// (a buffered leg's output, sent at the end).
func (lw *lineWriter) lines(ps []piece, fin *lifecycle.Finalize, merge bool) []workerapi.StreamLine {
	var out []workerapi.StreamLine
	byChoice := map[int]int{} // merge: the line of each choice
	for _, p := range ps {
		if p.prompt != nil {
			out = append(out, workerapi.StreamLine{PromptLogprobs: wirePrompt(p.prompt)})
			continue
		}
		var l *workerapi.StreamLine
		if i, ok := byChoice[p.choice]; ok && merge && out[i].FinishReason == "" {
			l = &out[i]
		} else {
			out = append(out, workerapi.StreamLine{Index: p.choice})
			l = &out[len(out)-1]
			byChoice[p.choice] = len(out) - 1
		}
		top := false
		for _, t := range p.tokens {
			top = top || t.Top != nil
		}
		for _, t := range p.tokens {
			l.TokenIDs = append(l.TokenIDs, t.Token)
			l.Logprobs = append(l.Logprobs, wireLogprob(t.Logprob))
			if top {
				l.TopLogprobs = append(l.TopLogprobs, wireTop(t.Top))
			}
		}
		if p.finish != "" {
			l.FinishReason, l.More = p.finish, true
			lw.lastEnded = p.choice
		}
	}
	if fin == nil {
		return out
	}
	// The last line carries the end: the tokens (or the end of the last
	// choice) just before it, or a line of its own.
	last := workerapi.StreamLine{Index: lw.lastEnded}
	if n := len(out); n > 0 {
		last, out = out[n-1], out[:n-1]
	}
	last.PromptTokens, last.OutputTokens, last.CachedTokens = fin.PromptTokens, fin.OutputTokens, fin.CachedTokens
	if fin.Outcome != outcome.OK {
		return append(out, workerapi.ErrorLine(last, finalError(fin)))
	}
	if last.FinishReason == "" {
		last.FinishReason = fin.FinishReason
	}
	last.More = false
	return append(out, last)
}

// requestInfo is a machine's view of a live request as the worker API shows it.
func requestInfo(ri lifecycle.RequestInfo) workerapi.RequestInfo {
	out := workerapi.RequestInfo{RID: ri.RID, Room: ri.Room, Gen: ri.Gen, Stage: ri.Stage,
		AgeSeconds: ri.AgeSeconds, InStageSecs: ri.InStageSecs, DeadlineLeft: ri.DeadlineLeft, DeadlineKind: ri.DeadlineKind,
		StageBudget: ri.StageBudget, Peer: ri.Peer, PeerAddr: ri.PeerAddr, PromptTokens: ri.PromptTokens,
		OutputTokens: ri.OutputTokens, Pages: ri.Pages, LastEvent: ri.LastEvent}
	for _, h := range ri.History {
		out.History = append(out.History, workerapi.HistoryEntry{At: h.At, What: h.What})
	}
	return out
}

// Handler returns the worker HTTP API: the role's leg endpoint(s), abort,
// info, /health, /metrics (gathered from gatherer) and /debug/requests.
func (w *Worker) Handler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	switch w.role {
	case lifecycle.RolePrefill:
		mux.HandleFunc("POST "+workerapi.PathPrefill, w.handlePrefill)
	case lifecycle.RoleDecode:
		mux.HandleFunc("POST "+workerapi.PathDecode, w.handleStream)
		// A local leg: the whole request, without a room (FeatureLocal).
		mux.HandleFunc("POST "+workerapi.PathGenerate, w.handleStream)
	case lifecycle.RoleColocated:
		mux.HandleFunc("POST "+workerapi.PathGenerate, w.handleStream)
	}
	mux.HandleFunc("POST "+workerapi.PathAbort, w.handleAbort)
	mux.HandleFunc("GET "+workerapi.PathInfo, w.handleInfo)
	mux.HandleFunc("GET "+workerapi.PathHealth, w.handleHealth)
	mux.HandleFunc("GET "+workerapi.PathLoad, w.handleLoad)
	mux.HandleFunc("GET "+workerapi.PathLive, w.handleLive)
	mux.HandleFunc("GET "+workerapi.PathRequests, w.handleRequests)
	mux.HandleFunc("GET "+workerapi.PathRequests+"/{rid}", w.handleRequest)
	if gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", openai.Unrouted(mux, "no route for %s %s on a "+w.role.String()+" worker"))
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
// it. (The deadline is the connection's, so it is on the wall clock.)
func (w *Worker) readBody(rw http.ResponseWriter, r *http.Request, v any, limit int64) error {
	rc := http.NewResponseController(rw)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body := http.MaxBytesReader(rw, r.Body, limit)
	n := r.ContentLength
	if n > limit {
		n = -1 // MaxBytesReader refuses it; allocate nothing for the claim
	}
	data, err := workerapi.ReadSized(body, n)
	if err == nil {
		// A leg body decodes itself (without reflection when it is in the
		// router's form); trailing data is an error either way.
		if u, ok := v.(json.Unmarshaler); ok {
			err = u.UnmarshalJSON(data)
		} else {
			err = json.Unmarshal(data, v)
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
// KV connection here. local is a decode worker's local leg (PathGenerate):
// the whole request, without a room or a prefill worker, served as on a
// colocated worker.
func (w *Worker) request(b *workerapi.GenerateBody, local bool) (lifecycle.Request, error) {
	if len(b.RID) > workerapi.MaxRIDBytes {
		return lifecycle.Request{}, openai.BadRequest("rid", "rid is limited to %d bytes", workerapi.MaxRIDBytes)
	}
	q := lifecycle.Request{
		RID: b.RID, Gen: b.Gen, InputIDs: b.InputIDs, MaxTokens: b.MaxTokens, Sampling: b.SamplingParams,
		StopTokenIDs: b.StopTokenIDs, IgnoreEOS: b.IgnoreEOS, MinTokens: b.MinTokens,
		N: b.N, Priority: b.Priority, Continued: b.ContinuedTokens,
	}
	if b.ContinuedTokens != 0 {
		// (Checked here for every role: a decode leg ignores
		// prompt_logprobs, and the machine never sees them; a prefill
		// leg's max_tokens becomes 1 below.)
		var e *openai.Error
		switch {
		case b.PromptLogprobs != nil:
			e = openai.BadRequest("prompt_logprobs", "%s: a continuation (continued_tokens %d) does not score its prompt: prompt_logprobs must be unset",
				outcome.RejectedInvalid, b.ContinuedTokens)
		case b.MaxTokens < 1:
			e = openai.BadRequest("max_tokens", "%s: a continuation (continued_tokens %d) generates: max_tokens must be at least 1, got %d",
				outcome.RejectedInvalid, b.ContinuedTokens, b.MaxTokens)
		}
		if e != nil {
			e.Code = outcome.RejectedInvalid.String()
			return q, e
		}
	}
	if b.Constraint != nil {
		// Both PD legs compile it (each its own cache): prefill masks the
		// first token, decode every later one, its matcher rebuilt from
		// the spec and advanced over the first token KV_DONE brings.
		if err := w.constrain(&q, *b.Constraint); err != nil {
			return q, err
		}
	}
	if b.PromptLogprobs != nil && (w.role != lifecycle.RoleDecode || local) {
		// (Both PD legs carry one body; decode does not compute the
		// prompt unless the leg is local.)
		q.ScorePrompt, q.PromptTop = true, *b.PromptLogprobs
	}
	if b.TimeoutMS > 0 {
		q.Timeout = time.Duration(min(b.TimeoutMS, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
	}
	promptOnly := b.MaxTokens == 0 && b.Room == "" && w.role == lifecycle.RolePrefill
	if w.role == lifecycle.RolePrefill && !promptOnly {
		// Prefill draws the first token only: min_tokens matters to it
		// only as "not EOS at step 0" (of this leg: a continuation's
		// MinTokens is what is left, so any left bans EOS there). An
		// invalid value passes unchanged, to be refused.
		q.MaxTokens = 1
		if q.MinTokens > 0 && q.MinTokens <= b.MaxTokens {
			q.MinTokens = 1
		}
	}
	if local {
		if b.Room != "" || b.PrefillKVAddr != "" {
			return q, openai.BadRequest("room", "a local leg (%s on a decode worker) has no room and no prefill_kv_addr", workerapi.PathGenerate)
		}
		return q, nil
	}
	if w.role != lifecycle.RoleColocated && !promptOnly {
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

// abortClient aborts rid as the client's: its caller went away before the
// request ended (the HTTP handler's context ended, or an in-process stream
// was closed early).
func (w *Worker) abortClient(rid string) {
	w.post(lifecycle.AbortRequest{RID: rid, Reason: lifecycle.AbortClient, Detail: "caller disconnected"})
}

// arriveLeg reads a leg's body and submits it; on bad input it answers the
// error itself and returns ok false. buffered is the leg's Buffered flag.
func (w *Worker) arriveLeg(rw http.ResponseWriter, r *http.Request) (q lifecycle.Request, wt *waiter, buffered, ok bool) {
	var b workerapi.GenerateBody
	if err := w.readBody(rw, r, &b, w.cfg.MaxBodyBytes); err != nil {
		openai.WriteError(rw, err)
		return lifecycle.Request{}, nil, false, false
	}
	local := w.role == lifecycle.RoleDecode && r.URL.Path == workerapi.PathGenerate
	q, err := w.request(&b, local)
	if err != nil {
		openai.WriteError(rw, err)
		return lifecycle.Request{}, nil, false, false
	}
	if d := w.cfg.AdmissionDelay; d > 0 && w.role == lifecycle.RoleDecode && !local {
		t := w.clock.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C():
		case <-r.Context().Done(): // nothing was admitted: nothing to abort
			return lifecycle.Request{}, nil, false, false
		}
	}
	return q, w.submit(q), b.Buffered, true
}

func (w *Worker) handlePrefill(rw http.ResponseWriter, r *http.Request) {
	start := w.clock.Now()
	q, wt, _, ok := w.arriveLeg(rw, r)
	if !ok {
		return
	}
	lt := w.legSpan(r, start)
	fin, err := wt.wait(r.Context())
	if err != nil {
		w.abortClient(q.RID)
		w.endLegSpan(lt, "", &q, nil, nil)
		return
	}
	w.endLegSpan(lt, "", &q, fin, nil) // prefill: no output
	if fin.Outcome != outcome.OK {
		workerapi.WriteError(rw, finalError(fin))
		return
	}
	writeJSON(rw, http.StatusOK, workerapi.PrefillResult{RID: q.RID, PromptTokens: fin.PromptTokens,
		FirstToken: fin.FirstToken.Token, FirstLogprob: fin.FirstToken.Logprob,
		PromptLogprobs: wirePrompt(fin.PromptLogprobs), CachedTokens: fin.CachedTokens})
}

// BufferedFlushInterval is the most often a buffered leg (GenerateBody.Buffered)
// sends the output it holds before its end, on the worker's clock: once
// this long has passed since its start or its last line, what it holds
// goes out (at once, or with the next output if it holds none), so that
// a router can continue the request from the tokens it has if the worker
// fails. The last line, with the end, still goes out at the end.
const BufferedFlushInterval = time.Second

// handleStream serves a decode or colocated leg as NDJSON. The status line
// waits for the first token or the end, so an early rejection is an
// ordinary error answer.
func (w *Worker) handleStream(rw http.ResponseWriter, r *http.Request) {
	start := w.clock.Now()
	q, wt, buffered, ok := w.arriveLeg(rw, r)
	if !ok {
		return
	}
	lt := w.legSpan(r, start)
	w.endLegSpan(lt, "", &q, w.streamLeg(r.Context(), rw, q.RID, wt, buffered), wt)
}

// streamLeg writes request rid's output, as wt brings it, as NDJSON lines
// to rw: as it comes, or for a buffered leg merged per choice and sent at
// most once per BufferedFlushInterval and at the end. It returns the
// request's end, or nil if the caller went away first.
func (w *Worker) streamLeg(ctx context.Context, rw http.ResponseWriter, rid string, wt *waiter, buffered bool) *lifecycle.Finalize {
	rc := http.NewResponseController(rw)
	enc := json.NewEncoder(rw)
	started := false
	var lw lineWriter
	var held []piece // a buffered leg's output, until its next line
	var flush clock.Timer
	var flushC <-chan time.Time
	due := false // a buffered leg's interval passed: what it holds goes out
	if buffered {
		flush = w.clock.NewTimer(BufferedFlushInterval)
		defer flush.Stop()
		flushC = flush.C()
	}
	for {
		ps, fin, fired, err := wt.nextOr(ctx, flushC)
		if err != nil {
			w.abortClient(rid)
			return nil
		}
		if buffered {
			held = append(held, ps...)
			due = due || fired
			if fin == nil {
				if !due || len(held) == 0 {
					continue
				}
				due = false
				flush.Reset(BufferedFlushInterval)
			}
			ps, held = held, nil
		}
		if !started {
			if fin != nil && len(ps) == 0 && fin.Outcome != outcome.OK {
				workerapi.WriteError(rw, finalError(fin))
				return fin
			}
			rw.Header().Set("Content-Type", "application/x-ndjson")
			rw.WriteHeader(http.StatusOK)
			started = true
		}
		for _, line := range lw.lines(ps, fin, buffered) {
			if err := enc.Encode(line); err != nil {
				if fin == nil { // an ended request needs no abort
					w.abortClient(rid)
				}
				return fin
			}
		}
		if fin != nil {
			// The last line goes out with the response's end (the chunked
			// terminator) in one write when the handler returns: the router
			// finds its leg ended with the line, without another read.
			return fin
		}
		_ = rc.Flush()
	}
}

// abortReason maps an API abort reason to the machine's.
func abortReason(r workerapi.AbortReason) lifecycle.AbortReason {
	switch r {
	case workerapi.AbortStop:
		return lifecycle.AbortStop
	case workerapi.AbortPeer:
		return lifecycle.AbortPeerLeg
	}
	return lifecycle.AbortClient
}

func (w *Worker) handleAbort(rw http.ResponseWriter, r *http.Request) {
	var b workerapi.AbortBody
	if err := w.readBody(rw, r, &b, workerapi.MaxAbortBytes); err != nil {
		openai.WriteError(rw, err)
		return
	}
	if err := b.Check(); err != nil {
		openai.WriteError(rw, openai.BadRequest("", "%v", err))
		return
	}
	a := lifecycle.AbortRequest{RID: b.RID, Gen: b.Gen, Reason: abortReason(b.Reason), Detail: b.Detail}
	if b.Choice != nil {
		if b.Reason != workerapi.AbortStop || *b.Choice < 0 {
			openai.WriteError(rw, openai.BadRequest("choice", "choice is for a stop of one choice (reason stop, choice ≥ 0)"))
			return
		}
		a.OneChoice, a.Choice = true, *b.Choice
	}
	if b.Reason == workerapi.AbortPeer {
		a.Cause = b.Cause
	}
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
	// The abort is applied on the loop before we answer, so a caller that
	// saw 200 knows the worker has it (a tombstone if the request is unknown).
	if !w.query(5*time.Second, func() { w.step(a) }) {
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer within 5s; the abort is queued and will still be applied"))
		return
	}
	writeJSON(rw, http.StatusOK, map[string]bool{"ok": true})
}

func (w *Worker) handleInfo(rw http.ResponseWriter, _ *http.Request) {
	info := workerapi.Info{Role: apiRole(w.role), Model: w.info.Name, Fingerprint: w.Fingerprint(),
		ContextLen: w.info.ContextLen, VocabSize: w.info.VocabSize, KVAddr: w.kvAddr, Instance: w.instance,
		Features: w.features()}
	if i := strings.LastIndexByte(w.kvAddr, ':'); i >= 0 {
		fmt.Sscanf(w.kvAddr[i+1:], "%d", &info.KVPort)
	}
	writeJSON(rw, http.StatusOK, info)
}

// features is what this worker lists in Info: every feature of this build,
// but priority only when it schedules by priority (--scheduling-policy
// priority), so that a router never sends a priority to a worker that
// would ignore it, constraints only when its model has a tokenizer
// (a grammar needs the tokens' bytes), and local legs only on a decode
// worker.
func (w *Worker) features() []string {
	var out []string
	for _, f := range workerapi.Features() {
		switch {
		case f == workerapi.FeaturePriority && !w.cfg.Machine.PriorityScheduling:
		case f == workerapi.FeatureConstraint && w.model.Tokenizer() == nil:
		case f == workerapi.FeatureLocal && w.role != lifecycle.RoleDecode:
		default:
			out = append(out, f)
		}
	}
	return out
}

// Health returns the worker's readiness and load, read on the loop (status
// HealthStuck if the loop does not answer within timeout), and a decode
// worker's KV paths (every one it knows).
func (w *Worker) Health(timeout time.Duration) workerapi.Health {
	h := w.load(timeout)
	if w.paths != nil {
		h.KVPaths = w.paths.list(nil)
	}
	return h
}

// load is Health without the KV paths.
func (w *Worker) load(timeout time.Duration) workerapi.Health {
	type loopLoad struct {
		st       lifecycle.Stats
		tokens   int
		busy     time.Duration
		computed int64
	}
	ll, ok := queryValue(w, timeout, func() loopLoad {
		return loopLoad{w.machine.Stats(w.clock.Now()), w.promptTokens, w.forwardBusy, w.promptComputed}
	})
	h := workerapi.Health{Status: workerapi.HealthOK, Role: apiRole(w.role), Instance: w.instance}
	if !ok {
		h.Status = workerapi.HealthStuck
		select {
		case <-w.stop:
			// Stopped on purpose (Shutdown), not stuck: a router still
			// checking it while the process stops sees it going away.
			h.Status = workerapi.HealthDraining
		default:
		}
		return h
	}
	st := ll.st
	if st.Draining {
		h.Status = workerapi.HealthDraining
	}
	mc := w.cfg.Machine
	h.Live, h.PagesUsed, h.PagesCached, h.PagesTotal, h.PromptTokens = st.Live, st.PagesUsed, st.PagesCached, st.PagesTotal, ll.tokens
	h.PageSize, h.MaxRunning, h.MaxQueued = mc.PageSize, mc.MaxRunning, mc.MaxQueued
	h.Stages = make(map[string]int, len(st.Stages))
	for s, n := range st.Stages {
		h.Stages[s.String()] = n
	}
	h.Queued = queuedForCapacity(w.role, st.Stages, mc.MaxRunning)
	h.ForwardSeconds, h.PromptTokensComputed = ll.busy.Seconds(), ll.computed
	return h
}

// queuedForCapacity counts the requests that wait for the worker's capacity:
// those waiting for KV pages (decode's prealloc, preempted) and those
// waiting for a batch slot beyond the slots the next forward has free
// (maxRunning less the running sequences). A request waiting only for the
// next step, or (prefill's bootstrap) for decode's ROOM_OPEN, does not count:
// as in vLLM's waiting queue, what counts is what the engine cannot take.
func queuedForCapacity(role lifecycle.Role, stages map[lifecycle.Stage]int, maxRunning int) int {
	slots := func(waiting, running int) int { return max(0, waiting-max(0, maxRunning-running)) }
	switch role {
	case lifecycle.RolePrefill:
		return slots(stages[lifecycle.StageWaiting], stages[lifecycle.StagePrefilling])
	case lifecycle.RoleDecode:
		// Local requests (no room) wait in waiting for a slot, as queued
		// ones do.
		return stages[lifecycle.StagePrealloc] + stages[lifecycle.StagePreempted] +
			slots(stages[lifecycle.StageQueued]+stages[lifecycle.StageWaiting], stages[lifecycle.StageDecoding]+stages[lifecycle.StagePrefilling])
	}
	return stages[lifecycle.StagePreempted] +
		slots(stages[lifecycle.StageWaiting], stages[lifecycle.StagePrefilling]+stages[lifecycle.StageDecoding])
}

// kvPeers parses the kv_peers query parameter: at most MaxKVPeers
// host:port addresses.
func kvPeers(r *http.Request) ([]string, error) {
	raw := r.URL.Query().Get(workerapi.HealthQueryKVPeers)
	if raw == "" {
		return nil, nil
	}
	addrs := strings.Split(raw, ",")
	if len(addrs) > workerapi.MaxKVPeers {
		return nil, openai.BadRequest(workerapi.HealthQueryKVPeers, "at most %d KV peers, got %d", workerapi.MaxKVPeers, len(addrs))
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, openai.BadRequest(workerapi.HealthQueryKVPeers, "KV peer %q: %v", a, err)
		}
	}
	return addrs, nil
}

func (w *Worker) handleHealth(rw http.ResponseWriter, r *http.Request) {
	addrs, err := kvPeers(r)
	if err != nil {
		openai.WriteError(rw, err)
		return
	}
	var h workerapi.Health
	if w.paths != nil && addrs != nil {
		// The router names the prefill workers this decode worker should
		// reach: dial the ones it cannot yet, and say how each went (a
		// refused handshake takes a round trip, so the first answer
		// already tells).
		w.paths.ensure(addrs, w.backend.Connect, w.clock.Now())
		t := w.clock.NewTimer(workerapi.KVPathWait)
		w.paths.wait(r.Context(), addrs, t.C())
		t.Stop()
		h = w.load(2 * time.Second)
		h.KVPaths = w.paths.list(addrs)
	} else {
		h = w.Health(2 * time.Second)
	}
	status := http.StatusOK
	if h.Status != workerapi.HealthOK {
		status = http.StatusServiceUnavailable
		if h.Status == workerapi.HealthDraining {
			rw.Header().Set("Retry-After", "1")
		}
	}
	writeJSON(rw, status, h)
}

// handleLoad answers the worker's load (always 200: the status says
// whether it drains or its loop is stuck).
func (w *Worker) handleLoad(rw http.ResponseWriter, _ *http.Request) {
	writeJSON(rw, http.StatusOK, w.load(time.Second))
}

func (w *Worker) handleLive(rw http.ResponseWriter, _ *http.Request) {
	if !w.query(2*time.Second, func() {}) {
		writeJSON(rw, http.StatusServiceUnavailable, map[string]string{"status": workerapi.HealthStuck})
		return
	}
	writeJSON(rw, http.StatusOK, map[string]string{"status": "alive"})
}

func (w *Worker) handleRequests(rw http.ResponseWriter, _ *http.Request) {
	list, ok := w.Requests(5 * time.Second)
	if !ok {
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer"))
		return
	}
	used, cached, total := w.machine.Pages()
	out := workerapi.RequestList{Role: w.role.String(), Requests: make([]workerapi.RequestInfo, len(list)),
		Pages: &workerapi.PageCounts{Used: used, Cached: cached, Total: total}}
	for i, ri := range list {
		out.Requests[i] = requestInfo(ri)
	}
	writeJSON(rw, http.StatusOK, out)
}

func (w *Worker) handleRequest(rw http.ResponseWriter, r *http.Request) {
	ri, found, ok := w.Request(r.PathValue("rid"), 5*time.Second)
	switch {
	case !ok:
		openai.WriteError(rw, openai.Unavailable("worker loop did not answer"))
	case !found:
		openai.WriteError(rw, openai.NotFound("no live request %q on this worker", r.PathValue("rid")))
	default:
		writeJSON(rw, http.StatusOK, requestInfo(ri))
	}
}

// ---- in-process engine for a colocated worker ----

// Generate implements openai.Engine for a colocated worker: the request runs
// on this worker, without HTTP.
func (w *Worker) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	if w.role != lifecycle.RoleColocated {
		return nil, openai.Internal("Generate needs a colocated worker, this one is %s", w.role)
	}
	if g.Priority != 0 && !w.cfg.Machine.PriorityScheduling {
		return nil, openai.Unsupported("priority", "priority is %d, but this server schedules first come, first served: start it with --scheduling-policy priority (vLLM's)", g.Priority)
	}
	q := lifecycle.Request{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens, Sampling: g.Sampling,
		StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, MinTokens: g.MinTokens,
		N: g.N, ScorePrompt: g.ScorePrompt, PromptTop: g.PromptTopLogprobs, Priority: g.Priority, Timeout: g.Timeout}
	if err := w.constrain(&q, g.Constraint); err != nil {
		return nil, err
	}
	s := &localStream{w: w, rid: g.RID, ctx: ctx, wt: w.submit(q)}
	if w.tracer != nil {
		start := g.Arrived
		if start.IsZero() {
			start = w.clock.Now()
		}
		s.q, s.span = q, legTrace{on: true, parent: trace.SpanContextFromContext(ctx), start: start}
	}
	return s, nil
}

// localStream is a colocated request served in process. Its output goes
// through the same stream lines and decoder as the HTTP stream's, so the
// two answer alike.
type localStream struct {
	w        *Worker
	rid      string
	ctx      context.Context
	wt       *waiter
	lw       lineWriter
	lines    []workerapi.StreamLine // decoded one per Recv
	finished bool
	stopped  bool
	pending  *workerapi.Error // the failure to return after the tokens that came with it
	// span is the request's serve.request span, made at its end (the
	// zero legTrace: tracing off); fin its end, once known.
	span legTrace
	q    lifecycle.Request
	fin  *lifecycle.Finalize
}

func (s *localStream) Recv() (openai.Chunk, error) {
	if s.pending != nil {
		e := s.pending
		s.pending, s.finished = nil, true
		return openai.Chunk{}, e
	}
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	for len(s.lines) == 0 {
		ps, fin, err := s.wt.next(s.ctx)
		if err != nil {
			return openai.Chunk{}, err
		}
		if fin != nil {
			s.fin = fin
		}
		s.lines = s.lw.lines(ps, fin, false)
	}
	line := s.lines[0]
	s.lines = s.lines[1:]
	c, e := line.Decode()
	switch {
	case e != nil && (len(c.Tokens) > 0 || c.PromptLogprobs != nil):
		s.pending = e // deliver the tokens, then the error
	case e != nil:
		s.finished = true
		return openai.Chunk{}, e
	case c.Done:
		s.finished = true
	}
	return c, nil
}

// Pending implements openai.Pender: lines already decoded wait.
func (s *localStream) Pending() bool { return len(s.lines) > 0 || s.pending != nil }

// StopChoice implements openai.ChoiceStopper: a stop string ended choice
// index of a request with n > 1.
func (s *localStream) StopChoice(index int) {
	if !s.finished && !s.stopped {
		s.w.post(lifecycle.AbortRequest{RID: s.rid, Reason: lifecycle.AbortStop, OneChoice: true, Choice: index})
	}
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
	s.w.endLegSpan(s.span, "serve.request", &s.q, s.fin, s.wt)
}

// Ended implements openai.Ender: Close never waits.
func (s *localStream) Ended() bool { return true }

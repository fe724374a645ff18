package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// DefaultLegTimeout is Config.LegTimeout's default: a leg's HTTP exchange
// ends after it; workers end requests well before (their
// --max-request-time, 10 min by default), so it only matters if a worker
// hangs.
const DefaultLegTimeout = 15 * time.Minute

type prefillResult struct {
	res workerapi.PrefillResult
	err *workerapi.Error
}

// decodeEvent is one decoded line of a streaming leg, or its failure. own,
// with a line, hands the rest of the leg to the event's reader.
type decodeEvent struct {
	chunk openai.Chunk
	err   *workerapi.Error
	own   *ownedLeg
}

// ownedLeg is a streaming leg handed from the goroutine that read it to
// the one that writes the client, which reads the rest itself.
type ownedLeg struct {
	r    *Router
	resp *http.Response
	br   *bufio.Reader
	done func() // uncounts the leg on its worker
}

// release closes the leg's body (its context cancelled, or its answer read
// to the end) and uncounts it.
func (l *ownedLeg) release() {
	l.r.releaseStream(l.resp, l.br)
	l.done()
}

// attempt is one try of a request on one (prefill, decode) pair.
type attempt struct {
	// rid is the request id on the workers: the front end's id for the
	// first attempt, with "-g<gen>" appended for retries, so every
	// attempt is a new request on every worker.
	rid     string
	gen     uint32
	pw, dw  *fleet.Worker
	lines   chan decodeEvent
	prefill chan prefillResult
	pCancel context.CancelFunc
	dCancel context.CancelFunc
	pDone   bool // prefill answered
	// prompt is the prompt's logprobs from prefill's answer (the request
	// asks for them).
	prompt []model.PositionLogprobs
	// pDown closes, and dDown ends, when the pair's prefill and decode
	// workers are found down.
	pDown <-chan struct{}
	dDown context.Context
	// more is set while decode lines already read wait to be decoded.
	more atomic.Bool
	// handover asks the decode goroutine to hand the leg over with its
	// next line (set once prefill answered: then nothing but decode's own
	// stream, its worker's loss, the client or shutdown can end the
	// attempt). leg is the decode leg once handed over: Recv reads it
	// itself, and its watch (until stopped) cancels it for the client,
	// the worker's loss or shutdown.
	handover atomic.Bool
	leg      *ownedLeg
	dctx     context.Context
	watch    *legWatch
	// probe: the pair's breaker is half-open and this attempt is its one
	// probe; pathDone: the pair's breaker has been told how the attempt
	// went on the KV path.
	probe, pathDone bool
	// span is the attempt's (nil: tracing off, or ended).
	span trace.Span
}

// endSpan ends the attempt's span with o, once.
func (a *attempt) endSpan(o outcome.Outcome, msg string) {
	endSpan(a.span, o, msg)
	a.span = nil
}

// pdStream is one request's legs, seen as an openai.Stream.
type pdStream struct {
	r        *Router
	ctx      context.Context // the client's
	g        *openai.GenerateRequest
	rid      string
	room     string
	a        *attempt
	sent     bool // a token reached the client: no more retries
	ended    bool // finished OK, failed, or stopped: nothing more to abort
	stopped  bool // Stop ended it: its abort cancels the decode leg
	finished bool // the last chunk was returned
	// closeWhy is the detail of the aborts Close sends ("" = the client left).
	closeWhy string
	live     *liveRequest // what /debug/requests shows
	// exclude holds workers a retry must not go back to (they are leaving,
	// unreachable, refused the KV handshake or failed a probe); avoid the
	// workers of failed pairs, used again only if no other pair can form.
	exclude exclusions
	avoid   map[*fleet.Worker]bool
	// retryUnshed: the next attempt retries a failure of the fleet (not a
	// worker's 429), so admission does not shed it (pickOpts.retry).
	retryUnshed bool
	// drainRetries counts attempts that a draining worker refused: they
	// are retried without counting against MaxAttempts (up to
	// maxDrainRetries).
	drainRetries int
	// req is what the pair policies see of the request; dispatched is when
	// the current attempt's legs were sent.
	req        PickRequest
	dispatched time.Time
	// held are decode's chunks that wait for prefill's answer (the prompt's
	// logprobs go first); promptSent: they went out.
	held       []openai.Chunk
	promptSent bool
	// midStream goes on when a worker fails after output reached the
	// client (once fan is set, the attempt a is over).
	midStream
	// first is the pair the first attempt uses, when it was picked before
	// the stream was made (per-request disaggregation chose PD).
	first *pairPick
}

// maxDrainRetries bounds the extra attempts of a request whose legs were
// refused by draining workers.
const maxDrainRetries = 4

// Generate implements openai.Engine: it admits the request, picks a pair
// and starts both legs.
func (r *Router) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	if r.cfg.Recorder != nil {
		// Demand is counted where it arrives, refused or not.
		r.cfg.Recorder.Arrived(len(g.InputIDs), g.MaxTokens)
	}
	if e := r.refuse(); e != nil {
		return nil, e
	}
	arrived := g.Arrived
	if arrived.IsZero() {
		arrived = r.clock.Now()
	}
	var (
		st  openai.Stream
		err *openai.Error
	)
	ctx, span := r.requestSpan(ctx, g, arrived)
	tmpl := legBody(g)
	req := PickRequest{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens, MaxTokensDefault: g.MaxTokensDefault,
		MinTokens: g.MinTokens, Needs: workerapi.FeaturesOf(&tmpl)}
	plain := len(r.cfg.Colocated) > 0
	if !plain && r.cfg.Registry != nil {
		if w, _ := r.pickPlain(nil); w != nil {
			_, _, _, _, e := r.pickPair(pickOpts{req: &req, check: true})
			plain = e != nil
		}
	}
	switch {
	case plain:
		st, err = r.generatePlain(ctx, g, &req)
	case g.MaxTokens == 0:
		st, err = r.generatePrompt(ctx, g, req)
	default:
		st, err = r.generatePD(ctx, g, req)
	}
	if err != nil {
		if span != nil {
			o, _ := outcome.Parse(err.Code)
			failedSpan(ctx, outcome.Cause{Outcome: o, Role: "router", Stage: "pick", Detail: err.Message}, "")
			endSpan(span, o, err.Message)
		}
		if err.Status == http.StatusTooManyRequests {
			return nil, r.shed(err)
		}
		path := metrics.PathPD
		if plain {
			path = metrics.PathColocated
		}
		r.metrics.Answered(outcome.NoWorker, path)
		if err.Code == "" {
			err.Code = outcome.NoWorker.String()
		}
		if err.Status == http.StatusServiceUnavailable && err.RetryAfter <= 0 {
			// A worker may be ready at the next health check.
			err.RetryAfter = max(time.Second, r.cfg.HealthInterval)
		}
		return nil, err
	}
	return &measured{Stream: st, r: r, arrived: arrived, prompt: len(g.InputIDs), span: span}, nil
}

// refuse answers a request the router takes no more of: it is shutting
// down or draining (503), or it serves --max-inflight-requests (429).
func (r *Router) refuse() *openai.Error {
	select {
	case <-r.stopping:
		return openai.Unavailable("the router is shutting down")
	case <-r.draining:
		e := openai.Unavailable("the router is draining: it finishes the requests it has and takes no new one")
		e.Code, e.RetryAfter = outcome.Draining.String(), time.Second
		return e
	default:
	}
	if max := r.cfg.Admission.MaxInflight; max > 0 && r.inflight.Load() >= int64(max) {
		return r.shed(r.shedError(ShedMaxInflight, "the router serves %d requests, its --max-inflight-requests", max))
	}
	return nil
}

// Admit is the front end's early admission (openai.Config.Admit): before
// the request's body is read, it refuses what Generate would refuse for
// the router's own state (refuse) and for load, from the router's view of
// its workers alone (no worker is asked): a 429 when the workers a request
// could go to are all saturated — every decode or every prefill worker
// while a prefill/decode pair is ready (every prefill worker only if no
// decode worker may serve a short prompt alone: per-request
// disaggregation), else every colocated worker. What
// it lets through, Generate decides on as before (pair compatibility and
// breakers included).
func (r *Router) Admit() error {
	if e := r.refuse(); e != nil {
		return e
	}
	now := r.clock.Now()
	var pdShed, coShed *openai.Error
	if len(r.cfg.Colocated) == 0 {
		prefills, readyP, pwhy := r.candidates(workerapi.RolePrefill, now, true, func(p *fleet.Worker) bool { return p.KVAddr() == "" })
		decodes, readyD, dwhy := r.candidates(workerapi.RoleDecode, now, true, nil)
		switch {
		case readyP == 0 || readyD == 0:
		case len(decodes) == 0:
			pdShed = r.shedError(dwhy, "every decode worker is saturated")
		case len(prefills) == 0 && r.cfg.DisaggMinPromptTokens > 0 && slices.ContainsFunc(decodes, func(c Candidate) bool {
			return hasFeature(c.Worker, workerapi.FeatureLocal)
		}):
			// A short prompt may still be served by a decode worker alone:
			// Generate decides, with the prompt (pickLocalWhenPrefillSaturated).
			return nil
		case len(prefills) == 0:
			pdShed = r.shedError(pwhy, "every prefill worker is saturated")
		default:
			return nil
		}
	}
	if len(r.cfg.Colocated) > 0 || r.cfg.Registry != nil {
		cands, ready, why := r.candidates(workerapi.RoleColocated, now, true, nil)
		switch {
		case len(cands) > 0:
			return nil
		case ready > 0:
			coShed = r.shedError(why, "every colocated worker is saturated")
		}
	}
	switch {
	case pdShed != nil:
		return r.shed(pdShed)
	case coShed != nil:
		return r.shed(coShed)
	}
	return nil
}

// basePath is the path label of a request answered before it was placed:
// colocated for a router of colocated workers, else pd.
func (r *Router) basePath() string {
	if len(r.cfg.Colocated) > 0 {
		return metrics.PathColocated
	}
	return metrics.PathPD
}

// shed counts a 429 the router answers with e.
func (r *Router) shed(e *openai.Error) *openai.Error {
	r.metrics.Answered(outcome.Overloaded, r.basePath())
	r.metrics.Shed(shedReasonOf(e).String())
	return e
}

// pairPick is a pair pickPair chose.
type pairPick struct {
	pw, dw *fleet.Worker
	kv     string
	probe  bool
}

func (r *Router) generatePD(ctx context.Context, g *openai.GenerateRequest, req PickRequest) (openai.Stream, *openai.Error) {
	var first *pairPick
	var local localDecision
	if r.localOn(g) {
		// Per-request disaggregation (local.go): the decode worker is
		// chosen first, then whether it serves the request alone.
		pw, dw, kv, probe, e := r.pickPair(pickOpts{exclude: exclusions{}, req: &req, local: r.localHook(&req, &local)})
		if e != nil {
			return nil, e
		}
		if pw == nil {
			return r.generateLocal(ctx, g, &req, dw, local)
		}
		first = &pairPick{pw: pw, dw: dw, kv: kv, probe: probe}
	}
	s := &pdStream{r: r, ctx: ctx, g: g, rid: g.RID, room: kvxfer.NewRoom().String(), req: req,
		exclude: exclusions{}, avoid: map[*fleet.Worker]bool{}, first: first,
		midStream: midStream{cont: r.newContinuation(g), path: metrics.PathPD}}
	s.live = r.track(g.RID, s.room, len(g.InputIDs))
	if first != nil && local.threshold > 0 {
		s.live.event("disaggregated: " + local.String())
	}
	if e := s.start(1); e != nil {
		r.untrack(s.live)
		return nil, e
	}
	return s, nil
}

// start launches attempt gen on a freshly picked pair.
func (s *pdStream) start(gen uint32) *openai.Error {
	r, g := s.r, s.g
	var (
		pw, dw *fleet.Worker
		kv     string
		probe  bool
		e      *openai.Error
	)
	if p := s.first; p != nil {
		s.first = nil
		pw, dw, kv, probe = p.pw, p.dw, p.kv, p.probe
	} else {
		pw, dw, kv, probe, e = r.pickPair(pickOpts{exclude: s.exclude, avoid: s.avoid, req: &s.req, continuing: s.cont.migrations > 0,
			retry: gen > 1 && s.retryUnshed})
	}
	if e != nil {
		return e
	}
	rid := g.RID
	if gen > 1 {
		rid = fmt.Sprintf("%s-g%d", g.RID, gen)
	}
	body := s.cont.body(r, g, pw, dw)
	body.RID, body.Room, body.Gen, body.PrefillKVAddr = rid, s.room, gen, kv
	s.req.MaxTokens = body.MaxTokens
	if s.cont.budget == 0 {
		s.cont.budget = body.MaxTokens
	}
	payload, err := body.AppendJSON(nil)
	if err != nil {
		if probe {
			r.breakers.released(pw, dw)
		}
		return openai.Internal("encode leg: %v", err)
	}
	a := &attempt{rid: rid, gen: gen, pw: pw, dw: dw, lines: make(chan decodeEvent, 16), prefill: make(chan prefillResult, 1),
		pDown: pw.Down(), dDown: dw.DownContext(), probe: probe}
	legs, span := r.attemptSpan(s.ctx, context.Background(), gen, s.room, len(s.cont.out), pw, dw)
	a.span = span
	pctx, pcancel := r.withTimeout(legs, r.cfg.LegTimeout)
	dctx, dcancel := r.withTimeout(legs, r.cfg.LegTimeout)
	a.pCancel, a.dCancel, a.dctx = pcancel, dcancel, dctx
	r.bg.Add(2)
	pLeg := r.legStarted(pw, legTokens(workerapi.RolePrefill, &s.req))
	dLeg := r.legStarted(dw, legTokens(workerapi.RoleDecode, &s.req))
	go func() {
		defer r.bg.Done()
		defer pcancel()
		defer pLeg()
		a.prefill <- r.runPrefill(pctx, pw, payload, prefillLimit(g))
	}()
	go func() {
		defer r.bg.Done()
		if !r.runStream(dctx, dw, workerapi.PathDecode, payload, a.lines, &a.more, &a.handover, dLeg) {
			dLeg()
		}
	}()
	s.a = a
	s.held = nil
	s.dispatched = r.clock.Now()
	why := "legs sent"
	if gen > 1 {
		why = "retried on a new pair"
	}
	if probe {
		why += " (probing a half-open KV path)"
	}
	if s.cont.migrations > 0 && len(s.cont.out) > 0 {
		s.live.migrated(gen, pw.URL()+" → "+dw.URL(), len(s.cont.out), s.cont.migrations)
	} else {
		s.live.attempt(gen, pw.URL()+" → "+dw.URL(), why)
	}
	return nil
}

// pathWorked tells the pair's breaker that the attempt's KV arrived.
func (s *pdStream) pathWorked(a *attempt) {
	if a.pathDone {
		return
	}
	a.pathDone = true
	if s.r.breakers.success(a.pw, a.dw) {
		s.r.log.Info("KV path closed again", "prefill", a.pw.URL(), "decode", a.dw.URL())
	}
}

// pathEnded tells the pair's breaker how an attempt that did not get its
// KV ended: a failure of the path (o), or of something else.
func (s *pdStream) pathEnded(a *attempt, o outcome.Outcome, why string) {
	if a.pathDone {
		return
	}
	a.pathDone = true
	switch {
	case pathFailure(o):
		if !strings.HasPrefix(why, o.String()) {
			why = o.String() + ": " + why
		}
		if s.r.breakers.failure(a.pw, a.dw, why, s.r.clock.Now()) {
			s.r.log.Warn("KV path open", "prefill", a.pw.URL(), "decode", a.dw.URL(), "outcome", o.String(), "err", why,
				"cooldown", s.r.cfg.BreakerCooldown)
		}
	case a.probe:
		s.r.breakers.released(a.pw, a.dw)
	}
}

// drain consumes what is left of an attempt's decode stream, so its
// goroutine exits once the leg's context is cancelled.
func (s *pdStream) drain(a *attempt) {
	s.r.bg.Add(1)
	l := a.leg
	a.leg = nil // the goroutine's now
	go func() {
		defer s.r.bg.Done()
		discard(a.lines)
		if l != nil {
			// Cancelled already, or by Stop's abort once the worker has it.
			_, _ = io.Copy(io.Discard, l.br)
			l.release()
		}
	}()
}

// discard reads a streaming leg's events until its goroutine closes them.
// A leg handed over meanwhile is read to its end, and released: its
// context is cancelled already, or will be (a Stop's abort cancels it once
// the worker has it; until then the worker must not see a hang-up).
func discard(lines <-chan decodeEvent) {
	for ev := range lines {
		if ev.own != nil {
			_, _ = io.Copy(io.Discard, ev.own.br)
			ev.own.release()
		}
	}
}

// takeLeg makes the decode leg handed over with a line the attempt's own,
// and starts its watch.
func (s *pdStream) takeLeg(a *attempt, l *ownedLeg) {
	a.leg = l
	a.watch = s.r.watchLeg(s.ctx, a.dDown, a.dCancel)
}

// stopWatching stops the watch of a decode leg handed over.
func (a *attempt) stopWatching() {
	if a.watch != nil {
		a.watch.stop()
		a.watch = nil
	}
}

// errCancelled is a leg's end because the router cancelled it (the
// request ended another way): nobody reads it as an answer.
func errCancelled() *workerapi.Error {
	return workerapi.NewError(outcome.AbortedClient, "the leg was cancelled", outcome.Cause{})
}

func (r *Router) post(ctx context.Context, w *fleet.Worker, path string, payload []byte) (*http.Response, *workerapi.Error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL()+path, bytes.NewReader(payload))
	if err != nil {
		return nil, malformed("build the request to the %s worker: %v", w.Role(), err)
	}
	req.Header.Set("Content-Type", "application/json")
	injectTrace(ctx, req.Header)
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errCancelled()
		}
		r.metrics.WorkerFailed(w.URL())
		r.set.Observe(w, fleet.Info{}, err)
		if errors.Is(err, ErrNoAnswer) {
			// It had the request: it broke off (a non-streamed leg, whose
			// answer comes only at the end, dies here mid-decode).
			return nil, r.legError(w, outcome.WorkerStreamBroken, "broke off before its answer", err)
		}
		return nil, r.legError(w, outcome.WorkerUnreachable, "could not be reached", err)
	}
	return resp, nil
}

// legBody is the leg body of request g (its rid, room and gen, and the
// prefill's KV address, are the attempt's to set).
func legBody(g *openai.GenerateRequest) workerapi.GenerateBody {
	b := workerapi.GenerateBody{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens,
		SamplingParams: g.Sampling, StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, MinTokens: g.MinTokens,
		Buffered: g.Buffered, Priority: g.Priority}
	if g.N > 1 {
		b.N = g.N
	}
	if g.ScorePrompt {
		top := g.PromptTopLogprobs
		b.PromptLogprobs = &top
	}
	if g.Timeout > 0 {
		b.TimeoutMS = max(1, g.Timeout.Milliseconds())
	}
	if !g.Constraint.IsZero() {
		c := g.Constraint
		b.Constraint = &c
	}
	return b
}

// legMaxTokens is the max_tokens of request g's legs on workers ws: g's,
// or, for a default max_tokens, at most what the smallest of the workers'
// contexts leaves after the prompt (PickRequest.need made it at least
// min_tokens and 1).
func legMaxTokens(g *openai.GenerateRequest, ws ...*fleet.Worker) int {
	m := g.MaxTokens
	if !g.MaxTokensDefault {
		return m
	}
	for _, w := range ws {
		if c := w.Info().ContextLen; c > 0 {
			m = min(m, c-len(g.InputIDs))
		}
	}
	return m
}

// prefillLimit bounds what is read of request g's prefill answer (or of a
// colocated leg's first line): more when it carries the prompt's logprobs.
func prefillLimit(g *openai.GenerateRequest) int64 {
	if !g.ScorePrompt {
		return workerapi.MaxLineBytes
	}
	return workerapi.MaxPrefillBytes(len(g.InputIDs), g.PromptTopLogprobs)
}

func (r *Router) runPrefill(ctx context.Context, w *fleet.Worker, payload []byte, limit int64) prefillResult {
	resp, e := r.post(ctx, w, workerapi.PathPrefill, payload)
	if e != nil {
		return prefillResult{err: e}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		if ctx.Err() != nil {
			return prefillResult{err: errCancelled()}
		}
		return prefillResult{err: r.legError(w, outcome.WorkerStreamBroken, "broke off its answer", err)}
	}
	if resp.StatusCode != http.StatusOK {
		return prefillResult{err: workerapi.DecodeError(resp.StatusCode, body)}
	}
	var res workerapi.PrefillResult
	if err := json.Unmarshal(body, &res); err != nil {
		return prefillResult{err: r.malformedAnswer(w, "sent a malformed answer", err)}
	}
	return prefillResult{res: res}
}

// runStream posts a streaming leg (decode or colocated generate) and sends
// its NDJSON lines, decoded, to out, closing out at the end. more is set
// while lines already read remain to be decoded (the reader of out then
// waits for them before it flushes its own output). Once handover is set,
// the next line that is not the last goes out with the leg itself (done
// is then the new owner's to call) and runStream returns true.
func (r *Router) runStream(ctx context.Context, w *fleet.Worker, path string, payload []byte, out chan<- decodeEvent,
	more, handover *atomic.Bool, done func()) (handed bool) {
	defer close(out)
	defer more.Store(false)
	send := func(ev decodeEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	resp, br, e := r.openStream(ctx, w, path, payload)
	if e != nil {
		send(decodeEvent{err: e})
		return false
	}
	defer func() {
		if !handed {
			r.releaseStream(resp, br)
		}
	}()
	for {
		c, e, ok := r.nextLine(ctx, w, br, workerapi.MaxLineBytes)
		if !ok {
			return false // the leg was cancelled: nobody reads it
		}
		more.Store(lineBuffered(br))
		ev := decodeEvent{chunk: c, err: e}
		if e == nil && !c.Done && handover.Load() {
			ev.own = &ownedLeg{r: r, resp: resp, br: br, done: done}
			if send(ev) {
				return true
			}
			return false
		}
		if !send(ev) {
			return false
		}
		if e == nil && c.Done {
			drainStream(br)
		}
		if c.Done || e != nil {
			return false
		}
	}
}

// openStream posts a streaming leg and returns its response, with a pooled
// line reader on its body, once the worker answered 200; any other answer,
// or none, is the error (errCancelled if ctx ended). releaseStream gives
// both back.
func (r *Router) openStream(ctx context.Context, w *fleet.Worker, path string, payload []byte) (*http.Response, *bufio.Reader, *workerapi.Error) {
	resp, e := r.post(ctx, w, path, payload)
	if e != nil {
		return nil, nil, e
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, workerapi.MaxLineBytes))
		resp.Body.Close()
		return nil, nil, workerapi.DecodeError(resp.StatusCode, body)
	}
	br, _ := r.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(nil, 4096)
	}
	br.Reset(resp.Body)
	return resp, br, nil
}

// releaseStream closes a streaming leg's body and pools its reader.
func (r *Router) releaseStream(resp *http.Response, br *bufio.Reader) {
	resp.Body.Close()
	br.Reset(nil)
	r.readers.Put(br)
}

// nextLine reads and decodes the next line of a streaming leg from br. It
// returns the line's chunk, or the leg's failure: the worker's error line,
// a malformed or oversized line, or the stream broken off. When the read
// fails because ctx ended it returns ok false instead (the caller knows
// why it cancelled the leg).
// A line may be at most limit bytes long.
func (r *Router) nextLine(ctx context.Context, w *fleet.Worker, br *bufio.Reader, limit int64) (c openai.Chunk, e *workerapi.Error, ok bool) {
	var long []byte // a line longer than the reader's buffer
	for {
		frag, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if int64(len(long)+len(frag)) > limit {
				return openai.Chunk{}, r.malformedAnswer(w, "sent a stream line over the size limit", bufio.ErrTooLong), true
			}
			long = append(long, frag...)
			continue
		}
		if err != nil { // the stream ended before its last line
			if ctx.Err() != nil {
				return openai.Chunk{}, nil, false
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return openai.Chunk{}, r.legError(w, outcome.WorkerStreamBroken, "broke off its stream", err), true
		}
		lineb := frag
		if long != nil {
			lineb = append(long, frag...)
			long = nil
		}
		lineb = bytes.TrimRight(lineb, "\r\n")
		if len(lineb) == 0 {
			continue
		}
		if int64(len(lineb)) > limit {
			return openai.Chunk{}, r.malformedAnswer(w, "sent a stream line over the size limit", bufio.ErrTooLong), true
		}
		line, err := workerapi.ParseStreamLine(lineb)
		if err != nil {
			return openai.Chunk{}, r.malformedAnswer(w, "sent a malformed stream line", err), true
		}
		c, e = line.Decode()
		return c, e, true
	}
}

// lineBuffered reports whether a whole line already read waits in br.
func lineBuffered(br *bufio.Reader) bool {
	next, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(next, '\n') >= 0
}

// StreamDrainTimeout bounds how long the end of a finished leg's HTTP
// response (what follows its last line: the chunked body's terminator) is
// waited for before the leg is hung up.
const StreamDrainTimeout = time.Second

// drainStream reads what follows a stream's last line, up to
// workerapi.MaxLineBytes, so that the response ends at EOF: net/http reuses
// the connection only for a body read to its end, and a body closed early
// costs a TCP connection to the worker per request.
func drainStream(br *bufio.Reader) {
	_, _ = io.Copy(io.Discard, io.LimitReader(br, workerapi.MaxLineBytes))
}

// endLeg releases a streaming leg whose reader is done: a leg that sent its
// last line is left StreamDrainTimeout to end its response (runStream
// drains it, so the connection goes back to the pool) before it is hung up;
// any other leg is hung up at once. It returns once runStream has closed
// lines.
func endLeg(lines <-chan decodeEvent, cancel context.CancelFunc, finished bool) {
	if finished {
		t := time.AfterFunc(StreamDrainTimeout, cancel)
		defer t.Stop()
	} else {
		cancel()
	}
	discard(lines)
	cancel()
}

// abortLeg tells a worker to abort the request, in the background, bounded
// by AbortTimeout; then it cancels the leg's HTTP exchange (cancelLeg, may be
// nil). The explicit abort goes first so the worker records why the request
// ended; the cancellation alone would read as the client going away. cause
// (reason AbortPeer) is the other leg's first failure: the aborted leg ends
// with it and tells its KV peer.
func (r *Router) abortLeg(w *fleet.Worker, rid, room string, gen uint32, reason workerapi.AbortReason, detail string,
	cause outcome.Cause, cancelLeg context.CancelFunc) {
	payload, _ := json.Marshal(workerapi.AbortBody{RID: rid, Room: room, Gen: gen, Reason: reason, Detail: detail, Cause: cause})
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		if cancelLeg != nil {
			defer cancelLeg()
		}
		ctx, cancel := r.withTimeout(context.Background(), r.cfg.AbortTimeout)
		defer cancel()
		resp, e := r.post(ctx, w, workerapi.PathAbort, payload)
		if e != nil {
			r.log.Debug("abort failed", "worker", w.URL(), "rid", rid, "err", e.Message)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, workerapi.MaxInfoBytes))
		resp.Body.Close()
	}()
}

// abortChoice tells a worker, in the background, that a stop string ended
// choice index of request rid (n > 1): it ends that choice, and the leg
// goes on with the others.
func (r *Router) abortChoice(w *fleet.Worker, rid string, index int) {
	payload, _ := json.Marshal(workerapi.AbortBody{RID: rid, Reason: workerapi.AbortStop, Choice: &index})
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		ctx, cancel := r.withTimeout(context.Background(), r.cfg.AbortTimeout)
		defer cancel()
		resp, e := r.post(ctx, w, workerapi.PathAbort, payload)
		if e != nil {
			r.log.Debug("abort of a choice failed", "worker", w.URL(), "rid", rid, "choice", index, "err", e.Message)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, workerapi.MaxInfoBytes))
		resp.Body.Close()
	}()
}

// failure is a leg's failure as the router decides on it: the error that
// answers it and the side it happened on.
type failure struct {
	role workerapi.Role
	err  *workerapi.Error
}

// rootOf is the failure that e, reported by the role leg, stands for: for an
// aborted_peer echo whose cause is known, the root cause on its own side
// (with its status, code and message); otherwise e on role.
func rootOf(role workerapi.Role, e *workerapi.Error) failure {
	root := e.Root()
	if root != e {
		if r, ok := workerapi.ParseRole(e.Cause.Role); ok {
			role = r
		}
	}
	return failure{role: role, err: root}
}

// explain returns the failure that e, reported by leg, stands for. Only an
// echo of the other leg's failure (aborted_peer) that does not name its
// root cause waits: up to PeerFailureGrace for the other leg's own answer,
// which then explains it. Every other failure is decided at once.
func (s *pdStream) explain(a *attempt, leg workerapi.Role, e *workerapi.Error) failure {
	if !e.Outcome.PeerCaused() || e.Cause.Known() {
		return rootOf(leg, e)
	}
	if leg == workerapi.RoleDecode {
		if !a.pDone {
			if pe := s.awaitPrefillError(a); pe != nil {
				return rootOf(workerapi.RolePrefill, pe)
			}
		}
	} else if de := s.awaitDecodeError(a); de != nil {
		return rootOf(workerapi.RoleDecode, de)
	}
	return failure{role: leg, err: e}
}

// failed handles the failure of one leg of the current attempt: the other
// leg is aborted at once, told the failure's first cause; the request is
// retried on a new pair if it may be, otherwise the error is the answer.
func (s *pdStream) failed(f failure) (retried bool, err error) {
	a, e := s.a, f.err
	cause := e.FirstCause(f.role)
	detail := f.role.String() + " leg failed: " + e.Message
	if f.role == workerapi.RolePrefill {
		a.pCancel()
		s.r.abortLeg(a.dw, a.rid, s.room, a.gen, workerapi.AbortPeer, detail, cause, a.dCancel)
	} else {
		a.dCancel()
		if !a.pDone {
			s.r.abortLeg(a.pw, a.rid, s.room, a.gen, workerapi.AbortPeer, detail, cause, a.pCancel)
		} else {
			a.pCancel()
		}
	}
	a.stopWatching()
	s.drain(a)
	a.endSpan(e.Outcome, f.role.String()+" leg failed: "+e.Message)
	s.r.metrics.LegFailed(f.role, e.Outcome)
	s.live.event(fmt.Sprintf("%s leg failed (gen %d): %s", f.role, a.gen, e.Message))
	s.pathEnded(a, e.Outcome, e.Message)
	failedW := a.dw
	if f.role == workerapi.RolePrefill {
		failedW = a.pw
	}
	switch {
	case e.Outcome == outcome.Overloaded:
		// Its queue is full: no new pair for it until it reports room, and
		// never this request's retry.
		s.r.markOverloaded(failedW)
		s.exclude.add(failedW)
	case e.Outcome.Leaving():
		// The worker said it is going away: out of new pairs at once,
		// before its next health check, and never the retry's.
		s.r.set.MarkDraining(failedW, e.Message)
		s.exclude.add(failedW)
	case e.Outcome == outcome.WorkerUnreachable || e.Outcome == outcome.WorkerStreamBroken || e.Outcome == outcome.PeerRefused:
		s.exclude.add(failedW)
	default:
		s.avoid[a.pw], s.avoid[a.dw] = true, true
	}
	limit := s.r.cfg.MaxAttempts + s.drainRetries
	if e.Outcome == outcome.Draining && s.drainRetries < maxDrainRetries {
		limit++
		s.drainRetries++
	}
	switch {
	case s.sent:
		// Output reached the client: continue it on another pair from
		// where it stopped, if the worker (not the request) failed.
		var down map[*fleet.Worker]bool
		if e.Outcome.Suspect() {
			down = s.r.probe(a.pw, a.dw)
			for w := range down {
				s.exclude.add(w)
			}
		}
		if last, ok := s.cont.ended(s.g, s.r.cfg.EOS, s.r.cfg.ContextLen); ok && e.Outcome.Migratable() {
			// Its output was complete: only the line saying so was lost.
			s.last = &last
			s.live.event("its output was complete: finished at the router")
			return true, nil
		}
		if why := s.cont.refuse(s.r, f.role, e.Outcome, down[failedW], s.ctx); why == "" && !s.cont.one {
			s.cont.migrating(&s.req, s.g, failedW, f.role, e.Outcome, s.r.clock.Now())
			fan, fe := s.r.fanOut(s.ctx, s.g, &s.cont, false, s.exclude)
			if fe == nil {
				s.fan = fan
				s.r.metrics.Migrated(e.Outcome)
				s.live.event(fmt.Sprintf("continued choice by choice after %d output tokens (migration %d)", s.cont.progress(), s.cont.migrations))
				s.r.log.Info("continuing request's choices on new pairs", "rid", s.rid, "output_tokens", s.cont.progress(),
					"failed_leg", f.role.String(), "outcome", e.Outcome.String(), "err", e.Message)
				return true, nil
			}
			s.live.event("could not continue on new pairs: " + fe.Message)
			s.r.log.Warn("request could not be continued", "rid", s.rid, "room", s.room, "err", fe.Message)
		} else if why == "" {
			s.cont.migrating(&s.req, s.g, failedW, f.role, e.Outcome, s.r.clock.Now())
			se := s.r.awaitWorker(s.ctx, func() *openai.Error { return s.start(a.gen + 1) })
			if se == nil {
				s.r.metrics.Migrated(e.Outcome)
				s.r.log.Info("continuing request on a new pair", "rid", s.rid, "room", s.room, "gen", a.gen+1,
					"output_tokens", len(s.cont.out), "failed_leg", f.role.String(), "outcome", e.Outcome.String(), "err", e.Message)
				return true, nil
			}
			s.live.event("could not continue on a new pair: " + se.Message)
			s.r.log.Warn("request could not be continued", "rid", s.rid, "room", s.room, "err", se.Message)
		} else if s.cont.on() {
			s.live.event("not continued: " + why)
		}
	case e.Outcome.Retryable() && int(a.gen) < limit && s.ctx.Err() == nil:
		s.retryUnshed = e.Outcome != outcome.Overloaded
		if e.Outcome.Suspect() {
			// One of the pair may be frozen or cut off; find out before
			// the retry can pick it again.
			for w := range s.r.probe(a.pw, a.dw) {
				s.exclude.add(w)
			}
		}
		if se := s.start(a.gen + 1); se == nil {
			s.r.metrics.Retried(e.Outcome)
			if f.role == workerapi.RolePrefill && e.Outcome.Migratable() {
				s.r.metrics.Migrated(e.Outcome)
			}
			s.r.log.Info("retrying request on a new pair", "rid", s.rid, "room", s.room, "gen", a.gen+1,
				"failed_leg", f.role.String(), "outcome", e.Outcome.String(), "err", e.Message)
			return true, nil
		}
	}
	s.ended = true
	s.answered(s.r, e.Outcome)
	failedSpan(s.ctx, spanCause(e, f.role), s.live.stageNow())
	if e.Outcome == outcome.Overloaded {
		s.r.metrics.Shed(ShedWorkerOverloaded.String())
	}
	s.r.log.Info("request failed", "rid", s.rid, "room", s.room, "gen", a.gen, "leg", f.role.String(),
		"outcome", e.Outcome.String(), "status", e.Status, "err", e.Message)
	return false, e
}

// Recv returns decode's tokens; a leg's failure ends it or retries it.
func (s *pdStream) Recv() (openai.Chunk, error) {
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	for {
		a := s.a
		var f failure
		if s.fan != nil {
			return s.fanRecv()
		}
		if s.last != nil {
			return s.token(a, *s.last), nil
		}
		if len(s.held) > 0 && !s.waitsForPrompt(a) {
			c := s.held[0]
			s.held = s.held[1:]
			return s.token(a, c), nil
		}
		if a.leg != nil {
			c, e, ok := s.r.nextLine(a.dctx, a.dw, a.leg.br, workerapi.MaxLineBytes)
			switch {
			case !ok: // the watcher cancelled the leg, or its timeout ended it
				switch {
				case s.ctx.Err() != nil:
					return openai.Chunk{}, s.ctx.Err()
				case closed(s.r.stopping):
					s.closeWhy = "the router is shutting down"
					return openai.Chunk{}, openai.Unavailable("the router is shutting down")
				case a.dDown.Err() != nil:
					f = failure{role: workerapi.RoleDecode, err: downError(workerapi.RoleDecode)}
				default:
					f = s.explain(a, workerapi.RoleDecode, malformed("decode stream closed"))
				}
			case e == nil:
				return s.token(a, c), nil
			default:
				f = s.explain(a, workerapi.RoleDecode, e)
			}
			retried, err := s.failed(f)
			if !retried {
				return openai.Chunk{}, err
			}
			continue
		}
		pDown := a.pDown
		if a.pDone {
			pDown = nil // prefill's part is over; its worker may come and go
		}
		lines, dDown := a.lines, a.dDown.Done()
		if n := len(s.held); n > 0 && s.held[n-1].Done {
			// Decode's stream is over (and closed): only prefill's answer
			// is awaited.
			lines, dDown = nil, nil
		}
		select {
		case <-dDown:
			f = failure{role: workerapi.RoleDecode, err: downError(workerapi.RoleDecode)}
		case <-pDown:
			f = failure{role: workerapi.RolePrefill, err: downError(workerapi.RolePrefill)}
		case ev, ok := <-lines:
			e := ev.err
			if !ok {
				e = malformed("decode stream closed")
			}
			if e == nil {
				if ev.own != nil {
					s.takeLeg(a, ev.own)
				}
				if s.waitsForPrompt(a) {
					// The prompt's logprobs come first, with prefill's
					// answer: hold decode's tokens until then.
					s.held = append(s.held, ev.chunk)
					continue
				}
				return s.token(a, ev.chunk), nil
			}
			f = s.explain(a, workerapi.RoleDecode, e)
		case p := <-a.prefill:
			a.pDone = true
			a.prefill = nil
			if p.err == nil {
				a.prompt = p.res.PromptLogprobs
				a.handover.Store(true) // decode may be read here from its next line on
				continue
			}
			f = s.explain(a, workerapi.RolePrefill, p.err)
		case <-s.ctx.Done():
			return openai.Chunk{}, s.ctx.Err()
		case <-s.r.stopping:
			// Close aborts both legs as for a client that went away; the
			// client gets this answer.
			s.closeWhy = "the router is shutting down"
			return openai.Chunk{}, openai.Unavailable("the router is shutting down")
		}
		retried, err := s.failed(f)
		if !retried {
			return openai.Chunk{}, err
		}
	}
}

// fanRecv returns the next chunk of the choices' continuations.
func (s *pdStream) fanRecv() (openai.Chunk, error) {
	c, ended, err := s.midStream.fanRecv(s.r, s.ctx, s.live)
	if ended {
		s.ended, s.finished = true, err == nil
	}
	if err != nil && closed(s.r.stopping) {
		s.closeWhy = "the router is shutting down"
	}
	return c, err
}

// errOutcome is the outcome err answers with (failed_internal if it names
// none).
func errOutcome(err error) outcome.Outcome {
	var we *workerapi.Error
	if errors.As(err, &we) && we.Outcome != outcome.None {
		return we.Outcome
	}
	if o, ok := outcome.Parse(openai.ToError(err).Code); ok {
		return o
	}
	return outcome.FailedInternal
}

// waitsForPrompt reports whether decode's tokens must wait for prefill's
// answer: the request asks for the prompt's logprobs, which come first.
func (s *pdStream) waitsForPrompt(a *attempt) bool {
	return s.g.ScorePrompt && !s.promptSent && !a.pDone
}

// token accounts for a chunk of decode's that is returned to the client.
func (s *pdStream) token(a *attempt, c openai.Chunk) openai.Chunk {
	if s.g.ScorePrompt && !s.promptSent {
		c.PromptLogprobs, s.promptSent = a.prompt, true
	}
	if len(c.Tokens) > 0 {
		s.sent = true
		s.live.tokens(len(c.Tokens))
		s.pathWorked(a)
	}
	s.cont.returned(s.r, &c)
	if c.Done {
		a.endSpan(outcome.OK, "")
		c.CachedTokens = min(c.CachedTokens, len(s.g.InputIDs))
		s.finished, s.ended = true, true
		s.answered(s.r, outcome.OK)
	}
	return c
}

// awaitPrefillError waits up to PeerFailureGrace for the prefill leg's
// answer. It returns prefill's error, or nil if prefill succeeded or did not
// answer in time (or the request ended meanwhile).
func (s *pdStream) awaitPrefillError(a *attempt) *workerapi.Error {
	t := s.r.clock.NewTimer(s.r.cfg.PeerFailureGrace)
	defer t.Stop()
	select {
	case p := <-a.prefill:
		a.pDone = true
		a.prefill = nil
		return p.err
	case <-t.C():
	case <-s.ctx.Done(): // the client is gone: abort now, not after the grace
	case <-s.r.stopping:
	}
	return nil
}

// awaitDecodeError waits up to PeerFailureGrace for the decode leg's error
// line, skipping token lines (there are none before decode verified the
// KV). It returns nil if none came.
func (s *pdStream) awaitDecodeError(a *attempt) *workerapi.Error {
	t := s.r.clock.NewTimer(s.r.cfg.PeerFailureGrace)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-a.lines:
			switch {
			case !ok:
				return nil
			case ev.own != nil:
				a.dCancel()
				ev.own.release()
			case ev.err != nil:
				return ev.err
			}
		case <-t.C():
			return nil
		case <-s.ctx.Done():
			return nil
		case <-s.r.stopping:
			return nil
		}
	}
}

// Stop ends the request as finished (a stop string matched): only decode
// still runs; prefill finishes on its own once decode acknowledged the KV.
// The decode leg is hung up only after the worker has the stop abort
// (abortLeg cancels it then), so the worker ends the request ok instead of
// reading the hang-up as its client going away.
func (s *pdStream) Stop() {
	if s.ended {
		return
	}
	s.ended, s.stopped = true, true
	s.a.stopWatching() // the client's context ends with the answer: it must not hang up the leg
	s.answered(s.r, outcome.OK)
	if s.fan != nil {
		s.fan.close()
		s.fan = nil
		return // the attempt was over already
	}
	s.r.abortLeg(s.a.dw, s.a.rid, s.room, s.a.gen, workerapi.AbortStop, "", outcome.Cause{}, s.a.dCancel)
}

// StopChoice implements openai.ChoiceStopper: a stop string ended choice
// index of several; decode ends that choice alone (the leg goes on).
func (s *pdStream) StopChoice(index int) {
	if s.ended {
		return
	}
	if s.fan != nil {
		s.fan.stopChoice(index)
		return
	}
	s.cont.stopped(index)
	s.r.abortChoice(s.a.dw, s.a.rid, index)
}

// Close aborts both legs if the request has not ended (the client is
// gone), and releases the decode stream. A prefill leg that is still
// answering after a successful request is left to finish.
func (s *pdStream) Close() {
	s.r.untrack(s.live)
	a := s.a
	defer func() { a.endSpan(s.outcome, "") }()
	if s.fan != nil {
		s.fan.close()
		if !s.ended {
			s.ended = true
			o := outcome.AbortedClient
			if s.closeWhy != "" {
				o = outcome.Shutdown
			}
			s.answered(s.r, o)
		}
	}
	s.pathEnded(a, outcome.None, "")
	if !s.ended {
		s.ended = true
		why, o := s.closeWhy, outcome.Shutdown
		if why == "" {
			why, o = "client disconnected", outcome.AbortedClient
		}
		s.answered(s.r, o)
		s.r.abortLeg(a.dw, a.rid, s.room, a.gen, workerapi.AbortClient, why, outcome.Cause{}, nil)
		if !a.pDone {
			s.r.abortLeg(a.pw, a.rid, s.room, a.gen, workerapi.AbortClient, why, outcome.Cause{}, a.pCancel)
		} else {
			a.pCancel()
		}
	}
	a.stopWatching()
	if s.stopped {
		s.drain(a) // Stop's abort hangs the leg up once the worker has it
		return
	}
	if l := a.leg; l != nil {
		if s.finished {
			t := time.AfterFunc(StreamDrainTimeout, a.dCancel)
			drainStream(l.br)
			t.Stop()
		}
		a.dCancel()
		l.release()
		return
	}
	endLeg(a.lines, a.dCancel, s.finished)
}

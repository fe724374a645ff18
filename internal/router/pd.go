package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// LegTimeout bounds a leg's HTTP exchange; workers end requests well before
// (their --max-request-time), so it only matters if a worker hangs.
const LegTimeout = 15 * time.Minute

type prefillResult struct {
	res workerapi.PrefillResult
	err *workerapi.Error
}

// decodeEvent is one decoded line of a streaming leg, or its failure.
type decodeEvent struct {
	chunk openai.Chunk
	err   *workerapi.Error
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
	// pDown and dDown close when the pair's workers are found down.
	pDown, dDown <-chan struct{}
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
	exclude, avoid map[*fleet.Worker]bool
	// drainRetries counts attempts that a draining worker refused: they
	// are retried without counting against MaxAttempts (up to
	// maxDrainRetries).
	drainRetries int
}

// maxDrainRetries bounds the extra attempts of a request whose legs were
// refused by draining workers.
const maxDrainRetries = 4

// Generate implements openai.Engine: it picks a pair and starts both legs.
func (r *Router) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	select {
	case <-r.stopping:
		return nil, openai.Unavailable("the router is shutting down")
	case <-r.draining:
		e := openai.Unavailable("the router is draining: it finishes the requests it has and takes no new one")
		e.Code, e.RetryAfter = outcome.Draining.String(), time.Second
		return nil, e
	default:
	}
	if len(r.cfg.Colocated) > 0 {
		return r.generatePlain(ctx, g)
	}
	if r.cfg.Registry != nil && r.pick(workerapi.RoleColocated, nil, false) != nil {
		if _, _, _, e := r.pickPair(nil, nil, false); e != nil {
			return r.generatePlain(ctx, g)
		}
	}
	s := &pdStream{r: r, ctx: ctx, g: g, rid: g.RID, room: kvxfer.NewRoom().String(),
		exclude: map[*fleet.Worker]bool{}, avoid: map[*fleet.Worker]bool{}}
	s.live = r.track(g.RID, s.room, len(g.InputIDs))
	if e := s.start(1); e != nil {
		r.untrack(s.live)
		r.metrics.Answered(outcome.NoWorker)
		if e.Code == "" {
			e.Code = outcome.NoWorker.String()
		}
		return nil, e
	}
	return s, nil
}

// start launches attempt gen on a freshly picked pair.
func (s *pdStream) start(gen uint32) *openai.Error {
	r, g := s.r, s.g
	pw, dw, kv, e := r.pickPair(s.exclude, s.avoid, true)
	if e != nil {
		return e
	}
	rid := g.RID
	if gen > 1 {
		rid = fmt.Sprintf("%s-g%d", g.RID, gen)
	}
	body := workerapi.GenerateBody{RID: rid, Room: s.room, Gen: gen, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens,
		SamplingParams: g.Sampling, StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, PrefillKVAddr: kv,
		Buffered: g.Buffered}
	payload, err := json.Marshal(body)
	if err != nil {
		return openai.Internal("encode leg: %v", err)
	}
	a := &attempt{rid: rid, gen: gen, pw: pw, dw: dw, lines: make(chan decodeEvent, 16), prefill: make(chan prefillResult, 1),
		pDown: pw.Down(), dDown: dw.Down()}
	pctx, pcancel := r.withTimeout(context.Background(), LegTimeout)
	dctx, dcancel := r.withTimeout(context.Background(), LegTimeout)
	a.pCancel, a.dCancel = pcancel, dcancel
	r.bg.Add(2)
	pLeg, dLeg := pw.AddLeg(), dw.AddLeg()
	go func() {
		defer r.bg.Done()
		defer pcancel()
		defer pLeg()
		a.prefill <- r.runPrefill(pctx, pw, payload)
	}()
	go func() {
		defer r.bg.Done()
		defer dLeg()
		r.runDecode(dctx, dw, payload, a.lines)
	}()
	s.a = a
	why := "legs sent"
	if gen > 1 {
		why = "retried on a new pair"
	}
	s.live.attempt(gen, pw.URL()+" → "+dw.URL(), why)
	return nil
}

// drain consumes what is left of an attempt's decode stream, so its
// goroutine exits once the leg's context is cancelled.
func (s *pdStream) drain(a *attempt) {
	s.r.bg.Add(1)
	go func() {
		defer s.r.bg.Done()
		for range a.lines {
		}
	}()
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
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errCancelled()
		}
		r.metrics.WorkerFailed(w.URL())
		r.set.Observe(w, fleet.Info{}, err)
		return nil, r.legError(w, outcome.WorkerUnreachable, "could not be reached", err)
	}
	return resp, nil
}

func (r *Router) runPrefill(ctx context.Context, w *fleet.Worker, payload []byte) prefillResult {
	resp, e := r.post(ctx, w, workerapi.PathPrefill, payload)
	if e != nil {
		return prefillResult{err: e}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, workerapi.MaxLineBytes))
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

func (r *Router) runDecode(ctx context.Context, w *fleet.Worker, payload []byte, out chan<- decodeEvent) {
	r.runStream(ctx, w, workerapi.PathDecode, payload, out)
}

// runStream posts a streaming leg (decode or colocated generate) and sends
// its NDJSON lines, decoded, to out, closing out at the end.
func (r *Router) runStream(ctx context.Context, w *fleet.Worker, path string, payload []byte, out chan<- decodeEvent) {
	defer close(out)
	send := func(ev decodeEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	resp, e := r.post(ctx, w, path, payload)
	if e != nil {
		send(decodeEvent{err: e})
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, workerapi.MaxLineBytes))
		send(decodeEvent{err: workerapi.DecodeError(resp.StatusCode, body)})
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), workerapi.MaxLineBytes)
	for sc.Scan() {
		var line workerapi.StreamLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			send(decodeEvent{err: r.malformedAnswer(w, "sent a malformed stream line", err)})
			return
		}
		c, e := line.Decode()
		if !send(decodeEvent{chunk: c, err: e}) {
			return
		}
		if c.FinishReason != "" || e != nil {
			return
		}
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	if ctx.Err() == nil {
		send(decodeEvent{err: r.legError(w, outcome.WorkerStreamBroken, "broke off its stream", err)})
	}
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
	s.drain(a)
	s.r.metrics.LegFailed(f.role, e.Outcome)
	s.live.event(fmt.Sprintf("%s leg failed (gen %d): %s", f.role, a.gen, e.Message))
	failedW := a.dw
	if f.role == workerapi.RolePrefill {
		failedW = a.pw
	}
	switch {
	case e.Outcome.Leaving():
		// The worker said it is going away: out of new pairs at once,
		// before its next health check, and never the retry's.
		s.r.set.MarkDraining(failedW, e.Message)
		s.exclude[failedW] = true
	case e.Outcome == outcome.WorkerUnreachable || e.Outcome == outcome.WorkerStreamBroken || e.Outcome == outcome.PeerRefused:
		s.exclude[failedW] = true
	default:
		s.avoid[a.pw], s.avoid[a.dw] = true, true
	}
	limit := s.r.cfg.MaxAttempts + s.drainRetries
	if e.Outcome == outcome.Draining && s.drainRetries < maxDrainRetries {
		limit++
		s.drainRetries++
	}
	if !s.sent && e.Outcome.Retryable() && int(a.gen) < limit && s.ctx.Err() == nil {
		if e.Outcome.Suspect() {
			// One of the pair may be frozen or cut off; find out before
			// the retry can pick it again.
			for w := range s.r.probe(a.pw, a.dw) {
				s.exclude[w] = true
			}
		}
		if se := s.start(a.gen + 1); se == nil {
			s.r.metrics.Retried()
			s.r.log.Info("retrying request on a new pair", "rid", s.rid, "room", s.room, "gen", a.gen+1,
				"failed_leg", f.role.String(), "outcome", e.Outcome.String(), "err", e.Message)
			return true, nil
		}
	}
	s.ended = true
	s.r.metrics.Answered(e.Outcome)
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
		pDown := a.pDown
		if a.pDone {
			pDown = nil // prefill's part is over; its worker may come and go
		}
		select {
		case <-a.dDown:
			f = failure{role: workerapi.RoleDecode, err: downError(workerapi.RoleDecode)}
		case <-pDown:
			f = failure{role: workerapi.RolePrefill, err: downError(workerapi.RolePrefill)}
		case ev, ok := <-a.lines:
			e := ev.err
			if !ok {
				e = malformed("decode stream closed")
			}
			if e == nil {
				c := ev.chunk
				if len(c.Tokens) > 0 {
					s.sent = true
					s.live.tokens(len(c.Tokens))
				}
				if c.FinishReason != "" {
					s.finished, s.ended = true, true
					s.r.metrics.Answered(outcome.OK)
				}
				return c, nil
			}
			f = s.explain(a, workerapi.RoleDecode, e)
		case p := <-a.prefill:
			a.pDone = true
			a.prefill = nil
			if p.err == nil {
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
	s.r.metrics.Answered(outcome.OK)
	s.r.abortLeg(s.a.dw, s.a.rid, s.room, s.a.gen, workerapi.AbortStop, "", outcome.Cause{}, s.a.dCancel)
}

// Close aborts both legs if the request has not ended (the client is
// gone), and releases the decode stream. A prefill leg that is still
// answering after a successful request is left to finish.
func (s *pdStream) Close() {
	s.r.untrack(s.live)
	a := s.a
	if !s.ended {
		s.ended = true
		why, o := s.closeWhy, outcome.Shutdown
		if why == "" {
			why, o = "client disconnected", outcome.AbortedClient
		}
		s.r.metrics.Answered(o)
		s.r.abortLeg(a.dw, a.rid, s.room, a.gen, workerapi.AbortClient, why, outcome.Cause{}, nil)
		if !a.pDone {
			s.r.abortLeg(a.pw, a.rid, s.room, a.gen, workerapi.AbortClient, why, outcome.Cause{}, a.pCancel)
		} else {
			a.pCancel()
		}
	}
	if s.stopped {
		s.drain(a) // Stop's abort hangs the leg up once the worker has it
		return
	}
	a.dCancel()
	for range a.lines {
	}
}

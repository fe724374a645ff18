package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// plainStream is one request on one worker alone: a colocated worker (the
// router's plain mode), or a decode worker that computes the prompt itself
// (a local request, per-request disaggregation: local.go). The worker's
// NDJSON stream is relayed as an openai.Stream.
//
// The leg is read on the goroutine that calls Recv (the front end's, which
// writes to the client): no goroutine and no channel hand-over per line.
// What must end a blocked read — the client going away, the worker found
// down, the router shutting down — cancels the leg's context (legWatch: no
// goroutine unless it happens), and Recv then answers as for that cause.
type plainStream struct {
	r   *Router
	ctx context.Context
	g   *openai.GenerateRequest
	req PickRequest
	// role is the workers' role: RoleColocated, or RoleDecode for a local
	// request.
	role    workerapi.Role
	w       *fleet.Worker
	legDone func() // uncounts the leg on the worker
	rid     string // the current leg's: g.RID, then "-g<gen>" for continuations
	gen     uint32
	payload []byte
	limit   int64           // of a line: the first may carry the prompt's logprobs
	lctx    context.Context // the leg's
	cancel  context.CancelFunc
	down    <-chan struct{} // closed when the worker is found down
	watch   *legWatch       // Stop and Close stop it
	live    *liveRequest    // what /debug/requests shows
	// resp and br are the leg's answer and its line reader, once posted.
	resp     *http.Response
	br       *bufio.Reader
	posted   bool // the leg was sent (its answer may have failed)
	ended    bool
	stopped  bool // Stop ended it: its abort cancels the leg
	finished bool
	shutdown bool // the router stopped the request: its answer was a 503
	// dispatched is when the request was sent to its worker.
	dispatched time.Time
	// midStream goes on on another worker when the leg breaks after output
	// reached the client (once fan is set, the leg is over); exclude holds
	// the workers it must not go to.
	midStream
	exclude exclusions
	// span is the current attempt's (nil: tracing off).
	span trace.Span
}

// generatePlain sends a whole request to a colocated worker chosen by the
// decode policy. A failure before any output reached the client is the
// answer (plain mode is the baseline that disaggregation is compared
// with); one after, of the worker (outcome.Migratable), is continued on
// another colocated worker as a PD request is on another pair. The leg is
// posted on the first Recv.
func (r *Router) generatePlain(ctx context.Context, g *openai.GenerateRequest, req *PickRequest) (openai.Stream, *openai.Error) {
	w, e := r.pickPlain(req)
	if e != nil {
		return nil, e
	}
	return r.generateAlone(ctx, g, req, w, workerapi.RoleColocated, metrics.PathColocated, "sent to a colocated worker")
}

// generateAlone serves request g on worker w alone (a colocated worker, or
// a decode worker for a local request: role), counted under path; what
// says how it was placed (/debug/requests).
func (r *Router) generateAlone(ctx context.Context, g *openai.GenerateRequest, req *PickRequest, w *fleet.Worker,
	role workerapi.Role, path, what string) (openai.Stream, *openai.Error) {
	s := &plainStream{r: r, ctx: ctx, g: g, req: *req, role: role, rid: g.RID, gen: 1, limit: prefillLimit(g),
		midStream: midStream{cont: r.newContinuation(g), path: path}, exclude: exclusions{}}
	s.live = r.track(g.RID, "", len(g.InputIDs))
	if e := s.send(w); e != nil {
		r.untrack(s.live)
		s.stopWatching()
		s.cancel()
		s.legDone()
		return nil, e
	}
	s.live.attempt(1, w.URL(), what)
	return s, nil
}

// send readies the request's next leg on w (posted by Recv).
func (s *plainStream) send(w *fleet.Worker) *openai.Error {
	r := s.r
	body := s.cont.body(r, s.g, w)
	body.RID = s.rid
	s.req.MaxTokens = body.MaxTokens
	if s.cont.budget == 0 {
		s.cont.budget = body.MaxTokens
	}
	payload, err := body.AppendJSON(nil)
	legs, span := r.attemptSpan(s.ctx, context.Background(), s.gen, "", len(s.cont.out), w, nil)
	endSpan(s.span, outcome.None, "") // the previous attempt's, if any
	s.span = span
	lctx, cancel := r.withTimeout(legs, r.cfg.LegTimeout)
	downCtx := w.DownContext()
	s.w, s.payload, s.lctx, s.cancel, s.down = w, payload, lctx, cancel, downCtx.Done()
	s.legDone = r.legStarted(w, legTokens(s.role, &s.req))
	s.dispatched = r.clock.Now()
	s.resp, s.br, s.posted = nil, nil, false
	s.watch = r.watchLeg(s.ctx, downCtx, cancel)
	if err != nil {
		return openai.Internal("encode request: %v", err)
	}
	return nil
}

// stopWatching stops the leg's watch.
func (s *plainStream) stopWatching() { s.watch.stop() }

// Recv relays the worker's tokens.
func (s *plainStream) Recv() (openai.Chunk, error) {
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	if s.fan != nil {
		return s.fanRecv()
	}
	if s.last != nil {
		return s.token(*s.last), nil
	}
	if s.ended {
		return openai.Chunk{}, malformed("worker stream closed")
	}
	var (
		c  openai.Chunk
		e  *workerapi.Error
		ok = true
	)
	if !s.posted {
		s.posted = true
		s.resp, s.br, e = s.r.openStream(s.lctx, s.w, workerapi.PathGenerate, s.payload)
		if e != nil && s.lctx.Err() != nil {
			ok = false
		}
	}
	if e == nil && ok {
		c, e, ok = s.r.nextLine(s.lctx, s.w, s.br, s.limit)
	}
	if !ok { // the watcher cancelled the leg, or its timeout ended it
		return s.interrupted()
	}
	if e != nil {
		if s.continued(e) {
			return s.Recv()
		}
		s.ended = true
		s.r.metrics.LegFailed(s.role, e.Outcome)
		s.answered(s.r, e.Outcome)
		failedSpan(s.ctx, spanCause(e, s.role), s.live.stageNow())
		if e.Outcome == outcome.Overloaded {
			s.r.markOverloaded(s.w)
			s.r.metrics.Shed(ShedWorkerOverloaded.String())
		}
		return openai.Chunk{}, e
	}
	return s.token(c), nil
}

// token accounts for a chunk returned to the client.
func (s *plainStream) token(c openai.Chunk) openai.Chunk {
	s.live.tokens(len(c.Tokens))
	s.cont.returned(s.r, &c)
	if c.Done {
		s.finished, s.ended = true, true
		c.CachedTokens = min(c.CachedTokens, len(s.g.InputIDs))
		s.answered(s.r, outcome.OK)
	}
	return c
}

// fanRecv returns the next chunk of the choices' continuations.
func (s *plainStream) fanRecv() (openai.Chunk, error) {
	c, ended, err := s.midStream.fanRecv(s.r, s.ctx, s.live)
	if ended {
		s.ended, s.finished = true, err == nil
	}
	s.shutdown = s.shutdown || (err != nil && closed(s.r.stopping))
	return c, err
}

// continued handles the leg's failure e after output reached the client:
// when the worker failed (outcome.Migratable) and --max-migrations allows,
// the old leg is released (and aborted on its worker) and the request
// continued on another colocated worker, or finished at the router if its
// output was complete; it reports whether Recv goes on.
func (s *plainStream) continued(e *workerapi.Error) bool {
	r := s.r
	if s.cont.progress() == 0 {
		return false
	}
	o := e.Outcome
	var down bool
	if o.Suspect() {
		down = r.probe(s.w)[s.w]
	}
	last, complete := s.cont.ended(s.g, r.cfg.EOS, r.cfg.ContextLen)
	why := ""
	if !complete {
		why = s.cont.refuse(r, s.role, o, down, s.ctx)
	}
	if !complete && why != "" {
		if s.cont.on() {
			s.live.event("not continued: " + why)
		}
		return false
	}
	r.metrics.LegFailed(s.role, o)
	s.live.event(fmt.Sprintf("%s leg failed (gen %d): %s", s.role, s.gen, e.Message))
	endSpan(s.span, o, s.role.String()+" leg failed: "+e.Message)
	s.span = nil
	// The old leg: its worker ends the request (it may be gone already).
	s.stopWatching()
	r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "continued on another worker", outcome.Cause{}, nil)
	s.cancel()
	if s.resp != nil {
		r.releaseStream(s.resp, s.br)
	}
	s.legDone()
	s.legDone = func() {}
	s.resp, s.br = nil, nil
	if o.Leaving() {
		r.set.MarkDraining(s.w, e.Message)
	}
	s.exclude.add(s.w)
	if complete {
		s.last = &last
		s.live.event("its output was complete: finished at the router")
		return true
	}
	s.cont.migrating(&s.req, s.g, s.w, s.role, o, r.clock.Now())
	if !s.cont.one {
		// A local request's choices go on as PD requests (exact either way).
		fan, fe := r.fanOut(s.ctx, s.g, &s.cont, s.role == workerapi.RoleColocated, s.exclude)
		if fe != nil {
			s.live.event("could not continue on other workers: " + fe.Message)
			r.log.Warn("request could not be continued", "rid", s.g.RID, "err", fe.Message)
			return false
		}
		s.fan = fan
		r.metrics.Migrated(o)
		s.live.event(fmt.Sprintf("continued choice by choice after %d output tokens (migration %d)", s.cont.progress(), s.cont.migrations))
		return true
	}
	var w *fleet.Worker
	pe := r.awaitWorker(s.ctx, func() (e *openai.Error) {
		if s.role == workerapi.RoleDecode {
			w, e = r.pickLocalExcept(&s.req, s.exclude)
		} else {
			w, e = r.pickPlainExcept(&s.req, s.exclude)
		}
		return e
	})
	if pe != nil {
		s.live.event("could not continue on another worker: " + pe.Message)
		r.log.Warn("request could not be continued", "rid", s.g.RID, "err", pe.Message)
		return false
	}
	s.gen++
	s.rid = fmt.Sprintf("%s-g%d", s.g.RID, s.gen)
	if se := s.send(w); se != nil {
		s.live.event("could not continue on another worker: " + se.Message)
		return false
	}
	r.metrics.Migrated(o)
	r.log.Info("continuing request on another worker", "rid", s.g.RID, "gen", s.gen, "output_tokens", len(s.cont.out),
		"outcome", o.String(), "err", e.Message)
	s.live.migrated(s.gen, w.URL(), len(s.cont.out), s.cont.migrations)
	return true
}

// interrupted answers a read that ended because the leg's context did:
// the client went away, the router is shutting down, or the worker was
// found down (else the leg's own timeout ran out).
func (s *plainStream) interrupted() (openai.Chunk, error) {
	switch {
	case s.ctx.Err() != nil:
		return openai.Chunk{}, s.ctx.Err()
	case closed(s.r.stopping):
		s.shutdown = true
		return openai.Chunk{}, openai.Unavailable("the router is shutting down")
	}
	var e *workerapi.Error
	if closed(s.down) {
		e = downError(s.role)
		if s.continued(e) {
			return s.Recv()
		}
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "the router found the worker down", outcome.Cause{}, nil)
	} else {
		e = malformed("worker stream closed")
	}
	s.ended = true
	s.r.metrics.LegFailed(s.role, e.Outcome)
	s.answered(s.r, e.Outcome)
	failedSpan(s.ctx, spanCause(e, s.role), s.live.stageNow())
	return openai.Chunk{}, e
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Stop ends the request as finished (a stop string matched). The leg is
// hung up only after the worker has the stop abort (abortLeg cancels it
// then), so the worker ends the request ok, not as its client going away.
func (s *plainStream) Stop() {
	if s.fan != nil {
		if !s.ended {
			s.ended, s.stopped = true, true
			s.answered(s.r, outcome.OK)
		}
		s.fan.close()
		s.fan = nil
		return
	}
	if !s.ended {
		s.ended, s.stopped = true, true
		s.stopWatching() // the client's context ends with the answer: it must not hang up the leg
		s.answered(s.r, outcome.OK)
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortStop, "", outcome.Cause{}, s.cancel)
	}
}

// StopChoice implements openai.ChoiceStopper: the worker ends choice
// index alone.
func (s *plainStream) StopChoice(index int) {
	if s.fan != nil {
		if !s.ended {
			s.fan.stopChoice(index)
		}
		return
	}
	if !s.ended && s.posted {
		s.cont.stopped(index)
		s.r.abortChoice(s.w, s.rid, index)
	}
}

// Close aborts the request if it has not ended and releases the stream.
// A leg that sent its last line is left StreamDrainTimeout to end its
// response, so its connection goes back to the pool; any other is hung up.
func (s *plainStream) Close() {
	s.stopWatching()
	s.r.untrack(s.live)
	defer func() { endSpan(s.span, s.outcome, ""); s.span = nil }()
	if s.fan != nil {
		s.fan.close()
		s.fan = nil
	}
	if !s.ended {
		s.ended = true
		if s.shutdown {
			s.answered(s.r, outcome.Shutdown)
		} else {
			s.answered(s.r, outcome.AbortedClient)
		}
		if s.posted {
			// Both the abort and the hang-up read as the client leaving.
			s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "client disconnected", outcome.Cause{}, nil)
		}
	}
	if s.resp == nil {
		s.cancel()
		s.legDone()
		return
	}
	if s.stopped {
		// Stop's abort hangs the leg up once the worker has it; until then
		// the leg is read (and its lines dropped) so the worker is not cut
		// off first.
		resp, br := s.resp, s.br
		s.r.bg.Add(1)
		go func() {
			defer s.r.bg.Done()
			defer s.legDone()
			_, _ = io.Copy(io.Discard, br)
			s.r.releaseStream(resp, br)
		}()
		return
	}
	if s.finished {
		t := time.AfterFunc(StreamDrainTimeout, s.cancel)
		drainStream(s.br)
		t.Stop()
	}
	s.cancel()
	s.r.releaseStream(s.resp, s.br)
	// The leg is over: uncount it now, so a client's next request sees
	// the worker's true load.
	s.legDone()
}

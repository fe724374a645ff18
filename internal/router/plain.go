package router

import (
	"context"
	"encoding/json"
	"io"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// plainStream is one request on one colocated worker (the router's plain
// mode): the worker's NDJSON stream relayed as an openai.Stream.
type plainStream struct {
	r        *Router
	ctx      context.Context
	w        *fleet.Worker
	legDone  func() // uncounts the leg on the worker
	rid      string
	lines    chan decodeEvent
	cancel   context.CancelFunc
	down     <-chan struct{} // closed when the worker is found down
	live     *liveRequest    // what /debug/requests shows
	ended    bool
	stopped  bool // Stop ended it: its abort cancels the leg
	finished bool
	shutdown bool // the router stopped the request: its answer was a 503
	// dispatched is when the request was sent to its worker.
	dispatched time.Time
	// more is set while lines already read wait to be decoded.
	more atomic.Bool
}

// generatePlain sends a whole request to the next healthy colocated worker.
// It is not retried: the worker's failure, or its going down, is the
// answer (plain mode is the baseline that disaggregation is compared with).
func (r *Router) generatePlain(ctx context.Context, g *openai.GenerateRequest, req *PickRequest) (openai.Stream, *openai.Error) {
	payload, err := json.Marshal(workerapi.GenerateBody{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens,
		SamplingParams: g.Sampling, StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, Buffered: g.Buffered})
	if err != nil {
		return nil, openai.Internal("encode request: %v", err)
	}
	w, e := r.pickPlain(req)
	if e != nil {
		return nil, e
	}
	lctx, cancel := r.withTimeout(context.Background(), LegTimeout)
	s := &plainStream{r: r, ctx: ctx, w: w, rid: g.RID, lines: make(chan decodeEvent, 16), cancel: cancel, down: w.Down(),
		legDone: r.legStarted(w, legTokens(workerapi.RoleColocated, req)), dispatched: r.clock.Now()}
	s.live = r.track(g.RID, "", len(g.InputIDs))
	s.live.attempt(1, w.URL(), "sent to a colocated worker")
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		defer s.legDone()
		r.runStream(lctx, w, workerapi.PathGenerate, payload, s.lines, &s.more)
	}()
	return s, nil
}

// Recv relays the worker's tokens.
func (s *plainStream) Recv() (openai.Chunk, error) {
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	select {
	case ev, ok := <-s.lines:
		e := ev.err
		if !ok {
			e = malformed("worker stream closed")
		}
		if e != nil {
			s.ended = true
			s.r.metrics.LegFailed(workerapi.RoleColocated, e.Outcome)
			s.r.metrics.Answered(e.Outcome)
			if e.Outcome == outcome.Overloaded {
				s.r.markOverloaded(s.w)
				s.r.metrics.Shed(ShedWorkerOverloaded.String())
			}
			return openai.Chunk{}, e
		}
		c := ev.chunk
		s.live.tokens(len(c.Tokens))
		if c.FinishReason != "" {
			s.finished, s.ended = true, true
			s.r.metrics.Answered(outcome.OK)
		}
		return c, nil
	case <-s.down:
		s.ended = true
		e := downError(workerapi.RoleColocated)
		s.r.metrics.LegFailed(workerapi.RoleColocated, e.Outcome)
		s.r.metrics.Answered(e.Outcome)
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "the router found the worker down", outcome.Cause{}, nil)
		return openai.Chunk{}, e
	case <-s.ctx.Done():
		return openai.Chunk{}, s.ctx.Err()
	case <-s.r.stopping:
		s.shutdown = true
		return openai.Chunk{}, openai.Unavailable("the router is shutting down")
	}
}

// Stop ends the request as finished (a stop string matched). The leg is
// hung up only after the worker has the stop abort (abortLeg cancels it
// then), so the worker ends the request ok, not as its client going away.
func (s *plainStream) Stop() {
	if !s.ended {
		s.ended, s.stopped = true, true
		s.r.metrics.Answered(outcome.OK)
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortStop, "", outcome.Cause{}, s.cancel)
	}
}

// Close aborts the request if it has not ended and releases the stream.
func (s *plainStream) Close() {
	s.r.untrack(s.live)
	if !s.ended {
		s.ended = true
		if s.shutdown {
			s.r.metrics.Answered(outcome.Shutdown)
		} else {
			s.r.metrics.Answered(outcome.AbortedClient)
		}
		// Both the abort and the hang-up read as the client leaving.
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "client disconnected", outcome.Cause{}, nil)
	}
	if s.stopped {
		s.r.bg.Add(1)
		go func() { // Stop's abort hangs the leg up once the worker has it
			defer s.r.bg.Done()
			for range s.lines {
			}
		}()
		return
	}
	endLeg(s.lines, s.cancel, s.finished)
	// The leg is over: uncount it now rather than when its goroutine gets
	// to it, so a client's next request sees the worker's true load.
	s.legDone()
}

package router

import (
	"context"
	"encoding/json"
	"io"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/worker"
)

// plainStream is one request on one colocated worker (the router's plain
// mode): the worker's NDJSON stream relayed as an openai.Stream.
type plainStream struct {
	r        *Router
	ctx      context.Context
	w        *workerState
	rid      string
	lines    chan decodeEvent
	cancel   context.CancelFunc
	down     <-chan struct{} // closed when the worker is found down
	live     *liveRequest    // what /debug/requests shows
	ended    bool
	finished bool
}

// generatePlain sends a whole request to the next healthy colocated worker;
// a worker that cannot be reached is retried once on another.
func (r *Router) generatePlain(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	payload, err := json.Marshal(worker.GenerateBody{RID: g.RID, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens,
		Temperature: g.Sampling.Temperature, TopP: g.Sampling.TopP, TopK: g.Sampling.TopK, Seed: g.Sampling.Seed,
		StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, Buffered: g.Buffered})
	if err != nil {
		return nil, openai.Internal("encode request: %v", err)
	}
	w := pick(r.colocated, &r.rrC, nil)
	if w == nil {
		r.requests.WithLabelValues("no_worker").Inc()
		e := openai.Unavailable("no healthy colocated worker (see /debug/workers)")
		e.Code = "no_worker"
		return nil, e
	}
	lctx, cancel := context.WithTimeout(context.Background(), LegTimeout)
	s := &plainStream{r: r, ctx: ctx, w: w, rid: g.RID, lines: make(chan decodeEvent, 16), cancel: cancel, down: w.downCh()}
	s.live = r.track(g.RID, "", len(g.InputIDs))
	s.live.attempt(1, w.url, "sent to a colocated worker")
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		r.runStream(lctx, w, worker.PathGenerate, payload, s.lines)
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
		switch {
		case !ok:
			e = openai.Internal("worker stream closed")
		case e == nil && ev.line.Error != nil:
			l := ev.line.Error
			e = &openai.Error{Status: ev.line.Status, Type: l.Type, Message: l.Message}
			if l.Code != nil {
				e.Code = *l.Code
			}
		}
		if e != nil {
			s.ended = true
			s.r.requests.WithLabelValues("colocated_" + e.Code).Inc()
			return openai.Chunk{}, e
		}
		c := openai.Chunk{Tokens: make([]openai.Token, len(ev.line.TokenIDs)), FinishReason: ev.line.FinishReason}
		for i, id := range ev.line.TokenIDs {
			c.Tokens[i] = openai.Token{ID: id}
			if i < len(ev.line.Logprobs) {
				c.Tokens[i].Logprob = ev.line.Logprobs[i]
			}
		}
		s.live.tokens(len(c.Tokens))
		if c.FinishReason != "" {
			s.finished, s.ended = true, true
			s.r.requests.WithLabelValues("ok").Inc()
		}
		return c, nil
	case <-s.down:
		s.ended = true
		e := downError("colocated")
		s.r.requests.WithLabelValues("colocated_" + e.Code).Inc()
		s.r.abortLeg(s.w, s.rid, "", 0, "client", "the router found the worker down", nil)
		return openai.Chunk{}, e
	case <-s.ctx.Done():
		return openai.Chunk{}, s.ctx.Err()
	case <-s.r.stopping:
		return openai.Chunk{}, openai.Unavailable("the router is shutting down")
	}
}

// Stop ends the request as finished (a stop string matched).
func (s *plainStream) Stop() {
	if !s.ended {
		s.ended = true
		s.r.requests.WithLabelValues("ok").Inc()
		s.r.abortLeg(s.w, s.rid, "", 0, "stop", "", nil)
	}
}

// Close aborts the request if it has not ended and releases the stream.
func (s *plainStream) Close() {
	s.r.untrack(s.live)
	if !s.ended {
		s.ended = true
		s.r.requests.WithLabelValues("aborted_client").Inc()
		// Both the abort and the hang-up read as the client leaving.
		s.r.abortLeg(s.w, s.rid, "", 0, "client", "client disconnected", nil)
	}
	s.cancel()
	for range s.lines {
	}
}

package router

import (
	"context"
	"fmt"
	"io"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// promptStream is a prompt-only request (max_tokens 0: completions' echo,
// with logprobs a scoring request) under disaggregation: a prefill worker
// alone computes the prompt, with no room, no decode leg and no KV
// transfer, and its answer (the prompt's logprobs) is the request's one
// chunk. A failure another worker may not have is retried on another
// prefill worker, as a PD request is before its first token.
type promptStream struct {
	r       *Router
	ctx     context.Context // the client's
	g       *openai.GenerateRequest
	req     PickRequest
	live    *liveRequest
	exclude exclusions

	// The current attempt.
	gen    int
	w      *fleet.Worker
	rid    string
	res    chan prefillResult
	cancel context.CancelFunc

	answered bool // the chunk was returned
	ended    bool // answered, failed or closed: nothing more to abort
}

// generatePrompt starts a prompt-only request on a prefill worker.
func (r *Router) generatePrompt(ctx context.Context, g *openai.GenerateRequest, req PickRequest) (openai.Stream, *openai.Error) {
	s := &promptStream{r: r, ctx: ctx, g: g, req: req, exclude: exclusions{}}
	s.live = r.track(g.RID, "", len(g.InputIDs))
	if e := s.start(); e != nil {
		r.untrack(s.live)
		return nil, e
	}
	return s, nil
}

// start sends the next attempt to a prefill worker the request has not
// failed on.
func (s *promptStream) start() *openai.Error {
	r := s.r
	cands, ready, why := r.candidates(workerapi.RolePrefill, r.clock.Now(), true, func(w *fleet.Worker) bool {
		return s.exclude.has(w) || s.req.unfit(w)
	})
	switch {
	case ready == 0:
		return noWorker("no ready prefill worker%s (see /workers)", r.whyNone(workerapi.RolePrefill, s.exclude, &s.req))
	case len(cands) == 0:
		return r.shedError(why, "every prefill worker is saturated")
	}
	w := r.choose(workerapi.RolePrefill, &s.req, cands, nil)
	s.gen++
	s.w, s.rid = w, s.g.RID
	if s.gen > 1 {
		s.rid = fmt.Sprintf("%s-g%d", s.g.RID, s.gen)
	}
	body := legBody(s.g)
	body.RID = s.rid
	payload, err := body.AppendJSON(nil)
	if err != nil {
		return openai.Internal("encode leg: %v", err)
	}
	ctx, cancel := r.withTimeout(context.Background(), r.cfg.LegTimeout)
	s.res, s.cancel = make(chan prefillResult, 1), cancel
	done := r.legStarted(w, legTokens(workerapi.RolePrefill, &s.req))
	r.bg.Add(1)
	go func(res chan<- prefillResult) {
		defer r.bg.Done()
		defer cancel()
		defer done()
		res <- r.runPrefill(ctx, w, payload, prefillLimit(s.g))
	}(s.res)
	why2 := "prompt sent to a prefill worker (no decode: max_tokens 0)"
	if s.gen > 1 {
		why2 = "retried on another prefill worker"
	}
	s.live.attempt(uint32(s.gen), w.URL(), why2)
	return nil
}

// Recv waits for the prefill worker's answer: one chunk with the prompt's
// logprobs and finish reason "length".
func (s *promptStream) Recv() (openai.Chunk, error) {
	if s.answered {
		return openai.Chunk{}, io.EOF
	}
	for {
		var e *workerapi.Error
		select {
		case p := <-s.res:
			if p.err == nil {
				s.answered, s.ended = true, true
				s.r.metrics.Answered(outcome.OK, metrics.PathPD)
				return openai.Chunk{FinishReason: "length", Done: true, PromptLogprobs: p.res.PromptLogprobs,
					CachedTokens: p.res.CachedTokens}, nil
			}
			e = p.err
		case <-s.w.Down():
			e = downError(workerapi.RolePrefill)
		case <-s.ctx.Done():
			return openai.Chunk{}, s.ctx.Err()
		case <-s.r.stopping:
			return openai.Chunk{}, openai.Unavailable("the router is shutting down")
		}
		s.cancel()
		s.r.metrics.LegFailed(workerapi.RolePrefill, e.Outcome)
		s.live.event(fmt.Sprintf("prefill leg failed (attempt %d): %s", s.gen, e.Message))
		if e.Outcome.Leaving() {
			s.r.set.MarkDraining(s.w, e.Message)
		}
		s.exclude.add(s.w)
		if e.Outcome.Retryable() && s.gen < s.r.cfg.MaxAttempts && s.ctx.Err() == nil {
			if se := s.start(); se == nil {
				s.r.metrics.Retried(e.Outcome)
				continue
			}
		}
		s.ended = true
		s.r.metrics.Answered(e.Outcome, metrics.PathPD)
		return openai.Chunk{}, e
	}
}

// Stop has nothing to stop: the request has no output a stop string
// could end.
func (s *promptStream) Stop() {}

// Close aborts the prefill leg if it has not answered (the client is gone).
func (s *promptStream) Close() {
	s.r.untrack(s.live)
	if !s.ended {
		s.ended = true
		s.r.metrics.Answered(outcome.AbortedClient, metrics.PathPD)
		s.r.abortLeg(s.w, s.rid, "", 0, workerapi.AbortClient, "client disconnected", outcome.Cause{}, s.cancel)
	}
}

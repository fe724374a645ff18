package router

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// DefaultMaxMigrations is Config.MaxMigrations' default (Dynamo's
// migration_limit is the same idea): a request is continued on a new pair
// at most this many times.
const DefaultMaxMigrations = 3

// continuation is what the router knows of a request's output so far, so
// that a leg that breaks after output reached the client is continued on
// another worker from where it stopped: the new legs' prompt is the
// request's prompt followed by the output already returned
// (workerapi.GenerateBody.ContinuedTokens), with what is left of max_tokens
// and min_tokens and of the request's own timeout. The workers sample
// output step k of the continuation exactly as step k of the uninterrupted
// run (the draw is a function of (seed, step), the kernels' bits do not
// depend on batch or chunking), so the client gets the very tokens an
// uninterrupted run gives. The stop strings are the front end's, which
// sees one stream throughout.
//
// A request with n > 1 choices is not continued (its choices diverge after
// the first token, and a leg continues one sequence).
type continuation struct {
	// max is Config.MaxMigrations (≤ 0: none); one says the request has
	// one choice.
	max int
	one bool
	// out are the ids of the output tokens returned so far; budget is the
	// whole max_tokens of the request's first legs; started is when they
	// were sent (the request's timeout counts from there).
	out     []int32
	budget  int
	started time.Time
	// migrations counts continuations; last is the failure that caused the
	// last one (its leg's role and outcome, and len(out) then).
	migrations int
	last       struct {
		role workerapi.Role
		o    outcome.Outcome
		at   int
	}
	// brokeAt is when the leg that the next token continues broke (zero:
	// no continuation waits for its first token).
	brokeAt time.Time
}

// newContinuation returns the continuation state of request g.
func (r *Router) newContinuation(g *openai.GenerateRequest) continuation {
	return continuation{max: r.cfg.MaxMigrations, one: g.N <= 1, started: r.clock.Now()}
}

// on reports whether the request may be continued at all.
func (c *continuation) on() bool { return c.max > 0 && c.one }

// returned records the tokens of chunk ch, returned to the client.
func (c *continuation) returned(r *Router, ch *openai.Chunk) {
	if !c.on() {
		return
	}
	for _, t := range ch.Tokens {
		c.out = append(c.out, t.ID)
	}
	if !c.brokeAt.IsZero() {
		r.metrics.MigrationDelay(r.clock.Now().Sub(c.brokeAt))
		c.brokeAt = time.Time{}
	}
}

// refuse returns why a request whose role leg failed with o after output
// reached the client is not continued, or "" if it is. workerDown says the
// failed worker did not answer a probe after the failure.
func (c *continuation) refuse(r *Router, role workerapi.Role, o outcome.Outcome, workerDown bool, ctx context.Context) string {
	switch {
	case !c.one:
		return "a request with n > 1 choices is not continued"
	case c.max <= 0:
		return "--max-migrations is 0"
	case !o.Migratable():
		return fmt.Sprintf("%s is the request's failure, not its worker's", o)
	case c.migrations >= c.max:
		return fmt.Sprintf("it was continued %d times already (--max-migrations)", c.migrations)
	case ctx.Err() != nil:
		return "the client is gone"
	case closed(r.stopping):
		return "the router is shutting down"
	case c.migrations > 0 && c.last.role == role && c.last.o == o && c.last.at == len(c.out) && !workerDown:
		// The same failure again, on a second pair, before any new token,
		// and the worker still answers: the request, not a worker, is
		// what fails (no storm of continuations).
		return fmt.Sprintf("its %s leg failed with %s again on a new pair before any new token, its worker still up", role, o)
	}
	return ""
}

// migrating records a continuation about to start because the role leg
// failed with o, and sets req to place it: its prompt is the output so far
// appended to the request's, its budget what is left.
func (c *continuation) migrating(req *PickRequest, g *openai.GenerateRequest, role workerapi.Role, o outcome.Outcome, now time.Time) {
	c.migrations++
	c.last.role, c.last.o, c.last.at = role, o, len(c.out)
	c.brokeAt = now
	req.InputIDs = c.prompt(g)
	req.MaxTokens = max(c.budget-len(c.out), 1)
	req.MinTokens = max(g.MinTokens-len(c.out), 0)
	if !slices.Contains(req.Needs, workerapi.FeatureContinue) {
		req.Needs = append(slices.Clip(req.Needs), workerapi.FeatureContinue)
	}
	req.hashes = pageHashes{} // of the old prompt
}

// prompt is a continuation's input_ids: g's prompt, then the output so far.
func (c *continuation) prompt(g *openai.GenerateRequest) []int32 {
	return append(slices.Clip(g.InputIDs), c.out...)
}

// body is the leg body of request g on workers ws: legBody's, with
// max_tokens cut to what the workers' contexts hold (legMaxTokens); for a
// continuation, the prompt followed by the output so far, and what is left
// of max_tokens, min_tokens and the timeout.
func (c *continuation) body(r *Router, g *openai.GenerateRequest, ws ...*fleet.Worker) workerapi.GenerateBody {
	b := legBody(g)
	b.MaxTokens = legMaxTokens(g, ws...)
	k := len(c.out)
	if c.migrations == 0 || k == 0 {
		return b
	}
	b.InputIDs = c.prompt(g)
	b.ContinuedTokens = k
	b.MaxTokens = max(min(b.MaxTokens, c.budget)-k, 1)
	b.MinTokens = max(g.MinTokens-k, 0)
	b.PromptLogprobs, b.N = nil, 0
	if g.Timeout > 0 {
		left := g.Timeout - r.clock.Now().Sub(c.started)
		b.TimeoutMS = max(1, left.Milliseconds())
	}
	return b
}

// ended returns the last chunk of a request whose output so far already
// ends it, though its leg broke before saying so: it reached max_tokens
// (or what the context holds), or its last token is a stop token id or,
// unless ignore_eos without a constraint, EOS. ok is false when the
// request goes on.
func (c *continuation) ended(g *openai.GenerateRequest, eos []int32, contextLen int) (last openai.Chunk, ok bool) {
	k := len(c.out)
	if !c.on() || k == 0 {
		return openai.Chunk{}, false
	}
	tok := c.out[k-1]
	switch {
	case slices.Contains(g.StopTokenIDs, tok) || ((!g.IgnoreEOS || !g.Constraint.IsZero()) && slices.Contains(eos, tok)):
		return openai.Chunk{FinishReason: "stop", Done: true}, true
	case k >= c.budget || len(g.InputIDs)+k >= contextLen:
		return openai.Chunk{FinishReason: "length", Done: true}, true
	}
	return openai.Chunk{}, false
}

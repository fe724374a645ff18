package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// DefaultMigrationWait is Config.MigrationWait's default: about the time a
// restarted worker takes to be ready again (two passing health checks at
// the default 2 s interval, and its start).
const DefaultMigrationWait = 10 * time.Second

// awaitWorker calls place until it finds workers for a continuation: while
// it answers no_worker (no worker of a role is ready: the other one may be
// restarting) it tries again every poll, up to Config.MigrationWait; the
// client's stream just pauses longer. It returns place's last error, or the
// reason it stopped waiting.
func (r *Router) awaitWorker(ctx context.Context, place func() *openai.Error) *openai.Error {
	e := place()
	if e == nil || e.Code != outcome.NoWorker.String() || r.cfg.MigrationWait <= 0 {
		return e
	}
	poll := min(r.cfg.HealthInterval/4, 250*time.Millisecond)
	deadline := r.clock.Now().Add(r.cfg.MigrationWait)
	for r.clock.Now().Before(deadline) {
		t := r.clock.NewTimer(poll)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return e
		case <-r.stopping:
			t.Stop()
			return e
		}
		if e = place(); e == nil || e.Code != outcome.NoWorker.String() {
			return e
		}
	}
	e.Message += fmt.Sprintf(" (waited %s for one)", r.cfg.MigrationWait)
	return e
}

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
// A request with n > 1 choices is continued choice by choice (choiceFan):
// its choices diverge after the first token, and a leg continues one
// sequence.
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
	// outs and fin are, for a request with n > 1 choices, each choice's
	// output so far and whether it finished.
	outs [][]int32
	fin  []bool
	// migrations counts continuations; last is the failure that caused the
	// last one (its leg's role and outcome, and len(out) then).
	migrations int
	last       struct {
		role workerapi.Role
		o    outcome.Outcome
		at   int
	}
	// brokeAt is when the leg that the next token continues broke (zero:
	// no continuation waits for its first token); buffered says the
	// request's legs send their tokens at most once a second (its client
	// waits for the whole answer): the delay is not observed then.
	brokeAt  time.Time
	buffered bool
	// numerics is the KV fingerprint of the workers that computed the
	// output so far (set at the first migration): every continuation
	// stays on workers that compute the same (PickRequest.Numerics).
	numerics kvxfer.Fingerprint
}

// newContinuation returns the continuation state of request g.
func (r *Router) newContinuation(g *openai.GenerateRequest) continuation {
	return continuation{max: r.cfg.MaxMigrations, one: g.N <= 1, started: r.clock.Now(), buffered: g.Buffered}
}

// on reports whether the request may be continued at all.
func (c *continuation) on() bool { return c.max > 0 }

// returned records chunk ch, returned to the client: its tokens, and the
// end of its choice.
func (c *continuation) returned(r *Router, ch *openai.Chunk) {
	if !c.on() {
		return
	}
	if c.one {
		for _, t := range ch.Tokens {
			c.out = append(c.out, t.ID)
		}
	} else if i := ch.Index; i >= 0 && i < model.MaxForks {
		for len(c.outs) <= i {
			c.outs, c.fin = append(c.outs, nil), append(c.fin, false)
		}
		for _, t := range ch.Tokens {
			c.outs[i] = append(c.outs[i], t.ID)
		}
		c.fin[i] = c.fin[i] || ch.FinishReason != ""
	}
	if !c.brokeAt.IsZero() && len(ch.Tokens) > 0 {
		if !c.buffered {
			r.metrics.MigrationDelay(r.clock.Now().Sub(c.brokeAt))
		}
		c.brokeAt = time.Time{}
	}
}

// stopped records that a stop string ended choice i (n > 1): it is not
// continued.
func (c *continuation) stopped(i int) {
	if !c.one && i >= 0 && i < len(c.fin) {
		c.fin[i] = true
	}
}

// refuse returns why a request whose role leg failed with o after output
// reached the client is not continued, or "" if it is. workerDown says the
// failed worker did not answer a probe after the failure.
func (c *continuation) refuse(r *Router, role workerapi.Role, o outcome.Outcome, workerDown bool, ctx context.Context) string {
	switch {
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
	case c.migrations > 0 && c.last.role == role && c.last.o == o && c.last.at == c.progress() && !workerDown:
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
// from is the worker whose leg failed (its KV fingerprint is the output's
// numerics, if the first migration).
func (c *continuation) migrating(req *PickRequest, g *openai.GenerateRequest, from *fleet.Worker, role workerapi.Role, o outcome.Outcome, now time.Time) {
	if c.numerics == (kvxfer.Fingerprint{}) {
		c.numerics = from.Info().Fingerprint
	}
	c.migrations++
	c.last.role, c.last.o, c.last.at = role, o, c.progress()
	c.brokeAt = now
	if c.one {
		c.place(req, g)
	}
}

// progress is how many output tokens reached the client, over every choice.
func (c *continuation) progress() int {
	n := len(c.out)
	for _, o := range c.outs {
		n += len(o)
	}
	return n
}

// place sets req to place the continuation of the output so far: its
// prompt is the output appended to the request's, its budget what is left.
func (c *continuation) place(req *PickRequest, g *openai.GenerateRequest) {
	req.InputIDs = c.prompt(g)
	req.Numerics = c.numerics
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

// exclusions are the workers a request must not go back to (they are
// leaving, unreachable, broke its stream, refused the KV handshake or
// failed a probe), each with the process (fleet.Info.Instance) that failed
// it: a worker restarted since — a new instance, ready again — is a new
// process and may serve the request. In a rolling restart, the worker a
// request left first is often the only one back when the next one drains.
type exclusions map[*fleet.Worker]string

// add excludes w as it runs now.
func (x exclusions) add(w *fleet.Worker) { x[w] = w.Info().Instance }

// has reports whether w is excluded: it still runs the process that
// failed the request (or that process was never known).
func (x exclusions) has(w *fleet.Worker) bool {
	inst, ok := x[w]
	return ok && (inst == "" || w.Info().Instance == inst)
}

// midStream is what a request's stream (PD or plain) keeps to go on when
// its worker fails after output reached the client.
type midStream struct {
	// cont is the output so far; last, when set, is the request's last
	// chunk, made by the router (a leg broke after the output was
	// complete).
	cont continuation
	last *openai.Chunk
	// fan, once set, continues a request with n > 1 choices choice by
	// choice; quiet marks a stream that is one such choice's (the request
	// is counted once, by its parent).
	fan   *choiceFan
	quiet bool
	// outcome is the request's answer, once counted; path is how it is
	// served (the path label: metrics.PathPD, PathLocal, PathColocated).
	outcome outcome.Outcome
	path    string
}

// answered counts the request's answer with o, unless it is a choice's
// continuation.
func (m *midStream) answered(r *Router, o outcome.Outcome) {
	m.outcome = o
	if !m.quiet {
		path := m.path
		if path == "" {
			path = metrics.PathPD
		}
		r.metrics.Answered(o, path)
	}
}

// answeredWith is the request's answer, once counted (None before).
func (m *midStream) answeredWith() outcome.Outcome { return m.outcome }

// fanRecv returns the next chunk of the fan's continuations (live counts
// its tokens); ended says the request ended with it: its last chunk, or
// its failure (counted; not when the client left or the router stops).
func (m *midStream) fanRecv(r *Router, ctx context.Context, live *liveRequest) (c openai.Chunk, ended bool, err error) {
	c, err = m.fan.recv(r.stopping)
	switch {
	case err != nil:
		if closed(r.stopping) || ctx.Err() != nil {
			return c, false, err
		}
		m.answered(r, errOutcome(err))
		return c, true, err
	case c.Done:
		m.answered(r, outcome.OK)
		ended = true
	}
	live.tokens(len(c.Tokens))
	return c, ended, nil
}

// choiceFan continues a request with n > 1 choices whose leg broke after
// output reached the client: each choice not finished yet goes on as a
// request of its own with one choice (its seed model.ForkSeed(seed, i), as
// the worker draws choice i; its output so far continued as a one-choice
// request's is), and their chunks are merged back under their indexes.
// Each sub-stream is read by its own goroutine.
type choiceFan struct {
	subs map[int]*fanSub
	// pending are the last chunks of choices whose output was complete
	// (made by the router), returned first; events the sub-streams'.
	pending []fanEvent
	events  chan fanEvent
	live    int          // choices not finished
	ended   map[int]bool // choices finished or stopped
	ctx     context.Context
}

// fanSub is one choice's continuation.
type fanSub struct {
	st     openai.Stream
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when its reader returned
}

// fanEvent is a chunk, or the end, of one choice's continuation.
type fanEvent struct {
	index int
	c     openai.Chunk
	err   error
}

// fanOut starts the continuations of request g's unfinished choices on
// new workers (colocated ones when plain), avoiding exclude. cont is the
// parent's state: each choice's output so far, and the migrations so far.
func (r *Router) fanOut(ctx context.Context, g *openai.GenerateRequest, cont *continuation, plain bool,
	exclude exclusions) (*choiceFan, *openai.Error) {
	f := &choiceFan{subs: map[int]*fanSub{}, events: make(chan fanEvent, 16), ended: map[int]bool{}, ctx: ctx}
	for i := range max(g.N, 1) {
		if i < len(cont.fin) && cont.fin[i] {
			continue
		}
		var out []int32
		if i < len(cont.outs) {
			out = cont.outs[i]
		}
		one := continuation{max: cont.max, one: true, out: out, budget: cont.budget}
		if last, ok := one.ended(g, r.cfg.EOS, r.cfg.ContextLen); ok {
			// Its output was complete: only the line saying so was lost.
			last.Index = i
			f.pending = append(f.pending, fanEvent{index: i, c: last})
			f.live++
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		st, e := r.choiceStream(sctx, g, i, out, cont, plain, exclude)
		cont.brokeAt = time.Time{} // the first choice's continuation observes the delay
		if e != nil {
			cancel()
			f.close()
			return nil, e
		}
		sub := &fanSub{st: st, ctx: sctx, cancel: cancel, done: make(chan struct{})}
		f.subs[i] = sub
		f.live++
		go f.read(i, sub)
	}
	return f, nil
}

// choiceStream starts choice i of request g, whose output so far is out,
// as a request of its own.
func (r *Router) choiceStream(ctx context.Context, g *openai.GenerateRequest, i int, out []int32, parent *continuation, plain bool,
	exclude exclusions) (openai.Stream, *openai.Error) {
	gi := *g
	gi.RID = fmt.Sprintf("%s-c%d", g.RID, i)
	gi.N = 1
	gi.Sampling.Seed = model.ForkSeed(g.Sampling.Seed, i)
	gi.ScorePrompt, gi.PromptTopLogprobs = false, 0
	cont := continuation{max: parent.max, one: true, out: slices.Clone(out), budget: parent.budget, started: parent.started,
		migrations: parent.migrations, brokeAt: parent.brokeAt, buffered: parent.buffered, numerics: parent.numerics}
	tmpl := legBody(&gi)
	req := PickRequest{RID: gi.RID, InputIDs: gi.InputIDs, MaxTokens: gi.MaxTokens, MaxTokensDefault: gi.MaxTokensDefault,
		MinTokens: gi.MinTokens, Needs: workerapi.FeaturesOf(&tmpl)}
	if len(out) > 0 {
		cont.place(&req, &gi)
	}
	excl := maps.Clone(exclude)
	if plain {
		s := &plainStream{r: r, ctx: ctx, g: &gi, req: req, role: workerapi.RoleColocated, rid: gi.RID, gen: 1, limit: prefillLimit(&gi),
			midStream: midStream{cont: cont, quiet: true}, exclude: excl}
		var w *fleet.Worker
		if e := r.awaitWorker(ctx, func() (e *openai.Error) {
			w, e = r.pickPlainExcept(&s.req, excl)
			return e
		}); e != nil {
			return nil, e
		}
		s.live = r.track(gi.RID, "", len(g.InputIDs))
		if e := s.send(w); e != nil {
			r.untrack(s.live)
			s.stopWatching()
			s.cancel()
			s.legDone()
			return nil, e
		}
		s.live.migrated(1, w.URL(), len(out), cont.migrations)
		return s, nil
	}
	s := &pdStream{r: r, ctx: ctx, g: &gi, rid: gi.RID, room: kvxfer.NewRoom().String(), req: req,
		exclude: excl, avoid: map[*fleet.Worker]bool{}, midStream: midStream{cont: cont, quiet: true}}
	s.live = r.track(gi.RID, s.room, len(g.InputIDs))
	if e := r.awaitWorker(ctx, func() *openai.Error { return s.start(1) }); e != nil {
		r.untrack(s.live)
		return nil, e
	}
	return s, nil
}

// read relays choice i's continuation to the fan's events until it ends.
func (f *choiceFan) read(i int, sub *fanSub) {
	defer close(sub.done)
	for {
		c, err := sub.st.Recv()
		if err != nil && sub.ctx.Err() != nil {
			return // stopped (a stop string ended the choice), or the request ended
		}
		if err == nil {
			c.Index = i
		}
		select {
		case f.events <- fanEvent{index: i, c: c, err: err}:
		case <-sub.ctx.Done(): // ends with the parent's, or by close
			return
		}
		if err != nil || c.FinishReason != "" {
			return
		}
	}
}

// recv returns the next chunk of any choice; the last choice's last chunk
// is Done. A choice's failure is the request's.
func (f *choiceFan) recv(stopping <-chan struct{}) (openai.Chunk, error) {
	for {
		var ev fanEvent
		if len(f.pending) > 0 {
			ev, f.pending = f.pending[0], f.pending[1:]
		} else {
			select {
			case ev = <-f.events:
			case <-f.ctx.Done():
				return openai.Chunk{}, f.ctx.Err()
			case <-stopping:
				return openai.Chunk{}, openai.Unavailable("the router is shutting down")
			}
		}
		if ev.err != nil {
			if errors.Is(ev.err, io.EOF) {
				continue
			}
			return openai.Chunk{}, ev.err
		}
		if f.ended[ev.index] {
			continue // stopped meanwhile
		}
		c := ev.c
		c.Done = false
		if c.FinishReason != "" {
			f.ended[ev.index] = true
			f.live--
			c.Done = f.live == 0
		}
		return c, nil
	}
}

// stopChoice ends choice i's continuation (a stop string ended it).
func (f *choiceFan) stopChoice(i int) {
	if sub := f.subs[i]; sub != nil && !f.ended[i] {
		f.ended[i] = true
		f.live--
		sub.cancel()
	}
}

// close ends every continuation still running and releases them.
func (f *choiceFan) close() {
	for _, sub := range f.subs {
		sub.cancel()
	}
	for _, sub := range f.subs {
		<-sub.done
		sub.st.Close()
	}
	f.subs = nil
}

package router

import (
	"context"
	"fmt"
	"math"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Per-request disaggregation. With Config.DisaggMinPromptTokens N > 0, the
// router serves a request on its decode worker alone — decode computes the
// prompt itself, as a colocated worker does, and no prefill worker or KV
// transfer is involved — when the part of its prompt the decode worker
// does not already hold is short:
//
//	uncached  = prompt tokens − tokens the decode worker is believed to hold
//	threshold = N + min(prefill backlog, (LocalBoostCap − 1) × N)
//	local     ⇔ uncached < threshold
//
// The prefill backlog is the prompt tokens the least loaded prefill worker
// the request could pair with must get through before it (its load:
// queued and running prompt tokens, from its load reports and the legs
// this router sent since). A request that would wait behind that much
// prefill work is served sooner by its decode worker as long as its own
// prompt is shorter than the wait; the cap bounds what a local prefill
// may cost the decode worker's running sequences (their next tokens wait
// for its chunks), so the threshold never exceeds LocalBoostCap × N.
// Dynamo's conditional disaggregation makes the same choice with its
// max_local_prefill_length (an uncached prompt at most that long is
// prefilled on the decode worker) and sends every prompt local while
// prefill's queue holds max_prefill_queue_size requests; here the backlog
// raises the threshold instead, capped, so long prompts still go to
// prefill. llm-d's pd-profile-handler has a threshold in prompt tokens.
//
// The tokens the decode worker holds are known only to the cache_aware
// decode policy (its record of the prompts the router sent to the worker,
// cacheaware.go); with another decode policy the whole prompt counts as
// uncached.
//
// Only the first placement of a request decides; a request that asks for
// a prompt-only answer (max_tokens 0) keeps its path (a prefill worker),
// and only decode workers that list workerapi.FeatureLocal take a local
// request. A local request is a plainStream with role decode: its
// deadline, its abort when the client leaves, its continuation on another
// decode worker when its worker fails after output reached the client
// (--max-migrations), and /debug/requests are a colocated request's. A
// failure before any output is the answer, as for a colocated request.

// LocalBoostCap bounds how far a prefill backlog raises the local
// threshold: to at most LocalBoostCap × Config.DisaggMinPromptTokens.
const LocalBoostCap = 4

// LocalThreshold returns the uncached prompt length below which a request
// is served on its decode worker alone, for --disagg-min-prompt-tokens
// minTokens and a prefill backlog of backlog prompt tokens (0 when minTokens
// is 0: always disaggregate). It saturates at math.MaxInt (always local)
// instead of overflowing for a huge minTokens.
func LocalThreshold(minTokens, backlog int) int {
	if minTokens <= 0 {
		return 0
	}
	if minTokens > math.MaxInt/LocalBoostCap {
		return math.MaxInt
	}
	return minTokens + min(max(backlog, 0), (LocalBoostCap-1)*minTokens)
}

// localDecision is the router's choice for one request: local or not, and
// the inputs (for /debug/requests and the tests).
type localDecision struct {
	local     bool
	uncached  int // prompt tokens the decode worker must compute
	cached    int // prompt tokens it is believed to hold
	backlog   int // the least loaded partner prefill worker's prompt tokens
	threshold int
}

func (d localDecision) String() string {
	verb := "≥"
	if d.local {
		verb = "<"
	}
	return fmt.Sprintf("uncached prompt %d tokens (%d cached on decode) %s threshold %d (prefill backlog %d tokens)",
		d.uncached, d.cached, verb, d.threshold, d.backlog)
}

// decideLocal decides whether req, whose decode worker is chosen (req.cached
// set by choose), goes local, given the prefill workers it could pair with.
func decideLocal(minTokens int, req *PickRequest, prefills []Candidate) localDecision {
	backlog := -1
	for _, c := range prefills {
		if backlog < 0 || c.Load.Tokens < backlog {
			backlog = c.Load.Tokens
		}
	}
	backlog = max(backlog, 0)
	d := localDecision{cached: req.cached, backlog: backlog, threshold: LocalThreshold(minTokens, backlog)}
	d.uncached = max(len(req.InputIDs)-req.cached, 0)
	d.local = d.uncached < d.threshold
	return d
}

// localOn reports whether g may be served locally: per-request
// disaggregation is on and g generates (a prompt-only request goes to a
// prefill worker).
func (r *Router) localOn(g *openai.GenerateRequest) bool {
	return r.cfg.DisaggMinPromptTokens > 0 && g.MaxTokens > 0
}

// localHook returns the pickPair hook that decides, for the decode worker
// chosen, whether the request goes local; the decision is left in *d.
func (r *Router) localHook(req *PickRequest, d *localDecision) func(*fleet.Worker, []Candidate) bool {
	return func(dw *fleet.Worker, prefills []Candidate) bool {
		if !hasFeature(dw, workerapi.FeatureLocal) {
			*d = localDecision{}
			return false
		}
		*d = decideLocal(r.cfg.DisaggMinPromptTokens, req, prefills)
		return d.local
	}
}

// hasFeature reports whether w lists feature f.
func hasFeature(w *fleet.Worker, f string) bool {
	for _, have := range w.Info().Features {
		if have == f {
			return true
		}
	}
	return false
}

// generateLocal serves g on decode worker w alone.
func (r *Router) generateLocal(ctx context.Context, g *openai.GenerateRequest, req *PickRequest, w *fleet.Worker,
	d localDecision) (openai.Stream, *openai.Error) {
	r.log.Debug("serving request locally on a decode worker", "rid", g.RID, "decode", w.URL(), "uncached", d.uncached,
		"threshold", d.threshold, "prefill_backlog", d.backlog)
	if r.cfg.Recorder != nil {
		r.cfg.Recorder.ServedLocally(len(g.InputIDs))
	}
	return r.generateAlone(ctx, g, req, w, workerapi.RoleDecode, metrics.PathLocal,
		"served locally on a decode worker: "+d.String())
}

// pickLocalExcept chooses a decode worker for a continuation of local
// request req (its output began reaching the client): any usable decode
// worker not in exclude that fits req and takes local requests, with no
// admission (shedding it now would lose its output).
func (r *Router) pickLocalExcept(req *PickRequest, exclude exclusions) (*fleet.Worker, *openai.Error) {
	cands, _, _ := r.candidates(workerapi.RoleDecode, r.clock.Now(), false, func(w *fleet.Worker) bool {
		return exclude.has(w) || req.unfit(w) || !hasFeature(w, workerapi.FeatureLocal)
	})
	if len(cands) == 0 {
		e := openai.Unavailable("no other healthy decode worker%s (see /workers)", r.whyNone(workerapi.RoleDecode, exclude, req))
		e.Code = outcome.NoWorker.String()
		return nil, e
	}
	return r.choose(workerapi.RoleDecode, req, cands, nil), nil
}

package router

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
)

// Policy chooses the worker of one role for a request, among candidates the
// router has already filtered: ready, not excluded by the request's
// retries, compatible with the other leg's worker, on a KV path whose
// breaker lets it through, not saturated (admission), the failed pair's
// workers left out when others remain (the retry's soft avoid set), and a
// worker in slow start kept in the running with the probability of its
// weight. A policy only ranks what is left, so slow start and the retry
// rules hold whatever it is.
//
// A policy is chosen per role (--prefill-policy, --decode-policy; a
// colocated worker is chosen by the decode policy). Policies are registered
// by name in [policies]. The cache_aware policy ([PolicyCacheAware],
// cacheaware.go) reads PickRequest.InputIDs, scores candidates by the
// prefix the router sent them, weighs that against Candidate.Load, and
// records where each request went through [PolicyObserver].
//
// Pick is called concurrently from many requests; an implementation keeps
// its own state safe.
type Policy interface {
	// Name is the policy's name (the metrics label, the flag's value).
	Name() string
	// Pick returns the index in cands (len(cands) ≥ 1) of the worker to use.
	Pick(req *PickRequest, cands []Candidate) int
}

// PolicyObserver is implemented by policies that keep state per worker
// (e.g. a prefix tree per worker): Chosen is called for the worker each
// request was sent to, Forget when a worker leaves the fleet.
type PolicyObserver interface {
	Chosen(req *PickRequest, w *fleet.Worker)
	Forget(w *fleet.Worker)
}

// PickRequest is what a policy may know of the request it places.
type PickRequest struct {
	RID string
	// InputIDs is the tokenized prompt (its length is the prompt tokens).
	InputIDs []int32
	// MaxTokens is the request's output budget.
	MaxTokens int
	// MaxTokensDefault says the client gave no max_tokens
	// (openai.GenerateRequest.MaxTokensDefault): a worker whose context
	// holds the prompt and MinTokens output tokens (at least one) is a
	// candidate, its leg's max_tokens cut to what its context leaves.
	// Otherwise only a worker whose context holds the prompt plus
	// MaxTokens is.
	MaxTokensDefault bool
	MinTokens        int
	// Needs lists the worker features (workerapi.Feature…) the request
	// uses: a worker that does not list one of them is not a candidate.
	Needs []string
	// Numerics, set on a continuation (its output so far was computed by
	// workers with this KV fingerprint), keeps it on workers with the same
	// weights (Digest) and KV cache element type (DType): another dtype
	// rounds K and V differently, and the continued output would not be
	// the uninterrupted one. Zero: any worker.
	Numerics kvxfer.Fingerprint

	// hashes memoizes the prompt's page hashes for the cache_aware policy.
	hashes pageHashes
	// cached is the prompt tokens the worker last chosen for the request is
	// believed to hold, as the cache_aware policy saw them before it chose
	// (0 with another policy): what per-request disaggregation counts as
	// cached on the decode worker.
	cached int
}

// missing returns the first of the request's needs that w does not list,
// or "" (also for a nil request).
func (q *PickRequest) missing(w *fleet.Worker) string {
	if q == nil || len(q.Needs) == 0 {
		return ""
	}
	have := w.Info().Features
	for _, f := range q.Needs {
		if !slices.Contains(have, f) {
			return f
		}
	}
	return ""
}

// computesOtherwise returns what in w's KV fingerprint differs from the
// request's Numerics (e.g. "dtype f32 vs f16"), or "" when it computes the
// same (or either is not known).
func (q *PickRequest) computesOtherwise(w *fleet.Worker) string {
	if q == nil || q.Numerics == (kvxfer.Fingerprint{}) {
		return ""
	}
	fp := w.Info().Fingerprint
	if fp == (kvxfer.Fingerprint{}) {
		return ""
	}
	var diffs []string
	if fp.Digest != q.Numerics.Digest {
		diffs = append(diffs, fmt.Sprintf("digest %s vs %s", fp.Digest, q.Numerics.Digest))
	}
	if fp.DType != q.Numerics.DType {
		diffs = append(diffs, fmt.Sprintf("dtype %s vs %s", fp.DType, q.Numerics.DType))
	}
	return strings.Join(diffs, ", ")
}

// need is the context (in tokens) a worker must serve to take the
// request: the prompt and its output budget, at least one token past the
// prompt (as a worker admits a leg); for a default max_tokens, the prompt
// and min_tokens. 0 for a nil request.
func (q *PickRequest) need() int {
	if q == nil {
		return 0
	}
	out := q.MaxTokens
	if q.MaxTokensDefault {
		out = q.MinTokens
	}
	return len(q.InputIDs) + max(out, 1)
}

// short returns w's context length if it cannot hold the request (need),
// else 0 (also when w's context is not known yet).
func (q *PickRequest) short(w *fleet.Worker) int {
	n := q.need()
	if n == 0 {
		return 0
	}
	if c := w.Info().ContextLen; c > 0 && c < n {
		return c
	}
	return 0
}

// unfit reports that w may not take the request: it lacks a feature the
// request uses, its context cannot hold it, or (a continuation) it computes
// with other weights or another KV dtype than the output so far.
func (q *PickRequest) unfit(w *fleet.Worker) bool {
	return q.missing(w) != "" || q.short(w) != 0 || q.computesOtherwise(w) != ""
}

// Candidate is one worker a policy may choose, with the router's estimate
// of its load.
type Candidate struct {
	Worker *fleet.Worker
	Load   Load
}

// Load is the router's estimate of a worker's load when a request is
// placed: its own legs in flight on the worker (known at once) combined with
// what the worker last reported, if that report is fresher than
// --load-staleness. See the router's load estimate (load.go).
type Load struct {
	// Legs is the router's legs in flight on the worker.
	Legs int
	// Tokens is, for a prefill worker, the prompt tokens it has to compute
	// (outstanding prompt tokens); for a decode or colocated worker the
	// tokens (prompt + max_tokens) its requests may hold in its KV pool.
	Tokens int
	// Queue is the requests waiting to start on the worker.
	Queue float64
	// KVUse is the decode or colocated worker's KV pool use in [0, 1] (0
	// when its pool size is not known yet).
	KVUse float64
	// Fresh says a worker's report within --load-staleness took part.
	Fresh bool
	// Score ranks workers for least_load and power_of_two, lower is
	// better: outstanding prompt tokens for prefill; for decode and
	// colocated KVUse + Queue / decode-queue-threshold + Legs / max-running
	// (KV headroom first, then queue, then fewer sequences in the batch).
	Score float64
}

// policies are the pair policies by name, each a constructor of a fresh
// instance (one per role).
var policies = map[string]func(deps policyDeps) Policy{
	PolicyRoundRobin: func(policyDeps) Policy { return &roundRobin{} },
	PolicyLeastLoad:  func(policyDeps) Policy { return &leastLoad{} },
	PolicyPowerOfTwo: func(d policyDeps) Policy { return &powerOfTwo{intn: d.intn} },
	PolicyCacheAware: func(d policyDeps) Policy { return newCacheAware(d) },
}

// Policy names.
const (
	// PolicyRoundRobin takes the candidates in turn.
	PolicyRoundRobin = "round_robin"
	// PolicyLeastLoad takes the candidate with the lowest Load.Score,
	// ties in turn.
	PolicyLeastLoad = "least_load"
	// PolicyPowerOfTwo draws two candidates at random and takes the one
	// with the lower Load.Score (Mitzenmacher, "The Power of Two Choices
	// in Randomized Load Balancing", 2001; SGLang's router's power_of_two).
	PolicyPowerOfTwo = "power_of_two"
)

// PolicyNames lists the policies, sorted.
func PolicyNames() []string {
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// policyDeps are what a policy may draw on.
type policyDeps struct {
	// intn returns a uniform number in [0, n).
	intn func(n int) int
	// now is the router's clock; seed the page hash's seed, shared by the
	// roles' policies so a request's pages are hashed once.
	now  func() time.Time
	seed maphash.Seed
	// capacity returns a worker's KV pool size in pages (0: not known).
	capacity func(w *fleet.Worker) int
	// cacheAware tunes the cache_aware policy.
	cacheAware CacheAwareConfig
	// matched observes each leg the cache_aware policy placed: its prompt
	// tokens and those the chosen worker is believed to hold (nil: none).
	matched func(prompt, matched int)
}

// newPolicy returns a new instance of the policy named name.
func newPolicy(name string, d policyDeps) (Policy, error) {
	mk, ok := policies[name]
	if !ok {
		return nil, fmt.Errorf("unknown pair policy %q: want %s", name, strings.Join(PolicyNames(), ", "))
	}
	return mk(d), nil
}

// roundRobin takes the candidates in turn: the position advances by one
// each pick, modulo the number of candidates.
type roundRobin struct{ next atomic.Uint64 }

func (*roundRobin) Name() string { return PolicyRoundRobin }

func (p *roundRobin) Pick(_ *PickRequest, cands []Candidate) int {
	return int(p.next.Add(1) % uint64(len(cands)))
}

// leastLoad takes the lowest score; among equal scores it takes them in
// turn, so that equal workers (an idle fleet) share requests as round robin
// would.
type leastLoad struct{ next atomic.Uint64 }

func (*leastLoad) Name() string { return PolicyLeastLoad }

// scoreEpsilon is the difference below which two scores are equal.
const scoreEpsilon = 1e-9

func (p *leastLoad) Pick(_ *PickRequest, cands []Candidate) int {
	n := len(cands)
	start := int(p.next.Add(1) % uint64(n))
	best := start
	for i := 1; i < n; i++ {
		j := (start + i) % n
		if cands[j].Load.Score < cands[best].Load.Score-scoreEpsilon {
			best = j
		}
	}
	return best
}

// powerOfTwo draws two distinct candidates and takes the lower score (the
// first drawn on a tie).
type powerOfTwo struct{ intn func(int) int }

func (*powerOfTwo) Name() string { return PolicyPowerOfTwo }

func (p *powerOfTwo) Pick(_ *PickRequest, cands []Candidate) int {
	n := len(cands)
	if n == 1 {
		return 0
	}
	a := p.intn(n)
	b := p.intn(n - 1)
	if b >= a {
		b++
	}
	if cands[b].Load.Score < cands[a].Load.Score-scoreEpsilon {
		return b
	}
	return a
}

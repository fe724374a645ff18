// Package router is pdserve's OpenAI-compatible front door for
// disaggregated serving: it tokenizes once, pairs a prefill and a decode
// worker per request, sends both legs at once, streams decode's tokens to
// the client, and owns the request: whichever leg fails first, the other is
// aborted at once; a client that goes away aborts both.
//
// It speaks to workers only through the worker HTTP contract
// (internal/workerapi) and decides on the values a failed leg's answer
// carries: its outcome (retry when Retryable, probe the pair first when
// Suspect) and the request's first cause (an aborted_peer echo that names
// its root cause is answered with it at once; only one that does not waits
// PeerFailureGrace for the other leg).
//
// # Concurrency
//
// A Router is safe for concurrent use. Each request's legs run on their own
// goroutines; every goroutine the router starts is tracked and waited for by
// Close. Every timer, ticker and timeout the router uses, and the ages it
// reports, run on its Config.Clock.
//
// # Ownership
//
// The router owns each request from arrival to the client's answer. It never
// holds KV; workers do, and each worker frees its own on abort or deadline.
// The router's aborts are best effort and bounded (2 s); the workers'
// deadlines and leases are the guarantee.
package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/tracing"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Config configures a Router.
type Config struct {
	// Registry is where the router learns its workers (etcd, Kubernetes,
	// or static). Nil: a static registry of Prefill, Decode and Colocated.
	Registry registry.Registry
	// Prefill and Decode are worker base URLs, e.g. http://127.0.0.1:30000
	// (a static registry's initial workers).
	Prefill []string
	Decode  []string
	// Colocated lists colocated (`pdserve serve`) workers instead: the
	// router's plain mode, round robin over whole requests, for comparing
	// with disaggregation at equal worker count. With any registry, a
	// request goes to a prefill/decode pair when one is ready, else to a
	// colocated worker.
	Colocated []string
	// ModelName, Tokenizer, ContextLen and EOS describe the served model;
	// workers serving another model are not used.
	ModelName  string
	Tokenizer  model.Tokenizer
	ContextLen int
	VocabSize  int // 0: token ids are checked by the workers only
	EOS        []int32
	// HealthInterval is how often workers are checked (default 2 s);
	// CheckTimeout bounds one check (3 s). A worker is ready after
	// SuccessThreshold passes in a row (2) and not ready after
	// FailureThreshold failures (3; at once if its address refuses
	// connections). SlowStart ramps a newly ready worker's share of new
	// requests (10 s; negative: none). See package fleet.
	HealthInterval   time.Duration
	CheckTimeout     time.Duration
	SuccessThreshold int
	FailureThreshold int
	SlowStart        time.Duration
	// UnlistedGrace is how long a usable worker the registry stops listing
	// keeps serving while its checks pass (fleet.Config.UnlistedGrace): 0
	// is fleet.DefaultUnlistedGrace (30 s) with a Registry and none for the
	// static worker lists; negative is none.
	UnlistedGrace time.Duration
	// PrefillPolicy and DecodePolicy name the pair policy of each role
	// (PolicyNames; default least_load); colocated workers are chosen by
	// the decode policy.
	PrefillPolicy, DecodePolicy string
	// CacheAware tunes the cache_aware policy (zero fields: its defaults).
	CacheAware CacheAwareConfig
	// DisaggMinPromptTokens (--disagg-min-prompt-tokens) turns on
	// per-request disaggregation: a request whose prompt, less what its
	// decode worker is believed to hold, is shorter than this many tokens
	// (raised while prefill is busy: LocalThreshold) is served by its
	// decode worker alone (local.go). 0 (the default) always
	// disaggregates; negative is an error.
	DisaggMinPromptTokens int
	// LoadInterval is how often every worker's load is polled (default
	// 100 ms); LoadStaleness how old a report may be before only the
	// router's own count of its legs is used (default 1 s).
	LoadInterval, LoadStaleness time.Duration
	// Admission are the load-shedding thresholds (nil: DefaultAdmission).
	Admission *Admission
	// BreakerFailures consecutive KV path failures of a (prefill, decode)
	// pair open its breaker for BreakerCooldown (defaults 3 and 10 s).
	BreakerFailures int
	BreakerCooldown time.Duration
	// LegTimeout bounds each leg's HTTP exchange with a worker (default
	// DefaultLegTimeout, 15 min). Workers end a request at their own
	// --max-request-time, so it only matters when a worker hangs; it must
	// be longer than the workers' --max-request-time.
	LegTimeout time.Duration
	// AbortTimeout bounds each abort call to a worker (default 2 s).
	AbortTimeout time.Duration
	// MaxAttempts bounds the attempts of one request (default 2: one
	// retry). A retry happens only before the client saw any token, only
	// for a failure another pair may not have (a worker unreachable or
	// shutting down, a lost KV connection, a corrupted transfer); it aborts
	// the old attempt on both workers and reuses the room with gen+1.
	MaxAttempts int
	// MaxMigrations bounds how often one request is continued on a new
	// pair after its output began reaching the client (0:
	// DefaultMaxMigrations; negative: never). Only a failure of the worker
	// (outcome.Migratable) is continued: the new legs get the prompt with
	// the output so far appended and continue it exactly (see
	// continuation). A request that fails again with the same cause on
	// the new pair before any new token, its worker still up, is not.
	MaxMigrations int
	// MigrationWait is how long a continuation waits for a worker of a
	// role to be ready when none is (the others may be restarting; 0:
	// DefaultMigrationWait, negative: no wait).
	MigrationWait time.Duration
	// PeerFailureGrace is how long, when decode fails because its peer
	// did, the router waits for prefill's own answer so the client gets the
	// root cause (default 1 s).
	PeerFailureGrace time.Duration
	// MaxBodyBytes bounds client request bodies (default: the front end's).
	MaxBodyBytes int64
	// API are the OpenAI API's options (--max-logprobs, --logprobs-mode).
	API openai.APIOptions
	// Client is the HTTP client for worker calls (default: a pooled client
	// on NewTransport).
	Client *http.Client
	// Guard, if set, wraps the router's whole HTTP API (Handler): the front
	// door's authentication. answer counts a request it refuses in the
	// front end's answers (pdserve_api_answers_total), as openai.Config's
	// OnAnswer does.
	Guard func(h http.Handler, answer func(endpoint string, status int, code string)) http.Handler
	// HealthDetail, if set, says whether a /health request may see why the
	// router cannot serve and which workers it holds out, by URL and error
	// (the front door's admin key); the others get states and counts.
	// Nil: every request may.
	HealthDetail func(*http.Request) bool
	// Clock is the router's clock (default: the wall clock): request ages,
	// the grace wait, health checks and every timeout of a worker call run
	// on it.
	Clock clock.WithTickerAndDelayedExecution
	// Tracer, if set, traces every request (tracing.New): a span per
	// request and per attempt, whose context travels to the workers in
	// the legs' traceparent. Nil: no span.
	Tracer trace.TracerProvider
	// Recorder, if set, is given every arrival, leg, inter-token gap and
	// finished request (the planner's measurements); Planner, if set,
	// answers GET /planner.
	Recorder   *planner.Recorder
	Planner    http.Handler
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// NewTransport returns the pooled transport of the router's default
// Client (5 s dial timeout, up to 1024 idle connections per worker, kept
// 90 s), for a caller that builds its own Client around it (TLS to the
// workers, request signing). See Transport.
func NewTransport() *Transport {
	return &Transport{DialTimeout: 5 * time.Second, KeepAlive: 30 * time.Second,
		IdleConnTimeout: 90 * time.Second, MaxIdleConnsPerHost: 1024}
}

// Router pairs prefill and decode workers. See the package doc.
type Router struct {
	cfg    Config
	log    *slog.Logger
	clock  clock.WithTickerAndDelayedExecution
	client *http.Client
	set    *fleet.Set
	// policies choose prefill, decode and colocated workers.
	policies [3]Policy
	rnd      *rand.Rand // slow-start and policy draws (under rndMu)
	rndMu    sync.Mutex
	// wstates holds each worker's *wstate (load and admission).
	wstates  sync.Map
	breakers *breakers

	bg     sync.WaitGroup
	stop   chan struct{}
	closed sync.Once
	// stopping is closed when shutdown begins: new requests get 503 and
	// requests in flight end with an error answer (their legs aborted).
	// stopCtx ends with it (legs register their cancellation on it).
	stopping   <-chan struct{}
	stopCtx    context.Context
	stopCancel context.CancelFunc
	// draining is closed when a drain begins: new requests get 503 with
	// Retry-After, /health answers 503, requests in flight go on.
	draining     chan struct{}
	drainingOnce sync.Once

	liveMu sync.Mutex
	live   map[*liveRequest]struct{} // requests being served, for /debug/requests
	// inflight counts the requests being served (--max-inflight-requests).
	inflight atomic.Int64
	// readers are the line readers of streaming legs (*bufio.Reader), reused.
	readers sync.Pool

	metrics *metrics.Router
	// tracer traces requests (nil: tracing off).
	tracer   trace.Tracer
	frontend *metrics.Frontend
	roles    []workerapi.Role // the leg roles of the metrics
}

// New returns a router; it checks the worker URLs but contacts no worker
// until Start.
func New(cfg Config) (*Router, error) {
	switch {
	case cfg.Registry != nil && len(cfg.Prefill)+len(cfg.Decode)+len(cfg.Colocated) > 0:
		return nil, errors.New("router takes a registry or worker lists, not both")
	case cfg.Registry != nil:
	case len(cfg.Colocated) > 0 && (len(cfg.Prefill) > 0 || len(cfg.Decode) > 0):
		return nil, errors.New("router takes either prefill and decode workers or colocated workers, not both")
	case len(cfg.Colocated) == 0 && (len(cfg.Prefill) == 0 || len(cfg.Decode) == 0):
		return nil, errors.New("router needs at least one prefill and one decode worker (or colocated workers)")
	}
	if cfg.ModelName == "" || cfg.ContextLen < 1 {
		return nil, errors.New("router needs the model name and context length")
	}
	if cfg.DisaggMinPromptTokens < 0 {
		return nil, fmt.Errorf("--disagg-min-prompt-tokens must be 0 (always disaggregate) or positive, got %d", cfg.DisaggMinPromptTokens)
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = 2 * time.Second
	}
	if cfg.AbortTimeout <= 0 {
		cfg.AbortTimeout = 2 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 2
	}
	switch {
	case cfg.MaxMigrations == 0:
		cfg.MaxMigrations = DefaultMaxMigrations
	case cfg.MaxMigrations < 0:
		cfg.MaxMigrations = 0
	}
	switch {
	case cfg.MigrationWait == 0:
		cfg.MigrationWait = DefaultMigrationWait
	case cfg.MigrationWait < 0:
		cfg.MigrationWait = 0
	}
	if cfg.PeerFailureGrace <= 0 {
		cfg.PeerFailureGrace = time.Second
	}
	if cfg.PrefillPolicy == "" {
		cfg.PrefillPolicy = PolicyLeastLoad
	}
	if cfg.DecodePolicy == "" {
		cfg.DecodePolicy = PolicyLeastLoad
	}
	if cfg.LoadInterval <= 0 {
		cfg.LoadInterval = DefaultLoadInterval
	}
	if cfg.LoadStaleness <= 0 {
		cfg.LoadStaleness = DefaultLoadStaleness
	}
	if cfg.Admission == nil {
		a := DefaultAdmission()
		cfg.Admission = &a
	}
	if cfg.Admission.RetryAfter <= 0 {
		cfg.Admission.RetryAfter = workerapi.OverloadRetryAfter
	}
	if err := cfg.Admission.Validate(); err != nil {
		return nil, err
	}
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = DefaultBreakerFailures
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = DefaultBreakerCooldown
	}
	if cfg.LegTimeout <= 0 {
		cfg.LegTimeout = DefaultLegTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: NewTransport()}
	}
	r := &Router{cfg: cfg, log: cfg.Logger.With("role", "router"), clock: cfg.Clock, client: cfg.Client, stop: make(chan struct{}),
		draining: make(chan struct{}), live: make(map[*liveRequest]struct{}),
		rnd:      rand.New(rand.NewPCG(uint64(cfg.Clock.Now().UnixNano()), 0x9e3779b97f4a7c15)),
		breakers: newBreakers(cfg.BreakerFailures, cfg.BreakerCooldown)}
	r.stopCtx, r.stopCancel = context.WithCancel(context.Background())
	r.stopping = r.stopCtx.Done()
	if err := cfg.CacheAware.Validate(); err != nil {
		r.stopCancel()
		return nil, err
	}
	deps := policyDeps{intn: r.intn, now: r.clock.Now, seed: maphash.MakeSeed(), capacity: r.kvPages, cacheAware: cfg.CacheAware}
	for i, name := range []string{cfg.PrefillPolicy, cfg.DecodePolicy, cfg.DecodePolicy} {
		role := [...]workerapi.Role{workerapi.RolePrefill, workerapi.RoleDecode, workerapi.RoleColocated}[i]
		deps.matched = func(prompt, matched int) { r.metrics.PrefixMatched(role, prompt, matched) }
		p, err := newPolicy(name, deps)
		if err != nil {
			return nil, err
		}
		r.policies[i] = p
	}
	reg := cfg.Registry
	if reg == nil {
		st, err := registry.NewStatic(cfg.Prefill, cfg.Decode, cfg.Colocated)
		if err != nil {
			return nil, err
		}
		reg = st
	}
	grace := cfg.UnlistedGrace
	switch {
	case grace < 0:
		grace = 0
	case grace == 0 && cfg.Registry != nil && cfg.Registry.Name() != "static":
		grace = fleet.DefaultUnlistedGrace
	}
	var err error
	r.set, err = fleet.New(fleet.Config{Registry: reg, Probe: r.probeWorker, ModelName: cfg.ModelName,
		HealthInterval: cfg.HealthInterval, CheckTimeout: cfg.CheckTimeout, SuccessThreshold: cfg.SuccessThreshold,
		FailureThreshold: cfg.FailureThreshold, SlowStart: cfg.SlowStart, UnlistedGrace: grace, Clock: cfg.Clock, Logger: r.log,
		OnChange: r.workerChanged, Describe: r.describe})
	if err != nil {
		return nil, err
	}
	roles := []workerapi.Role{workerapi.RolePrefill, workerapi.RoleDecode}
	if len(cfg.Colocated) > 0 {
		roles = []workerapi.Role{workerapi.RoleColocated}
	} else if cfg.Registry != nil {
		roles = append(roles, workerapi.RoleColocated)
	}
	urls := map[string]workerapi.Role{}
	for i, l := range [][]string{cfg.Prefill, cfg.Decode, cfg.Colocated} {
		for _, u := range l {
			if pu, err := registry.ParseURL(u); err == nil {
				urls[pu] = []workerapi.Role{workerapi.RolePrefill, workerapi.RoleDecode, workerapi.RoleColocated}[i]
			}
		}
	}
	r.roles = roles
	if cfg.Tracer != nil {
		r.tracer = cfg.Tracer.Tracer(tracing.Instrumentation)
	}
	paths := []string{metrics.PathPD}
	switch {
	case len(cfg.Colocated) > 0:
		paths = []string{metrics.PathColocated}
	case cfg.DisaggMinPromptTokens > 0:
		paths = append(paths, metrics.PathLocal)
	}
	if r.metrics, err = metrics.NewRouter(cfg.Registerer, metrics.RouterConfig{ModelName: cfg.ModelName, Roles: roles,
		Workers: urls, State: r.metricsState, Paths: paths, Policies: map[workerapi.Role]string{
			workerapi.RolePrefill: cfg.PrefillPolicy, workerapi.RoleDecode: cfg.DecodePolicy, workerapi.RoleColocated: cfg.DecodePolicy}}); err != nil {
		return nil, err
	}
	if r.frontend, err = metrics.NewFrontend(cfg.Registerer, "router"); err != nil {
		return nil, err
	}
	return r, nil
}

// metricsState is what the router's scrape-time gauges read.
func (r *Router) metricsState() metrics.RouterState {
	st := metrics.RouterState{Workers: r.workerCounts(), Inflight: map[string]int{}, Oldest: map[string]time.Duration{},
		LegTimeout: r.cfg.LegTimeout}
	now := r.clock.Now()
	r.liveMu.Lock()
	for lr := range r.live {
		stage, since := lr.stageSinceNow()
		st.Inflight[stage]++
		st.Oldest[stage] = max(st.Oldest[stage], now.Sub(since))
	}
	r.liveMu.Unlock()
	for _, w := range r.set.Workers("") {
		ws := r.state(w)
		ws.mu.Lock()
		sat := ws.saturated || !ws.overloaded.IsZero()
		ws.mu.Unlock()
		st.Legs = append(st.Legs, metrics.WorkerLegs{Role: w.Role(), URL: w.URL(), Legs: w.Legs(), Saturated: sat})
	}
	for _, p := range r.Pairs() {
		st.Pairs = append(st.Pairs, metrics.PairBreaker{Prefill: p.Prefill, Decode: p.Decode, State: int(p.State)})
	}
	rs := r.set.RegistryStatus()
	st.Registry = metrics.RegistryState{Backend: rs.Backend, Up: rs.Synced}
	if rs.LastSync != nil {
		st.Registry.LastSync = *rs.LastSync
	}
	return st
}

// Pairing is what GET /workers adds about a worker: the router's estimate
// of its load, and (a decode worker) the breakers of its KV paths that are
// not closed.
type Pairing struct {
	Load  LoadStatus   `json:"load"`
	Paths []PairStatus `json:"kv_paths,omitempty"`
	// NoPair, when set, says why a checked prefill (decode) worker can
	// pair with no decode (prefill) worker of the fleet: e.g. "no
	// compatible decode: page_size 32 vs 16" (its KV fingerprint against
	// each one's, first fields that differ). It may be ready and still
	// never get a request.
	NoPair string `json:"no_pair,omitempty"`
}

// noPair says why w, a checked prefill or decode worker, has no worker of
// the other role whose KV fingerprint matches its own ("" if one has, or
// none of that role was checked yet).
func (r *Router) noPair(w *fleet.Worker) string {
	var other workerapi.Role
	switch roleOf(w) {
	case workerapi.RolePrefill:
		other = workerapi.RoleDecode
	case workerapi.RoleDecode:
		other = workerapi.RolePrefill
	default:
		return ""
	}
	fp := w.Info().Fingerprint
	if fp == (kvxfer.Fingerprint{}) {
		return ""
	}
	var whys []string
	for _, o := range r.set.Workers(other.String()) {
		ofp := o.Info().Fingerprint
		if ofp == (kvxfer.Fingerprint{}) {
			continue
		}
		m := fp.Mismatch(ofp)
		if m == "" {
			return ""
		}
		if !slices.Contains(whys, m) {
			whys = append(whys, m)
		}
	}
	if len(whys) == 0 {
		return ""
	}
	return "no compatible " + other.String() + ": " + strings.Join(whys, "; ")
}

// describe is the fleet's Describe: the router's view of w.
func (r *Router) describe(w *fleet.Worker) any {
	p := Pairing{Load: r.loadStatus(w), NoPair: r.noPair(w)}
	for _, ps := range r.Pairs() {
		if ps.State != BreakerClosed && (ps.Prefill == w.URL() || ps.Decode == w.URL()) {
			p.Paths = append(p.Paths, ps)
		}
	}
	return p
}

// legError is a leg's failure seen by the router itself (the worker could
// not be reached or broke off its answer), with that outcome. The client's
// message names the worker's role only — worker addresses are internal —
// and the log line names the worker.
func (r *Router) legError(w *fleet.Worker, o outcome.Outcome, what string, err error) *workerapi.Error {
	r.log.Warn("leg failed", "worker", w.URL(), "worker_role", w.Role(), "outcome", o.String(), "err", fmt.Sprintf("%s: %v", what, err))
	return workerapi.NewError(o, fmt.Sprintf("the %s worker %s (details: the router's log and /workers)", w.Role(), what),
		outcome.Cause{})
}

// malformedAnswer is a leg's failure because its worker answered something
// that is not the worker API: a 500 with no code (outcome failed_internal).
func (r *Router) malformedAnswer(w *fleet.Worker, what string, err error) *workerapi.Error {
	r.log.Warn("leg failed", "worker", w.URL(), "worker_role", w.Role(), "err", fmt.Sprintf("%s: %v", what, err))
	return malformed("the %s worker %s (details: the router's log and /workers)", w.Role(), what)
}

// malformed is a failure of the router's own exchange with a worker: a 500
// with no code, outcome failed_internal.
func malformed(format string, args ...any) *workerapi.Error {
	return &workerapi.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer,
		Message: fmt.Sprintf(format, args...), Outcome: outcome.FailedInternal}
}

// downError is a leg's failure because its worker stopped answering.
func downError(role workerapi.Role) *workerapi.Error {
	return workerapi.NewError(outcome.WorkerUnreachable,
		fmt.Sprintf("the %s worker stopped answering health checks (details: the router's /workers)", role), outcome.Cause{})
}

// withTimeout returns a context that ends after d on the router's clock;
// context.Cause then says so.
func (r *Router) withTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := r.clock.AfterFunc(d, func() { cancel(fmt.Errorf("%w: no answer within %s", context.DeadlineExceeded, d)) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// getJSON GETs u into v; an answer that is not 200 is an error naming it.
func (r *Router) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		if c := context.Cause(ctx); c != nil {
			return fmt.Errorf("GET %s: %w", u, c)
		}
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, workerapi.MaxInfoBytes))
	if err != nil {
		if c := context.Cause(ctx); c != nil {
			return fmt.Errorf("GET %s: %w", u, c)
		}
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, openai.DecodeError(resp.StatusCode, body).Message)
	}
	return json.Unmarshal(body, v)
}

// Handler returns the router's HTTP API: the OpenAI endpoints, /health and
// /metrics, behind Config.Guard.
func (r *Router) Handler() http.Handler {
	oc := openai.Config{
		ModelName: r.cfg.ModelName, Tokenizer: r.cfg.Tokenizer, ContextLen: r.cfg.ContextLen, VocabSize: r.cfg.VocabSize,
		EOS: r.cfg.EOS, MaxBodyBytes: r.cfg.MaxBodyBytes, Engine: r, Logger: r.log, ContextNow: r.contextLen, Now: r.clock.Now,
		OnAnswer: r.frontend.Answer, Admit: r.Admit, APIOptions: r.cfg.API,
	}
	if r.tracer != nil {
		oc.OnRefuse = r.refusedSpan
	}
	oa := openai.NewHandler(oc)
	mux := http.NewServeMux()
	if r.tracer != nil {
		oa = tracing.Extracting(oa)
	}
	mux.Handle("/v1/", oa)
	mux.HandleFunc("GET "+workerapi.PathLive, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"alive"}`+"\n")
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		select {
		case <-r.draining:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			b, _ := json.Marshal(map[string]string{"status": workerapi.HealthDraining})
			_, _ = w.Write(append(b, '\n'))
			return
		default:
		}
		// URLs and dial errors are the admin's: /health is open.
		detail := r.cfg.HealthDetail == nil || r.cfg.HealthDetail(req)
		ok, why := r.Serving()
		body := map[string]any{"status": "ok"}
		if !ok {
			if !detail {
				why = "the router cannot serve now; the admin key shows why (here and in /debug/workers)"
			}
			body = map[string]any{"status": "unavailable", "reason": why}
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		// Workers that do not take requests, and why: a worker held out
		// of pairing for its KV paths shows here as in /workers.
		var down []map[string]string
		for _, wk := range r.set.Workers("") {
			if st := wk.Status(); st.State == fleet.StateNotReady {
				d := map[string]string{"role": st.Role, "state": st.State.String()}
				if detail {
					d["url"], d["reason"] = st.URL, st.LastError
				}
				down = append(down, d)
			}
		}
		if len(down) > 0 {
			body["not_ready"] = down
		}
		b, _ := json.Marshal(body)
		_, _ = w.Write(append(b, '\n'))
	})
	mux.HandleFunc("GET /debug/workers", r.handleWorkers)
	mux.HandleFunc("GET /debug/pairs", r.handlePairs)
	if r.cfg.Planner != nil {
		mux.Handle("GET /planner", r.cfg.Planner)
	} else {
		mux.HandleFunc("GET /planner", func(w http.ResponseWriter, _ *http.Request) {
			openai.WriteError(w, openai.NotFound("the planner is off: start the router (or pdserve up) with --planner"))
		})
	}
	admin := r.set.AdminHandler()
	mux.Handle("/workers", admin)
	mux.Handle("/workers/", admin)
	mux.Handle("GET /discovery/prometheus", r.set.PrometheusSD())
	mux.HandleFunc("GET /debug/requests", r.handleRequests)
	mux.HandleFunc("GET /debug/requests/{rid}", r.handleRequest)
	if r.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(r.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", openai.Unrouted(mux, "no route for %s %s"))
	h := openai.CanonicalPaths(openai.Routes(oa, mux))
	if r.cfg.Guard != nil {
		return r.cfg.Guard(h, r.frontend.Answer)
	}
	return h
}

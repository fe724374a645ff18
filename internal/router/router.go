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
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Config configures a Router.
type Config struct {
	// Prefill and Decode are worker base URLs, e.g. http://127.0.0.1:30000.
	Prefill []string
	Decode  []string
	// Colocated lists colocated (`pdserve serve`) workers instead: the
	// router's plain mode, round robin over whole requests, for comparing
	// with disaggregation at equal worker count.
	Colocated []string
	// ModelName, Tokenizer, ContextLen and EOS describe the served model;
	// workers serving another model are not used.
	ModelName  string
	Tokenizer  model.Tokenizer
	ContextLen int
	VocabSize  int // 0: token ids are checked by the workers only
	EOS        []int32
	// HealthInterval is how often workers are checked (default 2 s).
	HealthInterval time.Duration
	// AbortTimeout bounds each abort call to a worker (default 2 s).
	AbortTimeout time.Duration
	// MaxAttempts bounds the attempts of one request (default 2: one
	// retry). A retry happens only before the client saw any token, only
	// for a failure another pair may not have (a worker unreachable or
	// shutting down, a lost KV connection, a corrupted transfer); it aborts
	// the old attempt on both workers and reuses the room with gen+1.
	MaxAttempts int
	// PeerFailureGrace is how long, when decode fails because its peer
	// did, the router waits for prefill's own answer so the client gets the
	// root cause (default 1 s).
	PeerFailureGrace time.Duration
	// MaxBodyBytes bounds client request bodies (default: the front end's).
	MaxBodyBytes int64
	// Client is the HTTP client for worker calls (default: a pooled client).
	Client *http.Client
	// Clock is the router's clock (default: the wall clock): request ages,
	// the grace wait, health checks and every timeout of a worker call run
	// on it.
	Clock      clock.WithTickerAndDelayedExecution
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// Router pairs prefill and decode workers. See the package doc.
type Router struct {
	cfg       Config
	log       *slog.Logger
	clock     clock.WithTickerAndDelayedExecution
	client    *http.Client
	prefill   []*workerState
	decode    []*workerState
	colocated []*workerState
	rrP       atomic.Uint64
	rrD       atomic.Uint64
	rrC       atomic.Uint64

	bg     sync.WaitGroup
	stop   chan struct{}
	closed sync.Once
	// stopping is closed when shutdown begins: new requests get 503 and
	// requests in flight end with an error answer (their legs aborted).
	stopping     chan struct{}
	stoppingOnce sync.Once

	liveMu sync.Mutex
	live   map[*liveRequest]struct{} // requests being served, for /debug/requests

	metrics *metrics.Router
}

type workerState struct {
	url  string
	host string
	role workerapi.Role
	mu   sync.Mutex
	// healthy is set by the last health check; kvAddr by the last info.
	healthy  bool
	kvAddr   string
	fp       kvxfer.Fingerprint
	ctxLen   int
	lastErr  string
	failures int
	checked  bool
	// down is closed when a health check or probe fails, and replaced by
	// an open channel when one passes: legs in flight on the worker watch
	// it, so a worker that stops answering (frozen, partitioned) fails
	// them within a health check instead of pinning them.
	down chan struct{}
}

// downCh returns the channel closed when the worker is next found down.
func (w *workerState) downCh() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.down
}

// setHealthLocked records a health check's or probe's result (err "" =
// healthy), closing or renewing down. Called with w.mu held.
func (w *workerState) setHealthLocked(err string) {
	w.checked = true
	if err != "" {
		w.healthy, w.lastErr = false, err
		w.failures++
		select {
		case <-w.down:
		default:
			close(w.down)
		}
		return
	}
	w.healthy, w.lastErr = true, ""
	select {
	case <-w.down:
		w.down = make(chan struct{})
	default:
	}
}

func (w *workerState) snapshot() (healthy bool, kvAddr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.healthy, w.kvAddr
}

func (w *workerState) fingerprint() kvxfer.Fingerprint {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fp
}

// markFailed records a failed call to the worker; it stays out of pairing
// until a health check passes.
func (w *workerState) markFailed(err string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.healthy, w.lastErr = false, err
	w.failures++
}

// New returns a router; it checks the worker URLs but contacts no worker
// until Start.
func New(cfg Config) (*Router, error) {
	switch {
	case len(cfg.Colocated) > 0 && (len(cfg.Prefill) > 0 || len(cfg.Decode) > 0):
		return nil, errors.New("router takes either prefill and decode workers or colocated workers, not both")
	case len(cfg.Colocated) == 0 && (len(cfg.Prefill) == 0 || len(cfg.Decode) == 0):
		return nil, errors.New("router needs at least one prefill and one decode worker (or colocated workers)")
	}
	if cfg.ModelName == "" || cfg.ContextLen < 1 {
		return nil, errors.New("router needs the model name and context length")
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
	if cfg.PeerFailureGrace <= 0 {
		cfg.PeerFailureGrace = time.Second
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
		cfg.Client = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	r := &Router{cfg: cfg, log: cfg.Logger.With("role", "router"), clock: cfg.Clock, client: cfg.Client, stop: make(chan struct{}),
		stopping: make(chan struct{}), live: make(map[*liveRequest]struct{})}
	for _, list := range []struct {
		urls []string
		dst  *[]*workerState
		role workerapi.Role
	}{{cfg.Prefill, &r.prefill, workerapi.RolePrefill}, {cfg.Decode, &r.decode, workerapi.RoleDecode},
		{cfg.Colocated, &r.colocated, workerapi.RoleColocated}} {
		for _, raw := range list.urls {
			u, err := url.Parse(strings.TrimRight(raw, "/"))
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("worker URL %q: want http://host:port", raw)
			}
			*list.dst = append(*list.dst, &workerState{url: u.String(), host: u.Hostname(), role: list.role, down: make(chan struct{})})
		}
	}
	var roles []workerapi.Role
	if len(r.colocated) > 0 {
		roles = []workerapi.Role{workerapi.RoleColocated}
	} else {
		roles = []workerapi.Role{workerapi.RolePrefill, workerapi.RoleDecode}
	}
	var urls []string
	for _, w := range r.workers() {
		urls = append(urls, w.url)
	}
	var err error
	if r.metrics, err = metrics.NewRouter(cfg.Registerer, roles, urls); err != nil {
		return nil, err
	}
	return r, nil
}

// Start checks every worker once, then keeps checking in the background
// until Close.
func (r *Router) Start() {
	r.checkAll()
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		t := r.clock.NewTicker(r.cfg.HealthInterval)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C():
				r.checkAll()
			}
		}
	}()
}

// AllHealthy reports whether every worker answered its last health check,
// and if not, why.
func (r *Router) AllHealthy() (bool, string) {
	for _, w := range r.workers() {
		w.mu.Lock()
		ok, why := w.healthy, w.lastErr
		w.mu.Unlock()
		if !ok {
			return false, fmt.Sprintf("%s: %s", w.url, why)
		}
	}
	return true, ""
}

// Serving reports whether the router can serve a request now: a healthy
// decode worker with a healthy, compatible prefill worker. If not, it says
// why.
func (r *Router) Serving() (bool, string) {
	if len(r.colocated) > 0 {
		if pick(r.colocated, &atomic.Uint64{}, nil) != nil {
			return true, ""
		}
		return false, "no healthy colocated worker"
	}
	for _, d := range r.decode {
		if ok, _ := d.snapshot(); !ok {
			continue
		}
		fp := d.fingerprint()
		for _, p := range r.prefill {
			if ok, kv := p.snapshot(); ok && kv != "" && p.fingerprint().Mismatch(fp) == "" {
				return true, ""
			}
		}
	}
	if _, _, _, e := r.pickPairPeek(); e != nil {
		return false, e.Message
	}
	return false, "no healthy, compatible prefill/decode pair"
}

// CheckNow runs one health check of every worker.
func (r *Router) CheckNow() { r.checkAll() }

// BeginShutdown makes the router refuse new requests (503) and end every
// request in flight with a 503 answer, aborting its legs on the workers.
// It is idempotent.
func (r *Router) BeginShutdown() {
	r.stoppingOnce.Do(func() { close(r.stopping) })
}

// Close begins shutdown, stops health checks and waits for every leg and
// abort goroutine.
func (r *Router) Close() {
	r.BeginShutdown()
	r.closed.Do(func() { close(r.stop) })
	r.bg.Wait()
	// Connections the pool dialed but never used are "new" to the workers'
	// servers, which wait up to 5 s for them in Shutdown; close them now.
	r.client.CloseIdleConnections()
}

func (r *Router) checkAll() {
	var wg sync.WaitGroup
	for _, w := range r.workers() {
		wg.Go(func() { r.check(w) })
	}
	wg.Wait()
}

// workers lists every worker of the router.
func (r *Router) workers() []*workerState {
	return append(append(append([]*workerState{}, r.prefill...), r.decode...), r.colocated...)
}

// CheckTimeout bounds one health check of a worker (its info and /health).
const CheckTimeout = 3 * time.Second

func (r *Router) check(w *workerState) {
	ctx, cancel := r.withTimeout(context.Background(), CheckTimeout)
	defer cancel()
	var info workerapi.Info
	err := r.getJSON(ctx, w.url+workerapi.PathInfo, &info)
	if err == nil {
		err = r.getJSON(ctx, w.url+workerapi.PathHealth, &struct{}{})
	}
	isPrefill := w.role == workerapi.RolePrefill
	switch {
	case err != nil:
	case info.Role != w.role:
		err = fmt.Errorf("worker is a %s worker, listed as %s", info.Role, w.role)
	case info.Model != r.cfg.ModelName:
		err = fmt.Errorf("worker serves model %q, router serves %q", info.Model, r.cfg.ModelName)
	case isPrefill && info.KVPort == 0:
		err = errors.New("prefill worker reports no KV port")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.healthy || w.lastErr != err.Error() {
			r.log.Warn("worker unhealthy", "worker", w.url, "err", err)
		}
		w.setHealthLocked(err.Error())
		r.metrics.WorkerFailed(w.url)
		return
	}
	if !w.healthy {
		r.log.Info("worker healthy", "worker", w.url, "worker_role", info.Role.String())
	}
	w.setHealthLocked("")
	w.fp = info.Fingerprint
	w.ctxLen = info.ContextLen
	if isPrefill {
		w.kvAddr = net.JoinHostPort(w.host, strconv.Itoa(info.KVPort))
	}
}

// ProbeTimeout bounds the health probe of a worker whose pair just failed
// with a lost peer, before a retry picks a pair (on the router's clock).
const ProbeTimeout = time.Second

// probe checks /health of each worker at once, each within ProbeTimeout,
// and marks the ones that do not answer as down (failing their legs in
// flight and keeping them out of pairing until a health check passes), so
// a retry after a lost peer does not pick a frozen worker again.
func (r *Router) probe(ws ...*workerState) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := r.withTimeout(context.Background(), ProbeTimeout)
			defer cancel()
			if err := r.getJSON(ctx, w.url+workerapi.PathHealth, &struct{}{}); err != nil {
				r.log.Warn("worker failed a probe", "worker", w.url, "err", err)
				w.mu.Lock()
				w.setHealthLocked("probe: " + err.Error())
				w.mu.Unlock()
				r.metrics.WorkerFailed(w.url)
			}
		}()
	}
	wg.Wait()
}

// legError is a leg's failure seen by the router itself (the worker could
// not be reached or broke off its answer), with that outcome. The client's
// message names the worker's role only — worker addresses are internal —
// and the log line names the worker.
func (r *Router) legError(w *workerState, o outcome.Outcome, what string, err error) *workerapi.Error {
	r.log.Warn("leg failed", "worker", w.url, "worker_role", w.role.String(), "outcome", o.String(), "err", fmt.Sprintf("%s: %v", what, err))
	return workerapi.NewError(o, fmt.Sprintf("the %s worker %s (details: the router's log and /debug/workers)", w.role, what),
		outcome.Cause{})
}

// malformedAnswer is a leg's failure because its worker answered something
// that is not the worker API: a 500 with no code (outcome failed_internal).
func (r *Router) malformedAnswer(w *workerState, what string, err error) *workerapi.Error {
	r.log.Warn("leg failed", "worker", w.url, "worker_role", w.role.String(), "err", fmt.Sprintf("%s: %v", what, err))
	return malformed("the %s worker %s (details: the router's log and /debug/workers)", w.role, what)
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
		fmt.Sprintf("the %s worker stopped answering health checks (details: the router's /debug/workers)", role), outcome.Cause{})
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

// pick chooses the next healthy worker round-robin; ok filters candidates.
func pick(list []*workerState, rr *atomic.Uint64, ok func(*workerState) bool) *workerState {
	n := uint64(len(list))
	start := rr.Add(1)
	for i := range n {
		w := list[(start+i)%n]
		if healthy, _ := w.snapshot(); healthy && (ok == nil || ok(w)) {
			return w
		}
	}
	return nil
}

// pickPairPeek is pickPair without moving the round-robin positions, for
// explaining why no pair is available.
func (r *Router) pickPairPeek() (pw, dw *workerState, kv string, err *openai.Error) {
	var rrP, rrD atomic.Uint64
	return r.pickPairWith(&rrP, &rrD)
}

// pickPair chooses a decode worker, then a prefill worker whose KV
// fingerprint (model, geometry, dtype, page size) matches it, so an
// incompatible pair is never used. It returns the prefill's KV address.
func (r *Router) pickPair() (pw, dw *workerState, kv string, err *openai.Error) {
	return r.pickPairWith(&r.rrP, &r.rrD)
}

func (r *Router) pickPairWith(rrP, rrD *atomic.Uint64) (pw, dw *workerState, kv string, err *openai.Error) {
	dw = pick(r.decode, rrD, nil)
	if dw == nil {
		return nil, nil, "", openai.Unavailable("no healthy decode worker (see /debug/workers)")
	}
	fp := dw.fingerprint()
	var mismatch string
	pw = pick(r.prefill, rrP, func(p *workerState) bool {
		_, addr := p.snapshot()
		if addr == "" {
			return false
		}
		if m := p.fingerprint().Mismatch(fp); m != "" {
			mismatch = fmt.Sprintf("%s vs %s: %s", p.url, dw.url, m)
			return false
		}
		return true
	})
	if pw == nil {
		if mismatch != "" {
			return nil, nil, "", openai.Unavailable("no healthy prefill worker compatible with decode worker %s (%s)", dw.url, mismatch)
		}
		return nil, nil, "", openai.Unavailable("no healthy prefill worker (see /debug/workers)")
	}
	_, kv = pw.snapshot()
	return pw, dw, kv, nil
}

// Handler returns the router's HTTP API: the OpenAI endpoints, /health and
// /metrics.
func (r *Router) Handler() http.Handler {
	oa := openai.NewHandler(openai.Config{
		ModelName: r.cfg.ModelName, Tokenizer: r.cfg.Tokenizer, ContextLen: r.cfg.ContextLen, VocabSize: r.cfg.VocabSize,
		EOS: r.cfg.EOS, MaxBodyBytes: r.cfg.MaxBodyBytes, Engine: r, Logger: r.log, ContextNow: r.contextLen,
	})
	mux := http.NewServeMux()
	mux.Handle("/v1/", oa)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if ok, why := r.Serving(); !ok {
			b, _ := json.Marshal(map[string]string{"status": "unavailable", "reason": why})
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(append(b, '\n'))
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("GET /debug/workers", r.handleWorkers)
	mux.HandleFunc("GET /debug/requests", r.handleRequests)
	if r.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(r.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		openai.WriteError(w, openai.NotFound("no route for %s %s", req.Method, req.URL.Path))
	})
	return openai.Routes(oa, mux)
}

// contextLen is the smallest context length among healthy workers (a
// worker serves a shorter context than the model's when its KV pool is
// smaller), or 0 if none is known.
func (r *Router) contextLen() int {
	c := 0
	for _, w := range r.workers() {
		w.mu.Lock()
		if w.healthy && w.ctxLen > 0 && (c == 0 || w.ctxLen < c) {
			c = w.ctxLen
		}
		w.mu.Unlock()
	}
	return c
}

// WorkerStatus is one entry of /debug/workers.
type WorkerStatus struct {
	URL      string `json:"url"`
	Role     string `json:"role"`
	Healthy  bool   `json:"healthy"`
	KVAddr   string `json:"kv_addr,omitempty"`
	Failures int    `json:"failures"`
	LastErr  string `json:"last_error,omitempty"`
}

// Workers lists the router's workers and their health.
func (r *Router) Workers() []WorkerStatus {
	var out []WorkerStatus
	for _, w := range r.workers() {
		w.mu.Lock()
		out = append(out, WorkerStatus{URL: w.url, Role: w.role.String(), Healthy: w.healthy, KVAddr: w.kvAddr,
			Failures: w.failures, LastErr: w.lastErr})
		w.mu.Unlock()
	}
	return out
}

func (r *Router) handleWorkers(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(map[string]any{"workers": r.Workers()})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

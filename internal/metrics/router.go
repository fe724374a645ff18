package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Router is the metrics of a router. Counters:
//
//   - pdserve_router_requests_total{outcome,path}: requests the router
//     answered, by outcome: ok; the root cause's outcome when a leg failed;
//     aborted_client when the client went away; shutdown when the router
//     stopped; no_worker when no worker or pair could be picked; overloaded
//     when it shed the request (429). path is how it was served (PathPD,
//     PathLocal, PathColocated).
//   - pdserve_router_leg_failures_total{role,outcome}: failed legs, retried
//     or not, by the role of the side where the failure happened and its
//     outcome.
//   - pdserve_router_retries_total{cause}: attempts retried on a new pair
//     (before any token reached the client), by the outcome that caused
//     the retry (every retryable outcome).
//   - pdserve_router_migrations_total{cause}: requests moved to a new pair
//     because a worker failed under them (outcome.Migratable: cause is
//     worker_unreachable, worker_stream_broken, shutdown, draining,
//     peer_lost or lease_expired): a decode or colocated leg that broke
//     after output reached the client, continued from there on another
//     pair, or a prefill leg whose worker was lost, retried.
//   - pdserve_router_migration_delay_seconds (histogram, seconds): from a
//     leg breaking after output reached the client to the first token of
//     its continuation (vLLM's TTFT buckets).
//   - pdserve_router_worker_failures_total{worker}: failed calls and health
//     checks, by worker URL (a worker's series appears when it joins the
//     fleet and goes when it leaves).
//   - pdserve_router_selections_total{role,policy,worker}: workers chosen
//     for a leg, by the role's pair policy.
//   - pdserve_router_shed_total{reason}: requests answered 429 overloaded,
//     by reason (max_inflight, decode_queue, decode_kv, prefill_queue,
//     worker_overloaded).
//   - pdserve_router_prefix_queried_tokens_total{role},
//     pdserve_router_prefix_matched_tokens_total{role} (tokens): the
//     prompt tokens of the legs the cache_aware policy placed, and of
//     those the tokens its record said the chosen worker holds (the
//     router's estimate of the prefix-cache hits; the workers count the
//     real ones). Zero for a role with another policy.
//   - pdserve_router_prompt_tokens_total{model_name},
//     pdserve_router_generation_tokens_total{model_name} (tokens): prompt
//     tokens of the requests whose first token reached the client, and
//     output tokens sent to clients (vLLM's vllm:prompt_tokens_total and
//     vllm:generation_tokens_total).
//
// Histograms (seconds, label model_name; the client's view, measured at the
// router from the moment it received the request):
//
//   - pdserve_router_time_to_first_token_seconds: to the first output token
//     sent to the client (vLLM's TTFT buckets).
//   - pdserve_router_inter_token_latency_seconds: between output tokens: a
//     chunk of n tokens after a gap g is n observations of g/n (vLLM's ITL
//     buckets, with SGLang's 2, 4, 6 and 8 ms below them).
//   - pdserve_router_e2e_request_latency_seconds: to the end of the answer,
//     for every request that got its first token, whatever its end (so its
//     count follows TTFT's; vLLM's request latency buckets).
//   - pdserve_router_request_queue_time_seconds: from arrival until the
//     legs that served the request were sent: admission, pairing and failed
//     attempts (vLLM's request latency buckets).
//
// Gauges read at scrape time (see RouterState):
//
//   - pdserve_router_workers{role,state}: workers by role and state.
//   - pdserve_router_requests_inflight{stage}: requests the router serves,
//     by its stage: legs (sent, no token yet) or streaming.
//   - pdserve_router_oldest_request_age_seconds{stage} (seconds): how long
//     the request that entered each router stage earliest has been in it
//     (0 if none is).
//   - pdserve_router_leg_timeout_seconds (seconds): the router's
//     --leg-timeout, the bound of every attempt (alert
//     PdserveRouterRequestPastLegTimeout).
//   - pdserve_router_worker_inflight_legs{role,worker}: legs in flight.
//   - pdserve_router_worker_saturated{role,worker}: 1 while admission
//     sends the worker no new request.
//   - pdserve_router_pair_breaker_state{prefill,decode}: each compatible
//     pair's KV path breaker: 0 closed, 1 half_open, 2 open.
//   - pdserve_router_registry_up{backend}: 1 while the router follows its
//     registry (it listed the fleet and, for etcd, etcd answered its last
//     check), 0 otherwise (it serves the fleet it last saw).
//   - pdserve_router_registry_last_sync_timestamp_seconds{backend}: when
//     the registry last confirmed the fleet, Unix seconds (0 before).
type Router struct {
	requests       *prometheus.CounterVec
	legFailures    *prometheus.CounterVec
	retries        *prometheus.CounterVec
	migrations     *prometheus.CounterVec
	migrationDelay prometheus.Histogram
	workerFailures *prometheus.CounterVec
	selections     *prometheus.CounterVec
	shed           *prometheus.CounterVec
	prefixQueried  *prometheus.CounterVec
	prefixMatched  *prometheus.CounterVec
	promptTokens   prometheus.Counter
	genTokens      prometheus.Counter
	ttft           prometheus.Observer
	itl            prometheus.Observer
	e2e            prometheus.Observer
	queue          prometheus.Observer
	policies       map[workerapi.Role]string
}

// Bucket sets of the router's client-side histograms, in seconds.
var (
	// vLLM's time_to_first_token_seconds buckets (vllm/v1/metrics/loggers.py).
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	// vLLM's inter_token_latency_seconds buckets below 10 ms are SGLang's
	// (python/sglang/srt/metrics/collector.py): a decode step of a small
	// model on a fast GPU takes 2–8 ms.
	routerITLBuckets = []float64{0.002, 0.004, 0.006, 0.008, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	// vLLM's request latency buckets (e2e, queue, prefill, decode time).
	vllmRequestBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// WorkerCounts returns the number of workers per (role, state), every
// series the gauge should have included (zeros too).
type WorkerCounts func() map[[2]string]int

// RouterState is what the router holds at one scrape.
type RouterState struct {
	// Workers counts workers per (role, state), every series included.
	Workers map[[2]string]int
	// Inflight counts the requests served, by router stage; Oldest is how
	// long the request that entered each stage earliest has been in it;
	// LegTimeout is the router's --leg-timeout, which bounds an attempt
	// (each stage of it).
	Inflight   map[string]int
	Oldest     map[string]time.Duration
	LegTimeout time.Duration
	// Legs lists every worker with its legs in flight and admission state.
	Legs []WorkerLegs
	// Pairs lists every compatible pair's breaker state.
	Pairs []PairBreaker
	// Registry is the registry's state (no series if Backend is "").
	Registry RegistryState
}

// RegistryState is the registry part of a RouterState.
type RegistryState struct {
	// Backend is "static", "etcd" or "kubernetes".
	Backend string
	// Up: the router follows the registry now.
	Up bool
	// LastSync is when the registry last confirmed the fleet (zero:
	// never).
	LastSync time.Time
}

// WorkerLegs is one worker of a RouterState.
type WorkerLegs struct {
	Role, URL string
	Legs      int
	Saturated bool
}

// PairBreaker is one pair of a RouterState: State is 0 closed, 1
// half-open, 2 open.
type PairBreaker struct {
	Prefill, Decode string
	State           int
}

// RouterConfig configures a router's collectors.
type RouterConfig struct {
	// ModelName is the served model (the model_name label).
	ModelName string
	// Roles are the leg roles (every (role, outcome) failure series).
	Roles []workerapi.Role
	// Workers are the initial workers, by URL, with their roles.
	Workers map[string]workerapi.Role
	// Policies names each role's pair policy.
	Policies map[workerapi.Role]string
	// Paths are the path labels of pdserve_router_requests_total exposed
	// (at 0) from the start, with every outcome: the ways this router may
	// serve a request (nil: PathPD). Another path's series appear when it
	// is first counted.
	Paths []string
	// State is read at every scrape (nil: none of its gauges).
	State func() RouterState
}

// RouterStages are the router stages of pdserve_router_requests_inflight.
var RouterStages = []string{"legs", "streaming"}

var (
	workersDesc = prometheus.NewDesc("pdserve_router_workers",
		"Workers the router knows, by role and state, read from its fleet at scrape time.", []string{"role", "state"}, nil)
	inflightDesc = prometheus.NewDesc("pdserve_router_requests_inflight",
		"Requests the router serves, by stage: legs (sent, no token yet) or streaming.", []string{"stage"}, nil)
	routerOldestDesc = prometheus.NewDesc("pdserve_router_oldest_request_age_seconds",
		"How long the request that entered each router stage earliest has been in it (0 if none is).", []string{"stage"}, nil)
	legTimeoutDesc = prometheus.NewDesc("pdserve_router_leg_timeout_seconds",
		"The router's --leg-timeout: no attempt of a request (and so no router stage) outlives it.", nil, nil)
	legsDesc = prometheus.NewDesc("pdserve_router_worker_inflight_legs",
		"Legs the router has in flight on each worker.", []string{"role", "worker"}, nil)
	saturatedDesc = prometheus.NewDesc("pdserve_router_worker_saturated",
		"1 while admission sends the worker no new request (its queue or KV use is over a threshold).", []string{"role", "worker"}, nil)
	breakerDesc = prometheus.NewDesc("pdserve_router_pair_breaker_state",
		"State of each (prefill, decode) pair's KV path breaker: 0 closed, 1 half_open, 2 open.", []string{"prefill", "decode"}, nil)
	registryUpDesc = prometheus.NewDesc("pdserve_router_registry_up",
		"1 while the router follows its registry (it listed the fleet and its source answered the last check), 0 while it serves the fleet it last saw.",
		[]string{"backend"}, nil)
	registrySyncDesc = prometheus.NewDesc("pdserve_router_registry_last_sync_timestamp_seconds",
		"When the registry last confirmed the fleet (etcd's last answer, or the last snapshot), Unix seconds; 0 before.",
		[]string{"backend"}, nil)
)

type stateGauges struct{ state func() RouterState }

func (c stateGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{workersDesc, inflightDesc, routerOldestDesc, legTimeoutDesc, legsDesc, saturatedDesc, breakerDesc, registryUpDesc, registrySyncDesc} {
		ch <- d
	}
}

func (c stateGauges) Collect(ch chan<- prometheus.Metric) {
	st := c.state()
	for k, n := range st.Workers {
		ch <- prometheus.MustNewConstMetric(workersDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	for _, s := range RouterStages {
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(st.Inflight[s]), s)
		ch <- prometheus.MustNewConstMetric(routerOldestDesc, prometheus.GaugeValue, st.Oldest[s].Seconds(), s)
	}
	if st.LegTimeout > 0 {
		ch <- prometheus.MustNewConstMetric(legTimeoutDesc, prometheus.GaugeValue, st.LegTimeout.Seconds())
	}
	for _, w := range st.Legs {
		ch <- prometheus.MustNewConstMetric(legsDesc, prometheus.GaugeValue, float64(w.Legs), w.Role, w.URL)
		sat := 0.0
		if w.Saturated {
			sat = 1
		}
		ch <- prometheus.MustNewConstMetric(saturatedDesc, prometheus.GaugeValue, sat, w.Role, w.URL)
	}
	for _, p := range st.Pairs {
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, float64(p.State), p.Prefill, p.Decode)
	}
	if r := st.Registry; r.Backend != "" {
		up, sync := 0.0, 0.0
		if r.Up {
			up = 1
		}
		if !r.LastSync.IsZero() {
			sync = float64(r.LastSync.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(registryUpDesc, prometheus.GaugeValue, up, r.Backend)
		ch <- prometheus.MustNewConstMetric(registrySyncDesc, prometheus.GaugeValue, sync, r.Backend)
	}
}

// ShedReasons are the reasons of pdserve_router_shed_total.
var ShedReasons = []string{"max_inflight", "decode_queue", "decode_kv", "prefill_queue", "worker_overloaded"}

// NewRouter registers a router's collectors on reg, with every series of
// the given roles, policies and workers present from the start. It returns
// an error if a collector is already registered on reg.
func NewRouter(reg prometheus.Registerer, cfg RouterConfig) (*Router, error) {
	model := prometheus.Labels{"model_name": cfg.ModelName}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: model})
	}
	ttft := hist("pdserve_router_time_to_first_token_seconds",
		"Time from the router receiving a request to its first output token sent to the client.", vllmTTFTBuckets)
	itl := hist("pdserve_router_inter_token_latency_seconds",
		"Time between output tokens sent to the client (a chunk of n tokens counts n gaps of 1/n).", routerITLBuckets)
	e2e := hist("pdserve_router_e2e_request_latency_seconds",
		"Time from the router receiving a request to the end of its answer, for requests that got a first token.", vllmRequestBuckets)
	queue := hist("pdserve_router_request_queue_time_seconds",
		"Time from the router receiving a request until the legs that served it were sent.", vllmRequestBuckets)
	m := &Router{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_requests_total",
			Help: "Requests the router answered, by outcome (ok, or the root cause of a failure) and path (pd, local, colocated).",
		}, []string{"outcome", "path"}),
		legFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_leg_failures_total",
			Help: "Failed legs (retried or not), by the role of the side that failed and the outcome.",
		}, []string{"role", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_retries_total",
			Help: "Attempts retried on a new pair (before any token reached the client), by the outcome that caused it.",
		}, []string{"cause"}),
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_migrations_total",
			Help: "Requests moved to a new pair because a worker failed under them, by the outcome that caused it: a decode or colocated leg that broke after output reached the client (continued from there), or a prefill leg whose worker was lost (retried).",
		}, []string{"cause"}),
		migrationDelay: hist("pdserve_router_migration_delay_seconds",
			"Time from a leg breaking after output reached the client to the continuation's first token, for streamed requests.", vllmTTFTBuckets),
		workerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_worker_failures_total",
			Help: "Failed calls and health checks, by worker URL.",
		}, []string{"worker"}),
		selections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_selections_total",
			Help: "Workers chosen for a leg, by role, the role's pair policy and worker URL.",
		}, []string{"role", "policy", "worker"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_shed_total",
			Help: "Requests answered 429 overloaded, by reason.",
		}, []string{"reason"}),
		prefixQueried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_prefix_queried_tokens_total",
			Help: "Prompt tokens of the legs the cache_aware policy placed, by role.",
		}, []string{"role"}),
		prefixMatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_prefix_matched_tokens_total",
			Help: "Prompt tokens of those legs the router's record says the chosen worker has cached, by role.",
		}, []string{"role"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_router_prompt_tokens_total",
			Help: "Prompt tokens of the requests whose first token reached the client.", ConstLabels: model}),
		genTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_router_generation_tokens_total",
			Help: "Output tokens sent to clients.", ConstLabels: model}),
		ttft: ttft, itl: itl, e2e: e2e, queue: queue,
		policies: cfg.Policies,
	}
	paths := cfg.Paths
	if len(paths) == 0 {
		paths = []string{PathPD}
	}
	for _, o := range outcome.All() {
		for _, p := range paths {
			m.requests.WithLabelValues(o.String(), p)
		}
		if o.Retryable() {
			m.retries.WithLabelValues(o.String())
		}
		if o.Migratable() {
			m.migrations.WithLabelValues(o.String())
		}
		if o == outcome.OK || o == outcome.NoWorker {
			continue
		}
		for _, r := range cfg.Roles {
			m.legFailures.WithLabelValues(r.String(), o.String())
		}
	}
	for _, why := range ShedReasons {
		m.shed.WithLabelValues(why)
	}
	for _, r := range cfg.Roles {
		m.prefixQueried.WithLabelValues(r.String())
		m.prefixMatched.WithLabelValues(r.String())
	}
	for url, role := range cfg.Workers {
		m.WorkerSeen(url, role)
	}
	cs := []prometheus.Collector{m.requests, m.legFailures, m.retries, m.migrations, m.migrationDelay, m.workerFailures, m.selections, m.shed,
		m.prefixQueried, m.prefixMatched, m.promptTokens, m.genTokens, ttft, itl, e2e, queue}
	if cfg.State != nil {
		cs = append(cs, stateGauges{cfg.State})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Answered counts a request answered with outcome o.
func (m *Router) Answered(o outcome.Outcome, path string) {
	m.requests.WithLabelValues(o.String(), path).Inc()
}

// The path label of pdserve_router_requests_total: how the router served a
// request.
const (
	// PathPD: disaggregated, a prefill and a decode worker (a prompt-only
	// request: a prefill worker alone); also a request answered before it
	// was placed (shed, no worker) by a router of prefill and decode
	// workers.
	PathPD = "pd"
	// PathLocal: a decode worker alone, which computed the prompt itself
	// (per-request disaggregation: --disagg-min-prompt-tokens).
	PathLocal = "local"
	// PathColocated: a colocated worker (the router's plain mode).
	PathColocated = "colocated"
)

// LegFailed counts a leg that failed with o on the side of role.
func (m *Router) LegFailed(role workerapi.Role, o outcome.Outcome) {
	m.legFailures.WithLabelValues(role.String(), o.String()).Inc()
}

// Retried counts an attempt retried on a new pair because of cause.
func (m *Router) Retried(cause outcome.Outcome) { m.retries.WithLabelValues(cause.String()).Inc() }

// Migrated counts a request moved to a new pair because a worker failed
// with cause under it.
func (m *Router) Migrated(cause outcome.Outcome) { m.migrations.WithLabelValues(cause.String()).Inc() }

// MigrationDelay observes the time from a leg breaking to the first token
// of the request's continuation.
func (m *Router) MigrationDelay(d time.Duration) { m.migrationDelay.Observe(seconds(d)) }

// Shed counts a request answered 429 for reason.
func (m *Router) Shed(reason string) { m.shed.WithLabelValues(reason).Inc() }

// Selected counts the worker at url chosen for a role's leg by policy.
func (m *Router) Selected(role workerapi.Role, policy, url string) {
	m.selections.WithLabelValues(role.String(), policy, url).Inc()
}

// PrefixMatched counts a leg of role placed by the cache_aware policy: its
// prompt tokens, and the tokens of it the chosen worker is believed to
// hold.
func (m *Router) PrefixMatched(role workerapi.Role, prompt, matched int) {
	m.prefixQueried.WithLabelValues(role.String()).Add(float64(prompt))
	m.prefixMatched.WithLabelValues(role.String()).Add(float64(matched))
}

// WorkerFailed counts a failed call to, or health check of, the worker at url.
func (m *Router) WorkerFailed(url string) { m.workerFailures.WithLabelValues(url).Inc() }

// WorkerSeen creates a joining worker's series.
func (m *Router) WorkerSeen(url string, role workerapi.Role) {
	m.workerFailures.WithLabelValues(url)
	if p, ok := m.policies[role]; ok {
		m.selections.WithLabelValues(role.String(), p, url)
	}
}

// WorkerGone drops a worker's series once it left the fleet.
func (m *Router) WorkerGone(url string) {
	m.workerFailures.DeleteLabelValues(url)
	m.selections.DeletePartialMatch(prometheus.Labels{"worker": url})
}

// FirstToken observes a request's time to first token (d), the time it
// waited before its legs were sent (queued), and counts its prompt tokens.
func (m *Router) FirstToken(d, queued time.Duration, promptTokens int) {
	m.ttft.Observe(seconds(d))
	m.queue.Observe(seconds(queued))
	m.promptTokens.Add(float64(promptTokens))
}

// Tokens observes n output tokens sent to the client, gap after the
// previous ones (first: the first chunk, whose gap is the TTFT).
func (m *Router) Tokens(n int, gap time.Duration, first bool) {
	m.genTokens.Add(float64(n))
	if first || n <= 0 {
		return
	}
	per := seconds(gap) / float64(n)
	for range n {
		m.itl.Observe(per)
	}
}

// Ended observes a request's end to end latency (requests that got a first
// token).
func (m *Router) Ended(d time.Duration) { m.e2e.Observe(seconds(d)) }

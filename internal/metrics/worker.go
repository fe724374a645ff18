package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Worker is the metrics of one worker:
//
//   - pdserve_requests_finished_total{role,outcome} (counter): requests that
//     reached a terminal state, by outcome (every outcome a worker has).
//   - pdserve_stage_duration_seconds{role,stage} (histogram, seconds): time
//     requests spent in each stage of the role.
//   - pdserve_time_to_first_token_seconds (histogram, seconds, const label
//     role): arrival on this worker to its first output token; on a prefill
//     worker, to the first token it sampled (the end of its prefill: the
//     time its bootstrap, queue and prefill stages took), observed for the
//     requests it served.
//   - pdserve_inter_token_latency_seconds (histogram, seconds; decode and
//     colocated workers only: prefill makes one token): the gap before each
//     output event after the first.
//   - pdserve_e2e_request_latency_seconds (histogram, seconds): arrival to
//     the end, for every request that got its first token whatever its end
//     (an abort after the first token too), so that its count follows
//     TTFT's.
//   - pdserve_kv_transfer_bytes_total{role,direction} (counter, bytes): KV
//     sent (prefill) or received (decode).
//   - pdserve_forward_batches_total{role,kind} (counter): forward passes by
//     kind (prefill, decode, mixed).
//   - pdserve_grammar_compile_seconds (histogram, seconds, const label
//     role): time to compile a request's constraint (structured outputs)
//     and bind it to the model's vocabulary, on a miss of the worker's
//     compiled-constraint cache.
//   - pdserve_grammar_cache_requests_total{role,result} (counter): lookups
//     of that cache by result, hit or miss.
//   - read at scrape time from the Snapshot: pdserve_requests{role,stage}
//     and pdserve_oldest_request_age_seconds{role,stage} (gauges),
//     pdserve_stage_deadline_seconds{role,stage} (gauge, seconds: the
//     longest a request may stay in the stage by the worker's flags; an
//     oldest age above it means a request outlived its deadline),
//     pdserve_kv_pages{role,state} (gauge, pages: used, cached, free; cached
//     pages are the prefix cache's, unreferenced and evicted as
//     allocations need them),
//     pdserve_prefix_cache_queries_total{role} and
//     pdserve_prefix_cache_hits_total{role} (counters, tokens: looked up in
//     the prefix cache and found there, as vLLM's prefix_cache_queries and
//     prefix_cache_hits), pdserve_prefix_cache_evictions_total{role}
//     (counter, pages),
//     pdserve_rooms{role,kind} (gauge: pending_open, tombstone),
//     pdserve_preemptions_total{role},
//     pdserve_peer_abort_tombstones_total{role} (ABORTs from the KV peer
//     for a room this worker did not hold, each leaving a tombstone) and
//     pdserve_kv_frames_dropped_total{role,reason} (counters), and
//     pdserve_worker_loop_up{role} (1 if the loop answered the scrape).
//   - prefill only, also from the Snapshot:
//     pdserve_optimistic_prefill_total{role,outcome} (counter): optimistic
//     prefills (computed before decode's ROOM_OPEN) started, parked
//     (complete before it), and how their optimistic KV ended: sent,
//     expired (a deadline first), aborted (any other end first), fell_back
//     (dropped: attempts used up, or its pages went to a bound request);
//     started = sent + expired + aborted + fell_back + those in flight.
//     pdserve_optimistic_prefill_kv_bytes{role,state} (gauge, bytes): KV
//     held by optimistic requests not yet bound to their room, computing
//     or parked (capped by --optimistic-prefill-max-parked of the pool).
//
// With [WithSGLang] it also exposes SGLang's series (see sglang.go).
// Durations are clamped at zero before they are observed, so no latency
// series can go negative whatever the clock does.
type Worker struct {
	role          string
	finished      *prometheus.CounterVec
	stageDuration *prometheus.HistogramVec
	ttft          prometheus.Observer
	itl           prometheus.Observer
	e2e           prometheus.Observer
	kvBytes       *prometheus.CounterVec
	batches       *prometheus.CounterVec
	grammarTime   prometheus.Observer
	grammarCache  *prometheus.CounterVec
	sglang        *sglang // nil without WithSGLang
}

// WorkerState is what a worker's machine and transport hold at one scrape.
type WorkerState struct {
	// Stages lists every non-terminal stage of the role, with its live
	// requests and how long the earliest to enter it has been there.
	Stages       []StageState
	PagesUsed    int
	PagesCached  int
	PagesTotal   int
	PendingOpens int
	Tombstones   int
	Preemptions  uint64
	// PrefixQueriedTokens and PrefixHitTokens count the tokens looked up
	// in the prefix cache and found there; PrefixEvictions the cached pages
	// evicted to make room.
	PrefixQueriedTokens uint64
	PrefixHitTokens     uint64
	PrefixEvictions     uint64
	// PeerAbortTombstones counts the peer's ABORTs for rooms this worker
	// did not hold (each left a tombstone).
	PeerAbortTombstones uint64
	// FramesDropped counts KV channel frames dropped, by reason.
	FramesDropped map[string]uint64
	// GenThroughput is output tokens per second over the recent past
	// (sglang:gen_throughput).
	GenThroughput float64
	// KV counts the KV channel's connections (prefill and decode).
	KV KVConns
	// Optimistic (prefill) counts optimistic prefill by outcome, keyed by
	// the names in OptimisticOutcomes.
	Optimistic map[string]uint64
	// OptimisticKVBytes (prefill) is the KV held by optimistic requests
	// not yet bound to their room, in bytes, by state: computing, parked.
	OptimisticKVBytes map[string]int64
}

// KVConns counts a worker's KV connections: Dials (decode: connections it
// opened; Reconnects those to an address it had a connection to before)
// and Live connections now. Refused handshakes are counted by reason in
// pdserve_peer_auth_failures_total{channel="kv"}.
type KVConns struct {
	Dials, Reconnects uint64
	Live              int
}

// OptimisticOutcomes are the outcome labels of
// pdserve_optimistic_prefill_total, every one exposed from the start.
var OptimisticOutcomes = []string{"started", "parked", "sent", "expired", "aborted", "fell_back"}

// OptimisticStates are the state labels of
// pdserve_optimistic_prefill_kv_bytes.
var OptimisticStates = []string{"computing", "parked"}

// StageState is one stage of a WorkerState.
type StageState struct {
	Stage    string
	Requests int
	Oldest   time.Duration
	// Deadline is the longest a request may stay in the stage.
	Deadline time.Duration
}

// Snapshot returns the worker's current state; ok is false if its loop did
// not answer in time. It is called on every scrape.
type Snapshot func() (st WorkerState, ok bool)

// Direction is which way KV bytes moved.
type Direction string

// Directions of KV bytes.
const (
	KVSent     Direction = "sent"
	KVReceived Direction = "received"
)

// Batch kinds.
const (
	BatchPrefill = "prefill"
	BatchDecode  = "decode"
	BatchMixed   = "mixed"
)

// WorkerOption adds to a worker's collectors.
type WorkerOption func(*Worker, workerapi.Role)

// WithSGLang adds SGLang's series (sglang:*, see sglang.go) for a worker
// serving the model named model (their model_name label).
func WithSGLang(model string) WorkerOption {
	return func(w *Worker, role workerapi.Role) { w.sglang = newSGLang(role, model) }
}

// NewWorker registers the collectors of a worker of role on reg; stages
// are the role's non-terminal stages (for the stage histograms). snap is
// read at scrape time. It returns an error if a collector is already
// registered on reg.
func NewWorker(reg prometheus.Registerer, role workerapi.Role, stages []string, snap Snapshot, opts ...WorkerOption) (*Worker, error) {
	r := role.String()
	w := &Worker{role: r}
	for _, o := range opts {
		o(w, role)
	}
	w.finished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_requests_finished_total",
		Help: "Requests that reached a terminal state, by outcome.",
	}, []string{"role", "outcome"})
	w.stageDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pdserve_stage_duration_seconds",
		Help:    "Time requests spent in each lifecycle stage.",
		Buckets: latencyBuckets,
	}, []string{"role", "stage"})
	newHist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: latencyBuckets, ConstLabels: prometheus.Labels{"role": r}})
	}
	ttft := newHist("pdserve_time_to_first_token_seconds", "Time from arrival on this worker to the first output token.")
	e2e := newHist("pdserve_e2e_request_latency_seconds", "Time from arrival on this worker to the end, for requests that got their first token.")
	w.ttft, w.e2e = ttft, e2e
	cs := []prometheus.Collector{ttft, e2e}
	if role != workerapi.RolePrefill {
		itl := newHist("pdserve_inter_token_latency_seconds", "Time between consecutive output events of a request.")
		w.itl = itl
		cs = append(cs, itl)
	}
	w.kvBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_kv_transfer_bytes_total",
		Help: "KV cache bytes sent (prefill) or received (decode) over the KV channel.",
	}, []string{"role", "direction"})
	w.batches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_forward_batches_total",
		Help: "Forward passes run, by kind (prefill, decode, mixed).",
	}, []string{"role", "kind"})
	grammarTime := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pdserve_grammar_compile_seconds",
		Help:    "Time to compile a constraint and bind it to the vocabulary, on a cache miss.",
		Buckets: compileBuckets, ConstLabels: prometheus.Labels{"role": r}})
	w.grammarTime = grammarTime
	w.grammarCache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_grammar_cache_requests_total",
		Help: "Lookups of the compiled-constraint cache, by result (hit, miss).",
	}, []string{"role", "result"})
	w.grammarCache.WithLabelValues(r, "hit")
	w.grammarCache.WithLabelValues(r, "miss")
	cs = append(cs, grammarTime, w.grammarCache)
	for _, o := range outcome.Worker() {
		w.finished.WithLabelValues(r, o.String())
	}
	for _, s := range stages {
		w.stageDuration.WithLabelValues(r, s)
	}
	kinds := []string{BatchPrefill, BatchDecode, BatchMixed} // decode recomputes a preempted request's KV
	switch role {
	case workerapi.RolePrefill:
		w.kvBytes.WithLabelValues(r, string(KVSent))
		kinds = kinds[:1]
	case workerapi.RoleDecode:
		w.kvBytes.WithLabelValues(r, string(KVReceived))
	}
	for _, k := range kinds {
		w.batches.WithLabelValues(r, k)
	}
	cs = append(cs, w.finished, w.stageDuration, w.kvBytes, w.batches, &stateCollector{role: r, snap: snap, sglang: w.sglang})
	if w.sglang != nil {
		cs = append(cs, w.sglang.collectors...)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Finished counts a request that ended with o after age; cause is its
// first failure (zero for OK), which SGLang's failure counters are counted
// by. A request that got its first token is also observed with Ended.
func (w *Worker) Finished(o outcome.Outcome, cause outcome.Cause, age time.Duration) {
	w.finished.WithLabelValues(w.role, o.String()).Inc()
	if w.sglang != nil {
		w.sglang.finished(o, cause, age)
	}
}

// compileBuckets are pdserve_grammar_compile_seconds' buckets: 100 µs to
// about 6.5 s, ×4 apart (a typical JSON Schema compiles in about 1 ms).
var compileBuckets = prometheus.ExponentialBuckets(1e-4, 4, 9)

// GrammarLookup counts a lookup of the compiled-constraint cache: a hit,
// or a miss whose compilation took d.
func (w *Worker) GrammarLookup(hit bool, d time.Duration) {
	if hit {
		w.grammarCache.WithLabelValues(w.role, "hit").Inc()
		return
	}
	w.grammarCache.WithLabelValues(w.role, "miss").Inc()
	w.grammarTime.Observe(seconds(d))
}

// Ended observes the E2E latency of a request that got its first token,
// however it ended.
func (w *Worker) Ended(age time.Duration) { w.e2e.Observe(seconds(age)) }

// StageTime observes the time an ended request spent in stage.
func (w *Worker) StageTime(stage string, d time.Duration) {
	w.stageDuration.WithLabelValues(w.role, stage).Observe(seconds(d))
}

// FirstToken observes a time to first token.
func (w *Worker) FirstToken(d time.Duration) {
	w.ttft.Observe(seconds(d))
	if w.sglang != nil {
		w.sglang.ttft.Observe(seconds(d))
	}
}

// InterToken observes the gap d before an output event of n tokens (one
// observation per event in pdserve_inter_token_latency_seconds; n of d/n in
// sglang:inter_token_latency_seconds, as SGLang counts per token).
func (w *Worker) InterToken(d time.Duration, n int) {
	if w.itl != nil {
		w.itl.Observe(seconds(d))
	}
	if w.sglang != nil {
		w.sglang.interToken(d, n)
	}
}

// KVTransfer observes a prefill request's finished KV transfer: d is the
// time from its last chunk computed (KV_DONE sent) to decode's KV_ACK, bytes
// the KV bytes of its prompt (sglang:kv_transfer_latency_ms and
// sglang:kv_transfer_speed_gb_s; pdserve's own figure is
// pdserve_stage_duration_seconds{stage="transferring"}).
func (w *Worker) KVTransfer(d time.Duration, bytes int) {
	if w.sglang != nil {
		w.sglang.kvTransfer(d, bytes)
	}
}

// KVBytes counts n KV bytes moved in direction d.
func (w *Worker) KVBytes(d Direction, n int) {
	w.kvBytes.WithLabelValues(w.role, string(d)).Add(float64(n))
}

// Batch counts a forward pass of kind (BatchPrefill, BatchDecode, BatchMixed).
func (w *Worker) Batch(kind string) { w.batches.WithLabelValues(w.role, kind).Inc() }

var (
	requestsDesc = prometheus.NewDesc("pdserve_requests",
		"Live requests in each lifecycle stage, read from the state machine at scrape time.",
		[]string{"role", "stage"}, nil)
	oldestDesc = prometheus.NewDesc("pdserve_oldest_request_age_seconds",
		"How long the request that entered each stage earliest has been in it (0 if empty).",
		[]string{"role", "stage"}, nil)
	deadlineDesc = prometheus.NewDesc("pdserve_stage_deadline_seconds",
		"The longest a request may stay in each stage, by this worker's flags: its oldest age above this is a pinned request.",
		[]string{"role", "stage"}, nil)
	pagesDesc = prometheus.NewDesc("pdserve_kv_pages",
		"KV cache pages by state (used: held by requests; cached: the prefix cache's, evictable; free).", []string{"role", "state"}, nil)
	prefixQueriesDesc = prometheus.NewDesc("pdserve_prefix_cache_queries_total",
		"Tokens looked up in the prefix cache (each time a request starts computing, or decode admits a room).", []string{"role"}, nil)
	prefixHitsDesc = prometheus.NewDesc("pdserve_prefix_cache_hits_total",
		"Tokens found in the prefix cache: not computed again (prefill, colocated) or not transferred (decode).", []string{"role"}, nil)
	prefixEvictionsDesc = prometheus.NewDesc("pdserve_prefix_cache_evictions_total",
		"Cached pages evicted to make room for new KV.", []string{"role"}, nil)
	droppedDesc = prometheus.NewDesc("pdserve_kv_frames_dropped_total",
		"KV channel frames dropped, by reason.", []string{"role", "reason"}, nil)
	roomsDesc = prometheus.NewDesc("pdserve_rooms",
		"Room bookkeeping: pending (ROOM_OPEN before its request) and tombstones.", []string{"role", "kind"}, nil)
	preemptDesc = prometheus.NewDesc("pdserve_preemptions_total",
		"Requests that lost their KV pages to older ones and recomputed them.", []string{"role"}, nil)
	peerAbortTombDesc = prometheus.NewDesc("pdserve_peer_abort_tombstones_total",
		"ABORTs from the KV peer for a room this worker did not hold; each leaves a tombstone for --tombstone-ttl.",
		[]string{"role"}, nil)
	kvDialsDesc = prometheus.NewDesc("pdserve_kv_dials_total",
		"KV connections this worker opened (decode: to prefill workers).", []string{"role"}, nil)
	kvReconnectsDesc = prometheus.NewDesc("pdserve_kv_reconnects_total",
		"KV connections opened to an address this worker had a connection to before.", []string{"role"}, nil)
	kvLiveDesc = prometheus.NewDesc("pdserve_kv_connections",
		"KV connections up now (handshake passed, not lost).", []string{"role"}, nil)
	upDesc = prometheus.NewDesc("pdserve_worker_loop_up",
		"1 if the worker loop answered this scrape, 0 if it did not in time.", []string{"role"}, nil)
	optimisticDesc = prometheus.NewDesc("pdserve_optimistic_prefill_total",
		"Optimistic prefills (computed before decode's ROOM_OPEN): started, parked, and how their KV ended (sent, expired, aborted, fell_back).",
		[]string{"role", "outcome"}, nil)
	optimisticBytesDesc = prometheus.NewDesc("pdserve_optimistic_prefill_kv_bytes",
		"KV bytes held by optimistic requests not yet bound to their room, computing or parked.",
		[]string{"role", "state"}, nil)
)

type stateCollector struct {
	role   string
	snap   Snapshot
	sglang *sglang
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{requestsDesc, oldestDesc, deadlineDesc, pagesDesc, droppedDesc, roomsDesc, preemptDesc,
		peerAbortTombDesc, upDesc, prefixQueriesDesc, prefixHitsDesc, prefixEvictionsDesc} {
		ch <- d
	}
	if c.role != workerapi.RoleColocated.String() {
		for _, d := range []*prometheus.Desc{kvDialsDesc, kvReconnectsDesc, kvLiveDesc} {
			ch <- d
		}
	}
	if c.role == workerapi.RolePrefill.String() {
		ch <- optimisticDesc
		ch <- optimisticBytesDesc
	}
	if c.sglang != nil {
		for _, d := range c.sglang.gaugeDescs {
			ch <- d
		}
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.snap()
	up := 0.0
	if ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, c.role)
	if !ok {
		return
	}
	for _, s := range st.Stages {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, float64(s.Requests), c.role, s.Stage)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, seconds(s.Oldest), c.role, s.Stage)
		ch <- prometheus.MustNewConstMetric(deadlineDesc, prometheus.GaugeValue, seconds(s.Deadline), c.role, s.Stage)
	}
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesUsed), c.role, "used")
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesCached), c.role, "cached")
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(max(0, st.PagesTotal-st.PagesUsed-st.PagesCached)), c.role, "free")
	ch <- prometheus.MustNewConstMetric(prefixQueriesDesc, prometheus.CounterValue, float64(st.PrefixQueriedTokens), c.role)
	ch <- prometheus.MustNewConstMetric(prefixHitsDesc, prometheus.CounterValue, float64(st.PrefixHitTokens), c.role)
	ch <- prometheus.MustNewConstMetric(prefixEvictionsDesc, prometheus.CounterValue, float64(st.PrefixEvictions), c.role)
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.PendingOpens), c.role, "pending_open")
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.Tombstones), c.role, "tombstone")
	ch <- prometheus.MustNewConstMetric(preemptDesc, prometheus.CounterValue, float64(st.Preemptions), c.role)
	ch <- prometheus.MustNewConstMetric(peerAbortTombDesc, prometheus.CounterValue, float64(st.PeerAbortTombstones), c.role)
	for reason, n := range st.FramesDropped {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n), c.role, reason)
	}
	if c.role != workerapi.RoleColocated.String() {
		ch <- prometheus.MustNewConstMetric(kvDialsDesc, prometheus.CounterValue, float64(st.KV.Dials), c.role)
		ch <- prometheus.MustNewConstMetric(kvReconnectsDesc, prometheus.CounterValue, float64(st.KV.Reconnects), c.role)
		ch <- prometheus.MustNewConstMetric(kvLiveDesc, prometheus.GaugeValue, float64(st.KV.Live), c.role)
	}
	if c.role == workerapi.RolePrefill.String() {
		for _, o := range OptimisticOutcomes {
			ch <- prometheus.MustNewConstMetric(optimisticDesc, prometheus.CounterValue, float64(st.Optimistic[o]), c.role, o)
		}
		for _, s := range OptimisticStates {
			ch <- prometheus.MustNewConstMetric(optimisticBytesDesc, prometheus.GaugeValue, float64(max(0, st.OptimisticKVBytes[s])), c.role, s)
		}
	}
	if c.sglang != nil {
		vals := c.sglang.gauges(st)
		for i, d := range c.sglang.gaugeDescs {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, vals[i])
		}
	}
}

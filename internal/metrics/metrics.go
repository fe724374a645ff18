// Package metrics holds pdserve's Prometheus collectors. Nothing registers
// itself: constructors take the prometheus.Registerer to use, so every worker
// (and every test) has its own registry.
//
// Stage gauges are not kept as counters that a code path could forget to
// decrement: they are read from the lifecycle machine at scrape time, so each
// gauge equals the true count of its stage at every scrape.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Latency buckets in seconds: 1 ms … ~160 s, roughly ×2 per bucket
// (finer at the low end, where TTFT and ITL of a fast model live).
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 20, 40, 80, 160}

// Worker is the metrics of one worker.
type Worker struct {
	role          string
	finished      *prometheus.CounterVec
	stageDuration *prometheus.HistogramVec
	ttft          prometheus.Observer
	itl           prometheus.Observer
	e2e           prometheus.Observer
	kvBytes       *prometheus.CounterVec
	batches       *prometheus.CounterVec
}

// Snapshot returns the machine's current stats and the transport's dropped
// frame counts by reason; it is called on every scrape.
type Snapshot func() (lifecycle.Stats, map[string]uint64, bool)

// NewWorker registers a worker's collectors on reg. snap is read at scrape
// time for the stage gauges, oldest ages, page counts and dropped frames.
// It returns an error if a collector is already registered on reg.
func NewWorker(reg prometheus.Registerer, role lifecycle.Role, snap Snapshot) (*Worker, error) {
	r := role.String()
	w := &Worker{role: r}
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
	itl := newHist("pdserve_inter_token_latency_seconds", "Time between consecutive output tokens of a request.")
	e2e := newHist("pdserve_e2e_request_latency_seconds", "Time from arrival on this worker to the terminal state.")
	w.ttft, w.itl, w.e2e = ttft, itl, e2e
	w.kvBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_kv_transfer_bytes_total",
		Help: "KV cache bytes sent (prefill) or received (decode) over the KV channel.",
	}, []string{"role", "direction"})
	w.batches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_forward_batches_total",
		Help: "Forward passes run, by kind (prefill, decode, mixed).",
	}, []string{"role", "kind"})
	for _, o := range outcome.Worker() {
		w.finished.WithLabelValues(r, o.String())
	}
	for _, c := range []prometheus.Collector{w.finished, w.stageDuration, ttft, itl, e2e, w.kvBytes, w.batches,
		&stateCollector{role: r, snap: snap}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Finished counts a terminal request and observes its stage times and E2E latency.
func (w *Worker) Finished(f lifecycle.Finalize) {
	w.finished.WithLabelValues(w.role, f.Outcome.String()).Inc()
	for s, d := range f.StageTime {
		w.stageDuration.WithLabelValues(w.role, s.String()).Observe(d.Seconds())
	}
	if f.Outcome == outcome.OK {
		w.e2e.Observe(f.Age.Seconds())
	}
}

// FirstToken observes a time to first token.
func (w *Worker) FirstToken(d time.Duration) { w.ttft.Observe(d.Seconds()) }

// InterToken observes the gap between two output tokens.
func (w *Worker) InterToken(d time.Duration) { w.itl.Observe(d.Seconds()) }

// KVBytes counts KV bytes moved; direction is "sent" or "received".
func (w *Worker) KVBytes(direction string, n int) {
	w.kvBytes.WithLabelValues(w.role, direction).Add(float64(n))
}

// Batch counts a forward pass.
func (w *Worker) Batch(kind string) { w.batches.WithLabelValues(w.role, kind).Inc() }

var (
	requestsDesc = prometheus.NewDesc("pdserve_requests",
		"Live requests in each lifecycle stage, read from the state machine at scrape time.",
		[]string{"role", "stage"}, nil)
	oldestDesc = prometheus.NewDesc("pdserve_oldest_request_age_seconds",
		"How long the request that entered each stage earliest has been in it (0 if empty).",
		[]string{"role", "stage"}, nil)
	pagesDesc = prometheus.NewDesc("pdserve_kv_pages",
		"KV cache pages by state (used, free).", []string{"role", "state"}, nil)
	droppedDesc = prometheus.NewDesc("pdserve_kv_frames_dropped_total",
		"KV channel frames dropped, by reason.", []string{"role", "reason"}, nil)
	roomsDesc = prometheus.NewDesc("pdserve_rooms",
		"Room bookkeeping: pending (ROOM_OPEN before its request) and tombstones.", []string{"role", "kind"}, nil)
	preemptDesc = prometheus.NewDesc("pdserve_preemptions_total",
		"Requests that lost their KV pages to older ones and recomputed them.", []string{"role"}, nil)
	upDesc = prometheus.NewDesc("pdserve_worker_loop_up",
		"1 if the worker loop answered this scrape, 0 if it did not in time.", []string{"role"}, nil)
)

type stateCollector struct {
	role string
	snap Snapshot
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{requestsDesc, oldestDesc, pagesDesc, droppedDesc, roomsDesc, preemptDesc, upDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, dropped, ok := c.snap()
	up := 0.0
	if ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, c.role)
	if !ok {
		return
	}
	for s, n := range st.Stages {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, float64(n), c.role, s.String())
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, st.OldestInStage[s].Seconds(), c.role, s.String())
	}
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesUsed), c.role, "used")
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesTotal-st.PagesUsed), c.role, "free")
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.PendingOpens), c.role, "pending_open")
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.Tombstones), c.role, "tombstone")
	ch <- prometheus.MustNewConstMetric(preemptDesc, prometheus.CounterValue, float64(st.Counters.Preemptions), c.role)
	all := make(map[string]uint64)
	for k, v := range st.Counters.FramesDropped {
		all[k] += v
	}
	for k, v := range dropped {
		all[k] += v
	}
	for reason, n := range all {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n), c.role, reason)
	}
}

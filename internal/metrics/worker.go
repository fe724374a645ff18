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
//   - pdserve_time_to_first_token_seconds, pdserve_inter_token_latency_seconds,
//     pdserve_e2e_request_latency_seconds (histograms, seconds, const label
//     role): arrival to first token, between tokens, arrival to end (OK).
//   - pdserve_kv_transfer_bytes_total{role,direction} (counter, bytes): KV
//     sent (prefill) or received (decode).
//   - pdserve_forward_batches_total{role,kind} (counter): forward passes by
//     kind (prefill, decode, mixed).
//   - read at scrape time from the Snapshot: pdserve_requests{role,stage}
//     and pdserve_oldest_request_age_seconds{role,stage} (gauges),
//     pdserve_kv_pages{role,state} (gauge, pages: used, free),
//     pdserve_rooms{role,kind} (gauge: pending_open, tombstone),
//     pdserve_preemptions_total{role},
//     pdserve_peer_abort_tombstones_total{role} (ABORTs from the KV peer
//     for a room this worker did not hold, each leaving a tombstone) and
//     pdserve_kv_frames_dropped_total{role,reason} (counters), and
//     pdserve_worker_loop_up{role} (1 if the loop answered the scrape).
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

// WorkerState is what a worker's machine and transport hold at one scrape.
type WorkerState struct {
	// Stages lists every non-terminal stage of the role, with its live
	// requests and how long the earliest to enter it has been there.
	Stages       []StageState
	PagesUsed    int
	PagesTotal   int
	PendingOpens int
	Tombstones   int
	Preemptions  uint64
	// PeerAbortTombstones counts the peer's ABORTs for rooms this worker
	// did not hold (each left a tombstone).
	PeerAbortTombstones uint64
	// FramesDropped counts KV channel frames dropped, by reason.
	FramesDropped map[string]uint64
}

// StageState is one stage of a WorkerState.
type StageState struct {
	Stage    string
	Requests int
	Oldest   time.Duration
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

// NewWorker registers the collectors of a worker of role on reg; stages
// are the role's non-terminal stages (for the stage histograms). snap is
// read at scrape time. It returns an error if a collector is already
// registered on reg.
func NewWorker(reg prometheus.Registerer, role workerapi.Role, stages []string, snap Snapshot) (*Worker, error) {
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
	for _, c := range []prometheus.Collector{w.finished, w.stageDuration, ttft, itl, e2e, w.kvBytes, w.batches,
		&stateCollector{role: r, snap: snap}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Finished counts a request that ended with o after age (the E2E latency,
// observed for OK only).
func (w *Worker) Finished(o outcome.Outcome, age time.Duration) {
	w.finished.WithLabelValues(w.role, o.String()).Inc()
	if o == outcome.OK {
		w.e2e.Observe(age.Seconds())
	}
}

// StageTime observes the time an ended request spent in stage.
func (w *Worker) StageTime(stage string, d time.Duration) {
	w.stageDuration.WithLabelValues(w.role, stage).Observe(d.Seconds())
}

// FirstToken observes a time to first token.
func (w *Worker) FirstToken(d time.Duration) { w.ttft.Observe(d.Seconds()) }

// InterToken observes the gap between two output tokens.
func (w *Worker) InterToken(d time.Duration) { w.itl.Observe(d.Seconds()) }

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
	pagesDesc = prometheus.NewDesc("pdserve_kv_pages",
		"KV cache pages by state (used, free).", []string{"role", "state"}, nil)
	droppedDesc = prometheus.NewDesc("pdserve_kv_frames_dropped_total",
		"KV channel frames dropped, by reason.", []string{"role", "reason"}, nil)
	roomsDesc = prometheus.NewDesc("pdserve_rooms",
		"Room bookkeeping: pending (ROOM_OPEN before its request) and tombstones.", []string{"role", "kind"}, nil)
	preemptDesc = prometheus.NewDesc("pdserve_preemptions_total",
		"Requests that lost their KV pages to older ones and recomputed them.", []string{"role"}, nil)
	peerAbortTombDesc = prometheus.NewDesc("pdserve_peer_abort_tombstones_total",
		"ABORTs from the KV peer for a room this worker did not hold; each leaves a tombstone for --tombstone-ttl.",
		[]string{"role"}, nil)
	upDesc = prometheus.NewDesc("pdserve_worker_loop_up",
		"1 if the worker loop answered this scrape, 0 if it did not in time.", []string{"role"}, nil)
)

type stateCollector struct {
	role string
	snap Snapshot
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{requestsDesc, oldestDesc, pagesDesc, droppedDesc, roomsDesc, preemptDesc,
		peerAbortTombDesc, upDesc} {
		ch <- d
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
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, s.Oldest.Seconds(), c.role, s.Stage)
	}
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesUsed), c.role, "used")
	ch <- prometheus.MustNewConstMetric(pagesDesc, prometheus.GaugeValue, float64(st.PagesTotal-st.PagesUsed), c.role, "free")
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.PendingOpens), c.role, "pending_open")
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(st.Tombstones), c.role, "tombstone")
	ch <- prometheus.MustNewConstMetric(preemptDesc, prometheus.CounterValue, float64(st.Preemptions), c.role)
	ch <- prometheus.MustNewConstMetric(peerAbortTombDesc, prometheus.CounterValue, float64(st.PeerAbortTombstones), c.role)
	for reason, n := range st.FramesDropped {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n), c.role, reason)
	}
}

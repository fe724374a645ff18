package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Router is the metrics of a router:
//
//   - pdserve_router_requests_total{outcome} (counter): requests the router
//     answered, by outcome: ok; the root cause's outcome when a leg failed;
//     aborted_client when the client went away; shutdown when the router
//     stopped; no_worker when no worker or pair could be picked.
//   - pdserve_router_leg_failures_total{role,outcome} (counter): failed
//     legs, retried or not, by the role of the side where the failure
//     happened and its outcome.
//   - pdserve_router_retries_total (counter): requests retried on a new
//     pair (before any token reached the client).
//   - pdserve_router_worker_failures_total{worker} (counter): failed calls
//     and health checks, by worker URL (a worker's series appears when it
//     joins the fleet and goes when it leaves).
//   - pdserve_router_workers{role,state} (gauge): workers by role and
//     state (pending, ready, not_ready, draining, removed), read from the
//     fleet at scrape time.
type Router struct {
	requests       *prometheus.CounterVec
	legFailures    *prometheus.CounterVec
	retries        prometheus.Counter
	workerFailures *prometheus.CounterVec
}

// WorkerCounts returns the number of workers per (role, state), every
// series the gauge should have included (zeros too).
type WorkerCounts func() map[[2]string]int

var workersDesc = prometheus.NewDesc("pdserve_router_workers",
	"Workers the router knows, by role and state, read from its fleet at scrape time.", []string{"role", "state"}, nil)

type workersCollector struct{ counts WorkerCounts }

func (c workersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- workersDesc }

func (c workersCollector) Collect(ch chan<- prometheus.Metric) {
	for k, n := range c.counts() {
		ch <- prometheus.MustNewConstMetric(workersDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// NewRouter registers a router's collectors on reg, with every series of
// the given leg roles and worker URLs present from the start. It returns an
// error if a collector is already registered on reg.
func NewRouter(reg prometheus.Registerer, roles []workerapi.Role, workers []string, counts WorkerCounts) (*Router, error) {
	m := &Router{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_requests_total",
			Help: "Requests the router answered, by outcome (ok, or the root cause of a failure).",
		}, []string{"outcome"}),
		legFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_leg_failures_total",
			Help: "Failed legs (retried or not), by the role of the side that failed and the outcome.",
		}, []string{"role", "outcome"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pdserve_router_retries_total",
			Help: "Requests retried on a new pair (before any token reached the client).",
		}),
		workerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_router_worker_failures_total",
			Help: "Failed calls and health checks, by worker URL.",
		}, []string{"worker"}),
	}
	for _, o := range outcome.All() {
		m.requests.WithLabelValues(o.String())
		if o == outcome.OK || o == outcome.NoWorker {
			continue
		}
		for _, r := range roles {
			m.legFailures.WithLabelValues(r.String(), o.String())
		}
	}
	for _, w := range workers {
		m.workerFailures.WithLabelValues(w)
	}
	cs := []prometheus.Collector{m.requests, m.legFailures, m.retries, m.workerFailures}
	if counts != nil {
		cs = append(cs, workersCollector{counts})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Answered counts a request answered with outcome o.
func (m *Router) Answered(o outcome.Outcome) { m.requests.WithLabelValues(o.String()).Inc() }

// LegFailed counts a leg that failed with o on the side of role.
func (m *Router) LegFailed(role workerapi.Role, o outcome.Outcome) {
	m.legFailures.WithLabelValues(role.String(), o.String()).Inc()
}

// Retried counts a request retried on a new pair.
func (m *Router) Retried() { m.retries.Inc() }

// WorkerFailed counts a failed call to, or health check of, the worker at url.
func (m *Router) WorkerFailed(url string) { m.workerFailures.WithLabelValues(url).Inc() }

// WorkerSeen creates a joining worker's series.
func (m *Router) WorkerSeen(url string) { m.workerFailures.WithLabelValues(url) }

// WorkerGone drops a worker's series once it left the fleet.
func (m *Router) WorkerGone(url string) { m.workerFailures.DeleteLabelValues(url) }

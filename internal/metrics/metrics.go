// Package metrics holds pdserve's Prometheus collectors: a worker's
// ([Worker]) and a router's ([Router]). Nothing registers itself:
// constructors take the prometheus.Registerer to use, so every worker,
// router and test has its own registry.
//
// Labels are enums (outcome.Outcome, workerapi.Role, lifecycle stages by
// name), and every series a collector can have is created with it, so a
// scrape shows a zero rather than no series before the first event.
//
// Stage gauges are not kept as counters that a code path could forget to
// decrement: they are read from the lifecycle machine at scrape time (the
// worker passes a [Snapshot]), so each gauge equals the true count of its
// stage at every scrape. The package does not import the lifecycle machine,
// so the router, which has none, uses it too.
package metrics

// Latency buckets in seconds: 1 ms … 160 s, finer from 50 ms to 1 s, where
// TTFT objectives and the stages that make them up live (a 200 ms or 300 ms
// TTFT SLO falls on a bucket bound), roughly ×2 per bucket elsewhere.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
	0.75, 1, 2.5, 5, 10, 20, 40, 80, 160}

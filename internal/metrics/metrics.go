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

// Latency buckets in seconds: 1 ms … 160 s, roughly ×2 per bucket (finer
// at the low end, where TTFT and ITL of a fast model live).
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 20, 40, 80, 160}

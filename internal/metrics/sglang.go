package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// SGLang-compatible series (a worker's --metrics-compat sglang): the names,
// types, label names and buckets of SGLang's SchedulerMetricsCollector and
// TokenizerMetricsCollector (python/sglang/srt/metrics/collector.py), each
// fed by the pdserve stage or outcome that means the same thing, so that an
// SGLang dashboard or alert works on pdserve workers. They sit next to the
// pdserve_* series, which stay the reference.
//
// Labels follow SGLang: scheduler series carry model_name (the served model
// name), engine_type ("prefill", "decode", or "unified" for a colocated
// worker), tp_rank and pp_rank ("0": a pdserve worker is one rank); request
// series (TTFT, ITL, E2E, aborted) carry model_name only.
//
// Scrape-time gauges, from the same snapshot as pdserve_requests (never
// counters that could drift):
//
//	sglang:num_prefill_bootstrap_queue_reqs  stage bootstrap (waiting for decode's ROOM_OPEN)
//	sglang:num_prefill_prealloc_queue_reqs   the same: its name before SGLang renamed it
//	sglang:num_prefill_inflight_queue_reqs   stages parked + transferring (KV computed, held until KV_ACK)
//	sglang:num_decode_prealloc_queue_reqs    stage prealloc (waiting for pages)
//	sglang:num_decode_transfer_queue_reqs    stage awaiting_kv (pages allocated, KV arriving)
//	sglang:num_running_reqs                  stages prefilling + decoding (in the forward)
//	sglang:num_queue_reqs                    stages waiting + queued (+ preempted on a colocated
//	                                         worker, whose retracted requests SGLang puts back in
//	                                         its waiting queue)
//	sglang:token_usage                       KV pages used / pages in the pool (ratio 0–1)
//	sglang:gen_throughput                    output tokens per second over the last RateWindow
//	sglang:cache_hit_rate                    prefix cache hit tokens / queried tokens since the
//	                                         worker started (0 before any query)
//
// Counters and histograms, observed as requests end:
//
//	sglang:num_bootstrap_failed_reqs_total   requests whose first failure is a bootstrap failure
//	                                         (see [SGLangFailure])
//	sglang:num_transfer_failed_reqs_total    requests whose first failure is a KV transfer failure
//	sglang:num_aborted_requests_total        outcome aborted_client (the client, or the router on
//	                                         its behalf, aborted)
//	sglang:kv_transfer_latency_ms            prefill, ok: time in stage transferring, ms (SGLang:
//	                                         transfer-queue entry to completion, "only the last
//	                                         chunk"); buckets 1…5000 ms
//	sglang:kv_transfer_speed_gb_s            prefill, ok: the prompt's KV bytes / that time, in
//	                                         2³⁰ bytes per second (SGLang's MiB/1024 per second);
//	                                         buckets 0.1…400
//	sglang:time_to_first_token_seconds       as pdserve_time_to_first_token_seconds, SGLang's buckets
//	sglang:inter_token_latency_seconds       per token: an event of n tokens after a gap g counts n
//	                                         observations of g/n (as SGLang), SGLang's buckets
//	sglang:e2e_request_latency_seconds       as pdserve_e2e_request_latency_seconds, SGLang's buckets
//
// Every duration is clamped at zero before it is observed: no SGLang series
// can go negative (SGLang's kv_transfer_alloc_ms did).
type sglang struct {
	sched           prometheus.Labels // model_name, engine_type, tp_rank, pp_rank
	model           string
	colocated       bool
	ttft, itl, e2e  prometheus.Observer
	kvLatency       prometheus.Observer
	kvSpeed         prometheus.Observer
	bootstrapFailed prometheus.Counter
	transferFailed  prometheus.Counter
	aborted         prometheus.Counter
	collectors      []prometheus.Collector
	gaugeDescs      []*prometheus.Desc // in sglangGauges order
}

// SGLang's bucket bounds (collector.py defaults).
var (
	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035,
		0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000}
	sglangE2EBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100,
		200, 400, 600, 1200, 1800, 2400}
	sglangKVLatencyBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000}
	sglangKVSpeedBuckets   = []float64{0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400}
)

// engineType is SGLang's engine_type label of a worker role.
func engineType(role workerapi.Role) string {
	switch role {
	case workerapi.RolePrefill:
		return "prefill"
	case workerapi.RoleDecode:
		return "decode"
	}
	return "unified"
}

func newSGLang(role workerapi.Role, model string) *sglang {
	s := &sglang{model: model, colocated: role == workerapi.RoleColocated,
		sched: prometheus.Labels{"model_name": model, "engine_type": engineType(role), "tp_rank": "0", "pp_rank": "0"}}
	req := prometheus.Labels{"model_name": model}
	hist := func(name, help string, buckets []float64, labels prometheus.Labels) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		s.collectors = append(s.collectors, h)
		return h
	}
	counter := func(name, help string, labels prometheus.Labels) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		s.collectors = append(s.collectors, c)
		return c
	}
	s.ttft = hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", sglangTTFTBuckets, req)
	s.itl = hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", sglangITLBuckets, req)
	s.e2e = hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", sglangE2EBuckets, req)
	s.kvLatency = hist("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.", sglangKVLatencyBuckets, s.sched)
	s.kvSpeed = hist("sglang:kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.", sglangKVSpeedBuckets, s.sched)
	s.bootstrapFailed = counter("sglang:num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests.", s.sched)
	s.transferFailed = counter("sglang:num_transfer_failed_reqs_total", "The number of transfer failed requests.", s.sched)
	s.aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.", req)
	for _, g := range sglangGauges {
		s.gaugeDescs = append(s.gaugeDescs, prometheus.NewDesc(g.name, g.help, nil, s.sched))
	}
	return s
}

// Failure kinds of SGLang's PD failure counters.
const (
	FailureNone      = ""
	FailureBootstrap = "bootstrap"
	FailureTransfer  = "transfer"
)

// SGLangFailure says which of SGLang's PD failure counters a request that
// ended with o counts in, from its first failure c (this side's or, for an
// echo of the other leg's failure, the other side's): FailureBootstrap,
// FailureTransfer or FailureNone.
//
// SGLang counts a request in num_bootstrap_failed_reqs when it fails in its
// bootstrap or prealloc queue handshake (timeout, or the peer's failure
// reported there), and in num_transfer_failed_reqs when it fails in the
// prefill inflight or decode transfer queue. pdserve's equivalents:
//
//   - bootstrap: timeout_bootstrap (decode never opened the room),
//     peer_refused (the KV handshake was refused), failed_identity (the two
//     legs disagree on the room's request, found when the room is opened),
//     and peer_lost or lease_expired while in bootstrap or prealloc;
//   - transfer: timeout_transfer, failed_transfer (checksum, incomplete or
//     misbound KV), timeout_kv_hold (prefill held computed KV that decode
//     never took), and peer_lost or lease_expired while in parked,
//     transferring or awaiting_kv.
//
// Client aborts, rejections, queue and request timeouts, model failures and
// shutdowns are neither (SGLang counts none of them there either).
func SGLangFailure(o outcome.Outcome, c outcome.Cause) string {
	if o == outcome.OK || o == outcome.None {
		return FailureNone
	}
	root, stage := o, c.Stage
	if c.Outcome != outcome.None {
		root = c.Outcome
	}
	switch root {
	case outcome.TimeoutBootstrap, outcome.PeerRefused, outcome.FailedIdentity:
		return FailureBootstrap
	case outcome.TimeoutTransfer, outcome.FailedTransfer, outcome.TimeoutKVHold:
		return FailureTransfer
	case outcome.PeerLost, outcome.LeaseExpired:
		switch stage {
		case "bootstrap", "prealloc":
			return FailureBootstrap
		case "parked", "transferring", "awaiting_kv":
			return FailureTransfer
		}
	}
	return FailureNone
}

func (s *sglang) finished(o outcome.Outcome, c outcome.Cause, age time.Duration) {
	switch SGLangFailure(o, c) {
	case FailureBootstrap:
		s.bootstrapFailed.Inc()
	case FailureTransfer:
		s.transferFailed.Inc()
	}
	switch o {
	case outcome.OK:
		s.e2e.Observe(seconds(age))
	case outcome.AbortedClient:
		s.aborted.Inc()
	}
}

// kvTransfer observes one finished prefill transfer of bytes in d; SGLang
// skips a transfer whose latency is not positive, and so does this.
func (s *sglang) kvTransfer(d time.Duration, bytes int) {
	if d <= 0 {
		return
	}
	s.kvLatency.Observe(float64(d) / float64(time.Millisecond))
	if bytes > 0 {
		s.kvSpeed.Observe(float64(bytes) / (1 << 30) / d.Seconds())
	}
}

// interToken observes a gap of d before an event of n tokens as n gaps of
// d/n, as SGLang's observe_inter_token_latency does.
func (s *sglang) interToken(d time.Duration, n int) {
	if n < 1 {
		n = 1
	}
	v := seconds(d) / float64(n)
	for range n {
		s.itl.Observe(v)
	}
}

// sglangGauges names the SGLang scrape-time gauges, with SGLang's help texts.
var sglangGauges = []struct{ name, help string }{
	{"sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue."},
	{"sglang:num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue."},
	{"sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."},
	{"sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."},
	{"sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."},
	{"sglang:num_running_reqs", "The number of running requests."},
	{"sglang:num_queue_reqs", "The number of requests in the waiting queue."},
	{"sglang:token_usage", "The token usage."},
	{"sglang:gen_throughput", "The generation throughput (token/s)."},
	{"sglang:cache_hit_rate", "The prefix cache hit rate."},
}

// gauges returns the values of the scrape-time gauges, in sglangGauges
// order, from a worker's state.
func (s *sglang) gauges(st WorkerState) []float64 {
	n := make(map[string]int, len(st.Stages))
	for _, x := range st.Stages {
		n[x.Stage] = x.Requests
	}
	queue := n["waiting"] + n["queued"]
	if s.colocated {
		queue += n["preempted"]
	}
	usage := 0.0
	if st.PagesTotal > 0 {
		usage = float64(st.PagesUsed) / float64(st.PagesTotal)
	}
	hitRate := 0.0
	if st.PrefixQueriedTokens > 0 {
		hitRate = float64(st.PrefixHitTokens) / float64(st.PrefixQueriedTokens)
	}
	return []float64{
		float64(n["bootstrap"]),
		float64(n["bootstrap"]),
		float64(n["parked"] + n["transferring"]),
		float64(n["prealloc"]),
		float64(n["awaiting_kv"]),
		float64(n["prefilling"] + n["decoding"]),
		float64(queue),
		usage,
		max(0, st.GenThroughput),
		hitRate,
	}
}

// seconds is d in seconds, clamped at zero: a clock that stepped back never
// makes a latency negative.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

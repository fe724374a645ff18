package e2e

import (
	"bytes"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// logBuffer collects a cluster's log lines; safe for its goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines that contain every one of subs.
func (l *logBuffer) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// sample returns the value of metric (a histogram's count) on a worker, in
// the sample whose labels include want; ok is false if there is none.
func sample(t *testing.T, w *cluster.WorkerServer, metric string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := w.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			ls := labels(m)
			for k, v := range want {
				if ls[k] != v {
					continue next
				}
			}
			switch {
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			default:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestSGLangCompatOfAPair: with --metrics-compat sglang, one request served
// by a real prefill/decode pair shows in SGLang's series as SGLang would
// count it (one KV transfer on prefill with a positive speed, one TTFT, a
// per-token ITL for each later token and one E2E on decode, the queue
// gauges back at zero), and both workers' batch lines read as SGLang's
// scheduler log: a search for the prefill line's #new-token and
// #inflight-req and the decode line's #running-req finds them.
func TestSGLangCompatOfAPair(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	mc := testMachine()
	mc.MaxPrefillTokens = 64 // a 200-token prompt in four forwards
	c := startPD(t, pdOptions{machine: &mc, metricsCompat: "sglang",
		logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	const maxTokens = 8
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("p", 200),
		"max_tokens": maxTokens, "ignore_eos": true})
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	assertQuiescent(t, c.Workers()...)
	pre, dec := c.Prefill[0], c.Decode[0]
	model := pre.Worker.ModelInfo().Name
	sched := func(engine string) map[string]string {
		return map[string]string{"model_name": model, "engine_type": engine, "tp_rank": "0", "pp_rank": "0"}
	}
	req := map[string]string{"model_name": model}
	for _, tc := range []struct {
		w      *cluster.WorkerServer
		metric string
		labels map[string]string
		want   float64
	}{
		{pre, "sglang:kv_transfer_latency_ms", sched("prefill"), 1},
		{pre, "sglang:kv_transfer_speed_gb_s", sched("prefill"), 1},
		{pre, "sglang:e2e_request_latency_seconds", req, 1},
		{pre, "sglang:time_to_first_token_seconds", req, 1},
		// pdserve's own: prefill's first token is the end of its prefill.
		{pre, "pdserve_time_to_first_token_seconds", map[string]string{"role": "prefill"}, 1},
		{pre, "pdserve_e2e_request_latency_seconds", map[string]string{"role": "prefill"}, 1},
		{dec, "pdserve_time_to_first_token_seconds", map[string]string{"role": "decode"}, 1},
		{dec, "pdserve_e2e_request_latency_seconds", map[string]string{"role": "decode"}, 1},
		{pre, "sglang:num_prefill_bootstrap_queue_reqs", sched("prefill"), 0},
		{pre, "sglang:num_prefill_prealloc_queue_reqs", sched("prefill"), 0},
		{pre, "sglang:num_prefill_inflight_queue_reqs", sched("prefill"), 0},
		{pre, "sglang:num_bootstrap_failed_reqs_total", sched("prefill"), 0},
		{pre, "sglang:num_transfer_failed_reqs_total", sched("prefill"), 0},
		{dec, "sglang:time_to_first_token_seconds", req, 1},
		{dec, "sglang:inter_token_latency_seconds", req, maxTokens - 1},
		{dec, "sglang:e2e_request_latency_seconds", req, 1},
		{dec, "sglang:kv_transfer_latency_ms", sched("decode"), 0},
		{dec, "sglang:num_decode_prealloc_queue_reqs", sched("decode"), 0},
		{dec, "sglang:num_decode_transfer_queue_reqs", sched("decode"), 0},
		{dec, "sglang:num_running_reqs", sched("decode"), 0},
		{dec, "sglang:num_queue_reqs", sched("decode"), 0},
		{dec, "sglang:token_usage", sched("decode"), 0},
		{dec, "sglang:num_aborted_requests_total", req, 0},
	} {
		got, ok := sample(t, tc.w, tc.metric, tc.labels)
		if !ok || got != tc.want {
			t.Errorf("%s %s%v = %v (present %v), want %v", tc.w.Worker.Role(), tc.metric, tc.labels, got, ok, tc.want)
		}
	}
	if _, ok := sample(t, pre, "pdserve_inter_token_latency_seconds", nil); ok {
		t.Error("a prefill worker exposes an inter-token latency histogram: it makes one token")
	}
	if g, _ := sample(t, dec, "sglang:gen_throughput", sched("decode")); g <= 0 {
		t.Errorf("decode gen_throughput %v just after generating %d tokens", g, maxTokens)
	}

	prefillLines := logs.lines("worker=prefill-0", "Prefill batch")
	if len(prefillLines) != 4 {
		t.Fatalf("want 4 prefill batch lines (200 tokens, 64 a forward), got %d:\n%s", len(prefillLines), strings.Join(prefillLines, "\n"))
	}
	first := regexp.MustCompile(`Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: \d\.\d\d, ` +
		`#running-req: 1, #queue-req: 0, #prealloc-req: 0, #bootstrap-req: 0, #inflight-req: 0, input throughput \(token/s\): \d+\.\d\d`)
	if !first.MatchString(prefillLines[0]) {
		t.Errorf("first prefill line does not read as SGLang's:\n%s", prefillLines[0])
	}
	last := regexp.MustCompile(`#new-token: 8, `) // 200 = 3×64 + 8
	if !last.MatchString(prefillLines[3]) {
		t.Errorf("last prefill line:\n%s", prefillLines[3])
	}
	decodeLines := logs.lines("worker=decode-0", "Decode batch")
	if len(decodeLines) == 0 {
		t.Fatal("no decode batch line")
	}
	dl := regexp.MustCompile(`Decode batch, #running-req: 1, #token: \d+, token usage: \d\.\d\d, #prealloc-req: 0, ` +
		`#transfer-req: 0, #retracted-req: 0, gen throughput \(token/s\): \d+\.\d\d, #queue-req: 0`)
	for _, l := range decodeLines {
		if !dl.MatchString(l) {
			t.Errorf("decode line does not read as SGLang's:\n%s", l)
		}
	}
}

// TestSGLangBootstrapFailureCounted: a prefill leg whose decode never
// opens the room times out in bootstrap, and counts as one of SGLang's
// bootstrap failures on the prefill worker (and not as a transfer
// failure).
func TestSGLangBootstrapFailureCounted(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	mc.BootstrapTimeout = 200 * time.Millisecond
	c := startPD(t, pdOptions{machine: &mc, metricsCompat: "sglang"})
	leg := workerapi.GenerateBody{RID: "lonely", Room: "0123456789abcdef0123456789abcdef", Gen: 1,
		InputIDs: []int32{1, 2, 3, 4}, MaxTokens: 4}
	status, body := postWith(t, c.WorkerClient(), c.Prefill[0].URL+workerapi.PathPrefill, leg)
	if status != http.StatusGatewayTimeout || !strings.Contains(string(body), "timeout_bootstrap") {
		t.Fatalf("want a 504 timeout_bootstrap, got %d %s", status, body)
	}
	pre := c.Prefill[0]
	sched := map[string]string{"engine_type": "prefill"}
	if n, _ := sample(t, pre, "sglang:num_bootstrap_failed_reqs_total", sched); n != 1 {
		t.Errorf("bootstrap failures %v, want 1", n)
	}
	if n, _ := sample(t, pre, "sglang:num_transfer_failed_reqs_total", sched); n != 0 {
		t.Errorf("transfer failures %v, want 0", n)
	}
	if n, _ := sample(t, pre, "pdserve_requests_finished_total", map[string]string{"outcome": "timeout_bootstrap"}); n != 1 {
		t.Errorf("pdserve timeout_bootstrap %v, want 1", n)
	}
}

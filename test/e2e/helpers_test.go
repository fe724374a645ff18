// Package e2e runs whole pdserve deployments — router, prefill and decode
// workers, and colocated workers — in-process and as OS processes, and drives
// them over HTTP like a client would.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/router"
	"github.com/pdserve/pdserve/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pdserve.RemovingAfter(m))
}

// testGeometry is a small KV shape so tests move little data: 2 layers × 2
// KV heads × 16 dims × bf16 = 256 bytes per token.
var testGeometry = kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvcache.BF16}

const testContext = 2048

func simFactory(cfg sim.Config) cluster.ModelFactory {
	if cfg.Geometry == (kvcache.Geometry{}) {
		cfg.Geometry = testGeometry
	}
	if cfg.ContextLen == 0 {
		cfg.ContextLen = testContext
	}
	return func() (model.Model, error) { return sim.New(cfg) }
}

// testMachine is the lifecycle config of test workers: design defaults with
// a fast heartbeat (250 ms: peer loss shows within 750 ms, a lease lasts
// 1 s), still slow enough for a loaded machine running -race, and the
// prefix cache on, as `pdserve` runs by default.
func testMachine() lifecycle.Config {
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.PrefixCache = true
	mc.HeartbeatInterval = 250 * time.Millisecond
	mc.MaxPrefillTokens = 512
	return mc
}

type pdOptions struct {
	sim     sim.Config
	machine *lifecycle.Config
	memory  int64
	// wrap wraps a worker's KV transport (fault injection).
	wrap func(role lifecycle.Role, i int, b kvxfer.Backend) kvxfer.Backend
	// selfShutdown: the test shuts the cluster down itself; cleanup does
	// not check quiescence.
	selfShutdown bool
	// metricsCompat is the workers' --metrics-compat; logger their logger.
	metricsCompat string
	logger        *slog.Logger
	// router tunes the router (zero: its defaults).
	router cluster.RouterTuning
	// api are the router's OpenAI API options (--max-logprobs,
	// --logprobs-mode; zero: the defaults).
	api openai.APIOptions
}

// noAdmission is a router that sheds no load: for tests that fill a
// worker's KV pool or queue on purpose (preemption, requests waiting for
// pages), which the router's admission would otherwise prevent.
func noAdmission() cluster.RouterTuning {
	return cluster.RouterTuning{Admission: &router.Admission{}}
}

// startPD starts router + 1 prefill + 1 decode in-process; at cleanup it
// checks every worker returned to zero pages and zero stage gauges, then
// shuts everything down.
func startPD(t *testing.T, o pdOptions) *cluster.Cluster {
	t.Helper()
	mc := testMachine()
	if o.machine != nil {
		mc = *o.machine
	}
	if o.memory == 0 {
		o.memory = 64 << 20
	}
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: simFactory(o.sim), Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: o.memory, MetricsCompat: o.metricsCompat},
		WrapBackend: o.wrap, HealthInterval: 100 * time.Millisecond, Router: cluster.RouterOptions{RouterTuning: o.router, API: o.api}, Logger: o.logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !o.selfShutdown {
			assertQuiescent(t, c.Workers()...)
			// Every stream the router handed out was closed.
			waitFor(t, 5*time.Second, "router serving no request", func() (bool, string) {
				live := c.Router.Router.Requests()
				return len(live) == 0, fmt.Sprintf("%+v", live)
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return c
}

// startServe starts one colocated worker (`pdserve serve`).
func startServe(t *testing.T, cfg sim.Config) *cluster.WorkerServer {
	t.Helper()
	return startServeWith(t, cfg, nil)
}

// startServeWith is startServe with the worker's options modified by mod
// (nil: the test defaults).
func startServeWith(t *testing.T, cfg sim.Config, mod func(*cluster.WorkerOptions)) *cluster.WorkerServer {
	t.Helper()
	m, err := simFactory(cfg)()
	if err != nil {
		t.Fatal(err)
	}
	mc := testMachine()
	mc.Role = lifecycle.RoleColocated
	wo := cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: 64 << 20}
	if mod != nil {
		mod(&wo)
	}
	s, err := cluster.StartWorker(wo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

// waitFor checks cond every 10 ms until it holds, and fails the test if
// timeout passes first.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if state, ok := testbin.WaitUntil(timeout, cond); !ok {
		t.Fatalf("%s: not reached after %s: %s", what, timeout, state)
	}
}

// assertQuiescent waits until every worker holds no pages and no live
// request and its scraped stage gauges all read 0 (a request may still
// arrive and end after the client's answer, e.g. a retry's leg that the
// router aborts; baseline is when all of that has settled).
func assertQuiescent(t *testing.T, workers ...*cluster.WorkerServer) {
	t.Helper()
	for _, w := range workers {
		waitFor(t, 10*time.Second, w.Worker.Role().String()+" worker back to baseline", func() (bool, string) {
			st, ok := w.Worker.Stats(time.Second)
			if !ok {
				return false, "loop did not answer"
			}
			if st.PagesUsed != 0 || st.Live != 0 {
				return false, fmt.Sprintf("pages used %d, live %d, stages %v", st.PagesUsed, st.Live, st.Stages)
			}
			mfs, err := w.Registry.Gather()
			if err != nil {
				return false, err.Error()
			}
			found := false
			for _, mf := range mfs {
				if mf.GetName() != "pdserve_requests" {
					continue
				}
				for _, m := range mf.GetMetric() {
					found = true
					if v := m.GetGauge().GetValue(); v != 0 {
						return false, fmt.Sprintf("pdserve_requests%v = %v", labels(m), v)
					}
				}
			}
			return found, "no pdserve_requests gauges scraped"
		})
	}
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// postJSON posts body (a value or a raw string) and returns status and body.
func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	return postWith(t, http.DefaultClient, url, body)
}

// postWith is postJSON through client (a worker's API takes signed
// requests: cluster.Cluster.WorkerClient).
func postWith(t *testing.T, client *http.Client, url string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	resp, err := client.Post(url, "application/json", r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// completion is the part of a /v1/completions answer the tests read.
type completion struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason string  `json:"finish_reason"`
		TokenIDs     []int32 `json:"token_ids"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeCompletion(t *testing.T, body []byte) completion {
	t.Helper()
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	return c
}

// startPair starts one prefill and one decode worker with their own options
// (each modified from the test defaults by its function) and a router in
// front; cleanup checks quiescence and shuts all down.
func startPair(t *testing.T, modP, modD func(*cluster.WorkerOptions)) *cluster.Cluster {
	t.Helper()
	c := &cluster.Cluster{}
	start := func(role lifecycle.Role, mod func(*cluster.WorkerOptions)) *cluster.WorkerServer {
		m, err := simFactory(sim.Config{})()
		if err != nil {
			t.Fatal(err)
		}
		mc := testMachine()
		mc.Role = role
		wo := cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: 64 << 20}
		if role == lifecycle.RolePrefill {
			wo.KVListen = "127.0.0.1:0"
		}
		if mod != nil {
			mod(&wo)
		}
		s, err := cluster.StartWorker(wo)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c.Prefill = []*cluster.WorkerServer{start(lifecycle.RolePrefill, modP)}
	c.Decode = []*cluster.WorkerServer{start(lifecycle.RoleDecode, modD)}
	m, _ := simFactory(sim.Config{})()
	r, err := cluster.StartRouter(cluster.RouterOptions{Addr: "127.0.0.1:0", Prefill: []string{c.Prefill[0].URL},
		Decode: []string{c.Decode[0].URL}, Info: m.Info(), Tokenizer: m.Tokenizer(), HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Router = r
	t.Cleanup(func() {
		assertQuiescent(t, c.Workers()...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	if err := cluster.WaitReady(context.Background(), r.Router, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// counterValue reads a counter (or gauge) from a server's registry: the
// sample whose label name has value (name "": the sum of its samples).
func counterValue(t *testing.T, s gatherer, metric, name, value string) float64 {
	t.Helper()
	mfs, err := s.gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		// Without a label to match: the sum of every series.
		sum := 0.0
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			if name == "" {
				sum += v
			} else if labels(m)[name] == value {
				return v
			}
		}
		return sum
	}
	return 0
}

type gatherer interface {
	gather() ([]*dto.MetricFamily, error)
}

type workerGatherer struct{ *cluster.WorkerServer }

func (w workerGatherer) gather() ([]*dto.MetricFamily, error) { return w.Registry.Gather() }

type routerGatherer struct{ *cluster.RouterServer }

func (r routerGatherer) gather() ([]*dto.MetricFamily, error) { return r.Registry.Gather() }

func routerAsWorker(c *cluster.Cluster) gatherer { return routerGatherer{c.Router} }

// debugCounters renders every worker's finished-request counts and the
// router's results, for failure messages.
func debugCounters(t *testing.T, c *cluster.Cluster) string {
	var b strings.Builder
	for _, w := range c.Workers() {
		for _, o := range outcome.Worker() {
			if n := counterValue(t, workerGatherer{w}, "pdserve_requests_finished_total", "outcome", o.String()); n > 0 {
				fmt.Fprintf(&b, " %s:%s=%v", w.Worker.Role(), o, n)
			}
		}
	}
	mfs, _ := c.Router.Registry.Gather()
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "pdserve_router") {
			for _, m := range mf.GetMetric() {
				fmt.Fprintf(&b, " %s%v=%v", mf.GetName(), labels(m), m.GetCounter().GetValue())
			}
		}
	}
	return b.String()
}

// longStream starts a streamed 1,500-token completion at url under ctx
// and returns once its first five events arrived, the stream still open.
func longStream(t *testing.T, ctx context.Context, url string) *http.Response {
	t.Helper()
	body := `{"prompt":"a long story","max_tokens":1500,"ignore_eos":true,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() && events < 5 {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if events < 5 {
		t.Fatalf("stream ended early: %v", sc.Err())
	}
	return resp
}

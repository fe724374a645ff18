package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/tracing"
)

// TestOneTraceAcrossPD: with tracing on, a PD request is one trace: the
// client's traceparent is the router's request span's parent, the attempt
// is its child, and each worker's leg span is the attempt's child with a
// child per stage (on decode, the KV hop as "kv transfer", linked to the
// prefill leg).
func TestOneTraceAcrossPD(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	var mu sync.Mutex
	var providers []*sdktrace.TracerProvider
	tracerFor := func(service string) trace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(tracing.IDs{}))
		mu.Lock()
		providers = append(providers, tp)
		mu.Unlock()
		return tp
	}
	mc := testMachine()
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: simFactory(sim.Config{}), Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20},
		HealthInterval: 100 * time.Millisecond, TracerFor: tracerFor})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	const traceID, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	postTraced(t, c.URL(), `{"prompt":"hello","max_tokens":5}`, traceID, parent, 200)
	byName := map[string]tracetest.SpanStub{}
	waitFor(t, 5*time.Second, "the router's and both legs' spans", func() (bool, string) {
		var names []string
		for _, s := range exp.GetSpans() {
			byName[s.Name] = s
			names = append(names, s.Name)
		}
		_, r := byName["router.request"]
		_, p := byName["prefill.leg"]
		_, d := byName["decode.leg"]
		return r && p && d, strings.Join(names, ", ")
	})
	for name, s := range byName {
		if s.SpanContext.TraceID().String() != traceID {
			t.Errorf("%s is in trace %s, want the client's %s", name, s.SpanContext.TraceID(), traceID)
		}
	}
	parentOf := func(child, want string) {
		t.Helper()
		if got, w := byName[child].Parent.SpanID(), byName[want].SpanContext.SpanID(); got != w {
			t.Errorf("%s's parent is %s, want %s's %s", child, got, want, w)
		}
	}
	if got := byName["router.request"].Parent.SpanID().String(); got != parent {
		t.Errorf("router.request's parent %s, want the client's %s", got, parent)
	}
	parentOf("router.attempt", "router.request")
	parentOf("prefill.leg", "router.attempt")
	parentOf("decode.leg", "router.attempt")
	parentOf("kv transfer", "decode.leg")
	parentOf("prefill prefilling", "prefill.leg")
	parentOf("decode decoding", "decode.leg")
	// The KV hop is linked to the prefill leg that sent the KV.
	if links := byName["kv transfer"].Links; len(links) != 1 || links[0].SpanContext.SpanID() != byName["prefill.leg"].SpanContext.SpanID() {
		t.Errorf("kv transfer links %+v, want the prefill leg %s", links, byName["prefill.leg"].SpanContext.SpanID())
	}
	attrs := map[string]string{}
	for _, a := range byName["router.request"].Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["pdserve.outcome"] != "ok" || attrs["gen_ai.usage.output_tokens"] != "5" || attrs["gen_ai.request.model"] == "" {
		t.Errorf("router.request attributes %v", attrs)
	}
	// A request of 3 choices: the decode leg names each choice's finish
	// reason, as the answer does. (They are the worker's: a stop string is
	// matched by the router's front end, which the worker does not see.)
	const nTrace = "5bf92f3577b34da6a3ce929d0e0e4736"
	answer := postTracedBody(t, c.URL(), `{"prompt":"hello","max_tokens":6,"n":3,"temperature":1,"seed":7}`, nTrace, parent)
	var want []string
	for _, ch := range answer.Choices {
		want = append(want, ch.FinishReason)
	}
	if len(want) != 3 {
		t.Fatalf("%d choices, want 3", len(want))
	}
	t.Logf("the answer's finish reasons: %v", want)
	waitFor(t, 5*time.Second, "the n=3 request's decode leg", func() (bool, string) {
		for _, s := range exp.GetSpans() {
			if s.Name != "decode.leg" || s.SpanContext.TraceID().String() != nTrace {
				continue
			}
			for _, a := range s.Attributes {
				if a.Key == "gen_ai.response.finish_reasons" {
					got := a.Value.AsStringSlice()
					return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("finish_reasons %v, the answer's %v", got, want)
				}
			}
			return false, "no gen_ai.response.finish_reasons"
		}
		return false, "no decode.leg in the trace"
	})
	// A request the front end refuses before the router takes it is a
	// span too, in the client's trace, naming the router's front end.
	const badTrace = "7bf92f3577b34da6a3ce929d0e0e4736"
	postTraced(t, c.URL(), `{"prompt":"hello","max_tokens":100000000}`, badTrace, parent, 400)
	waitFor(t, 5*time.Second, "the refused request's span", func() (bool, string) {
		for _, s := range exp.GetSpans() {
			if s.Name != "router.request" || s.SpanContext.TraceID().String() != badTrace {
				continue
			}
			at := map[string]string{}
			for _, a := range s.Attributes {
				at[string(a.Key)] = a.Value.Emit()
			}
			return at["pdserve.outcome"] == "rejected_invalid" && at["pdserve.cause.stage"] == "front end", fmt.Sprint(at)
		}
		return false, "no span in the trace"
	})
	mu.Lock()
	defer mu.Unlock()
	for _, tp := range providers {
		_ = tp.Shutdown(context.Background())
	}
}

// TestServeTraced: a request to a traced `serve` worker's own OpenAI API is
// a serve.request span, a child of the client's traceparent, with a child
// per stage.
func TestServeTraced(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(tracing.IDs{}))
	defer tp.Shutdown(context.Background())
	s := startServeWith(t, sim.Config{}, func(o *cluster.WorkerOptions) { o.Tracer = tp })
	const traceID, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	postTraced(t, s.URL, `{"prompt":"hello","max_tokens":4}`, traceID, parent, 200)
	byName := map[string]tracetest.SpanStub{}
	waitFor(t, 5*time.Second, "serve.request and its stages", func() (bool, string) {
		var names []string
		for _, sp := range exp.GetSpans() {
			byName[sp.Name] = sp
			names = append(names, sp.Name)
		}
		_, ok := byName["serve.request"]
		_, dec := byName["colocated decoding"]
		return ok && dec, strings.Join(names, ", ")
	})
	root := byName["serve.request"]
	if root.SpanContext.TraceID().String() != traceID || root.Parent.SpanID().String() != parent {
		t.Errorf("serve.request in trace %s under %s, want %s under %s", root.SpanContext.TraceID(), root.Parent.SpanID(), traceID, parent)
	}
	for _, st := range []string{"colocated prefilling", "colocated decoding"} {
		if byName[st].Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s is not a child of serve.request", st)
		}
	}
}

// postTraced posts a completion request body to base with the client's
// traceparent (traceID, parent span) and checks its status.
// postTracedBody is postTraced with status 200, returning the completion's
// choices.
func postTracedBody(t *testing.T, base, body, traceID, parent string) (answer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}) {
	t.Helper()
	resp := sendTraced(t, base, body, traceID, parent, http.StatusOK)
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	return answer
}

// postTraced sends a completion request with a client's traceparent
// (traceID, parent) and checks its answer's status.
func postTraced(t *testing.T, base, body, traceID, parent string, status int) {
	t.Helper()
	sendTraced(t, base, body, traceID, parent, status).Body.Close()
}

// sendTraced is postTraced's request; the caller closes the answer.
func sendTraced(t *testing.T, base, body, traceID, parent string, status int) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parent+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		resp.Body.Close()
		t.Fatalf("status %d, want %d", resp.StatusCode, status)
	}
	return resp
}

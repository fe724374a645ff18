// Package jaeger checks pdserve's traces in a real Jaeger v2: router,
// prefill and decode as three processes, one request, one trace.
package jaeger

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
)

var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

func TestMain(m *testing.M) {
	code := m.Run()
	pdserve.Remove()
	os.Exit(code)
}

// jaegerBinary is the Jaeger built from tools/jaeger (PDSERVE_JAEGER); the
// test is skipped without it unless PDSERVE_REQUIRE_JAEGER is set (CI).
func jaegerBinary(t *testing.T) string {
	bin := os.Getenv("PDSERVE_JAEGER")
	if bin == "" {
		if os.Getenv("PDSERVE_REQUIRE_JAEGER") != "" {
			t.Fatal("PDSERVE_REQUIRE_JAEGER is set but PDSERVE_JAEGER names no jaeger binary (build it: cd tools/jaeger && go build -o /tmp/jaeger github.com/jaegertracing/jaeger/cmd/jaeger)")
		}
		t.Skip("PDSERVE_JAEGER is not set (build Jaeger: cd tools/jaeger && go build -o /tmp/jaeger github.com/jaegertracing/jaeger/cmd/jaeger)")
	}
	return bin
}

// jaegerTrace is the part of Jaeger's /api/traces answer the test reads.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID     string `json:"spanID"`
		Operation  string `json:"operationName"`
		ProcessID  string `json:"processID"`
		References []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// TestOneTraceInJaeger: a PD request through a router, a prefill and a
// decode process, each exporting over OTLP gRPC to a real Jaeger, is one
// trace there: the client's traceparent its parent, the router's request
// and attempt, both legs under the attempt, each leg's stages under it,
// and decode's KV hop linked (FOLLOWS_FROM) to the prefill leg.
func TestOneTraceInJaeger(t *testing.T) {
	jbin := jaegerBinary(t)
	bin := pdserve.Path(t)
	ports := map[string]int{}
	var env []string
	for _, k := range []string{"JQ_HTTP", "JQ_GRPC", "JQ_HEALTH", "JQ_OTLP_GRPC", "JQ_OTLP_HTTP"} {
		ports[k] = testbin.FreePort(t)
		env = append(env, fmt.Sprintf("%s=%d", k, ports[k]))
	}
	j, err := testbin.Start(t, jbin, "jaeger", env, "--config=file:jaeger.yaml")
	if err != nil {
		t.Fatal(err)
	}
	health := fmt.Sprintf("http://127.0.0.1:%d/status", ports["JQ_HEALTH"])
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		resp, err := http.Get(health)
		if err != nil {
			return false, err.Error() + "; " + j.Stderr()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	}); !ok {
		t.Fatalf("jaeger not ready: %s", state)
	}

	otlp := fmt.Sprintf("grpc://127.0.0.1:%d", ports["JQ_OTLP_GRPC"])
	tenv := []string{"OTEL_BSP_SCHEDULE_DELAY=100"} // export within 100 ms of a span's end
	sim := []string{"--sim-layers", "2", "--sim-kv-heads", "2", "--sim-head-dim", "16", "--sim-decode-ms-per-step", "5"}
	start := func(name string, args ...string) {
		t.Helper()
		p, err := testbin.Start(t, bin, name, tenv, append(append(args, sim...), "--otlp-traces-endpoint", otlp)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitLine(regexp.MustCompile(`^ready`), 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pPort, kvPort, dPort, rPort := testbin.FreePort(t), testbin.FreePort(t), testbin.FreePort(t), testbin.FreePort(t)
	start("prefill", "prefill", "--host", "127.0.0.1", "--port", strconv.Itoa(pPort), "--kv-port", strconv.Itoa(kvPort), "--kv-cache-memory", "64MiB")
	start("decode", "decode", "--host", "127.0.0.1", "--port", strconv.Itoa(dPort), "--kv-cache-memory", "64MiB")
	start("router", "router", "--host", "127.0.0.1", "--port", strconv.Itoa(rPort),
		"--prefill", fmt.Sprintf("http://127.0.0.1:%d", pPort), "--decode", fmt.Sprintf("http://127.0.0.1:%d", dPort))

	const traceID, parent, rid = "5af7183fb1d4cf5f4bf92f3577b34da6", "a3ce929d0e0e4736", "jaeger-e2e-1"
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/completions", rPort),
		strings.NewReader(`{"prompt":"one trace","max_tokens":8,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parent+"-01")
	req.Header.Set("X-Request-Id", rid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	query := fmt.Sprintf("http://127.0.0.1:%d/api/traces/%s", ports["JQ_HTTP"], url.PathEscape(traceID))
	var tr jaegerTrace
	want := []string{"router.request", "router.attempt", "prefill.leg", "decode.leg", "kv transfer", "prefill prefilling", "decode decoding"}
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		resp, err := http.Get(query)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var body struct {
			Data []jaegerTrace `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Data) != 1 {
			return false, fmt.Sprintf("%s: %v, %d traces", resp.Status, err, len(body.Data))
		}
		tr = body.Data[0]
		have := map[string]bool{}
		for _, s := range tr.Spans {
			have[s.Operation] = true
		}
		for _, w := range want {
			if !have[w] {
				return false, fmt.Sprintf("no span %q yet (have %v)", w, have)
			}
		}
		return true, ""
	}); !ok {
		t.Fatalf("the trace in Jaeger: %s", state)
	}
	byOp := map[string]int{}
	for i, s := range tr.Spans {
		byOp[s.Operation] = i
	}
	span := func(op string) int { return byOp[op] }
	ref := func(op, refType string) string {
		for _, r := range tr.Spans[span(op)].References {
			if r.RefType == refType {
				return r.SpanID
			}
		}
		return ""
	}
	service := func(op string) string { return tr.Processes[tr.Spans[span(op)].ProcessID].ServiceName }
	for op, svc := range map[string]string{"router.request": "pdserve-router", "router.attempt": "pdserve-router",
		"prefill.leg": "pdserve-prefill", "decode.leg": "pdserve-decode", "kv transfer": "pdserve-decode"} {
		if got := service(op); got != svc {
			t.Errorf("%s from service %q, want %q", op, got, svc)
		}
	}
	for child, par := range map[string]string{"router.attempt": "router.request", "prefill.leg": "router.attempt",
		"decode.leg": "router.attempt", "kv transfer": "decode.leg", "prefill prefilling": "prefill.leg", "decode decoding": "decode.leg"} {
		if got, w := ref(child, "CHILD_OF"), tr.Spans[span(par)].SpanID; got != w {
			t.Errorf("%s is a child of %s, want %s (%s)", child, got, par, w)
		}
	}
	if got := ref("router.request", "CHILD_OF"); got != parent {
		t.Errorf("router.request's parent %s, want the client's %s", got, parent)
	}
	if got, w := ref("kv transfer", "FOLLOWS_FROM"), tr.Spans[span("prefill.leg")].SpanID; got != w {
		t.Errorf("kv transfer links to %s, want the prefill leg %s", got, w)
	}
	ridOK := false
	for _, tag := range tr.Spans[span("decode.leg")].Tags {
		if tag.Key == "pdserve.rid" && tag.Value == rid {
			ridOK = true
		}
	}
	if !ridOK {
		t.Errorf("decode.leg does not carry pdserve.rid %q", rid)
	}
}

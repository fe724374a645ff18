package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestNew: no endpoint is off (the no-op provider); the flag, else the
// standard variables, turn it on; an endpoint that is no URL is an error.
func TestNew(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	ctx := context.Background()
	p, err := New(ctx, Config{Service: "s", Getenv: env(nil)})
	if err != nil || p.On {
		t.Fatalf("no endpoint: on %v, %v", p.On, err)
	}
	if _, span := p.Tracer("t").Start(ctx, "x"); span.SpanContext().IsValid() {
		t.Fatal("the off provider records spans")
	}
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"flag, grpc", Config{Endpoint: "grpc://127.0.0.1:1"}},
		{"flag, http", Config{Endpoint: "http://127.0.0.1:1"}},
		{"flag, host:port", Config{Endpoint: "127.0.0.1:1"}},
		{"traces variable", Config{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "127.0.0.1:1"})}},
		{"general variable, http", Config{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:1",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})}},
	} {
		c.cfg.Service = "s"
		if c.cfg.Getenv == nil {
			c.cfg.Getenv = env(nil)
		}
		p, err := New(ctx, c.cfg)
		if err != nil || !p.On {
			t.Errorf("%s: on %v, %v", c.name, p.On, err)
			continue
		}
		if _, span := p.Tracer("t").Start(ctx, "x"); !span.SpanContext().IsValid() {
			t.Errorf("%s: no span recorded", c.name)
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = p.Shutdown(sctx) // nothing listens: the export may fail, the shutdown must end
		cancel()
	}
	for _, bad := range []Config{{Endpoint: "http://"}, {Endpoint: "127.0.0.1:1", Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"})},
		{Endpoint: "ftp://x:1"}, {Endpoint: "127.0.0.1"}, {Endpoint: ":::"}, {Endpoint: "http://127.0.0.1:99999"},
		{Endpoint: "127.0.0.1:1", Getenv: env(map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "NaN"})},
		{Endpoint: "127.0.0.1:1", Getenv: env(map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "0"})},
		{Endpoint: "127.0.0.1:1", Getenv: env(map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"})}} {
		if bad.Getenv == nil {
			bad.Getenv = env(nil)
		}
		if _, err := New(ctx, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestEndpointPath: over OTLP/HTTP the flag and the traces variable name
// the whole URL (a bare host:port, /v1/traces), the general variable a
// base URL whose path /v1/traces is appended to (the OpenTelemetry
// specification's rule, for collectors behind a path prefix).
func TestEndpointPath(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	for _, c := range []struct {
		name string
		cfg  Config
		env  map[string]string
		want string
	}{
		{"flag, no path", Config{Endpoint: srv.URL}, nil, "/v1/traces"},
		{"flag with a path", Config{Endpoint: srv.URL + "/x/v1/traces"}, nil, "/x/v1/traces"},
		{"traces variable with a path", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/custom/traces"}, "/custom/traces"},
		{"general variable, a base URL", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/otlp/"}, "/otlp/v1/traces"},
		{"general variable, no path", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}, "/v1/traces"},
	} {
		c.cfg.Service = "s"
		c.cfg.Getenv = func(k string) string { return c.env[k] }
		if err := Check(c.cfg); err != nil {
			t.Fatalf("%s: Check: %v", c.name, err)
		}
		p, err := New(context.Background(), c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_, s := p.Tracer("t").Start(context.Background(), "x")
		s.End()
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		mu.Lock()
		got := paths[len(paths)-1]
		mu.Unlock()
		if got != c.want {
			t.Errorf("%s: posted to %s, want %s", c.name, got, c.want)
		}
	}
	if err := Check(Config{Endpoint: "ftp://x", Getenv: func(string) string { return "" }}); err == nil || !strings.Contains(err.Error(), "scheme ftp") {
		t.Errorf("ftp://x: %v, want the scheme named", err)
	}
}

// TestEndpointPortNotANumber: an endpoint whose port is not a number says
// so, naming the port, with or without a scheme.
func TestEndpointPortNotANumber(t *testing.T) {
	for _, c := range []struct{ endpoint, port string }{
		{"http://host:notaport", "notaport"},
		{"grpc://host:43l7/", "43l7"},
		{"host:notaport", "notaport"},
	} {
		err := Check(Config{Endpoint: c.endpoint, Getenv: func(string) string { return "" }})
		want := `OTLP traces endpoint "` + c.endpoint + `": port "` + c.port + `" is not a number`
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %v, want %q", c.endpoint, err, want)
		}
	}
}

// TestLegSpanID: the id is a function of (trace, room, gen, role) alone,
// different for each, and a provider with IDs gives a span the id asked
// for with WithSpanID (and random ids otherwise).
func TestLegSpanID(t *testing.T) {
	var tid trace.TraceID
	tid[0] = 7
	a := LegSpanID(tid, "r1", 1, "prefill")
	if a != LegSpanID(tid, "r1", 1, "prefill") || !a.IsValid() {
		t.Fatal("not deterministic")
	}
	for _, b := range []trace.SpanID{LegSpanID(tid, "r2", 1, "prefill"), LegSpanID(tid, "r1", 2, "prefill"), LegSpanID(tid, "r1", 1, "decode")} {
		if b == a {
			t.Fatal("two legs share an id")
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(IDs{}))
	defer tp.Shutdown(context.Background())
	_, s := tp.Tracer("t").Start(WithSpanID(context.Background(), a), "x")
	if s.SpanContext().SpanID() != a {
		t.Fatalf("span id %s, want %s", s.SpanContext().SpanID(), a)
	}
	_, s2 := tp.Tracer("t").Start(context.Background(), "y")
	if !s2.SpanContext().IsValid() || s2.SpanContext().SpanID() == a {
		t.Fatal("a span without WithSpanID must get a random id")
	}
}

// Package tracing sets up pdserve's OpenTelemetry tracing: one trace per
// request across the router, the prefill worker, the KV hop and the decode
// worker, exported over OTLP (gRPC or HTTP) to the operator's backend
// (Jaeger, Tempo, an OpenTelemetry collector).
//
// It is off unless an endpoint is given (--otlp-traces-endpoint, vLLM's flag,
// or the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
// OTEL_EXPORTER_OTLP_ENDPOINT); off, every component gets the no-op
// provider and creates no span. The sampling ratio follows
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: every trace);
// below 1, every span is recorded and a tail sampler exports the traces
// within the ratio (the same on every process: a function of the trace
// id) and every one that failed, was retried or continued, or took
// Config.SlowThreshold. The exporter follows the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS).
//
// Trace context crosses the router's legs as W3C traceparent headers, and an
// incoming request's traceparent is honoured (InjectHeader, ExtractHeader).
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pdserve/pdserve/internal/netaddr"
)

// Instrumentation is the name of pdserve's tracers.
const Instrumentation = "github.com/pdserve/pdserve"

// Config says where spans go.
type Config struct {
	// Endpoint is the OTLP endpoint (--otlp-traces-endpoint): a URL
	// ("http://collector:4318", "grpc://jaeger:4317") or host:port, whose
	// protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
	// OTEL_EXPORTER_OTLP_PROTOCOL ("grpc", the default, or
	// "http/protobuf"). Empty: the OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT variable, else tracing is off.
	Endpoint string
	// Service is the service.name of the spans ("pdserve-router",
	// "pdserve-prefill", …).
	Service string
	// SlowThreshold (--trace-slow-threshold): with a sampling ratio below
	// 1, a request whose span (the router's request, a worker's leg) lasts
	// this long is exported whatever the ratio, as one that failed or was
	// retried or continued always is. 0: no such rule.
	SlowThreshold time.Duration
	// Getenv reads the environment (nil: os.Getenv).
	Getenv func(string) string
	// Logger, if set, is told when an export fails: the first failure, then
	// at most one line per exportLogEvery with the failures since.
	Logger *slog.Logger
}

// Provider is a component's tracer provider and how to flush it.
type Provider struct {
	trace.TracerProvider
	// On says spans are recorded and exported (an endpoint was given).
	On bool
	// Shutdown flushes the spans not yet exported and stops the exporter
	// (a no-op when off).
	Shutdown func(context.Context) error
}

// Off is the provider of a component without tracing.
func Off() Provider {
	return Provider{TracerProvider: noop.NewTracerProvider(), Shutdown: func(context.Context) error { return nil }}
}

// New returns the provider cfg asks for: Off without an endpoint. The
// exporter connects lazily; an endpoint that cannot be parsed is an error.
func New(ctx context.Context, cfg Config) (Provider, error) {
	st, err := settingsOf(cfg)
	if err != nil {
		return Provider{}, err
	}
	if st.client == nil {
		return Off(), nil
	}
	exp, err := newExporter(ctx, st.client)
	if err != nil {
		return Provider{}, err
	}
	p := &provider{res: st.res, ratio: st.ratio, slow: cfg.SlowThreshold, q: newQueue(st.qc, exp, cfg.Logger),
		tracers: map[instrumentation.Scope]*tracer{}}
	if st.ratio < 1 {
		// Every span is recorded; the tail sampler exports the traces
		// within the ratio and those that matter (failed, slow, retried).
		p.tail = newTailSampler(p.q, st.ratio, cfg.SlowThreshold)
	}
	return Provider{TracerProvider: p, On: true, Shutdown: p.q.shutdown}, nil
}

// Check returns the error New would return for cfg (an endpoint or an
// OTEL_* variable it cannot use), without starting anything: a process
// that starts several components checks before it starts the first.
func Check(cfg Config) error {
	_, err := settingsOf(cfg)
	return err
}

// settings is what New makes a provider of; client is nil when tracing is
// off.
type settings struct {
	client otlptrace.Client
	ratio  float64
	qc     queueConfig
	res    *resource.Resource
}

// settingsOf reads cfg and the environment. The general
// OTEL_EXPORTER_OTLP_ENDPOINT is a base URL, as the OpenTelemetry
// specification has it: over HTTP, traces go to its path + /v1/traces;
// the flag and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT name the whole URL.
func settingsOf(cfg Config) (settings, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	endpoint, base := cfg.Endpoint, false
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	}
	if endpoint == "" {
		endpoint, base = getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), true
	}
	if endpoint == "" {
		return settings{}, nil
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	ratio, err := ratioOf(getenv)
	if err != nil {
		return settings{}, err
	}
	qc, err := queueConfigOf(getenv)
	if err != nil {
		return settings{}, err
	}
	// As the SDK's provider with WithResource: OTEL_RESOURCE_ATTRIBUTES and
	// OTEL_SERVICE_NAME, then the service name.
	res, err := resource.Merge(resource.Environment(), resource.NewSchemaless(semconv.ServiceName(cfg.Service)))
	if err != nil {
		return settings{}, fmt.Errorf("tracing resource: %w", err)
	}
	client, err := otlpClient(endpoint, proto, base)
	if err != nil {
		return settings{}, err
	}
	return settings{client: client, ratio: ratio, qc: qc, res: res}, nil
}

// otlpClient returns the OTLP client of endpoint: gRPC unless the URL's
// scheme or proto says HTTP. Over HTTP the path is the URL's, or
// /v1/traces when it names none or base says it is a base URL (then
// appended to it).
func otlpClient(endpoint, proto string, base bool) (otlptrace.Client, error) {
	bad := func(why string) error {
		return fmt.Errorf("OTLP traces endpoint %q: %s (want grpc://host:4317, http://host:4318 or host:port)", endpoint, why)
	}
	scheme, host, path := "", endpoint, ""
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if p, ok := netaddr.NonNumericPort(endpoint); err != nil && ok {
			return nil, bad(fmt.Sprintf("port %q is not a number", p))
		}
		if err != nil || u.Host == "" {
			return nil, bad("not a URL with a host")
		}
		scheme, host, path = u.Scheme, u.Host, u.Path
		if scheme != "grpc" && scheme != "http" && scheme != "https" {
			return nil, bad("scheme " + scheme)
		}
	}
	if h, port, err := net.SplitHostPort(host); err != nil || h == "" {
		return nil, bad("no host:port")
	} else if n, err := strconv.Atoi(port); err != nil && strings.Trim(port, "0123456789") != "" {
		return nil, bad(fmt.Sprintf("port %q is not a number", port))
	} else if err != nil || n < 1 || n > 65535 {
		return nil, bad("port " + port + " out of range")
	}
	switch {
	case scheme == "grpc" || (scheme == "" && (proto == "" || proto == "grpc")):
		return otlptracegrpc.NewClient(otlptracegrpc.WithEndpoint(host), otlptracegrpc.WithInsecure()), nil
	case scheme == "http" || scheme == "https" || (scheme == "" && proto == "http/protobuf"):
		// The standard path unless the URL names one (so the traces
		// variable's plain http://host:4318 works as the flag does), or
		// after a base URL's.
		if path == "" || path == "/" || base {
			path = strings.TrimSuffix(path, "/") + "/v1/traces"
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(host), otlptracehttp.WithURLPath(path)}
		if scheme != "https" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return otlptracehttp.NewClient(opts...), nil
	}
	return nil, errors.New("OTEL_EXPORTER_OTLP_PROTOCOL " + proto + ": want grpc or http/protobuf")
}

// Extracting is h with an incoming traceparent honoured: the request's
// context carries it, so the spans its handler starts are its children.
func Extracting(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if sc := ExtractHeader(req.Header); sc.IsValid() {
			req = req.WithContext(trace.ContextWithRemoteSpanContext(req.Context(), sc))
		}
		h.ServeHTTP(w, req)
	})
}

// spanIDKey carries the span id a caller asks the next span to have.
type spanIDKey struct{}

// WithSpanID returns ctx asking the provider's next span started with it
// to take id (New's providers, or one built with IDs): so that a span's id
// can be known in another process without sending it there (LegSpanID).
func WithSpanID(ctx context.Context, id trace.SpanID) context.Context {
	return context.WithValue(ctx, spanIDKey{}, id)
}

// IDs is the span and trace id generator of pdserve's providers: random
// ids, except a span id asked for with WithSpanID.
type IDs struct{}

// NewIDs implements sdktrace.IDGenerator.
func (IDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	return randomTraceID(), IDs{}.NewSpanID(ctx, trace.TraceID{})
}

// NewSpanID implements sdktrace.IDGenerator.
func (IDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if id, ok := ctx.Value(spanIDKey{}).(trace.SpanID); ok && id.IsValid() {
		return id
	}
	return randomSpanID()
}

// randomTraceID is a random, valid trace id.
func randomTraceID() trace.TraceID {
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid
}

// randomSpanID is a random, valid span id.
func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.BigEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

// LegSpanID is the span id of the role leg of attempt (room, gen) in trace
// tid: the first 8 bytes of SHA-256 over the trace id's 16 bytes and
// "room/gen/role". The prefill worker gives its leg this id, and the
// decode worker links its KV hop to it: the two ends of one transfer,
// found in the trace without the id crossing the KV channel.
func LegSpanID(tid trace.TraceID, room string, gen uint32, role string) trace.SpanID {
	var buf [128]byte
	b := append(buf[:0], tid[:]...)
	b = append(b, room...)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(gen), 10)
	b = append(b, '/')
	b = append(b, role...)
	sum := sha256.Sum256(b)
	var sid trace.SpanID
	copy(sid[:], sum[:])
	if !sid.IsValid() {
		sid[7] = 1
	}
	return sid
}

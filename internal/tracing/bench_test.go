package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkPDRequestSpans is the tracing work of one PD request, every
// request sampled, as the router and the two workers do it, in one
// process: the router's request and attempt spans with their attributes,
// the first-token event, traceparent injected into the two legs' headers
// and extracted by the workers, each worker's leg span ended with its
// stages (5 prefill, 4 decode, the KV hop linked), and the export of all
// of it over OTLP/HTTP to a receiver in the process that discards it (its
// share counts). It reports the process's CPU per request (cpu-us/req),
// which includes the exporter's goroutine:
//
//	go test ./internal/tracing -run '^$' -bench PDRequestSpans -benchtime 200000x
func BenchmarkPDRequestSpans(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	ctx := context.Background()
	providers := map[string]Provider{}
	for _, svc := range []string{"pdserve-router", "pdserve-prefill-0", "pdserve-decode-0"} {
		p, err := New(ctx, Config{Endpoint: sink.URL, Service: svc, Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		providers[svc] = p
	}
	router := providers["pdserve-router"].Tracer(Instrumentation)
	stageList := make([]Stage, 8)
	leg := func(svc string, h http.Header, stages int, peer trace.SpanContext) {
		p := providers[svc]
		tr := p.Tracer(Instrumentation)
		t0 := time.Now()
		parent := ExtractHeader(h)
		o := SpanStart{Kind: trace.SpanKindServer, Time: t0}
		if !peer.IsValid() { // the prefill leg: its id is the one decode links to
			o.ID = LegSpanID(parent.TraceID(), "0123456789abcdef", 1, "prefill")
		}
		span := StartChild(tr, parent, "leg", o)
		if span.IsRecording() {
			SetAttributes(span, attribute.String("pdserve.rid", "cmpl-0123456789abcdef"), attribute.Int("gen_ai.usage.input_tokens", 32),
				attribute.String("pdserve.room", "0123456789abcdef"), attribute.Int("pdserve.gen", 1),
				attribute.String("pdserve.outcome", "ok"), attribute.Int("gen_ai.usage.output_tokens", 16),
				attribute.Int("pdserve.cached_tokens", 0), attribute.StringSlice("gen_ai.response.finish_reasons", []string{"length"}))
		}
		st := stageList[:stages] // reused, as the workers reuse theirs
		for i := range st {
			st[i] = Stage{Name: "stage", Start: t0, End: t0.Add(time.Millisecond)}
		}
		st[0].Link = peer
		EndWithStages(p, tr, span, t0.Add(time.Duration(stages)*time.Millisecond), st)
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c0 := cpu()
	b.ReportAllocs()
	for b.Loop() {
		rctx, req := Start(ctx, router, "router.request", SpanStart{Kind: trace.SpanKindServer, Time: time.Now()})
		SetAttributes(req, attribute.String("pdserve.rid", "cmpl-0123456789abcdef"), attribute.String("gen_ai.request.model", "m"),
			attribute.Int("gen_ai.usage.input_tokens", 32), attribute.Int("gen_ai.request.max_tokens", 16),
			attribute.Int("gen_ai.request.choice.count", 1))
		_, att := Start(rctx, router, "router.attempt", SpanStart{Kind: trace.SpanKindClient})
		SetAttributes(att, attribute.Int("pdserve.gen", 1), attribute.String("pdserve.room", "0123456789abcdef"),
			attribute.String("pdserve.prefill", "http://127.0.0.1:30000"), attribute.String("pdserve.decode", "http://127.0.0.1:30001"))
		actx := trace.ContextWithSpan(ctx, att)
		hp, hd := http.Header{}, http.Header{}
		InjectHeader(trace.SpanContextFromContext(actx), hp)
		InjectHeader(trace.SpanContextFromContext(actx), hd)
		leg("pdserve-prefill-0", hp, 5, trace.SpanContext{})
		leg("pdserve-decode-0", hd, 4, att.SpanContext())
		SetAttributes(att, attribute.String("pdserve.outcome", "ok"))
		att.End()
		AddEventAt(req, "first token", time.Now())
		SetAttributes(req, attribute.Float64("gen_ai.latency.time_to_first_token", 0.01), attribute.String("pdserve.outcome", "ok"))
		req.SetStatus(codes.Unset, "")
		req.End()
	}
	for _, p := range providers {
		_ = p.Shutdown(ctx) // the last spans' export is part of the cost
	}
	b.ReportMetric(float64((cpu()-c0).Nanoseconds())/1e3/float64(b.N), "cpu-us/req")
}

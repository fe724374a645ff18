package tracing

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// capture is an OTLP client that keeps what it is asked to upload, as the
// bytes on the wire.
type capture struct{ sent [][]byte }

func (c *capture) Start(context.Context) error { return nil }
func (c *capture) Stop(context.Context) error  { return nil }
func (c *capture) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	for _, r := range rs {
		b, err := proto.Marshal(r)
		if err != nil {
			return err
		}
		c.sent = append(c.sent, b)
	}
	return nil
}

// decoded is what c was sent, decoded, ordered by resource.
func (c *capture) decoded(t *testing.T) []*tracepb.ResourceSpans {
	t.Helper()
	var out []*tracepb.ResourceSpans
	for _, b := range c.sent {
		m := &tracepb.ResourceSpans{}
		if err := proto.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *tracepb.ResourceSpans) int {
		return strings.Compare(a.GetResource().String(), b.GetResource().String())
	})
	return out
}

// spansOfEveryShape are spans with every kind of attribute value, events,
// links, statuses and parents, over two resources and three scopes, one
// of them with a message longer than two varint bytes can count.
func spansOfEveryShape() []sdktrace.ReadOnlySpan {
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ts, _ := trace.ParseTraceState("vendor=x")
	sc := func(sid byte, remote bool) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{sid, 1}, TraceFlags: trace.FlagsSampled,
			TraceState: ts, Remote: remote})
	}
	r1 := resource.NewSchemaless(attribute.String("service.name", "a"))
	r2 := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.37.0", attribute.String("service.name", "b"),
		attribute.Int("n", 3))
	s1 := instrumentation.Scope{Name: Instrumentation}
	s2 := instrumentation.Scope{Name: "other", Version: "v1", SchemaURL: "https://example.com/s",
		Attributes: attribute.NewSet(attribute.Bool("b", true))}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	every := []attribute.KeyValue{
		attribute.String("s", "v"), attribute.String("empty", ""), attribute.Bool("t", true), attribute.Bool("f", false),
		attribute.Int("zero", 0), attribute.Int("neg", -7), attribute.Int64("big", 1<<62), attribute.Float64("x", 0.25),
		attribute.Float64("fzero", 0), attribute.StringSlice("ss", []string{"a", "", "c"}), attribute.IntSlice("is", []int{1, -2}),
		attribute.Float64Slice("fs", []float64{1.5}), attribute.BoolSlice("bs", []bool{true, false}),
		attribute.StringSlice("none", nil), {Key: "bytes", Value: attribute.ByteSliceValue([]byte{0, 1})},
		{Key: "slice", Value: attribute.SliceValue(attribute.StringValue("x"), attribute.IntValue(2))},
		{Key: "map", Value: attribute.MapValue(attribute.String("k", "v"), attribute.Int("i", 1))},
		{Key: "empty value", Value: attribute.Value{}},
	}
	stubs := []tracetest.SpanStub{
		{Name: "root", SpanContext: sc(1, false), SpanKind: trace.SpanKindServer, StartTime: t0, EndTime: t0.Add(time.Second),
			Attributes: every, Resource: r1, InstrumentationScope: s1, Status: sdktrace.Status{Code: codes.Error, Description: "it failed"},
			Events: []sdktrace.Event{{Name: "first token", Time: t0.Add(time.Millisecond)},
				{Name: "e", Time: t0, Attributes: every[:3], DroppedAttributeCount: 2}},
			DroppedAttributes: 1, DroppedEvents: 3, DroppedLinks: 4},
		{Name: "remote child", SpanContext: sc(2, false), Parent: sc(9, true), SpanKind: trace.SpanKindClient, StartTime: t0,
			EndTime: t0, Resource: r1, InstrumentationScope: s1, Status: sdktrace.Status{Code: codes.Ok},
			Links: []sdktrace.Link{{SpanContext: sc(3, true), Attributes: every[:2], DroppedAttributeCount: 1},
				{SpanContext: sc(4, false)}}},
		{Name: strings.Repeat("long ", 4000), SpanContext: sc(5, false), Parent: sc(1, false), StartTime: t0, EndTime: t0,
			Resource: r2, InstrumentationScope: s2},
		{Name: "no scope", SpanContext: sc(6, false), Parent: sc(1, false), StartTime: t0, EndTime: t0, Resource: r2},
		{Name: "kinds", SpanContext: sc(7, false), SpanKind: trace.SpanKindConsumer, StartTime: time.Unix(0, 0).Add(-time.Hour),
			EndTime: t0, Resource: r1, InstrumentationScope: s2},
		{Name: "again in scope 1", SpanContext: sc(8, false), SpanKind: trace.SpanKindProducer, StartTime: t0, EndTime: t0,
			Resource: r1, InstrumentationScope: s1},
	}
	return tracetest.SpanStubs(stubs).Snapshots()
}

// sendSpans writes spans into enc (emptied first) as the queue writes
// ended spans, and sends it with e.
func sendSpans(ctx context.Context, e *exporter, enc *encoded, spans []sdktrace.ReadOnlySpan) error {
	enc.reset()
	for _, s := range spans {
		enc.add(s)
	}
	return e.send(ctx, enc)
}

// TestExporterEncoding: the exporter's own encoding decodes to exactly
// what the SDK's OTLP exporter would send for the same spans, and a
// second batch through the same (reused) buffers too; a batch of no span
// sends nothing.
func TestExporterEncoding(t *testing.T) {
	ctx := context.Background()
	spans := spansOfEveryShape()
	var want capture
	if err := otlptrace.NewUnstarted(&want).ExportSpans(ctx, spans); err != nil {
		t.Fatal(err)
	}
	var got capture
	e, err := newExporter(ctx, &got)
	if err != nil {
		t.Fatal(err)
	}
	var enc encoded
	for range 2 {
		got.sent = nil
		if err := sendSpans(ctx, e, &enc, spans); err != nil {
			t.Fatal(err)
		}
		w, g := want.decoded(t), got.decoded(t)
		if len(g) != len(w) {
			t.Fatalf("%d resource spans, want %d", len(g), len(w))
		}
		for i := range w {
			if !proto.Equal(g[i], w[i]) {
				t.Errorf("resource %d:\n got %v\nwant %v", i, g[i], w[i])
			}
		}
	}
	if err := sendSpans(ctx, e, &enc, nil); err != nil || len(got.sent) != 2 {
		t.Errorf("no spans: %v, sent %d (want nothing more)", err, len(got.sent))
	}
	if err := e.Shutdown(ctx); err != nil {
		t.Error(err)
	}
}

// BenchmarkExporter: encoding a batch of 512 spans (the batch processor's
// default batch) shaped like a PD request's.
func BenchmarkExporter(b *testing.B) {
	ctx := context.Background()
	one := spansOfEveryShape()[:2]
	var spans []sdktrace.ReadOnlySpan
	for len(spans) < 512 {
		spans = append(spans, one...)
	}
	e, err := newExporter(ctx, discardClient{})
	if err != nil {
		b.Fatal(err)
	}
	var enc encoded
	b.ReportAllocs()
	for b.Loop() {
		if err := sendSpans(ctx, e, &enc, spans); err != nil {
			b.Fatal(err)
		}
	}
}

type discardClient struct{}

func (discardClient) Start(context.Context) error { return nil }
func (discardClient) Stop(context.Context) error  { return nil }
func (discardClient) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	_, err := proto.Marshal(rs[0])
	return err
}

// TestSmallKeyValue: the attributes appendSmallKeyValue writes byte by
// byte are the bytes the general encoding writes, at the one-byte length
// limits and past them (where it declines), and decode as the SDK's
// exporter's KeyValue.
func TestSmallKeyValue(t *testing.T) {
	var kvs []attribute.KeyValue
	for _, key := range []string{"", "k", "pdserve.rid", strings.Repeat("k", 60), strings.Repeat("k", 123), strings.Repeat("k", 200)} {
		for _, n := range []int{0, 1, 50, 100, 118, 119, 120, 121, 122, 127, 128, 300} {
			kvs = append(kvs, attribute.String(key, strings.Repeat("é", n/2)+strings.Repeat("v", n%2)))
		}
		for _, v := range []int64{0, 1, -1, 127, 128, 1 << 40, -1 << 63, 1<<63 - 1} {
			kvs = append(kvs, attribute.Int64(key, v))
		}
		for _, v := range []float64{0, -0.5, 1e300} {
			kvs = append(kvs, attribute.Float64(key, v))
		}
		kvs = append(kvs, attribute.Bool(key, true), attribute.Bool(key, false),
			attribute.StringSlice(key, []string{"length"}), attribute.Int64Slice(key, []int64{1}))
	}
	small := 0
	for _, kv := range kvs {
		general := appendAnyKeyValue([]byte{1}, fSpanAttributes, kv)
		if got, ok := appendSmallKeyValue([]byte{1}, fSpanAttributes, kv); ok {
			small++
			if string(got) != string(general) {
				t.Errorf("%s=%v: %x, want %x", kv.Key, kv.Value.Emit(), got, general)
			}
		} else if string(got) != "\x01" {
			t.Errorf("%s=%v: declined but wrote %x", kv.Key, kv.Value.Emit(), got)
		}
		if got := appendKeyValue(nil, fSpanAttributes, kv); string(got) != string(general[1:]) {
			t.Errorf("%s=%v: appendKeyValue %x, want %x", kv.Key, kv.Value.Emit(), got, general[1:])
		}
	}
	if small == 0 {
		t.Error("no attribute written by the small path")
	}
	for _, kv := range []attribute.KeyValue{AttrRID.String("cmpl-0123456789abcdef"), AttrGen.Int(1),
		attribute.Float64("gen_ai.latency.time_to_first_token", 0.01), AttrKeep.Bool(true)} {
		if _, ok := appendSmallKeyValue(nil, fSpanAttributes, kv); !ok {
			t.Errorf("%s=%v: not written by the small path", kv.Key, kv.Value.Emit())
		}
	}
}

package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// testStages are a leg's two stages laid end to end from t0, the second
// linked to a span of another process.
func testStages(t0 time.Time) ([]Stage, trace.SpanContext) {
	peer := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7}, SpanID: trace.SpanID{8}, Remote: true,
		TraceFlags: trace.FlagsSampled})
	return []Stage{{Name: "decode queued", Start: t0.Add(time.Millisecond), End: t0.Add(3 * time.Millisecond)},
		{Name: "kv transfer", Start: t0, End: t0.Add(time.Millisecond), Link: peer,
			LinkAttrs: []attribute.KeyValue{attribute.String("pdserve.link", "x")}}}, peer
}

// TestEndWithStages: with New's provider, a span ended with stages is
// exported with a child span per stage (its times, the leg as parent, the
// link), written by the exporter; a span its sampler does not record
// leaves nothing behind.
func TestEndWithStages(t *testing.T) {
	var mu sync.Mutex
	var got []*tracepb.Span
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Error(err)
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				got = append(got, ss.Spans...)
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	ctx := context.Background()
	p, err := New(ctx, Config{Endpoint: srv.URL, Service: "s", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Tracer(Instrumentation)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	_, leg := tr.Start(ctx, "decode.leg", trace.WithTimestamp(t0))
	stages, peer := testStages(t0)
	EndWithStages(p, tr, leg, t0.Add(3*time.Millisecond), stages)
	// Not sampled (a parent-based sampler under an unsampled parent).
	unsampled := trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}, Remote: true}))
	_, quiet := tr.Start(unsampled, "decode.leg")
	EndWithStages(p, tr, quiet, t0, stages)
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range got {
		byName[s.Name] = s
	}
	if len(got) != 3 || byName["decode.leg"] == nil {
		t.Fatalf("exported %v, want the leg and its two stages", got)
	}
	l := byName["decode.leg"]
	for _, st := range stages {
		s := byName[st.Name]
		if s == nil {
			t.Fatalf("no span %q", st.Name)
		}
		if string(s.ParentSpanId) != string(l.SpanId) || string(s.TraceId) != string(l.TraceId) || len(s.SpanId) != 8 {
			t.Errorf("%s: trace %x parent %x, want the leg's %x, %x", st.Name, s.TraceId, s.ParentSpanId, l.TraceId, l.SpanId)
		}
		if s.StartTimeUnixNano != uint64(st.Start.UnixNano()) || s.EndTimeUnixNano != uint64(st.End.UnixNano()) ||
			s.Kind != tracepb.Span_SPAN_KIND_INTERNAL {
			t.Errorf("%s: %d–%d kind %v, want %d–%d internal", st.Name, s.StartTimeUnixNano, s.EndTimeUnixNano, s.Kind,
				st.Start.UnixNano(), st.End.UnixNano())
		}
	}
	kv := byName["kv transfer"]
	if len(kv.Links) != 1 || trace.SpanID(kv.Links[0].SpanId) != peer.SpanID() || len(kv.Links[0].Attributes) != 1 {
		t.Errorf("kv transfer links %v, want one to %s with its attribute", kv.Links, peer.SpanID())
	}
	if len(byName["decode queued"].Links) != 0 {
		t.Error("decode queued has a link")
	}
}

// TestEndWithStagesElsewhere: with any other provider (a test's in-memory
// one) the stages are spans of its own, children of the span.
func TestEndWithStagesElsewhere(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer(Instrumentation)
	t0 := time.Now()
	_, leg := tr.Start(context.Background(), "decode.leg", trace.WithTimestamp(t0))
	stages, peer := testStages(t0)
	EndWithStages(tp, tr, leg, t0.Add(3*time.Millisecond), stages)
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for _, s := range spans[:2] {
		if s.Parent.SpanID() != leg.SpanContext().SpanID() {
			t.Errorf("%s is not the leg's child", s.Name)
		}
	}
	if s := spans[1]; s.Name != "kv transfer" || len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != peer.SpanID() ||
		!s.StartTime.Equal(t0) {
		t.Errorf("kv transfer: %+v", s)
	}
}

// TestStagesListReusable: EndWithStages does not keep the stage list, so
// a caller may reuse it at once (the workers pool theirs); under the tail
// sampler, which holds a span until its trace is decided, the span keeps a
// copy.
func TestStagesListReusable(t *testing.T) {
	for _, ratio := range []float64{1, 0.5} {
		p, sent := testProvider(t, ratio, 0)
		tr := p.Tracer(Instrumentation)
		t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		stages, _ := testStages(t0)
		_, root := tr.Start(context.Background(), "root", trace.WithTimestamp(t0))
		leg := StartChild(tr, root.SpanContext(), "leg", SpanStart{Time: t0})
		Provider{TracerProvider: p}.EndWithStages(leg, t0.Add(3*time.Millisecond), stages)
		for i := range stages {
			stages[i] = Stage{Name: "overwritten", Start: t0, End: t0}
		}
		SetAttributes(root, AttrKeep.Bool(true)) // kept whatever the ratio
		root.End(trace.WithTimestamp(t0.Add(4 * time.Millisecond)))
		if err := p.q.shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, s := range exportedSpans(t, sent) {
			names[s.Name] = true
		}
		if !names["decode queued"] || !names["kv transfer"] || names["overwritten"] || len(names) != 4 {
			t.Errorf("ratio %v: exported %v; want root, leg and the two stages as they were when the leg ended", ratio, names)
		}
	}
}

// TestSetAttributesOnTheStack: SetAttributes on New's spans does not make
// the caller's attributes escape (no allocation per call), and on another
// provider's spans sets them as the span's own method does.
func TestSetAttributesOnTheStack(t *testing.T) {
	p, _ := testProvider(t, 1, 0)
	_, s := p.Tracer(Instrumentation).Start(context.Background(), "s")
	defer s.End()
	if n := testing.AllocsPerRun(100, func() {
		SetAttributes(s, AttrOutcome.String("ok"), AttrGen.Int(1), AttrRID.String("cmpl-1"))
	}); n != 0 {
		t.Errorf("SetAttributes allocates %v times per call", n)
	}
	exp := tracetest.NewInMemoryExporter()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	_, o := sdk.Tracer("t").Start(context.Background(), "other")
	SetAttributes(o, AttrOutcome.String("ok"), AttrGen.Int(2))
	o.End() // exported at once: a syncer
	if got := exp.GetSpans(); len(got) != 1 || len(got[0].Attributes) != 2 || got[0].Attributes[1] != AttrGen.Int(2) {
		t.Errorf("the SDK's span got %v", got)
	}
	_ = sdk.Shutdown(context.Background())
}

// TestPlainStage: the stages appendPlainStage writes byte by byte are the
// bytes appendStageFields writes, for names up to its limit and past it
// (where it declines, as for a tracestate, a link or a time before 1970).
func TestPlainStage(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	sid := trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}
	ts, _ := trace.ParseTraceState("vendor=v")
	link := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{3}, SpanID: trace.SpanID{4}, Remote: true})
	plain := 0
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled, trace.FlagsSampled | trace.FlagsRandom} {
		for _, state := range []trace.TraceState{{}, ts} {
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 9}, SpanID: trace.SpanID{2, 9},
				TraceFlags: flags, TraceState: state})
			for _, n := range []int{0, 1, 13, 58, 59, 60, 61, 200} {
				for _, st := range []Stage{
					{Name: strings.Repeat("s", n), Start: t0, End: t0.Add(time.Millisecond)},
					{Name: strings.Repeat("s", n), Start: time.Unix(0, 0), End: t0},
					{Name: strings.Repeat("s", n), Start: t0, End: t0, Link: link, LinkAttrs: []attribute.KeyValue{attribute.String("k", "v")}},
				} {
					want := appendStageFields([]byte{7}, sc, sid, st)
					got, ok := appendPlainStage([]byte{7}, sc, sid, st)
					if !ok {
						if string(got) != "\x07" {
							t.Errorf("%q: declined but wrote %x", st.Name, got)
						}
						continue
					}
					plain++
					if string(got) != string(want) {
						t.Errorf("%q (flags %v, tracestate %q): %x, want %x", st.Name, flags, state, got, want)
					}
				}
			}
		}
	}
	if plain == 0 {
		t.Error("no stage written byte by byte")
	}
	if _, ok := appendPlainStage(nil, trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}}),
		sid, Stage{Name: "decode awaiting_kv", Start: t0, End: t0}); !ok {
		t.Error("a worker's stage not written byte by byte")
	}
}

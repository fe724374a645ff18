package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/pdserve/pdserve/internal/testbin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// testProvider is New's provider at ratio and slow, exporting to a
// capture; its queue exports only when full or shut down.
func testProvider(t *testing.T, ratio float64, slow time.Duration) (*provider, *capture) {
	t.Helper()
	sent := &capture{}
	exp, err := newExporter(context.Background(), sent)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{res: resource.NewSchemaless(semconv.ServiceName("s")), ratio: ratio, slow: slow,
		q:       newQueue(queueConfig{delay: time.Hour, timeout: 10 * time.Second, max: 2048, batch: 512}, exp, nil),
		tracers: map[instrumentation.Scope]*tracer{}}
	if ratio < 1 {
		p.tail = newTailSampler(p.q, ratio, slow)
	}
	t.Cleanup(func() { _ = p.q.shutdown(context.Background()) })
	return p, sent
}

// idleQueue is a provider whose queue (max spans, batches of batch)
// exports over client but has no goroutine: the test flushes it. log, if
// set, gets its warnings.
func idleQueue(t *testing.T, client otlptrace.Client, max, batch int, log *slog.Logger) (*queue, *provider) {
	t.Helper()
	exp, err := newExporter(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	q := &queue{cfg: queueConfig{delay: time.Hour, timeout: 10 * time.Second, max: max, batch: batch}, exp: exp, log: log}
	return q, &provider{res: resource.Empty(), ratio: 1, q: q, tracers: map[instrumentation.Scope]*tracer{}}
}

// exportedSpans is every span c was sent.
func exportedSpans(t *testing.T, c *capture) []*tracepb.Span {
	t.Helper()
	var out []*tracepb.Span
	for _, rs := range c.decoded(t) {
		for _, ss := range rs.ScopeSpans {
			out = append(out, ss.Spans...)
		}
	}
	return out
}

// exercise makes the same spans with tp: every call of the trace API the
// router and workers use and the others (events, errors, links, status
// rules, attribute overwrites and limits, renames, calls after End, a
// remote parent sampled and not), and this package's Start and StartChild,
// at fixed times.
func exercise(tp trace.TracerProvider) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	tr := tp.Tracer(Instrumentation, trace.WithInstrumentationVersion("v1"))
	ctx, root := tr.Start(context.Background(), "root", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(t0),
		trace.WithAttributes(attribute.String("a", "1"), attribute.Int("n", 1)))
	root.SetAttributes(attribute.String("a", "2"), attribute.Bool("b", true), attribute.String("", "invalid"))
	root.AddEvent("first token", trace.WithTimestamp(t0.Add(time.Millisecond)), trace.WithAttributes(attribute.Int("i", 3)))
	root.RecordError(errors.New("boom"), trace.WithTimestamp(t0.Add(2*time.Millisecond)))
	root.RecordError(nil)
	root.SetStatus(codes.Error, "it failed")
	root.SetStatus(codes.Unset, "ignored")
	_, child := tr.Start(ctx, "child", trace.WithTimestamp(t0.Add(time.Millisecond)))
	peer := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7}, SpanID: trace.SpanID{8},
		TraceFlags: trace.FlagsSampled, Remote: true})
	child.AddLink(trace.Link{SpanContext: peer, Attributes: []attribute.KeyValue{attribute.String("l", "x")}})
	child.AddLink(trace.Link{}) // names no span: dropped
	child.SetName("child renamed")
	child.SetStatus(codes.Ok, "description dropped")
	child.SetStatus(codes.Error, "lower than Ok")
	for i := range 130 {
		child.SetAttributes(attribute.Int("k"+strings.Repeat("x", i), i))
	}
	child.End(trace.WithTimestamp(t0.Add(3 * time.Millisecond)))
	child.SetAttributes(attribute.String("after", "end"))
	child.End() // a second End: nothing
	remote := trace.ContextWithRemoteSpanContext(context.Background(), peer)
	_, leg := tr.Start(remote, "leg", trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(t0),
		trace.WithLinks(trace.Link{SpanContext: peer}))
	leg.End(trace.WithTimestamp(t0.Add(time.Millisecond)))
	unsampled := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}, Remote: true}))
	uctx, quiet := tr.Start(unsampled, "not sampled")
	_, quietChild := tr.Start(uctx, "not sampled either")
	quietChild.End()
	quiet.End()
	// The fast path's starts (Start, StartChild): as the options say.
	_, fast := Start(ctx, tr, "fast", SpanStart{Kind: trace.SpanKindClient, Time: t0.Add(time.Millisecond)})
	fast.SetAttributes(attribute.String("f", "1"))
	fast.End(trace.WithTimestamp(t0.Add(2 * time.Millisecond)))
	fastChild := StartChild(tr, peer, "fast child", SpanStart{Kind: trace.SpanKindServer, Time: t0})
	fastChild.End(trace.WithTimestamp(t0.Add(time.Millisecond)))
	_, other := tp.Tracer("other").Start(context.Background(), "other scope", trace.WithTimestamp(t0), trace.WithNewRoot())
	other.End(trace.WithTimestamp(t0))
	root.End(trace.WithTimestamp(t0.Add(4 * time.Millisecond)))
}

// TestProviderMatchesSDK: New's provider exports what the OpenTelemetry
// SDK's provider (parent-based always-on sampler, the SDK's OTLP exporter)
// exports for the same calls, field for field but the random ids; the
// ids keep the same parent/child and trace relations.
func TestProviderMatchesSDK(t *testing.T) {
	ctx := context.Background()
	p, got := testProvider(t, 1, 0)
	exercise(p)
	if err := p.q.shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var want capture
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSyncer(otlptrace.NewUnstarted(&want)), sdktrace.WithResource(p.res))
	exercise(sdk)
	if err := sdk.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	gs, ws := exportedSpans(t, got), exportedSpans(t, &want)
	if len(gs) != 6 || len(ws) != 6 {
		t.Fatalf("exported %d spans, the SDK %d; want 6", len(gs), len(ws))
	}
	// Relations, by name: child under root, leg under the remote peer.
	rel := func(spans []*tracepb.Span) map[string]string {
		byID := map[string]string{}
		for _, s := range spans {
			byID[string(s.SpanId)] = s.Name
		}
		out := map[string]string{}
		for _, s := range spans {
			out[s.Name] = byID[string(s.ParentSpanId)]
			if len(s.ParentSpanId) > 0 && out[s.Name] == "" {
				out[s.Name] = "remote " + trace.SpanID(s.ParentSpanId).String()
			}
		}
		return out
	}
	if diff := cmp.Diff(rel(ws), rel(gs)); diff != "" {
		t.Errorf("parents (-sdk +provider):\n%s", diff)
	}
	byName := func(spans []*tracepb.Span) []*tracepb.Span {
		spans = slices.Clone(spans)
		slices.SortFunc(spans, func(a, b *tracepb.Span) int { return strings.Compare(a.Name, b.Name) })
		return spans
	}
	ignoreIDs := protocmp.IgnoreFields(&tracepb.Span{}, "trace_id", "span_id", "parent_span_id")
	sortAttrs := protocmp.SortRepeated(func(a, b *commonpb.KeyValue) bool { return a.Key < b.Key })
	if diff := cmp.Diff(byName(ws), byName(gs), protocmp.Transform(), ignoreIDs, sortAttrs); diff != "" {
		t.Errorf("spans (-sdk +provider):\n%s", diff)
	}
	// Each span's resource and scope (the SDK's syncer sends one request
	// per span, the queue one per batch).
	where := func(c *capture) map[string]string {
		out := map[string]string{}
		for _, rs := range c.decoded(t) {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out[s.Name] = fmt.Sprint(rs.Resource.GetAttributes(), " ", ss.Scope.GetName(), " ", ss.Scope.GetVersion())
				}
			}
		}
		return out
	}
	if diff := cmp.Diff(where(&want), where(got)); diff != "" {
		t.Errorf("resources and scopes (-sdk +provider):\n%s", diff)
	}
}

// TestQueueBoundsAndShutdown: spans past the queue's bound are dropped
// rather than waited for; a full batch is exported without waiting for
// the delay; Shutdown exports the rest, and spans ended after it are
// dropped.
func TestQueueBoundsAndShutdown(t *testing.T) {
	sent := &blockingCapture{release: make(chan struct{})}
	exp, err := newExporter(context.Background(), sent)
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(queueConfig{delay: time.Hour, timeout: 10 * time.Second, max: 8, batch: 4}, exp, nil)
	p := &provider{res: resource.Empty(), ratio: 1, q: q, tracers: map[instrumentation.Scope]*tracer{}}
	tr := p.Tracer("t")
	for range 4 { // a full batch: exported at once, and held up in the client
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if state, ok := testbin.WaitUntil(5*time.Second, func() (bool, string) {
		n := sent.uploads()
		return n == 1, fmt.Sprint(n, " uploads started")
	}); !ok {
		t.Fatalf("a full batch was not exported: %s", state)
	}
	for range 20 { // 8 fit the queue, the other 12 are dropped, none blocks
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	q.mu.Lock()
	queued, dropped := q.queued(), q.dropped
	q.mu.Unlock()
	if queued != 8 || dropped != 12 {
		t.Errorf("queued %d, dropped %d; want 8 and 12", queued, dropped)
	}
	close(sent.release)
	if err := q.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := sent.spans(t); n != 12 {
		t.Errorf("%d spans exported, want 4 + 8", n)
	}
	_, late := tr.Start(context.Background(), "late")
	late.End()
	if q.dropped != 13 {
		t.Errorf("a span ended after shutdown was not dropped (%d dropped)", q.dropped)
	}
}

// blockingCapture is a capture whose uploads wait for release.
type blockingCapture struct {
	release chan struct{}
	mu      sync.Mutex
	started int
	c       capture
}

func (b *blockingCapture) Start(context.Context) error { return nil }
func (b *blockingCapture) Stop(context.Context) error  { return nil }
func (b *blockingCapture) UploadTraces(ctx context.Context, rs []*tracepb.ResourceSpans) error {
	b.mu.Lock()
	b.started++
	b.mu.Unlock()
	<-b.release
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.c.UploadTraces(ctx, rs)
}

func (b *blockingCapture) uploads() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started
}

func (b *blockingCapture) spans(t *testing.T) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(exportedSpans(t, &b.c))
}

// TestQueueFlushReusesItsBatches: a flush exports every queued span, a
// batch per request, and hands the batches back emptied, to write the
// next spans in; the queue keeps no span object (each is written as it
// ends).
func TestQueueFlushReusesItsBatches(t *testing.T) {
	sent := &capture{}
	q, p := idleQueue(t, sent, 16, 2, nil)
	for range 5 {
		_, s := p.Tracer("t").Start(context.Background(), "s")
		s.End()
	}
	if q.queued() != 5 || len(q.full) != 2 || q.cur == nil || q.cur.spans != 1 {
		t.Fatalf("queued %d in %d full batches and %v; want 5: 2 full of 2, 1 in the current one", q.queued(), len(q.full), q.cur)
	}
	used := map[*encoded]bool{q.cur: true}
	for _, b := range q.full {
		used[b] = true
	}
	q.flush()
	if n := len(exportedSpans(t, sent)); n != 5 || len(sent.sent) != 3 {
		t.Fatalf("exported %d spans in %d requests, want 5 in 3", n, len(sent.sent))
	}
	if q.queued() != 0 || len(q.full) != 0 || q.cur != nil || len(q.spare) != 3 {
		t.Fatalf("after the flush: queued %d, %d full, current %v, %d spare; want 0, 0, nil, 3", q.queued(), len(q.full), q.cur, len(q.spare))
	}
	for _, b := range q.spare {
		if !used[b] || b.spans != 0 || slices.ContainsFunc(b.groups, func(g encGroup) bool { return len(g.b) > 0 }) {
			t.Fatalf("spare batch %p: used before %v, %d spans; want a flushed batch, emptied", b, used[b], b.spans)
		}
	}
	_, s := p.Tracer("t").Start(context.Background(), "next")
	s.End()
	if !used[q.cur] {
		t.Error("the next span was not written into a flushed batch")
	}
	q.flush()
	if got := exportedSpans(t, sent); len(got) != 6 || got[5].Name != "next" {
		t.Errorf("the batch reused sent %d spans, want the 5 before and \"next\"", len(got))
	}
}

// failingClient is an OTLP client whose uploads fail.
type failingClient struct{}

func (failingClient) Start(context.Context) error { return nil }
func (failingClient) Stop(context.Context) error  { return nil }
func (failingClient) UploadTraces(context.Context, []*tracepb.ResourceSpans) error {
	return errors.New("connection refused")
}

// TestQueueLogsFailedExports: a failed export is logged (the SDK's batch
// processor hands it to the global error handler, which logs it), once,
// not once per batch.
func TestQueueLogsFailedExports(t *testing.T) {
	var logged testbin.Buffer
	q, p := idleQueue(t, failingClient{}, 16, 2, slog.New(slog.NewTextHandler(&logged, nil)))
	for range 5 {
		_, s := p.Tracer("t").Start(context.Background(), "s")
		s.End()
	}
	q.flush() // three batches, three failures
	out := logged.String()
	if strings.Count(out, "traces not exported") != 1 || !strings.Contains(out, "connection refused") {
		t.Fatalf("log:\n%s\nwant one line naming the error", out)
	}
	// 5 spans in batches of 2: the first failure (2 spans) is logged, the
	// other two (3 spans) counted for the next line.
	if !strings.Contains(out, "failed_exports=1 spans=2") {
		t.Errorf("log:\n%s\nwant the first failure's count and spans", out)
	}
	if q.failed != 2 || q.failedSpans != 3 {
		t.Errorf("%d failures and %d spans counted since the line, want 2 and 3", q.failed, q.failedSpans)
	}
}

// TestSpanSize: a span is one 112-byte object (what its holders keep once
// it ended); what it records (its attributes inline) is reused from span to
// span, so that a span with ten attributes, ended and written into the
// batch, is that one allocation.
func TestSpanSize(t *testing.T) {
	if n := unsafe.Sizeof(span{}); n > 112 {
		t.Errorf("a span is %d bytes, over the 112-byte size class", n)
	}
	p, sent := testProvider(t, 1, 0)
	tr := p.Tracer(Instrumentation)
	if n := testing.AllocsPerRun(100, func() {
		s := StartChild(tr, trace.SpanContext{}, "leg", SpanStart{})
		SetAttributes(s, AttrRID.String("cmpl-0123456789abcdef"), AttrInputTokens.Int(32), AttrRoom.String("0123456789abcdef"),
			AttrGen.Int(1), AttrOutcome.String("ok"), AttrOutputTokens.Int(16), AttrModel.String("a-model-name"),
			attribute.Float64("gen_ai.latency.time_to_first_token", 0.01), attribute.Int("pdserve.cached_tokens", 0),
			AttrOutcome.String("ok again"))
		s.End()
	}); n != 1 && !testbin.RaceEnabled { // the race detector's sync.Pool drops some of what it is given
		t.Errorf("a span with ten attributes is %v allocations, want 1", n)
	}
	if err := p.q.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exportedSpans(t, sent)
	if len(spans) != 101 {
		t.Fatalf("%d spans exported, want 101", len(spans))
	}
	for _, s := range spans {
		if len(s.Attributes) != 9 || s.Attributes[4].Value.GetStringValue() != "ok again" {
			t.Fatalf("span exported with attributes %v, want 9, the fifth outcome \"ok again\"", s.Attributes)
		}
	}
}

// TestBatchBuffersBounded: a batch whose buffer grew past maxKeptBuffer
// (a span with many events of many long attributes) does not keep it for
// the next spans.
func TestBatchBuffersBounded(t *testing.T) {
	sent := &capture{}
	q, p := idleQueue(t, sent, 16, 4, nil)
	long := attribute.String("long", strings.Repeat("x", maxValueBytes))
	attrs := make([]attribute.KeyValue, 100)
	for i := range attrs {
		attrs[i] = attribute.String(fmt.Sprint("a", i), long.Value.AsString())
	}
	_, s := p.Tracer("t").Start(context.Background(), "big")
	for range 15 { // 15 × 100 × 4 KB: 6 MB
		s.AddEvent("e", trace.WithAttributes(attrs...))
	}
	s.End()
	if q.cur != nil || len(q.full) != 1 || q.full[0].size() <= maxKeptBuffer {
		t.Fatalf("the big span's batch is not full and over %d bytes", maxKeptBuffer)
	}
	q.flush()
	if n := len(exportedSpans(t, sent)); n != 1 {
		t.Fatalf("exported %d spans, want 1", n)
	}
	for _, b := range q.spare {
		for _, g := range b.groups {
			if cap(g.b) > maxKeptBuffer {
				t.Errorf("a spare batch keeps a %d-byte buffer", cap(g.b))
			}
		}
	}
	for _, b := range q.exp.bufs {
		if cap(b) > maxKeptBuffer {
			t.Errorf("the exporter keeps a %d-byte buffer", cap(b))
		}
	}
}

// TestLongValuesClipped: a string attribute and a status description are
// written cut to maxValueBytes, at a character boundary (a client's 3.5 MB
// model name echoed in an error must not make the batch too big for the
// collector), and a batch is sent once its spans reach maxBatchBytes.
func TestLongValuesClipped(t *testing.T) {
	p, sent := testProvider(t, 1, 0)
	tr := p.Tracer(Instrumentation)
	huge := strings.Repeat("é", 2<<20) // 2 bytes each: the cut falls inside one
	for range 8 {
		_, s := tr.Start(context.Background(), "s")
		attrs := make([]attribute.KeyValue, 100)
		for i := range attrs {
			attrs[i] = attribute.String(fmt.Sprint("a", i), huge)
		}
		s.SetAttributes(attrs...)
		s.SetStatus(codes.Error, huge)
		s.End()
	}
	if err := p.q.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exportedSpans(t, sent)
	if len(spans) != 8 {
		t.Fatalf("exported %d spans, want 8", len(spans))
	}
	for _, s := range spans {
		v := s.Attributes[0].Value.GetStringValue()
		if d := s.Status.Message; len(v) > maxValueBytes || len(v) < maxValueBytes-1 || !utf8.ValidString(v) ||
			len(d) > maxValueBytes || !utf8.ValidString(d) {
			t.Fatalf("value of %d bytes (valid UTF-8 %v), description of %d: want each cut to %d", len(v), utf8.ValidString(v), len(d), maxValueBytes)
		}
	}
	// 8 spans of 100 × 4 KB: 400 KB each; a request once 2 MB are reached.
	if len(sent.sent) < 2 {
		t.Errorf("8 spans of 400 KB went in %d request(s), want one per %d bytes", len(sent.sent), maxBatchBytes)
	}
	for _, req := range sent.sent {
		if n := len(req); n > maxBatchBytes+512<<10 { // a request's one resource's bytes
			t.Errorf("a request of %d bytes", n)
		}
	}
}

// TestQueueBoundDuringExport: while a batch is being sent, the queue
// takes at most its bound of new spans (the SDK's processor's rule), not
// its bound again on top of batches taken for export but not yet sent; and
// the spans it dropped are logged.
func TestQueueBoundDuringExport(t *testing.T) {
	sent := &blockingCapture{release: make(chan struct{})}
	var logged testbin.Buffer
	q, p := idleQueue(t, sent, 8, 4, slog.New(slog.NewTextHandler(&logged, nil)))
	tr := p.Tracer("t")
	end := func(n int) {
		for range n {
			_, s := tr.Start(context.Background(), "s")
			s.End()
		}
	}
	end(8) // two full batches
	done := make(chan struct{})
	go func() { q.flush(); close(done) }()
	if state, ok := testbin.WaitUntil(5*time.Second, func() (bool, string) {
		n := sent.uploads()
		return n == 1, fmt.Sprint(n, " uploads started")
	}); !ok {
		t.Fatalf("no export started: %s", state)
	}
	end(20)
	q.mu.Lock()
	queued, dropped := q.queued(), q.dropped
	q.mu.Unlock()
	if queued != 8 || dropped != 16 {
		t.Errorf("with one batch of 4 being sent and 4 spans waiting: queued %d, dropped %d; want 8 and 16", queued, dropped)
	}
	close(sent.release)
	<-done
	if out := logged.String(); !strings.Contains(out, "spans dropped") || !strings.Contains(out, "dropped=16") {
		t.Errorf("log:\n%s\nwant the 16 dropped spans named", out)
	}
	before := logged.String()
	q.flush()
	if logged.String() != before {
		t.Errorf("a flush with no new drop logged again:\n%s", logged.String())
	}
}

// hookClient is a capture that calls hook at each upload.
type hookClient struct {
	capture
	hook func()
}

func (h *hookClient) UploadTraces(ctx context.Context, rs []*tracepb.ResourceSpans) error {
	h.hook()
	return h.capture.UploadTraces(ctx, rs)
}

// TestFlushTakesThePartialBatchOnce: a flush sends the full batches and
// the one being filled, once: spans that keep ending while it sends wait
// for the next flush instead of going out a few at a time for as long as
// they come.
func TestFlushTakesThePartialBatchOnce(t *testing.T) {
	var p *provider
	uploads := 0
	client := &hookClient{hook: func() {
		uploads++
		if uploads < 50 { // a span ends during each export
			_, s := p.Tracer("t").Start(context.Background(), "during")
			s.End()
		}
	}}
	var q *queue
	q, p = idleQueue(t, client, 100, 4, nil)
	for range 6 { // a full batch and 2 spans
		_, s := p.Tracer("t").Start(context.Background(), "before")
		s.End()
	}
	q.flush()
	if uploads != 2 {
		t.Errorf("the flush sent %d requests, want 2: the full batch and the partial one", uploads)
	}
	// The span that ended during the first export went with the partial
	// batch; the one that ended during the second waits.
	if n := q.queued(); n != 1 {
		t.Errorf("%d spans left for the next flush, want 1", n)
	}
}

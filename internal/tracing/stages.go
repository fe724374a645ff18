package tracing

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Stage is a child span known whole when its parent ends: a stage of a
// worker's leg, made from the times the request's lifecycle recorded.
type Stage struct {
	// Name is the span's name.
	Name string
	// Start and End bound it.
	Start, End time.Time
	// Link, if valid, is a span it is linked to, with LinkAttrs.
	Link      trace.SpanContext
	LinkAttrs []attribute.KeyValue
}

// StageRecorder ends a span with its stages as child spans: the providers
// of New, which write the stages into the OTLP batch with their parent
// when it is exported (no span object of the SDK per stage: they cost a
// few hundred bytes of protobuf each), keeping or dropping them with it.
type StageRecorder interface {
	EndWithStages(span trace.Span, end time.Time, stages []Stage)
}

// EndWithStages ends span at end with stages as its children: through tp's
// StageRecorder when it has one (New's providers), else as spans started
// and ended by tp's tracer tr (any other provider: a test's in-memory
// one). The child spans' kind is internal.
func EndWithStages(tp trace.TracerProvider, tr trace.Tracer, span trace.Span, end time.Time, stages []Stage) {
	if r, ok := tp.(StageRecorder); ok {
		r.EndWithStages(span, end, stages)
		return
	}
	if span.IsRecording() {
		ctx := trace.ContextWithSpan(context.Background(), span)
		for _, st := range stages {
			opts := []trace.SpanStartOption{trace.WithTimestamp(st.Start)}
			if st.Link.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: st.Link, Attributes: st.LinkAttrs}))
			}
			_, s := tr.Start(ctx, st.Name, opts...)
			s.End(trace.WithTimestamp(st.End))
		}
	}
	span.End(trace.WithTimestamp(end))
}

// EndWithStages implements StageRecorder. Off, it ends span.
func (p Provider) EndWithStages(span trace.Span, end time.Time, stages []Stage) {
	if p.stages != nil && len(stages) > 0 && span.IsRecording() {
		p.stages.hold(span.SpanContext().SpanID(), stages)
	}
	span.End(trace.WithTimestamp(end))
}

// stageProcessor is the span processor that gives a span ended with
// stages (Provider.EndWithStages) its stages on the way to next: the span
// goes on as a spanWithStages, which the exporter writes with a child span
// per stage.
type stageProcessor struct {
	next sdktrace.SpanProcessor
	mu   sync.Mutex
	held map[trace.SpanID][]Stage // spans being ended with stages
}

func newStageProcessor(next sdktrace.SpanProcessor) *stageProcessor {
	return &stageProcessor{next: next, held: map[trace.SpanID][]Stage{}}
}

// hold keeps stages for span id's end.
func (p *stageProcessor) hold(id trace.SpanID, stages []Stage) {
	p.mu.Lock()
	p.held[id] = stages
	p.mu.Unlock()
}

// OnStart implements sdktrace.SpanProcessor.
func (p *stageProcessor) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) {
	p.next.OnStart(parent, s)
}

// OnEnd implements sdktrace.SpanProcessor.
func (p *stageProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	id := s.SpanContext().SpanID()
	p.mu.Lock()
	stages, ok := p.held[id]
	if ok {
		delete(p.held, id)
	}
	p.mu.Unlock()
	if ok {
		s = spanWithStages{ReadOnlySpan: s, stages: stages}
	}
	p.next.OnEnd(s)
}

// Shutdown implements sdktrace.SpanProcessor.
func (p *stageProcessor) Shutdown(ctx context.Context) error { return p.next.Shutdown(ctx) }

// ForceFlush implements sdktrace.SpanProcessor.
func (p *stageProcessor) ForceFlush(ctx context.Context) error { return p.next.ForceFlush(ctx) }

// spanWithStages is an ended span and its stages.
type spanWithStages struct {
	sdktrace.ReadOnlySpan
	stages []Stage
}

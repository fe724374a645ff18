package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
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
// of New, whose exporter writes the stages into the OTLP batch with their
// parent (no span object per stage: they cost a few hundred bytes of
// protobuf each), keeping or dropping them with it. It does not keep the
// stages slice once EndWithStages returns.
type StageRecorder interface {
	EndWithStages(span trace.Span, end time.Time, stages []Stage)
}

// EndWithStages ends span at end with stages as its children: through tp's
// StageRecorder when it has one (New's providers), else as spans started
// and ended by tp's tracer tr (any other provider: a test's in-memory
// one). The child spans' kind is internal. stages is not kept: the caller
// may reuse it once EndWithStages returns.
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

// EndWithStages implements StageRecorder. A span of another provider is
// only ended.
func (p Provider) EndWithStages(sp trace.Span, end time.Time, stages []Stage) {
	if s, ok := sp.(*span); ok && len(stages) > 0 {
		s.endWithStages(end, stages)
		return
	}
	sp.End(trace.WithTimestamp(end))
}

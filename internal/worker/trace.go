package worker

import (
	"context"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/tracing"
)

// tracerOf is the worker's tracer of tp (nil: tracing off).
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracing.Instrumentation)
}

// Traced reports whether the worker traces its requests (Config.Tracer).
func (w *Worker) Traced() bool { return w.tracer != nil }

// legSpan starts the span of a leg that arrived at start (nil when tracing
// is off): a child of the router's attempt, whose context the leg's
// traceparent carries.
func (w *Worker) legSpan(r *http.Request, q *lifecycle.Request, start time.Time) trace.Span {
	if w.tracer == nil {
		return nil
	}
	ctx := tracing.Propagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return w.startSpan(ctx, w.role.String()+".leg", q, start)
}

// startSpan starts the span name of request q, which arrived at start, a
// child of ctx's span.
func (w *Worker) startSpan(ctx context.Context, name string, q *lifecycle.Request, start time.Time) trace.Span {
	attrs := []attribute.KeyValue{attribute.String("pdserve.rid", q.RID), attribute.Int("gen_ai.usage.input_tokens", len(q.InputIDs)),
		attribute.Int("pdserve.continued_tokens", q.Continued)}
	if !q.Room.IsZero() {
		attrs = append(attrs, attribute.String("pdserve.room", q.Room.String()), attribute.Int("pdserve.gen", int(q.Gen)))
	}
	if q.PeerAddr != "" {
		attrs = append(attrs, attribute.String("pdserve.peer", q.PeerAddr))
	}
	if q.Gen > 1 || q.Continued > 0 {
		attrs = append(attrs, tracing.AttrKeep.Bool(true)) // a retry or a continuation: always exported
	}
	if parent := trace.SpanContextFromContext(ctx); parent.IsValid() && !q.Room.IsZero() && w.role == lifecycle.RolePrefill {
		// Decode links its KV hop to this leg by this id.
		ctx = tracing.WithSpanID(ctx, tracing.LegSpanID(parent.TraceID(), q.Room.String(), q.Gen, lifecycle.RolePrefill.String()))
	}
	_, span := w.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start),
		trace.WithAttributes(attrs...))
	return span
}

// endLegSpan ends a leg's span with its request's end fin (nil: the
// router hung up first), and gives it a child span per stage the request
// went through, each as long as the request spent in it (summed over its
// visits), laid end to end in the role's stage order up to the end. On
// decode, awaiting_kv is the KV hop: the transfer of the prompt's KV from
// the prefill worker (pdserve.peer).
func (w *Worker) endLegSpan(span trace.Span, q *lifecycle.Request, fin *lifecycle.Finalize) {
	if span == nil {
		return
	}
	end := w.clock.Now()
	if fin == nil {
		span.SetAttributes(attribute.String("pdserve.outcome", outcome.AbortedClient.String()))
		span.SetStatus(codes.Error, "the router hung up the leg")
		span.End(trace.WithTimestamp(end))
		return
	}
	span.SetAttributes(attribute.String("pdserve.outcome", fin.Outcome.String()),
		attribute.Int("gen_ai.usage.output_tokens", fin.OutputTokens), attribute.Int("pdserve.cached_tokens", fin.CachedTokens))
	if fin.FinishReason != "" {
		span.SetAttributes(attribute.StringSlice("gen_ai.response.finish_reasons", []string{fin.FinishReason}))
	}
	if fin.SentPages > 0 {
		span.SetAttributes(attribute.Int("pdserve.kv_pages_sent", fin.SentPages))
	}
	if fin.Outcome != outcome.OK {
		cause := fin.Cause
		if !cause.Known() {
			// Refused at arrival, or ended by no named cause: its own.
			cause = outcome.Cause{Outcome: fin.Outcome, Role: w.role.String(), Stage: "arrival"}
			for _, st := range w.role.Stages() {
				if fin.StageTime[st] > 0 {
					cause.Stage = st.String()
				}
			}
		}
		span.SetAttributes(attribute.String("pdserve.cause.outcome", cause.Outcome.String()),
			attribute.String("pdserve.cause.role", cause.Role))
		if cause.Stage != "" {
			span.SetAttributes(attribute.String("pdserve.cause.stage", cause.Stage))
		}
		span.SetStatus(codes.Error, fin.Err)
	}
	ctx := trace.ContextWithSpan(context.Background(), span)
	at := end
	stages := slices.Clone(w.role.Stages())
	slices.Reverse(stages)
	for _, st := range stages {
		d := fin.StageTime[st]
		if d <= 0 {
			continue
		}
		name := w.role.String() + " " + st.String()
		opts := []trace.SpanStartOption{trace.WithTimestamp(at.Add(-d)), trace.WithAttributes(attribute.String("pdserve.stage", st.String()))}
		if w.role == lifecycle.RoleDecode && st == lifecycle.StageAwaitingKV {
			// The KV hop, linked to the prefill leg that sent the KV.
			name = "kv transfer"
			tid := span.SpanContext().TraceID()
			peer := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, Remote: true, TraceFlags: trace.FlagsSampled,
				SpanID: tracing.LegSpanID(tid, q.Room.String(), q.Gen, lifecycle.RolePrefill.String())})
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: peer,
				Attributes: []attribute.KeyValue{attribute.String("pdserve.link", "prefill leg that sent the KV")}}))
		}
		_, s := w.tracer.Start(ctx, name, opts...)
		s.End(trace.WithTimestamp(at))
		at = at.Add(-d)
	}
	span.End(trace.WithTimestamp(end))
}

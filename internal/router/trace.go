package router

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/tracing"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Span attributes of pdserve's own (the GenAI semantic conventions'
// gen_ai.* names are used where one fits).
const (
	attrOutcome   = tracing.AttrOutcome
	attrRID       = tracing.AttrRID
	attrRoom      = tracing.AttrRoom
	attrGen       = tracing.AttrGen
	attrPrefill   = attribute.Key("pdserve.prefill")
	attrDecode    = attribute.Key("pdserve.decode")
	attrWorker    = attribute.Key("pdserve.worker")
	attrContinued = tracing.AttrContinued

	attrModel        = tracing.AttrModel
	attrInputTokens  = tracing.AttrInputTokens
	attrOutputTokens = tracing.AttrOutputTokens
	attrMaxTokens    = attribute.Key("gen_ai.request.max_tokens")
	attrChoices      = attribute.Key("gen_ai.request.choice.count")
	attrTTFT         = attribute.Key("gen_ai.latency.time_to_first_token")
	attrE2E          = attribute.Key("gen_ai.latency.e2e")
)

// requestSpan starts the router's span of request g (a child of the
// client's traceparent, which ctx carries), or returns ctx and nil when
// tracing is off. A span the sampler does not record gets no attributes.
func (r *Router) requestSpan(ctx context.Context, g *openai.GenerateRequest, arrived time.Time) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	ctx, span := tracing.Start(ctx, r.tracer, "router.request", tracing.SpanStart{Kind: trace.SpanKindServer, Time: arrived})
	if span.IsRecording() {
		tracing.SetAttributes(span, attrRID.String(g.RID), attrModel.String(r.cfg.ModelName), attrInputTokens.Int(len(g.InputIDs)),
			attrMaxTokens.Int(g.MaxTokens), attrChoices.Int(max(g.N, 1)))
	}
	return ctx, span
}

// attemptSpan starts the span of one attempt of the request whose context
// is ctx on workers (prefill, decode; decode nil in plain mode), and returns
// the context its legs carry (their traceparent): base with the span.
func (r *Router) attemptSpan(ctx context.Context, base context.Context, gen uint32, room string, continued int,
	pw, dw *fleet.Worker) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if r.tracer == nil || !parent.SpanContext().IsValid() {
		return base, nil
	}
	// Started from the request's span context: the context Start would
	// return is not the one the legs carry (base is).
	span := tracing.StartChild(r.tracer, parent.SpanContext(), "router.attempt", tracing.SpanStart{Kind: trace.SpanKindClient})
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 6) // on the stack: tracing.SetAttributes copies them
		attrs = append(attrs, attrGen.Int(int(gen)))
		if continued > 0 {
			attrs = append(attrs, attrContinued.Int(continued))
		}
		if gen > 1 || continued > 0 {
			// A retry or a continuation: the trace is kept whatever the
			// sampling ratio (tracing.AttrKeep), the request's span too.
			attrs = append(attrs, tracing.AttrKeep.Bool(true))
			tracing.SetAttributes(parent, tracing.AttrKeep.Bool(true))
		}
		if room != "" {
			attrs = append(attrs, attrRoom.String(room))
		}
		if dw != nil {
			attrs = append(attrs, attrPrefill.String(pw.URL()), attrDecode.String(dw.URL()))
		} else {
			attrs = append(attrs, attrWorker.String(pw.URL()))
		}
		tracing.SetAttributes(span, attrs...)
	}
	return trace.ContextWithSpan(base, span), span
}

// endSpan ends span (nil: tracing off) with o and the attributes extra,
// and err's message as its status when o is not OK.
func endSpan(span trace.Span, o outcome.Outcome, msg string, extra ...attribute.KeyValue) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		var buf [4]attribute.KeyValue // on the stack: tracing.SetAttributes copies them
		tracing.SetAttributes(span, append(append(buf[:0], extra...), attrOutcome.String(o.String()))...)
		if o != outcome.OK && o != outcome.None {
			span.SetStatus(codes.Error, msg)
		}
	}
	span.End()
}

// injectTrace puts the trace context of ctx (an attempt's) into a leg's
// headers as traceparent; nothing when ctx has none.
func injectTrace(ctx context.Context, h http.Header) {
	tracing.InjectHeader(trace.SpanContextFromContext(ctx), h)
}

// spanCause is the first failure a failed request's span names: e's first
// cause, or, when no side named one (an aborted_peer echo whose root never
// came), e's own outcome on the side whose leg answered with it.
func spanCause(e *workerapi.Error, role workerapi.Role) outcome.Cause {
	if c := e.FirstCause(role); c.Known() {
		return c
	}
	return outcome.Cause{Outcome: e.Outcome, Role: role.String(), Detail: e.Message}
}

// failedSpan names on the request's span (ctx's) the first failure of a
// request that failed: its outcome, the side (role) and the stage where it
// happened — the worker's stage when the cause names it, else the router's
// stage of the request then ("router legs", "router streaming") — and its
// detail as the span's status.
func failedSpan(ctx context.Context, cause outcome.Cause, routerStage string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() || cause.Outcome == outcome.None {
		return
	}
	stage := cause.Stage
	if stage == "" {
		stage = "router " + routerStage
	}
	tracing.SetAttributes(span, tracing.AttrCauseOutcome.String(cause.Outcome.String()),
		tracing.AttrCauseRole.String(cause.Role), tracing.AttrCauseStage.String(stage))
	span.SetStatus(codes.Error, cause.Detail)
}

// refusedSpan is openai.Config.OnRefuse: a request the front end refuses
// before the router takes it (a bad header or body, an early 429) is a
// router.request span too, in the client's trace, its outcome the answer's
// code (rejected_invalid when it names none) and its cause the router's
// front end.
func (r *Router) refusedSpan(ctx context.Context, rid string, received time.Time, e *openai.Error) {
	o, ok := outcome.Parse(e.Code)
	if !ok {
		o = outcome.RejectedInvalid
		if e.Status >= 500 {
			o = outcome.FailedInternal
		}
	}
	ctx, span := r.tracer.Start(ctx, "router.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(received),
		trace.WithAttributes(attrRID.String(rid), attrModel.String(r.cfg.ModelName),
			attribute.Int("http.response.status_code", e.Status)))
	failedSpan(ctx, outcome.Cause{Outcome: o, Role: "router", Stage: "front end", Detail: e.Message}, "")
	endSpan(span, o, e.Message)
}

package worker

import (
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/tracing"
)

// Span attributes of a worker's spans (the GenAI semantic conventions'
// gen_ai.* names where one fits).
const (
	attrRID           = tracing.AttrRID
	attrInputTokens   = tracing.AttrInputTokens
	attrOutputTokens  = tracing.AttrOutputTokens
	attrFinishReasons = attribute.Key("gen_ai.response.finish_reasons")
	attrModel         = tracing.AttrModel
	attrContinued     = tracing.AttrContinued
	attrRoom          = tracing.AttrRoom
	attrGen           = tracing.AttrGen
	attrPeer          = attribute.Key("pdserve.peer")
	attrOutcome       = tracing.AttrOutcome
	attrCached        = attribute.Key("pdserve.cached_tokens")
	attrPagesSent     = attribute.Key("pdserve.kv_pages_sent")
	attrCauseOutcome  = tracing.AttrCauseOutcome
	attrCauseRole     = tracing.AttrCauseRole
	attrCauseStage    = tracing.AttrCauseStage
	// maxLegAttrs bounds the attributes of a leg's span (those above).
	maxLegAttrs = 16
)

// legTracer is a worker's tracing: its tracer, and what its spans share,
// made once: the leg span's name, and for each stage of its role (last
// first, the order the stage spans are laid out from the leg's end) the
// stage span's name.
type legTracer struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
	role     lifecycle.Role
	legName  string
	stages   []stageSpan
	// stageLists holds the stage lists a leg's span is ended with
	// (*[]tracing.Stage; EndWithStages does not keep them).
	stageLists sync.Pool
	// linkAttrs are the KV hop's link's.
	linkAttrs []attribute.KeyValue
}

// stageSpan is the span of one stage of a leg: "<role> <stage>", or on
// decode "kv transfer" for awaiting_kv (the KV hop).
type stageSpan struct {
	stage lifecycle.Stage
	name  string
	kvHop bool
}

// newLegTracer is the worker's tracing with tp (nil: off).
func newLegTracer(tp trace.TracerProvider, role lifecycle.Role) *legTracer {
	if tp == nil {
		return nil
	}
	t := &legTracer{provider: tp, tracer: tp.Tracer(tracing.Instrumentation), role: role, legName: role.String() + ".leg",
		linkAttrs: []attribute.KeyValue{attribute.String("pdserve.link", "prefill leg that sent the KV")}}
	t.stageLists.New = func() any { s := make([]tracing.Stage, 0, len(role.Stages())); return &s }
	stages := role.Stages()
	for i := len(stages) - 1; i >= 0; i-- {
		st := stageSpan{stage: stages[i], name: role.String() + " " + stages[i].String()}
		if role == lifecycle.RoleDecode && stages[i] == lifecycle.StageAwaitingKV {
			st.name, st.kvHop = "kv transfer", true
		}
		t.stages = append(t.stages, st)
	}
	return t
}

// Traced reports whether the worker traces its requests (Config.Tracer).
func (w *Worker) Traced() bool { return w.tracer != nil }

// legTrace is what a leg's span is made of at the leg's end, when all of
// it is known: its parent's context and its arrival. The zero value:
// tracing off.
type legTrace struct {
	on     bool
	parent trace.SpanContext
	start  time.Time
}

// legSpan notes a leg that arrived at start, a child of the router's
// attempt, whose context the leg's traceparent carries (the zero legTrace
// when tracing is off).
func (w *Worker) legSpan(r *http.Request, start time.Time) legTrace {
	if w.tracer == nil {
		return legTrace{}
	}
	return legTrace{on: true, parent: tracing.ExtractHeader(r.Header), start: start}
}

// endLegSpan makes the span of leg lt of request q, whose end is fin (nil:
// the router hung up first) and whose output wt brought (its choices'
// finish reasons; nil: a prefill leg, no output), named name ("" for the
// role's leg): a child of lt's parent, from its arrival to now, with a
// child span per stage the request went through, each as long as the
// request spent in it (summed over its visits), laid end to end in the
// role's stage order up to the end (tracing.EndWithStages: with New's
// providers the stages are written with the span, not made as spans). On
// decode, awaiting_kv is the KV hop: the transfer of the prompt's KV from
// the prefill worker (pdserve.peer), linked to the prefill leg that sent
// it. A span its
// sampler does not record costs no more than its start and end.
func (w *Worker) endLegSpan(lt legTrace, name string, q *lifecycle.Request, fin *lifecycle.Finalize, wt *waiter) {
	t := w.tracer
	if t == nil || !lt.on {
		return
	}
	end := w.clock.Now()
	if name == "" {
		name = t.legName
	}
	room := q.Room.String() // once: hex, an allocation
	o := tracing.SpanStart{Kind: trace.SpanKindServer, Time: lt.start}
	if parent := lt.parent; parent.IsValid() && !q.Room.IsZero() && t.role == lifecycle.RolePrefill {
		// Decode links its KV hop to this leg by this id.
		o.ID = tracing.LegSpanID(parent.TraceID(), room, q.Gen, lifecycle.RolePrefill.String())
	}
	span := tracing.StartChild(t.tracer, lt.parent, name, o)
	if !span.IsRecording() {
		span.End(trace.WithTimestamp(end))
		return
	}
	var buf [maxLegAttrs]attribute.KeyValue // on the stack: tracing.SetAttributes copies them
	attrs := append(buf[:0], attrRID.String(q.RID), attrInputTokens.Int(len(q.InputIDs)))
	if q.Continued > 0 {
		attrs = append(attrs, attrContinued.Int(q.Continued))
	}
	if !q.Room.IsZero() {
		attrs = append(attrs, attrRoom.String(room), attrGen.Int(int(q.Gen)))
	}
	if q.PeerAddr != "" {
		attrs = append(attrs, attrPeer.String(q.PeerAddr))
	}
	if q.Gen > 1 || q.Continued > 0 {
		attrs = append(attrs, tracing.AttrKeep.Bool(true)) // a retry or a continuation: always exported
	}
	if name != t.legName {
		attrs = append(attrs, attrModel.String(w.info.Name))
	}
	if fin == nil {
		attrs = append(attrs, attrOutcome.String(outcome.AbortedClient.String()))
		tracing.SetAttributes(span, attrs...)
		span.SetStatus(codes.Error, "the router hung up the leg")
		span.End(trace.WithTimestamp(end))
		return
	}
	attrs = append(attrs, attrOutcome.String(fin.Outcome.String()), attrOutputTokens.Int(fin.OutputTokens),
		attrCached.Int(fin.CachedTokens))
	if wt != nil {
		if reasons := wt.finishReasons(fin, q.N); len(reasons) > 0 {
			attrs = append(attrs, attrFinishReasons.StringSlice(reasons))
		}
	}
	if fin.SentPages > 0 {
		attrs = append(attrs, attrPagesSent.Int(fin.SentPages))
	}
	if fin.Outcome != outcome.OK {
		cause := fin.Cause
		if !cause.Known() {
			// Refused at arrival, or ended by no named cause: its own.
			cause = outcome.Cause{Outcome: fin.Outcome, Role: t.role.String(), Stage: "arrival"}
			for _, st := range t.role.Stages() {
				if fin.StageTime[st] > 0 {
					cause.Stage = st.String()
				}
			}
		}
		attrs = append(attrs, attrCauseOutcome.String(cause.Outcome.String()), attrCauseRole.String(cause.Role))
		if cause.Stage != "" {
			attrs = append(attrs, attrCauseStage.String(cause.Stage))
		}
		span.SetStatus(codes.Error, fin.Err)
	}
	tracing.SetAttributes(span, attrs...)
	sp := t.stageLists.Get().(*[]tracing.Stage)
	stages := (*sp)[:0]
	at := end
	for _, st := range t.stages {
		d := fin.StageTime[st.stage]
		if d <= 0 {
			continue
		}
		s := tracing.Stage{Name: st.name, Start: at.Add(-d), End: at}
		if st.kvHop {
			// The KV hop, linked to the prefill leg that sent the KV.
			tid := span.SpanContext().TraceID()
			s.Link = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, Remote: true, TraceFlags: trace.FlagsSampled,
				SpanID: tracing.LegSpanID(tid, room, q.Gen, lifecycle.RolePrefill.String())})
			s.LinkAttrs = t.linkAttrs
		}
		stages = append(stages, s)
		at = s.Start
	}
	tracing.EndWithStages(t.provider, t.tracer, span, end, stages)
	clear(stages) // no span context or name kept alive
	*sp = stages[:0]
	t.stageLists.Put(sp)
}

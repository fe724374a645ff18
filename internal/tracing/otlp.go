package tracing

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// exporter is an OTLP span exporter that writes the protobuf encoding of
// the spans itself, straight from the spans into reused buffers (encoded:
// New's queue writes each span as it ends), and hands it to the OTLP client (HTTP or gRPC, with everything the
// OTEL_EXPORTER_OTLP_* variables configure: headers, timeout, TLS,
// compression, retries) as the unknown fields of an otherwise empty
// ResourceSpans, which the client's marshalling copies verbatim. The SDK's
// own exporter builds a tree of protobuf structs per batch and marshals it
// by reflection: on a PD request's 13 spans that was most of what tracing
// cost (docs/performance.md, "Tracing overhead").
type exporter struct {
	client otlptrace.Client
	stop   sync.Once

	// mu guards bufs, the buffers send writes the request in.
	mu   sync.Mutex
	bufs [][]byte
}

// encodable is what the exporter reads of an ended span: the methods of
// the SDK's sdktrace.ReadOnlySpan it uses, which New's spans have too, and
// the attributes: an SDK span's Attributes(), New's spans' written as they
// were set (encodedAttributes). A span that also has stageList() (New's
// spans ended with stages) is written with a child span per stage.
type encodable interface {
	SpanContext() trace.SpanContext
	Parent() trace.SpanContext
	Name() string
	SpanKind() trace.SpanKind
	StartTime() time.Time
	EndTime() time.Time
	DroppedAttributes() int
	Events() []sdktrace.Event
	DroppedEvents() int
	Links() []sdktrace.Link
	DroppedLinks() int
	Status() sdktrace.Status
	Resource() *resource.Resource
	InstrumentationScope() instrumentation.Scope
}

// staged is a span ended with stages.
type staged interface{ stageList() []Stage }

// encoded is ended spans written as OTLP Span messages, grouped by
// resource and scope as OTLP nests them: the groups of one resource next
// to each other, each group's spans and the groups in the order they
// came. New's queue writes each span as it ends, while its fields are
// still in the cache and so that the span is garbage at once (a queue of
// span objects kept hundreds of them alive for the collector to scan).
type encoded struct {
	groups []encGroup
	spans  int // spans added (stages not counted)
}

// encGroup is the spans of one resource and scope.
type encGroup struct {
	res   *resource.Resource
	scope instrumentation.Scope
	// tr is the tracer whose spans are this group's, when they are New's:
	// a span finds its group by its tracer, without comparing scopes.
	tr *tracer
	// b is the group's ScopeSpans.spans fields (empty: no span since the
	// last reset).
	b []byte
}

// add writes s, and its stages as its child spans when it has them.
func (e *encoded) add(s encodable) {
	g := e.group(s)
	g.b = appendSpan(g.b, s)
	if ws, ok := s.(staged); ok {
		for _, st := range ws.stageList() {
			g.b = appendStage(g.b, s, st)
		}
	}
	e.spans++
}

// group is s's group, made if it has none: after the last one of its
// resource.
func (e *encoded) group(s encodable) *encGroup {
	own, _ := s.(*span)
	if own != nil {
		for i := range e.groups {
			if e.groups[i].tr == own.t {
				return &e.groups[i]
			}
		}
	}
	res, scope := s.Resource(), s.InstrumentationScope()
	at := len(e.groups)
	for i := range e.groups {
		g := &e.groups[i]
		if !sameResource(g.res, res) {
			continue
		}
		if g.tr == nil && own == nil && sameScope(g.scope, scope) {
			return g
		}
		at = i + 1
	}
	ng := encGroup{res: res, scope: scope}
	if own != nil {
		ng.tr = own.t
	}
	e.groups = slices.Insert(e.groups, at, ng)
	return &e.groups[at]
}

// maxKeptBuffer bounds the capacity of a buffer kept for the next batch:
// one that grew past it (spans with very large attributes) goes.
const maxKeptBuffer = 4 << 20

// reset empties e, keeping its groups' buffers for the next spans (but
// one grown past maxKeptBuffer).
func (e *encoded) reset() {
	for i := range e.groups {
		if cap(e.groups[i].b) > maxKeptBuffer {
			e.groups[i].b = nil
		} else {
			e.groups[i].b = e.groups[i].b[:0]
		}
	}
	e.spans = 0
}

// newExporter returns an exporter sending over client, started.
func newExporter(ctx context.Context, client otlptrace.Client) (*exporter, error) {
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	return &exporter{client: client}, nil
}

// send sends the spans of enc as one OTLP request (none when it holds
// none).
func (e *exporter) send(ctx context.Context, enc *encoded) error {
	if enc.spans == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var rs []*tracepb.ResourceSpans
	gs := enc.groups
	for i := 0; i < len(gs); {
		j := i + 1
		for j < len(gs) && sameResource(gs[j].res, gs[i].res) {
			j++
		}
		run := gs[i:j]
		i = j
		if !slices.ContainsFunc(run, func(g encGroup) bool { return len(g.b) > 0 }) {
			continue
		}
		if len(rs) == len(e.bufs) {
			e.bufs = append(e.bufs, nil)
		}
		b := appendResourceSpans(e.bufs[len(rs)][:0], run)
		e.bufs[len(rs)] = b
		m := &tracepb.ResourceSpans{}
		m.ProtoReflect().SetUnknown(protoreflect.RawFields(b))
		rs = append(rs, m)
	}
	err := e.client.UploadTraces(ctx, rs)
	for i, b := range e.bufs {
		if cap(b) > maxKeptBuffer {
			e.bufs[i] = nil
		}
	}
	if err != nil {
		return fmt.Errorf("traces export: %w", err)
	}
	return nil
}

// Shutdown stops the client, once.
func (e *exporter) Shutdown(ctx context.Context) error {
	err := context.Cause(ctx)
	e.stop.Do(func() { err = e.client.Stop(ctx) })
	return err
}

func sameResource(a, b *resource.Resource) bool {
	return a == b || (a != nil && b != nil && a.Equivalent() == b.Equivalent())
}

func sameScope(a, b instrumentation.Scope) bool {
	return a.Name == b.Name && a.Version == b.Version && a.SchemaURL == b.SchemaURL && a.Attributes.Equals(&b.Attributes)
}

// The field numbers of the OTLP messages written here
// (opentelemetry/proto/trace/v1/trace.proto, common/v1/common.proto and
// resource/v1/resource.proto of github.com/open-telemetry/opentelemetry-proto).
const (
	fResourceSpansResource   = 1
	fResourceSpansScopeSpans = 2
	fResourceSpansSchemaURL  = 3

	fResourceAttributes = 1

	fScopeSpansScope     = 1
	fScopeSpansSpans     = 2
	fScopeSpansSchemaURL = 3

	fScopeName       = 1
	fScopeVersion    = 2
	fScopeAttributes = 3

	fSpanTraceID       = 1
	fSpanSpanID        = 2
	fSpanTraceState    = 3
	fSpanParentSpanID  = 4
	fSpanName          = 5
	fSpanKind          = 6
	fSpanStart         = 7
	fSpanEnd           = 8
	fSpanAttributes    = 9
	fSpanDroppedAttrs  = 10
	fSpanEvents        = 11
	fSpanDroppedEvents = 12
	fSpanLinks         = 13
	fSpanDroppedLinks  = 14
	fSpanStatus        = 15
	fSpanFlags         = 16
	fEventTime         = 1
	fEventName         = 2
	fEventAttributes   = 3
	fEventDroppedAttrs = 4
	fLinkTraceID       = 1
	fLinkSpanID        = 2
	fLinkAttributes    = 4
	fLinkDroppedAttrs  = 5
	fLinkFlags         = 6
	fStatusMessage     = 2
	fStatusCode        = 3
	fKeyValueKey       = 1
	fKeyValueValue     = 2
	fAnyString         = 1
	fAnyBool           = 2
	fAnyInt            = 3
	fAnyDouble         = 4
	fAnyArray          = 5
	fAnyKvlist         = 6
	fAnyBytes          = 7
	fArrayValues       = 1
	fKvlistValues      = 1
	statusCodeOK       = 1
	statusCodeError    = 2
	flagsHasIsRemote   = 0x100 // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
	flagsIsRemote      = 0x200 // SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
	// smallMessage is the longest message whose length takes one varint
	// byte.
	smallMessage = 1<<7 - 1
)

// appendTag appends the tag of field num of wire type typ: one byte for
// the fields under 16 (inlined, where protowire.AppendTag is a call).
func appendTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	if num < 16 {
		return append(b, byte(num)<<3|byte(typ))
	}
	return protowire.AppendTag(b, num, typ)
}

// appendVarint appends v as a varint: one byte under 128 (inlined).
func appendVarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

// beginField starts length-delimited field num of b: its tag and a
// one-byte length placeholder. It returns where the placeholder is, for
// endField.
func beginField(b []byte, num protowire.Number) ([]byte, int) {
	b = appendTag(b, num, protowire.BytesType)
	return append(b, 0), len(b)
}

// endField writes the length of the field beginField started at at, moving its
// contents when the length takes more than one byte.
func endField(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n <= smallMessage {
		b[at] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[at+k:], b[at+1:at+1+n])
	protowire.AppendVarint(b[at:at], uint64(n))
	return b
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, num, protowire.BytesType)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = appendTag(b, num, protowire.BytesType)
	b = appendVarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.VarintType)
	return appendVarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.Fixed64Type)
	return binary.LittleEndian.AppendUint64(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.Fixed32Type)
	return binary.LittleEndian.AppendUint32(b, v)
}

// maxValueBytes bounds a string attribute value and a status description
// as written: the longest error message or request field a span carries
// (a model name a client sent, echoed in the error) is cut to it, so that
// one request cannot make a batch too large for the collector to take
// (gRPC's default 4 MiB) and lose the other requests' spans with it.
const maxValueBytes = 4096

// clip is s cut to maxValueBytes at a UTF-8 character boundary.
func clip(s string) string {
	if len(s) <= maxValueBytes {
		return s
	}
	i := maxValueBytes
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// maxBatchBytes bounds the encoded spans of one export request: a batch
// reaching it is sent before it has OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans,
// so that a request stays under gRPC's default 4 MiB a collector takes.
const maxBatchBytes = 2 << 20

// size is the bytes of e's encoded spans.
func (e *encoded) size() int {
	n := 0
	for i := range e.groups {
		n += len(e.groups[i].b)
	}
	return n
}

// clampCount is a dropped count as OTLP's uint32.
func clampCount(n int) uint64 { return uint64(min(max(n, 0), math.MaxUint32)) }

// unixNano is t in OTLP's fixed64 nanoseconds (0 before 1970).
func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) }

// appendResourceSpans appends the fields of a ResourceSpans holding gs,
// groups of one resource (those with no span left out).
func appendResourceSpans(b []byte, gs []encGroup) []byte {
	res := gs[0].res
	if res != nil {
		var at int
		b, at = beginField(b, fResourceSpansResource)
		for it := res.Iter(); it.Next(); {
			b = appendKeyValue(b, fResourceAttributes, it.Attribute())
		}
		b = endField(b, at)
	}
	for _, g := range gs {
		if len(g.b) > 0 {
			b = appendScopeSpans(b, g)
		}
	}
	if res != nil {
		b = appendString(b, fResourceSpansSchemaURL, res.SchemaURL())
	}
	return b
}

// appendScopeSpans appends g as field ResourceSpans.scope_spans.
func appendScopeSpans(b []byte, g encGroup) []byte {
	b, ss := beginField(b, fResourceSpansScopeSpans)
	if g.scope != (instrumentation.Scope{}) {
		var at int
		b, at = beginField(b, fScopeSpansScope)
		b = appendString(b, fScopeName, g.scope.Name)
		b = appendString(b, fScopeVersion, g.scope.Version)
		for it := g.scope.Attributes.Iter(); it.Next(); {
			b = appendKeyValue(b, fScopeAttributes, it.Attribute())
		}
		b = endField(b, at)
	}
	b = append(b, g.b...)
	b = appendString(b, fScopeSpansSchemaURL, g.scope.SchemaURL)
	return endField(b, ss)
}

// spanFlags is OTLP's flags of a span or link: the W3C trace flags and
// whether its parent (or the linked span) is remote.
func spanFlags(tf trace.TraceFlags, sc trace.SpanContext) uint32 {
	f := uint32(tf) | flagsHasIsRemote
	if sc.IsRemote() {
		f |= flagsIsRemote
	}
	return f
}

// appendSpan appends s as field ScopeSpans.spans.
func appendSpan(b []byte, s encodable) []byte {
	b, at := beginField(b, fScopeSpansSpans)
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	if ts := sc.TraceState(); ts.Len() > 0 {
		b = appendString(b, fSpanTraceState, ts.String())
	}
	parent := s.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, fSpanParentSpanID, psid[:])
	}
	b = appendString(b, fSpanName, s.Name())
	b = appendUint(b, fSpanKind, uint64(otlpKind(s.SpanKind())))
	b = appendFixed64(b, fSpanStart, unixNano(s.StartTime()))
	b = appendFixed64(b, fSpanEnd, unixNano(s.EndTime()))
	switch a := s.(type) {
	case interface{ encodedAttributes() []byte }: // New's spans: written as set
		b = append(b, a.encodedAttributes()...)
	case interface{ Attributes() []attribute.KeyValue }:
		for _, kv := range a.Attributes() {
			b = appendKeyValue(b, fSpanAttributes, kv)
		}
	}
	b = appendUint(b, fSpanDroppedAttrs, clampCount(s.DroppedAttributes()))
	for _, e := range s.Events() {
		var ea int
		b, ea = beginField(b, fSpanEvents)
		b = appendFixed64(b, fEventTime, unixNano(e.Time))
		b = appendString(b, fEventName, e.Name)
		for _, a := range e.Attributes {
			b = appendKeyValue(b, fEventAttributes, a)
		}
		b = appendUint(b, fEventDroppedAttrs, clampCount(e.DroppedAttributeCount))
		b = endField(b, ea)
	}
	b = appendUint(b, fSpanDroppedEvents, clampCount(s.DroppedEvents()))
	for _, l := range s.Links() {
		var la int
		b, la = beginField(b, fSpanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, fLinkTraceID, ltid[:])
		b = appendBytes(b, fLinkSpanID, lsid[:])
		for _, a := range l.Attributes {
			b = appendKeyValue(b, fLinkAttributes, a)
		}
		b = appendUint(b, fLinkDroppedAttrs, clampCount(l.DroppedAttributeCount))
		b = appendFixed32(b, fLinkFlags, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = endField(b, la)
	}
	b = appendUint(b, fSpanDroppedLinks, clampCount(s.DroppedLinks()))
	var st int
	b, st = beginField(b, fSpanStatus) // present even when unset, as the SDK's exporter sends it
	status := s.Status()
	b = appendString(b, fStatusMessage, clip(status.Description))
	switch status.Code {
	case codes.Ok:
		b = appendUint(b, fStatusCode, statusCodeOK)
	case codes.Error:
		b = appendUint(b, fStatusCode, statusCodeError)
	}
	b = endField(b, st)
	b = appendFixed32(b, fSpanFlags, spanFlags(sc.TraceFlags(), parent))
	return endField(b, at)
}

// appendStage appends stage st of span s as a span of its own in
// ScopeSpans.spans: s's child, of kind internal, with a random id.
func appendStage(b []byte, s encodable, st Stage) []byte {
	sc := s.SpanContext()
	sid := randomSpanID()
	if b, ok := appendPlainStage(b, sc, sid, st); ok {
		return b
	}
	return appendStageFields(b, sc, sid, st)
}

// The wire types of the fields appendPlainStage and appendSmallKeyValue
// write byte by byte, each tag (field << 3) | wire type: one byte for the
// fields under 16, two for the span's flags (field 16).
const (
	tagBytes   = byte(protowire.BytesType)
	tagFixed64 = byte(protowire.Fixed64Type)
	tagVarint  = byte(protowire.VarintType)
	tagFixed32 = byte(protowire.Fixed32Type)

	plainStageFixed = 2 + 16 + 2 + 8 + 2 + 8 + 2 + 2 + 1 + 8 + 1 + 8 + 2 + 2 + 4 // its fields but the name's bytes
)

// appendPlainStage appends stage st, of the span of sc, with span id sid,
// as appendStageFields does, byte by byte, when it is the common stage:
// no tracestate, no link, times after 1970, a name (the general path
// leaves an empty one out) and the whole span under 128 bytes (its name
// under 60). false (b as it was) for any other.
func appendPlainStage(b []byte, sc trace.SpanContext, sid trace.SpanID, st Stage) ([]byte, bool) {
	start, end := unixNano(st.Start), unixNano(st.End)
	if sc.TraceState().Len() > 0 || st.Link.IsValid() || start == 0 || end == 0 || st.Name == "" ||
		plainStageFixed+len(st.Name) > smallMessage {
		return b, false
	}
	tid, parent := sc.TraceID(), sc.SpanID()
	b = append(b, fScopeSpansSpans<<3|tagBytes, byte(plainStageFixed+len(st.Name)), fSpanTraceID<<3|tagBytes, 16)
	b = append(b, tid[:]...)
	b = append(b, fSpanSpanID<<3|tagBytes, 8)
	b = append(b, sid[:]...)
	b = append(b, fSpanParentSpanID<<3|tagBytes, 8)
	b = append(b, parent[:]...)
	b = append(b, fSpanName<<3|tagBytes, byte(len(st.Name)))
	b = append(b, st.Name...)
	b = append(b, fSpanKind<<3|tagVarint, byte(trace.SpanKindInternal), fSpanStart<<3|tagFixed64)
	b = binary.LittleEndian.AppendUint64(b, start)
	b = append(b, fSpanEnd<<3|tagFixed64)
	b = binary.LittleEndian.AppendUint64(b, end)
	// The status, empty; the flags (field 16: a two-byte tag).
	b = append(b, fSpanStatus<<3|tagBytes, 0, fSpanFlags<<3&0x7f|tagFixed32|0x80, fSpanFlags>>4)
	return binary.LittleEndian.AppendUint32(b, spanFlags(sc.TraceFlags(), trace.SpanContext{})), true
}

// appendStageFields appends stage st, of the span of sc, with span id
// sid, field by field.
func appendStageFields(b []byte, sc trace.SpanContext, sid trace.SpanID, st Stage) []byte {
	b, at := beginField(b, fScopeSpansSpans)
	tid, parent := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	if ts := sc.TraceState(); ts.Len() > 0 {
		b = appendString(b, fSpanTraceState, ts.String())
	}
	b = appendBytes(b, fSpanParentSpanID, parent[:])
	b = appendString(b, fSpanName, st.Name)
	b = appendUint(b, fSpanKind, uint64(trace.SpanKindInternal))
	b = appendFixed64(b, fSpanStart, unixNano(st.Start))
	b = appendFixed64(b, fSpanEnd, unixNano(st.End))
	if st.Link.IsValid() {
		var la int
		b, la = beginField(b, fSpanLinks)
		ltid, lsid := st.Link.TraceID(), st.Link.SpanID()
		b = appendBytes(b, fLinkTraceID, ltid[:])
		b = appendBytes(b, fLinkSpanID, lsid[:])
		for _, a := range st.LinkAttrs {
			b = appendKeyValue(b, fLinkAttributes, a)
		}
		b = appendFixed32(b, fLinkFlags, spanFlags(st.Link.TraceFlags(), st.Link))
		b = endField(b, la)
	}
	var ss int
	b, ss = beginField(b, fSpanStatus)
	b = endField(b, ss)
	b = appendFixed32(b, fSpanFlags, spanFlags(sc.TraceFlags(), trace.SpanContext{}))
	return endField(b, at)
}

// otlpKind is OTLP's SpanKind of k: the same numbers, unknown ones
// unspecified.
func otlpKind(k trace.SpanKind) trace.SpanKind {
	if k < trace.SpanKindInternal || k > trace.SpanKindConsumer {
		return trace.SpanKindUnspecified
	}
	return k
}

// appendKeyValue appends kv as KeyValue field num.
func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	if out, ok := appendSmallKeyValue(b, num, kv); ok {
		return out
	}
	return appendAnyKeyValue(b, num, kv)
}

// appendAnyKeyValue appends kv, of any value, as KeyValue field num.
func appendAnyKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	b, at := beginField(b, num)
	b = appendString(b, fKeyValueKey, string(kv.Key))
	b, v := beginField(b, fKeyValueValue)
	b = appendAnyValue(b, kv.Value)
	b = endField(b, v)
	return endField(b, at)
}

// appendSmallKeyValue appends kv as KeyValue field num (under 16) as
// appendKeyValue does, byte by byte, when its value is a string, an
// integer, a bool or a float and the whole KeyValue is under 128 bytes
// (its lengths one byte each) and its key not empty (the general path
// leaves an empty key out): the attributes of pdserve's spans. false (b as
// it was) for any other.
func appendSmallKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) ([]byte, bool) {
	key := string(kv.Key)
	var scalar [1 + binary.MaxVarintLen64]byte // AnyValue of a number or bool
	var str string                             // or of a string
	n := 0
	switch kv.Value.Type() {
	case attribute.STRING:
		str = kv.Value.AsString()
		if len(str) > smallMessage {
			return b, false
		}
		n = 2 + len(str)
	case attribute.INT64:
		scalar[0] = fAnyInt<<3 | tagVarint
		n = 1 + binary.PutUvarint(scalar[1:], uint64(kv.Value.AsInt64()))
	case attribute.BOOL:
		scalar[0] = fAnyBool<<3 | tagVarint
		scalar[1] = byte(protowire.EncodeBool(kv.Value.AsBool()))
		n = 2
	case attribute.FLOAT64:
		scalar[0] = fAnyDouble<<3 | tagFixed64
		binary.LittleEndian.PutUint64(scalar[1:], math.Float64bits(kv.Value.AsFloat64()))
		n = 9
	default:
		return b, false
	}
	// KeyValue: key (tag, length, bytes), value (tag, length, AnyValue).
	body := 2 + len(key) + 2 + n
	if num >= 16 || key == "" || body > smallMessage {
		return b, false
	}
	b = append(b, byte(num)<<3|tagBytes, byte(body),
		fKeyValueKey<<3|tagBytes, byte(len(key)))
	b = append(b, key...)
	b = append(b, fKeyValueValue<<3|tagBytes, byte(n))
	if kv.Value.Type() == attribute.STRING {
		b = append(b, fAnyString<<3|tagBytes, byte(len(str)))
		return append(b, str...), true
	}
	return append(b, scalar[:n]...), true
}

// appendAnyValue appends the fields of v's AnyValue. An empty value is an
// AnyValue with no field set; a type this does not know is the string
// "INVALID", as in the SDK's exporter.
func appendAnyValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.EMPTY:
	case attribute.BOOL:
		b = protowire.AppendTag(b, fAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, fAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		// A oneof member: present even when empty.
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, clip(v.AsString()))
	case attribute.BYTESLICE:
		b = appendBytes(b, fAnyBytes, v.AsByteSlice())
	case attribute.BOOLSLICE, attribute.INT64SLICE, attribute.FLOAT64SLICE, attribute.STRINGSLICE, attribute.SLICE:
		var at int
		b, at = beginField(b, fAnyArray)
		b = appendArray(b, v)
		b = endField(b, at)
	case attribute.MAP:
		var at int
		b, at = beginField(b, fAnyKvlist)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, fKvlistValues, kv)
		}
		b = endField(b, at)
	default:
		b = appendString(b, fAnyString, "INVALID")
	}
	return b
}

// appendArray appends the values of slice v as ArrayValue.values.
func appendArray(b []byte, v attribute.Value) []byte {
	elem := func(b []byte, x attribute.Value) []byte {
		b, at := beginField(b, fArrayValues)
		b = appendAnyValue(b, x)
		return endField(b, at)
	}
	switch v.Type() {
	case attribute.BOOLSLICE:
		for _, x := range v.AsBoolSlice() {
			b = elem(b, attribute.BoolValue(x))
		}
	case attribute.INT64SLICE:
		for _, x := range v.AsInt64Slice() {
			b = elem(b, attribute.Int64Value(x))
		}
	case attribute.FLOAT64SLICE:
		for _, x := range v.AsFloat64Slice() {
			b = elem(b, attribute.Float64Value(x))
		}
	case attribute.STRINGSLICE:
		for _, x := range v.AsStringSlice() {
			b = elem(b, attribute.StringValue(x))
		}
	case attribute.SLICE:
		for _, x := range v.AsSlice() {
			b = elem(b, x)
		}
	}
	return b
}

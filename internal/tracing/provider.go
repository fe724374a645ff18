package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"google.golang.org/protobuf/encoding/protowire"
)

// The span limits of New's providers: the OpenTelemetry SDK's defaults
// (sdktrace.SpanLimits, OTEL_SPAN_*_COUNT_LIMIT unset). Past them an
// attribute, event or link is dropped and counted.
const (
	maxSpanAttributes = 128
	maxSpanEvents     = 128
	maxSpanLinks      = 128
)

// provider is the tracer provider New returns: the OpenTelemetry trace
// API over spans of its own, handed at their end straight to the OTLP
// exporter's queue. The SDK's provider keeps a span object of ~2 KB, a
// snapshot copied at its end and a chain of span processors per span:
// with a PD request's spans on three components that was most of what
// tracing still cost (docs/performance.md, "Tracing overhead"). It samples
// as New documents: parent-based at ratio 1 (a span under an unsampled
// parent is not recorded), else every span recorded and the tail sampler
// deciding per trace.
type provider struct {
	embedded.TracerProvider
	res   *resource.Resource
	ratio float64
	slow  time.Duration
	tail  *tailSampler // nil at ratio 1
	q     *queue
	// data is the spanData of the provider's spans, reused once a span
	// was written (span.release).
	data sync.Pool

	mu      sync.Mutex
	tracers map[instrumentation.Scope]*tracer
}

// Tracer implements trace.TracerProvider.
func (p *provider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	c := trace.NewTracerConfig(opts...)
	scope := instrumentation.Scope{Name: name, Version: c.InstrumentationVersion(), SchemaURL: c.SchemaURL(),
		Attributes: c.InstrumentationAttributes()}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tracers[scope]
	if t == nil {
		t = &tracer{p: p, scope: scope}
		p.tracers[scope] = t
	}
	return t
}

// ended takes span s once it ended: to the tail sampler below ratio 1,
// else to the exporter's queue, and then its spanData back to the pool.
func (p *provider) ended(s *span) {
	if p.tail != nil {
		p.tail.onEnd(s)
		return
	}
	p.q.add(s)
	s.release()
}

// tracer is a provider's tracer of one instrumentation scope.
type tracer struct {
	embedded.Tracer
	p     *provider
	scope instrumentation.Scope
}

// Start implements trace.Tracer.
func (t *tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	c := trace.NewSpanStartConfig(opts...)
	var parent trace.SpanContext
	if !c.NewRoot() {
		parent = trace.SpanContextFromContext(ctx)
	}
	var sid trace.SpanID
	if id, ok := ctx.Value(spanIDKey{}).(trace.SpanID); ok {
		sid = id
	}
	sp := t.start(parent, name, trace.ValidateSpanKind(c.SpanKind()), c.Timestamp(), sid)
	if s, ok := sp.(*span); ok {
		s.addAttributes(c.Attributes())
		for _, l := range c.Links() {
			s.addLink(l)
		}
	}
	return trace.ContextWithSpan(ctx, sp), sp
}

// start starts a span named name of kind at start (zero: now), a child of
// parent (invalid: a root), with span id sid (invalid: a random one): a
// *span, or a *quietSpan when the sampler does not record it.
func (t *tracer) start(parent trace.SpanContext, name string, kind trace.SpanKind, start time.Time, sid trace.SpanID) trace.Span {
	var tid trace.TraceID
	if parent.TraceID().IsValid() {
		tid = parent.TraceID()
	} else {
		tid = randomTraceID()
	}
	if !sid.IsValid() {
		sid = randomSpanID()
	}
	// At ratio 1 the sampler is parent-based: no parent or a sampled one.
	sampled := t.p.ratio < 1 || !parent.IsValid() || parent.IsSampled()
	flags := parent.TraceFlags() &^ trace.FlagsSampled
	if sampled {
		flags |= trace.FlagsSampled
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags,
		TraceState: parent.TraceState()})
	if !sampled {
		return &quietSpan{sc: sc, p: t.p}
	}
	d := t.p.spanData()
	d.parent, d.name, d.kind, d.start = parent, name, kind, start
	if d.start.IsZero() {
		d.start = time.Now()
	}
	return &span{t: t, sc: sc, spanData: d}
}

// span is a recorded span of a provider: what its callers hold (its
// context, whether it ended), and its spanData, what it records. Its
// fields change only under mu until End; then the exporter reads them (the
// queue's lock orders the two) and every setter is a no-op. Once written
// into the exporter's batch (or dropped) its spanData goes back to the
// provider's pool for another span (spanData nil): a span that ended costs
// its holders 112 bytes, and the ~1 KB it recorded into is reused warm
// instead of being allocated per span and collected.
type span struct {
	embedded.Span
	t  *tracer
	sc trace.SpanContext

	mu    sync.Mutex
	ended bool
	*spanData
}

// spanData is what a span records, reused across spans (provider.data).
type spanData struct {
	parent trace.SpanContext
	keep   bool // AttrKeep's value (the tail sampler keeps the trace)
	kind   trace.SpanKind
	name   string
	status sdktrace.Status
	start  time.Time
	end    time.Time
	// attrs is the span's attributes as OTLP writes them, each written
	// when set: a Span.attributes field (KeyValue) per key, with the last
	// value set, in the order the keys were first set; nattrs counts them.
	attrs        []byte
	nattrs       int32
	droppedAttrs int32
	// keys has bit keyBit(k) set for every key k in attrs: a key whose bit
	// is clear is new, without a look through attrs.
	keys   uint64
	events []sdktrace.Event
	rare   *spanRare // nil until a link, or an event or link dropped
	stages []Stage
	// attrBuf holds attrs, eventBuf events: the router's and workers'
	// spans have about ten attributes of 20 to 50 bytes, and the router's
	// request span one event (the first token).
	attrBuf  [attrInline]byte
	eventBuf [1]sdktrace.Event
}

// attrInline is the bytes of encoded attributes a span holds inline.
const attrInline = 512

// spanData is an empty spanData: one from the pool, else a new one.
func (p *provider) spanData() *spanData {
	if d, _ := p.data.Get().(*spanData); d != nil {
		return d
	}
	d := &spanData{}
	d.attrs, d.events = d.attrBuf[:0], d.eventBuf[:0]
	return d
}

// reset empties d for another span, keeping its inline buffers (their
// bytes are not cleared: attrs and events say how much of them is used).
func (d *spanData) reset() {
	if len(d.events) > 0 {
		clear(d.eventBuf[:]) // no name or attribute kept alive
	}
	d.parent, d.keep, d.kind, d.name, d.status = trace.SpanContext{}, false, 0, "", sdktrace.Status{}
	d.start, d.end = time.Time{}, time.Time{}
	d.attrs, d.nattrs, d.droppedAttrs, d.keys = d.attrBuf[:0], 0, 0, 0
	d.events, d.rare, d.stages = d.eventBuf[:0], nil, nil
}

// spanRare is what few spans have: links, and the counts of the events
// and links dropped past their limits.
type spanRare struct {
	links         []sdktrace.Link
	droppedEvents int
	droppedLinks  int
}

// rareFields is s's spanRare, or the zero one if it has none.
func (s *span) rareFields() spanRare {
	if s.rare == nil {
		return spanRare{}
	}
	return *s.rare
}

// rareOf is s's spanRare, made if it has none. Caller holds mu or owns s.
func (s *span) rareOf() *spanRare {
	if s.rare == nil {
		s.rare = &spanRare{}
	}
	return s.rare
}

// release hands s's spanData back to its provider's pool, once s was
// written into a batch or dropped. No lock: s ended, and nothing reads its
// spanData after (the setters see, under mu, that s ended and return
// before they touch it; the queue and the tail sampler are done with it).
func (s *span) release() {
	d := s.spanData
	s.spanData = nil
	if d != nil {
		d.reset()
		s.t.p.data.Put(d)
	}
}

// keyBit is the bit of key k in spanData.keys: a hash of its length and
// three of its bytes, which tell the keys a span has apart.
func keyBit(k string) uint64 {
	n := len(k)
	x := uint64(n)
	if n > 0 {
		x |= uint64(k[n-1])<<8 | uint64(k[n/2])<<16 | uint64(k[n/3])<<24
	}
	return 1 << ((x * 0x9E3779B97F4A7C15) >> 58)
}

// addAttributes adds kvs, the invalid ones (an empty key) dropped: each
// is written as OTLP at once; a key set again takes the new value where
// it was first set; a new key past maxSpanAttributes is dropped and
// counted (the SDK's rules). Caller holds mu or owns s.
func (s *span) addAttributes(kvs []attribute.KeyValue) {
	for _, kv := range kvs {
		if !kv.Valid() {
			s.droppedAttrs++
			continue
		}
		n := len(s.attrs)
		s.attrs = appendKeyValue(s.attrs, fSpanAttributes, kv)
		bit := keyBit(string(kv.Key))
		at, size := -1, 0
		if s.keys&bit != 0 {
			at, size = findAttr(s.attrs[:n], string(kv.Key))
		}
		if at >= 0 {
			// Set before: the new field takes the old one's place.
			var tmp [256]byte
			field := append(tmp[:0], s.attrs[n:]...)
			s.attrs = slices.Replace(s.attrs[:n], at, at+size, field...)
		} else if s.nattrs >= maxSpanAttributes {
			s.attrs = s.attrs[:n]
			s.droppedAttrs++
			continue
		} else {
			s.nattrs++
			s.keys |= bit
		}
		if kv.Key == AttrKeep {
			s.keep = kv.Value.AsBool()
		}
	}
}

// findAttr returns where in b, a run of Span.attributes fields, the field
// of key is, and its size; -1 if none is.
func findAttr(b []byte, key string) (at, size int) {
	for i := 0; i < len(b); {
		_, _, tn := protowire.ConsumeTag(b[i:])
		if tn < 0 {
			return -1, 0
		}
		fl, ln := protowire.ConsumeVarint(b[i+tn:])
		if ln < 0 {
			return -1, 0
		}
		body := b[i+tn+ln : i+tn+ln+int(fl)]
		// KeyValue: the key (field 1) first, as appendKeyValue writes it.
		if _, _, kt := protowire.ConsumeTag(body); kt > 0 {
			if k, kl := protowire.ConsumeBytes(body[kt:]); kl > 0 && string(k) == key {
				return i, tn + ln + int(fl)
			}
		}
		i += tn + ln + int(fl)
	}
	return -1, 0
}

// addLink adds l unless it names no span (as the SDK does). Caller holds
// mu or owns s.
func (s *span) addLink(l trace.Link) {
	if !l.SpanContext.IsValid() {
		return
	}
	r := s.rareOf()
	if len(r.links) >= maxSpanLinks {
		r.droppedLinks++
		return
	}
	r.links = append(r.links, sdktrace.Link{SpanContext: l.SpanContext, Attributes: l.Attributes})
}

// End implements trace.Span.
func (s *span) End(opts ...trace.SpanEndOption) {
	end := time.Time{}
	if len(opts) > 0 {
		c := trace.NewSpanEndConfig(opts...)
		end = c.Timestamp()
	}
	s.endAt(end, nil)
}

// endAt ends s at end (zero: now), with stages as its children when
// there are some. The stages are written before it returns and not kept
// (but by the tail sampler, which holds the span: a copy).
func (s *span) endAt(end time.Time, stages []Stage) {
	if end.IsZero() {
		end = time.Now()
	}
	tail := s.t.p.tail != nil
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.end = true, end
	if len(stages) > 0 {
		if tail {
			stages = slices.Clone(stages)
		}
		s.stages = stages
	}
	s.mu.Unlock()
	s.t.p.ended(s) // at ratio 1 written and released: stages no longer held
}

// endWithStages ends s at end with stages as its children.
func (s *span) endWithStages(end time.Time, stages []Stage) { s.endAt(end, stages) }

// AddEvent implements trace.Span.
func (s *span) AddEvent(name string, opts ...trace.EventOption) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addEvent(name, trace.NewEventConfig(opts...))
	}
}

func (s *span) addEvent(name string, c trace.EventConfig) {
	s.addEventAt(name, c.Timestamp(), c.Attributes())
}

// addEventAt adds the event name at at (zero: now) with attrs. Caller
// holds mu.
func (s *span) addEventAt(name string, at time.Time, attrs []attribute.KeyValue) {
	if len(s.events) >= maxSpanEvents {
		s.rareOf().droppedEvents++
		return
	}
	if at.IsZero() {
		at = time.Now()
	}
	s.events = append(s.events, sdktrace.Event{Name: name, Attributes: attrs, Time: at})
}

// AddEventAt adds to span sp the event name at time at, as
// sp.AddEvent(name, trace.WithTimestamp(at)) does, without the option
// list (an allocation per call) when sp is one of New's.
func AddEventAt(sp trace.Span, name string, at time.Time) {
	if s, ok := sp.(*span); ok {
		s.mu.Lock()
		if !s.ended {
			s.addEventAt(name, at, nil)
		}
		s.mu.Unlock()
		return
	}
	sp.AddEvent(name, trace.WithTimestamp(at))
}

// AddLink implements trace.Span.
func (s *span) AddLink(l trace.Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addLink(l)
	}
}

// IsRecording implements trace.Span: true until End.
func (s *span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

// RecordError implements trace.Span: an "exception" event with the
// error's type and message (and a stack trace when asked), as the SDK
// records it.
func (s *span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	opts = append(opts, trace.WithAttributes(semconv.ExceptionType(errorType(err)), semconv.ExceptionMessage(err.Error())))
	c := trace.NewEventConfig(opts...)
	if c.StackTrace() {
		buf := make([]byte, 2048)
		buf = buf[:runtime.Stack(buf, false)]
		c = trace.NewEventConfig(append(opts, trace.WithAttributes(semconv.ExceptionStacktrace(string(buf))))...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addEvent(semconv.ExceptionEventName, c)
	}
}

// errorType is the exception.type of err: its package path and type name.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer or another unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}

// SpanContext implements trace.Span.
func (s *span) SpanContext() trace.SpanContext { return s.sc }

// SetStatus implements trace.Span: a code lower than the one set is
// ignored (Ok > Error > Unset); the description is kept for Error only.
func (s *span) SetStatus(code codes.Code, description string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.status.Code > code {
		return
	}
	st := sdktrace.Status{Code: code}
	if code == codes.Error {
		st.Description = description
	}
	s.status = st
}

// SetName implements trace.Span.
func (s *span) SetName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.name = name
	}
}

// SetAttributes sets kvs on span as span.SetAttributes does, without
// making the caller's kvs escape to the heap when span is one of New's
// (the trace.Span interface call does: a list of attributes written at
// each request's end was an allocation).
func SetAttributes(sp trace.Span, kvs ...attribute.KeyValue) {
	if s, ok := sp.(*span); ok {
		s.SetAttributes(kvs...)
		return
	}
	sp.SetAttributes(slices.Clone(kvs)...)
}

// SetAttributes implements trace.Span.
func (s *span) SetAttributes(kvs ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addAttributes(kvs)
	}
}

// TracerProvider implements trace.Span.
func (s *span) TracerProvider() trace.TracerProvider { return s.t.p }

// The span's fields for the exporter (encodable) and the tail sampler,
// read once it ended.

func (s *span) Parent() trace.SpanContext                   { return s.parent }
func (s *span) Name() string                                { return s.name }
func (s *span) SpanKind() trace.SpanKind                    { return s.kind }
func (s *span) StartTime() time.Time                        { return s.start }
func (s *span) EndTime() time.Time                          { return s.end }
func (s *span) DroppedAttributes() int                      { return int(s.droppedAttrs) }
func (s *span) encodedAttributes() []byte                   { return s.attrs }
func (s *span) Events() []sdktrace.Event                    { return s.events }
func (s *span) DroppedEvents() int                          { return s.rareFields().droppedEvents }
func (s *span) Links() []sdktrace.Link                      { return s.rareFields().links }
func (s *span) DroppedLinks() int                           { return s.rareFields().droppedLinks }
func (s *span) Status() sdktrace.Status                     { return s.status }
func (s *span) Resource() *resource.Resource                { return s.t.p.res }
func (s *span) InstrumentationScope() instrumentation.Scope { return s.t.scope }
func (s *span) stageList() []Stage                          { return s.stages }

// quietSpan is a span its sampler did not record: it carries its context
// (unsampled, so its children are not recorded either) and nothing else.
type quietSpan struct {
	embedded.Span
	sc trace.SpanContext
	p  *provider
}

func (s *quietSpan) End(...trace.SpanEndOption)              {}
func (s *quietSpan) AddEvent(string, ...trace.EventOption)   {}
func (s *quietSpan) AddLink(trace.Link)                      {}
func (s *quietSpan) IsRecording() bool                       { return false }
func (s *quietSpan) RecordError(error, ...trace.EventOption) {}
func (s *quietSpan) SpanContext() trace.SpanContext          { return s.sc }
func (s *quietSpan) SetStatus(codes.Code, string)            {}
func (s *quietSpan) SetName(string)                          {}
func (s *quietSpan) SetAttributes(...attribute.KeyValue)     {}
func (s *quietSpan) TracerProvider() trace.TracerProvider    { return s.p }

// queueConfig is the batching of the exporter's queue: the SDK's batch
// span processor's settings and defaults, from the same variables
// (OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_EXPORT_TIMEOUT in milliseconds,
// OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE).
type queueConfig struct {
	delay, timeout time.Duration
	max, batch     int
}

// queueConfigOf reads queueConfig from the environment; a value that is
// not a positive integer is an error.
func queueConfigOf(getenv func(string) string) (queueConfig, error) {
	c := queueConfig{delay: 5 * time.Second, timeout: 30 * time.Second, max: 2048, batch: 512}
	for _, v := range []struct {
		name string
		ms   *time.Duration
		n    *int
	}{{"OTEL_BSP_SCHEDULE_DELAY", &c.delay, nil}, {"OTEL_BSP_EXPORT_TIMEOUT", &c.timeout, nil},
		{"OTEL_BSP_MAX_QUEUE_SIZE", nil, &c.max}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", nil, &c.batch}} {
		s := strings.TrimSpace(getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return queueConfig{}, fmt.Errorf("%s %q: want a positive integer", v.name, s)
		}
		if v.ms != nil {
			*v.ms = time.Duration(n) * time.Millisecond
		} else {
			*v.n = n
		}
	}
	c.batch = min(c.batch, c.max) // as the SDK does
	return c, nil
}

// queue holds ended spans, written as OTLP as they come (encoded), until
// they are exported: a batch at a time once a batch is full or the delay
// passed, from one goroutine. A span that finds the queue full is dropped
// (and counted), as the SDK's batch processor drops it: tracing never
// blocks a request.
type queue struct {
	cfg  queueConfig
	exp  *exporter
	log  *slog.Logger // nil: failures are not logged
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	// The export goroutine's failure log: when it last logged and the
	// failed exports and their spans since; when it last logged dropped
	// spans and their count then.
	loggedAt      time.Time
	failed        int
	failedSpans   int
	droppedAt     time.Time
	droppedLogged int

	mu sync.Mutex
	// full are batches of cfg.batch spans (or maxBatchBytes) waiting for
	// export, cur the batch being filled (nil: none yet), spare emptied
	// batches to fill again.
	full    []*encoded
	cur     *encoded
	spare   []*encoded
	dropped int
	closed  bool
}

func newQueue(cfg queueConfig, exp *exporter, log *slog.Logger) *queue {
	q := &queue{cfg: cfg, exp: exp, log: log, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

// queued is the spans waiting for export: those of full and cur (not
// those of a batch being sent). Caller holds mu.
func (q *queue) queued() int {
	n := 0
	for _, b := range q.full {
		n += b.spans
	}
	if q.cur != nil {
		n += q.cur.spans
	}
	return n
}

// add writes s into the batch being filled, under the queue's lock (the
// span's fields are read once, straight into the batch: an encoding
// buffer per span, copied in after, cost more in `up` than the lock).
func (q *queue) add(s encodable) {
	q.mu.Lock()
	if q.closed || q.queued() >= q.cfg.max {
		q.dropped++
		q.mu.Unlock()
		return
	}
	if q.cur == nil {
		if n := len(q.spare); n > 0 {
			q.cur, q.spare = q.spare[n-1], q.spare[:n-1]
		} else {
			q.cur = &encoded{}
		}
	}
	q.cur.add(s)
	full := q.cur.spans >= q.cfg.batch || q.cur.size() >= maxBatchBytes
	if full {
		q.full = append(q.full, q.cur)
		q.cur = nil
	}
	q.mu.Unlock()
	if full {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// run exports the queue every delay, or sooner when a batch is full, until
// stop; then once more.
func (q *queue) run() {
	defer close(q.done)
	tick := time.NewTicker(q.cfg.delay)
	defer tick.Stop()
	for {
		select {
		case <-q.stop:
			q.flush()
			return
		case <-tick.C:
		case <-q.kick:
		}
		q.flush()
	}
}

// flush exports what is queued, a batch at a time, each taken off the
// queue as its export starts (so that, as with the SDK's processor, the
// queue holds up to cfg.max spans besides the batch being sent), and hands
// the batches back emptied for the next spans.
func (q *queue) flush() {
	partial := false // the batch being filled was taken: once per flush
	for {
		q.mu.Lock()
		var b *encoded
		switch {
		case len(q.full) > 0:
			b = q.full[0]
			n := copy(q.full, q.full[1:])
			q.full[n] = nil
			q.full = q.full[:n]
		case q.cur != nil && !partial:
			// Once: while spans keep coming, taking it again would send
			// a few spans at a time for as long as they do.
			b, q.cur, partial = q.cur, nil, true
		}
		dropped := q.dropped
		q.mu.Unlock()
		q.droppedSince(dropped)
		if b == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.cfg.timeout)
		// As the SDK's processor: a failed export is reported, not
		// retried here (the OTLP client retries).
		q.exportFailed(q.exp.send(ctx, b), b.spans)
		cancel()
		b.reset()
		q.mu.Lock()
		// Kept, with their buffers: there are never more batches than the
		// queue's bound holds (cfg.max / cfg.batch, one being filled and
		// one being sent).
		q.spare = append(q.spare, b)
		q.mu.Unlock()
	}
}

// droppedSince logs, at most once per exportLogEvery, how many spans the
// queue dropped (it was full) since it last said; dropped is its count so
// far.
func (q *queue) droppedSince(dropped int) {
	if q.log == nil || dropped == q.droppedLogged {
		return
	}
	if now := time.Now(); q.droppedAt.IsZero() || now.Sub(q.droppedAt) >= exportLogEvery {
		q.log.Warn("spans dropped: the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE)",
			"dropped", dropped-q.droppedLogged, "queue_size", q.cfg.max)
		q.droppedAt, q.droppedLogged = now, dropped
	}
}

// exportLogEvery bounds how often a queue logs failed exports.
const exportLogEvery = time.Minute

// exportFailed logs err, the failure of an export of n spans, if it is the
// first or exportLogEvery passed since the last line, with the failed
// exports and their spans since that line (the SDK's processor hands every
// failure to the global error handler, which logs it).
func (q *queue) exportFailed(err error, n int) {
	if err == nil || q.log == nil {
		return
	}
	q.failed++
	q.failedSpans += n
	if now := time.Now(); q.loggedAt.IsZero() || now.Sub(q.loggedAt) >= exportLogEvery {
		q.log.Warn("traces not exported", "err", err, "failed_exports", q.failed, "spans", q.failedSpans)
		q.loggedAt, q.failed, q.failedSpans = now, 0, 0
	}
}

// shutdown exports what is queued (or gives up when ctx ends) and stops
// the exporter.
func (q *queue) shutdown(ctx context.Context) error {
	q.mu.Lock()
	already := q.closed
	q.closed = true
	q.mu.Unlock()
	if !already {
		close(q.stop)
	}
	select {
	case <-q.done:
	case <-ctx.Done():
		return errors.Join(context.Cause(ctx), q.exp.Shutdown(ctx))
	}
	return q.exp.Shutdown(ctx)
}

package tracing

import (
	"context"
	"encoding/hex"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The spans of a request are started and their context crosses processes
// on every request, so the router and the workers do both through the
// functions below: with New's providers and an http.Header they build no
// option list, walk no context and allocate only the span and the header
// value; with any other provider or carrier they do what the OpenTelemetry
// API calls do (a test's SDK provider gets the same spans).

// SpanStart is how Start and StartChild start a span.
type SpanStart struct {
	// Kind is the span's kind (0: internal).
	Kind trace.SpanKind
	// Time is its start (zero: now).
	Time time.Time
	// ID is its span id (invalid: a random one), as WithSpanID asks.
	ID trace.SpanID
}

// Start starts a span named name with tr, a child of the span ctx
// carries, as o says, and returns ctx with it: tr.Start with the options
// of o.
func Start(ctx context.Context, tr trace.Tracer, name string, o SpanStart) (context.Context, trace.Span) {
	if t, ok := tr.(*tracer); ok {
		s := t.start(trace.SpanContextFromContext(ctx), name, trace.ValidateSpanKind(o.Kind), o.Time, o.ID)
		return trace.ContextWithSpan(ctx, s), s
	}
	if o.ID.IsValid() {
		ctx = WithSpanID(ctx, o.ID)
	}
	return tr.Start(ctx, name, o.options()...)
}

// StartChild starts a span named name with tr, a child of parent (as
// ExtractHeader returns it, or a local span's; invalid: a root), as o
// says.
func StartChild(tr trace.Tracer, parent trace.SpanContext, name string, o SpanStart) trace.Span {
	if t, ok := tr.(*tracer); ok {
		return t.start(parent, name, trace.ValidateSpanKind(o.Kind), o.Time, o.ID)
	}
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent) // remote or not, as parent says
	}
	if o.ID.IsValid() {
		ctx = WithSpanID(ctx, o.ID)
	}
	_, s := tr.Start(ctx, name, o.options()...)
	return s
}

// options are o as the API's start options.
func (o SpanStart) options() []trace.SpanStartOption {
	opts := []trace.SpanStartOption{trace.WithSpanKind(o.Kind)}
	if !o.Time.IsZero() {
		opts = append(opts, trace.WithTimestamp(o.Time))
	}
	return opts
}

// The W3C Trace Context headers (https://www.w3.org/TR/trace-context/), in
// http.Header's canonical form.
const (
	headerTraceparent = "Traceparent"
	headerTracestate  = "Tracestate"
)

// traceparentLen is the length of a version 00 traceparent:
// "00-" 32 hex "-" 16 hex "-" 2 hex.
const traceparentLen = 55

// InjectHeader sets h's traceparent (and tracestate, when sc has one) to
// sc, as propagation.TraceContext's Inject does; an invalid sc sets
// nothing.
func InjectHeader(sc trace.SpanContext, h http.Header) {
	if !sc.IsValid() {
		return
	}
	if ts := sc.TraceState().String(); ts != "" {
		h[headerTracestate] = []string{ts}
	}
	var b [traceparentLen]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	// Only the flags the specification defines: sampled and random.
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))})
	h[headerTraceparent] = []string{string(b[:])}
}

// ExtractHeader is the remote span context of h's traceparent and
// tracestate, as propagation.TraceContext's Extract reads them: invalid
// when h has none or a malformed one (a malformed tracestate is ignored).
func ExtractHeader(h http.Header) trace.SpanContext {
	v := h[headerTraceparent]
	if len(v) == 0 || v[0] == "" {
		return trace.SpanContext{}
	}
	tp := v[0]
	var scc trace.SpanContextConfig
	var ver, flags [1]byte
	rest := "" // what follows the flags
	if !hexFields(tp, ver[:], scc.TraceID[:], scc.SpanID[:], flags[:]) {
		rest = tp
		if !hexPart(ver[:], &rest) ||
			!hexPart(scc.TraceID[:], &rest) || !hexPart(scc.SpanID[:], &rest) || !hexPart(flags[:], &rest) {
			return trace.SpanContext{}
		}
	}
	if ver[0] == 0xff || ver[0] == 0 && (rest != "" || flags[0] > 3) {
		// Version ff is invalid; 00 allows no further field and no
		// reserved flag bit.
		return trace.SpanContext{}
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	if ts := h[headerTracestate]; len(ts) > 0 && ts[0] != "" {
		scc.TraceState, _ = trace.ParseTraceState(ts[0])
	}
	scc.Remote = true
	sc := trace.NewSpanContext(scc)
	if !sc.IsValid() {
		return trace.SpanContext{}
	}
	return sc
}

// hexFields decodes tp into ver, tid, sid and flags when it has the
// length and the dashes of a version 00 traceparent and all its other
// characters are lower-case hex digits: the one pass a traceparent pdserve
// sent takes. false (tp to be read field by field) for any other.
func hexFields(tp string, ver, tid, sid, flags []byte) bool {
	if len(tp) != traceparentLen || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	return decodeLowerHex(ver, tp[0:2]) && decodeLowerHex(tid, tp[3:35]) &&
		decodeLowerHex(sid, tp[36:52]) && decodeLowerHex(flags, tp[53:55])
}

// decodeLowerHex decodes src, 2×len(dst) lower-case hex digits, into dst;
// false if a character is not one.
func decodeLowerHex(dst []byte, src string) bool {
	if len(src) != 2*len(dst) {
		return false
	}
	bad := byte(0)
	for i := range dst {
		hi, lo := hexNibble(src[2*i]), hexNibble(src[2*i+1])
		bad |= (hi | lo) & 0xf0
		dst[i] = hi<<4 | lo&0x0f
	}
	return bad == 0
}

// hexNibble is the value of the lower-case hex digit c, or a value with a
// bit of 0xf0 set if c is not one.
func hexNibble(c byte) byte {
	if d := c - '0'; d <= 9 {
		return d
	}
	if d := c - 'a'; d <= 5 {
		return d + 10
	}
	return 0xff
}

// hexPart decodes into dst the field of *s up to the next '-' (or its
// end), which must be 2×len(dst) lower-case hex digits, and leaves the
// rest after the '-' in *s; false if the field is not that.
func hexPart(dst []byte, s *string) bool {
	f := *s
	part, rest := f, ""
	for i := 0; i < len(f); i++ {
		if f[i] == '-' {
			part, rest = f[:i], f[i+1:]
			break
		}
	}
	*s = rest
	return decodeLowerHex(dst, part)
}

package tracing

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestHeaderCodecMatchesTraceContext: InjectHeader writes the headers the
// OpenTelemetry propagator writes, and ExtractHeader reads what it reads,
// on valid headers of every flag, with and without tracestate, and on
// thousands of mutations of them (a character replaced, dropped or added,
// upper case, other versions, extra fields, cut short).
func TestHeaderCodecMatchesTraceContext(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var otel propagation.TraceContext
	randomSC := func() trace.SpanContext {
		var scc trace.SpanContextConfig
		for i := range scc.TraceID {
			scc.TraceID[i] = byte(rng.IntN(256))
		}
		for i := range scc.SpanID {
			scc.SpanID[i] = byte(rng.IntN(256))
		}
		scc.TraceFlags = trace.TraceFlags(rng.IntN(256))
		if rng.IntN(3) == 0 {
			scc.TraceState, _ = trace.ParseTraceState(fmt.Sprintf("vendor=v%d,other=o", rng.IntN(100)))
		}
		return trace.NewSpanContext(scc)
	}
	var headers []http.Header
	for range 200 {
		sc := randomSC()
		got, want := http.Header{}, http.Header{}
		InjectHeader(sc, got)
		otel.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(want))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("inject %v (-otel +ours):\n%s", sc, diff)
		}
		headers = append(headers, got)
	}
	none := http.Header{}
	InjectHeader(trace.SpanContext{}, none)
	if len(none) != 0 {
		t.Fatalf("an invalid span context injected %v", none)
	}
	const alphabet = "0123456789abcdefABCDEF-xz "
	mutate := func(s string) string {
		b := []byte(s)
		switch rng.IntN(8) {
		case 0:
			b[rng.IntN(len(b))] = alphabet[rng.IntN(len(alphabet))]
		case 1:
			i := rng.IntN(len(b))
			b = append(b[:i], b[i+1:]...)
		case 2:
			i := rng.IntN(len(b) + 1)
			b = append(b[:i], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[i:]...)...)
		case 3:
			b = []byte(fmt.Sprintf("%02x", []int{0, 1, 2, 0xfe, 0xff}[rng.IntN(5)]) + string(b[2:]))
		case 4:
			b = append(b, "-"+[]string{"", "ab", "0123", "x-y"}[rng.IntN(4)]...)
		case 5:
			b = b[:rng.IntN(len(b))]
		case 6:
			for i := range b {
				if b[i] >= 'a' && b[i] <= 'f' && rng.IntN(4) == 0 {
					b[i] -= 'a' - 'A'
				}
			}
		case 7:
			b[53], b[54] = "0123456789abcdef"[rng.IntN(16)], "0123456789abcdef"[rng.IntN(16)]
		}
		return string(b)
	}
	cases, valid := 0, 0
	for _, h := range headers {
		tp := h.Get("Traceparent")
		for range 40 {
			m := http.Header{"Traceparent": {mutate(tp)}}
			switch rng.IntN(3) {
			case 0:
				m["Tracestate"] = h["Tracestate"]
			case 1:
				m["Tracestate"] = []string{"not a=valid,,state=="}
			}
			got := ExtractHeader(m)
			want := trace.SpanContextFromContext(otel.Extract(context.Background(), propagation.HeaderCarrier(m)))
			if !got.Equal(want) {
				t.Fatalf("extract %q, tracestate %q: %v, otel %v", m.Get("Traceparent"), m.Get("Tracestate"), got, want)
			}
			cases++
			if want.IsValid() {
				valid++
			}
		}
		if got, want := ExtractHeader(h), trace.SpanContextFromContext(otel.Extract(context.Background(), propagation.HeaderCarrier(h))); !got.Equal(want) || !got.IsValid() {
			t.Fatalf("extract the valid %v: %v, otel %v", h, got, want)
		}
	}
	if sc := ExtractHeader(http.Header{}); sc.IsValid() {
		t.Fatal("no header extracted a span context")
	}
	if valid == 0 || valid == cases {
		t.Fatalf("%d of %d mutated headers valid: the mutations test one side only", valid, cases)
	}
	t.Logf("%d mutated headers (%d of them valid) read as otel reads them", cases, valid)
}

// TestLegSpanIDFormula: the id is the first 8 bytes of SHA-256 over the
// trace id and "room/gen/role", as every earlier pdserve computes it, so
// a prefill and a decode worker of different versions (a rolling upgrade)
// still link the KV hop.
func TestLegSpanIDFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		var tid trace.TraceID
		for i := range tid {
			tid[i] = byte(rng.IntN(256))
		}
		room, gen, role := fmt.Sprintf("%016x", rng.Uint64()), uint32(rng.IntN(5)+1), []string{"prefill", "decode"}[rng.IntN(2)]
		h := sha256.New()
		h.Write(tid[:])
		fmt.Fprintf(h, "%s/%d/%s", room, gen, role)
		var want trace.SpanID
		copy(want[:], h.Sum(nil))
		if got := LegSpanID(tid, room, gen, role); got != want {
			t.Fatalf("LegSpanID(%s, %s, %d, %s) = %s, want %s", tid, room, gen, role, got, want)
		}
	}
	if testing.AllocsPerRun(100, func() { LegSpanID(trace.TraceID{1}, "0123456789abcdef", 1, "prefill") }) != 0 {
		t.Error("LegSpanID allocates")
	}
}

// TestSpanStartIDAndParent: Start and StartChild give the span the id
// SpanStart asks for, under the parent given, with New's provider and
// with the SDK's (through WithSpanID and IDs); a zero ID is a random one.
func TestSpanStartIDAndParent(t *testing.T) {
	p, _ := testProvider(t, 1, 0)
	sdk := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(IDs{}))
	defer sdk.Shutdown(context.Background())
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2}, SpanID: trace.SpanID{3},
		TraceFlags: trace.FlagsSampled, Remote: true})
	want := LegSpanID(parent.TraceID(), "room", 1, "prefill")
	for name, tp := range map[string]trace.TracerProvider{"provider": p, "sdk": sdk} {
		tr := tp.Tracer(Instrumentation)
		s := StartChild(tr, parent, "leg", SpanStart{Kind: trace.SpanKindServer, ID: want})
		if sc := s.SpanContext(); sc.SpanID() != want || sc.TraceID() != parent.TraceID() || !sc.IsSampled() {
			t.Errorf("%s: StartChild gave %v, want span %s in trace %s", name, sc, want, parent.TraceID())
		}
		ro, ok := s.(sdktrace.ReadOnlySpan)
		if ok && ro.Parent().SpanID() != parent.SpanID() {
			t.Errorf("%s: parent %s, want %s", name, ro.Parent().SpanID(), parent.SpanID())
		}
		if own, ok := s.(*span); ok && own.Parent().SpanID() != parent.SpanID() {
			t.Errorf("%s: parent %s, want %s", name, own.Parent().SpanID(), parent.SpanID())
		}
		s.End()
		ctx, root := Start(context.Background(), tr, "root", SpanStart{})
		_, child := Start(ctx, tr, "child", SpanStart{})
		if child.SpanContext().TraceID() != root.SpanContext().TraceID() || child.SpanContext().SpanID() == root.SpanContext().SpanID() ||
			!root.SpanContext().IsValid() {
			t.Errorf("%s: Start's child %v of root %v", name, child.SpanContext(), root.SpanContext())
		}
		if trace.SpanFromContext(ctx) != root {
			t.Errorf("%s: Start's context does not carry its span", name)
		}
		child.End()
		root.End()
	}
}

// BenchmarkExtractHeader: reading the traceparent a router sent a leg.
func BenchmarkExtractHeader(b *testing.B) {
	h := http.Header{}
	InjectHeader(trace.NewSpanContext(trace.SpanContextConfig{TraceID: randomTraceID(), SpanID: randomSpanID(),
		TraceFlags: trace.FlagsSampled}), h)
	b.ReportAllocs()
	for b.Loop() {
		if !ExtractHeader(h).IsValid() {
			b.Fatal("invalid")
		}
	}
}

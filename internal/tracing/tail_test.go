package tracing

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestTailSampler: at ratio 0, a trace whose spans are all fine and fast
// is dropped; one with an error anywhere, AttrKeep, or a local root of
// SlowThreshold or longer is exported whole; a remote parent makes a local
// root (a worker's leg).
func TestTailSampler(t *testing.T) {
	tp, sent := testProvider(t, 0, time.Second)
	tr := tp.Tracer("t")
	t0 := time.Unix(1000, 0)
	run := func(name string, mod func(root, child trace.Span), rootDur time.Duration, remote bool) {
		ctx := context.Background()
		if remote {
			var tid trace.TraceID
			tid[0], tid[15] = 1, 0xff // outside any ratio below 1
			ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid,
				SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true}))
		}
		ctx, root := tr.Start(ctx, name, trace.WithTimestamp(t0))
		_, child := tr.Start(ctx, name+"/child", trace.WithTimestamp(t0))
		mod(root, child)
		child.End(trace.WithTimestamp(t0.Add(rootDur / 2)))
		root.End(trace.WithTimestamp(t0.Add(rootDur)))
	}
	none := func(trace.Span, trace.Span) {}
	run("fine", none, 10*time.Millisecond, false)
	run("fine-remote", none, 10*time.Millisecond, true)
	run("child-error", func(_, c trace.Span) { c.SetStatus(codes.Error, "broken") }, 10*time.Millisecond, false)
	run("keep", func(r, _ trace.Span) { r.SetAttributes(AttrKeep.Bool(true)) }, 10*time.Millisecond, true)
	run("slow", none, 2*time.Second, true)
	if err := tp.q.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range exportedSpans(t, sent) {
		got[s.Name] = true
	}
	for _, name := range []string{"child-error", "keep", "slow"} {
		if !got[name] || !got[name+"/child"] {
			t.Errorf("trace %s not exported whole: %v", name, got)
		}
	}
	for _, name := range []string{"fine", "fine-remote"} {
		if got[name] || got[name+"/child"] {
			t.Errorf("trace %s exported at ratio 0: %v", name, got)
		}
	}
}

// TestRatio: the ratio variables, and the trace-id rule every process
// shares.
func TestRatio(t *testing.T) {
	env := func(s, arg string) func(string) string {
		return func(k string) string {
			return map[string]string{"OTEL_TRACES_SAMPLER": s, "OTEL_TRACES_SAMPLER_ARG": arg}[k]
		}
	}
	for _, c := range []struct {
		s, arg string
		want   float64
	}{{"", "", 1}, {"always_on", "", 1}, {"parentbased_always_off", "", 0}, {"traceidratio", "0.25", 0.25},
		{"parentbased_traceidratio", "0.01", 0.01}, {"TraceIDRatio", "", 1}} {
		if r, err := ratioOf(env(c.s, c.arg)); err != nil || r != c.want {
			t.Errorf("%s %s: %v %v, want %v", c.s, c.arg, r, err, c.want)
		}
	}
	for _, bad := range [][2]string{{"traceidratio", "2"}, {"traceidratio", "x"}, {"jaeger_remote", ""}} {
		if _, err := ratioOf(env(bad[0], bad[1])); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	var low, high trace.TraceID
	high[8] = 0xff
	if !inRatio(low, 0.01) || inRatio(high, 0.5) || !inRatio(high, 1) {
		t.Error("inRatio does not follow the trace id's last 8 bytes")
	}
	// The SDK's TraceIDRatioBased keeps the same traces.
	s := sdktrace.TraceIDRatioBased(0.3)
	for i := range 256 {
		var tid trace.TraceID
		tid[8], tid[9] = byte(i), byte(i*7)
		sampled := s.ShouldSample(sdktrace.SamplingParameters{TraceID: tid}).Decision == sdktrace.RecordAndSample
		if sampled != inRatio(tid, 0.3) {
			t.Fatalf("trace %s: SDK %v, inRatio %v", tid, sampled, !sampled)
		}
	}
}

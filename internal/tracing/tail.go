package tracing

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// AttrKeep is the span attribute that makes a trace kept whatever the
// sampling ratio: the router sets it on a request retried or continued on
// a new pair, a worker on the legs of such an attempt (gen > 1, or a
// continuation).
const AttrKeep = attribute.Key("pdserve.keep")

// MaxBufferedSpans bounds the spans a tail sampler holds while their
// traces' local roots run (about 1 KiB each): past it, a trace's spans are
// decided at once, by its ratio alone.
const MaxBufferedSpans = 1 << 16

// ratioOf reads the sampling ratio of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (the OpenTelemetry SDK's names): 1 for
// always_on, parentbased_always_on or none; 0 for always_off and
// parentbased_always_off; the argument (default 1) for traceidratio and
// parentbased_traceidratio.
func ratioOf(getenv func(string) string) (float64, error) {
	s := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	switch s {
	case "", "always_on", "parentbased_always_on":
		return 1, nil
	case "always_off", "parentbased_always_off":
		return 0, nil
	case "traceidratio", "parentbased_traceidratio":
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) { // NaN too
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG %q: want a ratio in [0, 1]", arg)
		}
		return r, nil
	}
	return 0, fmt.Errorf("OTEL_TRACES_SAMPLER %q: want always_on, always_off, traceidratio or their parentbased_ forms", s)
}

// inRatio reports whether trace tid falls within ratio r: the same rule
// as the SDK's TraceIDRatioBased (its last 8 bytes, shifted right once,
// below r × 2⁶³), so every process keeps the same traces.
func inRatio(tid trace.TraceID, r float64) bool {
	if r >= 1 {
		return true
	}
	return binary.BigEndian.Uint64(tid[8:16])>>1 < uint64(r*(1<<63))
}

// tailSampler decides which traces to export once each trace's local
// root span (one whose parent is remote or absent: the router's request, a
// worker's leg) ends: a trace within the ratio, or one that failed (an
// error status on any of its spans), took SlowThreshold or longer, or was
// retried or continued (AttrKeep), goes to the queue; the others are
// dropped. Every span is recorded meanwhile.
type tailSampler struct {
	q     *queue
	ratio float64
	slow  time.Duration

	mu       sync.Mutex
	held     map[trace.TraceID][]*span
	keep     map[trace.TraceID]bool // traces whose spans are known to be kept
	buffered int
}

func newTailSampler(q *queue, ratio float64, slow time.Duration) *tailSampler {
	return &tailSampler{q: q, ratio: ratio, slow: slow, held: map[trace.TraceID][]*span{}, keep: map[trace.TraceID]bool{}}
}

// interesting reports a span that keeps its trace.
func interesting(s *span) bool {
	return s.status.Code == codes.Error || s.keep
}

// onEnd takes span s once it ended.
func (t *tailSampler) onEnd(s *span) {
	tid := s.sc.TraceID()
	root := !s.parent.IsValid() || s.parent.IsRemote()
	t.mu.Lock()
	held := t.held[tid]
	keep := t.keep[tid] || inRatio(tid, t.ratio) || interesting(s) || (root && t.slow > 0 && s.end.Sub(s.start) >= t.slow)
	for _, h := range held {
		keep = keep || interesting(h)
	}
	switch {
	case root:
		delete(t.held, tid)
		delete(t.keep, tid)
		t.buffered -= len(held)
	case keep:
		t.keep[tid] = true
		delete(t.held, tid)
		t.buffered -= len(held)
	case t.buffered >= MaxBufferedSpans:
		// Full: decided now, by the ratio (false here).
		delete(t.held, tid)
		t.buffered -= len(held)
		held = nil
	default:
		t.held[tid] = append(held, s)
		t.buffered++
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	if !keep {
		for _, h := range held {
			h.release()
		}
		s.release()
		return
	}
	for _, h := range held {
		t.q.add(h)
		h.release()
	}
	t.q.add(s)
	s.release()
}

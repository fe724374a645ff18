package router

import (
	"bufio"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/tracing"
)

// measured wraps a request's stream to observe what its client sees: time
// to first token, the gaps between tokens, the end to end time (for every
// request that got a first token, however it ended), the time it waited
// before the legs that served it were sent, and the tokens.
type measured struct {
	openai.Stream
	r       *Router
	arrived time.Time
	prompt  int
	seen    bool // a token was sent
	ended   bool // the E2E latency is observed
	last    time.Time
	// span is the request's (nil: tracing off); tokens counts the output
	// tokens sent, and first is when the first one was, for it.
	span   trace.Span
	tokens int
	first  time.Time
	// gaps counts the gaps between choice 0's token lines after the first.
	gaps int
}

// answerer is a stream that knows the outcome its request was counted
// with.
type answerer interface{ answeredWith() outcome.Outcome }

// dispatcher is a stream that knows when its current legs were sent.
type dispatcher interface{ dispatchedAt() time.Time }

func (s *pdStream) dispatchedAt() time.Time    { return s.dispatched }
func (s *plainStream) dispatchedAt() time.Time { return s.dispatched }

func (m *measured) Recv() (openai.Chunk, error) {
	c, err := m.Stream.Recv()
	if err == nil && len(c.Tokens) > 0 {
		now := m.r.clock.Now()
		m.tokens += len(c.Tokens)
		if !m.seen {
			m.seen, m.first = true, now
			queued := time.Duration(0)
			if d, ok := m.Stream.(dispatcher); ok {
				queued = d.dispatchedAt().Sub(m.arrived)
			}
			m.r.metrics.FirstToken(now.Sub(m.arrived), queued, m.prompt)
			m.r.metrics.Tokens(len(c.Tokens), 0, true)
			m.last = now
		} else if c.Index == 0 {
			// The gaps between tokens follow choice 0: the choices of an
			// n > 1 request decode in the same steps.
			m.r.metrics.Tokens(len(c.Tokens), now.Sub(m.last), false)
			if rec := m.r.cfg.Recorder; rec != nil {
				if l, ok := m.Stream.(legWorker); ok {
					if id := l.decodeWorker(); id != "" {
						rec.Gap(id, now.Sub(m.last))
					}
				}
			}
			m.last, m.gaps = now, m.gaps+1
		} else {
			m.r.metrics.Tokens(len(c.Tokens), 0, true)
		}
	}
	if err != nil || c.Done {
		m.end()
	}
	return c, err
}

// end observes the E2E latency of a request that got its first token, once.
func (m *measured) end() {
	if m.seen && !m.ended {
		m.ended = true
		m.r.metrics.Ended(m.r.clock.Now().Sub(m.arrived))
		if rec := m.r.cfg.Recorder; rec != nil {
			var tpot time.Duration
			if m.gaps > 0 {
				tpot = m.last.Sub(m.first) / time.Duration(m.gaps)
			}
			rec.Finished(m.first.Sub(m.arrived), tpot)
		}
	}
}

// legWorker is a stream that knows the worker its tokens come from.
type legWorker interface{ decodeWorker() string }

// decodeWorker is the id of the decode worker of the current attempt.
func (s *pdStream) decodeWorker() string {
	if s.a == nil || s.a.dw == nil {
		return ""
	}
	return s.a.dw.ID()
}

// decodeWorker is the id of the worker that serves the request.
func (s *plainStream) decodeWorker() string {
	if s.w == nil {
		return ""
	}
	return s.w.ID()
}

func (m *measured) Close() {
	m.end()
	m.Stream.Close()
	if m.span != nil {
		o := outcome.None
		if a, ok := m.Stream.(answerer); ok {
			o = a.answeredWith()
		}
		if m.seen && m.span.IsRecording() {
			tracing.AddEventAt(m.span, "first token", m.first)
			endSpan(m.span, o, o.String(), attrTTFT.Float64(m.first.Sub(m.arrived).Seconds()),
				attrOutputTokens.Int(m.tokens), attrE2E.Float64(m.r.clock.Now().Sub(m.arrived).Seconds()))
		} else {
			endSpan(m.span, o, o.String(), attrOutputTokens.Int(m.tokens), attrE2E.Float64(m.r.clock.Now().Sub(m.arrived).Seconds()))
		}
	}
}

// Pending implements openai.Pender for the wrapped stream.
func (m *measured) Pending() bool {
	p, ok := m.Stream.(openai.Pender)
	return ok && p.Pending()
}

// Pending implements openai.Pender: a line is waiting, decoded or read.
func (s *pdStream) Pending() bool {
	switch {
	case s.finished || s.a == nil:
		return false
	case s.a.leg != nil:
		return lineBuffered(s.a.leg.br)
	}
	return len(s.a.lines) > 0 || s.a.more.Load()
}

// Pending implements openai.Pender: a line is waiting, decoded or read.
func (s *plainStream) Pending() bool { return !s.finished && s.br != nil && lineBuffered(s.br) }

// Ended implements openai.Ender for the wrapped stream.
func (m *measured) Ended() bool {
	e, ok := m.Stream.(openai.Ender)
	return ok && e.Ended()
}

// legEnded reports, without blocking, whether a leg whose last line br has
// returned has its whole answer read (its chunked terminator came with the
// line): closing it then returns its connection to the pool at once.
func legEnded(resp *http.Response, br *bufio.Reader) bool {
	if resp == nil || br == nil || br.Buffered() > 0 {
		return false
	}
	e, ok := resp.Body.(interface{ Ended() bool })
	return ok && e.Ended()
}

// Ended implements openai.Ender: the leg sent its last line and its end.
func (s *plainStream) Ended() bool { return s.finished && !s.stopped && legEnded(s.resp, s.br) }

// Ended implements openai.Ender: the decode leg, handed over to the
// client's goroutine, sent its last line and its end.
func (s *pdStream) Ended() bool {
	return s.finished && !s.stopped && s.a != nil && s.a.leg != nil && legEnded(s.a.leg.resp, s.a.leg.br)
}

// StopChoice implements openai.ChoiceStopper for the wrapped stream.
func (m *measured) StopChoice(index int) {
	if c, ok := m.Stream.(openai.ChoiceStopper); ok {
		c.StopChoice(index)
	}
}

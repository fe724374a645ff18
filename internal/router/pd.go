package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/worker"
)

// LegTimeout bounds a leg's HTTP exchange; workers end requests well before
// (their --max-request-time), so it only matters if a worker hangs.
const LegTimeout = 15 * time.Minute

// maxLineBytes bounds one NDJSON line of a decode stream and a prefill answer.
const maxLineBytes = 1 << 20

type prefillResult struct {
	res worker.PrefillResult
	err *openai.Error
}

type decodeEvent struct {
	line worker.StreamLine
	err  *openai.Error
}

// pdStream is one request's two legs, seen as an openai.Stream.
type pdStream struct {
	r        *Router
	ctx      context.Context // the client's
	rid      string
	room     string
	pw, dw   *workerState
	lines    chan decodeEvent
	prefill  chan prefillResult
	pCancel  context.CancelFunc
	dCancel  context.CancelFunc
	pDone    bool // prefill answered
	pFailed  bool
	ended    bool // finished OK, failed, or stopped: nothing more to abort
	finished bool // the last chunk was returned
	stopped  bool
	start    time.Time
}

// Generate implements openai.Engine: it picks a pair and starts both legs.
func (r *Router) Generate(ctx context.Context, g *openai.GenerateRequest) (openai.Stream, error) {
	pw, kv := pick(r.prefill, &r.rrP, true)
	if pw == nil {
		r.requests.WithLabelValues("no_prefill").Inc()
		return nil, openai.Unavailable("no healthy prefill worker (see /debug/workers)")
	}
	dw, _ := pick(r.decode, &r.rrD, false)
	if dw == nil {
		r.requests.WithLabelValues("no_decode").Inc()
		return nil, openai.Unavailable("no healthy decode worker (see /debug/workers)")
	}
	room := kvxfer.NewRoom().String()
	body := worker.GenerateBody{RID: g.RID, Room: room, Gen: 1, InputIDs: g.InputIDs, MaxTokens: g.MaxTokens,
		Temperature: g.Sampling.Temperature, TopP: g.Sampling.TopP, TopK: g.Sampling.TopK, Seed: g.Sampling.Seed,
		StopTokenIDs: g.StopTokenIDs, IgnoreEOS: g.IgnoreEOS, PrefillKVAddr: kv}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, openai.Internal("encode leg: %v", err)
	}
	s := &pdStream{r: r, ctx: ctx, rid: g.RID, room: room, pw: pw, dw: dw,
		lines: make(chan decodeEvent, 16), prefill: make(chan prefillResult, 1), start: time.Now()}
	pctx, pcancel := context.WithTimeout(context.Background(), LegTimeout)
	dctx, dcancel := context.WithTimeout(context.Background(), LegTimeout)
	s.pCancel, s.dCancel = pcancel, dcancel
	r.bg.Add(2)
	go func() {
		defer r.bg.Done()
		defer pcancel()
		s.prefill <- r.runPrefill(pctx, pw, payload)
	}()
	go func() {
		defer r.bg.Done()
		r.runDecode(dctx, dw, payload, s.lines)
	}()
	return s, nil
}

func (r *Router) post(ctx context.Context, w *workerState, path string, payload []byte) (*http.Response, *openai.Error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+path, bytes.NewReader(payload))
	if err != nil {
		return nil, openai.Internal("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, openai.ToError(context.Canceled)
		}
		r.legFails.WithLabelValues(w.url).Inc()
		w.mu.Lock()
		w.healthy, w.lastErr = false, err.Error()
		w.failures++
		w.mu.Unlock()
		return nil, &openai.Error{Status: http.StatusBadGateway, Type: openai.TypeServer, Code: "worker_unreachable",
			Message: fmt.Sprintf("worker %s: %v", w.url, err)}
	}
	return resp, nil
}

func (r *Router) runPrefill(ctx context.Context, w *workerState, payload []byte) prefillResult {
	resp, e := r.post(ctx, w, worker.PathPrefill, payload)
	if e != nil {
		return prefillResult{err: e}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLineBytes))
	if err != nil {
		return prefillResult{err: openai.ToError(fmt.Errorf("prefill worker %s: %w", w.url, err))}
	}
	if resp.StatusCode != http.StatusOK {
		return prefillResult{err: openai.DecodeError(resp.StatusCode, body)}
	}
	var res worker.PrefillResult
	if err := json.Unmarshal(body, &res); err != nil {
		return prefillResult{err: openai.Internal("prefill worker %s: bad answer: %v", w.url, err)}
	}
	return prefillResult{res: res}
}

func (r *Router) runDecode(ctx context.Context, w *workerState, payload []byte, out chan<- decodeEvent) {
	defer close(out)
	send := func(ev decodeEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	resp, e := r.post(ctx, w, worker.PathDecode, payload)
	if e != nil {
		send(decodeEvent{err: e})
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxLineBytes))
		send(decodeEvent{err: openai.DecodeError(resp.StatusCode, body)})
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	for sc.Scan() {
		var line worker.StreamLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			send(decodeEvent{err: openai.Internal("decode worker %s: bad stream line: %v", w.url, err)})
			return
		}
		if !send(decodeEvent{line: line}) {
			return
		}
		if line.FinishReason != "" || line.Error != nil {
			return
		}
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	if ctx.Err() == nil {
		send(decodeEvent{err: &openai.Error{Status: http.StatusBadGateway, Type: openai.TypeServer,
			Code: "worker_stream_broken", Message: fmt.Sprintf("decode worker %s: stream ended: %v", w.url, err)}})
	}
}

// abortLeg tells a worker to abort the request, in the background, bounded
// by AbortTimeout.
func (r *Router) abortLeg(w *workerState, rid, room, reason, detail string) {
	payload, _ := json.Marshal(worker.AbortBody{RID: rid, Room: room, Gen: 1, Reason: reason, Detail: detail})
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.AbortTimeout)
		defer cancel()
		resp, e := r.post(ctx, w, worker.PathAbort, payload)
		if e != nil {
			r.log.Debug("abort failed", "worker", w.url, "rid", rid, "err", e.Message)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxInfoBytes))
		resp.Body.Close()
	}()
}

// peerCaused reports a decode failure that is the echo of its peer's.
func peerCaused(e *openai.Error) bool {
	switch e.Code {
	case "aborted_peer", "peer_lost", "lease_expired":
		return true
	}
	return false
}

func (s *pdStream) fail(e *openai.Error, failedLeg string) (openai.Chunk, error) {
	s.ended = true
	if failedLeg == "prefill" {
		s.r.abortLeg(s.dw, s.rid, s.room, "peer", "prefill leg failed: "+e.Message)
	} else if !s.pDone {
		s.r.abortLeg(s.pw, s.rid, s.room, "peer", "decode leg failed: "+e.Message)
	}
	result := e.Code
	if result == "" {
		result = fmt.Sprintf("http_%d", e.Status)
	}
	s.r.requests.WithLabelValues(failedLeg + "_" + result).Inc()
	s.r.log.Info("request failed", "rid", s.rid, "room", s.room, "leg", failedLeg, "status", e.Status, "err", e.Message)
	return openai.Chunk{}, e
}

// Recv returns decode's tokens; it ends with the first leg to fail.
func (s *pdStream) Recv() (openai.Chunk, error) {
	if s.finished {
		return openai.Chunk{}, io.EOF
	}
	for {
		select {
		case ev, ok := <-s.lines:
			if !ok {
				return s.fail(openai.Internal("decode stream closed"), "decode")
			}
			e := ev.err
			if e == nil && ev.line.Error != nil {
				l := ev.line.Error
				e = &openai.Error{Status: ev.line.Status, Type: l.Type, Message: l.Message}
				if l.Code != nil {
					e.Code = *l.Code
				}
			}
			if e != nil {
				if !s.pDone && peerCaused(e) {
					// Prefill's own answer names the root cause; give it a moment.
					t := time.NewTimer(s.r.cfg.PeerFailureGrace)
					select {
					case p := <-s.prefill:
						s.pDone = true
						if p.err != nil {
							t.Stop()
							s.pFailed = true
							return s.fail(p.err, "prefill")
						}
					case <-t.C:
					}
					t.Stop()
				}
				return s.fail(e, "decode")
			}
			c := openai.Chunk{Tokens: make([]openai.Token, len(ev.line.TokenIDs)), FinishReason: ev.line.FinishReason}
			for i, id := range ev.line.TokenIDs {
				c.Tokens[i] = openai.Token{ID: id}
				if i < len(ev.line.Logprobs) {
					c.Tokens[i].Logprob = ev.line.Logprobs[i]
				}
			}
			if c.FinishReason != "" {
				s.finished, s.ended = true, true
				s.r.requests.WithLabelValues("ok").Inc()
			}
			return c, nil
		case p := <-s.prefill:
			s.pDone = true
			s.prefill = nil
			if p.err != nil {
				s.pFailed = true
				return s.fail(p.err, "prefill")
			}
		case <-s.ctx.Done():
			return openai.Chunk{}, s.ctx.Err()
		}
	}
}

// Stop ends the request as finished (a stop string matched): only decode
// still runs; prefill finishes on its own once decode acknowledged the KV.
func (s *pdStream) Stop() {
	if s.ended {
		return
	}
	s.ended, s.stopped = true, true
	s.r.requests.WithLabelValues("ok").Inc()
	s.r.abortLeg(s.dw, s.rid, s.room, "stop", "")
}

// Close aborts both legs if the request has not ended (the client is
// gone), and releases the decode stream.
func (s *pdStream) Close() {
	if !s.ended {
		s.ended = true
		s.r.requests.WithLabelValues("aborted_client").Inc()
		s.r.abortLeg(s.dw, s.rid, s.room, "client", "client disconnected")
		if !s.pDone {
			s.r.abortLeg(s.pw, s.rid, s.room, "client", "client disconnected")
		}
		s.pCancel()
	}
	if s.pFailed {
		s.pCancel()
	}
	s.dCancel()
	// Drain the decode goroutine so it exits (it stops at dCancel).
	for range s.lines {
	}
}

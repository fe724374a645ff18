package openai

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

// byteTokenizer is a fake tokenizer: token id = byte value (0-255); id
// eosID is EOS and renders as "</s>" (as a tokenizer that does not skip
// special tokens would), so tests can see it is kept out of the text.
type byteTokenizer struct{}

const eosID = 256

func (byteTokenizer) Encode(text string, _ bool) ([]int32, error) {
	if strings.Contains(text, "FAIL-ENCODE") {
		return nil, errors.New("cannot encode FAIL-ENCODE")
	}
	ids := make([]int32, len(text))
	for i := range len(text) {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

// ApplyChatTemplate renders "<role>content\n" per message, then "<assistant>".
func (byteTokenizer) ApplyChatTemplate(msgs []model.Message, _ model.ChatOptions) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		if m.Role == "bad" {
			return "", errors.New("role bad is not allowed")
		}
		b.WriteString("<" + m.Role + ">" + m.Content + "\n")
	}
	b.WriteString("<assistant>")
	return b.String(), nil
}

func (byteTokenizer) NewDecoder() model.Decoder { return &byteDecoder{} }

func (byteTokenizer) TokenBytes(id int32) []byte {
	if id < 0 || id > 255 {
		return nil
	}
	return []byte{byte(id)}
}

// byteDecoder holds back the bytes of an incomplete UTF-8 character.
type byteDecoder struct{ buf []byte }

func (d *byteDecoder) Add(id int32) string {
	if id == eosID {
		return "</s>"
	}
	if id < 0 || id > 255 {
		return ""
	}
	d.buf = append(d.buf, byte(id))
	var out []byte
	for len(d.buf) > 0 && utf8.FullRune(d.buf) {
		r, n := utf8.DecodeRune(d.buf)
		if r == utf8.RuneError && n == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, d.buf[:n]...)
		}
		d.buf = d.buf[n:]
	}
	return string(out)
}

func (d *byteDecoder) Flush() string {
	s := strings.ToValidUTF8(string(d.buf), "\uFFFD")
	d.buf = nil
	return s
}

// toks returns the byte tokens of s.
func toks(s string) []Token {
	out := make([]Token, len(s))
	for i := range len(s) {
		out[i] = Token{ID: int32(s[i]), Logprob: -0.5}
	}
	return out
}

// chunksOf splits s into chunks of per bytes; the last chunk carries finish.
func chunksOf(s string, per int, finish string) []Chunk {
	var cs []Chunk
	for len(s) > 0 {
		n := min(per, len(s))
		cs = append(cs, Chunk{Tokens: toks(s[:n])})
		s = s[n:]
	}
	if len(cs) == 0 {
		cs = append(cs, Chunk{})
	}
	cs[len(cs)-1].FinishReason = finish
	return cs
}

// fakeEngine serves every request with the same script of chunks.
type fakeEngine struct {
	script []Chunk
	// genErr is returned by Generate.
	genErr error
	// failAt ≥ 0: Recv returns failErr instead of script[failAt].
	failAt  int
	failErr error
	// blockAt ≥ 0: Recv blocks at script[blockAt] until the ctx is done.
	blockAt int
	// ended is what the streams' Ended (openai.Ender) reports.
	ended bool

	streams chan *fakeStream // every stream Generate returned
	mu      sync.Mutex
	reqs    []*GenerateRequest
}

func newFakeEngine(script ...Chunk) *fakeEngine {
	return &fakeEngine{script: script, failAt: -1, blockAt: -1, streams: make(chan *fakeStream, 64)}
}

func (e *fakeEngine) Generate(ctx context.Context, req *GenerateRequest) (Stream, error) {
	e.mu.Lock()
	e.reqs = append(e.reqs, req)
	e.mu.Unlock()
	if e.genErr != nil {
		return nil, e.genErr
	}
	s := &fakeStream{e: e, ctx: ctx, stopped: make(chan struct{}), closed: make(chan struct{})}
	e.streams <- s
	return s, nil
}

func (e *fakeEngine) lastReq(t *testing.T) *GenerateRequest {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) == 0 {
		t.Fatal("engine got no request")
	}
	return e.reqs[len(e.reqs)-1]
}

// nextStream returns the next stream Generate returned, waiting up to 10s.
func (e *fakeEngine) nextStream(t *testing.T) *fakeStream {
	t.Helper()
	select {
	case s := <-e.streams:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no stream was started")
		return nil
	}
}

// fakeStream records Stop and Close.
type fakeStream struct {
	e   *fakeEngine
	ctx context.Context
	pos int

	mu                   sync.Mutex
	stopN, closeN, recvN int
	stopChoices          []int // StopChoice's indices, in order
	recvAfterClose       bool
	stopped, closed      chan struct{}
}

func (s *fakeStream) Recv() (Chunk, error) {
	s.mu.Lock()
	s.recvN++
	if s.closeN > 0 {
		s.recvAfterClose = true
	}
	pos := s.pos
	s.pos++
	s.mu.Unlock()
	switch {
	case pos == s.e.blockAt:
		<-s.ctx.Done()
		return Chunk{}, s.ctx.Err()
	case pos == s.e.failAt:
		return Chunk{}, s.e.failErr
	case pos >= len(s.e.script):
		return Chunk{}, io.EOF
	}
	return s.e.script[pos], nil
}

// Ended implements Ender.
func (s *fakeStream) Ended() bool { return s.e.ended }

func (s *fakeStream) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopN++
	if s.stopN == 1 {
		close(s.stopped)
	}
}

// StopChoice implements ChoiceStopper.
func (s *fakeStream) StopChoice(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopChoices = append(s.stopChoices, i)
}

func (s *fakeStream) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeN++
	if s.closeN == 1 {
		close(s.closed)
	}
}

// counts returns how often Stop and Close were called.
func (s *fakeStream) counts() (stop, closeN int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopN, s.closeN
}

// waitClosed waits up to 10s for Close.
func (s *fakeStream) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("stream was not closed")
	}
}

// optionsTokenizer is byteTokenizer with a chat template that shows the
// chat options: a request's template is written first, then its kwargs;
// the assistant's turn is opened unless NoGenerationPrompt or
// ContinueFinalMessage, which also leaves the last message unterminated.
type optionsTokenizer struct{ byteTokenizer }

func (optionsTokenizer) ApplyChatTemplate(msgs []model.Message, opts model.ChatOptions) (string, error) {
	var b strings.Builder
	if opts.Template != "" {
		b.WriteString("[" + opts.Template + "]")
	}
	keys := make([]string, 0, len(opts.Kwargs))
	for k := range opts.Kwargs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString("{" + k + "=" + string(opts.Kwargs[k]) + "}")
	}
	for i, m := range msgs {
		b.WriteString("<" + m.Role + ">" + m.Content)
		if !opts.ContinueFinalMessage || i < len(msgs)-1 {
			b.WriteString("\n")
		}
	}
	if !opts.NoGenerationPrompt && !opts.ContinueFinalMessage {
		b.WriteString("<assistant>")
	}
	return b.String(), nil
}

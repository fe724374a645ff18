package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// postLeg posts body to a worker handler's path and returns the status and
// the answer.
func postLeg(t *testing.T, h http.Handler, path string, body *workerapi.GenerateBody) (int, []byte) {
	t.Helper()
	data, err := body.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", path, bytes.NewReader(data)))
	return rec.Code, rec.Body.Bytes()
}

// streamOf reads an NDJSON answer: every token and its logprob, and the
// last line.
func streamOf(t *testing.T, body []byte) (toks []int32, lps []float32, last workerapi.StreamLine) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, workerapi.MaxLineBytes)
	for sc.Scan() {
		var l workerapi.StreamLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		if l.Error != nil {
			t.Fatalf("error line: %+v", l.Error)
		}
		toks = append(toks, l.TokenIDs...)
		lps = append(lps, l.Logprobs...)
		last = l
	}
	return toks, lps, last
}

// TestContinuationOnRealModel: on a colocated worker serving stories260K
// (a real trained model), a leg that continues a request after k of its
// tokens (the prompt and those tokens as input_ids, continued_tokens k,
// max_tokens and min_tokens what is left) answers exactly the rest of the
// uninterrupted answer: the same token ids and bit-identical logprobs,
// greedy and seeded sampling (with penalties), buffered or not, the usage
// counting the leg's own tokens. The worker lists the continue feature.
func TestContinuationOnRealModel(t *testing.T) {
	m, err := llama.Load(llamatest.Stories260K(t), llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Model: m, Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
	if !slices.Contains(w.features(), workerapi.FeatureContinue) {
		t.Fatalf("features %v lack %q", w.features(), workerapi.FeatureContinue)
	}
	h := w.Handler(nil)
	prompt := llamatest.References(t)[0].Tokens
	if len(prompt) > 12 {
		prompt = prompt[:12]
	}
	for _, tc := range []struct {
		name     string
		sampling model.SamplingParams
		min      int
		buffered bool
	}{
		{"greedy", model.SamplingParams{TopP: 1}, 0, false},
		{"seeded", model.SamplingParams{Temperature: 0.9, TopP: 0.95, TopK: 40, Seed: 1234}, 0, false},
		{"seeded with penalties and min_tokens, buffered", model.SamplingParams{Temperature: 1.2, TopP: 1, Seed: 77,
			PresencePenalty: 0.6, FrequencyPenalty: 0.3, RepetitionPenalty: 1.2}, 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const maxTokens = 24
			body := workerapi.GenerateBody{RID: "whole-" + tc.name, InputIDs: prompt, MaxTokens: maxTokens, MinTokens: tc.min,
				SamplingParams: tc.sampling, Buffered: tc.buffered}
			code, ans := postLeg(t, h, workerapi.PathGenerate, &body)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, ans)
			}
			out, lps, last := streamOf(t, ans)
			if len(out) < 4 || len(lps) != len(out) || last.OutputTokens != len(out) {
				t.Fatalf("uninterrupted: %d tokens, %d logprobs, last line %+v", len(out), len(lps), last)
			}
			for _, k := range []int{1, len(out) / 2, len(out) - 1} {
				c := body
				c.RID = fmt.Sprintf("cont-%s-%d", tc.name, k)
				c.InputIDs = append(slices.Clone(prompt), out[:k]...)
				c.ContinuedTokens, c.MaxTokens, c.MinTokens = k, maxTokens-k, max(0, tc.min-k)
				code, ans := postLeg(t, h, workerapi.PathGenerate, &c)
				if code != http.StatusOK {
					t.Fatalf("k=%d: %d %s", k, code, ans)
				}
				got, glps, glast := streamOf(t, ans)
				if !slices.Equal(got, out[k:]) {
					t.Fatalf("k=%d: %v, want %v", k, got, out[k:])
				}
				for i, lp := range glps {
					if math.Float32bits(lp) != math.Float32bits(lps[k+i]) {
						t.Fatalf("k=%d: token %d's logprob %v, uninterrupted %v", k, k+i, lp, lps[k+i])
					}
				}
				if glast.FinishReason != last.FinishReason || glast.OutputTokens != len(out)-k || glast.PromptTokens != len(prompt)+k {
					t.Fatalf("k=%d: last line %+v, uninterrupted %+v", k, glast, last)
				}
			}
		})
	}
}

// TestContinuationRefused: a continuation leg the contract does not allow
// is answered 400 with a message naming the problem: continued_tokens
// negative or not below the input's length, n > 1, prompt_logprobs (on a
// decode leg too, which otherwise ignores them), max_tokens 0.
func TestContinuationRefused(t *testing.T) {
	w := startSim(t, 64)
	h := w.Handler(nil)
	one := 1
	for _, tc := range []struct {
		name string
		edit func(b *workerapi.GenerateBody)
		msg  string
	}{
		{"negative", func(b *workerapi.GenerateBody) { b.ContinuedTokens = -1 }, "continued_tokens must be in [0, 4)"},
		{"all of the input", func(b *workerapi.GenerateBody) { b.ContinuedTokens = 4 }, "continued_tokens must be in [0, 4)"},
		{"n > 1", func(b *workerapi.GenerateBody) { b.N = 3 }, "n is 3"},
		{"prompt logprobs", func(b *workerapi.GenerateBody) { b.PromptLogprobs = &one }, "prompt_logprobs must be unset"},
		{"max_tokens 0", func(b *workerapi.GenerateBody) { b.MaxTokens = 0 }, "max_tokens must be at least 1"},
	} {
		b := workerapi.GenerateBody{RID: "r-" + tc.name, InputIDs: []int32{1, 2, 3, 4}, MaxTokens: 4, ContinuedTokens: 2,
			SamplingParams: model.SamplingParams{TopP: 1}}
		tc.edit(&b)
		code, ans := postLeg(t, h, workerapi.PathGenerate, &b)
		if code != http.StatusBadRequest || !strings.Contains(string(ans), tc.msg) {
			t.Errorf("%s: %d %s, want 400 with %q", tc.name, code, ans, tc.msg)
		}
	}
	b := workerapi.GenerateBody{RID: "good", InputIDs: []int32{1, 2, 3, 4}, MaxTokens: 2, ContinuedTokens: 2,
		SamplingParams: model.SamplingParams{TopP: 1}, IgnoreEOS: true}
	if code, ans := postLeg(t, h, workerapi.PathGenerate, &b); code != http.StatusOK {
		t.Fatalf("a good continuation: %d %s", code, ans)
	} else if toks, _, _ := streamOf(t, ans); len(toks) != 2 {
		t.Fatalf("a good continuation answered %v, want its 2 new tokens", toks)
	}

	// A decode leg never scores the prompt; the worker refuses the pair
	// before the machine sees it.
	dw := &Worker{role: lifecycle.RoleDecode}
	_, err := dw.request(&workerapi.GenerateBody{RID: "d", Room: "00000000000000000000000000000001", InputIDs: []int32{1, 2},
		MaxTokens: 2, ContinuedTokens: 1, PromptLogprobs: &one, PrefillKVAddr: "p:1"}, false)
	if err == nil || !strings.Contains(err.Error(), "prompt_logprobs must be unset") {
		t.Fatalf("decode leg with prompt_logprobs: %v", err)
	}
	if e, ok := err.(*openai.Error); !ok || e.Code != "rejected_invalid" {
		t.Fatalf("decode leg with prompt_logprobs: %#v, want code rejected_invalid as the other refusals", err)
	}
	// Prefill draws the leg's first token: min_tokens left bans EOS there.
	pw := &Worker{role: lifecycle.RolePrefill}
	q, err := pw.request(&workerapi.GenerateBody{RID: "p", Room: "00000000000000000000000000000001", InputIDs: []int32{1, 2, 3},
		MaxTokens: 5, MinTokens: 2, ContinuedTokens: 2}, false)
	if err != nil || q.Continued != 2 || q.MaxTokens != 1 || q.MinTokens != 1 {
		t.Fatalf("prefill leg: %+v %v", q, err)
	}
	// A prefill leg's max_tokens becomes 1: a continuation with none left
	// is refused before that, not left to time out waiting for decode.
	if _, err := pw.request(&workerapi.GenerateBody{RID: "p0", Room: "00000000000000000000000000000001", InputIDs: []int32{1, 2, 3},
		MaxTokens: 0, ContinuedTokens: 2}, false); err == nil || !strings.Contains(err.Error(), "max_tokens must be at least 1") {
		t.Fatalf("prefill continuation with max_tokens 0: %v", err)
	}
}

// flushWriter is an http.ResponseWriter whose Flush hands what was written
// since the last one to flushed; the rest stays in tail.
type flushWriter struct {
	mu      sync.Mutex
	header  http.Header
	code    int
	buf     bytes.Buffer
	flushed chan string
}

func (f *flushWriter) Header() http.Header { return f.header }
func (f *flushWriter) WriteHeader(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.code = code
}
func (f *flushWriter) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.Write(b)
}
func (f *flushWriter) Flush() {
	f.mu.Lock()
	s := f.buf.String()
	f.buf.Reset()
	f.mu.Unlock()
	f.flushed <- s
}

// lineTokens decodes flushed NDJSON lines into their tokens, one slice per
// line.
func lineTokens(t *testing.T, s string) [][]int32 {
	t.Helper()
	var out [][]int32
	for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		var sl workerapi.StreamLine
		if err := json.Unmarshal([]byte(l), &sl); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if sl.FinishReason != "" {
			t.Fatalf("a flushed line carries an end: %q", l)
		}
		out = append(out, sl.TokenIDs)
	}
	return out
}

// TestBufferedLegFlushes: a buffered leg sends nothing before
// BufferedFlushInterval (on the worker's clock) has passed since its start;
// then what it holds goes out merged in one line and flushed; the next
// line waits a full interval again (what came in between, in one line);
// after an interval in which it held nothing, the next output goes out at
// once; the last line carries what is left with the end and usage.
func TestBufferedLegFlushes(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	w := &Worker{clock: fc}
	wt := newWaiter()
	fw := &flushWriter{header: http.Header{}, flushed: make(chan string, 16)}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		w.streamLeg(context.Background(), fw, "r", wt, true)
	}()
	waitFor(t, "the flush timer", fc.HasWaiters)
	emit := func(toks ...int32) {
		var so []model.SeqOutput
		for _, tk := range toks {
			so = append(so, model.SeqOutput{Token: tk, Logprob: -float32(tk)})
		}
		wt.push(lifecycle.Emit{RID: "r", Tokens: so})
		waitFor(t, "the leg to take its tokens", func() bool {
			wt.mu.Lock()
			defer wt.mu.Unlock()
			return len(wt.pieces) == 0
		})
	}
	next := func() [][]int32 {
		t.Helper()
		select {
		case s := <-fw.flushed:
			return lineTokens(t, s)
		case <-time.After(10 * time.Second):
			t.Fatal("no flush")
			return nil
		}
	}
	emit(1)
	emit(2, 3)
	fc.Step(BufferedFlushInterval - time.Millisecond)
	emit(4)
	fc.Step(time.Millisecond)
	if got := next(); len(got) != 1 || !slices.Equal(got[0], []int32{1, 2, 3, 4}) {
		t.Fatalf("first flush %v, want one line of 1…4", got)
	}
	emit(5)
	emit(6)
	waitFor(t, "the flush timer again", fc.HasWaiters)
	fc.Step(BufferedFlushInterval / 2)
	emit(7)
	fc.Step(BufferedFlushInterval / 2)
	if got := next(); len(got) != 1 || !slices.Equal(got[0], []int32{5, 6, 7}) {
		t.Fatalf("second flush %v, want one line of 5…7", got)
	}
	waitFor(t, "the flush timer again", fc.HasWaiters)
	fc.Step(BufferedFlushInterval) // nothing held: nothing to send
	emit(8)
	if got := next(); len(got) != 1 || !slices.Equal(got[0], []int32{8}) {
		t.Fatalf("flush after an idle interval %v, want 8 at once", got)
	}
	wt.push(lifecycle.Emit{RID: "r", Tokens: []model.SeqOutput{{Token: 9, Logprob: -9}}})
	wt.finish(lifecycle.Finalize{RID: "r", Outcome: outcome.OK, FinishReason: "length", PromptTokens: 3, OutputTokens: 9})
	<-ended
	select {
	case s := <-fw.flushed:
		t.Fatalf("the end was flushed apart from the response's end: %q", s)
	default:
	}
	var last workerapi.StreamLine
	if err := json.Unmarshal(fw.buf.Bytes(), &last); err != nil {
		t.Fatalf("last line %q: %v", fw.buf.Bytes(), err)
	}
	if !slices.Equal(last.TokenIDs, []int32{9}) || last.FinishReason != "length" || last.OutputTokens != 9 || fw.code != http.StatusOK {
		t.Fatalf("last line %+v (status %d)", last, fw.code)
	}
}

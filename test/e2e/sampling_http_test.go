package e2e

import (
	"bytes"
	stdcmp "cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
)

// This file drives the sampling surface of the OpenAI API (logprobs, echo,
// prompt logprobs, n, best_of, penalties, logit_bias, min_p, allowed and
// banned tokens, token-id logprob strings, priority, timeout) over HTTP,
// through a router in front of a prefill/decode pair and through a
// colocated worker, and checks the two answer the same bytes.

// simText is the sim's 30 text tokens: the only byte tokens with finite
// logits besides EOS (internal/model/sim).
const simText = "abcdefghijklmnopqrstuvwxyz .,'"

// volatile matches the response fields that legitimately differ between
// two servers answering the same request: the id, the creation time and
// the prompt tokens a prefix cache saved.
var volatile = regexp.MustCompile(`"id":"(?:chat)?cmpl-[^"]*"|"created":[0-9]+|"cached_tokens":[0-9]+`)

// normalize blanks the volatile fields of a response body, keeping every
// other byte (the order of top_logprobs objects included).
func normalize(b []byte) []byte {
	return volatile.ReplaceAllFunc(b, func(m []byte) []byte {
		key, _, _ := bytes.Cut(m, []byte(":"))
		return append(slices.Clone(key), ":_"...)
	})
}

// randText is n characters, mostly the sim's text tokens, some not (their
// logits are −30: they show up in prompt logprobs).
func randText(rng *rand.Rand, n int) string {
	const other = "ABCXYZ0189\n-!"
	var b strings.Builder
	for range n {
		if rng.IntN(10) == 0 {
			b.WriteByte(other[rng.IntN(len(other))])
		} else {
			b.WriteByte(simText[rng.IntN(len(simText))])
		}
	}
	return b.String()
}

// randWord is 1…maxLen letters of the sim's text tokens.
func randWord(rng *rand.Rand, maxLen int) string {
	var b strings.Builder
	for range 1 + rng.IntN(maxLen) {
		b.WriteByte(simText[rng.IntN(26)])
	}
	return b.String()
}

// samplingReq is one generated request.
type samplingReq struct {
	path string
	body map[string]any
}

func (r samplingReq) chat() bool   { return r.path == "/v1/chat/completions" }
func (r samplingReq) stream() bool { return r.body["stream"] == true }

// n is the number of choices the request asks for.
func (r samplingReq) n() int {
	if n, ok := r.body["n"].(int); ok {
		return n
	}
	return 1
}

// scoring reports whether the request has pdserve compute the prompt's
// logprobs (so it takes nothing from the prefix cache).
func (r samplingReq) scoring() bool {
	_, pl := r.body["prompt_logprobs"]
	_, lp := r.body["logprobs"]
	return pl || r.body["echo"] == true && lp && !r.chat()
}

// withoutStream is the same request not streamed.
func (r samplingReq) withoutStream() samplingReq {
	b := maps.Clone(r.body)
	delete(b, "stream")
	delete(b, "stream_options")
	return samplingReq{r.path, b}
}

// randomSamplingRequest mixes every sampling field on either endpoint.
func randomSamplingRequest(rng *rand.Rand) samplingReq {
	chat := rng.IntN(2) == 0
	body := map[string]any{"return_token_ids": rng.IntN(4) != 0}
	stream := rng.IntN(3) == 0
	if stream {
		body["stream"] = true
		if rng.IntN(2) == 0 {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
	}
	n := []int{1, 1, 2, 4, 8}[rng.IntN(5)]
	if n > 1 || rng.IntN(2) == 0 {
		body["n"] = n
	}
	temp := []float64{0, 0.7, 1, 1.5}[rng.IntN(4)]
	body["temperature"] = temp
	if temp > 0 || rng.IntN(2) == 0 { // greedy needs no seed
		body["seed"] = rng.Int64N(1 << 40)
	}
	if rng.IntN(4) == 0 {
		body["top_p"] = []float64{0.9, 0.5}[rng.IntN(2)]
	}
	if rng.IntN(5) == 0 {
		body["top_k"] = 1 + rng.IntN(10)
	}
	maxTok := 1 + rng.IntN(24)
	if chat && rng.IntN(2) == 0 {
		body["max_completion_tokens"] = maxTok
	} else {
		body["max_tokens"] = maxTok
	}
	if rng.IntN(2) == 0 {
		body["ignore_eos"] = true
	}
	if rng.IntN(5) == 0 {
		body["min_tokens"] = rng.IntN(maxTok + 1)
	}
	if rng.IntN(3) == 0 {
		body["presence_penalty"] = []float64{-1, 0.5, 2}[rng.IntN(3)]
		body["frequency_penalty"] = []float64{-0.5, 0.8, 2}[rng.IntN(3)]
		body["repetition_penalty"] = []float64{0.8, 1.3, 2}[rng.IntN(3)]
	}
	if rng.IntN(3) == 0 {
		bias := map[string]float64{"101": 5} // 'e'
		for range rng.IntN(3) {
			id := int(simText[rng.IntN(len(simText))])
			if rng.IntN(4) == 0 {
				id = int(sim.EOS)
			}
			bias[strconv.Itoa(id)] = []float64{-100, -5, 3, 100}[rng.IntN(4)]
		}
		body["logit_bias"] = bias
	}
	if rng.IntN(4) == 0 {
		body["min_p"] = []float64{0.05, 0.1, 0.3}[rng.IntN(3)]
	}
	// allowed_token_ids and bad_words never together: they could ban
	// every token.
	switch rng.IntN(5) {
	case 0:
		ids := []int{}
		for _, i := range rng.Perm(len(simText))[:3+rng.IntN(6)] {
			ids = append(ids, int(simText[i]))
		}
		if rng.IntN(2) == 0 {
			ids = append(ids, int(sim.EOS))
		}
		body["allowed_token_ids"] = ids
	case 1:
		words := []string{}
		for range 1 + rng.IntN(3) {
			words = append(words, randWord(rng, 3))
		}
		body["bad_words"] = words
	}
	if rng.IntN(8) == 0 {
		body["stop"] = []string{randWord(rng, 2)}
	}
	if rng.IntN(4) == 0 {
		body["return_tokens_as_token_ids"] = true
	}
	if rng.IntN(6) == 0 {
		body["priority"] = 0
	}
	if rng.IntN(6) == 0 {
		body["timeout"] = 60
	}
	if !stream && rng.IntN(4) == 0 {
		body["prompt_logprobs"] = []int{0, 1, 5}[rng.IntN(3)]
	}
	promptLen := 1 + rng.IntN(40)
	if rng.IntN(2) == 0 {
		promptLen = 40 + rng.IntN(260)
	}
	if chat {
		if rng.IntN(2) == 0 {
			body["logprobs"] = true
			if rng.IntN(4) != 0 {
				body["top_logprobs"] = []int{0, 1, 5, 20}[rng.IntN(4)]
			}
		}
		msgs := []map[string]any{}
		if rng.IntN(2) == 0 {
			msgs = append(msgs, map[string]any{"role": "system", "content": randText(rng, 1+rng.IntN(60))})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": randText(rng, promptLen)})
		if rng.IntN(6) == 0 { // continue the assistant's message, echoed
			msgs = append(msgs, map[string]any{"role": "assistant", "content": randWord(rng, 8)})
			body["echo"], body["continue_final_message"], body["add_generation_prompt"] = true, true, false
		}
		body["messages"] = msgs
		return samplingReq{"/v1/chat/completions", body}
	}
	if rng.IntN(2) == 0 {
		body["logprobs"] = []int{0, 1, 5, 20}[rng.IntN(4)]
	}
	if rng.IntN(4) == 0 {
		body["echo"] = true
	}
	if rng.IntN(4) == 0 {
		ids := make([]int, promptLen)
		for i := range ids {
			ids[i] = int(simText[rng.IntN(len(simText))])
		}
		body["prompt"] = ids
	} else {
		body["prompt"] = randText(rng, promptLen)
	}
	if !stream && rng.IntN(2) == 0 {
		body["best_of"] = n + rng.IntN(4)
	}
	if rng.IntN(8) == 0 { // the prompt alone: scoring
		body["max_tokens"], body["echo"], body["n"] = 0, true, 1
		delete(body, "best_of")
		delete(body, "min_tokens")
	}
	return samplingReq{"/v1/completions", body}
}

// wireChoice is a choice of any answer or stream event, completion or chat.
type wireChoice struct {
	Index   int     `json:"index"`
	Text    *string `json:"text"`
	Message *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	TokenIDs     []int32 `json:"token_ids"`
	FinishReason *string `json:"finish_reason"`
	Logprobs     *struct {
		TextOffset    []int             `json:"text_offset"`
		TokenLogprobs []json.RawMessage `json:"token_logprobs"`
		Tokens        []string          `json:"tokens"`
		TopLogprobs   []json.RawMessage `json:"top_logprobs"`
		Content       []json.RawMessage `json:"content"`
	} `json:"logprobs"`
}

type wireAnswer struct {
	ID      string          `json:"id"`
	Choices []wireChoice    `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

// choiceSum is one choice's whole output: a response's choice, or the
// concatenation of a stream's deltas for one index. Logprob entries are
// kept as their raw JSON.
type choiceSum struct {
	Text          string
	TokenIDs      []int32
	TextOffset    []int
	TokenLogprobs []string
	Tokens        []string
	TopLogprobs   []string
	Content       []string
	Finish        string
	Finishes      int
}

// answerSum is a whole answer, streamed or not.
type answerSum struct {
	Choices []choiceSum
	// Usage is the normalized usage (a stream's: its include_usage chunk).
	Usage string
}

func raws(rs []json.RawMessage) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

func (a *answerSum) add(c wireChoice) {
	for len(a.Choices) <= c.Index {
		a.Choices = append(a.Choices, choiceSum{})
	}
	s := &a.Choices[c.Index]
	switch {
	case c.Text != nil:
		s.Text += *c.Text
	case c.Message != nil:
		s.Text += c.Message.Content
	case c.Delta != nil && c.Delta.Content != nil:
		s.Text += *c.Delta.Content
	}
	s.TokenIDs = append(s.TokenIDs, c.TokenIDs...)
	if l := c.Logprobs; l != nil {
		s.TextOffset = append(s.TextOffset, l.TextOffset...)
		s.TokenLogprobs = append(s.TokenLogprobs, raws(l.TokenLogprobs)...)
		s.Tokens = append(s.Tokens, l.Tokens...)
		s.TopLogprobs = append(s.TopLogprobs, raws(l.TopLogprobs)...)
		s.Content = append(s.Content, raws(l.Content)...)
	}
	if c.FinishReason != nil {
		s.Finish = *c.FinishReason
		s.Finishes++
	}
}

// summarizeResponse reads a non-streamed answer.
func summarizeResponse(t *testing.T, body []byte) answerSum {
	t.Helper()
	var w wireAnswer
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	var a answerSum
	for i, c := range w.Choices {
		if c.Index != i {
			t.Fatalf("choice %d has index %d: %s", i, c.Index, body)
		}
		a.add(c)
	}
	a.Usage = string(normalize(w.Usage))
	return a
}

// summarizeStream reads a stream: every event's choices concatenated per
// index. Every event has the same id, every choice finishes exactly once,
// and the stream ends with [DONE] and carries no error.
func summarizeStream(t *testing.T, body []byte) answerSum {
	t.Helper()
	var a answerSum
	id, done := "", false
	for _, ev := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || done {
			t.Fatalf("event %q out of place in stream:\n%s", ev, body)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var w wireAnswer
		if err := json.Unmarshal([]byte(data), &w); err != nil {
			t.Fatalf("bad event %q: %v", data, err)
		}
		if w.Error != nil {
			t.Fatalf("error event in stream: %s", data)
		}
		if id == "" {
			id = w.ID
		} else if w.ID != id {
			t.Fatalf("event id %q, stream's %q", w.ID, id)
		}
		for _, c := range w.Choices {
			a.add(c)
		}
		if len(w.Usage) > 0 && string(w.Usage) != "null" {
			a.Usage = string(normalize(w.Usage))
		}
	}
	if !done {
		t.Fatalf("stream without [DONE]:\n%s", body)
	}
	for i, c := range a.Choices {
		if c.Finishes != 1 {
			t.Fatalf("choice %d finished %d times:\n%s", i, c.Finishes, body)
		}
	}
	return a
}

// sumsEqual compares answers with empty and nil lists equal.
var sumsEqual = cmpopts.EquateEmpty()

// checkAnswer checks the structure of a non-streamed answer to r: n
// choices (index 0…n−1), and usage counts every returned choice's tokens.
func checkAnswer(t *testing.T, r samplingReq, body []byte) {
	t.Helper()
	var w struct {
		Choices []struct {
			Index    int     `json:"index"`
			TokenIDs []int32 `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	if len(w.Choices) != r.n() {
		t.Fatalf("%d choices, want n = %d: %s", len(w.Choices), r.n(), body)
	}
	sum := 0
	for i, c := range w.Choices {
		if c.Index != i {
			t.Fatalf("choice %d has index %d: %s", i, c.Index, body)
		}
		sum += len(c.TokenIDs)
	}
	if r.body["return_token_ids"] == true && w.Usage.CompletionTokens != sum {
		t.Fatalf("usage.completion_tokens %d, the choices hold %d tokens: %s", w.Usage.CompletionTokens, sum, body)
	}
	if w.Usage.TotalTokens != w.Usage.PromptTokens+w.Usage.CompletionTokens || w.Usage.PromptTokens < 1 {
		t.Fatalf("usage %+v: %s", w.Usage, body)
	}
}

// cachedTokensOf is a non-streamed answer's usage.prompt_tokens_details.cached_tokens.
func cachedTokensOf(t *testing.T, body []byte) int {
	t.Helper()
	var w struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	return w.Usage.PromptTokensDetails.CachedTokens
}

// promptTokensOf is a non-streamed answer's usage.prompt_tokens.
func promptTokensOf(t *testing.T, body []byte) int {
	t.Helper()
	var w struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	return w.Usage.PromptTokens
}

// pairResult is one request's answer bodies from PD (bp) and colocated (bc).
type pairResult struct {
	r      samplingReq
	bp, bc []byte
}

// sendBoth sends every request of reqs to PD and then to colocated, all
// requests at once, and fails the test unless every answer is a 200.
func sendBoth(t *testing.T, pdURL, coURL string, reqs []samplingReq) []pairResult {
	t.Helper()
	type result struct {
		pairResult
		sp, sc     int
		errP, errC error
	}
	results := make([]result, len(reqs))
	done := make(chan int, len(reqs))
	for i, r := range reqs {
		go func() {
			res := result{pairResult: pairResult{r: r}}
			res.sp, res.bp, res.errP = post(pdURL+r.path, r.body)
			res.sc, res.bc, res.errC = post(coURL+r.path, r.body)
			results[i] = res
			done <- i
		}()
	}
	for range reqs {
		<-done
	}
	out := make([]pairResult, len(reqs))
	for i, res := range results {
		r := res.r
		if res.errP != nil || res.errC != nil || res.sp != http.StatusOK || res.sc != http.StatusOK {
			t.Fatalf("request %d %s %v: PD %d %s %v; colocated %d %s %v", i, r.path, r.body, res.sp, res.bp, res.errP,
				res.sc, res.bc, res.errC)
		}
		out[i] = res.pairResult
	}
	return out
}

// post is postJSON for any goroutine: it returns errors instead of
// failing the test.
func post(url string, body any) (int, []byte, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// exchange sends r to PD and to the colocated worker and fails unless the
// answers are the same (streams: the same per-choice concatenations, finish
// reasons and usage; a stream also gives what the request not streamed
// gives). It returns PD's body.
func exchange(t *testing.T, what string, pdURL, coURL string, r samplingReq) []byte {
	t.Helper()
	sp, bp := postJSON(t, pdURL+r.path, r.body)
	sc, bc := postJSON(t, coURL+r.path, r.body)
	if sp != http.StatusOK || sc != http.StatusOK {
		t.Fatalf("%s %s %v: PD %d %s; colocated %d %s", what, r.path, r.body, sp, bp, sc, bc)
	}
	if !r.stream() {
		if np, nc := normalize(bp), normalize(bc); !bytes.Equal(np, nc) {
			t.Fatalf("%s %s %v: PD differs from colocated\nPD:        %s\ncolocated: %s\n(-colocated +PD):\n%s",
				what, r.path, r.body, np, nc, cmp.Diff(summarizeResponse(t, bc), summarizeResponse(t, bp), sumsEqual))
		}
		checkAnswer(t, r, bp)
		return bp
	}
	a, c := summarizeStream(t, bp), summarizeStream(t, bc)
	if d := cmp.Diff(c, a, sumsEqual); d != "" {
		t.Fatalf("%s %s %v: PD's stream differs from colocated's (-colocated +PD):\n%s", what, r.path, r.body, d)
	}
	if len(a.Choices) != r.n() {
		t.Fatalf("%s: %d choices streamed, want %d", what, len(a.Choices), r.n())
	}
	plain := r.withoutStream()
	s, bn := postJSON(t, pdURL+plain.path, plain.body)
	if s != http.StatusOK {
		t.Fatalf("%s not streamed: %d %s", what, s, bn)
	}
	n := summarizeResponse(t, bn)
	if a.Usage == "" {
		n.Usage = ""
	}
	if d := cmp.Diff(n, a, sumsEqual); d != "" {
		t.Fatalf("%s %s %v: the stream differs from the answer not streamed (-not streamed +streamed):\n%s", what, r.path, r.body, d)
	}
	return bp
}

// TestPDEqualsColocatedSampling: random requests on both endpoints,
// streamed and not, greedy and seeded, with every sampling field mixed in,
// get the same answer byte for byte (but id, created and cached_tokens)
// from a router over a prefill/decode pair as from a colocated worker,
// with the prefix cache on (cold and warm: some requests are sent twice)
// and off.
func TestPDEqualsColocatedSampling(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(2026, 12))
	t.Run("cache", func(t *testing.T) {
		pd := startPD(t, pdOptions{})
		co := startServe(t, sim.Config{})
		for i := range 40 {
			r := randomSamplingRequest(rng)
			what := fmt.Sprintf("request %d", i)
			first := exchange(t, what, pd.URL(), co.URL, r)
			if i%4 != 0 {
				continue
			}
			// Again, with the prompt's pages in both caches now.
			again := exchange(t, what+" again", pd.URL(), co.URL, r)
			if r.stream() {
				continue // exchange compared the stream with the answer not streamed
			}
			if !bytes.Equal(normalize(first), normalize(again)) {
				t.Fatalf("%s %v: warm answer differs\ncold: %s\nwarm: %s", what, r.body, first, again)
			}
			// A prompt of more than a page (that is not scored) is found in
			// prefill's cache the second time (an answer cut by a stop
			// string may report 0, as docs/api.md says).
			_, stop := r.body["stop"]
			if p := promptTokensOf(t, again); !r.scoring() && !stop && p > 16 && cachedTokensOf(t, again) == 0 {
				t.Fatalf("%s %v: %d prompt tokens sent twice, none cached: %s", what, r.body, p, again)
			}
		}
	})
	t.Run("nocache", func(t *testing.T) {
		mc := testMachine()
		mc.PrefixCache = false
		pd := startPD(t, pdOptions{machine: &mc})
		co := startServeWith(t, sim.Config{}, func(o *cluster.WorkerOptions) { o.Machine.PrefixCache = false })
		for i := range 16 {
			r := randomSamplingRequest(rng)
			what := fmt.Sprintf("request %d without cache", i)
			body := exchange(t, what, pd.URL(), co.URL, r)
			if i%4 == 0 {
				again := exchange(t, what+" again", pd.URL(), co.URL, r)
				if !r.stream() && !bytes.Equal(normalize(body), normalize(again)) {
					t.Fatalf("%s %v: the answer changed\nfirst: %s\nagain: %s", what, r.body, body, again)
				}
			}
			if !r.stream() && cachedTokensOf(t, body) != 0 {
				t.Fatalf("%s: cached tokens without a prefix cache: %s", what, body)
			}
		}
	})
	// Concurrent requests, in a decode pool small enough that decode
	// preempts (and recomputes) some of them.
	t.Run("concurrent", func(t *testing.T) {
		pageBytes := int64(testGeometry.BytesPerToken() * 16)
		pd := startPD(t, pdOptions{memory: 80 * pageBytes, router: noAdmission()})
		co := startServe(t, sim.Config{})
		// Connections the client dialed and never used would hold the
		// servers' shutdown 5 s (net/http waits that long for them).
		t.Cleanup(http.DefaultClient.CloseIdleConnections)
		const n = 24
		reqs := make([]samplingReq, n)
		for i := range reqs {
			r := randomSamplingRequest(rng)
			if r.body["max_tokens"] != 0 {
				delete(r.body, "max_completion_tokens")
				r.body["max_tokens"] = 30 + rng.IntN(40)
			}
			reqs[i] = r
		}
		for i, res := range sendBoth(t, pd.URL(), co.URL, reqs) {
			r := res.r
			if r.stream() {
				if d := cmp.Diff(summarizeStream(t, res.bc), summarizeStream(t, res.bp), sumsEqual); d != "" {
					t.Fatalf("request %d %s %v: PD's stream differs from colocated's (-colocated +PD):\n%s", i, r.path, r.body, d)
				}
			} else if !bytes.Equal(normalize(res.bp), normalize(res.bc)) {
				t.Fatalf("request %d %s %v: PD differs from colocated (-colocated +PD):\n%s", i, r.path, r.body,
					cmp.Diff(summarizeResponse(t, res.bc), summarizeResponse(t, res.bp), sumsEqual))
			}
		}
		t.Logf("decode preempted %v times", counterValue(t, workerGatherer{pd.Decode[0]}, "pdserve_preemptions_total", "", ""))
	})
	// --logprobs-mode processed_logprobs on both: the logprobs of the
	// distribution each token was drawn from (excluded tokens at -9999),
	// the first token's from prefill under PD; best_of ranks by them.
	t.Run("processed", func(t *testing.T) {
		api := openai.APIOptions{LogprobsMode: model.LogprobsProcessed}
		pd := startPD(t, pdOptions{api: api})
		co := startServeWith(t, sim.Config{}, func(o *cluster.WorkerOptions) { o.API = api })
		for i := range 16 {
			r := randomSamplingRequest(rng)
			exchange(t, fmt.Sprintf("request %d, processed logprobs", i), pd.URL(), co.URL, r)
		}
		// top_k 2 of 5 alternatives: the other 3 are excluded.
		for _, r := range []samplingReq{
			{"/v1/completions", map[string]any{"prompt": "processed", "logprobs": 5, "top_k": 2, "n": 2, "best_of": 3,
				"seed": 3, "temperature": 0.8, "max_tokens": 6}},
			{"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "processed"}},
				"logprobs": true, "top_logprobs": 5, "top_k": 2, "n": 2, "stream": true, "seed": 3, "temperature": 0.8, "max_tokens": 6}},
		} {
			if body := exchange(t, "top_k 2, processed logprobs", pd.URL(), co.URL, r); !bytes.Contains(body, []byte(":-9999")) {
				t.Fatalf("%v: no logprob at the floor (-9999) for the tokens top_k excluded: %s", r.body, body)
			}
		}
	})
}

// TestSeededChoicesReproducible: n choices with a seed come back the same
// for the same request, streamed or not; sampled choices of 8 tokens or
// more are not all the same; choices are indexed 0…n−1, and usage counts
// the prompt once and every choice's tokens.
func TestSeededChoicesReproducible(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	rng := rand.New(rand.NewPCG(9, 9))
	for i, n := range []int{2, 4, 8, 2, 4, 8} {
		r := samplingReq{"/v1/completions", map[string]any{"prompt": randText(rng, 20+rng.IntN(100))}}
		if i%2 == 1 {
			r = samplingReq{"/v1/chat/completions", map[string]any{"messages": []map[string]any{
				{"role": "user", "content": randText(rng, 20+rng.IntN(100))}}}}
		}
		maxTok := 8 + rng.IntN(16)
		maps.Copy(r.body, map[string]any{"n": n, "seed": rng.Int64N(1 << 40), "temperature": []float64{0.7, 1, 1.5}[i%3],
			"max_tokens": maxTok, "ignore_eos": i < 3, "return_token_ids": true})
		what := fmt.Sprintf("request %d (%s, n %d)", i, r.path, n)
		s1, b1 := postJSON(t, pd.URL()+r.path, r.body)
		s2, b2 := postJSON(t, pd.URL()+r.path, r.body)
		if s1 != http.StatusOK || s2 != http.StatusOK {
			t.Fatalf("%s: %d %s; %d %s", what, s1, b1, s2, b2)
		}
		if !bytes.Equal(normalize(b1), normalize(b2)) {
			t.Fatalf("%s: the same request answered differently\n%s\n%s", what, b1, b2)
		}
		checkAnswer(t, r, b1)
		a := summarizeResponse(t, b1)
		distinct := map[string]bool{}
		for _, c := range a.Choices {
			distinct[fmt.Sprint(c.TokenIDs)] = true
			if i < 3 && len(c.TokenIDs) != maxTok {
				t.Fatalf("%s: ignore_eos, max_tokens %d: a choice of %d tokens", what, maxTok, len(c.TokenIDs))
			}
		}
		if len(distinct) < 2 {
			t.Fatalf("%s: the %d sampled choices are all the same: %s", what, n, b1)
		}
		// Streamed, the same choices (interleaved).
		st := samplingReq{r.path, maps.Clone(r.body)}
		st.body["stream"] = true
		st.body["stream_options"] = map[string]any{"include_usage": true}
		s3, b3 := postJSON(t, pd.URL()+st.path, st.body)
		if s3 != http.StatusOK {
			t.Fatalf("%s streamed: %d %s", what, s3, b3)
		}
		if d := cmp.Diff(a, summarizeStream(t, b3), sumsEqual); d != "" {
			t.Fatalf("%s: streamed differs (-not streamed +streamed):\n%s", what, d)
		}
	}
}

// completionLogprobs is the part of a completion answer the scoring and
// best_of tests read.
type completionLogprobs struct {
	Choices []struct {
		Index    int     `json:"index"`
		Text     string  `json:"text"`
		TokenIDs []int32 `json:"token_ids"`
		Finish   string  `json:"finish_reason"`
		Logprobs *struct {
			TextOffset    []int                        `json:"text_offset"`
			TokenLogprobs []*float64                   `json:"token_logprobs"`
			Tokens        []string                     `json:"tokens"`
			TopLogprobs   []map[string]json.RawMessage `json:"top_logprobs"`
		} `json:"logprobs"`
		PromptLogprobs []map[string]struct {
			Logprob json.Number `json:"logprob"`
		} `json:"prompt_logprobs"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func decodeLogprobs(t *testing.T, body []byte) completionLogprobs {
	t.Helper()
	var c completionLogprobs
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	return c
}

// workerTotal sums a worker metric over all its series.
func workerTotal(t *testing.T, w gatherer, metric string) float64 {
	t.Helper()
	return counterValue(t, w, metric, "", "")
}

// TestScoringPromptUnderPD: {"echo": true, "logprobs": 1, "max_tokens": 0}
// scores the prompt: the text is the prompt, its tokens cover it, the first
// logprob is null and the others finite and ≤ 0, the same as a colocated
// worker's and as the prompt logprobs of a generation; under PD prefill
// alone answers it, so no KV moves and decode never sees it.
func TestScoringPromptUnderPD(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	p, d := workerGatherer{pd.Prefill[0]}, workerGatherer{pd.Decode[0]}
	const prompt = "the kv cache is not moved when a prompt is only scored, Really."
	for _, extra := range []map[string]any{{}, {"logprobs": 5, "return_token_ids": true}, {"return_tokens_as_token_ids": true}} {
		req := map[string]any{"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 0}
		maps.Copy(req, extra)
		prefillDone := workerTotal(t, p, "pdserve_requests_finished_total")
		decodeDone := workerTotal(t, d, "pdserve_requests_finished_total")
		sentBefore, recvBefore := workerTotal(t, p, "pdserve_kv_transfer_bytes_total"), workerTotal(t, d, "pdserve_kv_transfer_bytes_total")

		sp, bp := postJSON(t, pd.URL()+"/v1/completions", req)
		sc, bc := postJSON(t, co.URL+"/v1/completions", req)
		if sp != http.StatusOK || sc != http.StatusOK {
			t.Fatalf("%v: PD %d %s; colocated %d %s", req, sp, bp, sc, bc)
		}
		if !bytes.Equal(normalize(bp), normalize(bc)) {
			t.Fatalf("%v: PD differs from colocated\nPD:        %s\ncolocated: %s", req, bp, bc)
		}
		c := decodeLogprobs(t, bp)
		if len(c.Choices) != 1 || c.Choices[0].Text != prompt || c.Choices[0].Logprobs == nil || c.Usage.CompletionTokens != 0 ||
			c.Usage.PromptTokens != len(prompt) || c.Choices[0].Finish != "length" {
			t.Fatalf("%v: %s", req, bp)
		}
		lp := c.Choices[0].Logprobs
		if len(lp.Tokens) != len(prompt) || len(lp.TokenLogprobs) != len(prompt) || len(lp.TopLogprobs) != len(prompt) ||
			len(lp.TextOffset) != len(prompt) {
			t.Fatalf("%v: logprobs of %d tokens for a prompt of %d: %s", req, len(lp.Tokens), len(prompt), bp)
		}
		offset := 0 // characters of the token strings before
		for j := range prompt {
			tok := prompt[j : j+1]
			if extra["return_tokens_as_token_ids"] == true {
				tok = fmt.Sprintf("token_id:%d", prompt[j])
			}
			if lp.Tokens[j] != tok || lp.TextOffset[j] != offset {
				t.Fatalf("%v: token %d is %q at offset %d, want %q at %d", req, j, lp.Tokens[j], lp.TextOffset[j], tok, offset)
			}
			offset += len(tok)
			switch v := lp.TokenLogprobs[j]; {
			case j == 0 && v != nil:
				t.Fatalf("%v: the first token's logprob is %v, want null", req, *v)
			case j == 0 && lp.TopLogprobs[0] != nil:
				t.Fatalf("%v: the first token has top logprobs %v, want null", req, lp.TopLogprobs[0])
			case j > 0 && (v == nil || math.IsInf(*v, 0) || math.IsNaN(*v) || *v > 0 || *v <= -9999):
				t.Fatalf("%v: token %d's logprob %v", req, j, v)
			case j > 0 && len(lp.TopLogprobs[j]) < 1:
				t.Fatalf("%v: token %d has no top logprobs", req, j)
			}
		}
		// Prefill answered it; decode never saw it and no KV moved.
		waitFor(t, 5*time.Second, "prefill finished the scoring request", func() (bool, string) {
			got := workerTotal(t, p, "pdserve_requests_finished_total")
			return got == prefillDone+1, fmt.Sprintf("prefill finished %v requests, want %v", got, prefillDone+1)
		})
		if got := workerTotal(t, d, "pdserve_requests_finished_total"); got != decodeDone {
			t.Fatalf("%v: decode finished %v requests, before %v: %s", req, got, decodeDone, debugCounters(t, pd))
		}
		sent, recv := workerTotal(t, p, "pdserve_kv_transfer_bytes_total"), workerTotal(t, d, "pdserve_kv_transfer_bytes_total")
		if sent != sentBefore || recv != recvBefore {
			t.Fatalf("%v: KV bytes moved for a scored prompt: prefill sent %v, decode received %v", req, sent-sentBefore, recv-recvBefore)
		}
	}

	// The scores are the prompt logprobs a generation reports.
	s, b := postJSON(t, pd.URL()+"/v1/completions", map[string]any{"prompt": prompt, "echo": true, "logprobs": 0, "max_tokens": 0})
	if s != http.StatusOK {
		t.Fatalf("%d %s", s, b)
	}
	var scores struct {
		Choices []struct {
			Logprobs struct {
				TokenLogprobs []json.RawMessage `json:"token_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	s, g := postJSON(t, pd.URL()+"/v1/completions", map[string]any{"prompt": prompt, "prompt_logprobs": 0, "max_tokens": 2, "seed": 1})
	if s != http.StatusOK {
		t.Fatalf("%d %s", s, g)
	}
	var gen struct {
		Choices []struct {
			PromptLogprobs []map[string]struct {
				Logprob json.RawMessage `json:"logprob"`
			} `json:"prompt_logprobs"`
		} `json:"choices"`
	}
	if json.Unmarshal(b, &scores) != nil || json.Unmarshal(g, &gen) != nil || len(scores.Choices) != 1 || len(gen.Choices) != 1 ||
		len(gen.Choices[0].PromptLogprobs) != len(prompt) {
		t.Fatalf("scores %s; generation %s", b, g)
	}
	for j := 1; j < len(prompt); j++ {
		e, ok := gen.Choices[0].PromptLogprobs[j][strconv.Itoa(int(prompt[j]))]
		if !ok || string(e.Logprob) != string(scores.Choices[0].Logprobs.TokenLogprobs[j]) {
			t.Fatalf("prompt token %d: scored %s, the generation's prompt_logprobs %v", j, scores.Choices[0].Logprobs.TokenLogprobs[j],
				gen.Choices[0].PromptLogprobs[j])
		}
	}

	// A generation does move KV: the metrics read above count.
	before := workerTotal(t, d, "pdserve_kv_transfer_bytes_total")
	if s, b := postJSON(t, pd.URL()+"/v1/completions", map[string]any{"prompt": "another prompt entirely, of some length", "max_tokens": 2}); s != http.StatusOK {
		t.Fatalf("%d %s", s, b)
	}
	waitFor(t, 5*time.Second, "decode received KV for a generation", func() (bool, string) {
		got := workerTotal(t, d, "pdserve_kv_transfer_bytes_total")
		return got > before, fmt.Sprintf("decode received %v bytes in all", got)
	})
}

// TestBestOfRanksByLogprob: best_of generates best_of choices and returns
// the n with the highest cumulative logprob, best first: exactly the best n
// of the choices the request with n = best_of gets; usage counts only the
// choices returned. best_of with stream is refused.
func TestBestOfRanksByLogprob(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	rng := rand.New(rand.NewPCG(4, 1))
	cumulative := func(ch []float64) float64 {
		s := 0.0
		for _, v := range ch {
			s += v
		}
		return s
	}
	for i := range 8 {
		n := 1 + rng.IntN(3)
		bestOf := n + 1 + rng.IntN(4)
		req := map[string]any{"prompt": randText(rng, 10+rng.IntN(80)), "n": n, "best_of": bestOf, "logprobs": 0,
			"seed": rng.Int64N(1 << 40), "temperature": 1.2, "max_tokens": 2 + rng.IntN(14), "ignore_eos": i%2 == 0, "return_token_ids": true}
		s, b := postJSON(t, pd.URL()+"/v1/completions", req)
		if s != http.StatusOK {
			t.Fatalf("%v: %d %s", req, s, b)
		}
		got := decodeLogprobs(t, b)
		// Every candidate: the same request with n = best_of.
		all := maps.Clone(req)
		delete(all, "best_of")
		all["n"] = bestOf
		s, ab := postJSON(t, pd.URL()+"/v1/completions", all)
		if s != http.StatusOK {
			t.Fatalf("%v: %d %s", all, s, ab)
		}
		cands := decodeLogprobs(t, ab)
		if len(got.Choices) != n || len(cands.Choices) != bestOf {
			t.Fatalf("%v: %d choices, want %d; with n = best_of %d, want %d", req, len(got.Choices), n, len(cands.Choices), bestOf)
		}
		type cand struct {
			cum  float64
			text string
			ids  []int32
		}
		lps := func(c int, a completionLogprobs) []float64 {
			var out []float64
			for _, v := range a.Choices[c].Logprobs.TokenLogprobs {
				out = append(out, *v)
			}
			return out
		}
		var ranked []cand
		for c := range cands.Choices {
			ranked = append(ranked, cand{cumulative(lps(c, cands)), cands.Choices[c].Text, cands.Choices[c].TokenIDs})
		}
		slices.SortStableFunc(ranked, func(a, b cand) int { return stdcmp.Compare(b.cum, a.cum) })
		tokens := 0
		for c := range got.Choices {
			cum := cumulative(lps(c, got))
			if c > 0 && cum > cumulative(lps(c-1, got)) {
				t.Fatalf("%v: choice %d has cumulative logprob %v, above choice %d's %v: %s", req, c, cum, c-1, cumulative(lps(c-1, got)), b)
			}
			if got.Choices[c].Index != c || got.Choices[c].Text != ranked[c].text || !slices.Equal(got.Choices[c].TokenIDs, ranked[c].ids) ||
				cum != ranked[c].cum {
				t.Fatalf("%v: choice %d is %q %v (cumulative %v); the best candidates %+v", req, c, got.Choices[c].Text,
					got.Choices[c].TokenIDs, cum, ranked)
			}
			tokens += len(got.Choices[c].TokenIDs)
		}
		if got.Usage.CompletionTokens != tokens {
			t.Fatalf("%v: usage counts %d tokens, the choices returned hold %d", req, got.Usage.CompletionTokens, tokens)
		}
	}
	for _, url := range []string{pd.URL(), co.URL} {
		for _, body := range []string{
			`{"prompt":"abc","n":1,"best_of":2,"stream":true,"max_tokens":4}`,
			`{"prompt":"abc","n":3,"best_of":2,"max_tokens":4}`,
		} {
			s, b := postJSON(t, url+"/v1/completions", body)
			var e struct {
				Error struct {
					Param string `json:"param"`
				} `json:"error"`
			}
			if s != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Param != "best_of" {
				t.Fatalf("%s: %d %s, want 400 naming best_of", body, s, b)
			}
		}
		s, b := postJSON(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"best_of":2}`)
		if s != http.StatusBadRequest || !strings.Contains(string(b), "best_of") {
			t.Fatalf("chat best_of 2: %d %s, want 400 naming best_of", s, b)
		}
	}
}

// TestRequestTimeout: a request's own timeout fails it with 504
// timeout_request when it passes, streamed or not, under PD and on a
// colocated worker, instead of running on; a generous one does not get in
// the way.
func TestRequestTimeout(t *testing.T) {
	t.Parallel()
	// 2 ms a decode step: 500 tokens take a second at least.
	slow := sim.Config{DecodePerStep: 2 * time.Millisecond}
	pd := startPD(t, pdOptions{sim: slow})
	co := startServe(t, slow)
	cl := &http.Client{Timeout: 20 * time.Second} // a hang fails the test
	type errBody struct {
		Error *struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	for _, base := range []string{pd.URL(), co.URL} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			req := map[string]any{"timeout": 0.001, "max_tokens": 500, "ignore_eos": true}
			if path == "/v1/completions" {
				req["prompt"] = "this request has a millisecond"
			} else {
				req["messages"] = []map[string]any{{"role": "user", "content": "this request has a millisecond"}}
			}
			s, b := postWith(t, cl, base+path, req)
			var e errBody
			if s != http.StatusGatewayTimeout || json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Code != "timeout_request" {
				t.Fatalf("%s%s %v: %d %s, want 504 timeout_request", base, path, req, s, b)
			}
			// Streamed, with time for some output first: the timeout ends
			// it with an error (an event if output had started).
			req["stream"], req["timeout"] = true, 0.3
			s, b = postWith(t, cl, base+path, req)
			switch {
			case s == http.StatusGatewayTimeout:
				if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Code != "timeout_request" {
					t.Fatalf("%s%s streamed: %d %s, want timeout_request", base, path, s, b)
				}
			case s == http.StatusOK:
				events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
				if len(events) < 2 || events[len(events)-1] != "data: [DONE]" ||
					json.Unmarshal([]byte(strings.TrimPrefix(events[len(events)-2], "data: ")), &e) != nil ||
					e.Error == nil || e.Error.Code != "timeout_request" {
					t.Fatalf("%s%s streamed: the stream does not end with a timeout_request error:\n%s", base, path, b)
				}
			default:
				t.Fatalf("%s%s streamed: %d %s", base, path, s, b)
			}
			// A generous timeout: the whole answer.
			delete(req, "stream")
			req["timeout"], req["max_tokens"] = 60, 20
			s, b = postWith(t, cl, base+path, req)
			if s != http.StatusOK {
				t.Fatalf("%s%s %v: %d %s", base, path, req, s, b)
			}
			var ok struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(b, &ok) != nil || ok.Usage.CompletionTokens != 20 {
				t.Fatalf("%s%s %v: %s", base, path, req, b)
			}
		}
	}
}

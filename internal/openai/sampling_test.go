package openai

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
)

// lp is a token with a logprob and alternatives (id, logprob pairs).
func lp(id byte, logprob float32, top ...any) Token {
	t := Token{ID: int32(id), Logprob: logprob}
	for i := 0; i < len(top); i += 2 {
		t.Top = append(t.Top, model.TokenLogprob{ID: int32(top[i].(byte)), Logprob: float32(top[i+1].(float64))})
	}
	return t
}

// wireCompletion is a completion answer as a client decodes it.
type wireCompletion struct {
	Choices []struct {
		Index    int    `json:"index"`
		Text     string `json:"text"`
		Logprobs *struct {
			TextOffset    []int                 `json:"text_offset"`
			TokenLogprobs []*float64            `json:"token_logprobs"`
			Tokens        []string              `json:"tokens"`
			TopLogprobs   []*map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		FinishReason   *string                                 `json:"finish_reason"`
		TokenIDs       []int32                                 `json:"token_ids"`
		PromptLogprobs []map[string]map[string]json.RawMessage `json:"prompt_logprobs"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

func decodeWire[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return v
}

// TestCompletionLogprobs: logprobs N gives each token's string, logprob,
// text offset and the N alternatives with the sampled token added when it
// is not among them; return_tokens_as_token_ids names tokens by id; −∞ is
// written as the floor.
func TestCompletionLogprobs(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: []Token{
		lp('a', -0.25, byte('a'), -0.25, byte('b'), -1.5),
		lp('\xc3', -2, byte('x'), -0.5, byte('y'), -0.75),
		lp('\xa9', float32(math.Inf(-1)), byte('\xa9'), -0.125, byte('z'), -3.0),
	}, FinishReason: "length"})
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":3,"logprobs":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if got := eng.lastReq(t).Sampling.TopLogprobs; got != 2 {
		t.Errorf("engine asked for %d top logprobs, want 2", got)
	}
	// The raw body: order of likelihood, the floor for −∞, a partial
	// UTF-8 token as U+FFFD.
	want := `"logprobs":{"text_offset":[0,1,2],"token_logprobs":[-0.25,-2,-9999],"tokens":["a","\ufffd","\ufffd"],` +
		`"top_logprobs":[{"a":-0.25,"b":-1.5},{"x":-0.5,"y":-0.75,"\ufffd":-2},{"\ufffd":-0.125,"z":-3}]}`
	if !strings.Contains(body, want) {
		t.Fatalf("body %s\nwant it to contain %s", body, want)
	}
	a := decodeWire[wireCompletion](t, body)
	if a.Choices[0].Text != "aé" {
		t.Errorf("text %q", a.Choices[0].Text)
	}

	_, body = post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":3,"logprobs":0,"return_tokens_as_token_ids":true}`)
	want = `"tokens":["token_id:97","token_id:195","token_id:169"],"top_logprobs":[{"token_id:97":-0.25},{"token_id:195":-2},{"token_id:169":-9999}]`
	if !strings.Contains(body, want) {
		t.Fatalf("body %s\nwant it to contain %s", body, want)
	}
	// Without logprobs: null.
	_, body = post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":3}`)
	if !strings.Contains(body, `"logprobs":null`) {
		t.Fatalf("body %s", body)
	}
}

// TestEchoScoresPrompt: echo with logprobs and max_tokens 0 is a scoring
// request: the engine is asked for the prompt's logprobs and no output,
// and the answer is the prompt with its tokens' logprobs, the first null.
func TestEchoScoresPrompt(t *testing.T) {
	eng := newFakeEngine(Chunk{FinishReason: "length", PromptLogprobs: []model.PositionLogprobs{
		{},
		{Token: model.TokenLogprob{ID: 'i', Logprob: -1.5}, Rank: 3, Top: []model.TokenLogprob{{ID: 'a', Logprob: -0.5}, {ID: 'b', Logprob: -1}}},
	}})
	srv := newServer(t, eng)
	_, body := post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":0,"echo":true,"logprobs":1,"prompt_logprobs":2}`)
	g := eng.lastReq(t)
	if g.MaxTokens != 0 || !g.ScorePrompt || g.PromptTopLogprobs != 2 || g.N > 1 {
		t.Fatalf("engine request %+v", g)
	}
	want := `"text":"hi","logprobs":{"text_offset":[0,1],"token_logprobs":[null,-1.5],"tokens":["h","i"],"top_logprobs":[null,{"a":-0.5,"i":-1.5}]},"finish_reason":"length"`
	if !strings.Contains(body, want) {
		t.Fatalf("body %s\nwant it to contain %s", body, want)
	}
	want = `"prompt_logprobs":[null,{"105":{"logprob":-1.5,"rank":3,"decoded_token":"i"},"97":{"logprob":-0.5,"rank":1,"decoded_token":"a"},"98":{"logprob":-1,"rank":2,"decoded_token":"b"}}]`
	if !strings.Contains(body, want) {
		t.Fatalf("body %s\nwant it to contain %s", body, want)
	}
	if u := decodeWire[wireCompletion](t, body).Usage; u.PromptTokens != 2 || u.CompletionTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
	// An engine that forgets the prompt's logprobs is an error, not a
	// silent null.
	eng2 := newFakeEngine(Chunk{FinishReason: "length"})
	resp, body := post(t, newServer(t, eng2), "/v1/completions", `{"prompt":"hi","max_tokens":0,"echo":true,"logprobs":1}`)
	if resp.StatusCode != 500 || !strings.Contains(body, "no prompt logprobs") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// echo without logprobs: the prompt text, no scoring.
	eng3 := newFakeEngine(chunksOf("yo", 1, "length")...)
	_, body = post(t, newServer(t, eng3), "/v1/completions", `{"prompt":"hi","max_tokens":2,"echo":true}`)
	if g := eng3.lastReq(t); g.ScorePrompt || !strings.Contains(body, `"text":"hiyo"`) {
		t.Fatalf("engine %+v, body %s", g, body)
	}
}

// choiceScript interleaves choices: choice 0 "ab" then EOS-free length,
// choice 1 "xSTOPy" whose stop string ends it early.
func choiceScript() []Chunk {
	return []Chunk{
		{Index: 0, Tokens: []Token{lp('a', -1)}},
		{Index: 1, Tokens: []Token{lp('x', -2)}},
		{Index: 1, Tokens: toks("S")},
		{Index: 1, Tokens: toks("T")},
		{Index: 0, Tokens: []Token{lp('b', -1)}},
		{Index: 1, Tokens: toks("OPy")}, // dropped: the stop string ended choice 1
		{Index: 0, Tokens: []Token{lp('c', -1)}, FinishReason: "length"},
		{Index: 1, Tokens: toks("z"), FinishReason: "length", Done: true},
	}
}

// TestChoices: n = 2 asks the engine for two choices; a stop string ends
// one alone (StopChoice), the other goes on; the answer has both, indexed,
// and usage counts the prompt once and both choices' tokens.
func TestChoices(t *testing.T) {
	for _, stream := range []bool{false, true} {
		eng := newFakeEngine(choiceScript()...)
		srv := newServer(t, eng)
		body := `{"prompt":"p","max_tokens":3,"n":2,"stop":"STOP","stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
		resp, out := post(t, srv, "/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if g := eng.lastReq(t); g.N != 2 {
			t.Fatalf("engine N = %d", g.N)
		}
		s := eng.nextStream(t)
		checkClosed(t, s, 0)
		s.mu.Lock()
		stops := slices.Clone(s.stopChoices)
		s.mu.Unlock()
		if !slices.Equal(stops, []int{1}) {
			t.Errorf("StopChoice %v, want [1]", stops)
		}
		texts, finish := map[int]string{}, map[int]string{}
		var usage *Usage
		if stream {
			for _, ev := range sseEvents(t, out) {
				if ev == "[DONE]" {
					continue
				}
				a := decodeWire[wireCompletion](t, ev)
				for _, c := range a.Choices {
					if finish[c.Index] != "" {
						t.Errorf("choice %d has an event after its finish: %s", c.Index, ev)
					}
					texts[c.Index] += c.Text
					if c.FinishReason != nil {
						finish[c.Index] = *c.FinishReason
					}
				}
			}
		} else {
			a := decodeWire[wireCompletion](t, out)
			for i, c := range a.Choices {
				if c.Index != i {
					t.Errorf("choice %d has index %d", i, c.Index)
				}
				texts[c.Index], finish[c.Index] = c.Text, *c.FinishReason
			}
			usage = a.Usage
		}
		if want := map[int]string{0: "abc", 1: "x"}; !cmp.Equal(texts, want) {
			t.Errorf("stream %v: texts %v, want %v", stream, texts, want)
		}
		if want := map[int]string{0: "length", 1: "stop"}; !cmp.Equal(finish, want) {
			t.Errorf("stream %v: finish %v, want %v", stream, finish, want)
		}
		if usage != nil && (usage.PromptTokens != 1 || usage.CompletionTokens != 3+5) {
			t.Errorf("usage %+v: want the prompt once and 3 + 5 tokens (up to the stop string's last)", usage)
		}
	}
}

// TestChatChoicesStream: each choice opens with the assistant's role, its
// content and logprobs follow under its index.
func TestChatChoicesStream(t *testing.T) {
	eng := newFakeEngine(
		Chunk{Index: 1, Tokens: []Token{lp('y', -0.5, byte('y'), -0.5)}},
		Chunk{Index: 0, Tokens: []Token{lp('x', -0.25, byte('x'), -0.25)}, FinishReason: "length"},
		Chunk{Index: 1, Tokens: []Token{lp('z', -0.75, byte('q'), -0.5)}, FinishReason: "length", Done: true},
	)
	srv := newServer(t, eng)
	_, out := post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":2,"logprobs":true,"top_logprobs":1,"stream":true}`)
	evs := sseEvents(t, out)
	type chunk struct {
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Role    string  `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			Logprobs *struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	roles, content, tops := map[int]int{}, map[int]string{}, map[int][]string{}
	for i, ev := range evs[:len(evs)-1] {
		c := decodeWire[chunk](t, ev)
		for _, ch := range c.Choices {
			if ch.Delta.Role == "assistant" {
				roles[ch.Index]++
				if content[ch.Index] != "" {
					t.Errorf("event %d: choice %d's role after its content", i, ch.Index)
				}
			}
			if ch.Delta.Content != nil {
				content[ch.Index] += *ch.Delta.Content
			}
			if ch.Logprobs != nil {
				for _, l := range ch.Logprobs.Content {
					if len(l.Bytes) != 1 || l.Bytes[0] != int(l.Token[0]) || len(l.TopLogprobs) != 1 {
						t.Errorf("logprob %+v", l)
					}
					tops[ch.Index] = append(tops[ch.Index], l.Token+">"+l.TopLogprobs[0].Token)
				}
			}
		}
	}
	if !cmp.Equal(roles, map[int]int{0: 1, 1: 1}) || !cmp.Equal(content, map[int]string{0: "x", 1: "yz"}) ||
		!cmp.Equal(tops, map[int][]string{0: {"x>x"}, 1: {"y>y", "z>q"}}) {
		t.Fatalf("roles %v, content %v, logprobs %v:\n%s", roles, content, tops, out)
	}
}

// TestBestOf: best_of generates that many choices and answers with the n
// whose tokens have the highest summed logprob, best first.
func TestBestOf(t *testing.T) {
	eng := newFakeEngine(
		Chunk{Index: 0, Tokens: []Token{lp('a', -3), lp('a', -3)}, FinishReason: "length"},
		Chunk{Index: 1, Tokens: []Token{lp('b', -1), lp('b', -1)}, FinishReason: "length"},
		Chunk{Index: 2, Tokens: []Token{lp('c', -0.5)}, FinishReason: "stop", Done: true},
	)
	srv := newServer(t, eng)
	_, out := post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":2,"n":2,"best_of":3}`)
	if g := eng.lastReq(t); g.N != 3 {
		t.Fatalf("engine N = %d, want best_of 3", g.N)
	}
	a := decodeWire[wireCompletion](t, out)
	if len(a.Choices) != 2 || a.Choices[0].Text != "c" || a.Choices[1].Text != "bb" || a.Choices[0].Index != 0 || a.Choices[1].Index != 1 {
		t.Fatalf("choices %s", out)
	}
	if a.Usage.CompletionTokens != 3 {
		t.Fatalf("usage %+v: want the returned choices' 3 tokens", a.Usage)
	}
}

// TestSamplingFieldsReachTheEngine: the sampling fields arrive in the
// engine's request as the sampler's parameters.
func TestSamplingFieldsReachTheEngine(t *testing.T) {
	eng := newFakeEngine(chunksOf("ok", 2, "length")...)
	srv := newServer(t, eng, func(c *Config) { c.LogprobsMode = model.LogprobsProcessed; c.MaxLogprobs = 30 })
	resp, out := post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":2,"presence_penalty":0.5,"frequency_penalty":-0.25,
		"repetition_penalty":1.25,"logit_bias":{"98":-100,"97":2.5},"min_p":0.1,"allowed_token_ids":[97,98,111,107],
		"bad_words":["no"],"logprobs":30,"priority":-3,"timeout":1.5,"seed":9}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	g := eng.lastReq(t)
	want := model.SamplingParams{Temperature: 1, TopP: 1, Seed: 9, MinP: 0.1, PresencePenalty: 0.5, FrequencyPenalty: -0.25,
		RepetitionPenalty: 1.25, LogitBias: []model.LogitBias{{ID: 97, Bias: 2.5}, {ID: 98, Bias: -100}},
		AllowedTokenIDs: []int32{97, 98, 111, 107}, BadWords: [][]int32{{'n', 'o'}}, TopLogprobs: 30,
		LogprobsMode: model.LogprobsProcessed}
	if d := cmp.Diff(want, g.Sampling); d != "" {
		t.Errorf("sampling (-want +got):\n%s", d)
	}
	if g.Priority != -3 || g.Timeout != 1500*time.Millisecond {
		t.Errorf("priority %d, timeout %v", g.Priority, g.Timeout)
	}
	// Ids outside the vocabulary are refused naming the field.
	srv = newServer(t, eng, func(c *Config) { c.VocabSize = 100 })
	for field, body := range map[string]string{
		"logit_bias":        `"logit_bias":{"100":1}`,
		"allowed_token_ids": `"allowed_token_ids":[1,100]`,
	} {
		resp, out := post(t, srv, "/v1/completions", `{"prompt":[1],`+body+`}`)
		if e := decodeErrorBody(t, out); resp.StatusCode != 400 || e.Param != field || !strings.Contains(e.Message, "outside the vocabulary") {
			t.Errorf("%s: %d %s", field, resp.StatusCode, out)
		}
	}
}

// specialTokenizer is byteTokenizer with byte 1 a special token.
type specialTokenizer struct{ byteTokenizer }

func (specialTokenizer) IsSpecial(id int32) bool { return id == 1 }

// TestSpecialTokensNotRendered: special tokens (model.SpecialTokens) and
// the EOS never appear in the text, wherever they fall in the engine's
// chunks (a choice's EOS need not come in the chunk that finishes it),
// while they are counted and listed in token_ids and logprobs.
func TestSpecialTokensNotRendered(t *testing.T) {
	eng := newFakeEngine(
		Chunk{Index: 0, Tokens: []Token{lp('a', -1), lp(1, -1), lp('b', -1), lp(0, -1)}},
		Chunk{Index: 1, Tokens: []Token{lp('c', -1)}},
		Chunk{Index: 0, Tokens: []Token{{ID: eosID, Logprob: -1}}},
		Chunk{Index: 0, FinishReason: "stop"},
		Chunk{Index: 1, Tokens: []Token{{ID: eosID, Logprob: -1}}, FinishReason: "stop", Done: true},
	)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = specialTokenizer{} })
	_, out := post(t, srv, "/v1/completions", `{"prompt":"p","max_tokens":8,"n":2,"return_token_ids":true,"logprobs":0}`)
	a := decodeWire[wireCompletion](t, out)
	if len(a.Choices) != 2 || a.Choices[0].Text != "ab\x00" || a.Choices[1].Text != "c" {
		t.Fatalf("texts: %s", out)
	}
	if ids := a.Choices[0].TokenIDs; !slices.Equal(ids, []int32{'a', 1, 'b', 0, eosID}) || len(a.Choices[0].Logprobs.Tokens) != 5 {
		t.Fatalf("choice 0 counts every token: %s", out)
	}
}

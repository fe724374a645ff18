package openai

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The tests in this file drive the handler with the official openai-go
// client, to check that what we send parses as OpenAI's own API does.

func newClient(srv *httptest.Server) oai.Client {
	return oai.NewClient(
		option.WithBaseURL(srv.URL+"/v1/"),
		option.WithAPIKey("test"),
		option.WithHTTPClient(srv.Client()),
		option.WithMaxRetries(0),
	)
}

func TestClientCompletion(t *testing.T) {
	eng := newFakeEngine(chunksOf("once upon a time there", 4, "length")...)
	srv := newServer(t, eng)
	c := newClient(srv)
	res, err := c.Completions.New(t.Context(), oai.CompletionNewParams{
		Model:     "m",
		Prompt:    oai.CompletionNewParamsPromptUnion{OfString: oai.String("tell")},
		MaxTokens: oai.Int(16),
		Seed:      oai.Int(7),
		Stop:      oai.CompletionNewParamsStopUnion{OfStringArray: []string{" time", "zz"}},
	}, option.WithJSONSet("return_token_ids", true))
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != "cmpl-rid1" || res.Model != "m" || res.Created != testCreated || string(res.Object) != "text_completion" {
		t.Errorf("header fields %+v", res)
	}
	if len(res.Choices) != 1 {
		t.Fatalf("choices %+v", res.Choices)
	}
	ch := res.Choices[0]
	if ch.Text != "once upon a" || ch.FinishReason != "stop" || ch.Index != 0 {
		t.Errorf("choice %+v", ch)
	}
	var ids []int32
	if err := json.Unmarshal([]byte(ch.JSON.ExtraFields["token_ids"].Raw()), &ids); err != nil || string(toBytes(ids)) != "once upon a time" {
		t.Errorf("token_ids %q (%v)", toBytes(ids), err)
	}
	if u := res.Usage; u.PromptTokens != 4 || u.CompletionTokens != 16 || u.TotalTokens != 20 {
		t.Errorf("usage %+v", u)
	}
	checkClosed(t, eng.nextStream(t), 1)
	if got := eng.lastReq(t); got.MaxTokens != 16 || got.Sampling.Seed != 7 {
		t.Errorf("request %+v", got)
	}
}

func TestClientCompletionTokenPrompt(t *testing.T) {
	eng := newFakeEngine(chunksOf("ok", 1, "stop")...)
	srv := newServer(t, eng)
	c := newClient(srv)
	res, err := c.Completions.New(t.Context(), oai.CompletionNewParams{
		Model:  "m",
		Prompt: oai.CompletionNewParamsPromptUnion{OfArrayOfTokenArrays: [][]int64{{3, 4, 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Text != "ok" || res.Usage.PromptTokens != 3 {
		t.Errorf("%+v", res)
	}
	checkClosed(t, eng.nextStream(t), 0)
	if got := eng.lastReq(t); !cmp.Equal(got.InputIDs, []int32{3, 4, 5}) || got.MaxTokens != DefaultCompletionMaxTokens {
		t.Errorf("request %+v", got)
	}
}

func TestClientCompletionStreaming(t *testing.T) {
	eng := newFakeEngine(chunksOf("héllo wörld", 1, "length")...)
	srv := newServer(t, eng)
	c := newClient(srv)
	stream := c.Completions.NewStreaming(t.Context(), oai.CompletionNewParams{
		Model:         "m",
		Prompt:        oai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"say"}},
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)},
	})
	var text strings.Builder
	var finish string
	var usage oai.CompletionUsage
	n := 0
	for stream.Next() {
		ev := stream.Current()
		n++
		if ev.ID != "cmpl-rid1" {
			t.Errorf("id %q", ev.ID)
		}
		for _, ch := range ev.Choices {
			text.WriteString(ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		if ev.JSON.Usage.Valid() {
			usage = ev.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if text.String() != "héllo wörld" || finish != "length" {
		t.Errorf("text %q finish %q", text.String(), finish)
	}
	// 13 byte tokens, but the two characters of two bytes each come as one event.
	if n != 12 {
		t.Errorf("%d events, want 11 text events + usage", n)
	}
	if usage.PromptTokens != 3 || usage.CompletionTokens != 13 || usage.TotalTokens != 16 {
		t.Errorf("usage %+v", usage)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

func TestClientChat(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("I am <b>fine</b>")}, Chunk{Tokens: []Token{{ID: eosID}}, FinishReason: "stop"})
	srv := newServer(t, eng)
	c := newClient(srv)
	res, err := c.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{
		Model: "m",
		Messages: []oai.ChatCompletionMessageParamUnion{
			oai.SystemMessage("be brief"),
			oai.UserMessage("how are you?"),
		},
		MaxCompletionTokens: oai.Int(17),
		Temperature:         oai.Float(0.5),
		TopP:                oai.Float(0.9),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != "chatcmpl-rid1" || string(res.Object) != "chat.completion" || res.Created != testCreated || res.Model != "m" {
		t.Errorf("header fields %+v", res)
	}
	ch := res.Choices[0]
	if ch.Message.Content != "I am <b>fine</b>" || string(ch.Message.Role) != "assistant" || ch.FinishReason != "stop" {
		t.Errorf("choice %+v", ch)
	}
	prompt := "<system>be brief\n<user>how are you?\n<assistant>"
	if u := res.Usage; u.PromptTokens != int64(len(prompt)) || u.CompletionTokens != 17 || u.TotalTokens != int64(len(prompt))+17 {
		t.Errorf("usage %+v", u)
	}
	checkClosed(t, eng.nextStream(t), 0)
	got := eng.lastReq(t)
	if string(toBytes(got.InputIDs)) != prompt || got.MaxTokens != 17 || got.Sampling.Temperature != 0.5 || got.Sampling.TopP != 0.9 {
		t.Errorf("request %+v", got)
	}
}

func TestClientChatStreaming(t *testing.T) {
	eng := newFakeEngine(chunksOf("Hello there. STOP never", 3, "length")...)
	srv := newServer(t, eng)
	c := newClient(srv)
	stream := c.Chat.Completions.NewStreaming(t.Context(), oai.ChatCompletionNewParams{
		Model:         "m",
		Messages:      []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")},
		Stop:          oai.ChatCompletionNewParamsStopUnion{OfString: oai.String(" STOP")},
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)},
	})
	acc := oai.ChatCompletionAccumulator{}
	var roles []string
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if string(ch.Object) != "chat.completion.chunk" || ch.ID != "chatcmpl-rid1" {
			t.Errorf("chunk %+v", ch)
		}
		for _, c := range ch.Choices {
			if c.Delta.Role != "" {
				roles = append(roles, c.Delta.Role)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if len(acc.Choices) != 1 {
		t.Fatalf("choices %+v", acc.Choices)
	}
	if got := acc.Choices[0].Message.Content; got != "Hello there." {
		t.Errorf("content %q", got)
	}
	if acc.Choices[0].FinishReason != "stop" {
		t.Errorf("finish %q", acc.Choices[0].FinishReason)
	}
	if !cmp.Equal(roles, []string{"assistant"}) {
		t.Errorf("roles %v", roles)
	}
	// "Hello there. STOP" is 17 tokens, read 3 at a time: 18 tokens, 17 counted.
	if u := acc.Usage; u.CompletionTokens != 17 || u.PromptTokens != 20 || u.TotalTokens != 37 {
		t.Errorf("usage %+v", u)
	}
	checkClosed(t, eng.nextStream(t), 1)
}

func TestClientErrors(t *testing.T) {
	eng := newFakeEngine(chunksOf("a", 1, "length")...)
	srv := newServer(t, eng)
	c := newClient(srv)

	_, err := c.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{
		Model:    "gpt-4o",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")},
	})
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v is not an *openai.Error", err)
	}
	if apiErr.StatusCode != 404 || apiErr.Code != CodeModelNotFound || apiErr.Param != "model" || apiErr.Type != TypeInvalidRequest ||
		!strings.Contains(apiErr.Message, "gpt-4o") {
		t.Errorf("error %+v", apiErr)
	}

	_, err = c.Completions.New(t.Context(), oai.CompletionNewParams{
		Model:     "m",
		Prompt:    oai.CompletionNewParamsPromptUnion{OfString: oai.String("hi")},
		MaxTokens: oai.Int(1000),
	})
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v is not an *openai.Error", err)
	}
	if apiErr.StatusCode != 400 || apiErr.Code != CodeContextLengthExceeded || !strings.Contains(apiErr.Message, "maximum context length is 64 tokens") {
		t.Errorf("error %+v", apiErr)
	}
}

func TestClientStreamErrorMidStream(t *testing.T) {
	eng := newFakeEngine(chunksOf("abc", 1, "")...)
	eng.failAt, eng.failErr = 2, Unavailable("decode worker lost")
	srv := newServer(t, eng)
	c := newClient(srv)
	stream := c.Chat.Completions.NewStreaming(t.Context(), oai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")},
	})
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	stream.Close()
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "decode worker lost") {
		t.Errorf("stream error %v", err)
	}
	if text.String() != "ab" {
		t.Errorf("text before the error %q", text.String())
	}
	checkClosed(t, eng.nextStream(t), 0)
}

func TestClientModels(t *testing.T) {
	srv := newServer(t, newFakeEngine())
	c := newClient(srv)
	page, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "m" || page.Data[0].OwnedBy != "pdserve" || page.Data[0].Created != testCreated {
		t.Errorf("models %+v", page.Data)
	}
	m, err := c.Models.Get(t.Context(), "m")
	if err != nil || m.ID != "m" || string(m.Object) != "model" {
		t.Errorf("model %+v, %v", m, err)
	}
	_, err = c.Models.Get(t.Context(), "other")
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != CodeModelNotFound {
		t.Errorf("error %v", err)
	}
}

// TestClientLogprobsAndChoices: the official client reads several choices
// and their logprobs in its own types, on both endpoints.
func TestClientLogprobsAndChoices(t *testing.T) {
	script := []Chunk{
		{Index: 1, Tokens: []Token{lp('y', -0.5, byte('y'), -0.5, byte('z'), -1.0)}, FinishReason: "length"},
		{Index: 0, Tokens: []Token{lp('x', -0.25, byte('x'), -0.25, byte('w'), -2.0)}, FinishReason: "length", Done: true},
	}
	c := newClient(newServer(t, newFakeEngine(script...)))
	res, err := c.Completions.New(t.Context(), oai.CompletionNewParams{
		Model:  "m",
		Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("p")},
		N:      oai.Int(2), Logprobs: oai.Int(1), MaxTokens: oai.Int(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 2 || res.Choices[0].Text != "x" || res.Choices[1].Text != "y" || res.Choices[1].Index != 1 {
		t.Fatalf("choices %+v", res.Choices)
	}
	l := res.Choices[0].Logprobs
	if !cmp.Equal(l.Tokens, []string{"x"}) || !cmp.Equal(l.TokenLogprobs, []float64{-0.25}) || !cmp.Equal(l.TextOffset, []int64{0}) ||
		len(l.TopLogprobs) != 1 || l.TopLogprobs[0]["x"] != -0.25 {
		t.Fatalf("completion logprobs %+v", l)
	}
	if res.Usage.CompletionTokens != 2 || res.Usage.PromptTokens != 1 {
		t.Fatalf("usage %+v", res.Usage)
	}

	c = newClient(newServer(t, newFakeEngine(script...)))
	chat, err := c.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")},
		N:        oai.Int(2), Logprobs: oai.Bool(true), TopLogprobs: oai.Int(2), MaxTokens: oai.Int(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 2 {
		t.Fatalf("choices %+v", chat.Choices)
	}
	ct := chat.Choices[1].Logprobs.Content
	if len(ct) != 1 || ct[0].Token != "y" || ct[0].Logprob != -0.5 || !cmp.Equal(ct[0].Bytes, []int64{'y'}) ||
		len(ct[0].TopLogprobs) != 2 || ct[0].TopLogprobs[1].Token != "z" || ct[0].TopLogprobs[1].Logprob != -1 {
		t.Fatalf("chat logprobs %+v", ct)
	}
}

package openai

import (
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

// TestClientToolRoundTrip drives tool calling with the official openai-go
// client: a required call (constrained, so the fake engine's text is the
// call's JSON), the same streamed through the client's accumulator, and
// the conversation with the assistant's call (ToParam) and the tool's
// result sent back, which the template receives.
func TestClientToolRoundTrip(t *testing.T) {
	const callJSON = `[{"name":"get_weather","parameters":{"city":"Oslo"}}]`
	eng := newFakeEngine(chunksOf(callJSON, 6, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = toolsTokenizer{}; c.ContextLen = 4096 })
	c := newClient(srv)
	tools := []oai.ChatCompletionToolUnionParam{oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: oai.String("The weather in a city"),
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
			"required": []string{"city"}},
	})}
	params := oai.ChatCompletionNewParams{
		Model:      "m",
		Messages:   []oai.ChatCompletionMessageParamUnion{oai.UserMessage("weather in Oslo?")},
		Tools:      tools,
		ToolChoice: oai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oai.String("required")},
	}
	res, err := c.Chat.Completions.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	ch := res.Choices[0]
	if ch.FinishReason != "tool_calls" || ch.Message.Content != "" || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("choice %+v", ch)
	}
	call := ch.Message.ToolCalls[0]
	if call.Type != "function" || call.Function.Name != "get_weather" || call.Function.Arguments != `{"city":"Oslo"}` || len(call.ID) != 29 {
		t.Fatalf("call %+v", call)
	}

	stream := c.Chat.Completions.NewStreaming(t.Context(), params)
	acc := oai.ChatCompletionAccumulator{}
	finished := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished++
			if tc.Name != "get_weather" || tc.Arguments != `{"city":"Oslo"}` {
				t.Errorf("finished call %+v", tc)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if finished != 1 || len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("streamed: %d calls finished, %+v", finished, acc.Choices)
	}
	if got := acc.Choices[0].Message.ToolCalls; len(got) != 1 || got[0].Function.Arguments != call.Function.Arguments {
		t.Fatalf("accumulated calls %+v", got)
	}

	// The round trip: the call and its result go back.
	params.Messages = append(params.Messages, ch.Message.ToParam(), oai.ToolMessage(`{"temp":-3}`, call.ID))
	params.ToolChoice = oai.ChatCompletionToolChoiceOptionUnionParam{}
	eng.script = chunksOf("It is cold.", 4, "stop")
	res, err = c.Chat.Completions.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "It is cold." || res.Choices[0].FinishReason != "stop" {
		t.Fatalf("answer %+v", res.Choices[0])
	}
	want := "<assistant><call " + call.ID + ` get_weather {"city":"Oslo"}>` + "\n<tool>{\"temp\":-3}<re " + call.ID + ">\n<assistant>"
	if prompt := string(idsBytes(eng.lastReq(t).InputIDs)); len(prompt) < len(want) || prompt[len(prompt)-len(want):] != want {
		t.Fatalf("prompt %q, want it to end %q", prompt, want)
	}
}

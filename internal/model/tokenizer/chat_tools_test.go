package tokenizer

import (
	"encoding/json"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
)

// weatherTools is one function's declaration, as a request's tools.
const weatherTools = `[{"type":"function","function":{"name":"get_weather","description":"Get the weather",` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

// TestChatToolsQwen3 renders a tool round trip (the tools, an assistant's
// call, the tool's answer) with Qwen3's own template, which reads tools,
// message.tool_calls (its arguments as a mapping, written with tojson) and
// tool messages; the expected text is what transformers'
// apply_chat_template gives for the same conversation.
func TestChatToolsQwen3(t *testing.T) {
	t.Parallel()
	tok := loadShared(t, "qwen3")
	msgs := []model.Message{
		{Role: "user", Content: "What's the weather in Paris?"},
		{Role: "assistant", ToolCalls: []model.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", Content: `{"temp": 21}`, ToolCallID: "call_1"},
	}
	got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{Tools: json.RawMessage(weatherTools)})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}` +
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n" +
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n" +
		"<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("rendered:\n%q\nwant:\n%q", got, want)
	}

	// Arguments that are not a JSON object reach the template as the
	// string, which Qwen3's writes as it is.
	msgs[1].ToolCalls[0].Arguments = "not json"
	got, err = tok.ApplyChatTemplate(msgs[:2], model.ChatOptions{NoGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n" +
		"<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": not json}\n</tool_call><|im_end|>\n"; got != want {
		t.Fatalf("string arguments:\n%q\nwant:\n%q", got, want)
	}
	if src := tok.ChatTemplateSource(); len(src) < 100 {
		t.Fatalf("ChatTemplateSource = %q", src)
	}
}

// TestChatToolsVariable checks the variables a template sees: tools as a
// list of dicts in the client's key order, none without tools; a call's
// id, type and function; tool_call_id and name only where set.
func TestChatToolsVariable(t *testing.T) {
	t.Parallel()
	var c TemplateCache
	tmpl, err := c.Get(`{{ tools is none }}|{% for t in tools or [] %}{{ t.function.name }}:{{ t.function.parameters.required[0] }};{% endfor %}|` +
		`{% for m in messages %}{{ m.role }}[{% for c in m.tool_calls or [] %}{{ c.id }} {{ c.type }} {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}` +
		`{{ m.tool_call_id is defined }} {{ m.name is defined }}]{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []model.Message{
		{Role: "assistant", ToolCalls: []model.ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
		{Role: "tool", Content: "cold", ToolCallID: "c1", Name: "get_weather"},
	}
	got, err := RenderChat(tmpl, msgs, model.ChatOptions{Tools: json.RawMessage(weatherTools)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "False|get_weather:city;|assistant[c1 function get_weather OsloFalse False]tool[True True]"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	got, err = RenderChat(tmpl, []model.Message{{Role: "user", Content: "x"}}, model.ChatOptions{}, nil)
	if err != nil || got != "True||user[False False]" {
		t.Fatalf("without tools: %q, %v", got, err)
	}
}

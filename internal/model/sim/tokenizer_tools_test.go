package sim

import (
	"encoding/json"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
)

// TestApplyChatTemplateTools: the simulated model's template writes the
// tools first, an assistant's calls after its content and tool messages
// under their role, through the template engine; without them it renders
// as before.
func TestApplyChatTemplateTools(t *testing.T) {
	tok := newByteTokenizer()
	msgs := []model.Message{
		{Role: "user", Content: "sum?"},
		{Role: "assistant", ToolCalls: []model.ToolCall{{ID: "c1", Name: "add", Arguments: `{"a":1,"b":2}`}, {ID: "c2", Name: "now", Arguments: "{}"}}},
		{Role: "tool", Content: "3", ToolCallID: "c1"},
	}
	got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{Tools: json.RawMessage(`[{"type":"function","function":{"name":"add"}}]`)})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|tools|>\n[{\"type\": \"function\", \"function\": {\"name\": \"add\"}}]\n" +
		"<|user|>\nsum?\n<|assistant|>\n\n" +
		"<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>\n" +
		"<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\n" +
		"<|tool|>\n3\n<|assistant|>\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	plain, err := tok.ApplyChatTemplate(msgs[:1], model.ChatOptions{})
	if err != nil || plain != "<|user|>\nsum?\n<|assistant|>\n" {
		t.Fatalf("without tools: %q, %v", plain, err)
	}
}

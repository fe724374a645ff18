package openai

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// qwen3 loads the Qwen3 tokenizer fixture (its chat template reads tools,
// tool calls and tool messages, and opens <think> blocks) once per test
// binary.
var qwen3 = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.LoadMaybeGzipped(filepath.Join("..", "model", "tokenizer", "testdata", "qwen3"))
})

// TestQwen3ThinkThenCall runs a Qwen3 conversation through the front end
// with the model's own template and tokenizer: the tools reach the
// prompt, --tool-call-parser auto picks hermes from the template, and an
// answer that thinks and then calls is split into reasoning_content and
// tool_calls, whole and streamed alike.
func TestQwen3ThinkThenCall(t *testing.T) {
	tok, err := qwen3()
	if err != nil {
		t.Fatal(err)
	}
	if got := ToolCallParserFor(tok.ChatTemplateSource()); got != "hermes" {
		t.Fatalf("Qwen3's template picks parser %s, want hermes", got)
	}
	const out = "<think>\nThe user wants Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	ids, err := tok.Encode(out, false)
	if err != nil {
		t.Fatal(err)
	}
	eos := tok.EOS()
	ids = append(ids, eos[0])
	var script []Chunk
	for i := 0; i < len(ids); i += 3 {
		var c Chunk
		for _, id := range ids[i:min(i+3, len(ids))] {
			c.Tokens = append(c.Tokens, Token{ID: id})
		}
		script = append(script, c)
	}
	script[len(script)-1].FinishReason = "stop"
	eng := newFakeEngine(script...)
	srv := newServer(t, eng, func(c *Config) {
		c.Tokenizer, c.EOS, c.ContextLen, c.ReasoningParser = tok, eos, 4096, "qwen3"
	})
	want := []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"stream":%v,"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[%s]}`, stream, weatherTool)
		resp, got := post(t, srv, "/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
		prompt := tok.NewDecoder()
		var text strings.Builder
		for _, id := range eng.lastReq(t).InputIDs {
			text.WriteString(prompt.Add(id))
		}
		if p := text.String(); !strings.Contains(p, "# Tools") || !strings.Contains(p, `"name": "get_weather"`) || !strings.HasSuffix(p, "<|im_start|>assistant\n") {
			t.Fatalf("prompt %q", p)
		}
		var content, reasoning, finish string
		var calls []ToolCall
		if stream {
			content, reasoning, calls, finish = streamedAnswer(t, got)
		} else {
			var a chatAnswer
			if err := json.Unmarshal([]byte(got), &a); err != nil {
				t.Fatal(err)
			}
			m := a.Choices[0].Message
			if m.Content != nil {
				content = *m.Content
			}
			if m.ReasoningContent != nil {
				reasoning = *m.ReasoningContent
			}
			calls, finish = m.ToolCalls, a.Choices[0].FinishReason
		}
		if reasoning != "\nThe user wants Paris.\n" || content != "\n\n" || finish != "tool_calls" || !cmp.Equal(want, calls, ignoreIDs) {
			t.Fatalf("stream %v: reasoning %q, content %q, finish %q, calls %+v\n%s", stream, reasoning, content, finish, calls, got)
		}
	}
}

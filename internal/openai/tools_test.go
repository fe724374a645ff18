package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model"
)

// toolsTokenizer renders like byteTokenizer, and writes the tools, each
// call ("<call id name args>") and tool_call_id ("<re id>") too, so that
// tests see what reached the template.
type toolsTokenizer struct{ byteTokenizer }

func (toolsTokenizer) ApplyChatTemplate(msgs []model.Message, opts model.ChatOptions) (string, error) {
	var b strings.Builder
	if opts.Tools != nil {
		b.WriteString("<tools>" + string(opts.Tools) + "\n")
	}
	for _, m := range msgs {
		b.WriteString("<" + m.Role + ">" + m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&b, "<call %s %s %s>", c.ID, c.Name, c.Arguments)
		}
		if m.ToolCallID != "" {
			b.WriteString("<re " + m.ToolCallID + ">")
		}
		b.WriteString("\n")
	}
	b.WriteString("<assistant>")
	return b.String(), nil
}

const (
	weatherTool = `{"type":"function","function":{"name":"get_weather","description":"d",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`
	timeTool  = `{"type":"function","function":{"name":"get_time"}}`
	userHi    = `{"role":"user","content":"hi"}`
	toolsBody = `"tools":[` + weatherTool + `,` + timeTool + `]`
)

// chatAnswer is the part of a chat answer these tests read.
type chatAnswer struct {
	Choices []struct {
		Message struct {
			Content          *string    `json:"content"`
			ReasoningContent *string    `json:"reasoning_content"`
			ToolCalls        []ToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// streamedAnswer reassembles a chat stream's first choice as a client
// does: content and reasoning concatenated, calls by index (id, type and
// name from their first delta, arguments appended), and checks each call
// delta's shape.
func streamedAnswer(t *testing.T, body string) (content, reasoning string, calls []ToolCall, finish string) {
	t.Helper()
	for _, ev := range sseEvents(t, body) {
		if ev == "[DONE]" {
			continue
		}
		var c ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %s: %v", ev, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				content += *ch.Delta.Content
			}
			if ch.Delta.ReasoningContent != nil {
				reasoning += *ch.Delta.ReasoningContent
			}
			for _, d := range ch.Delta.ToolCalls {
				switch {
				case d.Index == len(calls):
					if d.ID == "" || d.Type != "function" || d.Function.Name == "" {
						t.Fatalf("a call's first delta without id, type or name: %s", ev)
					}
					calls = append(calls, ToolCall{ID: d.ID, Type: d.Type, Function: FunctionCall{Name: d.Function.Name, Arguments: d.Function.Arguments}})
				case d.Index == len(calls)-1:
					if d.ID != "" || d.Function.Name != "" {
						t.Fatalf("a later delta of call %d repeats its id or name: %s", d.Index, ev)
					}
					calls[d.Index].Function.Arguments += d.Function.Arguments
				default:
					t.Fatalf("delta of call %d after %d calls: %s", d.Index, len(calls), ev)
				}
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return content, reasoning, calls, finish
}

// ignoreIDs compares calls without their ids (random).
var ignoreIDs = cmp.Transformer("noID", func(c ToolCall) ToolCall { c.ID = ""; return c })

func TestToolChoiceAuto(t *testing.T) {
	const out = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
		"<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>"
	wantCalls := []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}},
		{Type: "function", Function: FunctionCall{Name: "get_time", Arguments: `{}`}}}
	eng := newFakeEngine(chunksOf(out, 4, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = toolsTokenizer{}; c.ToolCallParser = "hermes"; c.ContextLen = 4096 })
	body := `{"messages":[` + userHi + `],` + toolsBody + `}`
	resp, got := post(t, srv, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	if req := eng.lastReq(t); !req.Constraint.IsZero() {
		t.Fatalf("auto constrained the output: %+v", req.Constraint)
	} else if prompt := string(idsBytes(req.InputIDs)); !strings.HasPrefix(prompt, "<tools>["+weatherTool+","+timeTool+"]\n") {
		t.Fatalf("the template did not get the tools: %q", prompt)
	}
	var a chatAnswer
	if err := json.Unmarshal([]byte(got), &a); err != nil {
		t.Fatal(err)
	}
	m := a.Choices[0].Message
	if m.Content == nil || *m.Content != "Let me check." || a.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("content %v, finish %q: %s", m.Content, a.Choices[0].FinishReason, got)
	}
	if d := cmp.Diff(wantCalls, m.ToolCalls, ignoreIDs); d != "" {
		t.Fatalf("calls (-want +got):\n%s", d)
	}
	if id0, id1 := m.ToolCalls[0].ID, m.ToolCalls[1].ID; !strings.HasPrefix(id0, "call_") || len(id0) != 29 || id0 == id1 {
		t.Fatalf("call ids %q, %q: want distinct call_ and 24 hex digits", id0, id1)
	}

	_, sbody := post(t, srv, "/v1/chat/completions", `{"stream":true,"messages":[`+userHi+`],`+toolsBody+`}`)
	content, _, calls, finish := streamedAnswer(t, sbody)
	if content != "Let me check." || finish != "tool_calls" {
		t.Fatalf("streamed content %q, finish %q:\n%s", content, finish, sbody)
	}
	if d := cmp.Diff(wantCalls, calls, ignoreIDs); d != "" {
		t.Fatalf("streamed calls (-want +got):\n%s", d)
	}

	// parallel_tool_calls false: the first call only.
	_, got = post(t, srv, "/v1/chat/completions", `{"parallel_tool_calls":false,"messages":[`+userHi+`],`+toolsBody+`}`)
	a = chatAnswer{}
	if err := json.Unmarshal([]byte(got), &a); err != nil || !cmp.Equal(wantCalls[:1], a.Choices[0].Message.ToolCalls, ignoreIDs) {
		t.Fatalf("parallel_tool_calls false: %s (%v)", got, err)
	}

	// tool_choice none: the text is content, the tools still rendered
	// (as vLLM does).
	_, got = post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`],`+toolsBody+`,"tool_choice":"none"}`)
	a = chatAnswer{}
	if err := json.Unmarshal([]byte(got), &a); err != nil || a.Choices[0].Message.Content == nil ||
		*a.Choices[0].Message.Content != out || a.Choices[0].Message.ToolCalls != nil || a.Choices[0].FinishReason != "stop" {
		t.Fatalf("tool_choice none: %s (%v)", got, err)
	}
}

// idsBytes is token ids of the byte tokenizer as bytes.
func idsBytes(ids []int32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

func TestToolChoiceConstrained(t *testing.T) {
	for _, tc := range []struct {
		name, choice, extra, out string
		schema                   string
		want                     []ToolCall
	}{
		{"required", `"required"`, "", `[{"name":"get_weather","parameters":{"city":"Oslo"}},{"name":"get_time","parameters":{}}]`,
			`{"type":"array","minItems":1,"items":{"anyOf":[` +
				`{"type":"object","properties":{"name":{"const":"get_weather"},"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},"required":["name","parameters"],"additionalProperties":false},` +
				`{"type":"object","properties":{"name":{"const":"get_time"},"parameters":{"type":"object","properties":{},"additionalProperties":false}},"required":["name","parameters"],"additionalProperties":false}]}}`,
			[]ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Oslo"}`}},
				{Type: "function", Function: FunctionCall{Name: "get_time", Arguments: `{}`}}}},
		{"required, one call", `"required"`, `,"parallel_tool_calls":false`, `[{"name":"get_time","parameters":{}}]`,
			`{"type":"array","minItems":1,"maxItems":1,"items":{"anyOf":[`,
			[]ToolCall{{Type: "function", Function: FunctionCall{Name: "get_time", Arguments: `{}`}}}},
		{"named", `{"type":"function","function":{"name":"get_weather"}}`, "", `{"city":"Oslo"}`,
			`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`,
			[]ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Oslo"}`}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine(chunksOf(tc.out, 5, "stop")...)
			srv := newServer(t, eng)
			body := `{"messages":[` + userHi + `],` + toolsBody + `,"tool_choice":` + tc.choice + tc.extra
			resp, got := post(t, srv, "/v1/chat/completions", body+`}`)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, got)
			}
			c := eng.lastReq(t).Constraint
			if c.Kind != grammar.KindJSONSchema || !strings.HasPrefix(c.Source, tc.schema) {
				t.Fatalf("constraint %v %s, want a JSON Schema starting %s", c.Kind, c.Source, tc.schema)
			}
			var a chatAnswer
			if err := json.Unmarshal([]byte(got), &a); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(got, `"content":null`) || a.Choices[0].FinishReason != "tool_calls" {
				t.Fatalf("want content null and finish tool_calls: %s", got)
			}
			if d := cmp.Diff(tc.want, a.Choices[0].Message.ToolCalls, ignoreIDs); d != "" {
				t.Fatalf("calls (-want +got):\n%s", d)
			}
			_, sbody := post(t, srv, "/v1/chat/completions", body+`,"stream":true}`)
			if !strings.Contains(sbody, `"delta":{"role":"assistant"},`) {
				t.Fatalf("the stream's opening delta has content (a call's stays null):\n%s", sbody)
			}
			content, _, calls, finish := streamedAnswer(t, sbody)
			if d := cmp.Diff(tc.want, calls, ignoreIDs); d != "" || content != "" || finish != "tool_calls" {
				t.Fatalf("streamed: content %q, finish %q, calls (-want +got):\n%s", content, finish, d)
			}
		})
	}
	// Cut short by max_tokens inside a call: the call so far (as OpenAI
	// answers), finish length.
	eng0 := newFakeEngine(chunksOf(`[{"name":"get_weather","parameters":{"city":"Os`, 5, "length")...)
	srv0 := newServer(t, eng0)
	_, got0 := post(t, srv0, "/v1/chat/completions", `{"messages":[`+userHi+`],`+toolsBody+`,"tool_choice":"required"}`)
	if !strings.Contains(got0, `"content":null`) || !strings.Contains(got0, `"arguments":"{\"city\":\"Os"`) || !strings.Contains(got0, `"finish_reason":"length"`) {
		t.Fatalf("a call cut short: %s", got0)
	}
	// Cut short before a call began: the text as content.
	eng := newFakeEngine(chunksOf(`[{"name":"get_ti`, 5, "length")...)
	srv := newServer(t, eng)
	_, got := post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`],`+toolsBody+`,"tool_choice":"required"}`)
	if !strings.Contains(got, `"content":"[{\"name\":\"get_ti"`) || strings.Contains(got, "tool_calls") || !strings.Contains(got, `"finish_reason":"length"`) {
		t.Fatalf("a call cut short: %s", got)
	}
}

func TestToolMessagesRendered(t *testing.T) {
	eng := newFakeEngine(chunksOf("It is 21 degrees.", 4, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = toolsTokenizer{}; c.ContextLen = 4096 })
	body := `{"messages":[` + userHi + `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_9","type":"function",` +
		`"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_9","content":"21"}],` + toolsBody + `}`
	resp, got := post(t, srv, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	prompt := string(idsBytes(eng.lastReq(t).InputIDs))
	if !strings.Contains(prompt, "<assistant><call call_9 get_weather {\"city\":\"Paris\"}>\n<tool>21<re call_9>\n<assistant>") {
		t.Fatalf("prompt %q", prompt)
	}
	if !strings.Contains(got, `"content":"It is 21 degrees."`) || !strings.Contains(got, `"finish_reason":"stop"`) {
		t.Fatalf("answer %s", got)
	}
}

func TestToolsRefused(t *testing.T) {
	srv := newServer(t, newFakeEngine(chunksOf("x", 1, "stop")...))
	for _, tc := range []struct{ body, param, msg string }{
		{`"tools":[{"type":"function","function":{"name":"a.b"}}]`, "tools", "function.name must be"},
		{`"tools":[{"type":"function","function":{"name":"` + strings.Repeat("a", 65) + `"}}]`, "tools", "function.name must be"},
		{`"tools":[{"type":"retrieval","function":{"name":"a"}}]`, "tools", `type must be "function"`},
		{`"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}]`, "tools", "declared twice"},
		{`"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"string"}}}]`, "tools[0].function.parameters", "schema of an object"},
		{`"tools":[{"type":"function","function":{"name":"a","parameters":[1]}}]`, "tools[0].function.parameters", "JSON Schema object"},
		{`"tools":{"a":1}`, "tools", "must be an array"},
		{`"tool_choice":"auto"`, "tool_choice", "only allowed when tools are given"},
		{toolsBody + `,"tool_choice":"sometimes"`, "tool_choice", "must be"},
		{toolsBody + `,"tool_choice":{"type":"function","function":{"name":"nope"}}`, "tool_choice", "not among the tools"},
		{toolsBody + `,"tool_choice":"required","response_format":{"type":"json_object"}`, "tool_choice", "send one"},
		{toolsBody + `,"parallel_tool_calls":"yes"`, "parallel_tool_calls", "boolean"},
		{`"messages":[{"role":"tool","content":"21"}]`, "messages", "tool_call_id is required"},
		{`"messages":[{"role":"user","content":"x","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]`, "messages", "only an assistant"},
		{`"functions":[{"name":"f"}]`, "functions", "use tools"},
	} {
		body := `{"messages":[` + userHi + `],` + tc.body + `}`
		if strings.HasPrefix(tc.body, `"messages"`) {
			body = `{` + tc.body + `}`
		}
		resp, got := post(t, srv, "/v1/chat/completions", body)
		var e struct{ Error Error }
		_ = json.Unmarshal([]byte(got), &e)
		if resp.StatusCode != http.StatusBadRequest || e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s: %d %s; want 400 naming %s, saying %q", tc.body, resp.StatusCode, got, tc.param, tc.msg)
		}
	}
}

func TestReasoningContent(t *testing.T) {
	const out = "<think>\nsix times seven\n</think>\n\n42"
	eng := newFakeEngine(chunksOf(out, 3, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.ReasoningParser = "qwen3" })
	_, got := post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`]}`)
	var a chatAnswer
	if err := json.Unmarshal([]byte(got), &a); err != nil {
		t.Fatal(err)
	}
	m := a.Choices[0].Message
	if m.ReasoningContent == nil || *m.ReasoningContent != "\nsix times seven\n" || m.Content == nil || *m.Content != "\n\n42" {
		t.Fatalf("answer %s", got)
	}
	_, sbody := post(t, srv, "/v1/chat/completions", `{"stream":true,"messages":[`+userHi+`]}`)
	content, reasoning, _, finish := streamedAnswer(t, sbody)
	if content != *m.Content || reasoning != *m.ReasoningContent || finish != "stop" {
		t.Fatalf("streamed content %q, reasoning %q, finish %q", content, reasoning, finish)
	}
	// include_reasoning false leaves it out.
	_, got = post(t, srv, "/v1/chat/completions", `{"include_reasoning":false,"messages":[`+userHi+`]}`)
	if strings.Contains(got, "reasoning_content") || !strings.Contains(got, `"content":"\n\n42"`) {
		t.Fatalf("include_reasoning false: %s", got)
	}
	// Without the parser the think block is content, and
	// include_reasoning false is refused.
	plain := newServer(t, newFakeEngine(chunksOf(out, 3, "stop")...))
	_, got = post(t, plain, "/v1/chat/completions", `{"messages":[`+userHi+`]}`)
	if want := marshalJSON(out); !strings.Contains(got, `"content":`+string(want)) {
		t.Fatalf("without a parser: %s", got)
	}
	if resp, got := post(t, plain, "/v1/chat/completions", `{"include_reasoning":false,"messages":[`+userHi+`]}`); resp.StatusCode != 400 {
		t.Fatalf("include_reasoning false without a parser: %d %s", resp.StatusCode, got)
	}
}

// TestReasoningThenToolCall: a Qwen3 answer that thinks, then calls.
func TestReasoningThenToolCall(t *testing.T) {
	const out = "<think>I need the weather.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
	eng := newFakeEngine(chunksOf(out, 2, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.ReasoningParser = "qwen3"; c.ToolCallParser = "hermes" })
	for _, stream := range []bool{false, true} {
		_, got := post(t, srv, "/v1/chat/completions", fmt.Sprintf(`{"stream":%v,"messages":[%s],%s}`, stream, userHi, toolsBody))
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
			reasoning, calls, finish = *m.ReasoningContent, m.ToolCalls, a.Choices[0].FinishReason
		}
		want := []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Rome"}`}}}
		if reasoning != "I need the weather." || content != "\n\n" || finish != "tool_calls" || !cmp.Equal(want, calls, ignoreIDs) {
			t.Fatalf("stream %v: reasoning %q, content %q, finish %q, calls %+v", stream, reasoning, content, finish, calls)
		}
	}
}

// markerTokenizer is toolsTokenizer with a special token, id 300, for
// Mistral's [TOOL_CALLS].
type markerTokenizer struct{ toolsTokenizer }

const toolCallsID = 300

func (markerTokenizer) Encode(text string, add bool) ([]int32, error) {
	if text == "[TOOL_CALLS]" {
		return []int32{toolCallsID}, nil
	}
	return byteTokenizer{}.Encode(text, add)
}

func (markerTokenizer) IsSpecial(id int32) bool { return id == toolCallsID }

func (markerTokenizer) NewDecoder() model.Decoder { return markerDecoder{&byteDecoder{}} }

type markerDecoder struct{ *byteDecoder }

func (d markerDecoder) Add(id int32) string {
	if id == toolCallsID {
		return "[TOOL_CALLS]"
	}
	return d.byteDecoder.Add(id)
}

// TestToolMarkerSpecialToken: the special token a parser reads
// (Mistral's [TOOL_CALLS]) is kept in the text it parses, and left out of
// the text as always when the request has no tools.
func TestToolMarkerSpecialToken(t *testing.T) {
	script := append(toks("Sure. "), Token{ID: toolCallsID})
	script = append(script, toks(`[{"name":"get_time","arguments":{}}]`)...)
	eng := newFakeEngine(Chunk{Tokens: script, FinishReason: "stop"})
	srv := newServer(t, eng, func(c *Config) {
		c.Tokenizer, c.ToolCallParser, c.ContextLen = markerTokenizer{}, "mistral", 4096
	})
	_, got := post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`],`+toolsBody+`}`)
	var a chatAnswer
	if err := json.Unmarshal([]byte(got), &a); err != nil {
		t.Fatal(err)
	}
	want := []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_time", Arguments: `{}`}}}
	m := a.Choices[0].Message
	if m.Content == nil || *m.Content != "Sure. " || !cmp.Equal(want, m.ToolCalls, ignoreIDs) {
		t.Fatalf("with tools: %s", got)
	}
	// Mistral's templates take call ids of 9 letters and digits only.
	if id := m.ToolCalls[0].ID; !regexp.MustCompile(`^[a-zA-Z0-9]{9}$`).MatchString(id) {
		t.Fatalf("call id %q for a Mistral model, want 9 letters and digits", id)
	}
	// Ids of other lengths sent back are cut to their last 9, call and
	// answer alike, as vLLM does.
	_, got = post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`,{"role":"assistant","tool_calls":[{"id":"call_0123456789abcdef01234567",`+
		`"type":"function","function":{"name":"get_time","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_0123456789abcdef01234567","content":"noon"}],`+toolsBody+`}`)
	if prompt := string(idsBytes(eng.lastReq(t).InputIDs)); !strings.Contains(prompt, "<call f01234567 get_time {}>\n<tool>noon<re f01234567>") {
		t.Fatalf("prompt %q: %s", prompt, got)
	}
	_, got = post(t, srv, "/v1/chat/completions", `{"messages":[`+userHi+`]}`)
	if !strings.Contains(got, `"content":"Sure. [{\"name\":\"get_time\",\"arguments\":{}}]"`) {
		t.Fatalf("without tools the special token is not rendered: %s", got)
	}
}

package npmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// toolsOutput is what tools.mjs prints.
type toolsOutput struct {
	Tools []struct {
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	Call, Streamed, Parsed, Answer toolAnswer
	AnswerRequest                  struct {
		Messages []json.RawMessage `json:"messages"`
	} `json:"answer_request"`
}

type toolAnswer struct {
	Choices []struct {
		Message struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name            string          `json:"name"`
					Arguments       string          `json:"arguments"`
					ParsedArguments json.RawMessage `json:"parsed_arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// TestOpenAINPMClientTools: the npm client's tool round trip against a PD
// pair of the simulated model — a forced call (tool_choice required, one
// call), the same streamed and assembled by the client, a named strict
// function's arguments parsed by chat.completions.parse, and the answer
// to the conversation with the call and the tool's result.
func TestOpenAINPMClientTools(t *testing.T) {
	node := nodeAndClient(t)
	c := startPD(t)
	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "tools.mjs", c.URL()+"/v1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("node tools.mjs: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	var out toolsOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("tools.mjs output is not the expected JSON: %v\n%s", err, stdout.String())
	}
	params := map[string]map[string]any{}
	for _, tool := range out.Tools {
		var p map[string]any
		if err := json.Unmarshal(tool.Function.Parameters, &p); err != nil {
			t.Fatal(err)
		}
		params[tool.Function.Name] = p
	}
	// checkCall checks a choice is one call of a declared function whose
	// arguments have the required properties, of the allowed values.
	checkCall := func(what string, a toolAnswer, name string) map[string]any {
		t.Helper()
		if len(a.Choices) != 1 {
			t.Fatalf("%s: %d choices", what, len(a.Choices))
		}
		ch := a.Choices[0]
		m := ch.Message
		if ch.FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 1 {
			t.Fatalf("%s: finish %q, content %v, %d calls; want tool_calls, null, 1", what, ch.FinishReason, m.Content, len(m.ToolCalls))
		}
		call := m.ToolCalls[0]
		if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" || (name != "" && call.Function.Name != name) {
			t.Fatalf("%s: call %+v", what, call)
		}
		p, ok := params[call.Function.Name]
		if !ok {
			t.Fatalf("%s: a call of %q, not declared", what, call.Function.Name)
		}
		var args map[string]any
		if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
			t.Fatalf("%s: arguments %q: %v", what, call.Function.Arguments, err)
		}
		props := p["properties"].(map[string]any)
		if len(args) != len(props) {
			t.Fatalf("%s: arguments %s, want exactly the properties %v", what, call.Function.Arguments, props)
		}
		for k, v := range args {
			prop, ok := props[k].(map[string]any)
			if !ok {
				t.Fatalf("%s: argument %q not declared", what, k)
			}
			s, isString := v.(string)
			if !isString {
				t.Fatalf("%s: argument %q is %v, want a string", what, k, v)
			}
			if enum, ok := prop["enum"].([]any); ok && !strings.Contains(strings.Trim(strings.ReplaceAll(jsonString(enum), `"`, " "), "[]"), " "+s+" ") {
				t.Fatalf("%s: argument %q = %q, not in %v", what, k, s, enum)
			}
			if ml, ok := prop["maxLength"].(float64); ok && float64(len([]rune(s))) > ml {
				t.Fatalf("%s: argument %q = %q, longer than %v", what, k, s, ml)
			}
		}
		return args
	}
	checkCall("required", out.Call, "")
	checkCall("required, streamed", out.Streamed, "")
	if a, b := out.Call.Choices[0].Message.ToolCalls[0].Function, out.Streamed.Choices[0].Message.ToolCalls[0].Function; a.Name != b.Name || a.Arguments != b.Arguments {
		t.Fatalf("the streamed call %s(%s) differs from the call %s(%s) with the same seed", b.Name, b.Arguments, a.Name, a.Arguments)
	}
	args := checkCall("named, parse", out.Parsed, "get_time")
	var parsedArgs map[string]any
	if err := json.Unmarshal(out.Parsed.Choices[0].Message.ToolCalls[0].Function.ParsedArguments, &parsedArgs); err != nil || !cmp.Equal(parsedArgs, args) {
		t.Fatalf("parse gave parsed_arguments %s (%v), want the arguments %v", out.Parsed.Choices[0].Message.ToolCalls[0].Function.ParsedArguments, err, args)
	}
	// The round trip's conversation: user, the assistant's call, the
	// tool's result; its answer is text.
	if n := len(out.AnswerRequest.Messages); n != 3 || !strings.Contains(string(out.AnswerRequest.Messages[2]), `"tool_call_id":"call_`) {
		t.Fatalf("the round trip sent %d messages: %s", n, out.AnswerRequest.Messages)
	}
	if len(out.Answer.Choices) != 1 {
		t.Fatalf("answer: %d choices", len(out.Answer.Choices))
	}
	ans := out.Answer.Choices[0]
	if ans.Message.Content == nil || *ans.Message.Content == "" || ans.FinishReason != "length" || len(ans.Message.ToolCalls) != 0 {
		t.Fatalf("answer: content %v, finish %q, calls %d; want text of max_tokens", ans.Message.Content, ans.FinishReason, len(ans.Message.ToolCalls))
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

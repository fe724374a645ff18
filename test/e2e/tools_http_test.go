package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pdserve/pdserve/internal/model/sim"
)

// This file drives tool calling (issue 26) over HTTP on the simulated
// model, which has no tool-call format of its own: tool_choice "required"
// and a named function constrain the output to a call, so even random
// logits give a valid call of a declared tool. A router over a
// prefill/decode pair answers what a colocated worker answers, and every
// call's arguments validate against its function's parameters.

// e2eTools are the declared functions: bounded strings and enums, so the
// simulated model finishes its calls.
var e2eTools = []string{
	`{"type":"function","function":{"name":"get_weather","description":"The weather in a city",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]}},` +
		`"required":["city","unit"],"additionalProperties":false}}}`,
	`{"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{` +
		`"a":{"type":"integer","minimum":0,"maximum":999},"b":{"type":"integer","minimum":0,"maximum":999}},"required":["a","b"],"additionalProperties":false}}}`,
	`{"type":"function","function":{"name":"now"}}`,
}

// callIDs matches the ids of calls, random per answer.
var callIDs = regexp.MustCompile(`"id":"call_[0-9a-f]{24}"`)

// toolValidators compiles each tool's parameters, by name.
func toolValidators(t *testing.T) (map[string]*jsonschema.Schema, []any) {
	t.Helper()
	byName := map[string]*jsonschema.Schema{}
	var tools []any
	for i, src := range e2eTools {
		var tool struct {
			Function struct {
				Name       string `json:"name"`
				Parameters any    `json:"parameters"`
			} `json:"function"`
		}
		var doc any
		if err := json.Unmarshal([]byte(src), &tool); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		tools = append(tools, doc)
		params := tool.Function.Parameters
		if params == nil {
			params = map[string]any{"type": "object", "properties": map[string]any{}, "additionalProperties": false}
		}
		c := jsonschema.NewCompiler()
		url := fmt.Sprintf("mem://tool%d.json", i)
		if err := c.AddResource(url, params); err != nil {
			t.Fatal(err)
		}
		sch, err := c.Compile(url)
		if err != nil {
			t.Fatal(err)
		}
		byName[tool.Function.Name] = sch
	}
	return byName, tools
}

// wireCall is a call as the answer carries it.
type wireCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// callsOf returns the calls and finish reason of a chat answer's choices,
// failing unless each choice is calls only (content null).
func callsOf(t *testing.T, body []byte) ([][]wireCall, []string) {
	t.Helper()
	var a struct {
		Choices []struct {
			Message struct {
				Content   *string    `json:"content"`
				ToolCalls []wireCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var calls [][]wireCall
	var finish []string
	for _, c := range a.Choices {
		if c.FinishReason == "tool_calls" && c.Message.Content != nil {
			t.Fatalf("a choice with calls has content %q: %s", *c.Message.Content, body)
		}
		calls = append(calls, c.Message.ToolCalls)
		finish = append(finish, c.FinishReason)
	}
	return calls, finish
}

// streamedCalls reassembles the calls of a streamed chat answer's choices
// as the OpenAI clients do, checking that a call's first delta has its id,
// type and name and the next ones only arguments.
func streamedCalls(t *testing.T, body []byte) ([][]wireCall, []string) {
	t.Helper()
	calls := map[int][]wireCall{}
	finish := map[int]string{}
	for _, line := range strings.Split(string(body), "\n\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index int `json:"index"`
						wireCall
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		for _, c := range ch.Choices {
			for _, d := range c.Delta.ToolCalls {
				cs := calls[c.Index]
				switch {
				case d.Index == len(cs) && d.ID != "" && d.Type == "function" && d.Function.Name != "":
					calls[c.Index] = append(cs, d.wireCall)
				case d.Index == len(cs)-1 && d.ID == "" && d.Function.Name == "":
					cs[d.Index].Function.Arguments += d.Function.Arguments
				default:
					t.Fatalf("choice %d: unexpected call delta %s", c.Index, data)
				}
			}
			if c.FinishReason != nil {
				finish[c.Index] = *c.FinishReason
			}
		}
	}
	var outCalls [][]wireCall
	var outFinish []string
	for i := range len(finish) {
		outCalls = append(outCalls, calls[i])
		outFinish = append(outFinish, finish[i])
	}
	return outCalls, outFinish
}

// TestToolChoiceConstrainedPDEqualsColocated: tool_choice required (with
// and without parallel_tool_calls) and a named function on the simulated
// model answer valid calls of declared tools, the same through PD as
// colocated, streamed as not streamed.
func TestToolChoiceConstrainedPDEqualsColocated(t *testing.T) {
	t.Parallel()
	validators, tools := toolValidators(t)
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	finished := 0
	for i := range 12 {
		body := map[string]any{
			"messages":   []map[string]any{{"role": "user", "content": fmt.Sprintf("call something %d", i)}},
			"tools":      tools,
			"seed":       1000 + i,
			"max_tokens": 300,
		}
		var want string // the function a named choice calls
		switch i % 4 {
		case 0:
			body["tool_choice"] = "required"
		case 1:
			body["tool_choice"] = "required"
			body["parallel_tool_calls"] = false
		case 2:
			want = []string{"get_weather", "add", "now"}[i%3]
			body["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": want}}
		case 3:
			body["tool_choice"] = "required"
			body["n"] = 2
		}
		what := fmt.Sprintf("request %d %v", i, body["tool_choice"])
		sp, bp := postJSON(t, pd.URL()+"/v1/chat/completions", body)
		sc, bc := postJSON(t, co.URL+"/v1/chat/completions", body)
		if sp != http.StatusOK || sc != http.StatusOK {
			t.Fatalf("%s: PD %d %s; colocated %d %s", what, sp, bp, sc, bc)
		}
		np, nc := callIDs.ReplaceAll(normalize(bp), []byte(`"id":_`)), callIDs.ReplaceAll(normalize(bc), []byte(`"id":_`))
		if !bytes.Equal(np, nc) {
			t.Fatalf("%s: PD differs from colocated\nPD:        %s\ncolocated: %s", what, np, nc)
		}
		calls, finish := callsOf(t, bp)
		for c, cs := range calls {
			if finish[c] != "tool_calls" {
				if finish[c] != "length" {
					t.Fatalf("%s choice %d: finish %q without calls: %s", what, c, finish[c], bp)
				}
				continue
			}
			finished++
			if len(cs) == 0 || (body["parallel_tool_calls"] == false || want != "") && len(cs) != 1 {
				t.Fatalf("%s choice %d: %d calls: %s", what, c, len(cs), bp)
			}
			for _, call := range cs {
				sch, ok := validators[call.Function.Name]
				switch {
				case !ok:
					t.Fatalf("%s: a call of %q, which is not declared: %s", what, call.Function.Name, bp)
				case want != "" && call.Function.Name != want:
					t.Fatalf("%s: a call of %q, not the function named: %s", what, call.Function.Name, bp)
				case call.Type != "function" || !strings.HasPrefix(call.ID, "call_"):
					t.Fatalf("%s: call type %q, id %q", what, call.Type, call.ID)
				}
				args, err := jsonschema.UnmarshalJSON(strings.NewReader(call.Function.Arguments))
				if err != nil {
					t.Fatalf("%s: arguments %q are not JSON: %v", what, call.Function.Arguments, err)
				}
				if err := sch.Validate(args); err != nil {
					t.Fatalf("%s: arguments %s of %s do not validate: %v", what, call.Function.Arguments, call.Function.Name, err)
				}
			}
		}
		// Streamed, the same calls (PD and colocated).
		body["stream"] = true
		for _, url := range []string{pd.URL(), co.URL} {
			s, bs := postJSON(t, url+"/v1/chat/completions", body)
			if s != http.StatusOK {
				t.Fatalf("%s streamed: %d %s", what, s, bs)
			}
			scalls, sfinish := streamedCalls(t, bs)
			noID := cmp.Transformer("noID", func(c wireCall) wireCall { c.ID = ""; return c })
			if d := cmp.Diff(calls, scalls, noID); d != "" || !cmp.Equal(finish, sfinish) {
				t.Fatalf("%s: streamed from %s, finish %v (not streamed %v), calls (-not streamed +streamed):\n%s", what, url, sfinish, finish, d)
			}
		}
	}
	if finished < 8 {
		t.Fatalf("only %d choices finished with calls", finished)
	}
	t.Logf("%d choices finished with valid calls", finished)
}

// TestToolRoundTripOnSim: a conversation with the assistant's call and the
// tool's answer is rendered and answered (tool_choice auto on a model
// without a tool-call format: the answer is content).
func TestToolRoundTripOnSim(t *testing.T) {
	t.Parallel()
	_, tools := toolValidators(t)
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	body := map[string]any{
		"messages": []map[string]any{
			{"role": "user", "content": "weather in oslo?"},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"oslo","unit":"c"}`}}}},
			{"role": "tool", "tool_call_id": "call_1", "content": "-3"},
		},
		"tools": tools, "seed": 7, "max_tokens": 12, "return_token_ids": true,
	}
	sp, bp := postJSON(t, pd.URL()+"/v1/chat/completions", body)
	sc, bc := postJSON(t, co.URL+"/v1/chat/completions", body)
	if sp != http.StatusOK || sc != http.StatusOK || !bytes.Equal(normalize(bp), normalize(bc)) {
		t.Fatalf("PD %d %s\ncolocated %d %s", sp, bp, sc, bc)
	}
	var a struct {
		PromptTokenIDs []int32 `json:"prompt_token_ids"`
		Choices        []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(bp, &a); err != nil || len(a.Choices) != 1 || a.Choices[0].Message.Content == nil {
		t.Fatalf("answer %s (%v)", bp, err)
	}
	prompt := make([]byte, len(a.PromptTokenIDs))
	for i, id := range a.PromptTokenIDs {
		prompt[i] = byte(id)
	}
	for _, want := range []string{"<|tools|>\n[", `"name": "get_weather"`, "<|assistant|>\n\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"oslo\", \"unit\": \"c\"}}</tool_call>\n",
		"<|tool|>\n-3\n<|assistant|>\n"} {
		if !strings.Contains(string(prompt), want) {
			t.Fatalf("the prompt %q does not contain %q", prompt, want)
		}
	}
}

package openai

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// scanCalls runs a constrained call's post-processing over text cut at
// cuts, returning the content, the calls assembled, how many pieces of
// arguments came, and the finish reason for finish.
func scanCalls(named, text string, cuts []int, finish string) (string, []ToolCall, int, string) {
	c := &chatPost{scan: &callScanner{named: named}}
	var content strings.Builder
	var pieces []ToolCallDelta
	prev := 0
	for _, cut := range append(cuts, len(text)) {
		_, got, ps := c.feed(text[prev:cut], cut == len(text))
		content.WriteString(got)
		pieces = append(pieces, ps...)
		prev = cut
	}
	args := 0
	for _, p := range pieces {
		if p.ID == "" {
			args++
		}
	}
	return content.String(), assemble(pieces), args, c.finish(finish)
}

func TestCallScanner(t *testing.T) {
	call := func(name, args string) ToolCall {
		return ToolCall{Type: "function", Function: FunctionCall{Name: name, Arguments: args}}
	}
	for _, tc := range []struct {
		named, text, finish string
		content             string
		calls               []ToolCall
		wantFinish          string
	}{
		{"", `[{"name":"f","parameters":{"a":"}{][\"","b":[1,{"c":2}]}},{"name":"g-2","parameters":{}}]`, "stop", "",
			[]ToolCall{call("f", `{"a":"}{][\"","b":[1,{"c":2}]}`), call("g-2", `{}`)}, "tool_calls"},
		{"", `[{"name":"f","parameters":{"a":1}}]`, "stop", "", []ToolCall{call("f", `{"a":1}`)}, "tool_calls"},
		// Cut inside a call: the call so far, finish length.
		{"", `[{"name":"f","parameters":{"a":"xy`, "length", "", []ToolCall{call("f", `{"a":"xy`)}, "length"},
		// Cut before a call began: the text is content.
		{"", `[{"name":"lon`, "length", `[{"name":"lon`, nil, "length"},
		{"", ``, "length", ``, nil, "length"},
		// Not the constrained shape: content from there on.
		{"", `{"a":1}`, "stop", `{"a":1}`, nil, "stop"},
		{"", `[{"name":"f","parameters":{}}]tail`, "stop", "tail", []ToolCall{call("f", `{}`)}, "tool_calls"},
		{"", `[{"name":"f","parameters":{}}X`, "stop", "}X", []ToolCall{call("f", `{}`)}, "tool_calls"},
		{"", `[{"name":"f","parameters":{}},Q`, "stop", "},Q", []ToolCall{call("f", `{}`)}, "tool_calls"},
		// Named: the output is the arguments.
		{"f", `{"a":[1,2]}`, "stop", "", []ToolCall{call("f", `{"a":[1,2]}`)}, "tool_calls"},
		{"f", `{"a":[1`, "length", "", []ToolCall{call("f", `{"a":[1`)}, "length"},
	} {
		content, calls, _, finish := scanCalls(tc.named, tc.text, nil, tc.finish)
		if content != tc.content || finish != tc.wantFinish || !cmp.Equal(calls, tc.calls, ignoreIDs) {
			t.Errorf("%q: content %q, finish %q, calls %+v; want %q, %q, %+v", tc.text, content, finish, calls, tc.content, tc.wantFinish, tc.calls)
			continue
		}
		rng := rand.New(rand.NewPCG(uint64(len(tc.text)), 5))
		for i := range 200 {
			cuts := randomCuts(rng, tc.text, i%12)
			if i < len(tc.text) {
				cuts = []int{i}
			}
			c2, calls2, _, f2 := scanCalls(tc.named, tc.text, cuts, tc.finish)
			if c2 != content || f2 != finish || !cmp.Equal(calls2, calls, ignoreIDs) {
				t.Fatalf("%q cut at %v: %q, %q, %+v; whole gave %q, %q, %+v", tc.text, cuts, c2, f2, calls2, content, finish, calls)
			}
		}
	}
	// Arguments stream as they are drawn: a piece per piece of text.
	text := `[{"name":"f","parameters":{"city":"Oslo","unit":"c"}}]`
	cuts := []int{30, 35, 40, 45}
	if _, calls, args, _ := scanCalls("", text, cuts, "stop"); len(calls) != 1 || args != 5 {
		t.Fatalf("%d calls, %d pieces of arguments; want 1 call in 5 pieces (the arguments start at byte 26)", len(calls), args)
	}
}

// FuzzChatPostChunking: for any output text, the tool-call parsers, the
// reasoning split and the constrained-call scanner give the same content,
// reasoning and calls fed whole or in pieces cut anywhere.
func FuzzChatPostChunking(f *testing.F) {
	for _, s := range []string{
		"<think>a</think>b<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>",
		"[TOOL_CALLS][{\"name\":\"f\",\"arguments\":{\"x\":1}}]",
		"<|python_tag|>{\"name\":\"f\",\"parameters\":{}}; {\"name\":\"g\",\"parameters\":{}}",
		"[{\"name\":\"f\",\"parameters\":{\"a\":\"}\\\"\"}},{\"name\":\"g\",\"parameters\":{}}]",
		"plain <tool_ca </thi [TOOL",
	} {
		f.Add(s, uint64(1))
	}
	f.Fuzz(func(t *testing.T, text string, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 9))
		cuts := randomCuts(rng, text, 1+int(seed%8))
		for _, mk := range []func() *chatPost{
			func() *chatPost {
				return &chatPost{calls: &callStream{p: hermesParser{}}, think: newThinkStream("qwen3", false)}
			},
			func() *chatPost { return &chatPost{calls: &callStream{p: llama3Parser{}}} },
			func() *chatPost {
				return &chatPost{calls: &callStream{p: mistralParser{}}, think: newThinkStream("deepseek_r1", false)}
			},
			func() *chatPost { return &chatPost{scan: &callScanner{}} },
			func() *chatPost { return &chatPost{scan: &callScanner{named: "f"}} },
		} {
			run := func(cuts []int) (string, string, []ToolCall) {
				c := mk()
				var r, ct strings.Builder
				var pieces []ToolCallDelta
				prev := 0
				for _, cut := range append(cuts, len(text)) {
					a, b, ps := c.feed(text[prev:cut], cut == len(text))
					r.WriteString(a)
					ct.WriteString(b)
					pieces = append(pieces, ps...)
					prev = cut
				}
				return r.String(), ct.String(), assemble(pieces)
			}
			r1, c1, k1 := run(nil)
			r2, c2, k2 := run(cuts)
			if r1 != r2 || c1 != c2 || !cmp.Equal(k1, k2, ignoreIDs) {
				t.Fatalf("%q cut at %v: reasoning %q, content %q, calls %+v; whole: %q, %q, %+v", text, cuts, r2, c2, k2, r1, c1, k1)
			}
		}
	})
}

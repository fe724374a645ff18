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

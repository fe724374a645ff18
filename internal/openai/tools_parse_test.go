package openai

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// streamCalls feeds text to a callStream of p in pieces cut at cuts
// (ascending byte offsets), returning the content and calls.
func streamCalls(p toolParser, text string, cuts []int) (string, []FunctionCall) {
	s := callStream{p: p}
	var content strings.Builder
	var calls []FunctionCall
	prev := 0
	for _, c := range append(cuts, len(text)) {
		got, cs := s.feed(text[prev:c], c == len(text))
		content.WriteString(got)
		calls = append(calls, cs...)
		prev = c
	}
	return content.String(), calls
}

// parseToolCalls parses a whole output with p: the content and the calls.
func parseToolCalls(p toolParser, text string) (string, []FunctionCall) {
	s := callStream{p: p}
	return s.feed(text, true)
}

// randomCuts returns up to n ascending cut points inside text.
func randomCuts(rng *rand.Rand, text string, n int) []int {
	var cuts []int
	for range n {
		if len(text) > 0 {
			cuts = append(cuts, rng.IntN(len(text)+1))
		}
	}
	for i := 1; i < len(cuts); i++ {
		for j := i; j > 0 && cuts[j] < cuts[j-1]; j-- {
			cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
		}
	}
	return cuts
}

func TestToolParsers(t *testing.T) {
	weather := FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris","unit":"c"}`}
	time := FunctionCall{Name: "get_time", Arguments: `{}`}
	for _, tc := range []struct {
		parser  toolParser
		text    string
		content string
		calls   []FunctionCall
	}{
		// Hermes / Qwen: content, then blocks.
		{hermesParser{}, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>", "", []FunctionCall{weather}},
		{hermesParser{}, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
			"Let me look.\n", []FunctionCall{weather, time}},
		{hermesParser{}, "<tool_call>{\"name\":\"get_time\"}", "", []FunctionCall{time}},                                  // unclosed at the end, no arguments
		{hermesParser{}, "<tool_call>{\"name\":\"get_time\",\"arguments\":\"{}\"}</tool_call>", "", []FunctionCall{time}}, // arguments as a string
		{hermesParser{}, "plain answer, <tool no call", "plain answer, <tool no call", nil},
		{hermesParser{}, "<tool_call>{\"name\": oops}</tool_call>", "<tool_call>{\"name\": oops}</tool_call>", nil},
		{hermesParser{}, "<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>{\"arguments\":{}}</tool_call>", nil}, // no name
		{hermesParser{}, "ends with <tool_ca", "ends with <tool_ca", nil},
		// A block that is not a call ends the calls: it and what follows
		// are content (the calls before it were sent already).
		{hermesParser{}, "<tool_call>{\"name\":\"get_time\"}</tool_call>\n<tool_call>{bad}</tool_call> tail", "\n<tool_call>{bad}</tool_call> tail", []FunctionCall{time}},
		{hermesParser{}, "<tool_call>{\"name\":\"get_time\"}</tool_call> trailing words", "", []FunctionCall{time}}, // dropped, as vLLM does
		// Llama 3 JSON: the whole answer.
		{llama3Parser{}, `{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}`, "", []FunctionCall{weather}},
		{llama3Parser{}, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
			"", []FunctionCall{weather, time}},
		{llama3Parser{}, "  \n{\"name\": \"get_time\", \"arguments\": {}}", "", []FunctionCall{time}},
		{llama3Parser{}, `The answer is {"name": "x"}`, `The answer is {"name": "x"}`, nil},
		{llama3Parser{}, `{"name": "get_time", "parameters": {}} and more`, `{"name": "get_time", "parameters": {}} and more`, nil},
		{llama3Parser{}, `{"not": "a call"}`, `{"not": "a call"}`, nil},
		{llama3Parser{}, "<|python_", "<|python_", nil},
		// Mistral: content, [TOOL_CALLS] and an array, or name[ARGS]{…}.
		{mistralParser{}, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, {"name": "get_time", "arguments": {}}]`,
			"", []FunctionCall{weather, time}},
		{mistralParser{}, `Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {}}]`, "Sure. ", []FunctionCall{time}},
		{mistralParser{}, `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}[TOOL_CALLS]get_time[ARGS]{}`, "", []FunctionCall{weather, time}},
		{mistralParser{}, `[TOOL_CALLS][{"name": "get_time", "arguments": {}`, `[TOOL_CALLS][{"name": "get_time", "arguments": {}`, nil},
		{mistralParser{}, "no calls [TOOL", "no calls [TOOL", nil},
	} {
		content, calls := parseToolCalls(tc.parser, tc.text)
		if content != tc.content || !cmp.Equal(calls, tc.calls) {
			t.Errorf("%s %q: content %q, calls %v; want %q, %v", tc.parser.name(), tc.text, content, calls, tc.content, tc.calls)
			continue
		}
		// Streamed in any pieces, the same content and calls.
		rng := rand.New(rand.NewPCG(uint64(len(tc.text)), 7))
		for i := range 200 {
			cuts := randomCuts(rng, tc.text, i%12)
			if i < len(tc.text) {
				cuts = []int{i} // every single cut too
			}
			c2, calls2 := streamCalls(tc.parser, tc.text, cuts)
			if c2 != content || !cmp.Equal(calls2, calls) {
				t.Fatalf("%s %q cut at %v: content %q, calls %v; whole gave %q, %v", tc.parser.name(), tc.text, cuts, c2, calls2, content, calls)
			}
		}
	}
}

// TestToolCallStreamHoldsMarkers: streamed content never shows the start
// of a call, even when the marker arrives split.
func TestToolCallStreamHoldsMarkers(t *testing.T) {
	s := callStream{p: hermesParser{}}
	if got, _ := s.feed("Hello <tool", false); got != "Hello " {
		t.Fatalf("content %q before a possible marker, want %q", got, "Hello ")
	}
	if got, _ := s.feed("_call>{\"name\":\"f\",", false); got != "" {
		t.Fatalf("content %q inside a call", got)
	}
	got, calls := s.feed("\"arguments\":{\"a\":1}}</tool_call>", true)
	if got != "" || len(calls) != 1 || calls[0] != (FunctionCall{Name: "f", Arguments: `{"a":1}`}) {
		t.Fatalf("final: %q, %v", got, calls)
	}
	// A call is handed out as soon as its block closes.
	s = callStream{p: hermesParser{}}
	if got, calls := s.feed("<tool_call>{\"name\":\"f\"}</tool_call>\n<tool_", false); got != "" || len(calls) != 1 || calls[0].Name != "f" {
		t.Fatalf("a closed block: content %q, calls %v", got, calls)
	}
	if got, calls := s.feed("call>{\"name\":\"g\"}", true); got != "" || len(calls) != 1 || calls[0].Name != "g" {
		t.Fatalf("an unclosed last block: content %q, calls %v", got, calls)
	}
	s = callStream{p: hermesParser{}}
	if got, _ := s.feed("<tool", false); got != "" {
		t.Fatalf("held %q", got)
	}
	if got, _ := s.feed("box", false); got != "<toolbox" {
		t.Fatalf("content %q once the marker cannot follow, want <toolbox", got)
	}
}

func TestToolCallParserFor(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{{- '<tool_call>\\n' }}":                                     "hermes",
		"[TOOL_CALLS] {{ tools }}":                                    "mistral",
		"<|python_tag|>{{ x }}<|eot_id|>":                             "llama3_json",
		`{"name": function name, "parameters": dictionary}<|eot_id|>`: "llama3_json",
		"{{ messages }}":                                              "none",
	} {
		if got := ToolCallParserFor(tmpl); got != want {
			t.Errorf("ToolCallParserFor(%q) = %s, want %s", tmpl, got, want)
		}
	}
}

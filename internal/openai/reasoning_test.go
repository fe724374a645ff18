package openai

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// splitThink runs a thinkStream over text cut at cuts.
func splitThink(parser string, open bool, text string, cuts []int) (string, string) {
	s := newThinkStream(parser, open)
	var r, c strings.Builder
	prev := 0
	for _, cut := range append(cuts, len(text)) {
		a, b := s.feed(text[prev:cut], cut == len(text))
		r.WriteString(a)
		c.WriteString(b)
		prev = cut
	}
	return r.String(), c.String()
}

func TestReasoningParsers(t *testing.T) {
	for _, tc := range []struct {
		parser            string
		open              bool
		text              string
		reasoning, answer string
	}{
		{"qwen3", false, "<think>\nLet me think.\n</think>\n\nIt is 4.", "\nLet me think.\n", "\n\nIt is 4."},
		{"qwen3", false, "  <think>a</think>b", "a", "b"},
		{"qwen3", false, "It is 4.", "", "It is 4."},
		{"qwen3", false, "It is <think>4</think>.", "", "It is <think>4</think>."}, // only a block at the start
		{"qwen3", false, "<think>cut short", "cut short", ""},
		{"qwen3", true, "thinking already</think>answer", "thinking already", "answer"}, // the template opened the block
		{"qwen3", true, "<think>x</think>y", "x", "y"},
		{"qwen3", false, "<thin", "", "<thin"},
		{"deepseek_r1", false, "I reason.</think>Answer.", "I reason.", "Answer."},
		{"deepseek_r1", false, "<think>I reason.</think>Answer.", "I reason.", "Answer."},
		{"deepseek_r1", false, "no end in sight", "no end in sight", ""},
		{"deepseek_r1", false, "a</thi", "a</thi", ""},
	} {
		r, a := splitThink(tc.parser, tc.open, tc.text, nil)
		if r != tc.reasoning || a != tc.answer {
			t.Errorf("%s (open %v) %q: reasoning %q, content %q; want %q, %q", tc.parser, tc.open, tc.text, r, a, tc.reasoning, tc.answer)
			continue
		}
		rng := rand.New(rand.NewPCG(uint64(len(tc.text)), 3))
		for i := range 200 {
			cuts := randomCuts(rng, tc.text, i%10)
			if i < len(tc.text) {
				cuts = []int{i}
			}
			if r2, a2 := splitThink(tc.parser, tc.open, tc.text, cuts); r2 != r || a2 != a {
				t.Fatalf("%s %q cut at %v: %q, %q; whole gave %q, %q", tc.parser, tc.text, cuts, r2, a2, r, a)
			}
		}
	}
	if newThinkStream("", false) != nil || newThinkStream("none", true) != nil {
		t.Fatal("a splitter without a parser")
	}
}

func TestPromptOpensThink(t *testing.T) {
	for prompt, want := range map[string]bool{
		"<|im_start|>assistant\n<think>\n":                   true,
		"<|im_start|>assistant\n<think>\n\n</think>\n\n":     false,
		"<|im_start|>assistant\n":                            false,
		"<think>old</think><|im_start|>assistant\n<think>\n": true,
	} {
		if got := promptOpensThink(prompt); got != want {
			t.Errorf("promptOpensThink(%q) = %v, want %v", prompt, got, want)
		}
	}
}

package openai

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
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

// thinkTokenizer renders like byteTokenizer and opens a <think> block
// for the model, as Qwen3's thinking templates do.
type thinkTokenizer struct{ byteTokenizer }

func (t thinkTokenizer) ApplyChatTemplate(msgs []model.Message, opts model.ChatOptions) (string, error) {
	s, err := t.byteTokenizer.ApplyChatTemplate(msgs, opts)
	return s + "<think>\n", err
}

// TestConstrainedOutputNoReasoning: an output under a structured-output
// constraint has no think block, so all of it is content whatever the
// reasoning parser, whole and streamed; the same text without the
// constraint is reasoning.
func TestConstrainedOutputNoReasoning(t *testing.T) {
	const out = `{"answer":"<think>"}`
	for _, parser := range []string{"deepseek_r1", "qwen3"} {
		srv := newServer(t, newFakeEngine(chunksOf(out, 3, "stop")...), func(c *Config) {
			c.ReasoningParser, c.Tokenizer, c.ContextLen = parser, thinkTokenizer{}, 4096
		})
		for _, constraint := range []string{
			`"response_format":{"type":"json_object"},`,
			`"structured_outputs":{"json":{"type":"object"}},`,
			`"guided_regex":".*",`,
			`"",`, // none: the output is reasoning (the prompt opened the block)
		} {
			constraint = strings.TrimPrefix(constraint, `"",`)
			wantContent, wantReasoning := out, ""
			if constraint == "" {
				wantContent, wantReasoning = "", out
			}
			_, got := post(t, srv, "/v1/chat/completions", `{`+constraint+`"messages":[`+userHi+`]}`)
			var a chatAnswer
			if err := json.Unmarshal([]byte(got), &a); err != nil {
				t.Fatal(err)
			}
			m := a.Choices[0].Message
			content, reasoning := "", ""
			if m.Content != nil {
				content = *m.Content
			}
			if m.ReasoningContent != nil {
				reasoning = *m.ReasoningContent
			}
			if content != wantContent || reasoning != wantReasoning {
				t.Errorf("%s, %s: content %q, reasoning %q; want %q, %q", parser, constraint, content, reasoning, wantContent, wantReasoning)
			}
			_, sbody := post(t, srv, "/v1/chat/completions", `{"stream":true,`+constraint+`"messages":[`+userHi+`]}`)
			if content, reasoning, _, _ := streamedAnswer(t, sbody); content != wantContent || reasoning != wantReasoning {
				t.Errorf("%s, %s streamed: content %q, reasoning %q; want %q, %q", parser, constraint, content, reasoning, wantContent, wantReasoning)
			}
		}
	}
}

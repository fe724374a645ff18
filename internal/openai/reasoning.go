package openai

import (
	"fmt"
	"strings"
	"unicode"
)

// This file splits a reasoning model's thinking off its answer
// (--reasoning-parser, vLLM's flag and field names): the text of the
// <think>…</think> block that opens the output goes to reasoning_content,
// the rest to content.
//
//   - deepseek_r1: the output is reasoning from its start (DeepSeek-R1's
//     template opens the block in the prompt; a <think> the model writes
//     anyway is dropped) up to </think>; with no </think> it is all
//     reasoning.
//   - qwen3: the block is reasoning when the output opens it with <think>,
//     or when the prompt ends inside an open block (templates that open it
//     for the model, as Qwen3's thinking-only ones do); otherwise the whole
//     output is content (enable_thinking false renders an empty block into
//     the prompt).
//
// An output that ends inside the block (max_tokens) is reasoning only. Only
// a block at the start counts: <think> later in the answer is content.

// ReasoningParsers are the names --reasoning-parser takes (vLLM's), besides
// "" (none).
var ReasoningParsers = []string{"deepseek_r1", "qwen3"}

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

// checkReasoningParser refuses an unknown --reasoning-parser name.
func checkReasoningParser(name string) error {
	switch name {
	case "", "none", "deepseek_r1", "qwen3":
		return nil
	}
	return fmt.Errorf("unknown reasoning parser %q (want none, %s)", name, strings.Join(ReasoningParsers, ", "))
}

// promptOpensThink reports whether a rendered prompt ends inside an open
// <think> block (the template opened it for the model).
func promptOpensThink(prompt string) bool {
	i := strings.LastIndex(prompt, thinkOpen)
	return i >= 0 && !strings.Contains(prompt[i:], thinkClose)
}

// thinkStream splits one choice's text into reasoning and content as it
// arrives.
type thinkStream struct {
	// deciding: the output has not shown yet whether it opens a block
	// (white space and a prefix of <think> are held in pending).
	deciding bool
	// inThink: inside the block (the text is reasoning).
	inThink bool
	pending string
}

// newThinkStream returns the splitter for parser (one of
// ReasoningParsers; nil for none) of a request whose prompt ends inside an
// open block if open (promptOpensThink).
func newThinkStream(parser string, open bool) *thinkStream {
	switch parser {
	case "deepseek_r1":
		return &thinkStream{deciding: true, inThink: true}
	case "qwen3":
		return &thinkStream{deciding: true, inThink: open}
	}
	return nil
}

// feed adds text; final says the output ended. It returns the reasoning
// and the content that may be sent now.
func (s *thinkStream) feed(text string, final bool) (reasoning, content string) {
	s.pending += text
	if s.deciding {
		t := strings.TrimLeftFunc(s.pending, unicode.IsSpace)
		switch {
		case strings.HasPrefix(t, thinkOpen):
			s.pending, s.inThink, s.deciding = t[len(thinkOpen):], true, false
		case strings.HasPrefix(thinkOpen, t) && !final:
			return "", "" // white space or a prefix of <think>: wait
		default:
			s.deciding = false
		}
	}
	if !s.inThink {
		content, s.pending = s.pending, ""
		return "", content
	}
	if i := strings.Index(s.pending, thinkClose); i >= 0 {
		reasoning, content = s.pending[:i], s.pending[i+len(thinkClose):]
		s.pending, s.inThink = "", false
		return reasoning, content
	}
	keep := 0
	if at, st := markerStart(s.pending, thinkClose); !final && st == startPartial {
		keep = len(s.pending) - at // may be the start of </think>
	}
	reasoning = s.pending[:len(s.pending)-keep]
	s.pending = s.pending[len(s.pending)-keep:]
	return reasoning, ""
}

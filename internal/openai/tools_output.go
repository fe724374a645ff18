package openai

import "strings"

// chatPost turns one chat choice's text into what the answer carries:
// reasoning (--reasoning-parser), content and tool calls. The same code
// serves a whole answer (one feed with final set) and a stream (a feed per
// piece), so the two give the same result.
type chatPost struct {
	think *thinkStream
	calls *callStream
	// tools is set when the output is a constrained call (held whole and
	// parsed at the end).
	tools  *toolRequest
	held   strings.Builder
	noShow bool // include_reasoning false: reasoning is dropped
	// n counts the calls handed out (the index of the next).
	n int
}

// newChatPost returns the post-processing of req's choices, or nil if
// their text is all content.
func newChatPost(req *request) *chatPost {
	if !req.chat {
		return nil
	}
	c := &chatPost{noShow: req.hideReasoning}
	switch {
	case req.tools.constrained():
		// The grammar makes the output a call from its first token: no
		// thinking to split off.
		c.tools = req.tools
		return c
	case req.tools != nil && req.tools.mode == toolAuto && req.tools.parser != nil:
		c.calls = &callStream{p: req.tools.parser}
	}
	c.think = newThinkStream(req.reasoningParser, req.thinkOpen)
	if c.think == nil && c.calls == nil {
		return nil
	}
	return c
}

// feed adds text; final says the output ended. It returns the reasoning
// and content that may be sent now and, once final, the calls.
func (c *chatPost) feed(text string, final bool) (reasoning, content string, calls []ToolCall) {
	if c.tools != nil {
		c.held.WriteString(text)
		if !final {
			return "", "", nil
		}
		if cs, ok := c.tools.calls(c.held.String()); ok {
			return "", "", cs
		}
		return "", c.held.String(), nil
	}
	content = text
	if c.think != nil {
		reasoning, content = c.think.feed(text, final)
		if c.noShow {
			reasoning = ""
		}
	}
	if c.calls != nil {
		var fcs []FunctionCall
		content, fcs = c.calls.feed(content, final)
		for _, fc := range fcs {
			calls = append(calls, ToolCall{ID: newCallID(), Type: "function", Function: fc})
		}
	}
	return reasoning, content, calls
}

// callFinish is the finish reason of a choice that finished with finish
// and made calls: "tool_calls" when the model ended its turn.
func callFinish(finish string, calls []ToolCall) string {
	if len(calls) > 0 && finish == "stop" {
		return "tool_calls"
	}
	return finish
}

// chatMessage is the answer's message for a choice's whole text (after
// the echo), and its finish reason.
func (rs *response) chatMessage(text, finish string) (ChatResponseMessage, string) {
	msg := ChatResponseMessage{Role: "assistant"}
	post := newChatPost(rs.req)
	if post == nil {
		content := rs.req.echoText + text
		msg.Content = &content
		return msg, finish
	}
	reasoning, content, calls := post.feed(text, true)
	if content = rs.req.echoText + content; content != "" || len(calls) == 0 && reasoning == "" {
		msg.Content = &content
	}
	if reasoning != "" {
		msg.ReasoningContent = &reasoning
	}
	msg.ToolCalls = calls
	return msg, callFinish(finish, calls)
}

// callDeltas are the stream deltas of calls, numbered from c.n: for each,
// its id, type and name, then its arguments.
func (c *chatPost) callDeltas(calls []ToolCall) []ChatDelta {
	var out []ChatDelta
	for _, call := range calls {
		out = append(out,
			ChatDelta{ToolCalls: []ToolCallDelta{{Index: c.n, ID: call.ID, Type: call.Type,
				Function: FunctionCallDelta{Name: call.Function.Name}}}},
			ChatDelta{ToolCalls: []ToolCallDelta{{Index: c.n, Function: FunctionCallDelta{Arguments: call.Function.Arguments}}}})
		c.n++
	}
	return out
}

// sendCalls streams the last step of choice idx, which made calls: delta
// (the content or reasoning left, if any) with the step's logprobs lp and
// ids, then each call's deltas, then an empty delta with finish (as OpenAI
// ends a stream of calls; clients take a call as complete once a chunk
// without its deltas arrives). An error means the client is gone.
func (rs *response) sendCalls(sse *sseWriter, idx int, delta ChatDelta, lp *ChatLogprobs, ids []int32,
	calls []ToolCall, finish *string) error {
	deltas := rs.posts[idx].callDeltas(calls)
	if delta.Content != nil || delta.ReasoningContent != nil {
		deltas = append([]ChatDelta{delta}, deltas...)
	}
	deltas = append(deltas, ChatDelta{})
	for i, d := range deltas {
		c := ChatChunkChoice{Index: idx, Delta: d}
		if i == 0 {
			c.Logprobs, c.TokenIDs = lp, rs.tokenIDs(ids)
		}
		last := i == len(deltas)-1
		if last {
			c.FinishReason = finish
		}
		ev := ChatCompletionChunk{ID: "chatcmpl-" + rs.rid, Object: "chat.completion.chunk", Created: rs.created,
			Model: rs.h.cfg.ModelName, Choices: []ChatChunkChoice{c}, Usage: rs.continuousUsage()}
		if err := sse.event(ev, last && !rs.finished()); err != nil {
			return err
		}
	}
	return nil
}

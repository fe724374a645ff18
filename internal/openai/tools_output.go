package openai

import "strings"

// chatPost turns one chat choice's text into what the answer carries:
// reasoning (--reasoning-parser), content and tool calls, the calls as
// pieces (ToolCallDelta: a call's id, type and name, then pieces of its
// arguments). The same code serves a whole answer (one feed with final
// set) and a stream (a feed per piece of text), so the two give the same
// result.
type chatPost struct {
	think *thinkStream
	calls *callStream
	// scan reads a constrained call as it is drawn.
	scan   *callScanner
	noShow bool // include_reasoning false: reasoning is dropped
	// single: parallel_tool_calls false, so calls after the first are
	// dropped (a constrained output has one only).
	single bool
	// shortIDs: call ids are newShortCallID's (Mistral's models).
	shortIDs bool
	// n counts the calls begun (the index of the next).
	n int
}

// newChatPost returns the post-processing of req's choices, or nil if
// their text is all content.
func newChatPost(req *request) *chatPost {
	if !req.chat {
		return nil
	}
	c := &chatPost{noShow: req.hideReasoning, shortIDs: req.tools != nil && req.tools.shortIDs}
	switch {
	case req.tools.constrained():
		// The grammar makes the output a call from its first token: no
		// thinking to split off.
		c.scan = &callScanner{}
		if req.tools.mode == toolNamed {
			c.scan.named = req.tools.name
		}
		return c
	case req.tools != nil && req.tools.mode == toolAuto && req.tools.parser != nil:
		c.calls = &callStream{p: req.tools.parser}
		c.single = !req.tools.parallel
	}
	if req.constraint.IsZero() {
		// A structured output (response_format and the like) is the
		// grammar's text from its first token: no think block.
		c.think = newThinkStream(req.reasoningParser, req.thinkOpen)
	}
	if c.think == nil && c.calls == nil {
		return nil
	}
	return c
}

// feed adds text; final says the output ended. It returns the reasoning
// and content that may be sent now and the pieces of calls.
func (c *chatPost) feed(text string, final bool) (reasoning, content string, pieces []ToolCallDelta) {
	if c.scan != nil {
		content, pieces = c.scan.feed(text, final, c)
		return "", content, pieces
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
			if c.single && c.n > 0 {
				break
			}
			pieces = append(pieces, c.begin(fc.Name))
			pieces = append(pieces, ToolCallDelta{Index: c.n - 1, Function: FunctionCallDelta{Arguments: fc.Arguments}})
		}
	}
	return reasoning, content, pieces
}

// begin starts a call of name: its first piece.
func (c *chatPost) begin(name string) ToolCallDelta {
	c.n++
	id := newCallID()
	if c.shortIDs {
		id = newShortCallID()
	}
	return ToolCallDelta{Index: c.n - 1, ID: id, Type: "function", Function: FunctionCallDelta{Name: name}}
}

// finish is the finish reason of a choice that finished with finish:
// "tool_calls" when it made calls and the model ended its turn.
func (c *chatPost) finish(finish string) string {
	if c != nil && c.n > 0 && finish == "stop" {
		return "tool_calls"
	}
	return finish
}

// assemble joins pieces into calls.
func assemble(pieces []ToolCallDelta) []ToolCall {
	var calls []ToolCall
	for _, p := range pieces {
		if p.Index == len(calls) {
			calls = append(calls, ToolCall{ID: p.ID, Type: p.Type, Function: FunctionCall{Name: p.Function.Name}})
		}
		calls[p.Index].Function.Arguments += p.Function.Arguments
	}
	return calls
}

// callScanner reads the output of a constrained tool_choice as it is drawn
// (toolRequest.schema): for a named function its arguments, else a JSON
// array of {"name": …, "parameters": …}, which the grammar writes compact
// with the properties in that order. A call begins once its name is read
// and its arguments follow in pieces as they come. Text that is not that
// shape (only possible for output that was not drawn under the
// constraint) is content from there on.
type callScanner struct {
	named string // the function of a named tool_choice ("" for required)
	// pending holds bytes of the fixed parts not matched yet.
	pending string
	state   scanState
	name    strings.Builder
	// The arguments' JSON: nesting depth and string state.
	depth      int
	inStr, esc bool
	failed     bool
	begun      bool // named: the call began
	// pre is the text read before the first call began: the content if
	// the output ends before one does.
	pre strings.Builder
}

type scanState uint8

const (
	scanOpen   scanState = iota // `[` then `{"name":"`
	scanName                    // the name, up to `"`
	scanParams                  // `,"parameters":`
	scanArgs                    // the arguments' JSON
	scanNext                    // `}` then `,{"name":"` or `]`
	scanEnd                     // after `]`
)

const (
	scanOpenLit   = `[{"name":"`
	scanParamsLit = `,"parameters":`
	scanNextLit   = `},{"name":"`
	scanLastLit   = `}]`
)

// feed reads text. It returns the content (text that is not a call) and
// the pieces of calls, numbered through c.
func (s *callScanner) feed(text string, final bool, c *chatPost) (string, []ToolCallDelta) {
	var pieces []ToolCallDelta
	if s.failed {
		return text, nil
	}
	if s.named != "" {
		if !s.begun && (text != "" || final) {
			s.begun = true
			pieces = append(pieces, c.begin(s.named))
		}
		if text != "" {
			pieces = append(pieces, ToolCallDelta{Index: c.n - 1, Function: FunctionCallDelta{Arguments: text}})
		}
		return "", pieces
	}
	if c.n == 0 {
		s.pre.WriteString(text)
	}
	var args strings.Builder
	flushArgs := func() {
		if args.Len() > 0 {
			pieces = append(pieces, ToolCallDelta{Index: c.n - 1, Function: FunctionCallDelta{Arguments: args.String()}})
			args.Reset()
		}
	}
	for i := 0; i < len(text); i++ {
		b := text[i]
		switch s.state {
		case scanOpen, scanParams, scanNext:
			s.pending += string(b)
			lits := []string{scanOpenLit}
			switch s.state {
			case scanParams:
				lits = []string{scanParamsLit}
			case scanNext:
				lits = []string{scanNextLit, scanLastLit}
			}
			matched, prefix := "", false
			for _, l := range lits {
				if s.pending == l {
					matched = l
				} else if strings.HasPrefix(l, s.pending) {
					prefix = true
				}
			}
			switch {
			case matched == scanParamsLit:
				s.state, s.pending = scanArgs, ""
				pieces = append(pieces, c.begin(s.name.String()))
			case matched == scanLastLit:
				s.state, s.pending = scanEnd, ""
			case matched != "":
				s.state, s.pending = scanName, ""
				s.name.Reset()
			case !prefix:
				// pending holds b already.
				flushArgs()
				return s.fail(text[i+1:], pieces, c)
			}
		case scanName:
			if b == '"' {
				s.state = scanParams
			} else {
				s.name.WriteByte(b)
			}
		case scanArgs:
			args.WriteByte(b)
			switch {
			case s.inStr && s.esc:
				s.esc = false
			case s.inStr && b == '\\':
				s.esc = true
			case s.inStr && b == '"':
				s.inStr = false
			case s.inStr:
			case b == '"':
				s.inStr = true
			case b == '{' || b == '[':
				s.depth++
			case b == '}' || b == ']':
				s.depth--
			}
			if s.depth == 0 && !s.inStr {
				// Arguments are an object: they end when it closes.
				flushArgs()
				s.state = scanNext
			}
		case scanEnd:
			flushArgs()
			return s.fail(text[i:], pieces, c)
		}
	}
	flushArgs()
	if final && c.n == 0 {
		// Cut before the first call began: the text is content.
		s.failed = true
		return s.pre.String(), pieces
	}
	return "", pieces
}

// fail turns the rest of the output into content (all of it if no call
// began).
func (s *callScanner) fail(rest string, pieces []ToolCallDelta, c *chatPost) (string, []ToolCallDelta) {
	s.failed = true
	if c.n == 0 {
		return s.pre.String(), nil
	}
	rest = s.pending + rest
	s.pending = ""
	return rest, pieces
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
	reasoning, content, pieces := post.feed(text, true)
	calls := assemble(pieces)
	if content = rs.req.echoText + content; content != "" || len(calls) == 0 && reasoning == "" {
		msg.Content = &content
	}
	if reasoning != "" {
		msg.ReasoningContent = &reasoning
	}
	msg.ToolCalls = calls
	return msg, post.finish(finish)
}

// sendPieces streams a step of choice idx that has pieces of calls: delta
// (the content or reasoning of the step, if any) with the step's logprobs
// lp and ids, then a delta per piece, then, if the choice finished, an
// empty delta with finish (as OpenAI ends a stream of calls; clients take
// a call as complete once a chunk without its deltas arrives). An error
// means the client is gone.
func (rs *response) sendPieces(sse *sseWriter, idx int, delta ChatDelta, lp *ChatLogprobs, ids []int32,
	pieces []ToolCallDelta, finish *string) error {
	var deltas []ChatDelta
	if delta.Content != nil || delta.ReasoningContent != nil {
		deltas = append(deltas, delta)
	}
	for _, p := range pieces {
		deltas = append(deltas, ChatDelta{ToolCalls: []ToolCallDelta{p}})
	}
	if finish != nil {
		deltas = append(deltas, ChatDelta{})
	}
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

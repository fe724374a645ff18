package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// This file parses the tool calls a model writes into its text, for
// tool_choice "auto", family by family, after vLLM's tool parsers:
//
//   - hermes (Hermes 2 Pro and later, Qwen 2.5 and Qwen 3):
//     <tool_call>{"name": …, "arguments": {…}}</tool_call>, any number,
//     after optional content;
//   - llama3_json (Llama 3.1 to 3.3): the answer starts with a JSON object
//     {"name": …, "parameters": {…}} ("arguments" is taken too), maybe
//     after <|python_tag|>, several separated by ";";
//   - mistral: content, then [TOOL_CALLS] and a JSON array of {"name",
//     "arguments"} (or, in newer tokenizers' format, name[ARGS]{…} for each
//     call).
//
// Text up to where a call starts is content, streamed as it comes (less
// whatever could be the start of the call's marker); from there on the
// text is held and parsed when the output ends. If it does not parse, it
// is content after all, as vLLM returns it.

// ToolCallParsers are the names --tool-call-parser takes (vLLM's), besides
// "auto" (chosen from the chat template) and "none".
var ToolCallParsers = []string{"hermes", "llama3_json", "mistral"}

// toolParser is one family's format of calls in text.
type toolParser interface {
	// name is the parser's --tool-call-parser name.
	name() string
	// start finds where a call begins in text: at (found), or, when
	// text ends with what could begin one, from where it could (partial,
	// at ≤ len(text)); otherwise none.
	start(text string) (at int, st startState)
	// parse parses text from a call's start to the output's end.
	parse(text string) ([]FunctionCall, bool)
	// markers are the special tokens the parser reads, which the output
	// must render (they are otherwise left out of the text).
	markers() []string
}

// startState is what toolParser.start found.
type startState uint8

const (
	startNone    startState = iota
	startPartial            // text ends with what may begin a call
	startFound              // a call begins
	startNever              // no call can begin in this output any more
)

// newToolParser returns the parser named (one of ToolCallParsers), or nil
// for "none" and "".
func newToolParser(name string) (toolParser, error) {
	switch name {
	case "", "none":
		return nil, nil
	case "hermes":
		return hermesParser{}, nil
	case "llama3_json":
		return llama3Parser{}, nil
	case "mistral":
		return mistralParser{}, nil
	}
	return nil, fmt.Errorf("unknown tool call parser %q (want auto, none, %s)", name, strings.Join(ToolCallParsers, ", "))
}

// ToolCallParserFor returns the parser --tool-call-parser auto picks for
// a chat template's text: hermes for a template that writes <tool_call>,
// mistral for [TOOL_CALLS], llama3_json for <|python_tag|> or the Llama 3
// JSON call format, else "none" (the model's text is content).
func ToolCallParserFor(template string) string {
	switch {
	case strings.Contains(template, "<tool_call>"):
		return "hermes"
	case strings.Contains(template, "[TOOL_CALLS]"):
		return "mistral"
	case strings.Contains(template, "<|python_tag|>"),
		strings.Contains(template, `"parameters": `) && strings.Contains(template, "<|eot_id|>"):
		return "llama3_json"
	}
	return "none"
}

// markerStart finds marker in text: its index, or the start of the
// longest suffix of text that is a proper prefix of marker.
func markerStart(text, marker string) (int, startState) {
	if i := strings.Index(text, marker); i >= 0 {
		return i, startFound
	}
	for k := min(len(marker)-1, len(text)); k > 0; k-- {
		if strings.HasSuffix(text, marker[:k]) {
			return len(text) - k, startPartial
		}
	}
	return len(text), startNone
}

// callObject is a call as the families write it.
type callObject struct {
	Name       string          `json:"name"`
	Arguments  json.RawMessage `json:"arguments"`
	Parameters json.RawMessage `json:"parameters"`
}

// call converts c; false without a name or with arguments that are not an
// object.
func (c callObject) call() (FunctionCall, bool) {
	args := c.Arguments
	if args == nil {
		args = c.Parameters
	}
	if c.Name == "" {
		return FunctionCall{}, false
	}
	switch firstByte(args) {
	case 0:
		args = json.RawMessage("{}")
	case '{':
	case '"':
		// Some models write the arguments as a JSON string of an object.
		var s string
		if json.Unmarshal(args, &s) != nil || firstByte(json.RawMessage(s)) != '{' || !json.Valid([]byte(s)) {
			return FunctionCall{}, false
		}
		args = json.RawMessage(s)
	default:
		return FunctionCall{}, false
	}
	var b bytes.Buffer
	if json.Compact(&b, args) != nil {
		return FunctionCall{}, false
	}
	return FunctionCall{Name: c.Name, Arguments: b.String()}, true
}

// decodeCall decodes one call object at the start of text (after white
// space), returning what follows it.
func decodeCall(text string) (FunctionCall, string, bool) {
	dec := json.NewDecoder(strings.NewReader(text))
	var c callObject
	if firstByte(json.RawMessage(text)) != '{' || dec.Decode(&c) != nil {
		return FunctionCall{}, "", false
	}
	fc, ok := c.call()
	return fc, text[dec.InputOffset():], ok
}

type hermesParser struct{}

func (hermesParser) name() string      { return "hermes" }
func (hermesParser) markers() []string { return nil }

func (hermesParser) start(text string) (int, startState) { return markerStart(text, "<tool_call>") }

// parse reads <tool_call>…</tool_call> blocks (see blocks).
func (h hermesParser) parse(text string) ([]FunctionCall, bool) {
	calls, _, failed := h.blocks(text, true)
	return calls, !failed && len(calls) > 0
}

// blockParser is a toolParser whose calls are delimited blocks, each
// complete before the next begins: callStream hands out each call as soon
// as its block closes.
type blockParser interface {
	// blocks reads the complete blocks at the start of text (which
	// begins where a call does, or after a block): their calls and the
	// text left (an incomplete block, or, once final, nothing: text after
	// the last block is dropped). failed: text holds something that is
	// not a valid block, left in rest.
	blocks(text string, final bool) (calls []FunctionCall, rest string, failed bool)
}

// blocks reads <tool_call>…</tool_call> blocks; once final, the last may be
// unclosed.
func (hermesParser) blocks(text string, final bool) ([]FunctionCall, string, bool) {
	var calls []FunctionCall
	for {
		t := strings.TrimLeftFunc(text, unicode.IsSpace)
		body, ok := strings.CutPrefix(t, "<tool_call>")
		if !ok {
			if t == "" || strings.HasPrefix("<tool_call>", t) && !final {
				return calls, text, false // more may come
			}
			if final {
				return calls, "", false // text after the calls is dropped, as vLLM does
			}
			return calls, text, false
		}
		inner, after, closed := strings.Cut(body, "</tool_call>")
		if !closed && !final {
			return calls, text, false
		}
		fc, tail, ok := decodeCall(inner)
		if !ok || strings.TrimSpace(tail) != "" {
			return calls, text, true
		}
		calls = append(calls, fc)
		text = after
	}
}

type llama3Parser struct{}

func (llama3Parser) name() string      { return "llama3_json" }
func (llama3Parser) markers() []string { return []string{"<|python_tag|>"} }

// start: a call is the whole answer, so it begins at the first byte that
// is not white space, with <|python_tag|> or "{".
func (llama3Parser) start(text string) (int, startState) {
	t := strings.TrimLeftFunc(text, unicode.IsSpace)
	switch {
	case t == "":
		return 0, startPartial
	case strings.HasPrefix(t, "{") || strings.HasPrefix(t, "<|python_tag|>"):
		return 0, startFound // the white space before is no content either
	case strings.HasPrefix("<|python_tag|>", t):
		return 0, startPartial
	}
	return len(text), startNever
}

// parse reads one or more call objects separated by ";".
func (llama3Parser) parse(text string) ([]FunctionCall, bool) {
	text = strings.TrimLeftFunc(text, unicode.IsSpace)
	text = strings.TrimPrefix(text, "<|python_tag|>")
	var calls []FunctionCall
	for {
		fc, rest, ok := decodeCall(text)
		if !ok {
			return nil, false
		}
		calls = append(calls, fc)
		rest = strings.TrimSpace(rest)
		if rest == "" {
			return calls, true
		}
		var more bool
		if text, more = strings.CutPrefix(rest, ";"); !more {
			return nil, false
		}
	}
}

type mistralParser struct{}

func (mistralParser) name() string      { return "mistral" }
func (mistralParser) markers() []string { return []string{"[TOOL_CALLS]", "[ARGS]"} }

func (mistralParser) start(text string) (int, startState) { return markerStart(text, "[TOOL_CALLS]") }

// parse reads [TOOL_CALLS] and a JSON array of calls, or one or more
// [TOOL_CALLS]name[ARGS]{…}.
func (mistralParser) parse(text string) ([]FunctionCall, bool) {
	rest := strings.TrimSpace(strings.TrimPrefix(text, "[TOOL_CALLS]"))
	if strings.HasPrefix(rest, "[") {
		var list []callObject
		if json.Unmarshal([]byte(rest), &list) != nil || len(list) == 0 {
			return nil, false
		}
		calls := make([]FunctionCall, len(list))
		for i, c := range list {
			fc, ok := c.call()
			if !ok {
				return nil, false
			}
			calls[i] = fc
		}
		return calls, true
	}
	var calls []FunctionCall
	for _, part := range strings.Split(rest, "[TOOL_CALLS]") {
		name, args, ok := strings.Cut(strings.TrimSpace(part), "[ARGS]")
		if !ok || !toolName.MatchString(name) {
			return nil, false
		}
		fc, ok := callObject{Name: name, Arguments: json.RawMessage(strings.TrimSpace(args))}.call()
		if !ok || !json.Valid([]byte(strings.TrimSpace(args))) {
			return nil, false
		}
		calls = append(calls, fc)
	}
	return calls, len(calls) > 0
}

// callStream separates one choice's content from the calls in it as the
// text arrives.
type callStream struct {
	p       toolParser
	pending string // content not yet handed out (a marker may begin in it)
	calling bool   // a call began: the rest is held in pending
	never   bool   // no call can begin any more
}

// feed adds text; final says the output ended. It returns the content
// that may be sent now and, once final, the calls (nil if none parsed).
func (s *callStream) feed(text string, final bool) (string, []FunctionCall) {
	s.pending += text
	var content strings.Builder
	if !s.calling && !s.never {
		at, st := s.p.start(s.pending)
		switch st {
		case startFound:
			content.WriteString(s.pending[:at])
			s.pending, s.calling = s.pending[at:], true
		case startPartial:
			content.WriteString(s.pending[:at])
			s.pending = s.pending[at:]
		case startNone, startNever:
			content.WriteString(s.pending)
			s.pending, s.never = "", st == startNever
		}
	} else if s.never {
		content.WriteString(s.pending)
		s.pending = ""
	}
	if bp, ok := s.p.(blockParser); ok && s.calling && !s.never {
		calls, rest, failed := bp.blocks(s.pending, final)
		s.pending = rest
		if failed {
			// The rest is not a call: content, as is all that follows.
			s.never = true
			content.WriteString(s.pending)
			s.pending = ""
		}
		return content.String(), calls
	}
	if !final {
		return content.String(), nil
	}
	if s.calling {
		if calls, ok := s.p.parse(s.pending); ok {
			s.pending = ""
			return content.String(), calls
		}
	}
	content.WriteString(s.pending)
	s.pending = ""
	return content.String(), nil
}

// markerIDs returns the ids of p's markers that are single special tokens
// of tok (encode is its Encode), which the output must keep in its text.
func markerIDs(p toolParser, encode func(string, bool) ([]int32, error)) []int32 {
	if p == nil || encode == nil {
		return nil
	}
	var ids []int32
	for _, m := range p.markers() {
		if got, err := encode(m, false); err == nil && len(got) == 1 && !slices.Contains(ids, got[0]) {
			ids = append(ids, got[0])
		}
	}
	return ids
}

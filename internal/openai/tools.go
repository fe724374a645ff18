package openai

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model"
)

// This file implements function calling on chat completions, after
// OpenAI's API and vLLM's implementation of it:
//
//   - tools are validated and given to the chat template as its tools
//     variable (a list of {"type":"function","function":{…}} dicts);
//   - tool_choice "none" renders the tools too (vLLM's default) and returns
//     the model's text as content;
//   - tool_choice "auto" parses calls out of the model's text with the
//     family's parser (toolparse.go; --tool-call-parser);
//   - tool_choice "required" and a named function constrain the output with
//     a JSON Schema (toolSchema), so the answer is a valid call of a declared
//     tool whatever the model, and turn that JSON into tool_calls.

// Tool is one entry of a chat request's tools.
type Tool struct {
	// Type is "function", the only kind.
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction is a function the model may call.
type ToolFunction struct {
	// Name is 1 to 64 of [a-zA-Z0-9_-] (OpenAI's rule).
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the arguments: an object schema
	// (absent: no arguments).
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// Strict is accepted: the constrained calls are always exact.
	Strict *bool `json:"strict,omitempty"`
}

// ToolCall is a function call of an assistant message, in a request's
// messages or in an answer.
type ToolCall struct {
	// ID is unique per call ("call_" and 24 random hex digits in answers).
	ID string `json:"id"`
	// Type is "function".
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function called and its arguments.
type FunctionCall struct {
	Name string `json:"name"`
	// Arguments is a JSON object as a string.
	Arguments string `json:"arguments"`
}

// ToolCallDelta is a piece of a streamed call: the first of a call carries
// its ID, Type and Function.Name (with empty arguments), the next ones
// pieces of Function.Arguments, all with the call's Index.
type ToolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function FunctionCallDelta `json:"function"`
}

// FunctionCallDelta is the function part of a ToolCallDelta.
type FunctionCallDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// MaxTools bounds the tools of a request (OpenAI's limit, 128).
const MaxTools = 128

// toolName is what OpenAI allows as a function name.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// toolMode is a request's tool_choice.
type toolMode uint8

const (
	toolNone toolMode = iota
	toolAuto
	toolRequired
	toolNamed
)

// toolRequest is a chat request's validated tools.
type toolRequest struct {
	tools []Tool
	// params are the schemas of the tools' arguments (toolParameters).
	params []json.RawMessage
	// list is the tools as the template gets them (the client's JSON).
	list json.RawMessage
	mode toolMode
	// name is the function a named tool_choice calls.
	name string
	// parallel: more than one call per answer (parallel_tool_calls,
	// default true).
	parallel bool
	// parser parses calls out of text (toolAuto; nil: the model's family
	// is not known, so its text is content).
	parser toolParser
	// spec constrains the output to calls (toolRequired and toolNamed).
	spec grammar.Spec
	// shortIDs: the model is Mistral's, whose templates take only call
	// ids of 9 letters and digits (newShortCallID).
	shortIDs bool
}

// constrained reports whether the output is grammar-constrained to calls.
func (t *toolRequest) constrained() bool {
	return t != nil && (t.mode == toolRequired || t.mode == toolNamed)
}

// emptyParameters is the schema of the arguments of a function that
// declares no parameters: {} only.
const emptyParameters = `{"type":"object","properties":{},"additionalProperties":false}`

// tools validates w's tools, tool_choice and parallel_tool_calls; nil when
// the request offers none. Errors are 400s naming the field.
func (p *parser) tools(w *ChatCompletionRequest) (*toolRequest, error) {
	choice := strings.TrimSpace(string(w.ToolChoice))
	parallel := true
	if !isNull(w.ParallelToolCalls) {
		if err := json.Unmarshal(w.ParallelToolCalls, &parallel); err != nil {
			return nil, BadRequest("parallel_tool_calls", "parallel_tool_calls must be a boolean")
		}
	}
	if emptyJSON(w.Tools) {
		if isNull(w.ToolChoice) || choice == `"none"` {
			return nil, nil
		}
		return nil, BadRequest("tool_choice", "tool_choice is only allowed when tools are given")
	}
	var raws []json.RawMessage
	if firstByte(w.Tools) != '[' || json.Unmarshal(w.Tools, &raws) != nil {
		return nil, BadRequest("tools", "tools must be an array of {\"type\": \"function\", \"function\": {…}}")
	}
	if len(raws) > MaxTools {
		return nil, BadRequest("tools", "at most %d tools are allowed, got %d", MaxTools, len(raws))
	}
	tr := &toolRequest{list: w.Tools, parallel: parallel, mode: toolAuto}
	for i, raw := range raws {
		var t Tool
		if firstByte(raw) != '{' || json.Unmarshal(raw, &t) != nil {
			return nil, BadRequest("tools", "tools[%d] must be {\"type\": \"function\", \"function\": {name, description, parameters}}", i)
		}
		if t.Type != "function" {
			return nil, BadRequest("tools", "tools[%d].type must be \"function\", got %q", i, t.Type)
		}
		if !toolName.MatchString(t.Function.Name) {
			return nil, BadRequest("tools", "tools[%d].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got %q", i, t.Function.Name)
		}
		if slices.ContainsFunc(tr.tools, func(o Tool) bool { return o.Function.Name == t.Function.Name }) {
			return nil, BadRequest("tools", "tools[%d]: function %q is declared twice", i, t.Function.Name)
		}
		params, err := toolParameters(t.Function.Parameters)
		if err != nil {
			return nil, BadRequest(parametersField(i), "%s %s", parametersField(i), err)
		}
		tr.tools = append(tr.tools, t)
		tr.params = append(tr.params, params)
	}
	switch {
	case isNull(w.ToolChoice) || choice == `"auto"`:
	case choice == `"none"`:
		tr.mode = toolNone
	case choice == `"required"`:
		tr.mode = toolRequired
	case firstByte(w.ToolChoice) == '{':
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(w.ToolChoice, &named) != nil || named.Type != "function" {
			return nil, BadRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}")
		}
		if !slices.ContainsFunc(tr.tools, func(t Tool) bool { return t.Function.Name == named.Function.Name }) {
			return nil, BadRequest("tool_choice", "tool_choice names function %q, which is not among the tools", named.Function.Name)
		}
		tr.mode, tr.name = toolNamed, named.Function.Name
	default:
		return nil, BadRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}")
	}
	if tr.constrained() {
		src, err := tr.schema()
		if err != nil {
			return nil, err
		}
		tr.spec = grammar.Spec{Kind: grammar.KindJSONSchema, Source: src}
	}
	return tr, nil
}

// compileError is the 400 for the schema of a constrained tool_choice
// that does not compile: it names the parameters of the tool at fault and
// the path inside them when the error has one, else "tools".
func (t *toolRequest) compileError(err error) *Error {
	var ge *grammar.Error
	if !errors.As(err, &ge) {
		return compileError("tools", err)
	}
	for i, tool := range t.tools {
		if t.mode == toolNamed {
			if tool.Function.Name == t.name {
				return compileError(parametersField(i), err)
			}
			continue
		}
		if rest, ok := strings.CutPrefix(ge.Path, "#"+paramsAt(i)); ok && (rest == "" || rest[0] == '/') {
			e := *ge
			e.Path = "#" + rest
			return compileError(parametersField(i), &e)
		}
	}
	return compileError("tools", err)
}

// parametersField names the parameters of tools[i].
func parametersField(i int) string { return fmt.Sprintf("tools[%d].function.parameters", i) }

// schema is the JSON Schema the output of a constrained tool_choice
// follows, as vLLM constrains it: for a named function, that function's
// parameters (the output is the arguments); for "required", an array of at
// least one (at most one without parallel_tool_calls) {"name": one of the
// tools, "parameters": its parameters}, each tool's local $refs moved to
// where its parameters sit in that array's schema (paramsAt). The error is
// a 400 naming the parameters whose reference cannot be moved.
func (t *toolRequest) schema() (string, error) {
	if t.mode == toolNamed {
		for i, tool := range t.tools {
			if tool.Function.Name == t.name {
				return string(t.params[i]), nil
			}
		}
	}
	var b []byte
	b = append(b, `{"type":"array","minItems":1,`...)
	if !t.parallel {
		b = append(b, `"maxItems":1,`...)
	}
	b = append(b, `"items":{"anyOf":[`...)
	for i, tool := range t.tools {
		if i > 0 {
			b = append(b, ',')
		}
		params, err := rebaseRefs(t.params[i], paramsAt(i))
		if err != nil {
			return "", BadRequest(parametersField(i), "%s: %v", parametersField(i), err)
		}
		b = append(b, `{"type":"object","properties":{"name":{"const":`...)
		b = AppendJSONString(b, tool.Function.Name, false)
		b = append(b, `},"parameters":`...)
		b = append(b, params...)
		b = append(b, `},"required":["name","parameters"],"additionalProperties":false}`...)
	}
	b = append(b, `]}}`...)
	return string(b), nil
}

// paramsAt is the JSON pointer of the parameters of tools[i] in the schema
// of a "required" tool_choice.
func paramsAt(i int) string { return "/items/anyOf/" + strconv.Itoa(i) + "/properties/parameters" }

// newCallID returns "call_" and 24 random hex digits (96 bits: unique).
func newCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("call_%x", b)
}

// newShortCallID returns 9 random letters and digits, the call ids
// Mistral's templates accept (vLLM's mistral parser mints them too).
func newShortCallID() string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [9]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b[:])
}

// mistralIDs cuts the call ids of msgs (assistants' tool_calls, tool
// messages' tool_call_id) to their last 9 bytes, as vLLM does for Mistral's
// templates, which refuse any other length: the ids this server mints for
// other families end with 9 hex digits, and a call and its answer keep the
// same id.
func mistralIDs(msgs []model.Message) {
	cut := func(id string) string {
		if len(id) > 9 {
			return id[len(id)-9:]
		}
		return id
	}
	for i := range msgs {
		for j := range msgs[i].ToolCalls {
			msgs[i].ToolCalls[j].ID = cut(msgs[i].ToolCalls[j].ID)
		}
		msgs[i].ToolCallID = cut(msgs[i].ToolCallID)
	}
}

// messageToolCalls converts an assistant message's tool_calls for the
// template; i is the message's index.
func messageToolCalls(i int, m ChatMessage) ([]model.ToolCall, error) {
	if len(m.ToolCalls) == 0 {
		return nil, nil
	}
	if m.Role != "assistant" {
		return nil, BadRequest("messages", "messages[%d]: only an assistant's message may have tool_calls, not one of role %s", i, m.Role)
	}
	out := make([]model.ToolCall, len(m.ToolCalls))
	for j, c := range m.ToolCalls {
		if c.Type != "" && c.Type != "function" {
			return nil, BadRequest("messages", "messages[%d].tool_calls[%d].type must be \"function\", got %q", i, j, c.Type)
		}
		if c.Function.Name == "" {
			return nil, BadRequest("messages", "messages[%d].tool_calls[%d].function.name is required", i, j)
		}
		out[j] = model.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments}
	}
	return out, nil
}

// chatTools sets up w's tools and reasoning on req, and the tools of the
// template's rendering on opts; msgs are the messages to render, whose call
// ids it shortens for Mistral's templates (mistralIDs).
func (p *parser) chatTools(w *ChatCompletionRequest, req *request, opts *model.ChatOptions, msgs []model.Message) error {
	if reasoningOn(p.reasoningParser) {
		req.reasoningParser = p.reasoningParser
		req.hideReasoning = w.IncludeReasoning != nil && !*w.IncludeReasoning
	}
	family := p.toolParser
	if family == "" || family == "auto" {
		tmpl := opts.Template
		if src, ok := p.tok.(interface{ ChatTemplateSource() string }); ok && tmpl == "" {
			tmpl = src.ChatTemplateSource()
		}
		family = ToolCallParserFor(tmpl)
	}
	if family == "mistral" {
		mistralIDs(msgs)
	}
	tr, err := p.tools(w)
	if err != nil || tr == nil {
		return err
	}
	opts.Tools, req.tools = tr.list, tr
	tr.shortIDs = family == "mistral"
	switch {
	case tr.constrained():
		if !req.constraint.IsZero() {
			return BadRequest("tool_choice", "tool_choice %s makes the answer a function call, and a structured-output field (response_format or the like) constrains it too: send one",
				strings.TrimSpace(string(w.ToolChoice)))
		}
		if err := p.compiled.check(tr.spec); err != nil {
			return tr.compileError(err)
		}
		req.constraint = tr.spec
	case tr.mode == toolAuto:
		if tr.parser, err = newToolParser(family); err != nil {
			return Internal("%v", err)
		}
		req.keepSpecial = markerIDs(tr.parser, p.tok.Encode)
	}
	return nil
}

// reasoningOn reports whether --reasoning-parser names a parser.
func reasoningOn(name string) bool { return name != "" && name != "none" }

// CheckParsers checks the --tool-call-parser and --reasoning-parser names
// of o: an error names the flag and the names it takes.
func (o APIOptions) CheckParsers() error {
	if o.ToolCallParser != "auto" {
		if _, err := newToolParser(o.ToolCallParser); err != nil {
			return fmt.Errorf("--tool-call-parser: %w", err)
		}
	}
	if err := checkReasoningParser(o.ReasoningParser); err != nil {
		return fmt.Errorf("--reasoning-parser: %w", err)
	}
	return nil
}

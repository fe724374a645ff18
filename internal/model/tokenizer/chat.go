package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ardanlabs/jinja"

	"github.com/pdserve/pdserve/internal/model"
)

// MaxTemplateBytes bounds a chat template given with a request
// (model.ChatOptions.Template).
const MaxTemplateBytes = 64 << 10

// reservedVars are the template variables chat_template_kwargs may not set:
// those RenderChat sets itself, and the special tokens of
// tokenizer_config.json (specialTokenKeys).
var reservedVars = []string{"messages", "add_generation_prompt", "tools", "documents"}

// RenderChat renders msgs with tmpl as transformers' apply_chat_template
// (tokenize=False) does with opts: the variables are vars (fixed ones, such
// as a model's special tokens), opts.Kwargs (chat_template_kwargs, JSON
// values as jinja values: objects as dicts in their key order, arrays as
// lists, strings, integers (numbers without fraction or exponent that fit
// int64), other numbers as floats, booleans, null as none), messages (a
// list of {role, content} dicts, in that key order, with tool_calls,
// tool_call_id and name where messages have them: see messageValue),
// add_generation_prompt (true unless opts.NoGenerationPrompt or
// opts.ContinueFinalMessage), tools (opts.Tools as a list of dicts, or none)
// and documents (none). A kwarg named like one of those, or like a
// special token (bos_token, eos_token, unk_token, sep_token, pad_token,
// cls_token, mask_token), is an error.
//
// With opts.ContinueFinalMessage the last message must be an assistant's,
// and the rendered text is cut right after its content, as transformers
// does it: at the last occurrence of the content with surrounding white
// space trimmed, keeping the untrimmed content when the text has it there
// in full (so the prompt ends with the content and the model continues
// it); a content the text does not contain is an error.
func RenderChat(tmpl *jinja.Template, msgs []model.Message, opts model.ChatOptions, vars map[string]jinja.Value) (string, error) {
	cont := opts.ContinueFinalMessage
	if cont && (len(msgs) == 0 || msgs[len(msgs)-1].Role != "assistant") {
		return "", errors.New("chat template: continue_final_message needs a final message from the assistant")
	}
	data := make(map[string]jinja.Value, len(vars)+len(opts.Kwargs)+4)
	for k, v := range vars {
		data[k] = v
	}
	for k, raw := range opts.Kwargs {
		if _, fixed := vars[k]; fixed || slices.Contains(reservedVars, k) || slices.Contains(specialTokenKeys, k) {
			return "", fmt.Errorf("chat_template_kwargs: %q may not be set", k)
		}
		v, err := jinjaValue(raw)
		if err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %q: %w", k, err)
		}
		data[k] = v
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		list[i] = messageValue(m)
	}
	data["messages"] = jinja.NewList(list)
	data["add_generation_prompt"] = jinja.NewBool(!opts.NoGenerationPrompt && !cont)
	data["tools"] = jinja.None()
	if opts.Tools != nil {
		tools, err := jinjaValue(opts.Tools)
		if err != nil {
			return "", fmt.Errorf("chat template: tools: %w", err)
		}
		data["tools"] = tools
	}
	data["documents"] = jinja.None()
	out, err := tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	if cont {
		return ContinueFinal(out, msgs[len(msgs)-1].Content)
	}
	return out, nil
}

// messageValue is m as the template sees it: a dict of role and content,
// then, when set, tool_calls (a list of {id, type "function", function
// {name, arguments}}, the arguments a dict when they are a JSON object, as
// vLLM gives them to templates, else the text), tool_call_id and name.
func messageValue(m model.Message) jinja.Value {
	d := jinja.NewDict()
	d.AsDict().Set("role", jinja.NewString(m.Role))
	d.AsDict().Set("content", jinja.NewString(m.Content))
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			args := jinja.NewString(c.Arguments)
			if t := strings.TrimSpace(c.Arguments); strings.HasPrefix(t, "{") {
				if v, err := jinjaValue(json.RawMessage(t)); err == nil {
					args = v
				}
			}
			fn := jinja.NewDict()
			fn.AsDict().Set("name", jinja.NewString(c.Name))
			fn.AsDict().Set("arguments", args)
			call := jinja.NewDict()
			call.AsDict().Set("id", jinja.NewString(c.ID))
			call.AsDict().Set("type", jinja.NewString("function"))
			call.AsDict().Set("function", fn)
			calls[i] = call
		}
		d.AsDict().Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		d.AsDict().Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		d.AsDict().Set("name", jinja.NewString(m.Name))
	}
	return d
}

// ChatTemplateSource returns the text of the model's chat template ("" if
// it has none): the front end reads it to tell which tool-call and
// reasoning markup the model writes.
func (t *Tokenizer) ChatTemplateSource() string {
	if t.chat == nil {
		return ""
	}
	return t.chat.src
}

// ContinueFinal cuts a chat rendered without a generation prompt right
// after its final message, whose content is final, as transformers'
// continue_final_message does (see RenderChat). It returns an error if the
// text does not contain the content.
func ContinueFinal(rendered, final string) (string, error) {
	trimmed := strings.TrimSpace(final)
	at := strings.LastIndex(rendered, trimmed)
	if at < 0 {
		return "", errors.New("chat template: continue_final_message: the final message does not appear in the rendered chat")
	}
	if strings.HasPrefix(rendered[at:], final) {
		return rendered[:at+len(final)], nil
	}
	return rendered[:at+len(trimmed)], nil
}

// jinjaValue converts one JSON value to a jinja value (see RenderChat).
func jinjaValue(raw json.RawMessage) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("invalid JSON: more than one value")
	}
	return v, nil
}

// decodeValue reads the next JSON value of dec.
func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		if !strings.ContainsAny(t.String(), ".eE") {
			if n, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
				return jinja.NewInt(n), nil
			}
		}
		f, err := strconv.ParseFloat(t.String(), 64)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("number %s: %w", t, err)
		}
		return jinja.NewFloat(f), nil
	case json.Delim:
		switch t {
		case '[':
			items := []jinja.Value{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			_, err := dec.Token() // ]
			return jinja.NewList(items), err
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(k.(string), v)
			}
			_, err := dec.Token() // }
			return d, err
		}
	}
	return jinja.Value{}, fmt.Errorf("unexpected %v", tok)
}

// TemplateCache compiles the chat templates requests bring
// (model.ChatOptions.Template), keeping the last few compiled so that a
// client sending the same template each time compiles it once. It is safe
// for concurrent use; the zero value is ready to use.
type TemplateCache struct {
	mu      sync.Mutex
	entries []cachedTemplate // most recently used last
}

// cachedTemplates bounds a TemplateCache: at most that many templates of
// at most MaxTemplateBytes each.
const cachedTemplates = 8

type cachedTemplate struct {
	src  string
	tmpl *jinja.Template
}

// Get returns src compiled. It returns an error naming the template (the
// request's chat_template) for a source longer than MaxTemplateBytes or one
// that does not compile; failures are not cached.
func (c *TemplateCache) Get(src string) (*jinja.Template, error) {
	if len(src) > MaxTemplateBytes {
		return nil, fmt.Errorf("the request's chat_template has %d bytes, more than the %d allowed", len(src), MaxTemplateBytes)
	}
	if tmpl := c.lookup(src); tmpl != nil {
		return tmpl, nil
	}
	tmpl, err := jinja.Compile(src) // outside the lock: compiling takes a while
	if err != nil {
		return nil, fmt.Errorf("the request's chat_template cannot be compiled: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.src == src { // compiled meanwhile by another caller
			return e.tmpl, nil
		}
	}
	if len(c.entries) == cachedTemplates {
		c.entries = append(c.entries[:0], c.entries[1:]...)
	}
	c.entries = append(c.entries, cachedTemplate{src: src, tmpl: tmpl})
	return tmpl, nil
}

// lookup returns src's compiled template if cached (making it the most
// recently used), else nil.
func (c *TemplateCache) lookup(src string) *jinja.Template {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.entries {
		if e.src == src {
			copy(c.entries[i:], c.entries[i+1:])
			c.entries[len(c.entries)-1] = e
			return e.tmpl
		}
	}
	return nil
}

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

// Limits on request fields (the body as a whole is limited by
// Config.MaxBodyBytes).
const (
	// MaxStopStrings is the largest number of stop strings accepted
	// (OpenAI allows 4; vLLM any number).
	MaxStopStrings = 16
	// MaxStopStringBytes is the longest stop string accepted, in bytes.
	MaxStopStringBytes = 1024
	// MaxStopTokenIDs is the largest number of stop_token_ids accepted.
	MaxStopTokenIDs = 1024
)

// request is a validated generation request: what the handler works on.
type request struct {
	chat           bool
	promptIDs      []int32
	maxTokens      int
	sampling       model.SamplingParams
	stop           []string
	stopTokenIDs   []int32
	ignoreEOS      bool
	minTokens      int
	includeStopStr bool
	stream         bool
	includeUsage   bool
	// continuousUsage: usage in every chunk (with includeUsage).
	continuousUsage bool
	returnTokenIDs  bool
}

// parser converts wire requests into requests. Its methods are pure given
// newSeed.
type parser struct {
	modelName  string
	tok        model.Tokenizer // nil: token-id prompts only
	contextLen int
	// contextNow, if set, gives the context length for each request.
	contextNow func() int
	newSeed    func() uint64
	// vocabSize bounds token ids (0: unchecked here).
	vocabSize int
}

// decodeBody decodes one JSON object from r into v, mapping every failure to
// an *Error: 413 for a body over the limit, 400 naming the field for a value
// of the wrong type, 400 for invalid JSON or trailing data.
func decodeBody(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	err := dec.Decode(v)
	if err == nil {
		// Anything but white space after the object is an error.
		var extra json.RawMessage
		switch err2 := dec.Decode(&extra); {
		case err2 == io.EOF:
			return nil
		case err2 == nil:
			return BadRequest("", "invalid JSON: unexpected data after the request object")
		default:
			err = err2
		}
	}
	var (
		mb  *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mb):
		return TooLarge(mb.Limit)
	case errors.Is(err, io.EOF):
		return BadRequest("", "the request body is empty; expected a JSON object")
	case errors.As(err, &se):
		return BadRequest("", "invalid JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &ute):
		if ute.Field == "" {
			return BadRequest("", "the request body must be a JSON object, got %s", ute.Value)
		}
		field := jsonPath(ute.Field)
		if lit, ok := strings.CutPrefix(ute.Value, "number "); ok {
			return badNumber(field, lit, ute.Type)
		}
		return BadRequest(field, "%s must be %s, got %s", field, jsonKind(ute.Type), ute.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return BadRequest("", "invalid JSON: unexpected end of the request body")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &Error{Status: http.StatusRequestTimeout, Type: TypeInvalidRequest,
			Message: "timed out reading the request body"}
	}
	return BadRequest("", "invalid request body: %v", err)
}

// badNumber is the error for the number lit that a field of type t cannot
// hold: for an integer field, lit has a fractional part (pydantic's words)
// or is beyond t's range; for a float field, lit is beyond float64.
func badNumber(field, lit string, t reflect.Type) *Error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var kind reflect.Kind
	if t != nil {
		kind = t.Kind()
	}
	switch kind {
	case reflect.Float32, reflect.Float64:
		return BadRequest(field, "%s must be a finite number, got %s (out of range)", field, lit)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if f, err := strconv.ParseFloat(lit, 64); err == nil && f != math.Trunc(f) {
			return BadRequest(field, "%s must be an integer, got %s (a number with a fractional part)", field, lit)
		}
		if strings.HasPrefix(lit, "-") {
			return BadRequest(field, "%s must be an integer, got %s (out of range: at least %v)", field, lit, intMin(t))
		}
		return BadRequest(field, "%s must be an integer, got %s (out of range: at most %v)", field, lit, intMax(t))
	}
	return BadRequest(field, "%s must be %s, got number %s", field, jsonKind(t), lit)
}

// jsonPath turns the Field of a json.UnmarshalTypeError into the JSON path
// the client wrote: encoding/json includes the Go names of embedded structs
// ("SamplingFields.max_tokens"), which are not part of the wire format.
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "SamplingFields" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}

// jsonKind names the JSON shape expected for a Go type, e.g. "an integer".
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value of another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
		return "an integer"
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return fmt.Sprintf("an integer in [%v, %v]", intMin(t), intMax(t))
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a value of another type"
}

func intMin(t reflect.Type) any {
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return 0
	}
	return int64(-1) << (t.Bits() - 1)
}

func intMax(t reflect.Type) any {
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return uint64(math.MaxUint64) >> (64 - t.Bits())
	}
	return int64(math.MaxInt64) >> (64 - t.Bits())
}

// readBody reads a whole request body (already bounded by the caller's
// http.MaxBytesReader) and refuses one that is JSON null. A body that is
// not valid UTF-8 is refused later, naming the field, once it is decoded.
func readBody(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, decodeBody(io.MultiReader(bytes.NewReader(data), errReader{err}), &struct{}{})
	}
	if string(bytes.TrimSpace(data)) == "null" {
		return nil, BadRequest("", "the request body must be a JSON object, got null")
	}
	return data, nil
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// checkUTF8 refuses text that is not valid UTF-8 (encoding/json would
// silently turn it into U+FFFD), naming the field: raw is the field's JSON,
// data the whole body.
func checkUTF8(data []byte, fields map[string]json.RawMessage) error {
	if utf8.Valid(data) {
		return nil
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !utf8.Valid(fields[name]) {
			return BadRequest(name, "%s is not valid UTF-8", name)
		}
	}
	i := 0
	for i < len(data) {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		i += n
	}
	return BadRequest("", "the request body is not valid UTF-8 (at byte %d)", i)
}

// parseCompletion decodes and validates a /v1/completions body.
func (p *parser) parseCompletion(r io.Reader) (*request, error) {
	data, err := readBody(r)
	if err != nil {
		return nil, err
	}
	var w CompletionRequest
	if err := decodeBody(bytes.NewReader(data), &w); err != nil {
		return nil, err
	}
	if err := checkUTF8(data, map[string]json.RawMessage{"prompt": w.Prompt, "stop": w.Stop}); err != nil {
		return nil, err
	}
	if err := checkStreamOptions(data, &w.SamplingFields); err != nil {
		return nil, err
	}
	return p.completion(&w)
}

// parseChat decodes and validates a /v1/chat/completions body.
func (p *parser) parseChat(r io.Reader) (*request, error) {
	data, err := readBody(r)
	if err != nil {
		return nil, err
	}
	var w ChatCompletionRequest
	if err := decodeBody(bytes.NewReader(data), &w); err != nil {
		return nil, err
	}
	fields := map[string]json.RawMessage{"stop": w.Stop}
	for i, m := range w.Messages {
		fields[fmt.Sprintf("messages[%d].content", i)] = m.Content
		if !utf8.Valid(data) && strings.ContainsRune(m.Role, utf8.RuneError) {
			return nil, BadRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role is not valid UTF-8", i)
		}
	}
	if err := checkUTF8(data, fields); err != nil {
		return nil, err
	}
	if err := checkStreamOptions(data, &w.SamplingFields); err != nil {
		return nil, err
	}
	return p.chatCompletion(&w)
}

// checkStreamOptions refuses stream_options in a request that does not
// stream, as vLLM does ("Stream options can only be defined when
// `stream=True`."); like vLLM's check it lets null and {} through. data is
// the whole body, read again only when stream_options is given without
// stream.
func checkStreamOptions(data []byte, w *SamplingFields) error {
	if w.StreamOptions == nil || w.Stream {
		return nil
	}
	var raw struct {
		StreamOptions map[string]json.RawMessage `json:"stream_options"`
	}
	if json.Unmarshal(data, &raw) == nil && len(raw.StreamOptions) == 0 {
		return nil
	}
	return BadRequest("stream_options", "stream_options is only allowed when stream is true")
}

// completion converts a decoded completion request.
func (p *parser) completion(w *CompletionRequest) (*request, error) {
	if err := p.checkModel(w.Model); err != nil {
		return nil, err
	}
	switch {
	case w.Echo:
		return nil, Unsupported("echo", "echo is not supported")
	case w.Logprobs != nil:
		return nil, Unsupported("logprobs", "logprobs is not supported yet")
	case w.BestOf != nil && *w.BestOf != 1:
		return nil, Unsupported("best_of", "best_of must be 1, got %d", *w.BestOf)
	case w.Suffix != "":
		return nil, Unsupported("suffix", "suffix is not supported")
	}
	req := &request{}
	if err := p.common(&w.SamplingFields, req); err != nil {
		return nil, err
	}
	ids, err := p.prompt(w.Prompt)
	if err != nil {
		return nil, err
	}
	req.promptIDs = ids
	if err := p.resolveMaxTokens(req, w.MaxTokens, DefaultCompletionMaxTokens, "max_tokens", "prompt"); err != nil {
		return nil, err
	}
	return req, nil
}

// chatCompletion converts a decoded chat completion request.
func (p *parser) chatCompletion(w *ChatCompletionRequest) (*request, error) {
	if err := p.checkModel(w.Model); err != nil {
		return nil, err
	}
	switch {
	case w.Logprobs != nil && *w.Logprobs:
		return nil, Unsupported("logprobs", "logprobs is not supported yet")
	case w.TopLogprobs != nil && *w.TopLogprobs != 0:
		return nil, Unsupported("top_logprobs", "top_logprobs is not supported yet")
	case !emptyJSON(w.Tools):
		return nil, Unsupported("tools", "tools (function calling) are not supported")
	case !emptyJSON(w.Functions):
		return nil, Unsupported("functions", "functions (function calling) are not supported")
	case !isNull(w.ToolChoice) && strings.TrimSpace(string(w.ToolChoice)) != `"none"`:
		return nil, Unsupported("tool_choice", "tool_choice is not supported (only \"none\")")
	case !isNull(w.ResponseFormat) && !textFormat(w.ResponseFormat):
		return nil, Unsupported("response_format", "response_format is not supported (only {\"type\": \"text\"})")
	}
	req := &request{chat: true}
	if err := p.common(&w.SamplingFields, req); err != nil {
		return nil, err
	}
	msgs, err := chatMessages(w.Messages)
	if err != nil {
		return nil, err
	}
	if p.tok == nil {
		return nil, BadRequest("messages", "this model has no tokenizer, so chat completions are not available; use /v1/completions with a prompt of token ids")
	}
	text, err := p.tok.ApplyChatTemplate(msgs, model.ChatOptions{})
	if err != nil {
		// Tokenizers may already say where the error came from.
		return nil, BadRequest("messages", "the chat template rejected the messages: %s",
			strings.TrimPrefix(err.Error(), "chat template: "))
	}
	ids, err := p.tok.Encode(text, false)
	if err != nil {
		return nil, BadRequest("messages", "cannot tokenize the messages: %v", err)
	}
	if len(ids) == 0 {
		return nil, BadRequest("messages", "the messages render to an empty prompt")
	}
	req.promptIDs = ids
	maxTok, param := w.MaxTokens, "max_tokens"
	if w.MaxCompletionTokens != nil {
		maxTok, param = w.MaxCompletionTokens, "max_completion_tokens"
	}
	if err := p.resolveMaxTokens(req, maxTok, 0, param, "messages"); err != nil {
		return nil, err
	}
	return req, nil
}

func (p *parser) checkModel(name string) error {
	if name != "" && name != p.modelName {
		return ModelNotFound(name)
	}
	return nil
}

// common converts the fields shared by both endpoints, except max_tokens.
func (p *parser) common(w *SamplingFields, req *request) error {
	switch {
	case w.N != nil && *w.N != 1:
		return Unsupported("n", "n must be 1, got %d", *w.N)
	case w.PresencePenalty != nil && *w.PresencePenalty != 0:
		return Unsupported("presence_penalty", "presence_penalty is not supported (only 0)")
	case w.FrequencyPenalty != nil && *w.FrequencyPenalty != 0:
		return Unsupported("frequency_penalty", "frequency_penalty is not supported (only 0)")
	case len(w.LogitBias) != 0:
		return Unsupported("logit_bias", "logit_bias is not supported")
	case w.RepetitionPenalty != nil && *w.RepetitionPenalty != 1:
		return Unsupported("repetition_penalty", "repetition_penalty is not supported (only 1)")
	case w.MinP != nil && *w.MinP != 0:
		return Unsupported("min_p", "min_p is not supported (only 0)")
	case w.MinTokens != nil && *w.MinTokens < 0:
		return BadRequest("min_tokens", "min_tokens must be at least 0, got %d", *w.MinTokens)
	}
	sp := model.SamplingParams{Temperature: 1, TopP: 1}
	if w.Temperature != nil {
		t, err := samplingFloat("temperature", *w.Temperature)
		if err != nil {
			return err
		}
		sp.Temperature = t // a positive t that rounds to 0 is greedy, as in vLLM (< 1e-5)
		if err := (model.SamplingParams{Temperature: sp.Temperature, TopP: 1}).Validate(); err != nil {
			return BadRequest("temperature", "%v", err)
		}
	}
	if w.TopP != nil {
		tp, err := samplingFloat("top_p", *w.TopP)
		if err != nil {
			return err
		}
		if tp == 0 && *w.TopP > 0 {
			return BadRequest("top_p", "top_p must be in (0, 1], got %v, which is 0 in float32 (the sampler's precision)", *w.TopP)
		}
		sp.TopP = tp
		if err := (model.SamplingParams{TopP: sp.TopP}).Validate(); err != nil {
			return BadRequest("top_p", "%v", err)
		}
	}
	if w.TopK != nil {
		switch k := *w.TopK; {
		case k < -1:
			return BadRequest("top_k", "top_k must be -1 or 0 (disabled) or at least 1, got %d", k)
		case k > 0:
			sp.TopK = int(k)
		}
	}
	// Each field was checked alone above to name it; this catches any rule
	// model.SamplingParams adds later.
	if err := sp.Validate(); err != nil {
		return BadRequest("", "%v", err)
	}
	if w.Seed != nil {
		sp.Seed = uint64(*w.Seed)
	} else {
		sp.Seed = p.newSeed()
	}
	req.sampling = sp

	stop, err := stopStrings(w.Stop)
	if err != nil {
		return err
	}
	if len(stop) > 0 && p.tok == nil {
		return BadRequest("stop", "this model has no tokenizer, so stop strings are not available; use stop_token_ids")
	}
	req.stop = stop
	if len(w.StopTokenIDs) > MaxStopTokenIDs {
		return BadRequest("stop_token_ids", "at most %d stop_token_ids are allowed, got %d", MaxStopTokenIDs, len(w.StopTokenIDs))
	}
	if len(w.StopTokenIDs) > 0 {
		req.stopTokenIDs = make([]int32, len(w.StopTokenIDs))
		for i, id := range w.StopTokenIDs {
			if id < 0 || id > math.MaxInt32 {
				return BadRequest("stop_token_ids", "stop_token_ids[%d] = %d is not a token id", i, id)
			}
			req.stopTokenIDs[i] = int32(id)
		}
	}
	req.ignoreEOS = w.IgnoreEOS
	if w.MinTokens != nil {
		req.minTokens = int(*w.MinTokens) // ≤ max_tokens: checked in resolveMaxTokens
	}
	req.includeStopStr = w.IncludeStopStrInOutput
	req.stream = w.Stream
	req.includeUsage = w.Stream && w.StreamOptions != nil && w.StreamOptions.IncludeUsage
	req.continuousUsage = req.includeUsage && w.StreamOptions.ContinuousUsageStats
	// Without a tokenizer the output has no text: the token ids are the
	// answer, so they are always returned.
	req.returnTokenIDs = w.ReturnTokenIDs || p.tok == nil
	return nil
}

// samplingFloat converts the float field name to the sampler's float32,
// refusing a finite value beyond float32's range, which would become ±Inf,
// with the value the client sent. (encoding/json refuses one beyond
// float64.)
func samplingFloat(name string, v float64) (float32, error) {
	f := float32(v)
	if math.IsInf(float64(f), 0) && !math.IsInf(v, 0) {
		return 0, BadRequest(name, "%s is out of range, got %v (beyond float32, the sampler's precision)", name, v)
	}
	return f, nil
}

// DefaultCompletionMaxTokens is max_tokens of a /v1/completions request that
// gives none: 16, the OpenAI API's documented default (vLLM uses it too).
// A chat request without one may use the rest of the context.
const DefaultCompletionMaxTokens = 16

// resolveMaxTokens sets req.maxTokens from the request's value (nil: def,
// capped at the rest of the context; def 0: the rest of the context),
// checks the context length and that min_tokens does not exceed it (as
// vLLM does). promptParam names the prompt in messages ("prompt" or
// "messages").
func (p *parser) resolveMaxTokens(req *request, maxTokens *Int, def int, param, promptParam string) error {
	if err := p.maxTokens(req, maxTokens, def, param, promptParam); err != nil {
		return err
	}
	switch {
	case req.minTokens <= req.maxTokens:
	case maxTokens == nil && def == 0:
		e := BadRequest("min_tokens", "min_tokens is %d, but this model's context length leaves %d tokens after the %d in the %s",
			req.minTokens, req.maxTokens, len(req.promptIDs), promptParam)
		e.Code = CodeContextLengthExceeded
		return e
	default:
		return BadRequest("min_tokens", "min_tokens must be at most %s (%d), got %d", param, req.maxTokens, req.minTokens)
	}
	return nil
}

// maxTokens is resolveMaxTokens without the min_tokens check.
func (p *parser) maxTokens(req *request, maxTokens *Int, def int, param, promptParam string) error {
	n := len(req.promptIDs)
	ctxLen := p.contextLen
	if p.contextNow != nil {
		if c := p.contextNow(); c > 0 && c < ctxLen {
			ctxLen = c
		}
	}
	if maxTokens == nil {
		if n >= ctxLen {
			e := BadRequest(promptParam, "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the %s.",
				ctxLen, n, promptParam)
			e.Code = CodeContextLengthExceeded
			return e
		}
		req.maxTokens = ctxLen - n
		if def > 0 && def < req.maxTokens {
			req.maxTokens = def
		}
		return nil
	}
	m := int(*maxTokens)
	if m < 1 {
		return BadRequest(param, "%s must be at least 1, got %d", param, m)
	}
	if n > ctxLen || m > ctxLen-n {
		e := BadRequest(param, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			ctxLen, uint64(n)+uint64(m), n, promptParam, m, promptParam)
		e.Code = CodeContextLengthExceeded
		if n >= ctxLen {
			e.Param = promptParam
		}
		return e
	}
	req.maxTokens = m
	return nil
}

// emptyJSON reports an absent, null or empty-array value.
func emptyJSON(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return t == "" || t == "null" || strings.ReplaceAll(t, " ", "") == "[]"
}

// textFormat reports response_format {"type":"text"}.
func textFormat(raw json.RawMessage) bool {
	var f struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &f) == nil && f.Type == "text"
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// firstByte returns the first non-space byte of raw (0 if none).
func firstByte(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

const promptShapes = "a string, an array of one string, an array of token ids, or an array of one array of token ids"

// prompt converts the "prompt" field into token ids, tokenizing text.
func (p *parser) prompt(raw json.RawMessage) ([]int32, error) {
	if isNull(raw) {
		return nil, BadRequest("prompt", "prompt is required")
	}
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, BadRequest("prompt", "prompt must be %s", promptShapes)
		}
		return p.encodePrompt(s)
	case '[':
	default:
		return nil, BadRequest("prompt", "prompt must be %s", promptShapes)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, BadRequest("prompt", "prompt must be %s", promptShapes)
	}
	if len(elems) == 0 {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	switch firstByte(elems[0]) {
	case '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, BadRequest("prompt", "prompt must be %s", promptShapes)
		}
		if len(ss) > 1 {
			return nil, BadRequest("prompt", "only one prompt per request is supported, got %d", len(ss))
		}
		return p.encodePrompt(ss[0])
	case '[':
		if len(elems) > 1 {
			return nil, BadRequest("prompt", "only one prompt per request is supported, got %d", len(elems))
		}
		return tokenIDs(elems[0], p.vocabSize)
	default:
		return tokenIDs(raw, p.vocabSize)
	}
}

func (p *parser) encodePrompt(s string) ([]int32, error) {
	if s == "" {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	if p.tok == nil {
		return nil, BadRequest("prompt", "this model has no tokenizer; send the prompt as an array of token ids")
	}
	ids, err := p.tok.Encode(s, true)
	if err != nil {
		return nil, BadRequest("prompt", "cannot tokenize the prompt: %v", err)
	}
	if len(ids) == 0 {
		return nil, BadRequest("prompt", "the prompt tokenizes to no tokens")
	}
	return ids, nil
}

// tokenIDs converts a JSON array of token ids, each below vocab if it is
// positive. Ids may be whole numbers written as floats (Int).
func tokenIDs(raw json.RawMessage, vocab int) ([]int32, error) {
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		// Plain integers decode faster; try Int only if they fail.
		var lax []Int
		if json.Unmarshal(raw, &lax) != nil {
			return nil, BadRequest("prompt", "prompt must be %s", promptShapes)
		}
		ids = make([]int64, len(lax))
		for i, id := range lax {
			ids[i] = int64(id)
		}
	}
	if len(ids) == 0 {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, BadRequest("prompt", "prompt token id %d (at %d) is not a token id", id, i)
		}
		if vocab > 0 && id >= int64(vocab) {
			return nil, BadRequest("prompt", "prompt token id %d (at %d) is outside the vocabulary (ids 0 to %d)", id, i, vocab-1)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// stopStrings converts the "stop" field: null, a string or an array of
// strings. Empty strings are dropped (they would match at once).
func stopStrings(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var list []string
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, BadRequest("stop", "stop must be a string or an array of strings")
		}
		list = []string{s}
	case '[':
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, BadRequest("stop", "stop must be a string or an array of strings")
		}
	default:
		return nil, BadRequest("stop", "stop must be a string or an array of strings")
	}
	if len(list) > MaxStopStrings {
		return nil, BadRequest("stop", "at most %d stop strings are allowed, got %d", MaxStopStrings, len(list))
	}
	out := list[:0]
	for _, s := range list {
		if len(s) > MaxStopStringBytes {
			return nil, BadRequest("stop", "a stop string may be at most %d bytes long, got %d", MaxStopStringBytes, len(s))
		}
		if s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// chatMessages converts the "messages" field.
func chatMessages(ws []ChatMessage) ([]model.Message, error) {
	if len(ws) == 0 {
		return nil, BadRequest("messages", "messages must not be empty")
	}
	msgs := make([]model.Message, len(ws))
	for i, m := range ws {
		if m.Role == "" {
			return nil, BadRequest("messages", "messages[%d].role is required", i)
		}
		// Only an assistant message may go without content (OpenAI's rule:
		// one that made tool calls); every other role must say something.
		if m.Role != "assistant" && isNull(m.Content) {
			return nil, BadRequest("messages", "messages[%d].content is required for role %s", i, m.Role)
		}
		content, err := messageContent(i, m.Content)
		if err != nil {
			return nil, err
		}
		msgs[i] = model.Message{Role: m.Role, Content: content}
	}
	return msgs, nil
}

// messageContent converts a message's content: null, a string, or an array
// of text parts joined with "\n".
func messageContent(i int, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", BadRequest("messages", "messages[%d].content must be a string or an array of text parts", i)
		}
		return s, nil
	case '[':
	default:
		return "", BadRequest("messages", "messages[%d].content must be a string or an array of text parts", i)
	}
	var parts []ContentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", BadRequest("messages", "messages[%d].content must be a string or an array of text parts", i)
	}
	texts := make([]string, 0, len(parts))
	for j, part := range parts {
		if part.Type != "text" {
			return "", Unsupported("messages", "messages[%d].content[%d]: content type %q is not supported (only \"text\")", i, j, part.Type)
		}
		texts = append(texts, part.Text)
	}
	return strings.Join(texts, "\n"), nil
}

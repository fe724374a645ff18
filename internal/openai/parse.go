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
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/grammar"
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
	// maxTokensDefault: the client gave no max_tokens (maxTokens is the
	// default).
	maxTokensDefault bool

	// n is the number of choices returned; bestOf (≥ n) the number the
	// engine generates, of which the n with the highest cumulative logprob
	// are returned (completions' best_of).
	n, bestOf int
	// logprobs: each output token's logprob is returned (completions'
	// logprobs ≥ 0, chat's logprobs true), with sampling.TopLogprobs
	// alternatives.
	logprobs bool
	// echo: each choice's text starts with echoText (completions: the
	// prompt; chat: the last message, an assistant's), and with logprobs
	// (completions) its tokens start with the prompt's, scored.
	echo     bool
	echoText string
	// scorePrompt asks the engine for prompt logprobs (echo with logprobs,
	// or promptLogprobs) with promptTop alternatives; promptLogprobs is
	// vLLM's prompt_logprobs, returned in its own field.
	scorePrompt       bool
	promptTop         int
	promptLogprobs    bool
	promptLogprobsTop int
	// tokensAsIDs writes logprob tokens as "token_id:N" (vLLM's
	// return_tokens_as_token_ids).
	tokensAsIDs bool
	priority    int
	timeout     time.Duration
	// constraint is the output's structured-output constraint (zero: none).
	constraint grammar.Spec
	// tools are a chat request's tools (nil: none); reasoningParser splits
	// reasoning off chat answers (thinkOpen: the prompt opened the block;
	// hideReasoning: include_reasoning false). See tools.go, reasoning.go.
	tools           *toolRequest
	keepSpecial     []int32 // special tokens the tool parser reads: rendered
	reasoningParser string
	thinkOpen       bool
	hideReasoning   bool
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
	// maxLogprobs bounds logprobs, top_logprobs and prompt_logprobs.
	maxLogprobs int
	// logprobsMode is the distribution logprobs are of.
	logprobsMode model.LogprobsMode
	// trustTemplate accepts a request's chat_template.
	trustTemplate bool
	// compiled remembers which constraints compile (nil: compile each).
	compiled *compileCache
	// toolParser parses tool_choice auto's calls ("auto": from the chat
	// template); reasoningParser splits reasoning off ("": none).
	toolParser, reasoningParser string
	// anyOrder compiles JSON constraints with AnyPropertyOrder.
	anyOrder bool
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
	fields := map[string]json.RawMessage{"prompt": w.Prompt, "stop": w.Stop}
	constraintFields(&w.SamplingFields, fields)
	if err := checkUTF8(data, fields); err != nil {
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
	constraintFields(&w.SamplingFields, fields)
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
	case w.Suffix != "":
		return nil, Unsupported("suffix", "suffix is not supported")
	case !isNull(w.PromptEmbeds):
		return nil, Unsupported("prompt_embeds", "prompt_embeds is not supported: send the prompt as text or token ids")
	}
	req := &request{}
	if err := p.common(&w.SamplingFields, req); err != nil {
		return nil, err
	}
	if w.Logprobs != nil {
		if n := *w.Logprobs; n < 0 || n > Int(p.maxLogprobs) {
			return nil, BadRequest("logprobs", "logprobs must be in [0, %d], got %d", p.maxLogprobs, n)
		}
		req.logprobs, req.sampling.TopLogprobs = true, int(*w.Logprobs)
	}
	req.bestOf = req.n
	if w.BestOf != nil {
		switch b := *w.BestOf; {
		case b < Int(req.n) || b > MaxChoices:
			return nil, BadRequest("best_of", "best_of must be in [n = %d, %d], got %d", req.n, MaxChoices, b)
		case b > 1 && req.stream:
			return nil, BadRequest("best_of", "best_of is not allowed with stream (the best choices are known only at the end)")
		default:
			req.bestOf = int(b)
		}
	}
	addSpecial := w.AddSpecialTokens == nil || *w.AddSpecialTokens
	ids, text, err := p.prompt(w.Prompt, addSpecial)
	if err != nil {
		return nil, err
	}
	ids, truncated, err := p.truncate(ids, w.TruncatePromptTokens)
	if err != nil {
		return nil, err
	}
	req.promptIDs = ids
	req.echo = w.Echo
	if w.Echo {
		if text == "" || truncated {
			text = p.decode(ids)
		}
		req.echoText = text
		if req.logprobs {
			req.scorePrompt, req.promptTop = true, max(req.promptTop, req.sampling.TopLogprobs)
		}
	}
	if err := p.resolveMaxTokens(req, w.MaxTokens, DefaultCompletionMaxTokens, "max_tokens", "prompt", w.Echo); err != nil {
		return nil, err
	}
	if req.maxTokens == 0 && req.bestOf > 1 {
		return nil, BadRequest("n", "max_tokens 0 (the prompt alone) gives one answer: n and best_of must be 1, got %d and %d", req.n, req.bestOf)
	}
	if err := checkLogprobVolume(req, "logprobs", "max_tokens"); err != nil {
		return nil, err
	}
	return req, nil
}

// MaxLogprobEntries bounds the logprobs one answer may carry: choices ×
// output tokens × (alternatives + 1), about 100 MB of JSON. A request that
// could exceed it is refused before it runs rather than building an answer
// no client wants to read.
const MaxLogprobEntries = 1 << 22

// checkLogprobVolume refuses a request whose logprobs could exceed
// MaxLogprobEntries, naming param and the max_tokens field maxParam.
func checkLogprobVolume(req *request, param, maxParam string) error {
	if !req.logprobs {
		return nil
	}
	if v := int64(req.bestOf) * int64(req.maxTokens) * int64(req.sampling.TopLogprobs+1); v > MaxLogprobEntries {
		return BadRequest(param, "%s would return up to %d entries (%d choices × %d tokens × %d alternatives and the token), more than %d: lower %s, n or the alternatives",
			param, v, req.bestOf, req.maxTokens, req.sampling.TopLogprobs, MaxLogprobEntries, maxParam)
	}
	return nil
}

// chatCompletion converts a decoded chat completion request.
func (p *parser) chatCompletion(w *ChatCompletionRequest) (*request, error) {
	if err := p.checkModel(w.Model); err != nil {
		return nil, err
	}
	switch {
	case !emptyJSON(w.Functions):
		return nil, Unsupported("functions", "functions (deprecated function calling) are not supported; use tools")
	case !isNull(w.FunctionCall) && strings.TrimSpace(string(w.FunctionCall)) != `"none"`:
		return nil, Unsupported("function_call", "function_call is not supported (only \"none\")")
	case w.BestOf != nil && *w.BestOf != 1:
		return nil, Unsupported("best_of", "best_of is not supported on chat completions (only 1); use /v1/completions")
	case !isNull(w.Audio):
		return nil, Unsupported("audio", "audio output is not supported")
	case !isNull(w.Modalities) && strings.ReplaceAll(string(w.Modalities), " ", "") != `["text"]`:
		return nil, Unsupported("modalities", "only the text modality is supported (modalities [\"text\"])")
	case !isNull(w.Prediction):
		return nil, Unsupported("prediction", "predicted outputs are not supported")
	case !isNull(w.WebSearchOptions):
		return nil, Unsupported("web_search_options", "web search is not supported")
	case !isNull(w.Verbosity):
		return nil, Unsupported("verbosity", "verbosity is not supported")
	case !isNull(w.ReasoningEffort):
		return nil, Unsupported("reasoning_effort", "reasoning_effort is not supported; a model's thinking can be switched with chat_template_kwargs (e.g. enable_thinking) where its template reads it")
	case w.IncludeReasoning != nil && !*w.IncludeReasoning && !reasoningOn(p.reasoningParser):
		return nil, Unsupported("include_reasoning", "include_reasoning false needs a server started with --reasoning-parser, which separates reasoning from content")
	case !emptyJSON(w.Documents):
		return nil, Unsupported("documents", "documents are not supported")
	case !isNull(w.MMProcessorKwargs):
		return nil, Unsupported("mm_processor_kwargs", "multimodal inputs are not supported")
	case w.ContinueFinalMessage && w.AddGenerationPrompt != nil && *w.AddGenerationPrompt:
		return nil, BadRequest("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true")
	}
	req := &request{chat: true}
	if err := p.common(&w.SamplingFields, req); err != nil {
		return nil, err
	}
	req.bestOf = req.n
	if w.Logprobs != nil && *w.Logprobs {
		req.logprobs = true
	}
	if w.TopLogprobs != nil {
		switch n := *w.TopLogprobs; {
		case n < 0 || n > Int(p.maxLogprobs):
			return nil, BadRequest("top_logprobs", "top_logprobs must be in [0, %d], got %d", p.maxLogprobs, n)
		case n > 0 && !req.logprobs:
			return nil, BadRequest("top_logprobs", "top_logprobs needs logprobs: true")
		default:
			req.sampling.TopLogprobs = int(n)
		}
	}
	msgs, err := chatMessages(w.Messages)
	if err != nil {
		return nil, err
	}
	if p.tok == nil {
		return nil, BadRequest("messages", "this model has no tokenizer, so chat completions are not available; use /v1/completions with a prompt of token ids")
	}
	opts := model.ChatOptions{
		NoGenerationPrompt:   w.AddGenerationPrompt != nil && !*w.AddGenerationPrompt,
		ContinueFinalMessage: w.ContinueFinalMessage,
		Kwargs:               w.ChatTemplateKwargs,
	}
	if err := p.chatTools(w, req, &opts, msgs); err != nil {
		return nil, err
	}
	if w.ChatTemplate != nil {
		if !p.trustTemplate {
			return nil, Unsupported("chat_template", "a request's chat_template is refused: a template is a program the server runs, accepted only when the server is started with --trust-request-chat-template (vLLM's flag)")
		}
		if *w.ChatTemplate == "" {
			return nil, BadRequest("chat_template", "chat_template must not be empty (leave it out for the model's)")
		}
		opts.Template = *w.ChatTemplate
	}
	text, err := p.tok.ApplyChatTemplate(msgs, opts)
	if err != nil {
		// Tokenizers may already say where the error came from.
		param := "messages"
		switch {
		case opts.Template != "" && strings.Contains(err.Error(), "template"):
			param = "chat_template"
		case len(opts.Kwargs) > 0 && strings.Contains(err.Error(), "chat_template_kwargs"):
			param = "chat_template_kwargs"
		case opts.ContinueFinalMessage && strings.Contains(err.Error(), "continue_final_message"):
			param = "continue_final_message"
		}
		return nil, BadRequest(param, "the chat template rejected the messages: %s",
			strings.TrimPrefix(err.Error(), "chat template: "))
	}
	ids, err := p.tok.Encode(text, w.AddSpecialTokens != nil && *w.AddSpecialTokens)
	if err != nil {
		return nil, BadRequest("messages", "cannot tokenize the messages: %v", err)
	}
	if len(ids) == 0 {
		return nil, BadRequest("messages", "the messages render to an empty prompt")
	}
	if ids, _, err = p.truncate(ids, w.TruncatePromptTokens); err != nil {
		return nil, err
	}
	req.promptIDs = ids
	req.thinkOpen = promptOpensThink(text)
	if w.Echo && msgs[len(msgs)-1].Role == "assistant" {
		req.echo, req.echoText = true, msgs[len(msgs)-1].Content
	}
	maxTok, param := w.MaxTokens, "max_tokens"
	if w.MaxCompletionTokens != nil {
		maxTok, param = w.MaxCompletionTokens, "max_completion_tokens"
	}
	if err := p.resolveMaxTokens(req, maxTok, 0, param, "messages", false); err != nil {
		return nil, err
	}
	lpParam := "logprobs"
	if req.sampling.TopLogprobs > 0 {
		lpParam = "top_logprobs"
	}
	if err := checkLogprobVolume(req, lpParam, param); err != nil {
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

// Limits of the sampling fields.
const (
	// MaxChoices bounds n and best_of (OpenAI's limit, 128).
	MaxChoices = model.MaxForks
	// DefaultMaxLogprobs is the default of --max-logprobs, the most
	// logprobs, top_logprobs and prompt_logprobs may ask for (vLLM's
	// default, 20; OpenAI's chat allows 20 too).
	DefaultMaxLogprobs = 20
	// MaxLogitBias is the most logit_bias entries a request may carry.
	MaxLogitBias = 1024
	// MaxBadWords is the most bad_words a request may carry; each is at
	// most MaxStopStringBytes long.
	MaxBadWords = 128
	// MaxTimeout is the largest timeout accepted, in seconds (a day; the
	// workers' --max-request-time caps it further).
	MaxTimeout = 86400
)

// common converts the fields shared by both endpoints, except max_tokens
// and the prompt.
func (p *parser) common(w *SamplingFields, req *request) error {
	if err := refuseUnimplemented(w); err != nil {
		return err
	}
	req.n = 1
	if w.N != nil {
		if *w.N < 1 || *w.N > MaxChoices {
			return BadRequest("n", "n must be in [1, %d], got %d", MaxChoices, *w.N)
		}
		req.n = int(*w.N)
	}
	if w.MinTokens != nil && *w.MinTokens < 0 {
		return BadRequest("min_tokens", "min_tokens must be at least 0, got %d", *w.MinTokens)
	}
	sp := model.SamplingParams{Temperature: 1, TopP: 1, LogprobsMode: p.logprobsMode}
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
			sp.TopK = int(min(k, math.MaxInt32))
		}
	}
	if err := p.processors(w, &sp); err != nil {
		return err
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
	req.tokensAsIDs = w.ReturnTokensAsTokenIDs
	if w.PromptLogprobs != nil {
		switch n := *w.PromptLogprobs; {
		case n < 0 || n > Int(p.maxLogprobs):
			return BadRequest("prompt_logprobs", "prompt_logprobs must be in [0, %d], got %d", p.maxLogprobs, n)
		case w.Stream:
			return BadRequest("prompt_logprobs", "prompt_logprobs is not available with stream")
		default:
			req.promptLogprobs, req.promptLogprobsTop = true, int(n)
			req.scorePrompt, req.promptTop = true, int(n)
		}
	}
	if w.Priority != nil {
		if *w.Priority < math.MinInt32 || *w.Priority > math.MaxInt32 {
			return BadRequest("priority", "priority must be in [%d, %d], got %d", math.MinInt32, math.MaxInt32, *w.Priority)
		}
		req.priority = int(*w.Priority)
	}
	if w.Timeout != nil {
		t := *w.Timeout
		if !(t > 0 && t <= MaxTimeout) {
			return BadRequest("timeout", "timeout must be a number of seconds in (0, %d], got %v", MaxTimeout, t)
		}
		req.timeout = max(time.Millisecond, time.Duration(t*float64(time.Second)))
	}
	c, err := p.constraint(w)
	if err != nil {
		return err
	}
	req.constraint = c
	return nil
}

// refuseUnimplemented refuses the fields of w whose values would change
// the answer in a way pdserve does not implement.
func refuseUnimplemented(w *SamplingFields) error {
	switch {
	case !isNull(w.StructuralTag):
		return Unsupported("structural_tag", "structural_tag is not supported")
	case !isNull(w.LogitsProcessors):
		return Unsupported("logits_processors", "logits_processors is not supported (custom processors cannot be loaded)")
	case !isNull(w.KVTransferParams):
		return Unsupported("kv_transfer_params", "kv_transfer_params is not supported: the router moves the KV cache between prefill and decode itself")
	case !isNull(w.VLLMXargs) && strings.ReplaceAll(string(w.VLLMXargs), " ", "") != "{}":
		return Unsupported("vllm_xargs", "vllm_xargs is not supported")
	case w.UseBeamSearch:
		return Unsupported("use_beam_search", "beam search is not supported")
	case w.LengthPenalty != nil && *w.LengthPenalty != 1:
		return Unsupported("length_penalty", "length_penalty is not supported (only 1; it applies to beam search)")
	case w.SkipSpecialTokens != nil && !*w.SkipSpecialTokens:
		return Unsupported("skip_special_tokens", "skip_special_tokens false is not supported: special tokens are never rendered")
	}
	return nil
}

// processors converts the logit processors' fields into sp.
func (p *parser) processors(w *SamplingFields, sp *model.SamplingParams) error {
	for _, f := range []struct {
		name string
		v    *float64
		dst  *float32
		ok   func(float32) bool
		rng  string
	}{
		{"presence_penalty", w.PresencePenalty, &sp.PresencePenalty, func(x float32) bool { return x >= -2 && x <= 2 }, "in [-2, 2]"},
		{"frequency_penalty", w.FrequencyPenalty, &sp.FrequencyPenalty, func(x float32) bool { return x >= -2 && x <= 2 }, "in [-2, 2]"},
		{"repetition_penalty", w.RepetitionPenalty, &sp.RepetitionPenalty, func(x float32) bool { return x > 0 }, "a positive number"},
		{"min_p", w.MinP, &sp.MinP, func(x float32) bool { return x >= 0 && x <= 1 }, "in [0, 1]"},
	} {
		if f.v == nil {
			continue
		}
		x, err := samplingFloat(f.name, *f.v)
		if err != nil {
			return err
		}
		if !f.ok(x) {
			return BadRequest(f.name, "%s must be %s, got %v", f.name, f.rng, *f.v)
		}
		*f.dst = x
	}
	if sp.RepetitionPenalty == 1 {
		sp.RepetitionPenalty = 0 // off: the sampler's zero value
	}
	if len(w.LogitBias) > MaxLogitBias {
		return BadRequest("logit_bias", "at most %d logit_bias entries are allowed, got %d", MaxLogitBias, len(w.LogitBias))
	}
	for key, b := range w.LogitBias {
		if b == nil {
			return BadRequest("logit_bias", "logit_bias of %q must be a number, got null", key)
		}
		bias := *b
		id, err := strconv.ParseInt(strings.TrimSpace(key), 10, 32)
		if err != nil || id < 0 {
			return BadRequest("logit_bias", "logit_bias keys must be token ids, got %q", key)
		}
		if err := p.checkID("logit_bias", int64(id)); err != nil {
			return err
		}
		if !(bias >= -100 && bias <= 100) {
			return BadRequest("logit_bias", "logit_bias of token %d must be in [-100, 100], got %v", id, bias)
		}
		sp.LogitBias = append(sp.LogitBias, model.LogitBias{ID: int32(id), Bias: float32(bias)})
	}
	slices.SortFunc(sp.LogitBias, func(a, b model.LogitBias) int { return int(a.ID) - int(b.ID) })
	for i := 1; i < len(sp.LogitBias); i++ {
		if sp.LogitBias[i].ID == sp.LogitBias[i-1].ID {
			return BadRequest("logit_bias", "logit_bias names token %d twice", sp.LogitBias[i].ID)
		}
	}
	if w.AllowedTokenIDs != nil {
		if len(w.AllowedTokenIDs) == 0 {
			return BadRequest("allowed_token_ids", "allowed_token_ids must not be empty (leave it out to allow every token)")
		}
		sp.AllowedTokenIDs = make([]int32, len(w.AllowedTokenIDs))
		for i, id := range w.AllowedTokenIDs {
			if err := p.checkID("allowed_token_ids", int64(id)); err != nil {
				return err
			}
			sp.AllowedTokenIDs[i] = int32(id)
		}
	}
	bad, err := p.badWords(w.BadWords)
	if err != nil {
		return err
	}
	sp.BadWords = bad
	return nil
}

// checkID refuses id for field if it is not a token id of the vocabulary.
func (p *parser) checkID(field string, id int64) error {
	switch {
	case id < 0 || id > math.MaxInt32:
		return BadRequest(field, "%s: %d is not a token id", field, id)
	case p.vocabSize > 0 && id >= int64(p.vocabSize):
		return BadRequest(field, "%s: token id %d is outside the vocabulary (ids 0 to %d)", field, id, p.vocabSize-1)
	}
	return nil
}

// badWords tokenizes vLLM's bad_words as vLLM does: each word (leading
// white space removed) alone and after a space, the second only when it
// tokenizes to as many tokens with a different first one.
func (p *parser) badWords(words []*string) ([][]int32, error) {
	if len(words) == 0 {
		return nil, nil
	}
	if p.tok == nil {
		return nil, BadRequest("bad_words", "this model has no tokenizer, so bad_words are not available; use logit_bias")
	}
	if len(words) > MaxBadWords {
		return nil, BadRequest("bad_words", "at most %d bad_words are allowed, got %d", MaxBadWords, len(words))
	}
	var out [][]int32
	for i, w := range words {
		if w == nil {
			return nil, BadRequest("bad_words", "bad_words[%d] must be a string, got null", i)
		}
		word := *w
		if len(word) > MaxStopStringBytes {
			return nil, BadRequest("bad_words", "a bad word may be at most %d bytes long, got %d", MaxStopStringBytes, len(word))
		}
		word = strings.TrimLeftFunc(word, unicode.IsSpace)
		if word == "" {
			return nil, BadRequest("bad_words", "bad_words[%d] is empty", i)
		}
		plain, err := p.tok.Encode(word, false)
		if err != nil || len(plain) == 0 {
			return nil, BadRequest("bad_words", "cannot tokenize bad_words[%d]: %v", i, err)
		}
		out = append(out, plain)
		if spaced, err := p.tok.Encode(" "+word, false); err == nil && len(spaced) == len(plain) && spaced[0] != plain[0] {
			out = append(out, spaced)
		}
	}
	return out, nil
}

// truncate keeps the last k tokens of ids (vLLM's truncate_prompt_tokens;
// −1: as many as the context holds), reporting whether it cut any.
func (p *parser) truncate(ids []int32, k *Int) ([]int32, bool, error) {
	if k == nil {
		return ids, false, nil
	}
	n := int64(*k)
	switch {
	case n == -1:
		n = int64(p.contextLen)
	case n < 1:
		return nil, false, BadRequest("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or at least 1, got %d", n)
	case n > int64(p.contextLen):
		return nil, false, BadRequest("truncate_prompt_tokens", "truncate_prompt_tokens is %d, more than this model's context length (%d)", n, p.contextLen)
	}
	if int64(len(ids)) <= n {
		return ids, false, nil
	}
	return ids[int64(len(ids))-n:], true, nil
}

// decode renders ids as text (echo of a token-id or truncated prompt),
// without special tokens; "" without a tokenizer.
func (p *parser) decode(ids []int32) string {
	if p.tok == nil {
		return ""
	}
	d := p.tok.NewDecoder()
	st, _ := p.tok.(model.SpecialTokens)
	var b strings.Builder
	for _, id := range ids {
		if st == nil || !st.IsSpecial(id) {
			b.WriteString(d.Add(id))
		}
	}
	b.WriteString(d.Flush())
	return b.String()
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
// "messages"). allowZero accepts max_tokens 0 (completions' echo: the
// prompt alone).
func (p *parser) resolveMaxTokens(req *request, maxTokens *Int, def int, param, promptParam string, allowZero bool) error {
	if err := p.maxTokens(req, maxTokens, def, param, promptParam, allowZero); err != nil {
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
func (p *parser) maxTokens(req *request, maxTokens *Int, def int, param, promptParam string, allowZero bool) error {
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
		req.maxTokens, req.maxTokensDefault = ctxLen-n, true
		if def > 0 && def < req.maxTokens {
			req.maxTokens = def
		}
		return nil
	}
	m := int(*maxTokens)
	switch {
	case m == 0 && allowZero:
	case m == 0 && !req.chat:
		return BadRequest(param, "%s must be at least 1, got 0 (0, the prompt alone, only with echo)", param)
	case m < 1:
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

// prompt converts the "prompt" field into token ids, tokenizing text
// (with the tokenizer's BOS if addSpecial), and returns the text of a text
// prompt ("" for token ids).
func (p *parser) prompt(raw json.RawMessage, addSpecial bool) ([]int32, string, error) {
	if isNull(raw) {
		return nil, "", BadRequest("prompt", "prompt is required")
	}
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, "", BadRequest("prompt", "prompt must be %s", promptShapes)
		}
		ids, err := p.encodePrompt(s, addSpecial)
		return ids, s, err
	case '[':
	default:
		return nil, "", BadRequest("prompt", "prompt must be %s", promptShapes)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, "", BadRequest("prompt", "prompt must be %s", promptShapes)
	}
	if len(elems) == 0 {
		return nil, "", BadRequest("prompt", "prompt must not be empty")
	}
	switch firstByte(elems[0]) {
	case '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, "", BadRequest("prompt", "prompt must be %s", promptShapes)
		}
		if len(ss) > 1 {
			return nil, "", BadRequest("prompt", "only one prompt per request is supported, got %d", len(ss))
		}
		ids, err := p.encodePrompt(ss[0], addSpecial)
		return ids, ss[0], err
	case '[':
		if len(elems) > 1 {
			return nil, "", BadRequest("prompt", "only one prompt per request is supported, got %d", len(elems))
		}
		ids, err := tokenIDs(elems[0], p.vocabSize)
		return ids, "", err
	default:
		ids, err := tokenIDs(raw, p.vocabSize)
		return ids, "", err
	}
}

func (p *parser) encodePrompt(s string, addSpecial bool) ([]int32, error) {
	if s == "" {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	if p.tok == nil {
		return nil, BadRequest("prompt", "this model has no tokenizer; send the prompt as an array of token ids")
	}
	ids, err := p.tok.Encode(s, addSpecial)
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
		var ptrs []*string
		if err := json.Unmarshal(raw, &ptrs); err != nil {
			return nil, BadRequest("stop", "stop must be a string or an array of strings")
		}
		for i, s := range ptrs {
			if s == nil {
				return nil, BadRequest("stop", "stop[%d] must be a string, got null", i)
			}
			list = append(list, *s)
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
		calls, err := messageToolCalls(i, m)
		if err != nil {
			return nil, err
		}
		if m.Role == "tool" && m.ToolCallID == "" {
			return nil, BadRequest("messages", "messages[%d].tool_call_id is required for role tool", i)
		}
		msgs[i] = model.Message{Role: m.Role, Content: content, ToolCalls: calls, ToolCallID: m.ToolCallID, Name: m.Name}
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

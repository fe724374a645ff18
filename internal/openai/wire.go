package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
)

// This file holds the OpenAI wire types: plain structs with json tags.
// Request fields whose absence matters are pointers; fields that take several
// JSON shapes (prompt, stop, message content) are json.RawMessage and are
// interpreted by the converters in parse.go. Integer fields are Int, which
// also takes a whole number written as a float.

// Int is an integer request field (64 bits). Besides a JSON integer it
// takes a number with no fractional part written as a float (3.0, 1e3), as
// Python clients send and vLLM's pydantic models accept (pydantic's lax
// mode). A number with a fractional part, one beyond int64 and any other
// JSON value are refused with a *json.UnmarshalTypeError whose Value is
// "number <literal>" or the JSON kind, which the parser turns into a 400
// naming the field; null leaves the value unchanged.
type Int int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Int) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if kind := jsonValueKind(s); kind != "number" {
		return &json.UnmarshalTypeError{Value: kind, Type: reflect.TypeFor[Int]()}
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		*n = Int(v)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	// -2^63 is exact in float64; 2^63 is the first float64 above int64.
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= -math.MinInt64 {
		return &json.UnmarshalTypeError{Value: "number " + s, Type: reflect.TypeFor[Int]()}
	}
	*n = Int(f)
	return nil
}

// jsonValueKind names the kind of a JSON value by its first byte, as
// json.UnmarshalTypeError's Value does ("string", "number", ...).
func jsonValueKind(s string) string {
	if s == "" {
		return "empty value"
	}
	switch c := s[0]; {
	case c == '"':
		return "string"
	case c == 't' || c == 'f':
		return "bool"
	case c == '[':
		return "array"
	case c == '{':
		return "object"
	case c == 'n':
		return "null"
	case c == '-' || '0' <= c && c <= '9':
		return "number"
	}
	return "value"
}

// SamplingFields are the request fields shared by completions and chat
// completions (OpenAI fields plus the vLLM extensions pdserve implements).
type SamplingFields struct {
	// Model is the model name; "" (absent) means the served model.
	Model string `json:"model"`
	// MaxTokens is the maximum number of output tokens; absent means all
	// of the context left after the prompt.
	MaxTokens *Int `json:"max_tokens"`
	// Temperature in [0, 100]; absent means 1. 0 is greedy.
	Temperature *float64 `json:"temperature"`
	// TopP in (0, 1]; absent means 1.
	TopP *float64 `json:"top_p"`
	// TopK (vLLM extension): -1 or 0 disables it.
	TopK *Int `json:"top_k"`
	// Seed keys the sampler; absent means a random seed per request.
	Seed *Int `json:"seed"`
	// Stop is a string or an array of up to MaxStopStrings strings.
	Stop json.RawMessage `json:"stop"`
	// StopTokenIDs (vLLM extension) end generation like EOS does.
	StopTokenIDs []Int `json:"stop_token_ids"`
	// IgnoreEOS (vLLM extension) keeps generating past EOS.
	IgnoreEOS bool `json:"ignore_eos"`
	// IncludeStopStrInOutput (vLLM extension) keeps a matched stop string
	// at the end of the output text.
	IncludeStopStrInOutput bool `json:"include_stop_str_in_output"`
	// N is the number of choices, 1…MaxChoices (default 1): the prompt is
	// computed once and N sequences are generated from it.
	N *Int `json:"n"`
	// Stream asks for Server-Sent Events.
	Stream bool `json:"stream"`
	// StreamOptions applies when Stream is set.
	StreamOptions *StreamOptions `json:"stream_options"`
	// ReturnTokenIDs (vLLM extension) adds prompt_token_ids and token_ids
	// to responses and stream chunks; always on for a model without a
	// tokenizer, whose responses have no text.
	ReturnTokenIDs bool `json:"return_token_ids"`
	// PresencePenalty and FrequencyPenalty, in [−2, 2] (OpenAI's
	// definitions over the output tokens so far).
	PresencePenalty  *float64 `json:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
	// LogitBias maps token ids (as strings) to a bias in [−100, 100] added
	// to their logits.
	LogitBias map[string]*float64 `json:"logit_bias"`
	// RepetitionPenalty (vLLM and SGLang, > 0, 1 is off): the CTRL
	// penalty over prompt and output tokens. MinP in [0, 1].
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	MinP              *float64 `json:"min_p"`
	// MinTokens (vLLM extension, 0 ≤ min_tokens ≤ max_tokens): EOS and
	// stop_token_ids are not drawn, and stop strings not matched, before
	// that many output tokens.
	MinTokens *Int `json:"min_tokens"`
	// AllowedTokenIDs (vLLM): only these ids may be drawn.
	AllowedTokenIDs []Int `json:"allowed_token_ids"`
	// BadWords (vLLM): words whose tokens may not be generated in a row.
	BadWords []*string `json:"bad_words"`
	// PromptLogprobs (vLLM): the prompt's logprobs, with that many most
	// likely tokens per position.
	PromptLogprobs *Int `json:"prompt_logprobs"`
	// ReturnTokensAsTokenIDs (vLLM) writes logprob tokens as "token_id:N".
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	// TruncatePromptTokens (vLLM): keep only the prompt's last k tokens
	// (−1: as many as the context holds).
	TruncatePromptTokens *Int `json:"truncate_prompt_tokens"`
	// AddSpecialTokens (vLLM): add the tokenizer's BOS to the prompt;
	// default true for completions, false for chat (the template writes
	// its own).
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// SkipSpecialTokens (vLLM): only true (the default) is supported.
	// SpacesBetweenSpecialTokens only matters when special tokens are
	// rendered, which they never are: accepted.
	SkipSpecialTokens          *bool `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens *bool `json:"spaces_between_special_tokens"`
	// Priority (vLLM): lower starts first, with --scheduling-policy
	// priority; refused otherwise unless 0.
	Priority *Int `json:"priority"`
	// Timeout (pdserve): seconds the request may take at most, capped by
	// --max-request-time.
	Timeout *float64 `json:"timeout"`
	// UseBeamSearch and LengthPenalty (vLLM): beam search is not
	// implemented; refused unless false and 1.
	UseBeamSearch bool     `json:"use_beam_search"`
	LengthPenalty *float64 `json:"length_penalty"`
	// Structured outputs (constraint.go): OpenAI's ResponseFormat
	// ({"type": "text"}, "json_object" or "json_schema"), vLLM's
	// StructuredOutputs and older Guided* fields, llama.cpp's JSONSchema
	// and Grammar. At most one constraint per request; the rest tune it
	// (GuidedWhitespacePattern) or change nothing (GuidedDecodingBackend:
	// pdserve has one engine).
	ResponseFormat          json.RawMessage `json:"response_format"`
	StructuredOutputs       json.RawMessage `json:"structured_outputs"`
	GuidedJSON              json.RawMessage `json:"guided_json"`
	GuidedRegex             json.RawMessage `json:"guided_regex"`
	GuidedChoice            json.RawMessage `json:"guided_choice"`
	GuidedGrammar           json.RawMessage `json:"guided_grammar"`
	GuidedDecodingBackend   json.RawMessage `json:"guided_decoding_backend"`
	GuidedWhitespacePattern json.RawMessage `json:"guided_whitespace_pattern"`
	JSONSchema              json.RawMessage `json:"json_schema"`
	Grammar                 json.RawMessage `json:"grammar"`
	// StructuralTag and LogitsProcessors (vLLM) are refused unless null:
	// ignoring them would hand the client text it did not ask for.
	StructuralTag    json.RawMessage `json:"structural_tag"`
	LogitsProcessors json.RawMessage `json:"logits_processors"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	VLLMXargs        json.RawMessage `json:"vllm_xargs"`
	// User, RequestID, CacheSalt, Metadata, Store, ServiceTier,
	// PromptCacheKey and SafetyIdentifier do not change the output: they
	// are accepted and ignored (pdserve mints its own request ids; its
	// prefix cache is per worker).
	User             string          `json:"user"`
	RequestID        string          `json:"request_id"`
	CacheSalt        string          `json:"cache_salt"`
	Metadata         json.RawMessage `json:"metadata"`
	Store            json.RawMessage `json:"store"`
	ServiceTier      json.RawMessage `json:"service_tier"`
	PromptCacheKey   json.RawMessage `json:"prompt_cache_key"`
	SafetyIdentifier json.RawMessage `json:"safety_identifier"`
}

// StreamOptions is "stream_options".
type StreamOptions struct {
	// IncludeUsage adds a last chunk with usage and no choices.
	IncludeUsage bool `json:"include_usage"`
	// ContinuousUsageStats (vLLM's) adds, with IncludeUsage, the usage so
	// far to every chunk.
	ContinuousUsageStats bool `json:"continuous_usage_stats,omitempty"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	SamplingFields
	// Prompt is a string, an array of one string, an array of token ids,
	// or an array of one array of token ids.
	Prompt json.RawMessage `json:"prompt"`
	// Echo prepends the prompt to each choice's text (and, with
	// Logprobs, its tokens' logprobs to the choice's).
	Echo bool `json:"echo"`
	// Logprobs, 0…--max-logprobs: the sampled tokens' logprobs with that
	// many most likely tokens at each step.
	Logprobs *Int `json:"logprobs"`
	// BestOf, N…MaxChoices: generate that many choices and return the N
	// with the highest cumulative logprob (not with Stream).
	BestOf *Int `json:"best_of"`
	// Suffix: only "" is supported.
	Suffix string `json:"suffix"`
	// PromptEmbeds (vLLM): refused unless null.
	PromptEmbeds json.RawMessage `json:"prompt_embeds"`
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	SamplingFields
	// Messages is the conversation; never empty.
	Messages []ChatMessage `json:"messages"`
	// MaxCompletionTokens replaces MaxTokens (which OpenAI deprecated for
	// chat) and wins when both are set.
	MaxCompletionTokens *Int `json:"max_completion_tokens"`
	// Logprobs asks for the sampled tokens' logprobs, TopLogprobs
	// (0…--max-logprobs, only with Logprobs) most likely tokens with each.
	Logprobs    *bool `json:"logprobs"`
	TopLogprobs *Int  `json:"top_logprobs"`
	// Tools (function definitions), ToolChoice ("none", "auto",
	// "required" or {"type":"function","function":{"name"}}) and
	// ParallelToolCalls (false: at most one call): see tools.go.
	// The deprecated Functions and FunctionCall are rejected unless empty
	// (function_call "none").
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls json.RawMessage `json:"parallel_tool_calls"`
	Functions         json.RawMessage `json:"functions"`
	FunctionCall      json.RawMessage `json:"function_call"`
	// Echo (vLLM): the answer's content starts with the last message's
	// when that message is the assistant's.
	Echo bool `json:"echo"`
	// BestOf: only 1 (OpenAI's chat API has none).
	BestOf *Int `json:"best_of"`
	// ChatTemplate (vLLM): a Jinja template used instead of the model's.
	ChatTemplate *string `json:"chat_template"`
	// ChatTemplateKwargs (vLLM): extra variables for the template
	// (enable_thinking and the like).
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	// AddGenerationPrompt (vLLM, default true) ends the prompt with the
	// assistant's turn; ContinueFinalMessage (vLLM) instead leaves the
	// final message open for the answer to continue.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	// Options refused unless null: other modalities, reasoning controls
	// and documents change what the model sees or returns in ways pdserve
	// does not implement. Modalities ["text"] is accepted.
	Audio             json.RawMessage `json:"audio"`
	Modalities        json.RawMessage `json:"modalities"`
	Prediction        json.RawMessage `json:"prediction"`
	WebSearchOptions  json.RawMessage `json:"web_search_options"`
	Verbosity         json.RawMessage `json:"verbosity"`
	ReasoningEffort   json.RawMessage `json:"reasoning_effort"`
	IncludeReasoning  *bool           `json:"include_reasoning"`
	Documents         json.RawMessage `json:"documents"`
	MMProcessorKwargs json.RawMessage `json:"mm_processor_kwargs"`
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	Role string `json:"role"`
	// Content is a string, null, or an array of {"type":"text","text":...}
	// parts (joined with "\n", as vLLM does).
	Content json.RawMessage `json:"content"`
	// Name is the author's name, given to the chat template.
	Name string `json:"name,omitempty"`
	// ToolCalls are an assistant message's function calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// ContentPart is one element of an array-valued message content.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Usage counts tokens of one request.
type Usage struct {
	PromptTokens int `json:"prompt_tokens"`
	// CompletionTokens counts the output tokens sent to the client, up to
	// and including the token that completed a stop string.
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails breaks the prompt tokens down, as OpenAI's API
	// and vLLM do; the server always sets it.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is usage.prompt_tokens_details.
type PromptTokensDetails struct {
	// CachedTokens counts the prompt tokens whose KV the serving workers
	// did not compute because their prefix cache held it: under PD, the
	// prefill worker's cache (tokens decode held and did not need
	// transferred are not counted).
	CachedTokens int `json:"cached_tokens"`
}

// CompletionResponse is the answer of /v1/completions, and (with
// Object "text_completion" too, as OpenAI does) each event of its stream.
type CompletionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// CompletionChoice is a choice of a CompletionResponse (or of a stream event).
type CompletionChoice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	// Logprobs (with the request's logprobs) or null.
	Logprobs *CompletionLogprobs `json:"logprobs"`
	// FinishReason is null until the last event.
	FinishReason *string `json:"finish_reason"`
	// PromptTokenIDs (return_token_ids) is in the response and in the first
	// stream event.
	PromptTokenIDs []int32 `json:"prompt_token_ids,omitzero"`
	// TokenIDs (return_token_ids) are the output tokens of the response or
	// of this event.
	TokenIDs []int32 `json:"token_ids,omitzero"`
	// PromptLogprobs (vLLM's prompt_logprobs) is in the response only.
	PromptLogprobs PromptLogprobs `json:"prompt_logprobs,omitempty"`
}

// ChatCompletionResponse is the answer of /v1/chat/completions without stream.
type ChatCompletionResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
	// PromptTokenIDs (return_token_ids).
	PromptTokenIDs []int32 `json:"prompt_token_ids,omitzero"`
	// PromptLogprobs (vLLM's prompt_logprobs).
	PromptLogprobs PromptLogprobs `json:"prompt_logprobs,omitempty"`
}

// ChatChoice is a choice of a ChatCompletionResponse.
type ChatChoice struct {
	Index        int                 `json:"index"`
	Message      ChatResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs       `json:"logprobs"`
	FinishReason string              `json:"finish_reason"`
	// TokenIDs (return_token_ids) are the output tokens.
	TokenIDs []int32 `json:"token_ids,omitzero"`
}

// ChatResponseMessage is the assistant's message.
type ChatResponseMessage struct {
	Role string `json:"role"`
	// Content is null when the answer is only tool calls (or only
	// reasoning).
	Content *string `json:"content"`
	// ReasoningContent is the model's reasoning, split off the content by
	// --reasoning-parser (vLLM's field).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
	// ToolCalls are the function calls of the answer.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ChatCompletionChunk is one event of a chat completion stream.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
	// PromptTokenIDs (return_token_ids) is in the first event.
	PromptTokenIDs []int32 `json:"prompt_token_ids,omitzero"`
}

// ChatChunkChoice is a choice of a ChatCompletionChunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	// TokenIDs (return_token_ids) are the output tokens of this event.
	TokenIDs []int32 `json:"token_ids,omitzero"`
}

// ChatDelta is the new part of the assistant's message.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ReasoningContent is new reasoning (--reasoning-parser).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
	// ToolCalls are new parts of function calls: a call's first carries
	// its id, type and name, the next ones pieces of its arguments.
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ModelList is the answer of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelCard `json:"data"`
}

// ModelCard describes a served model (GET /v1/models/{id}).
type ModelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen (vLLM extension) is the context length in tokens.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// marshalJSON encodes v without HTML escaping (model output often contains
// "<" and ">") and without a trailing newline. The wire types cannot fail to
// encode; if v could, the error is reported as a JSON error body.
func marshalJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(`{"error":{"message":"cannot encode response","type":"server_error","param":null,"code":null}}`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

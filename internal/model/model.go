// Package model defines what a worker needs from a language model: its KV
// geometry and identity, a batched forward step over sequences whose KV lives
// in pool pages, a tokenizer, and the sampler shared by every model.
//
// # Concurrency
//
// A Model's Forward is called from one goroutine at a time (a worker's loop).
// Info and Tokenizer may be called from any goroutine.
package model

import (
	"context"
	"encoding/json"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// Info describes a model as workers and the router see it.
type Info struct {
	// Name is the model name served on /v1/models.
	Name string
	// Geometry is the per-token KV shape.
	Geometry kvcache.Geometry
	// ContextLen is the maximum number of tokens (prompt + output) of a sequence.
	ContextLen int
	// VocabSize is the number of token ids, 0 ≤ id < VocabSize.
	VocabSize int
	// EOS lists the token ids that end generation unless the request sets ignore_eos.
	EOS []int32
	// Digest identifies the weights (for the simulated model: its parameters).
	// Two workers may exchange KV only if their digests are equal.
	Digest string
}

// SeqInput is one sequence of a forward batch.
//
// The forward writes the KV of Tokens at positions Pos … Pos+len(Tokens)-1
// into Pages (token t at page t/PageSize, slot t%PageSize), reading the KV of
// positions 0 … Pos-1 already there. Pages must cover Pos+len(Tokens) tokens.
type SeqInput struct {
	Pages  []kvcache.PageID
	Pos    int
	Tokens []int32
	// Sample asks for a next token after the last of Tokens.
	Sample   bool
	Sampling SamplingParams
	// Step is the index of the sampled token among the sequence's outputs
	// (0 for the first output token); it keys the sampler's randomness so
	// that the same request samples the same tokens on any worker.
	Step int
	// Ban lists token ids that may not be drawn at this step (SampleBan):
	// while a request has fewer outputs than its min_tokens, the worker's
	// scheduler sets it to the EOS ids and the request's stop_token_ids.
	Ban []int32
	// Mask, when not nil, is a hard constraint on the token drawn (a
	// grammar's, grammar.Matcher.FillMask): token i may be drawn only if bit
	// i%64 of Mask[i/64] is set; an id past the mask's end counts as clear.
	// Unlike Ban it never gives way (see SampleSeq). nil: no constraint.
	Mask []uint64
	// Forks (> 1: a request with n > 1 choices, at its first output step)
	// draws that many tokens from the same logits, fork i keyed by
	// ForkSeed(Sampling.Seed, i); SeqOutput.Forks holds forks 1…Forks−1.
	// 0 and 1 draw one token.
	Forks int
	// Prompt and Output are the sequence's prompt and its output tokens so
	// far, read-only: what repetition_penalty (prompt and output),
	// presence_penalty, frequency_penalty and bad_words (output) look at.
	// The sampler reads them only when Sampling asks for one of those.
	Prompt, Output []int32
	// Score asks for prompt logprobs (vLLM's prompt_logprobs): when not
	// nil, len(Score) == len(Tokens) and Score[j] is the token whose
	// log-probability under the model's distribution after Tokens[j] is
	// wanted (the next prompt token), or −1 for none (the prompt's last
	// token, whose distribution is the one sampled). ScoreTop is how many
	// of the most likely tokens to report at each scored position
	// (0…MaxLogprobs).
	Score    []int32
	ScoreTop int
}

// SeqOutput is the result for one sequence; zero unless Sample was set or
// Score asked for prompt logprobs.
type SeqOutput struct {
	Token int32
	// Logprob is the natural log of the token's probability in the
	// distribution Sampling.LogprobsMode names: the model's (raw, before
	// any penalty, bias, temperature or truncation) by default.
	Logprob float32
	// Top holds the Sampling.TopLogprobs most likely tokens of that same
	// distribution, most likely first (ties by lower id); nil when
	// TopLogprobs is 0.
	Top []TokenLogprob
	// Forks holds the tokens of forks 1…SeqInput.Forks−1 (SeqInput.Forks >
	// 1), each drawn as Token is with its own seed; nil otherwise.
	Forks []SeqOutput
	// Scores (SeqInput.Score set) holds one entry per token of the
	// sequence: Scores[j] for the position after Tokens[j], the zero value
	// where Score[j] is −1.
	Scores []PositionLogprobs
}

// Model runs batched forward steps.
type Model interface {
	Info() Info
	// Forward runs one step over seqs, writing out[i] for each seqs[i]: the
	// sampled token (SampleSeq of the logits after the last token) when
	// Sample is set, the prompt scores (ScorePosition of the logits after
	// each scored token) when Score is, zero otherwise. len(out) ==
	// len(seqs). It returns ctx.Err() if cancelled and an error for input it
	// cannot run (a token id out of range, pages that do not cover the
	// positions, fields BatchCheck refuses).
	Forward(ctx context.Context, pool *kvcache.Pool, seqs []SeqInput, out []SeqOutput) error
	// Tokenizer returns the model's tokenizer, or nil if it has none (token-id
	// prompts only).
	Tokenizer() Tokenizer
}

// Message is one chat message.
type Message struct {
	Role    string
	Content string
	// ToolCalls are the function calls of an assistant's message.
	ToolCalls []ToolCall
	// ToolCallID is the call a tool message answers (role "tool").
	ToolCallID string
	// Name is the message's author name (a tool message's function name),
	// given to the template when not empty.
	Name string
}

// ToolCall is one function call of an assistant's message.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the call's arguments as the client sent them: JSON text
	// (an object), or any other text the model wrote.
	Arguments string
}

// ChatOptions are the choices of a chat template rendering besides the
// messages, after transformers' apply_chat_template and vLLM's chat request
// fields. The zero value renders as ApplyChatTemplate always did: with the
// model's template and the assistant's turn opened.
type ChatOptions struct {
	// NoGenerationPrompt leaves the assistant's turn unopened (vLLM's
	// add_generation_prompt: false).
	NoGenerationPrompt bool
	// ContinueFinalMessage renders the last message (an assistant's) open,
	// without its end-of-turn, so the model continues it (vLLM's
	// continue_final_message); it implies NoGenerationPrompt.
	ContinueFinalMessage bool
	// Template, if not empty, is a Jinja chat template used instead of the
	// model's (vLLM's chat_template).
	Template string
	// Kwargs are extra template variables (vLLM's chat_template_kwargs,
	// e.g. enable_thinking), each a JSON value; they may not replace
	// messages, add_generation_prompt, tools or documents.
	Kwargs map[string]json.RawMessage
	// Tools, if not nil, is the template's tools variable: a JSON array of
	// {"type":"function","function":{name, description, parameters}}.
	Tools json.RawMessage
}

// Tokenizer turns text into token ids and back.
type Tokenizer interface {
	// Encode tokenizes text. Special tokens written in the text (e.g.
	// "<|eot_id|>") are always recognised. addSpecial adds what the
	// tokenizer adds around a sequence (the model's BOS, if it uses one):
	// true for a completion prompt, false for a rendered chat template,
	// which writes its own (as vLLM and Hugging Face do).
	Encode(text string, addSpecial bool) ([]int32, error)
	// ApplyChatTemplate renders messages into a prompt ending with the
	// assistant's turn (or as opts say). It returns an error for a
	// conversation the template rejects, a template that does not compile
	// and options it cannot honour.
	ApplyChatTemplate(msgs []Message, opts ChatOptions) (string, error)
	// TokenBytes returns the bytes token id stands for in decoded text
	// (which may be part of a UTF-8 character, or nothing for a special
	// token that decodes to no text), or nil for an id outside the
	// vocabulary. The caller must not modify them.
	TokenBytes(id int32) []byte
	// NewDecoder returns an incremental detokenizer for one output stream.
	NewDecoder() Decoder
}

// SpecialTokens is implemented by tokenizers that know which ids are
// special tokens (BOS, EOS, chat markup: tokenizer.json's added tokens
// marked special, a GGUF vocabulary's control and unknown tokens). The
// front end leaves them out of output text, as vLLM does with
// skip_special_tokens (its default); a Decoder renders them as their
// content.
type SpecialTokens interface {
	IsSpecial(id int32) bool
}

// Decoder turns a stream of token ids into text, holding back bytes of an
// incomplete UTF-8 character until the token that completes it.
type Decoder interface {
	// Add appends a token and returns the newly complete text.
	Add(id int32) string
	// Flush returns whatever is held back (invalid bytes as U+FFFD).
	Flush() string
}

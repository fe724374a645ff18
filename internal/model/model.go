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
}

// SeqOutput is the result for one sequence; zero unless Sample was set.
type SeqOutput struct {
	Token   int32
	Logprob float32 // natural log of the token's probability before temperature/top-p
}

// Model runs batched forward steps.
type Model interface {
	Info() Info
	// Forward runs one step over seqs, writing out[i] for each seqs[i] with
	// Sample set. len(out) == len(seqs). It returns ctx.Err() if cancelled and
	// an error for input it cannot run (a token id out of range, pages that do
	// not cover the positions).
	Forward(ctx context.Context, pool *kvcache.Pool, seqs []SeqInput, out []SeqOutput) error
	// Tokenizer returns the model's tokenizer, or nil if it has none (token-id
	// prompts only).
	Tokenizer() Tokenizer
}

// Message is one chat message.
type Message struct {
	Role    string
	Content string
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
	// assistant's turn. It returns an error for a conversation the template
	// rejects.
	ApplyChatTemplate(msgs []Message) (string, error)
	// NewDecoder returns an incremental detokenizer for one output stream.
	NewDecoder() Decoder
}

// Decoder turns a stream of token ids into text, holding back bytes of an
// incomplete UTF-8 character until the token that completes it.
type Decoder interface {
	// Add appends a token and returns the newly complete text.
	Add(id int32) string
	// Flush returns whatever is held back (invalid bytes as U+FFFD).
	Flush() string
}

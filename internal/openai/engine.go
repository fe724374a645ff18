package openai

import (
	"context"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model"
)

// Engine runs generation requests: the PD router, or a colocated worker.
type Engine interface {
	// Generate starts a request. ctx is the client's request context: when
	// it is done the request must end (Recv returns an error promptly).
	//
	// An error returned here happens before any output; it should be an
	// *Error (its status and OpenAI body reach the client unchanged);
	// any other error is mapped by ToError (usually to 500).
	Generate(ctx context.Context, req *GenerateRequest) (Stream, error)
}

// GenerateRequest is one validated generation request.
type GenerateRequest struct {
	// RID is the request id minted by the front end (32 hex characters by
	// default); responses carry it as "cmpl-"+RID or "chatcmpl-"+RID.
	RID string
	// InputIDs is the tokenized prompt; never empty. Ids are not checked
	// against the vocabulary here: the engine must reject ids out of range
	// (with an *Error of status 400).
	InputIDs []int32
	// MaxTokens is the maximum number of output tokens, ≥ 1, with
	// len(InputIDs)+MaxTokens ≤ the context length; or 0 for a request
	// that only computes its prompt (completions' echo with max_tokens 0:
	// scoring, with ScorePrompt), which the engine answers with no output
	// token and finish reason "length".
	MaxTokens int
	// MaxTokensDefault says the client gave no max_tokens: MaxTokens is the
	// default (the rest of the context, or completions' 16, cut to what the
	// context leaves), computed against Config.ContextNow's context. An
	// engine whose workers serve different contexts may lower it to what
	// the context of the worker it picks leaves after the prompt (never
	// below MinTokens).
	MaxTokensDefault bool
	// N is the number of choices (1…model.MaxForks): the engine computes
	// the prompt once and generates N sequences from it, choice i drawn
	// with model.ForkSeed(Sampling.Seed, i). 0 means 1.
	N int
	// ScorePrompt asks for the prompt's logprobs (echo with logprobs,
	// vLLM's prompt_logprobs): the first chunk carries PromptLogprobs,
	// each with the PromptTopLogprobs most likely tokens.
	ScorePrompt       bool
	PromptTopLogprobs int
	// Priority orders requests waiting to start on a worker (lower first,
	// then by arrival), with --scheduling-policy priority; 0 otherwise.
	Priority int
	// Timeout, if positive, bounds the request (its own deadline, below
	// --max-request-time): it fails with timeout_request when it passes.
	Timeout time.Duration
	// Sampling has been validated with model.SamplingParams.Validate; Seed
	// is always set (drawn at random when the client sent none).
	Sampling model.SamplingParams
	// StopTokenIDs end generation (finish reason "stop") like EOS does,
	// even with IgnoreEOS.
	StopTokenIDs []int32
	// IgnoreEOS asks the engine not to stop at the model's EOS tokens.
	IgnoreEOS bool
	// MinTokens (vLLM's min_tokens, 0 ≤ MinTokens ≤ MaxTokens): the engine
	// must not draw EOS or a stop token before that many output tokens.
	MinTokens int
	// Constraint, unless zero, restricts every choice's output to the
	// strings it accepts (structured outputs: a JSON Schema, any JSON
	// object, a regex, a choice, a grammar): the engine masks each step's
	// tokens with it and allows EOS only where the output may end. The
	// front end has compiled it once (grammar.Compile succeeds on it).
	Constraint grammar.Spec
	// Buffered says the front end will not look at the output before the
	// end (a non-streaming request without stop strings), so the engine
	// may deliver it in one chunk instead of token by token.
	Buffered bool
	// Arrived is when the front end received the request (Config.Now),
	// before reading its body: the client's latencies start there.
	Arrived time.Time
}

// Token is one output token.
type Token struct {
	ID int32
	// Logprob is the natural log of the token's probability (in the
	// distribution Sampling.LogprobsMode names).
	Logprob float32
	// Top are the Sampling.TopLogprobs most likely tokens at this step,
	// most likely first.
	Top []model.TokenLogprob
}

// Chunk is a batch of output tokens of one choice, in order.
type Chunk struct {
	// Index is the choice the tokens belong to (0…N−1).
	Index  int
	Tokens []Token
	// FinishReason is "" until the choice's last chunk, which carries
	// "stop" (EOS or a stop token id, included as the last of Tokens) or
	// "length" (MaxTokens reached).
	FinishReason string
	// Done marks the stream's last chunk: every choice has finished. With
	// N = 1 the chunk with a FinishReason is the last whether or not Done
	// is set; with N > 1 the front end also ends once every choice has
	// finished.
	Done bool
	// PromptLogprobs (ScorePrompt, first chunk only) holds one entry per
	// prompt token: the first is the zero value (no token precedes it),
	// entry j the log-probability of prompt token j after the tokens
	// before it, with the most likely tokens there.
	PromptLogprobs []model.PositionLogprobs
	// CachedTokens, on the last chunk, is how many prompt tokens the engine
	// did not compute because its prefix cache held their KV (reported as
	// usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
}

// Pender is implemented by streams that know whether their next chunk is
// already there: the front end then writes the current one without
// flushing it, so a burst of chunks goes out in one write (each chunk is
// still flushed at once when nothing follows it).
type Pender interface {
	// Pending reports whether Recv would return at once.
	Pending() bool
}

// Ender is implemented by streams that know, after their last chunk,
// whether their source has ended too, so that Close will not wait for it
// (the router's leg read to its end). The front end then leaves the last
// event unflushed: the HTTP server sends it with the end of the response,
// in one write, once the handler returns.
type Ender interface {
	// Ended reports, without blocking, whether Close will not block.
	Ended() bool
}

// ChoiceStopper is implemented by streams of requests with N > 1 that can
// end one choice early: the front end calls StopChoice when a stop string
// ended choice index while others still run, so the engine frees what that
// choice holds. A stream without it keeps generating the choice (the front
// end ignores its later tokens) until it finishes on its own.
type ChoiceStopper interface {
	StopChoice(index int)
}

// Stream is the output of one request. The front end calls its methods
// from one goroutine, never concurrently.
type Stream interface {
	// Recv returns the next chunk. After the chunk with a FinishReason it
	// returns io.EOF (the front end does not call it again then). Other
	// errors end the request; they should be *Error, or ToError maps them
	// (usually to 500). It must return promptly once the context passed
	// to Generate is done.
	Recv() (Chunk, error)
	// Stop tells the engine the front end finished the request early (a
	// stop string matched): end it as finished, not as aborted by the
	// client. Called at most once, before Close.
	Stop()
	// Close releases the stream; if the request has not finished (and Stop
	// was not called) it aborts it, because the client is gone. Always
	// called exactly once.
	Close()
}

package model

import "fmt"

// MaxLogprobs bounds SamplingParams.TopLogprobs and SeqInput.ScoreTop: the
// most alternatives a worker computes per position. The API's limit
// (--max-logprobs, vLLM's default 20) is at most this.
const MaxLogprobs = 1024

// MaxForks bounds SeqInput.Forks: the most choices one request may have
// (OpenAI's n and best_of go up to 128).
const MaxForks = 128

// TokenLogprob is a token and the natural log of its probability.
type TokenLogprob struct {
	ID      int32   `json:"id"`
	Logprob float32 `json:"logprob"`
}

// PositionLogprobs is one prompt position's log-probabilities (vLLM's
// prompt_logprobs): the prompt's next token's, and the most likely tokens
// of the model's distribution there, most likely first (ties by lower id).
type PositionLogprobs struct {
	Token TokenLogprob `json:"token"`
	// Rank is the token's rank in that distribution: 1 for the most
	// likely, 1 + the number of tokens more likely (ties by lower id).
	Rank int32          `json:"rank"`
	Top  []TokenLogprob `json:"top,omitempty"`
}

// LogitBias is one entry of SamplingParams.LogitBias.
type LogitBias struct {
	ID   int32   `json:"id"`
	Bias float32 `json:"bias"`
}

// LogprobsMode names the distribution logprobs are reported from (vLLM's
// --logprobs-mode). Its zero value is LogprobsRaw.
type LogprobsMode uint8

// Logprobs modes.
const (
	// LogprobsRaw: log softmax of the model's logits, before any penalty,
	// bias, ban, temperature or truncation (vLLM's raw_logprobs).
	LogprobsRaw LogprobsMode = iota
	// LogprobsProcessed: log softmax of the logits the token is drawn from,
	// after bans, penalties, bias, temperature, min_p, top_k and top_p
	// (vLLM's processed_logprobs); a token those exclude has −∞. Greedy
	// sampling (temperature 0) applies no temperature or truncation, so
	// its processed logprobs are after bans, penalties and bias only.
	LogprobsProcessed
)

var logprobsModeNames = [...]string{"raw_logprobs", "processed_logprobs"}

func (m LogprobsMode) String() string {
	if int(m) < len(logprobsModeNames) {
		return logprobsModeNames[m]
	}
	return fmt.Sprintf("logprobs_mode(%d)", uint8(m))
}

// ParseLogprobsMode returns the mode named s (raw_logprobs or
// processed_logprobs).
func ParseLogprobsMode(s string) (LogprobsMode, error) {
	for i, n := range logprobsModeNames {
		if n == s {
			return LogprobsMode(i), nil
		}
	}
	return 0, fmt.Errorf("logprobs mode must be raw_logprobs or processed_logprobs, got %q", s)
}

// MarshalText implements encoding.TextMarshaler.
func (m LogprobsMode) MarshalText() ([]byte, error) {
	if int(m) >= len(logprobsModeNames) {
		return nil, fmt.Errorf("model: no logprobs mode %d", uint8(m))
	}
	return []byte(logprobsModeNames[m]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler ("" is LogprobsRaw).
func (m *LogprobsMode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = LogprobsRaw
		return nil
	}
	v, err := ParseLogprobsMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ForkSeed is the seed of choice i of a request whose seed is seed: seed
// itself for choice 0 (so n = 1 draws as it always did), and a SplitMix64
// mix of both for the others, so that every choice draws differently and
// the same request gives the same n choices on any worker.
func ForkSeed(seed uint64, i int) uint64 {
	if i == 0 {
		return seed
	}
	return splitmix64(seed ^ splitmix64(uint64(i)<<32|0x5eed))
}

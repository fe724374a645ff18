package openai

import (
	"math"
	"strconv"
)

// This file holds the logprob shapes of the responses. Each type encodes
// itself (MarshalJSON) with the same appenders the stream encoder uses, so
// a response written by marshalJSON and a stream event written by
// appendEvent carry byte-identical logprobs, and objects whose keys are
// token strings keep the order of likelihood (a Go map would sort them).

// LogprobFloor is what a logprob of −∞ is written as (JSON has no
// infinity): vLLM's −9999.0. Processed logprobs (--logprobs-mode
// processed_logprobs) give −∞ to tokens the sampler excluded.
const LogprobFloor = -9999.0

// CompletionLogprobs is a completion choice's "logprobs" (OpenAI's legacy
// shape): one entry per token in each list. The first entry of an echoed
// prompt has no logprob (null) and no alternatives (null).
type CompletionLogprobs struct {
	// TextOffset is each token's offset in the choice's text, in
	// characters (Unicode code points of the token strings before it).
	TextOffset []int
	// TokenLogprobs are the tokens' logprobs; NaN stands for null.
	TokenLogprobs []float32
	// Tokens are the tokens' strings (their bytes as text; "token_id:N"
	// with return_tokens_as_token_ids or without a tokenizer).
	Tokens []string
	// TopLogprobs are the most likely tokens at each position, the sampled
	// one added when it is not among them (so up to logprobs + 1 entries,
	// as OpenAI documents); nil stands for null.
	TopLogprobs []TopLogprobs
}

// TopLogprobs is an object from token strings to logprobs, most likely
// first; a string that occurs again (two ids that decode the same) keeps
// its first, most likely, entry.
type TopLogprobs []StringLogprob

// StringLogprob is one entry of TopLogprobs.
type StringLogprob struct {
	Token   string
	Logprob float32
}

// MarshalJSON implements json.Marshaler.
func (l CompletionLogprobs) MarshalJSON() ([]byte, error) {
	return appendCompletionLogprobs(nil, &l), nil
}

// MarshalJSON implements json.Marshaler.
func (t TopLogprobs) MarshalJSON() ([]byte, error) { return appendTopLogprobs(nil, t), nil }

// ChatLogprobs is a chat choice's "logprobs".
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatTokenLogprob is one output token of ChatLogprobs.
type ChatTokenLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	// Bytes are the token string's UTF-8 bytes (a token that is part of a
	// character has bytes that are not valid UTF-8 alone).
	Bytes []int `json:"bytes"`
	// TopLogprobs are the top_logprobs most likely tokens, most likely
	// first.
	TopLogprobs []ChatTopLogprob `json:"top_logprobs"`
}

// ChatTopLogprob is one alternative of ChatTokenLogprob.
type ChatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// MarshalJSON implements json.Marshaler.
func (l ChatLogprobs) MarshalJSON() ([]byte, error) { return appendChatLogprobs(nil, &l), nil }

// PromptLogprobs is vLLM's prompt_logprobs: one entry per prompt token,
// the first null (nil), each other an object from token ids (as strings)
// to {logprob, rank, decoded_token}: the prompt token's first, then the
// most likely tokens not already listed.
type PromptLogprobs [][]PromptLogprob

// PromptLogprob is one entry of a PromptLogprobs position.
type PromptLogprob struct {
	ID      int32
	Logprob float32
	// Rank is 1 for the most likely token (ties by lower id).
	Rank         int32
	DecodedToken string
}

// MarshalJSON implements json.Marshaler.
func (p PromptLogprobs) MarshalJSON() ([]byte, error) { return appendPromptLogprobs(nil, p), nil }

// appendLogprob appends a logprob as encoding/json writes a float32, −∞
// (and anything below the floor) as LogprobFloor, NaN as null.
func appendLogprob(b []byte, f float32) []byte {
	switch {
	case math.IsNaN(float64(f)):
		return append(b, "null"...)
	case f < LogprobFloor:
		f = LogprobFloor
	}
	return appendFloat(b, float64(f), 32)
}

// appendFloat appends f as encoding/json does for a float of the given
// bit size: the shortest decimal that reads back as f, in exponent form
// only below 1e-6 and from 1e21 on, with a two-digit exponent's leading
// zero dropped (ECMAScript's number formatting).
func appendFloat(b []byte, f float64, bits int) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// e-09 → e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

func appendCompletionLogprobs(b []byte, l *CompletionLogprobs) []byte {
	b = append(b, `{"text_offset":`...)
	b = appendInts(b, l.TextOffset)
	b = append(b, `,"token_logprobs":`...)
	if l.TokenLogprobs == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, f := range l.TokenLogprobs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendLogprob(b, f)
		}
		b = append(b, ']')
	}
	b = append(b, `,"tokens":`...)
	b = appendArray(b, l.Tokens, func(b []byte, s *string) []byte { return appendJSONString(b, *s) })
	b = append(b, `,"top_logprobs":`...)
	b = appendArray(b, l.TopLogprobs, func(b []byte, t *TopLogprobs) []byte { return appendTopLogprobs(b, *t) })
	return append(b, '}')
}

func appendTopLogprobs(b []byte, t TopLogprobs) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, e := range t {
		dup := false
		for _, f := range t[:i] {
			if f.Token == e.Token {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		if len(b) > 0 && b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = appendJSONString(b, e.Token)
		b = append(b, ':')
		b = appendLogprob(b, e.Logprob)
	}
	return append(b, '}')
}

func appendChatLogprobs(b []byte, l *ChatLogprobs) []byte {
	b = append(b, `{"content":`...)
	b = appendArray(b, l.Content, func(b []byte, t *ChatTokenLogprob) []byte {
		b = append(b, `{"token":`...)
		b = appendJSONString(b, t.Token)
		b = append(b, `,"logprob":`...)
		b = appendLogprob(b, t.Logprob)
		b = append(b, `,"bytes":`...)
		b = appendInts(b, t.Bytes)
		b = append(b, `,"top_logprobs":`...)
		b = appendArray(b, t.TopLogprobs, func(b []byte, a *ChatTopLogprob) []byte {
			b = append(b, `{"token":`...)
			b = appendJSONString(b, a.Token)
			b = append(b, `,"logprob":`...)
			b = appendLogprob(b, a.Logprob)
			b = append(b, `,"bytes":`...)
			b = appendInts(b, a.Bytes)
			return append(b, '}')
		})
		return append(b, '}')
	})
	return append(b, '}')
}

func appendPromptLogprobs(b []byte, p PromptLogprobs) []byte {
	return appendArray(b, p, func(b []byte, pos *[]PromptLogprob) []byte {
		if *pos == nil {
			return append(b, "null"...)
		}
		b = append(b, '{')
		for i, e := range *pos {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(e.ID), 10)
			b = append(b, `":{"logprob":`...)
			b = appendLogprob(b, e.Logprob)
			b = append(b, `,"rank":`...)
			b = strconv.AppendInt(b, int64(e.Rank), 10)
			b = append(b, `,"decoded_token":`...)
			b = appendJSONString(b, e.DecodedToken)
			b = append(b, '}')
		}
		return append(b, '}')
	})
}

// appendInts appends xs as an array of numbers, or null for nil.
func appendInts(b []byte, xs []int) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	return appendIntArray(b, xs)
}

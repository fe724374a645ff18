package openai

import (
	"strconv"
	"unicode/utf8"
)

// Stream events are encoded without reflection: every event of every
// streamed request passes here (one per token, or per coalesced chunk), and
// encoding/json's reflective encoder, its buffer and its encoder state were a
// sizeable share of the front end's CPU under load. The output is byte for
// byte what marshalJSON (encoding/json without HTML escaping) writes for the
// same value; TestAppendEventMatchesEncodingJSON and FuzzAppendEvent hold
// the two together.

// appendEvent appends v's JSON to b. It encodes CompletionResponse and
// ChatCompletionChunk (the stream events) itself and anything else with
// marshalJSON.
func appendEvent(b []byte, v any) []byte {
	switch e := v.(type) {
	case CompletionResponse:
		return appendCompletion(b, &e)
	case *CompletionResponse:
		return appendCompletion(b, e)
	case ChatCompletionChunk:
		return appendChatChunk(b, &e)
	case *ChatCompletionChunk:
		return appendChatChunk(b, e)
	}
	return append(b, marshalJSON(v)...)
}

// appendHead appends `{"id":…,"object":…,"created":…,"model":…,"choices":[`.
func appendHead(b []byte, id, object string, created int64, model string) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":`...)
	b = appendJSONString(b, object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, model)
	return append(b, `,"choices":`...)
}

func appendCompletion(b []byte, r *CompletionResponse) []byte {
	b = appendHead(b, r.ID, r.Object, r.Created, r.Model)
	b = appendArray(b, r.Choices, func(b []byte, c *CompletionChoice) []byte {
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c.Index), 10)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, c.Text)
		b = append(b, `,"logprobs":`...)
		if c.Logprobs == nil {
			b = append(b, "null"...)
		} else {
			b = appendCompletionLogprobs(b, c.Logprobs)
		}
		b = append(b, `,"finish_reason":`...)
		b = appendOptString(b, c.FinishReason)
		b = appendIDs(b, `,"prompt_token_ids":`, c.PromptTokenIDs)
		b = appendIDs(b, `,"token_ids":`, c.TokenIDs)
		if len(c.PromptLogprobs) > 0 {
			b = append(b, `,"prompt_logprobs":`...)
			b = appendPromptLogprobs(b, c.PromptLogprobs)
		}
		return append(b, '}')
	})
	b = appendUsage(b, r.Usage)
	return append(b, '}')
}

func appendChatChunk(b []byte, r *ChatCompletionChunk) []byte {
	b = appendHead(b, r.ID, r.Object, r.Created, r.Model)
	b = appendArray(b, r.Choices, func(b []byte, c *ChatChunkChoice) []byte {
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c.Index), 10)
		b = append(b, `,"delta":{`...)
		sep := false
		if c.Delta.Role != "" {
			b = append(b, `"role":`...)
			b = appendJSONString(b, c.Delta.Role)
			sep = true
		}
		if c.Delta.Content != nil {
			if sep {
				b = append(b, ',')
			}
			b = append(b, `"content":`...)
			b = appendJSONString(b, *c.Delta.Content)
			sep = true
		}
		if c.Delta.ReasoningContent != nil {
			if sep {
				b = append(b, ',')
			}
			b = append(b, `"reasoning_content":`...)
			b = appendJSONString(b, *c.Delta.ReasoningContent)
			sep = true
		}
		if len(c.Delta.ToolCalls) > 0 {
			if sep {
				b = append(b, ',')
			}
			b = append(b, `"tool_calls":`...)
			b = append(b, marshalJSON(c.Delta.ToolCalls)...)
		}
		b = append(b, '}')
		b = append(b, `,"logprobs":`...)
		if c.Logprobs == nil {
			b = append(b, "null"...)
		} else {
			b = appendChatLogprobs(b, c.Logprobs)
		}
		b = append(b, `,"finish_reason":`...)
		b = appendOptString(b, c.FinishReason)
		b = appendIDs(b, `,"token_ids":`, c.TokenIDs)
		return append(b, '}')
	})
	b = appendUsage(b, r.Usage)
	b = appendIDs(b, `,"prompt_token_ids":`, r.PromptTokenIDs)
	return append(b, '}')
}

// appendArray appends xs as a JSON array, each element by f, or null for a
// nil slice (as encoding/json does).
func appendArray[T any](b []byte, xs []T, f func([]byte, *T) []byte) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = f(b, &xs[i])
	}
	return append(b, ']')
}

func appendOptString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

// appendIDs appends key and ids, or nothing for a nil slice (omitzero).
func appendIDs(b []byte, key string, ids []int32) []byte {
	if ids == nil {
		return b
	}
	return appendIntArray(append(b, key...), ids)
}

// appendIntArray appends xs as a JSON array of numbers.
func appendIntArray[T int | int32](b []byte, xs []T) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendUsage appends the usage field, or nothing for nil (omitempty).
func appendUsage(b []byte, u *Usage) []byte {
	if u == nil {
		return b
	}
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
	if d := u.PromptTokensDetails; d != nil {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(d.CachedTokens), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString is AppendJSONString with HTML escaping off, as the
// stream encoder (json.Encoder with SetEscapeHTML(false)) writes.
func appendJSONString(b []byte, s string) []byte { return AppendJSONString(b, s, false) }

// AppendJSONString appends s as a JSON string the way encoding/json does:
// `"` and `\` escaped, \b \f \n \r \t short, other control characters as
// \u00XX, invalid UTF-8 as \ufffd, U+2028 and U+2029 as \u2028 and \u2029
// (encoding/json's appendString), and with escapeHTML also <, > and & as
// \u003c, \u003e and \u0026 (what json.Marshal writes).
func AppendJSONString(b []byte, s string, escapeHTML bool) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (!escapeHTML || (c != '<' && c != '>' && c != '&')) {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

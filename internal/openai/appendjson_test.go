package openai

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// pieces of strings that exercise every escape of appendJSONString.
var jsonPieces = []string{"", "a", "hello world", `"`, `\`, "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
	"<b>&amp;</b>", "é", "日本語", "\u2028", "\u2029", "\xff", "\xe6\x97", "🙂", "\ufffd", " ", "/"}

func randString(r *rand.Rand) string {
	var b []byte
	for range r.IntN(5) {
		b = append(b, jsonPieces[r.IntN(len(jsonPieces))]...)
	}
	return string(b)
}

func randIDs(r *rand.Rand) []int32 {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		return []int32{}
	}
	ids := make([]int32, 1+r.IntN(4))
	for i := range ids {
		ids[i] = r.Int32() - 1<<30
	}
	return ids
}

func randOpt(r *rand.Rand) *string {
	if r.IntN(2) == 0 {
		return nil
	}
	s := randString(r)
	return &s
}

func randUsage(r *rand.Rand) *Usage {
	if r.IntN(2) == 0 {
		return nil
	}
	u := &Usage{PromptTokens: r.IntN(1 << 20), CompletionTokens: r.IntN(1 << 20), TotalTokens: r.IntN(1 << 21)}
	if r.IntN(3) > 0 {
		u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: r.IntN(1 << 20)}
	}
	return u
}

func randEvent(r *rand.Rand) any {
	n := r.IntN(3)
	if r.IntN(2) == 0 {
		e := CompletionResponse{ID: randString(r), Object: "text_completion", Created: r.Int64() - 1<<62,
			Model: randString(r), Usage: randUsage(r)}
		if n > 0 || r.IntN(2) == 0 {
			e.Choices = []CompletionChoice{}
		}
		for i := range n {
			e.Choices = append(e.Choices, CompletionChoice{Index: i, Text: randString(r), Logprobs: randCompletionLogprobs(r),
				FinishReason: randOpt(r), PromptTokenIDs: randIDs(r), TokenIDs: randIDs(r), PromptLogprobs: randPromptLogprobs(r)})
		}
		return e
	}
	e := ChatCompletionChunk{ID: randString(r), Object: "chat.completion.chunk", Created: r.Int64N(1 << 40),
		Model: randString(r), Usage: randUsage(r), PromptTokenIDs: randIDs(r)}
	if n > 0 || r.IntN(2) == 0 {
		e.Choices = []ChatChunkChoice{}
	}
	for i := range n {
		d := ChatDelta{Content: randOpt(r), ReasoningContent: randOpt(r)}
		if r.IntN(2) == 0 {
			d.Role = randString(r)
		}
		if r.IntN(4) == 0 {
			d.ToolCalls = []ToolCallDelta{{Index: r.IntN(3), ID: randString(r), Type: randString(r),
				Function: FunctionCallDelta{Name: randString(r), Arguments: randString(r)}}}
		}
		e.Choices = append(e.Choices, ChatChunkChoice{Index: i, Delta: d, Logprobs: randChatLogprobs(r),
			FinishReason: randOpt(r), TokenIDs: randIDs(r)})
	}
	return e
}

// TestAppendEventMatchesEncodingJSON: the stream events' own encoder writes
// exactly what encoding/json (without HTML escaping) writes, for events
// with every field shape (nil and empty slices, absent and present
// optional fields, usage or none) and strings with every escape.
func TestAppendEventMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		ev := randEvent(r)
		want := marshalJSON(ev)
		if got := appendEvent(nil, ev); !bytes.Equal(got, want) {
			t.Fatalf("event %d (%#v):\n got %s\nwant %s", i, ev, got, want)
		}
	}
	// Pointers encode as their values; other types fall back to encoding/json.
	c := CompletionResponse{ID: "x", Choices: []CompletionChoice{{Text: "t"}}}
	if got, want := appendEvent([]byte("data: "), &c), append([]byte("data: "), marshalJSON(c)...); !bytes.Equal(got, want) {
		t.Fatalf("pointer: got %s, want %s", got, want)
	}
	body := BadRequest("stream", "x").Body()
	if got, want := appendEvent(nil, body), marshalJSON(body); !bytes.Equal(got, want) {
		t.Fatalf("fallback: got %s, want %s", got, want)
	}
}

// FuzzAppendEvent: for any text and ids, a stream event encodes as
// encoding/json encodes it.
func FuzzAppendEvent(f *testing.F) {
	f.Add("cmpl-1", "hello \"world\"\n", "stop", int32(5), true)
	f.Add("x", "\xff\u2028<>&", "", int32(-1), false)
	f.Fuzz(func(t *testing.T, id, text, finish string, tok int32, chat bool) {
		var ev any = CompletionResponse{ID: id, Object: "text_completion", Model: text,
			Choices: []CompletionChoice{{Text: text, FinishReason: &finish, TokenIDs: []int32{tok}}}}
		if chat {
			ev = ChatCompletionChunk{ID: id, Object: "chat.completion.chunk", Model: finish,
				Choices: []ChatChunkChoice{{Delta: ChatDelta{Role: finish, Content: &text}, TokenIDs: []int32{tok}}}}
		}
		if got, want := appendEvent(nil, ev), marshalJSON(ev); !bytes.Equal(got, want) {
			t.Fatalf("got %s, want %s", got, want)
		}
	})
}

// benchEvent is a typical stream event: one token with return_token_ids.
func benchEvent() CompletionResponse {
	return CompletionResponse{ID: "cmpl-0123456789abcdef0123456789abcdef", Object: "text_completion",
		Created: 1764633600, Model: "pdserve-sim", Choices: []CompletionChoice{{Text: " token", TokenIDs: []int32{1234}}}}
}

// BenchmarkStreamEvent: encoding one stream event, by encoding/json
// (marshalJSON, as before) and by appendEvent into a reused buffer.
func BenchmarkStreamEvent(b *testing.B) {
	ev := benchEvent()
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = marshalJSON(ev)
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendEvent(buf[:0], ev)
		}
	})
}

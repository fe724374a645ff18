package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// randLogprob returns a logprob of any magnitude, −∞ and NaN included.
func randLogprob(r *rand.Rand) float32 {
	switch r.IntN(8) {
	case 0:
		return float32(math.Inf(-1))
	case 1:
		return 0
	case 2:
		return -float32(r.Float64() * 1e-7) // exponent form
	case 3:
		return -float32(r.Float64() * 20000) // below the floor
	case 4:
		return float32(math.Float32frombits(r.Uint32()))
	}
	return -float32(r.ExpFloat64() * 3)
}

func randTop(r *rand.Rand) TopLogprobs {
	if r.IntN(5) == 0 {
		return nil
	}
	t := TopLogprobs{}
	for range r.IntN(4) {
		s := randString(r)
		if len(t) > 0 && r.IntN(4) == 0 {
			s = t[r.IntN(len(t))].Token // a string two ids decode to
		}
		t = append(t, StringLogprob{Token: s, Logprob: randLogprob(r)})
	}
	return t
}

func randCompletionLogprobs(r *rand.Rand) *CompletionLogprobs {
	if r.IntN(3) == 0 {
		return nil
	}
	l := &CompletionLogprobs{}
	if r.IntN(5) > 0 {
		n := r.IntN(4)
		l.TextOffset, l.TokenLogprobs, l.Tokens, l.TopLogprobs = []int{}, []float32{}, []string{}, []TopLogprobs{}
		for range n {
			l.TextOffset = append(l.TextOffset, r.IntN(1000))
			l.TokenLogprobs = append(l.TokenLogprobs, randLogprob(r))
			l.Tokens = append(l.Tokens, randString(r))
			l.TopLogprobs = append(l.TopLogprobs, randTop(r))
		}
	}
	return l
}

func randBytes(r *rand.Rand) []int {
	if r.IntN(4) == 0 {
		return nil
	}
	bs := []int{}
	for range r.IntN(5) {
		bs = append(bs, r.IntN(256))
	}
	return bs
}

func randChatLogprobs(r *rand.Rand) *ChatLogprobs {
	if r.IntN(3) == 0 {
		return nil
	}
	l := &ChatLogprobs{}
	if r.IntN(5) > 0 {
		l.Content = []ChatTokenLogprob{}
		for range r.IntN(4) {
			t := ChatTokenLogprob{Token: randString(r), Logprob: randLogprob(r), Bytes: randBytes(r), TopLogprobs: []ChatTopLogprob{}}
			for range r.IntN(3) {
				t.TopLogprobs = append(t.TopLogprobs, ChatTopLogprob{Token: randString(r), Logprob: randLogprob(r), Bytes: randBytes(r)})
			}
			l.Content = append(l.Content, t)
		}
	}
	return l
}

func randPromptLogprobs(r *rand.Rand) PromptLogprobs {
	if r.IntN(2) == 0 {
		return nil
	}
	p := PromptLogprobs{nil}
	for range r.IntN(4) {
		var pos []PromptLogprob
		for range 1 + r.IntN(3) {
			pos = append(pos, PromptLogprob{ID: r.Int32N(1 << 20), Logprob: randLogprob(r), Rank: 1 + r.Int32N(1000), DecodedToken: randString(r)})
		}
		p = append(p, pos)
	}
	return p
}

// refLogprob is a logprob as encoding/json writes a float32 (after the
// floor), or null for NaN: the reference appendLogprob must match.
func refLogprob(f float32) json.RawMessage {
	if math.IsNaN(float64(f)) {
		return json.RawMessage("null")
	}
	b, err := json.Marshal(max(f, LogprobFloor))
	if err != nil {
		panic(err)
	}
	return b
}

func refString(s string) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// refTop builds TopLogprobs' object with encoding/json for its keys and
// values.
func refTop(t TopLogprobs) json.RawMessage {
	if t == nil {
		return json.RawMessage("null")
	}
	b := []byte{'{'}
	seen := map[string]bool{}
	for _, e := range t {
		if seen[e.Token] {
			continue
		}
		if len(seen) > 0 {
			b = append(b, ',')
		}
		seen[e.Token] = true
		b = append(b, refString(e.Token)...)
		b = append(b, ':')
		b = append(b, refLogprob(e.Logprob)...)
	}
	return append(b, '}')
}

// TestLogprobsEncoding: the logprob shapes' encoders write what
// encoding/json writes for the same values (floats in float32 precision,
// strings without HTML escaping), with −∞ as the floor, NaN as null, a
// token string listed again dropped, and byte lists as numbers.
func TestLogprobsEncoding(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		f := randLogprob(r)
		if got, want := appendLogprob(nil, f), refLogprob(f); !bytes.Equal(got, want) {
			t.Fatalf("logprob %v (bits %#x): %s, encoding/json %s", f, math.Float32bits(f), got, want)
		}
		l := randCompletionLogprobs(r)
		if l == nil {
			continue
		}
		type plain struct {
			TextOffset    []int             `json:"text_offset"`
			TokenLogprobs []json.RawMessage `json:"token_logprobs"`
			Tokens        []string          `json:"tokens"`
			TopLogprobs   []json.RawMessage `json:"top_logprobs"`
		}
		ref := plain{TextOffset: l.TextOffset, Tokens: l.Tokens}
		if l.TokenLogprobs != nil {
			ref.TokenLogprobs = []json.RawMessage{}
			for _, f := range l.TokenLogprobs {
				ref.TokenLogprobs = append(ref.TokenLogprobs, refLogprob(f))
			}
		}
		if l.TopLogprobs != nil {
			ref.TopLogprobs = []json.RawMessage{}
			for _, t := range l.TopLogprobs {
				ref.TopLogprobs = append(ref.TopLogprobs, refTop(t))
			}
		}
		if got, want := marshalJSON(l), marshalJSON(ref); !bytes.Equal(got, want) {
			t.Fatalf("completion logprobs:\n got %s\nwant %s", got, want)
		}
	}
	for range 1000 {
		l := randChatLogprobs(r)
		if l == nil {
			continue
		}
		type alt struct {
			Token   string          `json:"token"`
			Logprob json.RawMessage `json:"logprob"`
			Bytes   []int           `json:"bytes"`
		}
		type tok struct {
			alt
			TopLogprobs []alt `json:"top_logprobs"`
		}
		var ref struct {
			Content []tok `json:"content"`
		}
		if l.Content != nil {
			ref.Content = []tok{}
		}
		for _, c := range l.Content {
			t := tok{alt: alt{c.Token, refLogprob(c.Logprob), c.Bytes}, TopLogprobs: []alt{}}
			for _, a := range c.TopLogprobs {
				t.TopLogprobs = append(t.TopLogprobs, alt{a.Token, refLogprob(a.Logprob), a.Bytes})
			}
			ref.Content = append(ref.Content, t)
		}
		if got, want := marshalJSON(l), marshalJSON(ref); !bytes.Equal(got, want) {
			t.Fatalf("chat logprobs:\n got %s\nwant %s", got, want)
		}
	}
	for range 1000 {
		p := randPromptLogprobs(r)
		var ref []json.RawMessage
		for _, pos := range p {
			if pos == nil {
				ref = append(ref, json.RawMessage("null"))
				continue
			}
			b := []byte{'{'}
			for i, e := range pos {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, refString(strconv.Itoa(int(e.ID)))...)
				b = append(b, ':')
				b = append(b, marshalJSON(struct {
					Logprob json.RawMessage `json:"logprob"`
					Rank    int32           `json:"rank"`
					Decoded string          `json:"decoded_token"`
				}{refLogprob(e.Logprob), e.Rank, e.DecodedToken})...)
			}
			ref = append(ref, append(b, '}'))
		}
		if got, want := marshalJSON(p), marshalJSON(ref); !bytes.Equal(got, want) {
			t.Fatalf("prompt logprobs:\n got %s\nwant %s", got, want)
		}
	}
}

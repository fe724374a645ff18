package workerapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
)

// StreamLine is one line of the NDJSON stream of [PathDecode] and
// [PathGenerate]. Lines carry tokens; the last line carries FinishReason
// (with usage) or Error (with the HTTP status the leg would have answered).
// A last line may carry tokens too: they came before the end.
//
// A request with n > 1 choices: each line carries tokens of one choice
// (Index); a choice's end is a line with its FinishReason and More set
// (others go on), the last line the one without More.
type StreamLine struct {
	TokenIDs []int32   `json:"token_ids,omitempty"`
	Logprobs []float32 `json:"logprobs,omitempty"`
	// Index is the choice of the line's tokens and FinishReason.
	Index int `json:"index,omitempty"`
	// TopLogprobs, when the request asks for them, holds each token's most
	// likely alternatives (TopLogprobs[i] for TokenIDs[i]).
	TopLogprobs [][]model.TokenLogprob `json:"top_logprobs,omitempty"`
	// PromptLogprobs (a colocated leg asking for them) is on the first
	// line: one entry per prompt token, the first empty.
	PromptLogprobs []model.PositionLogprobs `json:"prompt_logprobs,omitempty"`
	FinishReason   string                   `json:"finish_reason,omitempty"`
	// More, with FinishReason, says only choice Index ended: the stream
	// goes on.
	More         bool `json:"more,omitempty"`
	PromptTokens int  `json:"prompt_tokens,omitempty"`
	OutputTokens int  `json:"completion_tokens,omitempty"`
	// CachedTokens (last line) is how many prompt tokens the serving
	// workers did not compute because their prefix cache held the KV
	// (lifecycle.Finalize.CachedTokens): usage.prompt_tokens_details.cached_tokens.
	CachedTokens int          `json:"cached_tokens,omitempty"`
	Error        *ErrorObject `json:"error,omitempty"`
	Status       int          `json:"status,omitempty"`
}

// ErrorLine returns the last line of a stream that failed with e, carrying
// the tokens of line (which came before the failure).
func ErrorLine(line StreamLine, e *Error) StreamLine {
	b := e.Body()
	line.Error, line.Status, line.FinishReason, line.More = &b.Error, e.Status, "", false
	return line
}

// Decode turns a line into the tokens it carries (with the finish reason on
// the last line of a request that finished) and, for an error line, the
// leg's failure. It is the one decoder of a worker's stream: the router
// uses it on lines read from a worker, the colocated worker on its own
// lines in process. A logprob missing for a token is 0.
func (l *StreamLine) Decode() (openai.Chunk, *Error) {
	c := openai.Chunk{Index: l.Index, FinishReason: l.FinishReason, Done: l.FinishReason != "" && !l.More,
		CachedTokens: l.CachedTokens, PromptLogprobs: l.PromptLogprobs}
	if len(l.TokenIDs) > 0 {
		c.Tokens = make([]openai.Token, len(l.TokenIDs))
		for i, id := range l.TokenIDs {
			c.Tokens[i] = openai.Token{ID: id}
			if i < len(l.Logprobs) {
				c.Tokens[i].Logprob = l.Logprobs[i]
			}
			if i < len(l.TopLogprobs) {
				c.Tokens[i].Top = l.TopLogprobs[i]
			}
		}
	}
	if l.Error == nil {
		return c, nil
	}
	c.FinishReason, c.Done = "", false
	o := l.Error
	status := l.Status
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
		if o.Outcome != outcome.None && o.Outcome != outcome.OK {
			status = o.Outcome.Status()
		}
	}
	e := &Error{Status: status, Type: o.Type, Message: o.Message, Outcome: o.Outcome, Cause: o.Cause}
	if o.Param != nil {
		e.Param = *o.Param
	}
	if o.Code != nil {
		e.Code = *o.Code
	}
	if e.Type == "" {
		e.Type = openai.TypeServer
		if status < 500 {
			e.Type = openai.TypeInvalidRequest
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	e.fillOutcome()
	return c, e
}

// ParseStreamLine decodes one NDJSON line of a stream. A token line as
// workers write it ({"token_ids":[…],"logprobs":[…]}, and on the last line
// its finish reason and usage) is read without reflection: it is the one a router reads for every token;
// any other line goes through encoding/json. Either way the result is
// json.Unmarshal's.
func ParseStreamLine(b []byte) (StreamLine, error) {
	if l, ok := parseTokenLine(b); ok {
		return l, nil
	}
	var l StreamLine
	err := json.Unmarshal(b, &l)
	return l, err
}

// parseTokenLine reads exactly {"token_ids":[ints],"logprobs":[floats]},
// optionally followed by "finish_reason", "prompt_tokens",
// "completion_tokens" and "cached_tokens" in that order (no spaces, as encoding/json writes a
// StreamLine); false for anything else.
func parseTokenLine(b []byte) (StreamLine, bool) {
	const head, mid = `{"token_ids":[`, `],"logprobs":[`
	if len(b) < len(head) || string(b[:len(head)]) != head {
		return StreamLine{}, false
	}
	b = b[len(head):]
	i := bytes.IndexByte(b, ']')
	if i < 1 || len(b) < i+len(mid) || string(b[i:i+len(mid)]) != mid {
		return StreamLine{}, false
	}
	ids, rest := b[:i], b[i+len(mid):]
	j := bytes.IndexByte(rest, ']')
	if j < 1 {
		return StreamLine{}, false
	}
	lps, tail := rest[:j], rest[j+1:]
	var l StreamLine
	// The last line of a finished request: its finish reason and usage,
	// in the struct's order.
	if s, ok := bytes.CutPrefix(tail, []byte(`,"finish_reason":"`)); ok {
		k := bytes.IndexByte(s, '"')
		if k < 1 {
			return StreamLine{}, false
		}
		for _, c := range s[:k] {
			if (c < 'a' || c > 'z') && c != '_' {
				return StreamLine{}, false
			}
		}
		l.FinishReason, tail = string(s[:k]), s[k+1:]
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{`,"prompt_tokens":`, &l.PromptTokens}, {`,"completion_tokens":`, &l.OutputTokens}, {`,"cached_tokens":`, &l.CachedTokens}} {
		s, ok := bytes.CutPrefix(tail, []byte(f.key))
		if !ok {
			continue
		}
		k := 0
		for k < len(s) && (s[k] == '-' || (s[k] >= '0' && s[k] <= '9')) {
			k++
		}
		if !jsonNumber(s[:k]) {
			return StreamLine{}, false
		}
		v, err := strconv.ParseInt(string(s[:k]), 10, 0)
		if err != nil {
			return StreamLine{}, false
		}
		*f.v, tail = int(v), s[k:]
	}
	if string(tail) != "}" {
		return StreamLine{}, false
	}
	n := bytes.Count(ids, []byte{','}) + 1
	if bytes.Count(lps, []byte{','})+1 != n {
		return StreamLine{}, false
	}
	l.TokenIDs, l.Logprobs = make([]int32, 0, n), make([]float32, 0, n)
	for f := range bytes.SplitSeq(ids, []byte{','}) {
		if !jsonNumber(f) || bytes.ContainsAny(f, ".eE") {
			return StreamLine{}, false
		}
		v, err := strconv.ParseInt(string(f), 10, 32)
		if err != nil {
			return StreamLine{}, false
		}
		l.TokenIDs = append(l.TokenIDs, int32(v))
	}
	for f := range bytes.SplitSeq(lps, []byte{','}) {
		if !jsonNumber(f) {
			return StreamLine{}, false // let encoding/json say what is wrong
		}
		v, err := strconv.ParseFloat(string(f), 32)
		if err != nil {
			return StreamLine{}, false
		}
		l.Logprobs = append(l.Logprobs, float32(v))
	}
	return l, true
}

// jsonNumber reports whether b is a number as JSON spells it (RFC 8259 §6):
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(b []byte) bool {
	i := 0
	digits := func() int {
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

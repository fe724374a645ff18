package workerapi

import (
	"net/http"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
)

// StreamLine is one line of the NDJSON stream of [PathDecode] and
// [PathGenerate]. Lines carry tokens; the last line carries FinishReason
// (with usage) or Error (with the HTTP status the leg would have answered).
// A last line may carry tokens too: they came before the end.
type StreamLine struct {
	TokenIDs     []int32      `json:"token_ids,omitempty"`
	Logprobs     []float32    `json:"logprobs,omitempty"`
	FinishReason string       `json:"finish_reason,omitempty"`
	PromptTokens int          `json:"prompt_tokens,omitempty"`
	OutputTokens int          `json:"completion_tokens,omitempty"`
	Error        *ErrorObject `json:"error,omitempty"`
	Status       int          `json:"status,omitempty"`
}

// ErrorLine returns the last line of a stream that failed with e, carrying
// the tokens of line (which came before the failure).
func ErrorLine(line StreamLine, e *Error) StreamLine {
	b := e.Body()
	line.Error, line.Status, line.FinishReason = &b.Error, e.Status, ""
	return line
}

// Decode turns a line into the tokens it carries (with the finish reason on
// the last line of a request that finished) and, for an error line, the
// leg's failure. It is the one decoder of a worker's stream: the router
// uses it on lines read from a worker, the colocated worker on its own
// lines in process. A logprob missing for a token is 0.
func (l *StreamLine) Decode() (openai.Chunk, *Error) {
	c := openai.Chunk{FinishReason: l.FinishReason}
	if len(l.TokenIDs) > 0 {
		c.Tokens = make([]openai.Token, len(l.TokenIDs))
		for i, id := range l.TokenIDs {
			c.Tokens[i] = openai.Token{ID: id}
			if i < len(l.Logprobs) {
				c.Tokens[i].Logprob = l.Logprobs[i]
			}
		}
	}
	if l.Error == nil {
		return c, nil
	}
	c.FinishReason = ""
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

package workerapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
)

// ErrorObject is the "error" member of a worker's error answer and of a
// stream's error line: OpenAI's fields, then the outcome and the request's
// first failure.
type ErrorObject struct {
	openai.ErrorObject
	// Outcome is how the leg ended (absent when the answer is no outcome:
	// a malformed request the worker refused before admitting it).
	Outcome outcome.Outcome `json:"outcome,omitempty"`
	// Cause is the request's first failure: this leg's own, or, for
	// aborted_peer, the other leg's when it is known.
	Cause outcome.Cause `json:"cause,omitzero"`
}

// ErrorBody is the JSON body of a worker's error answer.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// Error is a leg's failure: the OpenAI error a client would be given, with
// the outcome and first cause typed. A worker's answers decode to it
// ([DecodeError], [StreamLine.Decode]); the router's own view of a leg (a
// worker it cannot reach) is one too. Its Unwrap gives the OpenAI error, so
// openai.ToError answers a client with it as is.
type Error struct {
	// Status, Type, Message, Param and Code are the OpenAI error's (see
	// openai.Error); Code is the outcome's name in a worker's answers.
	Status  int
	Type    string
	Message string
	Param   string
	Code    string
	// Outcome is how the leg ended. Never None for an Error from a decoder:
	// an answer that names no outcome is given rejected_invalid (4xx) or
	// failed_internal (5xx).
	Outcome outcome.Outcome
	// Cause is the first failure of the request, zero when unknown.
	Cause outcome.Cause
	// RetryAfter is the Retry-After of an overloaded answer (0: the
	// default, OverloadRetryAfter); the header carries it, whole seconds.
	RetryAfter time.Duration
}

// Error returns "<status> <code>: <message>".
func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// OpenAI returns the error as the client is told it.
func (e *Error) OpenAI() *openai.Error {
	oe := &openai.Error{Status: e.Status, Type: e.Type, Message: e.Message, Param: e.Param, Code: e.Code}
	switch e.Outcome {
	case outcome.Draining:
		oe.RetryAfter = DrainRetryAfter
	case outcome.Overloaded:
		oe.RetryAfter = e.RetryAfter
		if oe.RetryAfter <= 0 {
			oe.RetryAfter = OverloadRetryAfter
		}
	}
	return oe
}

// DrainRetryAfter is the Retry-After of a draining worker's 503: another
// worker (or this one, restarted) takes the request by then.
const DrainRetryAfter = time.Second

// OverloadRetryAfter is the default Retry-After of a 429 overloaded answer
// (a worker's full queue, or the router shedding load): long enough for a
// few requests to finish on a busy fleet, short enough that a client does
// not idle a recovered one (SGLang's and vLLM's clients retry after 1 s too).
const OverloadRetryAfter = time.Second

// Unwrap returns the OpenAI error, for errors.As and openai.ToError.
func (e *Error) Unwrap() error { return e.OpenAI() }

// Root returns the error the request's first failure answers with: for an
// aborted_peer echo whose Cause is known, the root cause's own error
// ([CauseError]); otherwise e.
func (e *Error) Root() *Error {
	if e.Outcome.PeerCaused() && e.Cause.Known() {
		return CauseError(e.Cause)
	}
	return e
}

// FirstCause returns e's Cause if it is known, or else e itself as a cause on
// role: the first failure to hand to the other leg.
func (e *Error) FirstCause(role Role) outcome.Cause {
	if e.Cause.Known() {
		return e.Cause
	}
	if e.Outcome == outcome.None || e.Outcome.PeerCaused() {
		return outcome.Cause{}
	}
	return outcome.Cause{Outcome: e.Outcome, Role: role.String(), Detail: e.Message}
}

// Body returns the JSON body of e.
func (e *Error) Body() ErrorBody {
	return ErrorBody{Error: ErrorObject{ErrorObject: e.OpenAI().Body().Error, Outcome: e.Outcome, Cause: e.Cause}}
}

// NewError returns the error of a leg that ended with o: the status is
// o.Status(), the type follows it (invalid_request_error for 4xx), the code is
// o's name, and message is sent as is.
func NewError(o outcome.Outcome, message string, cause outcome.Cause) *Error {
	typ := openai.TypeServer
	if o.ClientError() {
		typ = openai.TypeInvalidRequest
	}
	return &Error{Status: o.Status(), Type: typ, Message: message, Code: o.String(), Outcome: o, Cause: cause}
}

// OutcomeError is how a worker answers a request that ended with o for
// reason detail: NewError with the message "<o>: <detail>".
func OutcomeError(o outcome.Outcome, detail string, cause outcome.Cause) *Error {
	return NewError(o, fmt.Sprintf("%s: %s", o, detail), cause)
}

// CauseError is the error the side where c happened answered (or would
// have): OutcomeError of c's outcome and detail.
func CauseError(c outcome.Cause) *Error { return OutcomeError(c.Outcome, c.Detail, c) }

// WriteError writes err as a worker's JSON error answer: an *Error anywhere
// in err's chain with its outcome and cause, anything else as
// openai.WriteError does. It must be called before anything else is
// written to w.
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		openai.WriteError(w, err)
		return
	}
	b, mErr := json.Marshal(e.Body())
	if mErr != nil {
		openai.WriteError(w, openai.Internal("encode error answer: %v", mErr))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if ra := e.OpenAI().RetryAfter; ra > 0 {
		h.Set("Retry-After", strconv.Itoa(int((ra+time.Second-1)/time.Second)))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(b, '\n'))
}

// DecodeError turns an error answer (its status and at most MaxLineBytes of
// body) back into an *Error. The OpenAI fields are read as
// openai.DecodeError reads them (a body that is no error JSON becomes the
// message); the outcome and cause, when present and valid, are read as
// values. An answer that names no outcome is given one by its status.
func DecodeError(status int, body []byte) *Error {
	oe := openai.DecodeError(status, body)
	e := &Error{Status: oe.Status, Type: oe.Type, Message: oe.Message, Param: oe.Param, Code: oe.Code}
	var ext struct {
		Error *struct {
			Outcome outcome.Outcome `json:"outcome"`
			Cause   outcome.Cause   `json:"cause"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &ext) == nil && ext.Error != nil {
		e.Outcome, e.Cause = ext.Error.Outcome, ext.Error.Cause
	}
	e.fillOutcome()
	return e
}

// fillOutcome gives an error that names no outcome the one its status
// implies: rejected_invalid for 4xx, failed_internal otherwise.
func (e *Error) fillOutcome() {
	if e.Outcome != outcome.None {
		return
	}
	e.Outcome = outcome.FailedInternal
	if e.Status >= 400 && e.Status < 500 {
		e.Outcome = outcome.RejectedInvalid
	}
}

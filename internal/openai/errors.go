package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Error types, as the official OpenAI API spells them in the "type" field of
// an error body. The API uses invalid_request_error for every client error it
// can attribute to the request (400, 404 unknown model or URL, 405, 413) and
// server_error for 5xx answers, including 503 "overloaded" (vLLM's
// "NotFoundError"-style names are not used).
const (
	// TypeInvalidRequest marks a 4xx error caused by the request.
	TypeInvalidRequest = "invalid_request_error"
	// TypeServer marks a 5xx error on our side.
	TypeServer = "server_error"
)

// Codes carried in the "code" field of an error body.
const (
	// CodeModelNotFound: the request names a model this server does not serve.
	CodeModelNotFound = "model_not_found"
	// CodeContextLengthExceeded: prompt plus max_tokens exceed the context.
	CodeContextLengthExceeded = "context_length_exceeded"
	// CodeRequestTooLarge: the request body exceeds the configured limit.
	CodeRequestTooLarge = "request_too_large"
	// CodeUnsupported: a parameter value that pdserve does not implement.
	CodeUnsupported = "unsupported_parameter"
)

// StatusClientClosedRequest (499, nginx's convention) is the status given to
// a request whose client went away (context.Canceled). Nobody reads it; it
// shows up in logs and metrics.
const StatusClientClosedRequest = 499

// Error is an error with an HTTP status and an OpenAI error body
// {"error":{"message","type","param","code"}}. Engines return it to control
// what the client sees.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Type is the OpenAI error type (TypeInvalidRequest, TypeServer).
	Type string
	// Message is the human-readable message sent to the client.
	Message string
	// Param names the offending request parameter; "" is sent as null.
	Param string
	// Code is a machine-readable code (e.g. CodeModelNotFound); "" is sent
	// as null.
	Code string
	// RetryAfter, if positive, is sent as the Retry-After header (whole
	// seconds, rounded up): the server is draining or overloaded and the
	// client may try again then.
	RetryAfter time.Duration
}

// Error returns "<status> <type>: <message>".
func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// Body returns the JSON body of the error.
func (e *Error) Body() ErrorBody {
	o := ErrorObject{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		p := e.Param
		o.Param = &p
	}
	if e.Code != "" {
		c := e.Code
		o.Code = &c
	}
	return ErrorBody{Error: o}
}

// ErrorBody is the JSON body of every error answer, and the payload of the
// error event of a stream that failed after output started.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is the "error" member of an ErrorBody.
type ErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// BadRequest returns a 400 invalid_request_error about param (may be "").
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// Unsupported returns a 400 invalid_request_error with code
// CodeUnsupported: param is valid OpenAI but pdserve does not implement the
// value given.
func Unsupported(param, format string, args ...any) *Error {
	e := BadRequest(param, format, args...)
	e.Code = CodeUnsupported
	return e
}

// NotFound returns a 404 invalid_request_error (e.g. an unknown URL).
func NotFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

// MaxEchoedModel bounds the bytes of a requested model name that
// ModelNotFound repeats in its message; a longer name is cut there (at a
// character boundary) and marked with "…".
const MaxEchoedModel = 256

// ModelNotFound returns the 404 for a request naming a model this server
// does not serve: param "model", code CodeModelNotFound. The message names
// the model, cut to MaxEchoedModel bytes.
func ModelNotFound(name string) *Error {
	if len(name) > MaxEchoedModel {
		cut := MaxEchoedModel
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		name = name[:cut] + "…"
	}
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "model",
		Code: CodeModelNotFound, Message: fmt.Sprintf("The model `%s` does not exist.", name)}
}

// MethodNotAllowed returns the 405 for a known path called with a wrong method.
func MethodNotAllowed(method, path string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest,
		Message: fmt.Sprintf("Method %s is not allowed for %s", method, path)}
}

// TooLarge returns the 413 for a request body over limit bytes.
func TooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: CodeRequestTooLarge,
		Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
}

// Unavailable returns a 503 server_error: the request could not be served
// now (no worker, overloaded, shutting down) and may be retried.
func Unavailable(format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServer, Message: fmt.Sprintf(format, args...)}
}

// Timeout returns a 504 server_error: a deadline of the request expired.
func Timeout(format string, args ...any) *Error {
	return &Error{Status: http.StatusGatewayTimeout, Type: TypeServer, Message: fmt.Sprintf(format, args...)}
}

// Internal returns a 500 server_error.
func Internal(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: TypeServer, Message: fmt.Sprintf(format, args...)}
}

// ToError maps any error to the *Error the client sees:
//   - an *Error anywhere in err's chain: itself (a copy with status 500
//     if its Status is not 4xx/5xx, with Type and Message filled if empty);
//   - *http.MaxBytesError: 413 (TooLarge);
//   - context.Canceled: 499 (the client went away);
//   - context.DeadlineExceeded: 504 (Timeout);
//   - anything else: 500 (Internal) carrying err's text.
//
// nil maps to nil.
func ToError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return normalize(e)
	}
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		return TooLarge(mb.Limit)
	case errors.Is(err, context.Canceled):
		return &Error{Status: StatusClientClosedRequest, Type: TypeInvalidRequest, Message: "the client closed the request"}
	case errors.Is(err, context.DeadlineExceeded):
		return Timeout("request timed out")
	}
	return Internal("internal error: %v", err)
}

// normalize returns e, or a corrected copy if e could not be sent as is: a
// nil *Error, a status that is not an error status (4xx or 5xx), or an empty
// type or message.
func normalize(e *Error) *Error {
	if e == nil {
		return Internal("internal error: nil *Error")
	}
	if e.Status >= 400 && e.Status <= 599 && e.Type != "" && e.Message != "" {
		return e
	}
	c := *e
	if c.Status < 400 || c.Status > 599 {
		c.Status = http.StatusInternalServerError
	}
	if c.Type == "" {
		c.Type = TypeInvalidRequest
		if c.Status >= 500 {
			c.Type = TypeServer
		}
	}
	if c.Message == "" {
		c.Message = http.StatusText(c.Status)
		if c.Message == "" {
			c.Message = "error"
		}
	}
	return &c
}

// WriteError writes err, mapped by ToError, as a JSON error answer: status
// and body. It must be called before anything else is written to w.
func WriteError(w http.ResponseWriter, err error) {
	e := ToError(err)
	if e == nil {
		e = Internal("internal error: no error given")
	}
	b := marshalJSON(e.Body())
	noteCode(w, codeOf(e))
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.Status == http.StatusMethodNotAllowed && h.Get("Allow") == "" {
		h.Set("Allow", "GET, POST")
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

// DecodeError turns an error answer (its status and body) received from
// another pdserve component or OpenAI-compatible server back into an *Error.
// A body that is not an OpenAI error gives an *Error with the status, a type
// chosen by status class and the start of the body as message.
func DecodeError(status int, body []byte) *Error {
	var b struct {
		Error *struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   *string         `json:"param"`
			Code    json.RawMessage `json:"code"` // vLLM sends a number
		} `json:"error"`
	}
	typ := TypeInvalidRequest
	if status >= 500 {
		typ = TypeServer
	}
	if err := json.Unmarshal(body, &b); err != nil || b.Error == nil {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 512 {
			msg = msg[:512] + "…"
		}
		if msg == "" {
			msg = http.StatusText(status)
		}
		return &Error{Status: status, Type: typ, Message: strings.ToValidUTF8(msg, "\uFFFD")}
	}
	e := &Error{Status: status, Type: b.Error.Type, Message: b.Error.Message}
	if e.Type == "" {
		e.Type = typ
	}
	if b.Error.Param != nil {
		e.Param = *b.Error.Param
	}
	var code string
	if json.Unmarshal(b.Error.Code, &code) == nil {
		e.Code = code
	}
	return e
}

// CodeAbortedClient is the code an answer is counted with (Config.OnAnswer)
// when its client went away after the 200 of a stream: outcome
// aborted_client. It is never sent to a client.
const CodeAbortedClient = "aborted_client"

// Codes given by codeOf to error answers that carry no code of their own.
const (
	CodeInvalidRequest       = "invalid_request"
	CodeNotFound             = "not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeRequestTimeout       = "request_timeout"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeServerError          = "server_error"
)

// codeOf is an error answer's code as a label: its own, or one named by its
// status.
func codeOf(e *Error) string {
	if e.Code != "" {
		return e.Code
	}
	switch e.Status {
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusMethodNotAllowed:
		return CodeMethodNotAllowed
	case http.StatusRequestTimeout:
		return CodeRequestTimeout
	case http.StatusRequestEntityTooLarge:
		return CodeRequestTooLarge
	case http.StatusUnsupportedMediaType:
		return CodeUnsupportedMediaType
	}
	if e.Status >= 500 {
		return CodeServerError
	}
	return CodeInvalidRequest
}

package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// TestErrorMapping lists every constructor and every error ToError knows,
// with the status and body the client sees.
func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		typ    string
		param  string
		code   string
		msg    string
	}{
		{"BadRequest", BadRequest("top_p", "top_p must be %s", "positive"), 400, TypeInvalidRequest, "top_p", "", "top_p must be positive"},
		{"Unsupported", Unsupported("n", "n must be 1"), 400, TypeInvalidRequest, "n", CodeUnsupported, "n must be 1"},
		{"NotFound", NotFound("Invalid URL (GET /v1/x)"), 404, TypeInvalidRequest, "", "", "Invalid URL (GET /v1/x)"},
		{"ModelNotFound", ModelNotFound("gpt-9"), 404, TypeInvalidRequest, "model", CodeModelNotFound, "The model `gpt-9` does not exist."},
		{"MethodNotAllowed", MethodNotAllowed("GET", "/v1/completions"), 405, TypeInvalidRequest, "", "", "Method GET is not allowed for /v1/completions"},
		{"TooLarge", TooLarge(10), 413, TypeInvalidRequest, "", CodeRequestTooLarge, "request body exceeds the limit of 10 bytes"},
		{"Unavailable", Unavailable("no decode worker"), 503, TypeServer, "", "", "no decode worker"},
		{"Timeout", Timeout("queue timeout"), 504, TypeServer, "", "", "queue timeout"},
		{"Internal", Internal("bug %d", 7), 500, TypeServer, "", "", "bug 7"},
		{"wrapped *Error", fmt.Errorf("leg: %w", Unavailable("gone")), 503, TypeServer, "", "", "gone"},
		{"MaxBytesError", &http.MaxBytesError{Limit: 4}, 413, TypeInvalidRequest, "", CodeRequestTooLarge, "request body exceeds the limit of 4 bytes"},
		{"context.Canceled", fmt.Errorf("recv: %w", context.Canceled), StatusClientClosedRequest, TypeInvalidRequest, "", "", "the client closed the request"},
		{"context.DeadlineExceeded", context.DeadlineExceeded, 504, TypeServer, "", "", "request timed out"},
		{"other", errors.New("boom"), 500, TypeServer, "", "", "internal error: boom"},
		{"nil *Error", (*Error)(nil), 500, TypeServer, "", "", "internal error: nil *Error"},
		{"zero status", &Error{Message: "m"}, 500, TypeServer, "", "", "m"},
		{"empty type and message", &Error{Status: 409, Code: "c"}, 409, TypeInvalidRequest, "", "c", "Conflict"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ToError(tt.err)
			got := Error{Status: e.Status, Type: e.Type, Param: e.Param, Code: e.Code, Message: e.Message}
			want := Error{Status: tt.status, Type: tt.typ, Param: tt.param, Code: tt.code, Message: tt.msg}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ToError (-want +got):\n%s", diff)
			}

			rec := httptest.NewRecorder()
			WriteError(rec, tt.err)
			if rec.Code != tt.status {
				t.Errorf("WriteError status = %d, want %d", rec.Code, tt.status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var body map[string]map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			eo := body["error"]
			wantBody := map[string]any{"message": tt.msg, "type": tt.typ, "param": nilIfEmpty(tt.param), "code": nilIfEmpty(tt.code)}
			if diff := cmp.Diff(wantBody, eo); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
	if ToError(nil) != nil {
		t.Error("ToError(nil) != nil")
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestModelNotFoundBoundsTheName: the 404 repeats at most MaxEchoedModel
// bytes of the requested name, cut at a character boundary and marked
// "…"; a name of MaxEchoedModel bytes is repeated whole.
func TestModelNotFoundBoundsTheName(t *testing.T) {
	exact := strings.Repeat("m", MaxEchoedModel)
	if got, want := ModelNotFound(exact).Message, "The model `"+exact+"` does not exist."; got != want {
		t.Errorf("a %d-byte name: %q, want it whole", len(exact), got)
	}
	for _, name := range []string{
		strings.Repeat("a", 1<<20),
		strings.Repeat("a", MaxEchoedModel-1) + strings.Repeat("é", 100), // é straddles the cut
	} {
		msg := ModelNotFound(name).Message
		want := "The model `" + name[:MaxEchoedModel-1]
		if !strings.HasPrefix(msg, want) || !strings.HasSuffix(msg, "…` does not exist.") ||
			len(msg) > MaxEchoedModel+len("The model `…` does not exist.") || !utf8.ValidString(msg) {
			t.Errorf("a %d-byte name: %d-byte message %.300q..., want the name's first %d bytes at most, then …", len(name), len(msg), msg, MaxEchoedModel)
		}
	}
}

func TestWriteErrorExactBody(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, BadRequest("max_tokens", "max_tokens must be at least 1, got 0"))
	want := `{"error":{"message":"max_tokens must be at least 1, got 0","type":"invalid_request_error","param":"max_tokens","code":null}}`
	if got := rec.Body.String(); got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
	rec = httptest.NewRecorder()
	WriteError(rec, MethodNotAllowed("PUT", "/v1/models"))
	if a := rec.Header().Get("Allow"); a == "" {
		t.Error("405 without Allow header")
	}
}

func TestDecodeError(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   Error
	}{
		{"openai", 404, `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
			Error{Status: 404, Type: TypeInvalidRequest, Message: "The model `x` does not exist.", Param: "model", Code: CodeModelNotFound}},
		{"vllm numeric code", 400, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`,
			Error{Status: 400, Type: "BadRequestError", Message: "bad"}},
		{"no type", 503, `{"error":{"message":"busy"}}`, Error{Status: 503, Type: TypeServer, Message: "busy"}},
		{"plain text", 502, "bad gateway\n", Error{Status: 502, Type: TypeServer, Message: "bad gateway"}},
		{"empty", 429, "", Error{Status: 429, Type: TypeInvalidRequest, Message: "Too Many Requests"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(&tt.want, DecodeError(tt.status, []byte(tt.body))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// A round trip through WriteError is lossless.
	for _, e := range []*Error{ModelNotFound("m"), Unavailable("x"), Unsupported("n", "n")} {
		rec := httptest.NewRecorder()
		WriteError(rec, e)
		if diff := cmp.Diff(e, DecodeError(rec.Code, rec.Body.Bytes())); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
}

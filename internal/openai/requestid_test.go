package openai

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRequestIDHeader: a client's X-Request-Id is the request's id — the
// engine's RID, the response's id — and comes back in the answer's
// X-Request-Id; without one the minted id does; a malformed one is a 400
// naming the header, never passed on.
func TestRequestIDHeader(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("ok"), FinishReason: "length"})
	srv := newServer(t, eng)
	send := func(id, body string) (*http.Response, string) {
		t.Helper()
		h := map[string]string{}
		if id != "" {
			h[HeaderRequestID] = id
		}
		return doWith(t, srv, http.MethodPost, "/v1/completions", body, h)
	}
	resp, body := send("client-42.a:b", `{"prompt":"hi","max_tokens":2}`)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderRequestID) != "client-42.a:b" || !strings.Contains(body, `"id":"cmpl-client-42.a:b"`) {
		t.Fatalf("%d %q: %s", resp.StatusCode, resp.Header.Get(HeaderRequestID), body)
	}
	eng.nextStream(t)
	if got := eng.lastReq(t).RID; got != "client-42.a:b" {
		t.Fatalf("engine got rid %q", got)
	}
	resp, _ = send("", `{"prompt":"hi","max_tokens":2,"stream":true}`)
	if resp.Header.Get(HeaderRequestID) != "rid1" {
		t.Fatalf("minted id not echoed: %q", resp.Header.Get(HeaderRequestID))
	}
	eng.nextStream(t)
	n := len(eng.reqs)
	for _, bad := range []string{"has space", "a/b", strings.Repeat("x", MaxRequestIDBytes+1), "é", ".", ".."} {
		resp, body := send(bad, `{"prompt":"hi","max_tokens":2}`)
		// The answer carries a minted id, never the malformed one.
		if resp.StatusCode != 400 || !strings.Contains(body, `"param":"X-Request-Id"`) || resp.Header.Get(HeaderRequestID) != "rid1" {
			t.Errorf("X-Request-Id %q: %d %s (echoed %q)", bad, resp.StatusCode, body, resp.Header.Get(HeaderRequestID))
		}
	}
	if _, body := send("é", `{"prompt":"hi","max_tokens":2}`); !strings.Contains(body, `'é'`) {
		t.Errorf("a non-ASCII id's message should show the character: %s", body)
	}
	if len(eng.reqs) != n {
		t.Fatal("a request with a malformed X-Request-Id reached the engine")
	}
	// An error answer carries the id too.
	resp, _ = send("err-1", `{"prompt":"hi","max_tokens":-1}`)
	if resp.StatusCode != 400 || resp.Header.Get(HeaderRequestID) != "err-1" {
		t.Fatalf("error answer: %d %q", resp.StatusCode, resp.Header.Get(HeaderRequestID))
	}
}

// TestServerTiming: streamed and non-streamed answers carry the front
// end's steps as Server-Timing: admit, parse, pick, legs, each a
// non-negative duration in milliseconds.
func TestServerTiming(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("ok"), FinishReason: "length"})
	srv := newServer(t, eng)
	re := regexp.MustCompile(`^admit;dur=\d+\.\d{3}, parse;dur=\d+\.\d{3}, pick;dur=\d+\.\d{3}, legs;dur=\d+\.\d{3}$`)
	for _, stream := range []string{"false", "true"} {
		resp, body := post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":2,"stream":`+stream+`}`)
		eng.nextStream(t)
		if st := resp.Header.Get("Server-Timing"); resp.StatusCode != 200 || !re.MatchString(st) {
			t.Errorf("stream %s: %d Server-Timing %q (%s)", stream, resp.StatusCode, st, body)
		}
	}
}

// TestOnRefuse: the front end reports every request it answers before the
// engine takes it — a bad header, a bad body, Admit's refusal — with its
// id and error, and no request the engine took.
func TestOnRefuse(t *testing.T) {
	type refusal struct {
		rid    string
		status int
	}
	var got []refusal
	admit := error(nil)
	eng := newFakeEngine(Chunk{Tokens: toks("ok"), FinishReason: "length"})
	srv := newServer(t, eng, func(c *Config) {
		c.OnRefuse = func(_ context.Context, rid string, received time.Time, e *Error) {
			if received.IsZero() {
				t.Error("no arrival time")
			}
			got = append(got, refusal{rid, e.Status})
		}
		c.Admit = func() error { return admit }
	})
	post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":2}`) // taken
	eng.nextStream(t)
	post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":-1}`)
	admit = &Error{Status: http.StatusTooManyRequests, Type: TypeServer, Code: "overloaded", Message: "busy"}
	post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":2}`)
	want := []refusal{{"rid1", http.StatusBadRequest}, {"rid1", http.StatusTooManyRequests}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("refusals %+v, want %+v", got, want)
	}
}

package openai

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestInputGaps: invalid UTF-8 is refused naming the field (encoding/json
// would turn it into U+FFFD), a Content-Encoding the server does not decode
// gets 415, a null body says it must be an object, and a chat template's
// rejection is said once.
func TestInputGaps(t *testing.T) {
	srv := newServer(t, newFakeEngine(chunksOf("hi", 1, "stop")...))
	for _, c := range []struct {
		name, path, body string
		status           int
		param, msg       string
	}{
		{"prompt", "/v1/completions", "{\"prompt\": \"caf\xe9\"}", 400, "prompt", "prompt is not valid UTF-8"},
		{"stop", "/v1/completions", "{\"prompt\": \"hi\", \"stop\": [\"\xff\"]}", 400, "stop", "stop is not valid UTF-8"},
		{"content", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"ok\"}, {\"role\": \"user\", \"content\": \"\xc3\x28\"}]}",
			400, "messages[1].content", "messages[1].content is not valid UTF-8"},
		{"role", "/v1/chat/completions", "{\"messages\": [{\"role\": \"us\xffer\", \"content\": \"x\"}]}", 400, "messages[0].role", "not valid UTF-8"},
		{"elsewhere", "/v1/completions", "{\"prompt\": \"hi\", \"user\": \"\xfe\"}", 400, "", "the request body is not valid UTF-8 (at byte 26)"},
		{"null", "/v1/completions", "null", 400, "", "the request body must be a JSON object, got null"},
		{"bad role", "/v1/chat/completions", `{"messages": [{"role": "bad", "content": "x"}]}`, 400, "messages",
			"the chat template rejected the messages: role bad is not allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, c.path, c.body)
			e := decodeErrorBody(t, body)
			if resp.StatusCode != c.status || !strings.Contains(e.Message, c.msg) || e.Param != c.param {
				t.Fatalf("%d %s, want %d param %q containing %q", resp.StatusCode, body, c.status, c.param, c.msg)
			}
		})
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("gzip body: %d, want 415", resp.StatusCode)
	}
}

type answerLog struct {
	mu  sync.Mutex
	got []string
}

func (a *answerLog) note(endpoint string, status int, code string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, fmt.Sprintf("%s %d %s", endpoint, status, code))
}

// TestOnAnswerCountsEveryAnswer: rejections (400, 404, 405, 413, 415),
// successes and a stream that fails after its 200 each reach OnAnswer once.
func TestOnAnswerCountsEveryAnswer(t *testing.T) {
	var log answerLog
	eng := newFakeEngine(chunksOf("hello", 1, "stop")...)
	srv := newServer(t, eng, func(c *Config) { c.OnAnswer = log.note; c.MaxBodyBytes = 64 })
	post(t, srv, "/v1/completions", `{"prompt":"hi"}`)
	post(t, srv, "/v1/completions", `{"prompt":"hi","use_beam_search":true}`)
	post(t, srv, "/v1/completions", `{"prompt":"`+strings.Repeat("x", 100)+`"}`)
	post(t, srv, "/v1/completions", `{"model":"other","prompt":"hi"}`)
	do(t, srv, "GET", "/v1/completions", "")
	do(t, srv, "GET", "/v1/nope", "")
	do(t, srv, "GET", "/v1/models", "")
	post(t, srv, "/v1/completions", `{"prompt":"hi","max_tokens":0}`)
	want := []string{
		"completions 200 ",
		"completions 400 unsupported_parameter",
		"completions 413 request_too_large",
		"completions 404 model_not_found",
		"completions 405 method_not_allowed",
		"other 404 not_found",
		"models 200 ",
		"completions 400 invalid_request",
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if strings.Join(log.got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("answers:\n%s\nwant:\n%s", strings.Join(log.got, "\n"), strings.Join(want, "\n"))
	}
}

func decodeErrorBody(t *testing.T, body string) *Error {
	t.Helper()
	return DecodeError(400, []byte(body))
}

// TestContentType: a body declared as something other than JSON gets 415
// unsupported_media_type, as vLLM refuses it (its OpenAI server takes only
// application/json); JSON with parameters, in any case, or a body without
// Content-Type is read as JSON.
func TestContentType(t *testing.T) {
	srv := newServer(t, newFakeEngine(chunksOf("hi", 1, "stop")...))
	for _, c := range []struct {
		path, contentType string
		status            int
	}{
		{"/v1/completions", "text/plain", 415},
		{"/v1/completions", "application/x-www-form-urlencoded", 415},
		{"/v1/chat/completions", "text/plain; charset=utf-8", 415},
		{"/v1/completions", "multipart/form-data; boundary=x", 415},
		{"/v1/completions", "application/jsonl", 415},
		{"/v1/completions", "application/json", 200},
		{"/v1/completions", "application/json; charset=utf-8", 200},
		{"/v1/chat/completions", " Application/JSON ", 200},
		{"/v1/completions", "", 200},
	} {
		t.Run(c.path+" "+c.contentType, func(t *testing.T) {
			body := `{"prompt":"hi","max_tokens":1}`
			if strings.Contains(c.path, "chat") {
				body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
			}
			req, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(body))
			if c.contentType != "" {
				req.Header.Set("Content-Type", c.contentType)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, c.status)
			}
			if c.status == 415 {
				e := DecodeError(resp.StatusCode, b)
				if e.Code != CodeUnsupportedMediaType || e.Type != TypeInvalidRequest || !strings.Contains(e.Message, "application/json") {
					t.Fatalf("error %+v", e)
				}
			}
		})
	}
}

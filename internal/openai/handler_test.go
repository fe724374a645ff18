package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pdserve/pdserve/internal/model"
)

const testCreated = 1700000000

func testConfig(t *testing.T, eng Engine) Config {
	return Config{
		ModelName:  "m",
		Tokenizer:  byteTokenizer{},
		ContextLen: testContextLen,
		EOS:        []int32{eosID},
		Engine:     eng,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:        func() time.Time { return time.Unix(testCreated, 0) },
		NewRID:     func() string { return "rid1" },
	}
}

func newServer(t *testing.T, eng Engine, mods ...func(*Config)) *httptest.Server {
	t.Helper()
	cfg := testConfig(t, eng)
	for _, m := range mods {
		m(&cfg)
	}
	srv := httptest.NewServer(NewHandler(cfg))
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, srv *httptest.Server, method, path, body string) (*http.Response, string) {
	t.Helper()
	return doWith(t, srv, method, path, body, nil)
}

// doWith is do with extra request headers.
func doWith(t *testing.T, srv *httptest.Server, method, path, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func post(t *testing.T, srv *httptest.Server, path, body string) (*http.Response, string) {
	t.Helper()
	return do(t, srv, http.MethodPost, path, body)
}

// sseEvents splits an SSE body into its data payloads, checking the framing:
// only "data: <payload>\n\n" events.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("SSE body does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("bad SSE event %q in %q", ev, body)
		}
		out = append(out, data)
	}
	return out
}

func checkSSEHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("Cache-Control = %q", cc)
	}
}

// checkClosed checks the stream was closed exactly once and stopped stopN times.
func checkClosed(t *testing.T, s *fakeStream, stopN int) {
	t.Helper()
	s.waitClosed(t)
	gotStop, gotClose := s.counts()
	if gotClose != 1 || gotStop != stopN {
		t.Errorf("Stop called %d times (want %d), Close %d times (want 1)", gotStop, stopN, gotClose)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recvAfterClose {
		t.Error("Recv called after Close")
	}
}

func TestSSEFramingChat(t *testing.T) {
	eng := newFakeEngine(chunksOf("Hey", 2, "stop")...)
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
	checkSSEHeaders(t, resp)
	const head = `data: {"id":"chatcmpl-rid1","object":"chat.completion.chunk","created":1700000000,"model":"m",`
	want := head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		head + `"choices":[{"index":0,"delta":{"content":"He"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		head + `"choices":[{"index":0,"delta":{"content":"y"},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" +
		head + `"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":3,"total_tokens":23,"prompt_tokens_details":{"cached_tokens":0}}}` + "\n\n" +
		"data: [DONE]\n\n"
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

func TestSSEFramingCompletion(t *testing.T) {
	eng := newFakeEngine(chunksOf("a<b", 2, "length")...)
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":[1,2],"stream":true,"return_token_ids":true}`)
	checkSSEHeaders(t, resp)
	const head = `data: {"id":"cmpl-rid1","object":"text_completion","created":1700000000,"model":"m",`
	want := head + `"choices":[{"index":0,"text":"a<","logprobs":null,"finish_reason":null,"prompt_token_ids":[1,2],"token_ids":[97,60]}]}` + "\n\n" +
		head + `"choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":"length","token_ids":[98]}]}` + "\n\n" +
		"data: [DONE]\n\n"
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

type completionEvent struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		TokenIDs     []int32 `json:"token_ids"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

func decodeEvents(t *testing.T, body string) (events []completionEvent, done bool) {
	t.Helper()
	for _, data := range sseEvents(t, body) {
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev completionEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		events = append(events, ev)
	}
	return events, done
}

func TestStreamStopStringSplitAcrossTokens(t *testing.T) {
	// The engine would go on; the front end must stop at "END", which
	// arrives one byte per token, and never send any of it.
	eng := newFakeEngine(chunksOf("Hi ENough END more text", 1, "length")...)
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions",
		`{"prompt":"x","stream":true,"stop":["END","zzz"],"return_token_ids":true,"stream_options":{"include_usage":true}}`)
	checkSSEHeaders(t, resp)
	events, done := decodeEvents(t, body)
	if !done {
		t.Error("no [DONE]")
	}
	var text strings.Builder
	var ids []int32
	var finish string
	for _, ev := range events[:len(events)-1] {
		c := ev.Choices[0]
		if strings.HasSuffix(c.Text, "E") || strings.HasSuffix(c.Text, "EN") {
			t.Errorf("event text %q ends with a stop-string prefix", c.Text)
		}
		text.WriteString(c.Text)
		ids = append(ids, c.TokenIDs...)
		if c.FinishReason != nil {
			finish = *c.FinishReason
		}
	}
	if got := text.String(); got != "Hi ENough " {
		t.Errorf("text %q, want %q", got, "Hi ENough ")
	}
	if string(toBytes(ids)) != "Hi ENough END" {
		t.Errorf("token ids %q, want the tokens up to and including the one completing the stop", toBytes(ids))
	}
	if finish != "stop" {
		t.Errorf("finish %q", finish)
	}
	usage := events[len(events)-1].Usage
	if usage == nil || usage.PromptTokensDetails == nil || *usage.PromptTokensDetails != (PromptTokensDetails{}) ||
		(Usage{PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens, TotalTokens: usage.TotalTokens}) !=
			(Usage{PromptTokens: 1, CompletionTokens: 13, TotalTokens: 14}) {
		t.Errorf("usage %+v", usage)
	}
	s := eng.nextStream(t)
	checkClosed(t, s, 1)
	if s.recvN != 13 {
		t.Errorf("Recv called %d times; want 13 (no read past the stop)", s.recvN)
	}
}

func toBytes(ids []int32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

// TestUsageCachedTokens: the cached tokens the engine reports with its last
// chunk are usage.prompt_tokens_details.cached_tokens.
func TestUsageCachedTokens(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("ab")}, Chunk{Tokens: toks("c"), FinishReason: "length", CachedTokens: 4})
	srv := newServer(t, eng)
	_, body := post(t, srv, "/v1/completions", `{"prompt":"hello","max_tokens":3}`)
	if want := `"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}`; !strings.HasSuffix(body, want) {
		t.Errorf("body %s, want it to end with %s", body, want)
	}
}

func TestNonStreamCompletion(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("one ")}, Chunk{Tokens: append(toks("two"), Token{ID: eosID}), FinishReason: "stop"})
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"hello","max_tokens":10,"return_token_ids":true,"seed":5}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	want := `{"id":"cmpl-rid1","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"one two","logprobs":null,"finish_reason":"stop","prompt_token_ids":[104,101,108,108,111],"token_ids":[111,110,101,32,116,119,111,256]}],"usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":0}}}`
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	checkClosed(t, eng.nextStream(t), 0)
	// Non-streaming and no stop strings: the engine may buffer the output.
	wantReq := &GenerateRequest{RID: "rid1", InputIDs: []int32{104, 101, 108, 108, 111}, MaxTokens: 10,
		Sampling: model.SamplingParams{Temperature: 1, TopP: 1, Seed: 5}, Buffered: true, Arrived: time.Unix(1700000000, 0)}
	if diff := cmp.Diff(wantReq, eng.lastReq(t)); diff != "" {
		t.Errorf("GenerateRequest (-want +got):\n%s", diff)
	}
}

// TestBufferedOnlyWithoutStopStrings: stop strings (checked on the text as
// it comes) and streaming both need the output token by token.
func TestBufferedOnlyWithoutStopStrings(t *testing.T) {
	for _, tc := range []struct {
		body     string
		buffered bool
	}{
		{`{"prompt":"hello","max_tokens":4}`, true},
		{`{"prompt":"hello","max_tokens":4,"stop":["x"]}`, false},
		{`{"prompt":"hello","max_tokens":4,"stream":true}`, false},
	} {
		eng := newFakeEngine(Chunk{Tokens: toks("ab"), FinishReason: "length"})
		srv := newServer(t, eng)
		post(t, srv, "/v1/completions", tc.body)
		if got := eng.lastReq(t).Buffered; got != tc.buffered {
			t.Errorf("%s: Buffered %v, want %v", tc.body, got, tc.buffered)
		}
	}
}

func TestNonStreamChatStop(t *testing.T) {
	eng := newFakeEngine(chunksOf("Sure.\nUser: more", 3, "length")...)
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"q"}],"stop":"\nUser:","max_completion_tokens":20,"temperature":0,"top_k":3,"stop_token_ids":[9],"ignore_eos":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := `{"id":"chatcmpl-rid1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Sure."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":11,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":0}}}`
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	checkClosed(t, eng.nextStream(t), 1)
	got := eng.lastReq(t)
	if got.MaxTokens != 20 || got.Sampling.Temperature != 0 || got.Sampling.TopK != 3 || !got.IgnoreEOS ||
		!cmp.Equal(got.StopTokenIDs, []int32{9}) {
		t.Errorf("GenerateRequest %+v", got)
	}
}

func TestRandomSeedWhenAbsent(t *testing.T) {
	eng := newFakeEngine(chunksOf("a", 1, "length")...)
	srv := newServer(t, eng)
	seeds := map[uint64]bool{}
	for range 2 {
		if resp, body := post(t, srv, "/v1/completions", `{"prompt":"x"}`); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		seeds[eng.lastReq(t).Sampling.Seed] = true
		checkClosed(t, eng.nextStream(t), 0)
	}
	if len(seeds) != 2 {
		t.Errorf("two requests without seed got the same seed")
	}
}

func TestErrorsBeforeOutput(t *testing.T) {
	tests := []struct {
		name    string
		genErr  error
		failAt0 error // Recv fails at once
		body    string
		status  int
		msg     string
	}{
		{"engine rejects", BadRequest("prompt", "token id 300 is out of the vocabulary"), nil,
			`{"prompt":"x"}`, 400, "token id 300 is out of the vocabulary"},
		{"engine plain error", errors.New("boom"), nil, `{"prompt":"x","stream":true}`, 500, "internal error: boom"},
		{"no worker", Unavailable("no decode worker"), nil, `{"prompt":"x","stream":true}`, 503, "no decode worker"},
		{"first Recv fails, stream", nil, Unavailable("prefill failed"), `{"prompt":"x","stream":true}`, 503, "prefill failed"},
		{"first Recv fails", nil, Timeout("bootstrap timeout"), `{"prompt":"x"}`, 504, "bootstrap timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := newFakeEngine(chunksOf("a", 1, "length")...)
			eng.genErr = tt.genErr
			if tt.failAt0 != nil {
				eng.failAt, eng.failErr = 0, tt.failAt0
			}
			srv := newServer(t, eng)
			resp, body := post(t, srv, "/v1/completions", tt.body)
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %q, want %d JSON: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tt.status, body)
			}
			e := DecodeError(resp.StatusCode, []byte(body))
			if e.Message != tt.msg {
				t.Errorf("message %q, want %q", e.Message, tt.msg)
			}
			if tt.genErr == nil {
				checkClosed(t, eng.nextStream(t), 0)
			}
		})
	}
}

func TestErrorMidStream(t *testing.T) {
	eng := newFakeEngine(chunksOf("ab", 2, "")...)
	eng.failAt, eng.failErr = 1, Unavailable("decode worker lost")
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"x","stream":true,"stream_options":{"include_usage":true}}`)
	checkSSEHeaders(t, resp)
	want := `data: {"id":"cmpl-rid1","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"ab","logprobs":null,"finish_reason":null}]}` + "\n\n" +
		`data: {"error":{"message":"decode worker lost","type":"server_error","param":null,"code":null}}` + "\n\n" +
		"data: [DONE]\n\n"
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

func TestEngineEndsWithoutFinishReason(t *testing.T) {
	eng := newFakeEngine(Chunk{Tokens: toks("a")})
	srv := newServer(t, eng)
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"x"}`)
	if resp.StatusCode != 500 || !strings.Contains(body, "ended the stream before every choice finished") {
		t.Errorf("status %d: %s", resp.StatusCode, body)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

// TestClientDisconnect: the client goes away while the engine is busy;
// the handler must Close (abort) the stream, not Stop it.
func TestClientDisconnect(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := "stream"
		if !stream {
			name = "no stream"
		}
		t.Run(name, func(t *testing.T) {
			eng := newFakeEngine(Chunk{Tokens: toks("Hi")}, Chunk{Tokens: toks("!"), FinishReason: "length"})
			eng.blockAt = 1 // Recv blocks after the first chunk until the request ctx ends
			answers := make(chan string, 1)
			srv := newServer(t, eng, func(c *Config) {
				c.OnAnswer = func(endpoint string, status int, code string) {
					answers <- fmt.Sprintf("%s %d %s", endpoint, status, code)
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			body := `{"prompt":"x","stream":false}`
			if stream {
				body = `{"prompt":"x","stream":true}`
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				resp *http.Response
				err  error
			}
			got := make(chan result, 1)
			go func() {
				resp, err := srv.Client().Do(req)
				got <- result{resp, err}
			}()
			s := eng.nextStream(t)
			if stream {
				r := <-got
				if r.err != nil {
					t.Fatal(r.err)
				}
				line, err := bufio.NewReader(r.resp.Body).ReadString('\n')
				if err != nil || !strings.Contains(line, `"text":"Hi"`) {
					t.Fatalf("first event %q, %v", line, err)
				}
				cancel()
				r.resp.Body.Close()
			} else {
				cancel()
				if r := <-got; r.err == nil {
					r.resp.Body.Close()
					t.Fatal("request succeeded after cancel")
				}
			}
			checkClosed(t, s, 0)
			// Counted as the client saw it: a 499 before any output; after
			// the stream's 200, a 200 with the code aborted_client.
			want := "completions 499 "
			if stream {
				want = "completions 200 " + CodeAbortedClient
			}
			select {
			case got := <-answers:
				if got != want {
					t.Fatalf("answer counted as %q, want %q", got, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no answer counted")
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	eng := newFakeEngine()
	srv := newServer(t, eng)
	slash := newServer(t, eng, func(c *Config) { c.ModelName = "org/name" })
	tests := []struct {
		name   string
		srv    *httptest.Server
		method string
		path   string
		status int
		body   string // exact, or substring if it starts with "~"
		allow  string
	}{
		{"list", srv, "GET", "/v1/models", 200,
			`{"object":"list","data":[{"id":"m","object":"model","created":1700000000,"owned_by":"pdserve","max_model_len":64}]}`, ""},
		{"get", srv, "GET", "/v1/models/m", 200,
			`{"id":"m","object":"model","created":1700000000,"owned_by":"pdserve","max_model_len":64}`, ""},
		{"get with slash", slash, "GET", "/v1/models/org/name", 200, `~"id":"org/name"`, ""},
		{"get escaped slash", slash, "GET", "/v1/models/org%2Fname", 200, `~"id":"org/name"`, ""},
		{"unknown model", srv, "GET", "/v1/models/x", 404,
			`{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, ""},
		{"unknown path", srv, "GET", "/v1/nope", 404,
			`{"error":{"message":"Invalid URL (GET /v1/nope)","type":"invalid_request_error","param":null,"code":null}}`, ""},
		{"root", srv, "POST", "/", 404, `~Invalid URL (POST /)`, ""},
		{"trailing slash", srv, "POST", "/v1/completions/", 404, `~Invalid URL`, ""},
		{"GET completions", srv, "GET", "/v1/completions", 405,
			`{"error":{"message":"Method GET is not allowed for /v1/completions","type":"invalid_request_error","param":null,"code":null}}`, "POST"},
		{"GET chat", srv, "GET", "/v1/chat/completions", 405, `~not allowed`, "POST"},
		{"POST models", srv, "POST", "/v1/models", 405, `~not allowed`, "GET"},
		{"DELETE model", srv, "DELETE", "/v1/models/m", 405, `~not allowed`, "GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.srv, tt.method, tt.path, "")
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
			if sub, ok := strings.CutPrefix(tt.body, "~"); ok {
				if !strings.Contains(body, sub) {
					t.Errorf("body %s does not contain %s", body, sub)
				}
			} else if body != tt.body {
				t.Errorf("body\n got %s\nwant %s", body, tt.body)
			}
			if a := resp.Header.Get("Allow"); a != tt.allow {
				t.Errorf("Allow %q, want %q", a, tt.allow)
			}
		})
	}
}

func TestValidationThroughHandler(t *testing.T) {
	eng := newFakeEngine()
	srv := newServer(t, eng, func(c *Config) { c.MaxBodyBytes = 100 })
	tests := []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/v1/completions", `{"prompt":"` + strings.Repeat("a", 200) + `"}`, 413, "exceeds the limit of 100 bytes"},
		{"/v1/completions", `{"prompt":"a"}` + strings.Repeat(" ", 200), 413, "exceeds the limit of 100 bytes"},
		{"/v1/completions", `{"prompt":"a","max_tokens":"ten"}`, 400, "max_tokens must be an integer, got string"},
		{"/v1/chat/completions", `{"messages":[]}`, 400, "messages must not be empty"},
		{"/v1/chat/completions", `{`, 400, "invalid JSON"},
		{"/v1/chat/completions", `{"model":"gpt","messages":[{"role":"user","content":"x"}]}`, 404, "does not exist"},
	}
	for _, tt := range tests {
		resp, body := post(t, srv, tt.path, tt.body)
		e := DecodeError(resp.StatusCode, []byte(body))
		if resp.StatusCode != tt.status || !strings.Contains(e.Message, tt.msg) {
			t.Errorf("%s %s: status %d, message %q; want %d, %q", tt.path, tt.body, resp.StatusCode, e.Message, tt.status, tt.msg)
		}
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if len(eng.reqs) != 0 {
		t.Errorf("engine got %d invalid requests", len(eng.reqs))
	}
}

// TestUnknownModelAnswerIsBounded: a 512 KiB model name in a request (or in
// GET /v1/models/{id}) gets a 404 model_not_found of a few hundred bytes,
// not the name back in full.
func TestUnknownModelAnswerIsBounded(t *testing.T) {
	eng := newFakeEngine()
	srv := newServer(t, eng)
	name := strings.Repeat("x", 512<<10) // a GET's path fits the server's header limit (1 MiB)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/completions", `{"model":"` + name + `","prompt":"hi"}`},
		{"POST", "/v1/chat/completions", `{"model":"` + name + `","messages":[{"role":"user","content":"hi"}]}`},
		{"GET", "/v1/models/" + name, ""},
	} {
		resp, body := do(t, srv, c.method, c.path, c.body)
		e := DecodeError(resp.StatusCode, []byte(body))
		if resp.StatusCode != 404 || e.Code != CodeModelNotFound || len(body) > 1024 ||
			!strings.Contains(e.Message, strings.Repeat("x", MaxEchoedModel)+"…") {
			t.Errorf("%s %s: status %d, code %q, %d-byte body %.200s; want a 404 %s under 1 KiB", c.method, c.path[:20], resp.StatusCode, e.Code, len(body), body, CodeModelNotFound)
		}
	}
}

func TestNoTokenizerTokenIDs(t *testing.T) {
	eng := newFakeEngine(chunksOf("ab", 1, "length")...)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = nil })
	resp, body := post(t, srv, "/v1/completions", `{"prompt":[5,6],"return_token_ids":true,"stream":true}`)
	checkSSEHeaders(t, resp)
	events, done := decodeEvents(t, body)
	if !done || len(events) != 2 || events[0].Choices[0].Text != "" || !cmp.Equal(events[1].Choices[0].TokenIDs, []int32{'b'}) {
		t.Errorf("events %s", body)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

// TestNoTokenizerAlwaysReturnsTokenIDs: without a tokenizer the answer has
// no text, so the token ids come back even if not asked for.
func TestNoTokenizerAlwaysReturnsTokenIDs(t *testing.T) {
	eng := newFakeEngine(chunksOf("ab", 1, "length")...)
	srv := newServer(t, eng, func(c *Config) { c.Tokenizer = nil })
	resp, body := post(t, srv, "/v1/completions", `{"prompt":[5,6]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"token_ids":[97,98]`) || !strings.Contains(body, `"prompt_token_ids":[5,6]`) {
		t.Errorf("%d %s, want the prompt's and the output's token ids", resp.StatusCode, body)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

func TestNewHandlerPanicsOnBadConfig(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Engine = nil },
		func(c *Config) { c.ModelName = "" },
		func(c *Config) { c.ContextLen = 0 },
	} {
		cfg := testConfig(t, newFakeEngine())
		mod(&cfg)
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			NewHandler(cfg)
		}()
	}
}

// TestServeWithRecorder runs the handler without a real connection (no
// deadlines, no flusher) to check it copes.
func TestServeWithRecorder(t *testing.T) {
	eng := newFakeEngine(chunksOf("ok", 1, "length")...)
	h := NewHandler(testConfig(t, eng))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`)))
	if rec.Code != 200 || !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
	checkClosed(t, eng.nextStream(t), 0)
}

// engineFunc adapts a function to Engine.
type engineFunc func(context.Context, *GenerateRequest) (Stream, error)

func (f engineFunc) Generate(ctx context.Context, req *GenerateRequest) (Stream, error) {
	return f(ctx, req)
}

func TestBrokenEngine(t *testing.T) {
	for name, eng := range map[string]Engine{
		"nil stream":  engineFunc(func(context.Context, *GenerateRequest) (Stream, error) { return nil, nil }),
		"nil *Error":  engineFunc(func(context.Context, *GenerateRequest) (Stream, error) { return nil, (*Error)(nil) }),
		"zero *Error": engineFunc(func(context.Context, *GenerateRequest) (Stream, error) { return nil, &Error{} }),
	} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t, eng)
			resp, body := post(t, srv, "/v1/completions", `{"prompt":"x"}`)
			if resp.StatusCode != 500 || DecodeError(500, []byte(body)).Type != TypeServer {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
		})
	}
}

// endlessStream returns the same chunk forever.
type endlessStream struct {
	ctx    context.Context
	chunk  Chunk
	closed chan struct{}
}

func (s *endlessStream) Recv() (Chunk, error) {
	if err := s.ctx.Err(); err != nil {
		return Chunk{}, err
	}
	return s.chunk, nil
}
func (s *endlessStream) Stop()  {}
func (s *endlessStream) Close() { close(s.closed) }

// TestClientThatStopsReading: a client that keeps the connection open but
// stops reading must not pin the request: the write deadline (IOTimeout)
// ends it and the stream is closed.
func TestClientThatStopsReading(t *testing.T) {
	streams := make(chan *endlessStream, 1)
	chunk := Chunk{Tokens: toks(strings.Repeat("a", 16<<10))}
	eng := engineFunc(func(ctx context.Context, _ *GenerateRequest) (Stream, error) {
		s := &endlessStream{ctx: ctx, chunk: chunk, closed: make(chan struct{})}
		streams <- s
		return s, nil
	})
	srv := newServer(t, eng, func(c *Config) { c.IOTimeout = 50 * time.Millisecond })
	resp, err := srv.Client().Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read
	s := <-streams
	select {
	case <-s.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("a client that stopped reading pinned the request")
	}
}

// TestPartialBodyDoesNotPinConnection: a client that sends part of its body
// and stops gets an error after IOTimeout and its connection is closed,
// rather than held by the server forever.
func TestPartialBodyDoesNotPinConnection(t *testing.T) {
	srv := newServer(t, &fakeEngine{}, func(c *Config) { c.IOTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body) // ends only when the server closes the connection
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close || !strings.Contains(string(body), "timed out reading") {
		t.Fatalf("got %d (close=%v) %s", resp.StatusCode, resp.Close, body)
	}
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open")
	}
}

// TestAdmitBeforeBody: a refusal of Config.Admit is the answer before the
// body is read (a body that would be a 400 gets it) and the engine is not
// asked; a 429 carries the time to it as Server-Timing, from Admit or from
// the engine; what Admit lets through is parsed and served as before.
func TestAdmitBeforeBody(t *testing.T) {
	var refuse atomic.Bool
	var calls atomic.Int32
	overloaded := func() *Error {
		return &Error{Status: http.StatusTooManyRequests, Type: TypeServer, Code: "overloaded", Message: "busy", RetryAfter: time.Second}
	}
	eng := engineFunc(func(_ context.Context, req *GenerateRequest) (Stream, error) {
		calls.Add(1)
		if req.Buffered { // not streamed: the 429 comes from the stream, before output
			return failingStream{overloaded()}, nil
		}
		return nil, overloaded()
	})
	srv := newServer(t, eng, func(c *Config) {
		c.Admit = func() error {
			if refuse.Load() {
				return overloaded()
			}
			return nil
		}
	})
	checkTimed := func(resp *http.Response) {
		t.Helper()
		var ms float64
		st := resp.Header.Get("Server-Timing")
		if _, err := fmt.Sscanf(st, ServerTimingShed+";dur=%g", &ms); err != nil || ms < 0 {
			t.Errorf("Server-Timing %q (%v), want %s;dur=<ms>", st, err, ServerTimingShed)
		}
	}
	if resp, body := post(t, srv, "/v1/completions", `{"prompt": "x",`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("admitted, bad body: %d %s", resp.StatusCode, body)
	}
	resp, body := post(t, srv, "/v1/completions", `{"prompt":"x"}`)
	if resp.StatusCode != http.StatusTooManyRequests || calls.Load() != 1 {
		t.Fatalf("admitted, engine overloaded: %d %s (%d engine calls)", resp.StatusCode, body, calls.Load())
	}
	checkTimed(resp)
	resp, body = post(t, srv, "/v1/completions", `{"prompt":"x","stream":true}`)
	if resp.StatusCode != http.StatusTooManyRequests || calls.Load() != 2 {
		t.Fatalf("admitted, stream overloaded: %d %s (%d engine calls)", resp.StatusCode, body, calls.Load())
	}
	checkTimed(resp)
	refuse.Store(true)
	resp, body = post(t, srv, "/v1/chat/completions", `{"messages": [`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || calls.Load() != 2 {
		t.Fatalf("refused: %d %v %s (%d engine calls), want Admit's 429 with Retry-After and no engine call",
			resp.StatusCode, resp.Header, body, calls.Load())
	}
	checkTimed(resp)
}

// failingStream fails its first Recv with err.
type failingStream struct{ err error }

func (s failingStream) Recv() (Chunk, error) { return Chunk{}, s.err }
func (failingStream) Stop()                  {}
func (failingStream) Close()                 {}

// flushCounter is a ResponseWriter that records what was written before
// each flush.
type flushCounter struct {
	h       http.Header
	status  int
	body    strings.Builder
	flushed int // bytes of body written at the last Flush
	flushes int
}

func (f *flushCounter) Header() http.Header {
	if f.h == nil {
		f.h = http.Header{}
	}
	return f.h
}
func (f *flushCounter) WriteHeader(s int)           { f.status = s }
func (f *flushCounter) Write(b []byte) (int, error) { return f.body.Write(b) }
func (f *flushCounter) Flush()                      { f.flushes++; f.flushed = f.body.Len() }

// TestLastEventGoesWithTheEnd: when the stream's source has ended (Ender),
// the last events (the final chunk and [DONE]) are left unflushed so the server sends it with
// the response's end in one write; otherwise it is flushed. The bytes are
// the same either way.
func TestLastEventGoesWithTheEnd(t *testing.T) {
	var bodies []string
	for _, ended := range []bool{false, true} {
		eng := newFakeEngine(chunksOf("abcd", 2, "length")...)
		eng.ended = ended
		h := NewHandler(testConfig(t, eng))
		fc := &flushCounter{}
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(fc, req)
		body := fc.body.String()
		if fc.status != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("ended=%v: %d %q", ended, fc.status, body)
		}
		unflushed := body[fc.flushed:]
		if ended && (strings.Count(unflushed, "data: ") != 2 || !strings.Contains(unflushed, `"finish_reason":"length"`)) {
			t.Errorf("source ended: unflushed at the end %q, want the last chunk and [DONE]", unflushed)
		}
		if !ended && unflushed != "" {
			t.Errorf("source not ended: %q left unflushed", unflushed)
		}
		bodies = append(bodies, body)
	}
	if bodies[0] != bodies[1] {
		t.Errorf("bodies differ:\n%s\n%s", bodies[0], bodies[1])
	}
}

// TestContinuousUsageStats: with vLLM's stream_options
// continuous_usage_stats (and include_usage) every chunk carries the usage
// so far; without it only the last, choice-less chunk does.
func TestContinuousUsageStats(t *testing.T) {
	for _, continuous := range []bool{false, true} {
		eng := newFakeEngine(chunksOf("abcdef", 2, "length")...)
		srv := newServer(t, eng)
		_, body := post(t, srv, "/v1/completions", fmt.Sprintf(
			`{"prompt":"xy","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":%v}}`, continuous))
		events, done := decodeEvents(t, body)
		if !done || len(events) != 4 {
			t.Fatalf("continuous=%v: %d events, done %v:\n%s", continuous, len(events), done, body)
		}
		for i, ev := range events[:3] {
			switch {
			case !continuous && ev.Usage != nil:
				t.Errorf("chunk %d has usage without continuous_usage_stats", i)
			case continuous && (ev.Usage == nil || ev.Usage.PromptTokens != 2 || ev.Usage.CompletionTokens != 2*(i+1) ||
				ev.Usage.TotalTokens != 2+2*(i+1)):
				t.Errorf("chunk %d usage %+v, want 2 prompt and %d completion tokens", i, ev.Usage, 2*(i+1))
			}
		}
		if u := events[3].Usage; u == nil || u.CompletionTokens != 6 || len(events[3].Choices) != 0 {
			t.Errorf("continuous=%v: last chunk %+v, want the usage of 6 tokens and no choices", continuous, events[3])
		}
	}
}

// TestRefusalKeepsConnection: a 400 (invalid field, malformed JSON) and a
// 415 leave the connection open for the client's next request, as vLLM's
// server does; the next request on it is served.
func TestRefusalKeepsConnection(t *testing.T) {
	srv := newServer(t, newFakeEngine(chunksOf("ok", 2, "length")...))
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	send := func(ct, body string) *http.Response {
		t.Helper()
		fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", ct, len(body), body)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		return resp
	}
	for _, tc := range []struct {
		ct, body string
		status   int
	}{
		{"application/json", `{"prompt":"x","max_tokens":0}`, 400},
		{"application/json", `{"prompt":`, 400},
		{"text/plain", `{"prompt":"x"}`, 415},
		{"application/json", `{"prompt":"x","max_tokens":2}`, 200},
	} {
		if resp := send(tc.ct, tc.body); resp.StatusCode != tc.status || resp.Close {
			t.Fatalf("%s %s: %d close=%v, want %d on a kept connection", tc.ct, tc.body, resp.StatusCode, resp.Close, tc.status)
		}
	}
}

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/openai"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a Clock whose time moves only when Sleep is called: Sleep
// advances it by d at once and records d.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
		c.sleeps = append(c.sleeps, d)
	}
	return nil
}

func (c *fakeClock) slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// fakeRequest is what the fake server reads from a request.
type fakeRequest struct {
	chat   bool
	prompt string // the prompt, or the chat's last message
	// full is the whole prompt: the chat's messages' contents concatenated.
	full      string
	messages  []fakeMessage
	maxTokens int
	ignoreEOS bool
	tokenIDs  bool
	fields    map[string]json.RawMessage
}

// fakeMessage is one chat message a fake request carried.
type fakeMessage struct{ role, content string }

// parseFake reads a completions or chat request, or answers 400.
func parseFake(w http.ResponseWriter, r *http.Request) (*fakeRequest, bool) {
	var fields map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&fields); err != nil {
		openai.WriteError(w, openai.BadRequest("", "bad body: %v", err))
		return nil, false
	}
	b, _ := json.Marshal(fields)
	fr := &fakeRequest{fields: fields, chat: strings.HasSuffix(r.URL.Path, "/chat/completions")}
	if fr.chat {
		var req openai.ChatCompletionRequest
		if err := json.Unmarshal(b, &req); err != nil || len(req.Messages)%2 != 1 || req.MaxCompletionTokens == nil {
			openai.WriteError(w, openai.BadRequest("", "bad chat request: %v", err))
			return nil, false
		}
		for i, m := range req.Messages {
			var content string
			if err := json.Unmarshal(m.Content, &content); err != nil {
				openai.WriteError(w, openai.BadRequest("messages", "bad content: %v", err))
				return nil, false
			}
			if want := [2]string{"user", "assistant"}[i%2]; m.Role != want {
				openai.WriteError(w, openai.BadRequest("messages", "message %d is from %q, want %q", i, m.Role, want))
				return nil, false
			}
			fr.messages = append(fr.messages, fakeMessage{m.Role, content})
			fr.full += content
			fr.prompt = content
		}
		fr.maxTokens, fr.ignoreEOS, fr.tokenIDs = int(*req.MaxCompletionTokens), req.IgnoreEOS, req.ReturnTokenIDs
		if !req.Stream || req.StreamOptions == nil || !req.StreamOptions.IncludeUsage {
			openai.WriteError(w, openai.BadRequest("stream", "want a stream with usage"))
			return nil, false
		}
	} else {
		var req openai.CompletionRequest
		if err := json.Unmarshal(b, &req); err != nil || req.MaxTokens == nil {
			openai.WriteError(w, openai.BadRequest("", "bad completion request: %v", err))
			return nil, false
		}
		if err := json.Unmarshal(req.Prompt, &fr.prompt); err != nil {
			openai.WriteError(w, openai.BadRequest("prompt", "bad prompt: %v", err))
			return nil, false
		}
		fr.full = fr.prompt
		fr.maxTokens, fr.ignoreEOS, fr.tokenIDs = int(*req.MaxTokens), req.IgnoreEOS, req.ReturnTokenIDs
		if !req.Stream || req.StreamOptions == nil || !req.StreamOptions.IncludeUsage {
			openai.WriteError(w, openai.BadRequest("stream", "want a stream with usage"))
			return nil, false
		}
	}
	return fr, true
}

// sse writes OpenAI stream events for one fake request.
type sse struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	fr   *fakeRequest
	sent int // output tokens sent
}

func startSSE(w http.ResponseWriter, fr *fakeRequest) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w), fr: fr}
	if fr.chat {
		empty := ""
		s.event(openai.ChatCompletionChunk{Object: "chat.completion.chunk",
			Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Role: "assistant", Content: &empty}}}})
	}
	return s
}

func (s *sse) raw(data string) {
	fmt.Fprintf(s.w, "data: %s\n\n", data)
	_ = s.rc.Flush()
}

func (s *sse) event(v any) {
	b, _ := json.Marshal(v)
	s.raw(string(b))
}

// tokens sends one event with k output tokens, one lowercase letter each:
// the i-th token of an answer is 'a' + (prompt length + i) mod 26, so
// answers to prompts of different lengths differ.
func (s *sse) tokens(k int) {
	b := make([]byte, k)
	for i := range b {
		b[i] = byte('a' + (len(s.fr.full)+s.sent+i)%26)
	}
	s.sent += k
	text := string(b)
	var ids []int32
	if s.fr.tokenIDs {
		ids = make([]int32, k)
	}
	if s.fr.chat {
		s.event(openai.ChatCompletionChunk{Object: "chat.completion.chunk",
			Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: &text}, TokenIDs: ids}}})
		return
	}
	s.event(openai.CompletionResponse{Object: "text_completion",
		Choices: []openai.CompletionChoice{{Text: text, TokenIDs: ids}}})
}

func (s *sse) usage(prompt, completion int) {
	u := &openai.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if s.fr.chat {
		s.event(openai.ChatCompletionChunk{Object: "chat.completion.chunk", Choices: []openai.ChatChunkChoice{}, Usage: u})
		return
	}
	s.event(openai.CompletionResponse{Object: "text_completion", Choices: []openai.CompletionChoice{}, Usage: u})
}

// usageCached sends usage with prompt_tokens_details.cached_tokens (the
// OpenAI field).
func (s *sse) usageCached(prompt, completion, cached int) {
	object := "text_completion"
	if s.fr.chat {
		object = "chat.completion.chunk"
	}
	s.raw(fmt.Sprintf(`{"object": %q, "choices": [], "usage": {"prompt_tokens": %d, "completion_tokens": %d, "total_tokens": %d, `+
		`"prompt_tokens_details": {"cached_tokens": %d}}}`, object, prompt, completion, prompt+completion, cached))
}

// fakePageSize is the fake prefix cache's page, in bytes (tokens).
const fakePageSize = 16

// fakeOptions vary the fake server.
type fakeOptions struct {
	// noCachedField leaves prompt_tokens_details out of usage.
	noCachedField bool
	// onRequest sees every parsed request (concurrently).
	onRequest func(fr *fakeRequest)
}

func (s *sse) done() { s.raw("[DONE]") }

// fakeServer serves /v1/models and streams completions whose behaviour the
// prompt chooses (its first word):
//
//	ok       max_tokens events of one token, usage (prompt tokens = bytes;
//	         cached tokens = the longest prefix shared with an earlier
//	         prompt, in full 16-byte pages, less than the prompt), [DONE]
//	pairs    events of two tokens each, no usage, [DONE]
//	http500  a 500 server_error answer
//	http429  a 429 answer with code rate_limit_exceeded (no Retry-After)
//	shed     a 429 overloaded answer with Retry-After: 1 (shedonce: only the
//	         first time that prompt is sent; then as ok)
//	close    two tokens, then the connection is cut
//	eof      two tokens, then the stream ends without [DONE]
//	errevent one token, then an error event with code "engine_failed", [DONE]
//	numcode  one token, then an error event with a numeric code (as vLLM sends)
//	badjson  a malformed event
//	hang     one token, then nothing until the client goes away
func fakeServer(t *testing.T) *httptest.Server {
	t.Helper()
	return fakeServerWith(t, fakeOptions{})
}

// fakeServerWith is fakeServer varied by o.
func fakeServerWith(t *testing.T, o fakeOptions) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]int{}
	var history []string // every full prompt, for the fake prefix cache
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(openai.ModelList{Object: "list",
			Data: []openai.ModelCard{{ID: "fake-model", Object: "model"}, {ID: "other", Object: "model"}}})
	})
	h := func(w http.ResponseWriter, r *http.Request) {
		fr, ok := parseFake(w, r)
		if !ok {
			return
		}
		if o.onRequest != nil {
			o.onRequest(fr)
		}
		kind, _, _ := strings.Cut(fr.prompt, " ")
		mu.Lock()
		seen[fr.prompt]++
		n := seen[fr.prompt]
		cached := 0
		for _, h := range history {
			k := 0
			for k < len(h) && k < len(fr.full) && h[k] == fr.full[k] {
				k++
			}
			cached = max(cached, min(k, len(fr.full)-1)/fakePageSize*fakePageSize)
		}
		history = append(history, fr.full)
		mu.Unlock()
		if kind == "shedonce" && n > 1 {
			kind = "ok"
		}
		switch kind {
		case "shed", "shedonce":
			openai.WriteError(w, &openai.Error{Status: http.StatusTooManyRequests, Type: "server_error",
				Code: "overloaded", Message: "every decode worker is saturated", RetryAfter: time.Second})
			return
		case "http500":
			openai.WriteError(w, openai.Internal("boom"))
		case "http429":
			openai.WriteError(w, &openai.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error",
				Code: "rate_limit_exceeded", Message: "slow down"})
		case "close":
			s := startSSE(w, fr)
			s.tokens(1)
			s.tokens(1)
			panic(http.ErrAbortHandler)
		case "eof":
			s := startSSE(w, fr)
			s.tokens(1)
			s.tokens(1)
		case "errevent":
			s := startSSE(w, fr)
			s.tokens(1)
			s.raw(`{"error": {"message": "engine died", "type": "server_error", "param": null, "code": "engine_failed"}}`)
			s.done()
		case "numcode":
			s := startSSE(w, fr)
			s.tokens(1)
			s.raw(`{"error": {"object": "error", "message": "oops", "type": "InternalServerError", "param": null, "code": 500}}`)
			s.done()
		case "badjson":
			s := startSSE(w, fr)
			s.raw(`{"choices": [`)
			s.done()
		case "hang":
			s := startSSE(w, fr)
			s.tokens(1)
			<-r.Context().Done()
		case "pairs":
			s := startSSE(w, fr)
			for range fr.maxTokens / 2 {
				s.tokens(2)
			}
			s.done()
		default:
			s := startSSE(w, fr)
			for range fr.maxTokens {
				s.tokens(1)
			}
			if o.noCachedField {
				s.usage(len(fr.full), fr.maxTokens)
			} else {
				s.usageCached(len(fr.full), fr.maxTokens, cached)
			}
			s.done()
		}
	}
	mux.HandleFunc("POST /v1/completions", h)
	mux.HandleFunc("POST /v1/chat/completions", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// testClient is an http.Client whose idle connections are closed at
// cleanup (so goleak sees no transport goroutines).
func testClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// writeJSONL writes records {"prompt": p, "output_len": n} to a temp file.
func writeJSONL(t *testing.T, prompts []string, outputLen int) string {
	t.Helper()
	var b strings.Builder
	for _, p := range prompts {
		line, _ := json.Marshal(map[string]any{"prompt": p, "output_len": outputLen})
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// testConfig is a small valid config against url.
func testConfig(url string) Config {
	return Config{BaseURL: url, Endpoint: EndpointCompletions, NumPrompts: 10, Rates: []Rate{InfRate()},
		Dataset: DatasetRandom, RandomInputLen: 16, RandomOutputLen: 4, IgnoreEOS: true,
		ReturnTokenIDs: true, Timeout: 2 * time.Minute}
}

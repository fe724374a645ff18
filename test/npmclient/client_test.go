package npmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/testbin"
)

// requireNPMEnv, when set (CI sets it after installing the npm client),
// turns a missing node or openai package into a failure instead of a skip,
// so the test cannot silently stop running.
const requireNPMEnv = "PDSERVE_REQUIRE_NPM"

// clientDeadline bounds the whole node run: six requests of a few tokens
// each take well under a second; the rest is slack for a loaded machine
// running -race.
const clientDeadline = 2 * time.Minute

// nodeAndClient returns the path of node, or skips the test (fails it if
// PDSERVE_REQUIRE_NPM is set) when node or the openai package is missing.
// An installed openai of another version than package.json pins fails.
func nodeAndClient(t *testing.T) string {
	t.Helper()
	const install = "npm install --no-save --prefix test/npmclient"
	missing := func(what, fix string) {
		t.Helper()
		if os.Getenv(requireNPMEnv) != "" {
			t.Fatalf("%s and %s is set: %s", what, requireNPMEnv, fix)
		}
		t.Skipf("%s: %s (.ci/run does) to run the openai npm client test", what, fix)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node not on PATH", "install Node.js 20 or later and run `"+install+"`")
	}
	if !installedAsPinned(t, "openai", install) {
		missing("test/npmclient/node_modules/openai not installed", "run `"+install+"`")
	}
	return node
}

// installedAsPinned reports whether npm package name is installed in
// node_modules, and fails the test if it is at another version than
// package.json pins (install is the command that fixes it).
func installedAsPinned(t *testing.T, name, install string) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("node_modules", name, "package.json"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	} else if err != nil {
		t.Fatal(err)
	}
	var installed struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(raw, &installed); err != nil {
		t.Fatalf("node_modules/%s/package.json: %v", name, err)
	}
	raw, err = os.ReadFile("package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatalf("package.json: %v", err)
	}
	if want := pkg.Dependencies[name]; installed.Version != want {
		t.Fatalf("node_modules has %s %s, package.json pins %q: run `%s` again", name, installed.Version, want, install)
	}
	return true
}

// startPD starts a router with one prefill and one decode worker of the
// simulated model on loopback ports, as `pdserve up` does. At cleanup it
// waits until no request is live anywhere, then shuts everything down.
func startPD(t *testing.T) *cluster.Cluster {
	t.Helper()
	newModel := func() (model.Model, error) {
		// A small KV shape (256 bytes per token) keeps the pools small.
		return sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvcache.BF16}, ContextLen: 2048})
	}
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated) // Up sets each worker's role
	mc.PrefixCache = true                                  // on, as pdserve runs by default
	c, err := cluster.Up(context.Background(), cluster.Options{Host: "127.0.0.1", PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: newModel, Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20},
		HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Every request the client made has ended on every process.
		if state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
			if live := c.Router.Router.Requests(); len(live) != 0 {
				return false, fmt.Sprintf("router serving %+v", live)
			}
			for _, w := range c.Workers() {
				st, ok := w.Worker.Stats(time.Second)
				if !ok {
					return false, w.Worker.Role().String() + " worker's loop did not answer"
				}
				if st.Live != 0 || st.PagesUsed != 0 {
					return false, fmt.Sprintf("%s worker: live %d, pages used %d", w.Worker.Role(), st.Live, st.PagesUsed)
				}
			}
			return true, ""
		}); !ok {
			t.Errorf("not quiescent after the client finished: %s", state)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return c
}

// The requests client.mjs sent, as it reports them.
type completionRequest struct {
	Prompt    string `json:"prompt"`
	N         int    `json:"n"`
	Logprobs  int    `json:"logprobs"`
	MaxTokens int    `json:"max_tokens"`
	Echo      bool   `json:"echo"`
}

type chatRequest struct {
	N           int  `json:"n"`
	Logprobs    bool `json:"logprobs"`
	TopLogprobs int  `json:"top_logprobs"`
	MaxTokens   int  `json:"max_tokens"`
}

// What the client parsed: the fields of OpenAI's types the test reads.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type completion struct {
	Object  string             `json:"object"`
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	FinishReason *string             `json:"finish_reason"`
	Logprobs     *completionLogprobs `json:"logprobs"`
}

type completionLogprobs struct {
	TextOffset    []int          `json:"text_offset"`
	TokenLogprobs []*float64     `json:"token_logprobs"`
	Tokens        []string       `json:"tokens"`
	TopLogprobs   []*topLogprobs `json:"top_logprobs"`
}

// topLogprobs is a completion's top_logprobs object at one position, in
// the order its entries came (most likely first, the sampled token last
// when it is not among them).
type topLogprobs []tokenLogprob

type tokenLogprob struct {
	Token   string
	Logprob *float64
}

func (a tokenLogprob) String() string { return fmt.Sprintf("%q: %v", a.Token, deref(a.Logprob)) }

func (tl *topLogprobs) UnmarshalJSON(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("top_logprobs entry %s: not an object", b)
	}
	*tl = topLogprobs{}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return err
		}
		var v *float64
		if err := d.Decode(&v); err != nil {
			return fmt.Errorf("top_logprobs[%q]: %w", k, err)
		}
		*tl = append(*tl, tokenLogprob{Token: k.(string), Logprob: v})
	}
	_, err := d.Token()
	return err
}

type chatCompletion struct {
	Object  string       `json:"object"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatChoice struct {
	Index   int `json:"index"`
	Message struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
	} `json:"message"`
	FinishReason *string       `json:"finish_reason"`
	Logprobs     *chatLogprobs `json:"logprobs"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     *float64         `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

// chatTopLogprob is one of a chat token's top_logprobs.
type chatTopLogprob struct {
	Token   string   `json:"token"`
	Logprob *float64 `json:"logprob"`
	Bytes   []int    `json:"bytes"`
}

func (a chatTopLogprob) String() string {
	return fmt.Sprintf("{%q %v %v}", a.Token, deref(a.Logprob), a.Bytes)
}

type chatChunkChoice struct {
	Index int `json:"index"`
	Delta struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
	} `json:"delta"`
	FinishReason *string       `json:"finish_reason"`
	Logprobs     *chatLogprobs `json:"logprobs"`
}

// streamed is a stream as client.mjs collected it: every choice object
// under its index in arrival order, and the number of choices per chunk.
type streamed[C any] struct {
	Choices         map[int][]C `json:"choices"`
	ChoicesPerChunk []int       `json:"choices_per_chunk"`
}

type clientOutput struct {
	Model    string `json:"model"`
	Requests struct {
		Completion completionRequest `json:"completion"`
		Echo       completionRequest `json:"echo"`
		Chat       chatRequest       `json:"chat"`
	} `json:"requests"`
	Completion       completion                 `json:"completion"`
	Echo             completion                 `json:"echo"`
	Chat             chatCompletion             `json:"chat"`
	ChatStream       streamed[chatChunkChoice]  `json:"chat_stream"`
	CompletionStream streamed[completionChoice] `json:"completion_stream"`
	ChatStreamHelper struct {
		Chunks int            `json:"chunks"`
		Final  chatCompletion `json:"final"`
	} `json:"chat_stream_helper"`
}

// TestOpenAINPMClient runs client.mjs (the official openai npm client)
// against a PD pair and checks what it parsed: choices 0…n−1, every
// logprob finite and ≤ 0, top_logprobs as long as asked, completions'
// text_offset advancing by each token's length, echo scoring the prompt
// with a null first logprob, a streamed chat choice's content being its
// logprob tokens, and every streamed answer (the raw chunks per choice, and
// what the client's own stream accumulator made of them) equal to the
// non-streamed answer with the same seed.
func TestOpenAINPMClient(t *testing.T) {
	node := nodeAndClient(t)
	c := startPD(t)

	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", c.URL()+"/v1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs %s: %v after %s (deadline %s)\nstderr:\n%s\nstdout:\n%s", c.URL()+"/v1", err,
			time.Since(start).Round(time.Millisecond), clientDeadline, stderr.String(), stdout.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("node stderr:\n%s", s)
	}
	var out clientOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("client.mjs output is not the expected JSON: %v\n%s", err, stdout.String())
	}
	if out.Model != sim.DefaultName {
		t.Errorf("models.list gave %q, want %q", out.Model, sim.DefaultName)
	}
	creq, ereq, chreq := out.Requests.Completion, out.Requests.Echo, out.Requests.Chat
	// The requests must ask for what this test is about.
	if creq.N < 2 || creq.Logprobs < 1 || creq.MaxTokens < 2 || !ereq.Echo || ereq.Logprobs < 1 || ereq.MaxTokens != 0 ||
		chreq.N < 2 || !chreq.Logprobs || chreq.TopLogprobs < 1 || chreq.MaxTokens < 2 {
		t.Fatalf("client.mjs sent requests that do not exercise n and logprobs: %+v", out.Requests)
	}

	t.Run("completion", func(t *testing.T) {
		checkCompletion(t, out.Completion, creq)
	})
	t.Run("echo", func(t *testing.T) {
		e := out.Echo
		checkCompletion(t, e, ereq)
		if len(e.Choices) != 1 {
			return
		}
		ch := e.Choices[0]
		if ch.Text != ereq.Prompt {
			t.Errorf("echo text %q, want the prompt %q", ch.Text, ereq.Prompt)
		}
		if ch.Logprobs == nil || len(ch.Logprobs.Tokens) == 0 {
			return
		}
		if lp := ch.Logprobs; lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
			t.Errorf("echo: the prompt's first token has token_logprobs %v and top_logprobs %v, want null and null",
				deref(lp.TokenLogprobs[0]), lp.TopLogprobs[0])
		}
		if len(ch.Logprobs.Tokens) != e.Usage.PromptTokens {
			t.Errorf("echo: %d logprob tokens for %d prompt tokens", len(ch.Logprobs.Tokens), e.Usage.PromptTokens)
		}
	})
	t.Run("chat", func(t *testing.T) {
		checkChat(t, "chat", out.Chat, chreq)
		if want := chreq.N * chreq.MaxTokens; out.Chat.Usage.CompletionTokens != want {
			t.Errorf("usage.completion_tokens %d, want %d (%d choices × %d)", out.Chat.Usage.CompletionTokens, want, chreq.N, chreq.MaxTokens)
		}
	})
	t.Run("chat stream", func(t *testing.T) {
		checkOneChoicePerChunk(t, out.ChatStream.ChoicesPerChunk)
		checkIndices(t, out.ChatStream.Choices, chreq.N)
		for i := range chreq.N {
			events := out.ChatStream.Choices[i]
			if len(events) == 0 {
				continue
			}
			if events[0].Delta.Role != "assistant" {
				t.Errorf("choice %d: first event's delta.role %q, want assistant", i, events[0].Delta.Role)
			}
			var got chatChoice
			got.Index = i
			got.Message.Role = events[0].Delta.Role
			content := ""
			lp := &chatLogprobs{Content: []chatTokenLogprob{}}
			for j, ev := range events {
				if ev.Index != i {
					t.Errorf("choice %d: event %d has index %d", i, j, ev.Index)
				}
				if ev.Delta.Content != nil {
					content += *ev.Delta.Content
				}
				if ev.Logprobs != nil {
					lp.Content = append(lp.Content, ev.Logprobs.Content...)
				}
				if ev.FinishReason != nil {
					if j != len(events)-1 {
						t.Errorf("choice %d: finish_reason %q on event %d of %d", i, *ev.FinishReason, j, len(events))
					}
					got.FinishReason = ev.FinishReason
				}
			}
			if tokens := chatTokens(lp); content != tokens {
				t.Errorf("choice %d: streamed content %q, but its logprob tokens make %q", i, content, tokens)
			}
			got.Message.Content = &content
			got.Logprobs = lp
			if i < len(out.Chat.Choices) {
				if d := cmp.Diff(out.Chat.Choices[i], got); d != "" {
					t.Errorf("choice %d: streamed differs from non-streamed (same seed) (-non-streamed +streamed):\n%s", i, d)
				}
			}
		}
	})
	t.Run("chat stream accumulated by the client", func(t *testing.T) {
		h := out.ChatStreamHelper
		if h.Chunks < 2*chreq.N { // at least each choice's first and last
			t.Errorf("the client's stream yielded %d chunks for %d choices", h.Chunks, chreq.N)
		}
		checkChat(t, "finalChatCompletion", h.Final, chreq)
		// Usage is not streamed unless asked for.
		h.Final.Usage = out.Chat.Usage
		if d := cmp.Diff(out.Chat, h.Final); d != "" {
			t.Errorf("finalChatCompletion differs from the non-streamed answer (same seed) (-non-streamed +streamed):\n%s", d)
		}
	})
	t.Run("completion stream", func(t *testing.T) {
		checkOneChoicePerChunk(t, out.CompletionStream.ChoicesPerChunk)
		checkIndices(t, out.CompletionStream.Choices, creq.N)
		for i := range creq.N {
			events := out.CompletionStream.Choices[i]
			got := completionChoice{Index: i, Logprobs: &completionLogprobs{TextOffset: []int{},
				TokenLogprobs: []*float64{}, Tokens: []string{}, TopLogprobs: []*topLogprobs{}}}
			for j, ev := range events {
				if ev.Index != i {
					t.Errorf("choice %d: event %d has index %d", i, j, ev.Index)
				}
				got.Text += ev.Text
				if ev.Logprobs == nil {
					t.Errorf("choice %d: event %d has no logprobs", i, j)
				} else {
					l := got.Logprobs
					l.TextOffset = append(l.TextOffset, ev.Logprobs.TextOffset...)
					l.TokenLogprobs = append(l.TokenLogprobs, ev.Logprobs.TokenLogprobs...)
					l.Tokens = append(l.Tokens, ev.Logprobs.Tokens...)
					l.TopLogprobs = append(l.TopLogprobs, ev.Logprobs.TopLogprobs...)
				}
				if ev.FinishReason != nil {
					if j != len(events)-1 {
						t.Errorf("choice %d: finish_reason %q on event %d of %d", i, *ev.FinishReason, j, len(events))
					}
					got.FinishReason = ev.FinishReason
				}
			}
			checkCompletionChoice(t, fmt.Sprintf("streamed choice %d", i), got, i, creq)
			if i < len(out.Completion.Choices) {
				if d := cmp.Diff(out.Completion.Choices[i], got); d != "" {
					t.Errorf("choice %d: streamed differs from non-streamed (same seed) (-non-streamed +streamed):\n%s", i, d)
				}
			}
		}
	})
}

// checkCompletion checks a /v1/completions answer to req: its choices
// (n, or 1 for echo without output) and its usage.
func checkCompletion(t *testing.T, c completion, req completionRequest) {
	t.Helper()
	if c.Object != "text_completion" {
		t.Errorf("object %q", c.Object)
	}
	n := max(req.N, 1)
	if len(c.Choices) != n {
		t.Fatalf("%d choices, want %d: %+v", len(c.Choices), n, c.Choices)
	}
	for i, ch := range c.Choices {
		checkCompletionChoice(t, fmt.Sprintf("choice %d", i), ch, i, req)
	}
	if want := n * req.MaxTokens; c.Usage.CompletionTokens != want {
		t.Errorf("usage.completion_tokens %d, want %d (%d choices × %d)", c.Usage.CompletionTokens, want, n, req.MaxTokens)
	}
}

// checkCompletionChoice checks choice i of a completion: its index, its
// finish_reason (max_tokens reached: the requests ignore EOS), and its
// logprobs: one entry per token in every list, each logprob finite and
// ≤ 0 (the echoed prompt's first token: null), top_logprobs of logprobs
// entries or one more (the sampled token, when not among them), the
// tokens making the text and text_offset advancing by each token's
// length from 0.
func checkCompletionChoice(t *testing.T, where string, ch completionChoice, i int, req completionRequest) {
	t.Helper()
	if ch.Index != i {
		t.Errorf("%s: index %d, want %d", where, ch.Index, i)
	}
	if ch.FinishReason == nil || *ch.FinishReason != "length" {
		t.Errorf("%s: finish_reason %v, want length", where, deref(ch.FinishReason))
	}
	lp := ch.Logprobs
	if lp == nil {
		t.Errorf("%s: logprobs null", where)
		return
	}
	n := len(lp.Tokens)
	want := req.MaxTokens
	if req.Echo {
		want += len(req.Prompt) // the simulated model's tokens are bytes
	}
	if n != want || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
		t.Errorf("%s: %d tokens, %d token_logprobs, %d top_logprobs, %d text_offset; want %d of each",
			where, n, len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset), want)
		return
	}
	if text := strings.Join(lp.Tokens, ""); text != ch.Text {
		t.Errorf("%s: tokens %q make %q, text is %q", where, lp.Tokens, text, ch.Text)
	}
	offset := 0
	for j, tok := range lp.Tokens {
		if lp.TextOffset[j] != offset {
			t.Errorf("%s: text_offset %v: token %d (%q) at %d, want %d", where, lp.TextOffset, j, tok, lp.TextOffset[j], offset)
			break
		}
		offset += utf8.RuneCountInString(tok)
	}
	for j, tok := range lp.Tokens {
		at := fmt.Sprintf("%s token %d (%q)", where, j, tok)
		if req.Echo && j == 0 {
			continue // null, checked by the caller
		}
		checkLogprob(t, at+" token_logprobs", lp.TokenLogprobs[j])
		top := lp.TopLogprobs[j]
		if top == nil {
			t.Errorf("%s: top_logprobs null", at)
			continue
		}
		k := req.Logprobs
		if len(*top) != k && len(*top) != k+1 {
			t.Errorf("%s: %d top_logprobs %v, want %d or %d", at, len(*top), *top, k, k+1)
			continue
		}
		sampled := -1
		for e, a := range *top {
			checkLogprob(t, fmt.Sprintf("%s top_logprobs[%q]", at, a.Token), a.Logprob)
			if a.Token == tok {
				sampled = e
			}
			if e > 0 && e < k && a.Logprob != nil && (*top)[e-1].Logprob != nil && *a.Logprob > *(*top)[e-1].Logprob {
				t.Errorf("%s: top_logprobs %v not most likely first", at, *top)
			}
		}
		switch {
		case sampled < 0:
			t.Errorf("%s: the sampled token is not in top_logprobs %v", at, *top)
		case len(*top) == k+1 && sampled != k:
			t.Errorf("%s: %d top_logprobs %v, but the sampled token is among the first %d", at, k+1, *top, k)
		case lp.TokenLogprobs[j] != nil && (*top)[sampled].Logprob != nil && *(*top)[sampled].Logprob != *lp.TokenLogprobs[j]:
			t.Errorf("%s: logprob %v, %v in top_logprobs", at, *lp.TokenLogprobs[j], *(*top)[sampled].Logprob)
		}
	}
}

// checkChat checks a chat answer to req: n choices 0…n−1 of the assistant,
// each max_tokens long, its content made of its logprob tokens (and of
// their bytes), every logprob finite and ≤ 0 and exactly top_logprobs
// alternatives, most likely first.
func checkChat(t *testing.T, what string, c chatCompletion, req chatRequest) {
	t.Helper()
	if c.Object != "chat.completion" {
		t.Errorf("%s: object %q", what, c.Object)
	}
	if len(c.Choices) != req.N {
		t.Fatalf("%s: %d choices, want %d: %+v", what, len(c.Choices), req.N, c.Choices)
	}
	for i, ch := range c.Choices {
		where := fmt.Sprintf("%s choice %d", what, i)
		if ch.Index != i {
			t.Errorf("%s: index %d", where, ch.Index)
		}
		if ch.Message.Role != "assistant" || ch.Message.Content == nil {
			t.Errorf("%s: message role %q, content %v", where, ch.Message.Role, deref(ch.Message.Content))
			continue
		}
		if ch.FinishReason == nil || *ch.FinishReason != "length" {
			t.Errorf("%s: finish_reason %v, want length", where, deref(ch.FinishReason))
		}
		if ch.Logprobs == nil {
			t.Errorf("%s: logprobs null", where)
			continue
		}
		if len(ch.Logprobs.Content) != req.MaxTokens {
			t.Errorf("%s: %d logprobs, want %d", where, len(ch.Logprobs.Content), req.MaxTokens)
		}
		if tokens := chatTokens(ch.Logprobs); tokens != *ch.Message.Content {
			t.Errorf("%s: content %q, but its logprob tokens make %q", where, *ch.Message.Content, tokens)
		}
		var raw []byte
		for j, tl := range ch.Logprobs.Content {
			at := fmt.Sprintf("%s token %d (%q)", where, j, tl.Token)
			checkLogprob(t, at, tl.Logprob)
			raw = append(raw, intsBytes(tl.Bytes)...)
			if len(tl.TopLogprobs) != req.TopLogprobs {
				t.Errorf("%s: %d top_logprobs %+v, want %d", at, len(tl.TopLogprobs), tl.TopLogprobs, req.TopLogprobs)
			}
			for e, a := range tl.TopLogprobs {
				checkLogprob(t, fmt.Sprintf("%s top_logprobs[%d] (%q)", at, e, a.Token), a.Logprob)
				if string(intsBytes(a.Bytes)) != a.Token {
					t.Errorf("%s: top_logprobs[%d] bytes %v for token %q", at, e, a.Bytes, a.Token)
				}
				if a.Token == tl.Token && a.Logprob != nil && tl.Logprob != nil && *a.Logprob != *tl.Logprob {
					t.Errorf("%s: logprob %v, %v in top_logprobs", at, *tl.Logprob, *a.Logprob)
				}
				if e > 0 && a.Logprob != nil && tl.TopLogprobs[e-1].Logprob != nil && *a.Logprob > *tl.TopLogprobs[e-1].Logprob {
					t.Errorf("%s: top_logprobs %+v not most likely first", at, tl.TopLogprobs)
				}
			}
		}
		if string(raw) != *ch.Message.Content {
			t.Errorf("%s: the logprobs' bytes make %q, content is %q", where, raw, *ch.Message.Content)
		}
	}
}

// checkIndices checks that a stream carried choices 0…n−1 and no other.
func checkIndices[C any](t *testing.T, byIndex map[int][]C, n int) {
	t.Helper()
	for i := range n {
		if len(byIndex[i]) == 0 {
			t.Errorf("no streamed event for choice %d", i)
		}
	}
	for i := range byIndex {
		if i < 0 || i >= n {
			t.Errorf("streamed events for choice %d of %d", i, n)
		}
	}
}

// checkOneChoicePerChunk: with n > 1 each event carries one choice
// (docs/api.md, Streaming).
func checkOneChoicePerChunk(t *testing.T, perChunk []int) {
	t.Helper()
	for j, k := range perChunk {
		if k != 1 {
			t.Errorf("chunk %d carried %d choices, want 1 (choices per chunk: %v)", j, k, perChunk)
			return
		}
	}
}

func checkLogprob(t *testing.T, where string, lp *float64) {
	t.Helper()
	switch {
	case lp == nil:
		t.Errorf("%s: logprob null", where)
	case math.IsNaN(*lp) || math.IsInf(*lp, 0) || *lp > 0:
		t.Errorf("%s: logprob %v, want finite and ≤ 0", where, *lp)
	}
}

func chatTokens(l *chatLogprobs) string {
	var b strings.Builder
	for _, tl := range l.Content {
		b.WriteString(tl.Token)
	}
	return b.String()
}

func intsBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// deref renders a pointer's value, or null.
func deref[T any](p *T) any {
	if p == nil {
		return "null"
	}
	return *p
}

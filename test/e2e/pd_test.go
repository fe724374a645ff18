package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/fault"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
)

func client(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// TestOpenAIClient drives router + 1P1D with the official openai-go client:
// completion and chat, streaming and not. A streamed answer must equal the
// non-streamed one for the same seed.
func TestOpenAIClient(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{})
	ctx := context.Background()
	cl := client(c.URL())

	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(sim.DefaultName),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The KV cache moves from prefill to decode")},
		MaxTokens:   openai.Int(24),
		Temperature: openai.Float(0.8),
		Seed:        openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Object != "text_completion" {
		t.Fatalf("completion: %+v", comp)
	}
	if comp.Usage.PromptTokens != int64(len("The KV cache moves from prefill to decode")) || comp.Usage.CompletionTokens < 1 {
		t.Fatalf("usage %+v", comp.Usage)
	}

	// The same request streamed gives the same text.
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(sim.DefaultName),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The KV cache moves from prefill to decode")},
		MaxTokens:   openai.Int(24),
		Temperature: openai.Float(0.8),
		Seed:        openai.Int(7),
	})
	var streamed strings.Builder
	finish := ""
	for stream.Next() {
		ch := stream.Current()
		for _, c := range ch.Choices {
			streamed.WriteString(c.Text)
			if c.FinishReason != "" {
				finish = string(c.FinishReason)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if streamed.String() != comp.Choices[0].Text || finish != string(comp.Choices[0].FinishReason) {
		t.Fatalf("streamed %q (%s), non-streamed %q (%s)", streamed.String(), finish, comp.Choices[0].Text, comp.Choices[0].FinishReason)
	}

	chat, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     sim.DefaultName,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")},
		MaxTokens: openai.Int(32),
		Seed:      openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" || chat.Object != "chat.completion" {
		t.Fatalf("chat: %+v", chat)
	}
	if r := chat.Choices[0].FinishReason; r != "stop" && r != "length" {
		t.Fatalf("finish reason %q", r)
	}

	cs := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         sim.DefaultName,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")},
		MaxTokens:     openai.Int(32),
		Seed:          openai.Int(3),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := acc.Choices[0].Message.Content, chat.Choices[0].Message.Content; got != want {
		t.Fatalf("streamed chat %q, non-streamed %q", got, want)
	}
	if acc.Usage.CompletionTokens != chat.Usage.CompletionTokens || acc.Usage.PromptTokens != chat.Usage.PromptTokens {
		t.Fatalf("streamed usage %+v, non-streamed %+v", acc.Usage, chat.Usage)
	}

	models, err := cl.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != sim.DefaultName {
		t.Fatalf("models: %+v, %v", models, err)
	}
}

// TestPDEqualsColocated: for 50 random prompts and sampling settings, the
// disaggregated path produces exactly the tokens a colocated worker does
// (invariant 5). With the simulated model the tokens depend on the KV bytes
// in decode's pages, so this also checks the KV arrived intact.
func TestPDEqualsColocated(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	co := startServe(t, sim.Config{})
	rng := rand.New(rand.NewPCG(2026, 11))
	const letters = "abcdefghijklmnopqrstuvwxyz ,.ABCDEFGH0123456789\n"
	for i := range 50 {
		n := 1 + rng.IntN(300)
		var b strings.Builder
		for range n {
			b.WriteByte(letters[rng.IntN(len(letters))])
		}
		maxTok := 1 + rng.IntN(40)
		minTok := []int{0, 0, maxTok, rng.IntN(maxTok + 1)}[rng.IntN(4)]
		req := map[string]any{
			"prompt": b.String(), "max_tokens": maxTok, "min_tokens": minTok, "seed": rng.Uint64() >> 1,
			"temperature": []float64{0, 0.5, 1, 1.3}[rng.IntN(4)], "top_p": []float64{1, 0.9, 0.5}[rng.IntN(3)],
			"ignore_eos": rng.IntN(2) == 0, "return_token_ids": true,
		}
		sp, bp := postJSON(t, pd.URL()+"/v1/completions", req)
		sc, bc := postJSON(t, co.URL+"/v1/completions", req)
		if sp != http.StatusOK || sc != http.StatusOK {
			t.Fatalf("prompt %d: PD %d %s; colocated %d %s", i, sp, bp, sc, bc)
		}
		a, c := decodeCompletion(t, bp), decodeCompletion(t, bc)
		if !slices.Equal(a.Choices[0].TokenIDs, c.Choices[0].TokenIDs) || a.Choices[0].Text != c.Choices[0].Text ||
			a.Choices[0].FinishReason != c.Choices[0].FinishReason {
			t.Fatalf("prompt %d (%v): PD %v %q %s; colocated %v %q %s", i, req, a.Choices[0].TokenIDs, a.Choices[0].Text,
				a.Choices[0].FinishReason, c.Choices[0].TokenIDs, c.Choices[0].Text, c.Choices[0].FinishReason)
		}
		if len(a.Choices[0].TokenIDs) == 0 {
			t.Fatalf("prompt %d: no tokens", i)
		}
		// min_tokens: no EOS among the first min_tokens outputs.
		if ids := a.Choices[0].TokenIDs; len(ids) < minTok || slices.Contains(ids[:minTok], sim.EOS) {
			t.Fatalf("prompt %d: min_tokens %d, got %v", i, minTok, ids)
		}
	}
}

// corruptKV flips one byte of the KV_CHUNKs a prefill worker sends: the
// first one, or all of them.
type corruptKV struct {
	kvxfer.Backend
	all  bool
	done bool
}

func (c *corruptKV) Send(p kvxfer.PeerID, m kvxfer.Message) error {
	if ch, ok := m.(kvxfer.KVChunk); ok && (c.all || !c.done) {
		c.done = true
		data := slices.Clone(ch.Data)
		data[len(data)/2] ^= 0x40
		ch.Data = data
		m = ch
	}
	return c.Backend.Send(p, m)
}

func corruptPrefill(all bool) func(lifecycle.Role, int, kvxfer.Backend) kvxfer.Backend {
	return func(role lifecycle.Role, _ int, b kvxfer.Backend) kvxfer.Backend {
		if role == lifecycle.RolePrefill {
			return &corruptKV{Backend: b, all: all}
		}
		return b
	}
}

// TestCorruptedKVChunkFails: KV corrupted on the way fails the request with
// a checksum error instead of producing output; both workers free their
// pages. The router retries once on a new attempt; when that one is
// corrupted too, the client gets the checksum error.
func TestCorruptedKVChunkFails(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{wrap: corruptPrefill(true)})
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("corrupt me ", 20), "max_tokens": 8})
	e := decodeCompletion(t, body)
	if status != http.StatusBadGateway || e.Error == nil || !strings.Contains(e.Error.Message, "checksum") {
		t.Fatalf("want 502 with a checksum error, got %d %s", status, body)
	}
	if e.Error.Code != "failed_transfer" {
		t.Fatalf("the client got %q, want decode's root cause failed_transfer", e.Error.Code)
	}
	waitFor(t, 2*time.Second, "both attempts counted", func() (bool, string) {
		got := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "failed_transfer")
		return got == 2, fmt.Sprintf("decode counted %v failed transfers, want 2 (the attempt and its retry)", got)
	})
}

// TestCorruptedKVChunkRetried: one corrupted transfer costs one retry; the
// client gets the right answer.
func TestCorruptedKVChunkRetried(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{wrap: corruptPrefill(false)})
	co := startServe(t, sim.Config{})
	req := map[string]any{"prompt": strings.Repeat("corrupt me ", 20), "max_tokens": 8, "seed": 5, "return_token_ids": true}
	status, body := postJSON(t, c.URL()+"/v1/completions", req)
	_, want := postJSON(t, co.URL+"/v1/completions", req)
	if status != http.StatusOK || !slices.Equal(decodeCompletion(t, body).Choices[0].TokenIDs, decodeCompletion(t, want).Choices[0].TokenIDs) {
		t.Fatalf("got %d %s, colocated %s", status, body, want)
	}
	waitFor(t, 2*time.Second, "the corrupted attempt counted", func() (bool, string) {
		got := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_requests_finished_total", "outcome", "failed_transfer")
		return got == 1, fmt.Sprintf("decode counted %v failed transfers, want 1", got)
	})
	if got := counterValue(t, routerAsWorker(c), "pdserve_router_retries_total", "", ""); got != 1 {
		t.Fatalf("router retries %v, want 1", got)
	}
}

// TestRelabelledReplayRefused (issue 18): prefill's KV channel replays the
// complete KV stream of a finished room under the (room, gen) of the next
// room, whose prompt has the same length: whole, uncorrupted and with a
// matching checksum, only computed for another request. Decode refuses it
// before decoding a token (failed_transfer, counted as a wrong_binding
// frame); the router's retry meets the replay too (of the first attempt's
// own stream, under gen 2) and the client gets 502 failed_transfer, never
// the other request's text. Both workers return to baseline, and with the
// fault off the same request gets the answer colocated serving gives.
func TestRelabelledReplayRefused(t *testing.T) {
	t.Parallel()
	var fb *fault.Backend
	c := startPD(t, pdOptions{wrap: func(role lifecycle.Role, _ int, b kvxfer.Backend) kvxfer.Backend {
		if role != lifecycle.RolePrefill {
			return b
		}
		fb = fault.Wrap(b, fault.Config{Seed: 18, Replay: 1})
		return fb
	}})
	co := startServe(t, sim.Config{})
	first := map[string]any{"prompt": strings.Repeat("alpha ", 8), "max_tokens": 8, "ignore_eos": true, "seed": 18, "return_token_ids": true}
	second := map[string]any{"prompt": strings.Repeat("omega ", 8), "max_tokens": 8, "ignore_eos": true, "seed": 18, "return_token_ids": true}
	if status, body := postJSON(t, c.URL()+"/v1/completions", first); status != http.StatusOK {
		t.Fatalf("the first request (nothing to replay yet): %d %s", status, body)
	}
	status, body := postJSON(t, c.URL()+"/v1/completions", second)
	e := decodeCompletion(t, body)
	if status != http.StatusBadGateway || e.Error == nil || e.Error.Code != "failed_transfer" ||
		!strings.Contains(e.Error.Message, "not this request's") {
		t.Fatalf("want 502 failed_transfer naming the binding, got %d %s", status, body)
	}
	waitFor(t, 2*time.Second, "both attempts refused and counted", func() (bool, string) {
		d := workerGatherer{c.Decode[0]}
		failed := counterValue(t, d, "pdserve_requests_finished_total", "outcome", "failed_transfer")
		wrong := counterValue(t, d, "pdserve_kv_frames_dropped_total", "reason", "wrong_binding")
		return failed == 2 && wrong == 2, fmt.Sprintf("decode: %v failed transfers, %v wrong_binding frames; want 2 and 2 (%s)",
			failed, wrong, debugCounters(t, c))
	})
	if n := fb.Injected()["replay"]; n != 2 {
		t.Fatalf("%d streams replayed, want 2 (the attempt and its retry)", n)
	}
	fb.SetConfig(fault.Config{Seed: 18})
	status, body = postJSON(t, c.URL()+"/v1/completions", second)
	_, want := postJSON(t, co.URL+"/v1/completions", second)
	if status != http.StatusOK || !slices.Equal(decodeCompletion(t, body).Choices[0].TokenIDs, decodeCompletion(t, want).Choices[0].TokenIDs) {
		t.Fatalf("with the fault off: %d %s, colocated %s", status, body, want)
	}
}

// TestBadInput: every bad request gets a 4xx OpenAI error naming the
// problem; the server keeps serving and holds no pages for them.
func TestBadInput(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{})
	long := strings.Repeat("x", testContext+10)
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		want   string
	}{
		{"empty prompt", "/v1/completions", `{"prompt":"","max_tokens":4}`, 400, "prompt"},
		{"prompt longer than the context", "/v1/completions", map[string]any{"prompt": long, "max_tokens": 4}, 400, "context length"},
		{"negative max_tokens", "/v1/completions", `{"prompt":"hi","max_tokens":-3}`, 400, "max_tokens"},
		{"zero max_tokens", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, 400, "max_tokens"},
		{"huge max_tokens", "/v1/completions", `{"prompt":"hi","max_tokens":100000000}`, 400, "context length"},
		{"wrong type", "/v1/completions", `{"prompt":"hi","max_tokens":"ten"}`, 400, "max_tokens"},
		{"invalid JSON", "/v1/completions", `{"prompt":`, 400, "JSON"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"hi"}`, 404, "gpt-9"},
		{"n=129", "/v1/completions", `{"prompt":"hi","n":129}`, 400, "n"},
		{"best_of with stream", "/v1/completions", `{"prompt":"hi","best_of":2,"stream":true}`, 400, "best_of"},
		{"logit_bias outside the vocabulary", "/v1/completions", `{"prompt":"hi","logit_bias":{"100000":1}}`, 400, "logit_bias"},
		{"temperature out of range", "/v1/completions", `{"prompt":"hi","temperature":-1}`, 400, "temperature"},
		{"token id out of vocabulary", "/v1/completions", `{"prompt":[1,2,999999],"max_tokens":2}`, 400, "vocabulary"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"unknown role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "wizard"},
		{"body too large", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 5<<20) + `"}`, 413, "limit"},
		{"unknown path", "/v1/embeddings", `{}`, 404, "embeddings"},
		{"tool with a bad name", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"no spaces"}}]}`, 400, "tools"},
		{"unsupported schema keyword", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"(?<=a)b"}}}}`, 400, "lookbehind"},
		{"two constraints", "/v1/completions", `{"prompt":"hi","guided_regex":"a","guided_choice":["a"]}`, 400, "guided_choice"},
		{"path without slash", "/v1", `{}`, 404, "/v1"},
		{"double slash", "//v1/completions", `{"prompt":"hi"}`, 400, "use \"/v1/completions\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := postJSON(t, c.URL()+tc.path, tc.body)
			e := decodeCompletion(t, body)
			if status != tc.status || e.Error == nil || !strings.Contains(strings.ToLower(e.Error.Message), strings.ToLower(tc.want)) {
				t.Fatalf("want %d naming %q, got %d %s", tc.status, tc.want, status, body)
			}
		})
	}
	status, body := postJSON(t, c.URL()+"/v1/completions", `{"prompt":"still serving","max_tokens":3}`)
	if status != http.StatusOK {
		t.Fatalf("after bad input: %d %s", status, body)
	}
}

// TestClientDisconnectAbortsBothLegs: a client that goes away mid-stream
// aborts the request on both workers; their pages return to zero (the
// cleanup check) promptly.
func TestClientDisconnectAbortsBothLegs(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 5 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	resp := longStream(t, ctx, c.URL())
	cancel()
	resp.Body.Close()
	d := c.Decode[0].Worker
	waitFor(t, 5*time.Second, "decode aborted", func() (bool, string) {
		st, _ := d.Stats(time.Second)
		return st.Live == 0 && st.PagesUsed == 0, fmt.Sprintf("live %d pages %d", st.Live, st.PagesUsed)
	})
}

// TestShutdownFailsInFlight: stopping the deployment answers in-flight
// requests with an error rather than dropping them.
func TestShutdownFailsInFlight(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 5 * time.Millisecond}, machine: &mc, selfShutdown: true})
	type result struct {
		status int
		body   string
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(c.URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"forever","max_tokens":1500,"ignore_eos":true}`))
		if err != nil {
			done <- result{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		done <- result{resp.StatusCode, b.String()}
	}()
	d := c.Decode[0].Worker
	waitFor(t, 5*time.Second, "request decoding", func() (bool, string) {
		st, _ := d.Stats(time.Second)
		return st.Stages[lifecycle.StageDecoding] == 1, fmt.Sprint(st.Stages)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var e completion
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != http.StatusServiceUnavailable || e.Error == nil ||
		!strings.Contains(e.Error.Message, "shutting down") {
		t.Fatalf("in-flight request got %d %s; want 503 naming the shutdown", r.status, r.body)
	}
}

// TestPreemptionKeepsAnswers: with a decode pool far smaller than what the
// running requests will need, decode preempts the newest requests (their
// KV is recomputed locally) instead of reserving worst cases up front; every
// answer still equals the colocated one.
func TestPreemptionKeepsAnswers(t *testing.T) {
	t.Parallel()
	pageBytes := int64(testGeometry.BytesPerToken() * 16)
	c := startPD(t, pdOptions{memory: 40 * pageBytes, router: noAdmission()}) // 640 tokens; 16 requests will want ~1,900
	co := startServe(t, sim.Config{})
	rng := rand.New(rand.NewPCG(7, 7))
	type result struct {
		i        int
		pd, want []int32
		err      string
	}
	results := make(chan result, 16)
	for i := range 16 {
		req := map[string]any{"prompt": strings.Repeat(string(rune('a'+i)), 20+rng.IntN(20)), "max_tokens": 80 + rng.IntN(20),
			"ignore_eos": true, "seed": i, "temperature": 0.7, "return_token_ids": true}
		go func() {
			status, body := postJSON(t, c.URL()+"/v1/completions", req)
			_, want := postJSON(t, co.URL+"/v1/completions", req)
			r := result{i: i}
			if status != http.StatusOK {
				r.err = fmt.Sprint(status, string(body))
			} else {
				r.pd = decodeCompletion(t, body).Choices[0].TokenIDs
				r.want = decodeCompletion(t, want).Choices[0].TokenIDs
			}
			results <- r
		}()
	}
	for range 16 {
		r := <-results
		if r.err != "" {
			t.Fatalf("request %d: %s", r.i, r.err)
		}
		if !slices.Equal(r.pd, r.want) {
			t.Fatalf("request %d: PD %v, colocated %v", r.i, r.pd, r.want)
		}
	}
	if n := counterValue(t, workerGatherer{c.Decode[0]}, "pdserve_preemptions_total", "", ""); n == 0 {
		t.Fatal("decode never preempted; the test proved nothing")
	}
}

package llama_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// llama3Tokenizer is the Llama 3 tokenizer fixture of the tokenizer package.
const llama3Tokenizer = "../../internal/model/tokenizer/testdata/llama3"

// gunzipTo writes the decompressed src into dst.
func gunzipTo(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Skipf("tokenizer fixture missing: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadTokenizer(dir string) (model.Tokenizer, error) {
	t, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	return t, nil
}

type chatResult struct {
	Content string
	IDs     []int32
	Prompt  []int32
}

// chat posts a chat completion and returns the answer's text and ids.
func chat(base string, body map[string]any) (chatResult, error) {
	body["return_token_ids"] = true
	raw, err := json.Marshal(body)
	if err != nil {
		return chatResult{}, err
	}
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
	if err != nil {
		return chatResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return chatResult{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return chatResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			Message  struct{ Content string } `json:"message"`
			TokenIDs []int32                  `json:"token_ids"`
		} `json:"choices"`
		PromptTokenIDs []int32 `json:"prompt_token_ids"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		return chatResult{}, fmt.Errorf("bad answer %s (%v)", b, err)
	}
	return chatResult{Content: out.Choices[0].Message.Content, IDs: out.Choices[0].TokenIDs, Prompt: out.PromptTokenIDs}, nil
}

// TestChatLlama3Tokenizer serves a small random-weight model with Llama 3's
// vocabulary and its real tokenizer.json and chat template, colocated and
// PD, and checks chat completions: the prompt is rendered by the template
// (it starts with <|begin_of_text|><|start_header_id|>), and both
// deployments answer with the same tokens and text.
func TestChatLlama3Tokenizer(t *testing.T) {
	t.Parallel()
	spec := llamatest.Tiny()
	spec.Vocab, spec.Tied, spec.DType, spec.MaxPositions = 128256, true, llama.BF16, 2048
	spec.BOS, spec.EOS = 128000, []int{128001, 128008, 128009}
	dir := spec.WriteT(t)
	gunzipTo(t, filepath.Join(llama3Tokenizer, "tokenizer.json.gz"), filepath.Join(dir, "tokenizer.json"))
	gunzipTo(t, filepath.Join(llama3Tokenizer, "tokenizer_config.json.gz"), filepath.Join(dir, "tokenizer_config.json"))
	newModel, base := factory(t, dir, llama.Options{Name: "llama3-vocab", LoadTokenizer: loadTokenizer})
	if base.Tokenizer() == nil {
		t.Fatal("no tokenizer loaded")
	}
	questions := []string{"Hello! Who are you?", "Write a haiku about the sea.", "2+2=?", "Ünïcödé and emoji 🦙 test",
		"Tell me a story about a llama who learned to serve tokens.", "Why is the sky blue?"}
	maxTokens := 12
	if raceEnabled {
		// model.Sample sorts the whole 128K vocabulary per sampled token,
		// which the race detector makes slow.
		maxTokens = 4
	}
	bodies := func() []map[string]any {
		var out []map[string]any
		for i, q := range questions {
			b := map[string]any{"messages": []map[string]string{{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}},
				"max_tokens": maxTokens, "temperature": 0}
			if i%2 == 1 {
				b["temperature"], b["seed"] = 1.0, i
			}
			out = append(out, b)
		}
		return out
	}
	run := func(base string) []chatResult {
		res := make([]chatResult, len(questions))
		errs := make([]error, len(questions))
		var wg sync.WaitGroup
		for i, b := range bodies() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = chat(base, b)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("question %d: %v", i, err)
			}
		}
		return res
	}
	mc := machine(512)
	colocated := run(startServe(t, newModel, mc).URL)
	pd := run(startPD(t, newModel, mc).URL())
	t.Logf("question 0 (%d prompt tokens) → %q %v", len(colocated[0].Prompt), colocated[0].Content, colocated[0].IDs)
	for i := range questions {
		c, p := colocated[i], pd[i]
		if len(c.Prompt) < 2 || c.Prompt[0] != 128000 || c.Prompt[1] != 128006 {
			t.Errorf("question %d: prompt ids %v do not start with <|begin_of_text|><|start_header_id|>", i, c.Prompt[:min(4, len(c.Prompt))])
		}
		if len(c.IDs) == 0 || !equal(c.IDs, p.IDs) || c.Content != p.Content || !equal(c.Prompt, p.Prompt) {
			t.Errorf("question %d: colocated %q %v, PD %q %v", i, c.Content, c.IDs, p.Content, p.IDs)
		}
	}
}

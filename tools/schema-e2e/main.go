// Command schema-e2e checks structured outputs end to end: it sends
// chat completions constrained by real JSON Schemas (MaskBench's, from
// guidance-ai/jsonschemabench) to a running pdserve and validates every
// finished answer against its schema with an independent JSON Schema
// validator (santhosh-tekuri/jsonschema, formats asserted).
//
// Usage:
//
//	go run ./tools/schema-e2e -data DIR -url http://127.0.0.1:8000 [-n 1000]
//	    [-compare http://127.0.0.1:8001] [-max-tokens 1024] [-concurrency 8]
//
// DIR holds MaskBench's *.json files (see tools/maskbench for how to get
// them). Schemas are taken in file-name order, skipping those the server
// refuses with 400 (counted by reason) and those the validator cannot
// compile; request i uses seed i. An answer that ends for its length
// (finish_reason "length") is counted apart: it is a prefix of a valid text,
// not a whole one. With -compare, every request is also sent to a second
// server (colocated against PD, prefix cache on against off) and the two
// answers must be byte-identical.
//
// The exit status is 1 if any finished answer does not validate or any
// comparison differs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

func main() {
	var (
		data        = flag.String("data", "", "directory of MaskBench *.json files")
		url         = flag.String("url", "http://127.0.0.1:8000", "pdserve base URL")
		compare     = flag.String("compare", "", "a second server whose answers must equal the first's")
		n           = flag.Int("n", 1000, "requests to send (schemas the server refuses do not count)")
		maxTokens   = flag.Int("max-tokens", 1024, "max_tokens of each request")
		concurrency = flag.Int("concurrency", 8, "requests in flight")
		model       = flag.String("model", "", "model name (default: the server's first)")
	)
	flag.Parse()
	if *data == "" {
		fmt.Fprintln(os.Stderr, "schema-e2e: -data is required")
		os.Exit(2)
	}
	r := &runner{url: strings.TrimRight(*url, "/"), compare: strings.TrimRight(*compare, "/"), maxTokens: *maxTokens, model: *model, client: &http.Client{Timeout: 5 * time.Minute}}
	rep, err := r.run(context.Background(), *data, *n, *concurrency)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schema-e2e:", err)
		os.Exit(2)
	}
	rep.print(os.Stdout)
	if rep.Invalid > 0 || rep.Differ > 0 || rep.Failed > 0 {
		os.Exit(1)
	}
}

// report counts the outcomes of a run.
type report struct {
	Sent, Refused, Finished, Valid, Invalid, Length, Differ, Failed, ValidatorSkipped int
	RefusedBy                                                                         map[string]int
	Examples                                                                          []string
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "requests answered: %d (refused with 400: %d; schemas the validator cannot compile: %d)\n", r.Sent, r.Refused, r.ValidatorSkipped)
	fmt.Fprintf(w, "finished (stop): %d — valid %d, invalid %d (%.2f%% valid)\n", r.Finished, r.Valid, r.Invalid, 100*float64(r.Valid)/max(1, float64(r.Finished)))
	fmt.Fprintf(w, "ended by max_tokens: %d; failed requests: %d; answers differing from -compare: %d\n", r.Length, r.Failed, r.Differ)
	var keys []string
	for k := range r.RefusedBy {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.RefusedBy[keys[i]] > r.RefusedBy[keys[j]] })
	for i, k := range keys {
		if i == 10 {
			break
		}
		fmt.Fprintf(w, "  refused %5d  %s\n", r.RefusedBy[k], k)
	}
	for _, e := range r.Examples {
		fmt.Fprintln(w, "  !", e)
	}
}

type runner struct {
	url, compare, model string
	maxTokens           int
	client              *http.Client

	mu  sync.Mutex
	rep report
}

type job struct {
	seed   int
	file   string
	schema json.RawMessage
	sch    *jsonschema.Schema
}

func (r *runner) run(ctx context.Context, dir string, n, conc int) (*report, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.json files in %s", dir)
	}
	if r.model == "" {
		if r.model, err = r.firstModel(ctx); err != nil {
			return nil, err
		}
	}
	r.rep.RefusedBy = map[string]int{}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for j := range jobs {
				r.do(ctx, j)
			}
		})
	}
	seed := 0
	for _, f := range files {
		r.mu.Lock()
		done := r.rep.Sent >= n
		r.mu.Unlock()
		if done {
			break
		}
		schema, sch, err := loadSchema(f)
		if err != nil {
			r.mu.Lock()
			r.rep.ValidatorSkipped++
			r.mu.Unlock()
			continue
		}
		jobs <- job{seed: seed, file: filepath.Base(f), schema: schema, sch: sch}
		seed++
	}
	close(jobs)
	wg.Wait()
	return &r.rep, nil
}

// loadSchema reads a MaskBench file's schema and compiles it for
// validation (formats asserted; remote references refused).
func loadSchema(path string) (json.RawMessage, *jsonschema.Schema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var f struct {
		Schema json.RawMessage `json:"schema"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(f.Schema))
	if err != nil {
		return nil, nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noRemote{})
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		return nil, nil, err
	}
	sch, err := c.Compile("mem:///schema.json")
	if err != nil {
		return nil, nil, err
	}
	return f.Schema, sch, nil
}

type noRemote struct{}

func (noRemote) Load(url string) (any, error) { return nil, fmt.Errorf("remote reference %s", url) }

type answer struct {
	status  int
	content string
	finish  string
	errMsg  string
}

func (r *runner) do(ctx context.Context, j job) {
	a, err := r.ask(ctx, r.url, j)
	if err != nil {
		r.count(func(rep *report) { rep.Failed++; rep.example(fmt.Sprintf("%s: %v", j.file, err)) })
		return
	}
	if a.status == http.StatusBadRequest {
		r.count(func(rep *report) { rep.Refused++; rep.RefusedBy[reason(a.errMsg)]++ })
		return
	}
	if a.status != http.StatusOK {
		r.count(func(rep *report) {
			rep.Failed++
			rep.example(fmt.Sprintf("%s: status %d: %s", j.file, a.status, a.errMsg))
		})
		return
	}
	var differ string
	if r.compare != "" {
		b, err := r.ask(ctx, r.compare, j)
		switch {
		case err != nil:
			differ = err.Error()
		case b.status != a.status || b.content != a.content || b.finish != a.finish:
			differ = fmt.Sprintf("%q (%s) vs %q (%s)", clip(a.content), a.finish, clip(b.content), b.finish)
		}
	}
	var verr error
	if a.finish == "stop" {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(a.content))
		if err != nil {
			verr = err
		} else {
			verr = j.sch.Validate(v)
		}
	}
	r.count(func(rep *report) {
		rep.Sent++
		if differ != "" {
			rep.Differ++
			rep.example(fmt.Sprintf("%s seed %d: answers differ: %s", j.file, j.seed, differ))
		}
		switch a.finish {
		case "stop":
			rep.Finished++
			if verr != nil {
				rep.Invalid++
				rep.example(fmt.Sprintf("%s seed %d: %q does not validate: %v", j.file, j.seed, clip(a.content), firstLine(verr)))
			} else {
				rep.Valid++
			}
		case "length":
			rep.Length++
		}
	})
}

func (rep *report) example(s string) {
	if len(rep.Examples) < 20 {
		rep.Examples = append(rep.Examples, s)
	}
}

func (r *runner) count(f func(*report)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.rep)
}

func (r *runner) ask(ctx context.Context, base string, j job) (answer, error) {
	body, err := json.Marshal(map[string]any{
		"model":       r.model,
		"messages":    []map[string]string{{"role": "user", "content": "Answer in JSON."}},
		"max_tokens":  r.maxTokens,
		"temperature": 1,
		"seed":        j.seed,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{
			"name": "maskbench", "schema": j.schema,
		}},
	})
	if err != nil {
		return answer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		a.errMsg = e.Error.Message
		return a, nil
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return a, err
	}
	if len(out.Choices) != 1 {
		return a, errors.New("no choice in the answer")
	}
	a.content, a.finish = out.Choices[0].Message.Content, out.Choices[0].FinishReason
	return a, nil
}

func (r *runner) firstModel(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m); err != nil {
		return "", err
	}
	if len(m.Data) == 0 {
		return "", errors.New("the server lists no model")
	}
	return m.Data[0].ID, nil
}

// reason is the part of a refusal message that names what was refused.
func reason(msg string) string {
	if i := strings.Index(msg, "grammar: "); i >= 0 {
		msg = msg[i+len("grammar: "):]
	}
	if i := strings.Index(msg, ":"); i > 0 && i < 60 {
		return msg[:i]
	}
	return clip(msg)
}

func clip(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	return s
}

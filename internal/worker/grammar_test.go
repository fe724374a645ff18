package worker

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
	"github.com/pdserve/pdserve/internal/openai"
)

func simModel(t *testing.T) *sim.Model {
	t.Helper()
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32}, ContextLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestVocabOfSim: the simulated model's grammar vocabulary is its bytes,
// EOS (special) with none, and EOS the end.
func TestVocabOfSim(t *testing.T) {
	m := simModel(t)
	v, err := VocabOf(m.Info(), m.Tokenizer())
	if err != nil {
		t.Fatal(err)
	}
	if v.Size() != sim.VocabSize || string(v.Token('{')) != "{" || string(v.Token(0xe9)) != "\xe9" ||
		len(v.Token(sim.EOS)) != 0 || !v.IsEOS(sim.EOS) || v.IsEOS('a') {
		t.Fatalf("vocabulary: size %d, '{' %q, EOS %q", v.Size(), v.Token('{'), v.Token(sim.EOS))
	}
	if _, err := VocabOf(m.Info(), nil); err == nil {
		t.Fatal("a model without a tokenizer got a vocabulary")
	}
}

// TestGrammarCache: a constraint compiles once (a miss, timed), is then a
// hit, and the least recently used one leaves beyond the bound; a
// constraint that does not compile is the compiler's *grammar.Error and is
// not cached.
func TestGrammarCache(t *testing.T) {
	m := simModel(t)
	var hits, misses int
	var timed []time.Duration
	now := time.Unix(0, 0)
	clock := func() time.Time { now = now.Add(time.Millisecond); return now }
	g := newGrammars(m.Info(), m.Tokenizer(), 2, func(hit bool, d time.Duration) {
		if hit {
			hits++
		} else {
			misses++
			timed = append(timed, d)
		}
	}, clock)
	spec := func(i int) grammar.Spec {
		return grammar.Spec{Kind: grammar.KindChoice, Source: fmt.Sprintf(`["a%d","b"]`, i)}
	}
	get := func(i int) *grammar.Constraint {
		t.Helper()
		s := spec(i)
		c, err := g.get(s, s.Digest())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := get(1)
	if get(1) != a || hits != 1 || misses != 1 || timed[0] != time.Millisecond {
		t.Fatalf("hits %d misses %d timed %v", hits, misses, timed)
	}
	get(2)
	get(1) // 1 is now the most recently used
	get(3) // evicts 2
	if g.len() != 2 || misses != 3 {
		t.Fatalf("%d cached, %d misses", g.len(), misses)
	}
	if get(1) != a || misses != 3 {
		t.Fatal("1 was evicted, not the least recently used")
	}
	get(2)
	if misses != 4 {
		t.Fatal("2 was not evicted")
	}
	bad := grammar.Spec{Kind: grammar.KindChoice, Source: `not json`}
	_, err := g.get(bad, bad.Digest())
	var ge *grammar.Error
	if !errors.As(err, &ge) {
		t.Fatalf("bad constraint: %v, want a *grammar.Error", err)
	}
	if g.len() != 2 {
		t.Fatal("a failed constraint was cached")
	}
	// The constraint follows the model's vocabulary.
	mt := a.NewMatcher()
	mask := make([]uint64, a.Vocab().MaskWords())
	mt.FillMask(mask)
	if mask[0]|mask[2]|mask[3]|mask[4] != 0 || mask[1] != 1<<('a'-64)|1<<('b'-64) {
		t.Fatalf("first mask %x, want only 'a' and 'b'", mask)
	}
}

// TestVocabOfLlama3: with a byte-level BPE tokenizer (Llama 3's, from the
// tokenizer's test fixtures), the vocabulary holds each token's decoded
// bytes, special tokens none, and a JSON Schema constraint follows a valid
// instance token by token to where only EOS may come.
func TestVocabOfLlama3(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		f, err := os.Open(filepath.Join("..", "model", "tokenizer", "testdata", "llama3", name+".gz"))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	info := model.Info{VocabSize: tok.VocabSize(), EOS: tok.EOS()}
	v, err := VocabOf(info, tok)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(`{"name":"Ada Lovelace","born":1815}`, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if string(v.Token(id)) != string(tok.TokenBytes(id)) || len(v.Token(id)) == 0 {
			t.Fatalf("token %d: %q, the tokenizer's %q", id, v.Token(id), tok.TokenBytes(id))
		}
	}
	for _, id := range info.EOS {
		if len(v.Token(id)) != 0 || !v.IsEOS(id) {
			t.Fatalf("EOS %d: %q", id, v.Token(id))
		}
	}
	spec := grammar.Spec{Kind: grammar.KindJSONSchema, Source: `{"type":"object","properties":{"name":{"type":"string"},"born":{"type":"integer"}},"required":["name","born"],"additionalProperties":false}`}
	g := newGrammars(info, tok, 4, func(bool, time.Duration) {}, time.Now)
	c, err := g.get(spec, spec.Digest())
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	for i, id := range ids {
		m.FillMask(mask)
		if mask[id/64]>>(id%64)&1 == 0 {
			t.Fatalf("token %d (%q) of the instance is not in the mask", i, v.Token(id))
		}
		if !m.Accept(id) {
			t.Fatalf("token %d (%q) refused", i, v.Token(id))
		}
	}
	m.FillMask(mask)
	var allowed []int32
	for id := range int32(v.Size()) {
		if mask[id/64]>>(id%64)&1 != 0 {
			allowed = append(allowed, id)
		}
	}
	if !slices.Equal(allowed, slices.Sorted(slices.Values(info.EOS))) {
		t.Fatalf("after the instance the mask allows %v, want only EOS %v", allowed, info.EOS)
	}
}

// TestGenerateConstrained: a colocated worker's engine draws within the
// request's constraint (the sim's answer is one of the choices, then EOS),
// and refuses one that does not compile with a 400 naming "constraint".
func TestGenerateConstrained(t *testing.T) {
	w, err := New(Config{Model: simModel(t), Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
	words := []string{"yes", "no", "Maybe So"}
	for seed := range uint64(6) {
		s, err := w.Generate(context.Background(), &openai.GenerateRequest{RID: fmt.Sprint("r", seed), InputIDs: []int32{'h', 'i'},
			MaxTokens: 20, Sampling: model.SamplingParams{Temperature: 1, TopP: 1, Seed: seed},
			Constraint: grammar.Spec{Kind: grammar.KindChoice, Source: `["yes","no","Maybe So"]`}})
		if err != nil {
			t.Fatal(err)
		}
		var text []byte
		finish := ""
		for finish == "" {
			c, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, tk := range c.Tokens {
				if tk.ID != sim.EOS {
					text = append(text, byte(tk.ID))
				}
			}
			finish = c.FinishReason
		}
		if finish != "stop" || !slices.Contains(words, string(text)) {
			t.Fatalf("seed %d: %q %s, want one of %q and stop", seed, text, finish, words)
		}
	}
	_, err = w.Generate(context.Background(), &openai.GenerateRequest{RID: "bad", InputIDs: []int32{'h'}, MaxTokens: 4,
		Sampling: model.SamplingParams{TopP: 1}, Constraint: grammar.Spec{Kind: grammar.KindRegex, Source: "(unclosed"}})
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.Status != http.StatusBadRequest || oe.Param != "constraint" {
		t.Fatalf("bad constraint: %v", err)
	}
}

package llama_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

// storiesRef is a file of testdata/stories260K/gguf (see its README).
type storiesRef struct {
	Type       string `json:"type"`
	GGUFSHA256 string `json:"gguf_sha256"`
	Sequences  []struct {
		Tokens []int32   `json:"tokens"`
		Probs  []float64 `json:"last_position_probs"`
		Greedy []int32   `json:"greedy_continuation"`
	} `json:"sequences"`
}

// TestStories260KGGUF quantizes the stories260K fixture to Q8_0, Q4_0 and
// Q5_0 with WriteGGUF, loads the file, and compares with llama.cpp on the same
// file (testdata/stories260K/gguf, whose README explains the bounds): the
// next-token probabilities after each of the eight fixture sequences, and
// their 32-token greedy continuations. Every Q8_0 and Q5_0 continuation
// is identical; every sequence's probabilities are within 1e-2, and most
// within 1e-4 (tight: at least as many as when the references were made).
func TestStories260KGGUF(t *testing.T) {
	dir := llamatest.Stories260K(t)
	for _, c := range []struct {
		typ          gguf.Type
		tight, exact int // sequences within 1e-4; identical continuations
	}{{gguf.Q8_0, 5, 8}, {gguf.Q4_0, 7, 7}, {gguf.Q5_0, 5, 8}} {
		t.Run(c.typ.String(), func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(llamatest.FixtureDir(t), "gguf", "stories260K-"+c.typ.String()+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref storiesRef
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			path := writeGGUF(t, dir, c.typ)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != ref.GGUFSHA256 {
				t.Fatalf("WriteGGUF's %s file has sha256 %x, the references were made from %s: regenerate them (see testdata/stories260K/gguf/README.md)",
					c.typ, sum, ref.GGUFSHA256)
			}
			m := load(t, path, llama.Options{})
			V := m.Info().VocabSize
			tight, exact := 0, 0
			for i, s := range ref.Sequences {
				lg := logitsOf(t, m, s.Tokens)
				last := lg[(len(s.Tokens)-1)*V:]
				mx := math.Inf(-1)
				for _, l := range last {
					mx = math.Max(mx, float64(l))
				}
				var z float64
				for _, l := range last {
					z += math.Exp(float64(l) - mx)
				}
				var dp float64
				for id, p := range s.Probs {
					dp = math.Max(dp, math.Abs(math.Exp(float64(last[id])-mx)/z-p))
				}
				if dp <= 1e-4 {
					tight++
				}
				if dp > 1e-2 {
					t.Errorf("sequence %d (%d tokens): max |Δp| vs llama.cpp = %.3g, want ≤ 1e-2", i, len(s.Tokens), dp)
				}
				// Greedy continuation through Forward, one token at a time.
				p := newPool(t, m, 16, 16)
				in := []model.SeqInput{{Pages: alloc(t, p, p.PagesFor(len(s.Tokens)+len(s.Greedy))), Tokens: s.Tokens, Sample: true, Sampling: greedy}}
				out := make([]model.SeqOutput, 1)
				var got []int32
				for len(got) < len(s.Greedy) {
					if err := m.Forward(context.Background(), p, in, out); err != nil {
						t.Fatal(err)
					}
					got = append(got, out[0].Token)
					in[0].Pos += len(in[0].Tokens)
					in[0].Tokens = []int32{out[0].Token}
				}
				diverge := -1
				for k := range got {
					if got[k] != s.Greedy[k] {
						diverge = k
						break
					}
				}
				if diverge < 0 {
					exact++
				}
				t.Logf("sequence %d (%d tokens): max |Δp| %.2g, greedy continuation diverges at %d (-1: never)", i, len(s.Tokens), dp, diverge)
			}
			if tight < c.tight || exact < c.exact {
				t.Errorf("%s: %d of %d sequences within 1e-4 of llama.cpp (want ≥ %d), %d identical 32-token continuations (want ≥ %d)",
					c.typ, tight, len(ref.Sequences), c.tight, exact, c.exact)
			}
		})
	}
}

package grammar

import (
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// llama3 loads the Llama 3 tokenizer fixture (128,256 tokens) once per test
// binary and its Vocab (special tokens left out, EOS from its config).
var llama3 = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.LoadMaybeGzipped(filepath.Join("..", "model", "tokenizer", "testdata", "llama3"))
})

func llama3Vocab(t testing.TB) (*tokenizer.Tokenizer, *Vocab) {
	t.Helper()
	tok, err := llama3()
	if err != nil {
		t.Fatal(err)
	}
	toks := make([][]byte, tok.VocabSize())
	for i := range toks {
		if !tok.IsSpecial(int32(i)) {
			toks[i] = tok.TokenBytes(int32(i))
		}
	}
	v, err := NewVocab(toks, tok.EOS())
	if err != nil {
		t.Fatal(err)
	}
	return tok, v
}

// jsonGrammar is any JSON value, compact or (skip) with flexible
// whitespace, written with the Builder (independent of the JSON Schema
// compiler).
func jsonGrammar(t testing.TB, skip bool) *Grammar {
	var b Builder
	value := b.NewRule("value")
	object := b.NewRule("object")
	members := b.NewRule("members")
	array := b.NewRule("array")
	elems := b.NewRule("elems")
	hex := Class(RuneRange{'0', '9'}, RuneRange{'a', 'f'}, RuneRange{'A', 'F'})
	char := Or(NotClass(RuneRange{'"', '"'}, RuneRange{'\\', '\\'}, RuneRange{0, 0x1f}),
		Concat(Lit(`\`), Or(Class(RuneRange{'"', '"'}, RuneRange{'\\', '\\'}, RuneRange{'/', '/'}, RuneRange{'b', 'b'}, RuneRange{'f', 'f'}, RuneRange{'n', 'n'}, RuneRange{'r', 'r'}, RuneRange{'t', 't'}),
			Concat(Lit("u"), hex, hex, hex, hex))))
	str := Concat(Lit(`"`), Star(char), Lit(`"`))
	digit := Class(RuneRange{'0', '9'})
	num := Concat(Opt(Lit("-")), Or(Lit("0"), Concat(Class(RuneRange{'1', '9'}), Star(digit))),
		Opt(Concat(Lit("."), Plus(digit))), Opt(Concat(Class(RuneRange{'e', 'e'}, RuneRange{'E', 'E'}), Opt(Class(RuneRange{'+', '+'}, RuneRange{'-', '-'})), Plus(digit))))
	for _, alt := range []Sym{N(object), N(array), T(str), T(num), T(Lit("true")), T(Lit("false")), T(Lit("null"))} {
		b.AddAlt(value, alt)
	}
	b.AddAlt(object, T(Lit("{")), T(Lit("}")))
	b.AddAlt(object, T(Lit("{")), N(members), T(Lit("}")))
	b.AddAlt(members, T(str), T(Lit(":")), N(value))
	b.AddAlt(members, N(members), T(Lit(",")), T(str), T(Lit(":")), N(value))
	b.AddAlt(array, T(Lit("[")), T(Lit("]")))
	b.AddAlt(array, T(Lit("[")), N(elems), T(Lit("]")))
	b.AddAlt(elems, N(value))
	b.AddAlt(elems, N(elems), T(Lit(",")), N(value))
	if skip {
		b.SetSkip(Plus(Class(RuneRange{' ', ' '}, RuneRange{'\t', '\t'}, RuneRange{'\n', '\n'}, RuneRange{'\r', '\r'})))
	}
	g, err := b.Grammar(value)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const sampleJSON = `{"id": 12345, "name": "Ada Lovelace", "tags": ["math", "engines", "poetry"], "born": "1815-12-10", "active": true, "score": -3.25e2, "notes": null, "address": {"city": "London", "zip": "W1 \u00e9", "lines": ["12 St James's Square", "Westminster"]}, "quote": "That brain of mine is something more than merely mortal; as time will show."}`

// TestLlama3JSONDocument feeds a JSON document's tokens through the mask:
// every token is allowed, EOS only at the end, and FillMask agrees with
// Accept on a sample of tokens at each step.
func TestLlama3JSONDocument(t *testing.T) {
	tok, v := llama3Vocab(t)
	ids, err := tok.Encode(sampleJSON, false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConstraint(jsonGrammar(t, true), v)
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	eos := v.eos[0]
	for i, id := range ids {
		m.FillMask(mask)
		if mask[id>>6]&(1<<(id&63)) == 0 {
			t.Fatalf("token %d (%q) at %d refused", id, v.Token(id), i)
		}
		if mask[eos>>6]&(1<<(eos&63)) != 0 {
			t.Fatalf("EOS allowed at %d", i)
		}
		for probe := int32(i * 3989 % 4000); probe < int32(v.Size()); probe += 4000 {
			bit := mask[probe>>6]&(1<<(probe&63)) != 0
			if ok := m.Clone().Accept(probe); ok != bit {
				t.Fatalf("step %d token %d %q: mask %v, Accept %v", i, probe, v.Token(probe), bit, ok)
			}
		}
		if !m.Accept(id) {
			t.Fatalf("Accept(%d) refused", id)
		}
	}
	m.FillMask(mask)
	if mask[eos>>6]&(1<<(eos&63)) == 0 || !m.CanEnd() {
		t.Fatal("EOS not allowed at the end")
	}
}

// BenchmarkMaskLlama3JSON is the time of one FillMask over the Llama 3
// vocabulary along a JSON document (per token; -benchtime sets how many
// passes over the document). It reports p50 and p99 per-token times.
func BenchmarkMaskLlama3JSON(b *testing.B) {
	tok, v := llama3Vocab(b)
	ids, err := tok.Encode(sampleJSON, false)
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewConstraint(jsonGrammar(b, true), v)
	if err != nil {
		b.Fatal(err)
	}
	mask := make([]uint64, v.MaskWords())
	var times []time.Duration
	b.ResetTimer()
	for b.Loop() {
		m := c.NewMatcher()
		for _, id := range ids {
			t0 := time.Now()
			m.FillMask(mask)
			times = append(times, time.Since(t0))
			m.Accept(id)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(len(ids)), "tokens")
}

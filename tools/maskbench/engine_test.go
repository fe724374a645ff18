package main

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestGrammarEngineLlama3 loads the Llama 3 fixture as the tool does by
// default (gzipped files decompressed) and checks the Vocab built from it.
func TestGrammarEngineLlama3(t *testing.T) {
	e, err := newGrammarEngine(filepath.Join("..", "..", "internal", "model", "tokenizer", "testdata", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	if n := e.vocabSize(); n != 128256 {
		t.Errorf("vocabulary of %d tokens, want 128256", n)
	}
	text := `{"name": "Zoë", "n": [1, 2.5e-05]}`
	ids, err := e.encode(text)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, id := range ids {
		if e.tok.IsSpecial(id) {
			t.Errorf("token %d of %q is special (a BOS?)", id, text)
		}
		got = append(got, e.vocab.Token(id)...)
	}
	if !bytes.Equal(got, []byte(text)) {
		t.Errorf("the vocabulary's bytes of %q's tokens spell %q", text, got)
	}
	if len(e.eos()) == 0 {
		t.Fatal("no EOS id")
	}
	for _, id := range e.eos() {
		if !e.vocab.IsEOS(id) || len(e.vocab.Token(id)) != 0 {
			t.Errorf("EOS %d: IsEOS %v, bytes %q; want true and none", id, e.vocab.IsEOS(id), e.vocab.Token(id))
		}
	}
	if bos, ok := e.tok.BOS(); ok && len(e.vocab.Token(bos)) != 0 {
		t.Errorf("BOS %d has bytes %q in the vocabulary, want none", bos, e.vocab.Token(bos))
	}
}

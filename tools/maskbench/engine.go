package main

import (
	"errors"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// grammarEngine is the engine of internal/grammar with a Hugging Face
// tokenizer.
type grammarEngine struct {
	tok   *tokenizer.Tokenizer
	vocab *grammar.Vocab
}

// newGrammarEngine loads the tokenizer of dir and builds its grammar.Vocab:
// a token's bytes as tokenizer.TokenBytes gives them, special tokens
// empty, the tokenizer's EOS ids.
func newGrammarEngine(dir string) (*grammarEngine, error) {
	tok, err := loadTokenizer(dir)
	if err != nil {
		return nil, err
	}
	v, err := newVocab(tok)
	if err != nil {
		return nil, err
	}
	return &grammarEngine{tok: tok, vocab: v}, nil
}

// newVocab is tok's vocabulary as grammar.NewVocab takes it.
func newVocab(tok *tokenizer.Tokenizer) (*grammar.Vocab, error) {
	n := tok.VocabSize()
	tokens := make([][]byte, n)
	for id := range int32(n) {
		if !tok.IsSpecial(id) {
			tokens[id] = tok.TokenBytes(id)
		}
	}
	eos := tok.EOS()
	if len(eos) == 0 {
		return nil, errors.New("the tokenizer has no EOS token")
	}
	return grammar.NewVocab(tokens, eos)
}

// loadTokenizer loads the tokenizer of dir (gzipped files too).
func loadTokenizer(dir string) (*tokenizer.Tokenizer, error) { return tokenizer.LoadMaybeGzipped(dir) }

func (g *grammarEngine) vocabSize() int             { return g.vocab.Size() }
func (g *grammarEngine) eos() []int32               { return g.tok.EOS() }
func (g *grammarEngine) tokenBytes(id int32) []byte { return g.tok.TokenBytes(id) }

func (g *grammarEngine) encode(text string) ([]int32, error) { return g.tok.Encode(text, false) }

func (g *grammarEngine) compile(schema []byte, o compileOptions) (func() matcher, error) {
	gr, err := grammar.Compile(grammar.Spec{Kind: grammar.KindJSONSchema, Source: string(schema), FlexibleWhitespace: o.flexible, AnyPropertyOrder: o.anyOrder})
	if err != nil {
		return nil, err
	}
	c, err := grammar.NewConstraint(gr, g.vocab)
	if err != nil {
		return nil, err
	}
	return func() matcher { return c.NewMatcher() }, nil
}

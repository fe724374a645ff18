package grammar

import (
	"errors"
	"hash/maphash"
	"sync"
)

// Vocab is a model's vocabulary as byte strings, with its end-of-sequence
// ids. Build it once per model with NewVocab; it is read-only after.
type Vocab struct {
	tokens [][]byte
	eos    []int32
	isEOS  []bool
	trie   *trie

	// seeds key the expression shapes of every Constraint bound to v
	// (unpredictable, so that no request can aim a collision at another's
	// cache entry).
	seeds [2]maphash.Seed
	// shared caches, by lexer-state shape, the tokens inside a lexeme:
	// common lexemes (a JSON string, a number) are walked once per Vocab,
	// not once per grammar.
	shared struct {
		sync.Mutex
		m map[shape]*sharedInside
	}
}

// sharedInside is an insideEntry as every Constraint of a Vocab can use
// it: the frontier groups are named by the shape of the state before
// their byte and by one node of each, from which a Constraint finds its
// own state. Read-only once published.
type sharedInside struct {
	inside []uint64
	groups []sharedGroup
}

type sharedGroup struct {
	t     shape
	b     byte
	nodes []int32
}

// maxShared bounds the entries of a Vocab's shared cache (16 KiB each for
// a 128k vocabulary); when full, it is emptied and refilled.
const maxShared = 2048

// NewVocab makes a Vocab: tokens[i] is token i's bytes as it adds them to
// the output (a byte-level BPE token's bytes, an SPM piece with ▁ as a
// space); an empty or nil entry is a token no grammar ever allows (special
// and control tokens). eos are the ids that end the output; a grammar
// allows them only where the text may end.
func NewVocab(tokens [][]byte, eos []int32) (*Vocab, error) {
	v := &Vocab{tokens: tokens, eos: eos, isEOS: make([]bool, len(tokens))}
	v.seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
	v.shared.m = make(map[shape]*sharedInside)
	for _, id := range eos {
		if id < 0 || int(id) >= len(tokens) {
			return nil, errors.New("grammar: an EOS id is outside the vocabulary")
		}
		v.isEOS[id] = true
	}
	v.trie = buildTrie(tokens, v.isEOS)
	return v, nil
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return len(v.tokens) }

// MaskWords is the length of a mask for v: one bit per token, token i at
// bit i%64 of word i/64.
func (v *Vocab) MaskWords() int { return (len(v.tokens) + 63) / 64 }

// Token is token id's bytes.
func (v *Vocab) Token(id int32) []byte { return v.tokens[id] }

// IsEOS reports whether id ends the output.
func (v *Vocab) IsEOS(id int32) bool { return id >= 0 && int(id) < len(v.isEOS) && v.isEOS[id] }

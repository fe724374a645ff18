package worker

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
)

// grammarCacheSize bounds a worker's compiled constraints: the 256 most
// recently used distinct constraints stay compiled.
const grammarCacheSize = 256

// grammars is a worker's cache of compiled constraints, keyed by
// grammar.Spec.Digest, least recently used out beyond its bound, over the
// model's vocabulary (built on first use). It is safe for concurrent use:
// the HTTP handlers look constraints up before a request reaches the
// loop, so compiling never holds the loop up. Two requests that miss on
// the same constraint at once may both compile it; one result is kept.
type grammars struct {
	info  model.Info
	tok   model.Tokenizer
	bound int
	// lookup counts a lookup: a hit, or a miss that took d to compile.
	lookup func(hit bool, d time.Duration)
	now    func() time.Time

	vocabOnce sync.Once
	vocab     *grammar.Vocab
	vocabErr  error

	mu    sync.Mutex
	lru   *list.List // of *grammarEntry, most recently used first
	byKey map[string]*list.Element
}

type grammarEntry struct {
	key string
	c   *grammar.Constraint
}

// newGrammars is the cache of a worker serving a model with info and tok
// (nil: the model has no tokenizer, so constraints are refused).
func newGrammars(info model.Info, tok model.Tokenizer, bound int, lookup func(bool, time.Duration), now func() time.Time) *grammars {
	return &grammars{info: info, tok: tok, bound: bound, lookup: lookup, now: now,
		lru: list.New(), byKey: make(map[string]*list.Element)}
}

// VocabOf is the grammar vocabulary of a model with info and tok: token
// i's bytes are tok.TokenBytes(i), except that special tokens
// (model.SpecialTokens) and ids the tokenizer does not know get none, so
// no grammar allows them; info.EOS are the ids that end the output.
func VocabOf(info model.Info, tok model.Tokenizer) (*grammar.Vocab, error) {
	if tok == nil {
		return nil, errors.New("the model has no tokenizer, and a constraint needs its tokens' bytes")
	}
	special, _ := tok.(model.SpecialTokens)
	tokens := make([][]byte, info.VocabSize)
	for i := range tokens {
		id := int32(i)
		if special != nil && special.IsSpecial(id) {
			continue
		}
		tokens[i] = tok.TokenBytes(id)
	}
	return grammar.NewVocab(tokens, info.EOS)
}

// errCompilePanic wraps a compiler panic: a bug, not a bad constraint.
var errCompilePanic = errors.New("the grammar compiler failed")

// get returns the compiled constraint of spec, whose digest is key,
// compiling it on a miss. Its error is the compiler's (a *grammar.Error),
// the vocabulary's, or wraps errCompilePanic.
func (g *grammars) get(spec grammar.Spec, key string) (*grammar.Constraint, error) {
	g.mu.Lock()
	if e, ok := g.byKey[key]; ok {
		c := e.Value.(*grammarEntry).c
		if c.NewMatcher().Err() == nil {
			g.lru.MoveToFront(e)
			g.mu.Unlock()
			g.lookup(true, 0)
			return c, nil
		}
		// It outgrew the engine's bounds (grammar.ErrTooComplex) on some
		// output: compiled afresh, a request starts from small tables.
		g.lru.Remove(e)
		delete(g.byKey, key)
	}
	g.mu.Unlock()
	g.vocabOnce.Do(func() { g.vocab, g.vocabErr = VocabOf(g.info, g.tok) })
	if g.vocabErr != nil {
		return nil, g.vocabErr
	}
	start := g.now()
	c, err := compile(spec, g.vocab)
	g.lookup(false, g.now().Sub(start))
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.byKey[key]; ok { // compiled meanwhile by another request
		g.lru.MoveToFront(e)
		return e.Value.(*grammarEntry).c, nil
	}
	g.byKey[key] = g.lru.PushFront(&grammarEntry{key: key, c: c})
	for g.lru.Len() > g.bound {
		last := g.lru.Back()
		g.lru.Remove(last)
		delete(g.byKey, last.Value.(*grammarEntry).key)
	}
	return c, nil
}

// len is the number of constraints cached.
func (g *grammars) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lru.Len()
}

// compile compiles spec and binds it to v, within grammar.CompileLimit
// (grammar.ErrCompileTime past it: no request waits on a compile without a
// deadline). A panic of the compiler (a bug) is returned as an error, so a
// constraint can never take the worker down.
func compile(spec grammar.Spec, v *grammar.Vocab) (*grammar.Constraint, error) {
	return grammar.Within(grammar.CompileLimit, func() (c *grammar.Constraint, err error) {
		defer func() {
			if p := recover(); p != nil {
				c, err = nil, fmt.Errorf("%w: %v", errCompilePanic, p)
			}
		}()
		gr, err := grammar.Compile(spec)
		if err != nil {
			return nil, err
		}
		return grammar.NewConstraint(gr, v)
	})
}

// constrain gives q the compiled constraint of spec (nothing for the zero
// Spec). A constraint that does not compile here (the router compiled it
// already, so it should not happen) is a 400 naming the field
// "constraint"; a compiler panic is a 500.
func (w *Worker) constrain(q *lifecycle.Request, spec grammar.Spec) error {
	if spec.IsZero() {
		return nil
	}
	key := spec.Digest()
	c, err := w.grammars.get(spec, key)
	switch {
	case errors.Is(err, errCompilePanic):
		return openai.Internal("constraint: %v", err)
	case err != nil:
		return openai.BadRequest("constraint", "%v", err)
	}
	q.Constraint, q.ConstraintDigest = c, key
	return nil
}

package grammar

import (
	"sync"
)

// Constraint is a Grammar bound to a Vocab: the lexer automaton and the
// parser tables every Matcher of it shares. It is safe for concurrent use
// (its matchers take a lock around each call).
type Constraint struct {
	g *Grammar
	v *Vocab

	mu      sync.Mutex
	ex      *exprSet
	lx      *lexer
	p       *parser
	hasSkip bool
	init    *eset

	// walk buffers, per depth of the trie
	stLex []lexState
	stSet []*eset
	stLen []int // chart length at each depth
}

// NewConstraint binds g to v. It reports a grammar that can match no text.
func NewConstraint(g *Grammar, v *Vocab) (*Constraint, error) {
	c := &Constraint{g: g, v: v, ex: newExprSet()}
	var roots []eid
	byExpr := map[eid]int32{}
	nonEmpty := c.ex.concat(c.ex.byteRange(0, 0xFF), c.ex.repeat(c.ex.byteRange(0, 0xFF), 0, -1))
	lexOf := func(r *Regex) (int32, bool) {
		e := c.ex.fromRegex(r)
		nullable := c.ex.node(e).nullable
		if nullable {
			e = c.ex.and(e, nonEmpty)
		}
		if e == eNone || !c.ex.isLive(e) {
			return -1, nullable
		}
		if i, ok := byExpr[e]; ok {
			return i, nullable
		}
		i := int32(len(roots))
		roots = append(roots, e)
		byExpr[e] = i
		return i, nullable
	}
	// Count lexemes first: the parser needs their number, and lexOf
	// assigns indices as it goes.
	p, err := newParser(g, lexOf, 0)
	if err != nil {
		return nil, err
	}
	skip := int32(-1)
	if g.Skip != nil {
		e := c.ex.fromRegex(g.Skip)
		if c.ex.node(e).nullable {
			e = c.ex.and(e, nonEmpty)
		}
		if e != eNone && c.ex.isLive(e) {
			skip = int32(len(roots))
			roots = append(roots, e)
			c.hasSkip = true
		}
	}
	p.nLex = len(roots)
	c.p = p
	c.lx = newLexer(c.ex, roots, skip)
	c.init = p.initial(c.lx)
	c.stLex = make([]lexState, v.trie.maxDepth+1)
	c.stSet = make([]*eset, v.trie.maxDepth+1)
	c.stLen = make([]int, v.trie.maxDepth+1)
	return c, nil
}

// Vocab is the vocabulary c was bound to.
func (c *Constraint) Vocab() *Vocab { return c.v }

// startOf is the lexer state at the start of the lexeme after set s.
func (c *Constraint) startOf(s *eset) lexState {
	if s.start == unknown {
		s.start = c.lx.start(s.allowed, c.hasSkip)
	}
	return s.start
}

// Matcher follows one output through a Constraint. Not safe for concurrent
// use; Clone gives an independent copy (cheap: the Earley sets are
// immutable and shared).
type Matcher struct {
	c     *Constraint
	chart []*eset
	lex   lexState
	done  bool
}

// NewMatcher is a matcher at the start of the output.
func (c *Constraint) NewMatcher() *Matcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Each matcher starts from its own initial set: sets memoize what
	// follows them, and the memo of a set shared by matchers of other
	// goroutines would need the lock anyway; this keeps walks local.
	s := c.p.initial(c.lx)
	return &Matcher{c: c, chart: []*eset{s}, lex: c.startOf(s)}
}

// step advances the lexer over byte b from state t after chart, committing
// the lexeme that ends before b if b cannot extend it. It returns the new
// chart (chart itself or chart plus one set) and state, or ok false.
func (c *Constraint) step(chart []*eset, t lexState, b byte) ([]*eset, lexState, bool) {
	if n := c.lx.next(t, b); n != deadState {
		return chart, n, true
	}
	info := &c.lx.states[t]
	top := chart[len(chart)-1]
	switch {
	case info.accepts != nil:
		s := c.p.scan(chart, info.accepts, c.lx)
		if s == nil {
			return chart, deadState, false
		}
		chart = append(chart[:len(chart):len(chart)], s)
		n := c.lx.next(c.startOf(s), b)
		return chart, n, n != deadState
	case info.skipDone:
		n := c.lx.next(c.startOf(top), b)
		return chart, n, n != deadState
	}
	return chart, deadState, false
}

// canEnd reports whether the text of chart and lexer state t is whole.
func (c *Constraint) canEnd(chart []*eset, t lexState) bool {
	top := chart[len(chart)-1]
	info := &c.lx.states[t]
	if info.accepts != nil {
		s := c.p.scan(chart, info.accepts, c.lx)
		return s != nil && s.accept
	}
	if info.skipDone || t == c.startOf(top) {
		return top.accept
	}
	return false
}

// FillMask sets mask (Vocab.MaskWords words) to the tokens that may come
// next: bit i set iff token i keeps the output a prefix of some text of the
// grammar; an EOS id iff the output so far is a whole text of the grammar.
// After Done, only the EOS ids are set.
func (m *Matcher) FillMask(mask []uint64) {
	c := m.c
	clear(mask)
	v := c.v
	setEOS := func() {
		for _, id := range v.eos {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	if m.done {
		setEOS()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canEnd(m.chart, m.lex) {
		setEOS()
	}
	tr := v.trie
	stLex, stSet := c.stLex, c.stSet
	stLex[0] = m.lex
	base := m.chart
	stSet[0] = base[len(base)-1]
	// charts per depth: a commit inside a token pushes a set; the chart at
	// depth d is base plus the sets committed on the path to the node.
	path := make([]*eset, 0, 8)
	stLen := c.stLen
	stLen[0] = 0
	lx := c.lx
	n := int32(len(tr.b))
	for i := int32(1); i < n; {
		d := tr.depth[i]
		t := stLex[d-1]
		nt := lx.trans[int(t)<<8|int(tr.b[i])]
		if nt == unknown {
			nt = lx.next(t, tr.b[i])
		}
		if nt != deadState {
			stLex[d] = nt
			stSet[d] = stSet[d-1]
			stLen[d] = stLen[d-1]
		} else {
			path = path[:stLen[d-1]]
			chart := append(base[:len(base):len(base)], path...)
			ch, t2, ok := c.step(chart, t, tr.b[i])
			if !ok {
				i = tr.end[i]
				continue
			}
			if len(ch) > len(chart) {
				path = append(path, ch[len(ch)-1])
			}
			stLex[d] = t2
			stSet[d] = ch[len(ch)-1]
			stLen[d] = len(path)
		}
		for _, id := range tr.toks[tr.tokLo[i]:tr.tokLo[i+1]] {
			mask[id>>6] |= 1 << (id & 63)
		}
		i++
	}
}

// advance walks b from m's state; it reports false (m unchanged) if b is
// not a prefix of a text of the grammar.
func (m *Matcher) advance(b []byte) bool {
	c := m.c
	chart, t := m.chart, m.lex
	for _, x := range b {
		var ok bool
		chart, t, ok = c.step(chart, t, x)
		if !ok {
			return false
		}
	}
	m.chart, m.lex = chart, t
	return true
}

// Accept advances m over token tok and reports true, or reports false and
// leaves m unchanged if tok is not allowed (its bit would be clear in
// FillMask). Accepting an EOS id makes m Done.
func (m *Matcher) Accept(tok int32) bool {
	v := m.c.v
	if tok < 0 || int(tok) >= len(v.tokens) || m.done {
		return false
	}
	if v.isEOS[tok] {
		if !m.CanEnd() {
			return false
		}
		m.done = true
		return true
	}
	b := v.tokens[tok]
	if len(b) == 0 {
		return false
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.advance(b)
}

// AcceptBytes advances m over text b (not necessarily token-aligned), or
// reports false and leaves m unchanged.
func (m *Matcher) AcceptBytes(b []byte) bool {
	if m.done {
		return len(b) == 0
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.advance(b)
}

// CanEnd reports whether the output so far is a whole text of the grammar
// (an EOS would be allowed).
func (m *Matcher) CanEnd() bool {
	if m.done {
		return true
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.canEnd(m.chart, m.lex)
}

// Done reports whether m accepted an EOS id.
func (m *Matcher) Done() bool { return m.done }

// Clone returns an independent copy of m.
func (m *Matcher) Clone() *Matcher {
	c := *m
	c.chart = m.chart[:len(m.chart):len(m.chart)]
	return &c
}

// MatchString reports whether s is a whole text of g: a convenience for
// tests and tools, compiling g each call.
func MatchString(g *Grammar, s string) (bool, error) {
	v, err := byteVocab()
	if err != nil {
		return false, err
	}
	c, err := NewConstraint(g, v)
	if err != nil {
		return false, err
	}
	m := c.NewMatcher()
	return m.AcceptBytes([]byte(s)) && m.CanEnd(), nil
}

// byteVocab is a vocabulary of the 256 single bytes and an EOS (id 256).
func byteVocab() (*Vocab, error) {
	toks := make([][]byte, 257)
	for i := range 256 {
		toks[i] = []byte{byte(i)}
	}
	toks[256] = nil
	return NewVocab(toks, []int32{256})
}

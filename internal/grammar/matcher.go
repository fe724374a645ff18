package grammar

import (
	"slices"
	"sync"
)

// Constraint is a Grammar bound to a Vocab: the lexer automaton and the
// parser tables every Matcher of it shares. It is safe for concurrent use
// (its matchers take a lock around each call).
type Constraint struct {
	v *Vocab

	mu      sync.Mutex
	ex      *exprSet
	lx      *lexer
	p       *parser
	hasSkip bool

	inside map[lexState]*insideEntry

	// walk buffers, per depth of the trie
	stLex *[256]lexState
}

// NewConstraint binds g to v. It reports a grammar that can match no text.
func NewConstraint(g *Grammar, v *Vocab) (*Constraint, error) {
	c := &Constraint{v: v, ex: newExprSetSeeded(&v.seeds, int32(v.trie.maxDepth)+1)}
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
	// Each matcher closes its own initial set (NewMatcher); this one shows
	// whether the start alone outgrows the bounds.
	p.initial(c.lx)
	if c.over() {
		return nil, ErrTooComplex
	}
	c.stLex = new([256]lexState)
	c.inside = make(map[lexState]*insideEntry)
	return c, nil
}

// ErrTooComplex is reported by Matcher.Err when a Constraint outgrew its
// bounds (expressions, lexer states, Earley items): its masks are no longer
// trustworthy and the output must end.
var ErrTooComplex = &Error{Msg: "the constraint is too complex: it needs more than the engine's bounds (1Mi expressions, 32Ki lexer states, 64Ki items or 256Ki completions an Earley set)"}

// over reports whether c outgrew a bound.
func (c *Constraint) over() bool { return c.ex.over || c.lx.over || c.p.over }

// Err is ErrTooComplex once m's Constraint outgrew its bounds (its masks
// and Accept are then wrong: stop the output), else nil.
func (m *Matcher) Err() error {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.c.over() {
		return ErrTooComplex
	}
	return nil
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
// the lexeme that ends before b if b cannot extend it. It returns the set
// committed (nil if none) and the new state, or ok false.
func (c *Constraint) step(chart chartView, t lexState, b byte) (*eset, lexState, bool) {
	if n := c.lx.next(t, b); n != deadState {
		return nil, n, true
	}
	info := &c.lx.states[t]
	switch {
	case info.accepts != nil:
		s := c.p.scan(chart, info.accepts, c.lx)
		if s == nil {
			return nil, deadState, false
		}
		n := c.lx.next(c.startOf(s), b)
		return s, n, n != deadState
	case info.skipDone:
		n := c.lx.next(c.startOf(chart.top()), b)
		return nil, n, n != deadState
	}
	return nil, deadState, false
}

// canEnd reports whether the text of chart and lexer state t is whole.
func (c *Constraint) canEnd(chart chartView, t lexState) bool {
	top := chart.top()
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
//
// The tokens that stay inside the current lexeme depend on the lexer state
// alone and come from a cache (a bitset per state); so do, per parser
// outcome, the tokens that end it once. Only tokens that cross two lexeme
// boundaries are walked each time.
func (m *Matcher) FillMask(mask []uint64) {
	c := m.c
	v := c.v
	if m.done {
		clear(mask)
		for _, id := range v.eos {
			mask[id>>6] |= 1 << (id & 63)
		}
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ent := c.insideOf(m.lex)
	copy(mask, ent.inside)
	cv := chartView{base: m.chart}
	if c.canEnd(cv, m.lex) {
		for _, id := range v.eos {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	c.applyGroups(mask, cv, ent.groups)
}

// applyGroups sets the bits of the tokens that end a lexeme at one of
// groups' nodes, after chart: each group commits once, and its nodes'
// subtrees come from the cache per resulting lexer state, recursively for
// tokens that end several lexemes.
func (c *Constraint) applyGroups(mask []uint64, chart chartView, groups []*frontGroup) {
	tr := c.v.trie
	for _, g := range groups {
		s, n, ok := c.step(chart, g.t, g.b)
		if !ok {
			continue
		}
		r := g.results[n]
		if r == nil {
			r = c.frontierResult(g, n)
			g.results[n] = r
		}
		for _, i := range r.nodes {
			tr.setToks(mask, i)
		}
		if len(r.groups) > 0 {
			ch := chart
			if s != nil {
				ch = chart.push(s)
			}
			c.applyGroups(mask, ch, r.groups)
		}
	}
}

// insideEntry caches, for a lexer state s at a token boundary, the tokens
// whose bytes all extend the current lexeme (inside, a bitset), and the
// trie nodes where a token's next byte ends the lexeme (groups, by the
// state before that byte and the byte).
type insideEntry struct {
	inside []uint64
	groups []*frontGroup
}

// frontGroup is the trie nodes reached from a cached state where the lexer
// in state t cannot take byte b and must end its lexeme.
type frontGroup struct {
	t       lexState
	b       byte
	nodes   []int32
	results map[lexState]*frontResult
}

// frontResult is what a frontGroup's nodes allow when the lexer's state
// after the commit and byte b is the map key: tokens with no further
// boundary, and nodes that need another commit.
type frontResult struct {
	nodes  []int32 // nodes whose tokens are allowed
	groups []*frontGroup
}

// maxInside bounds the lexer states whose masks are cached per Constraint
// (each holds a bitset of the vocabulary: 16 KiB for 128k tokens).
const maxInside = 4096

func (c *Constraint) insideOf(s lexState) *insideEntry {
	if e := c.inside[s]; e != nil {
		return e
	}
	if e := c.fromShared(s); e != nil {
		c.keep(s, e)
		return e
	}
	e := c.viaErased(s)
	if e == nil {
		e = c.walkInside(s)
	}
	c.keep(s, e)
	if !c.over() {
		c.publish(s, e)
	}
	return e
}

// viaErased is s's entry made from the entry of s' — s with every
// complement of a finite language made universal (exprSet.erase) and its
// entries of finite languages left out — and a walk of the trie nodes
// where the two states differ, or nil if s has neither. A JSON key that must be none of an object's known names
// is the common case: s' is a plain string state, cached once for every
// object, and the two differ only along the known names' prefixes.
func (c *Constraint) viaErased(s lexState) *insideEntry {
	lx := c.lx
	info := &lx.states[s]
	// Entries of finite languages (known keys, partly typed) are left
	// out of s' as well, when an infinite one remains: they too differ
	// from s' only along their own prefixes.
	infinite := false
	for _, en := range info.entries {
		infinite = infinite || !c.ex.finite(en.expr)
	}
	entries := make([]lexEntry, 0, len(info.entries))
	changed := false
	for _, en := range info.entries {
		if infinite && c.ex.finite(en.expr) {
			changed = true
			continue
		}
		x := c.ex.erase(en.expr)
		entries = append(entries, lexEntry{en.lex, x})
		changed = changed || x != en.expr
	}
	if !changed || len(entries) == 0 {
		return nil
	}
	s2 := lx.addState(entries)
	if s2 == deadState || s2 == s {
		return nil
	}
	base := c.insideOf(s2)
	e := &insideEntry{inside: slices.Clone(base.inside)}
	tr := c.v.trie
	accepting := func(t lexState) bool { i := &lx.states[t]; return i.accepts != nil || i.skipDone }
	removed := map[int32]bool{} // nodes of base's groups that are not s's
	var cut [][2]int32          // subtrees base walked and s does not: their group nodes go
	groups := map[[2]uint32]*frontGroup{}
	var st, st2 [256]lexState
	st[0], st2[0] = s, s2
	for i := int32(1); i < int32(len(tr.nodes)); {
		nd := &tr.nodes[i]
		d := uint8(nd.p >> 8)
		pt, pt2 := st[d-1], st2[d-1]
		if pt == pt2 {
			i = nd.end // the same state: the subtree is as base has it
			continue
		}
		b := byte(nd.p)
		nt, nt2 := lx.next(pt, b), lx.next(pt2, b)
		if nt2 == deadState && accepting(pt2) {
			removed[i] = true
		}
		if nt == deadState {
			if accepting(pt) {
				k := [2]uint32{uint32(pt), uint32(b)}
				g := groups[k]
				if g == nil {
					g = &frontGroup{t: pt, b: b, results: map[lexState]*frontResult{}}
					groups[k] = g
					e.groups = append(e.groups, g)
				}
				g.nodes = append(g.nodes, i)
			}
			if nt2 != deadState {
				for _, id := range tr.toks[tr.tokLo[i]:tr.tokLo[nd.end]] {
					e.inside[id>>6] &^= 1 << (id & 63)
				}
				cut = append(cut, [2]int32{i + 1, nd.end})
			}
			i = nd.end
			continue
		}
		tr.setToks(e.inside, i)
		st[d], st2[d] = nt, nt2
		i++
	}
	for _, g := range base.groups {
		var nodes []int32
		for _, n := range g.nodes {
			if removed[n] || inCut(cut, n) {
				continue
			}
			nodes = append(nodes, n)
		}
		if len(nodes) > 0 {
			e.groups = append(e.groups, &frontGroup{t: g.t, b: g.b, nodes: nodes, results: map[lexState]*frontResult{}})
		}
	}
	return e
}

// inCut reports whether node n lies in one of the ranges of cut.
func inCut(cut [][2]int32, n int32) bool {
	for _, r := range cut {
		if n >= r[0] && n < r[1] {
			return true
		}
	}
	return false
}

func (c *Constraint) keep(s lexState, e *insideEntry) {
	if len(c.inside) < maxInside {
		c.inside[s] = e
	}
}

// fromShared is s's entry made from the Vocab's shared cache, or nil.
func (c *Constraint) fromShared(s lexState) *insideEntry {
	v := c.v
	v.shared.Lock()
	se := v.shared.m[c.lx.states[s].shape]
	v.shared.Unlock()
	if se == nil {
		return nil
	}
	e := &insideEntry{inside: se.inside, groups: make([]*frontGroup, len(se.groups))}
	tr := v.trie
	var path []byte
	for i, g := range se.groups {
		// The state before the group's byte: s stepped along the path to
		// the parent of one of its nodes (all share it).
		path = path[:0]
		for n := tr.parent[g.nodes[0]]; n > 0; n = tr.parent[n] {
			path = append(path, tr.nodes[n].byte())
		}
		t := s
		for j := len(path) - 1; j >= 0 && t != deadState; j-- {
			t = c.lx.next(t, path[j])
		}
		if t == deadState || c.lx.states[t].shape != g.t {
			return nil // cannot happen unless shapes collide; walk instead
		}
		e.groups[i] = &frontGroup{t: t, b: g.b, nodes: g.nodes, results: map[lexState]*frontResult{}}
	}
	return e
}

// publish offers e, walked from s, to the Vocab's shared cache.
func (c *Constraint) publish(s lexState, e *insideEntry) {
	se := &sharedInside{inside: e.inside, groups: make([]sharedGroup, len(e.groups))}
	for i, g := range e.groups {
		se.groups[i] = sharedGroup{t: c.lx.states[g.t].shape, b: g.b, nodes: g.nodes}
	}
	v := c.v
	v.shared.Lock()
	defer v.shared.Unlock()
	if len(v.shared.m) >= maxShared {
		clear(v.shared.m)
	}
	v.shared.m[c.lx.states[s].shape] = se
}

// walkInside walks the whole trie from s without committing a lexeme.
func (c *Constraint) walkInside(s lexState) *insideEntry {
	tr := c.v.trie
	e := &insideEntry{inside: make([]uint64, c.v.MaskWords())}
	groups := map[[2]uint32]*frontGroup{}
	st := c.stLex
	st[0] = s
	lx := c.lx
	nodes := tr.nodes
	inside := e.inside
	trans := lx.trans
	for i := 1; i < len(nodes); {
		nd := &nodes[i]
		d := uint8(nd.p >> 8)
		t := st[d-1]
		nt := trans[uint(t)<<8|uint(nd.p&0xFF)]
		if nt == unknown {
			nt = lx.next(t, byte(nd.p))
			trans = lx.trans
		}
		if nt == deadState {
			if info := &lx.states[t]; info.accepts != nil || info.skipDone {
				k := [2]uint32{uint32(t), nd.p & 0xFF}
				g := groups[k]
				if g == nil {
					g = &frontGroup{t: t, b: byte(nd.p), results: map[lexState]*frontResult{}}
					groups[k] = g
					e.groups = append(e.groups, g)
				}
				g.nodes = append(g.nodes, int32(i))
			}
			i = int(nd.end)
			continue
		}
		st[d] = nt
		if id := nd.tok; id >= 0 {
			inside[uint32(id)>>6] |= 1 << (id & 63)
		} else if id == -2 {
			tr.setToks(inside, int32(i))
		}
		i++
	}
	return e
}

// frontierResult walks g's nodes from lexer state n (the state after the
// commit and the node's byte) without committing again.
func (c *Constraint) frontierResult(g *frontGroup, n lexState) *frontResult {
	tr := c.v.trie
	lx := c.lx
	r := &frontResult{}
	st := c.stLex
	groups := map[[2]uint32]*frontGroup{}
	for _, root := range g.nodes {
		st[tr.nodes[root].depth()] = n
		if tr.nodes[root].tok != -1 {
			r.nodes = append(r.nodes, root)
		}
		for i := root + 1; i < tr.nodes[root].end; {
			nd := &tr.nodes[i]
			d := nd.depth()
			t := st[d-1]
			nt := lx.next(t, nd.byte())
			if nt == deadState {
				if info := &lx.states[t]; info.accepts != nil || info.skipDone {
					k := [2]uint32{uint32(t), uint32(nd.byte())}
					sg := groups[k]
					if sg == nil {
						sg = &frontGroup{t: t, b: nd.byte(), results: map[lexState]*frontResult{}}
						groups[k] = sg
						r.groups = append(r.groups, sg)
					}
					sg.nodes = append(sg.nodes, i)
				}
				i = nd.end
				continue
			}
			st[d] = nt
			if nd.tok != -1 {
				r.nodes = append(r.nodes, i)
			}
			i++
		}
	}
	return r
}

// advance walks b from m's state; it reports false (m unchanged) if b is
// not a prefix of a text of the grammar.
func (m *Matcher) advance(b []byte) bool {
	c := m.c
	chart, t := m.chart, m.lex
	for _, x := range b {
		s, n, ok := c.step(chartView{base: chart}, t, x)
		if !ok {
			return false
		}
		if s != nil {
			// Amortized: a Clone's chart has no spare capacity, so
			// appending never writes into a chart another matcher reads.
			chart = append(chart, s)
		}
		t = n
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
	return m.c.canEnd(chartView{base: m.chart}, m.lex)
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

// Validate reports whether g can be bound to a vocabulary: that some text
// matches it (its start rule derives a string of live lexemes) and that it
// stays within the engine's bounds at its start. It is what NewConstraint
// checks, without a vocabulary; errors are *Error.
func (g *Grammar) Validate() error {
	v, err := NewVocab([][]byte{nil}, []int32{0})
	if err != nil {
		return err
	}
	_, err = NewConstraint(g, v)
	return err
}

package grammar

import (
	"encoding/binary"
	"slices"
)

// lexState is a state of the lexer automaton: a vector of (lexeme,
// derivative) pairs, one per lexeme still possible. 0 is the dead state
// (no lexeme possible).
type lexState uint32

const (
	deadState lexState = 0
	unknown            = ^lexState(0)
)

// lexEntry is one lexeme still possible and what of it is left to match.
type lexEntry struct {
	lex  int32
	expr eid
}

// lexInfo describes a lexer state.
type lexInfo struct {
	entries []lexEntry
	// accepts are the lexemes (not the skip lexeme) whose match is
	// complete here, as a set over lexeme indices; nil if none.
	accepts *lexSet
	// skipDone: the skip lexeme's match is complete here.
	skipDone bool
	// shape identifies the set of the entries' expressions (by wshape)
	// across Constraints: what the tokens inside a lexeme depend on.
	shape shape
	// part is the byte classes of the entries' lexemes: bytes of a class
	// lead to the same state.
	part *bytePartition
}

// lexSet is a set of lexeme indices; its key is its bytes.
type lexSet struct {
	bits []uint64
	key  string
}

func (s *lexSet) has(i int32) bool { return s.bits[i>>6]&(1<<(i&63)) != 0 }

// maxLexStates bounds the lexer states of one Constraint (each costs 1 KiB
// of transitions, so at most 32 MiB). Long outputs of strings with length
// bounds make a state per position: MaskBench's largest documents (1,600
// tokens, three in a row through one Constraint) reach 16Ki.
const maxLexStates = 1 << 15

// lexer is the lazily built automaton over every lexeme of a grammar. Not
// safe for concurrent use.
type lexer struct {
	over   bool // maxLexStates reached: see Constraint.Err
	ex     *exprSet
	roots  []eid // per lexeme: its expression; the skip lexeme is last
	skip   int32 // index of the skip lexeme, or -1
	states []lexInfo
	trans  []lexState // [state*256 + byte]
	index  map[string]lexState
	sets   map[string]*lexSet
	parts  []*bytePartition // per lexeme, its root's classes (lazily)
	// partsBySet caches partOf by the lexemes of a state.
	partsBySet map[string]*bytePartition
	key        []byte
}

func newLexer(ex *exprSet, roots []eid, skip int32) *lexer {
	l := &lexer{ex: ex, roots: roots, skip: skip, index: make(map[string]lexState), sets: make(map[string]*lexSet)}
	l.addState(nil) // dead
	return l
}

func (l *lexer) internSet(bits []uint64) *lexSet {
	k := make([]byte, 0, len(bits)*8)
	for _, w := range bits {
		k = binary.LittleEndian.AppendUint64(k, w)
	}
	if s, ok := l.sets[string(k)]; ok {
		return s
	}
	s := &lexSet{bits: slices.Clone(bits), key: string(k)}
	l.sets[s.key] = s
	return s
}

// addState interns the state of entries (sorted by lexeme, each live).
func (l *lexer) addState(entries []lexEntry) lexState {
	k := l.key[:0]
	for _, e := range entries {
		k = binary.AppendUvarint(k, uint64(e.lex))
		k = binary.AppendUvarint(k, uint64(e.expr))
	}
	l.key = k
	if len(entries) == 0 && len(l.states) > 0 {
		return deadState
	}
	if s, ok := l.index[string(k)]; ok {
		return s
	}
	if len(l.states) >= maxLexStates {
		l.over = true
		return deadState
	}
	id := lexState(len(l.states))
	info := lexInfo{entries: entries}
	var bits []uint64
	for _, e := range entries {
		if !l.ex.node(e.expr).nullable {
			continue
		}
		if e.lex == l.skip {
			info.skipDone = true
			continue
		}
		if bits == nil {
			bits = make([]uint64, (len(l.roots)+63)/64)
		}
		bits[e.lex>>6] |= 1 << (e.lex & 63)
	}
	if bits != nil {
		info.accepts = l.internSet(bits)
	}
	shapes := make([]shape, len(entries))
	for i, e := range entries {
		shapes[i] = l.ex.node(e.expr).wshape
	}
	slices.SortFunc(shapes, cmpShape)
	shapes = slices.Compact(shapes)
	kb := make([]byte, 0, 16*len(shapes))
	for _, x := range shapes {
		kb = binary.LittleEndian.AppendUint64(kb, x[0])
		kb = binary.LittleEndian.AppendUint64(kb, x[1])
	}
	info.shape = hashShape(l.ex.seeds, kb)
	info.part = l.partOf(entries)
	l.states = append(l.states, info)
	for range 256 {
		l.trans = append(l.trans, unknown)
	}
	if id == deadState {
		for i := range 256 {
			l.trans[i] = deadState
		}
	}
	l.index[string(k)] = id
	return id
}

// start is the state at the beginning of a lexeme, any of allowed (and the
// skip lexeme if withSkip).
func (l *lexer) start(allowed *lexSet, withSkip bool) lexState {
	var entries []lexEntry
	for i := range int32(len(l.roots)) {
		if (allowed != nil && i != l.skip && allowed.has(i)) || (withSkip && i == l.skip) {
			entries = append(entries, lexEntry{i, l.roots[i]})
		}
	}
	return l.addState(entries)
}

// next is the state after byte c from s.
func (l *lexer) next(s lexState, c byte) lexState {
	t := l.trans[int(s)<<8|int(c)]
	if t != unknown {
		return t
	}
	var entries []lexEntry
	for _, e := range l.states[s].entries {
		d := l.ex.derive(e.expr, c)
		if d != eNone && l.ex.isLiveIn(d, l.rootPart(e.lex)) {
			entries = append(entries, lexEntry{e.lex, d})
		}
	}
	t = l.addState(entries)
	part := l.states[s].part
	cls := part.class[c]
	row := l.trans[int(s)<<8 : int(s)<<8+256]
	for b := range row {
		if part.class[b] == cls {
			row[b] = t
		}
	}
	return t
}

// partOf is the byte classes of the lexemes of entries: the join of their
// roots' classes, cached by the set of lexemes.
func (l *lexer) partOf(entries []lexEntry) *bytePartition {
	k := make([]byte, 0, 4*len(entries))
	for _, e := range entries {
		k = binary.AppendUvarint(k, uint64(e.lex))
	}
	if p, ok := l.partsBySet[string(k)]; ok {
		return p
	}
	p := wholePartition
	for _, e := range entries {
		p = p.join(l.rootPart(e.lex))
	}
	if l.partsBySet == nil {
		l.partsBySet = make(map[string]*bytePartition)
	}
	l.partsBySet[string(k)] = p
	return p
}

// rootPart is the byte classes of lexeme i's expression.
func (l *lexer) rootPart(i int32) *bytePartition {
	if l.parts == nil {
		l.parts = make([]*bytePartition, len(l.roots))
	}
	if l.parts[i] == nil {
		l.parts[i] = l.ex.partition(l.roots[i])
	}
	return l.parts[i]
}

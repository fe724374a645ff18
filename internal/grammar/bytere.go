package grammar

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"unicode/utf8"
)

// A byte-level regular expression, hash-consed in an exprSet: equal
// expressions (up to the normalizations of the constructors below) have
// equal ids, so Brzozowski derivatives reach a finite set of ids and the
// lexer's states can be compared by id.
//
// Normalizations (Owens, Reppy and Turon, "Regular-expression derivatives
// re-examined", 2009): ∅ and ε absorbed in concatenations, concatenation
// right-associated, Or and And flattened, sorted and deduplicated, byte
// sets in an Or merged, double complement removed, a repeat of a nullable
// expression starting at 0.
type eid uint32

const (
	eNone  eid = 0 // ∅
	eEmpty eid = 1 // ε
)

type ekind uint8

const (
	kNone ekind = iota
	kEmpty
	kBytes  // one byte in set
	kConcat // a then b
	kOr
	kAnd
	kNot
	kRepeat // a, min…max times (max < 0: unbounded)
)

type byteSet [4]uint64

func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }
func (s *byteSet) add(b byte)      { s[b>>6] |= 1 << (b & 63) }
func (s *byteSet) empty() bool     { return s[0]|s[1]|s[2]|s[3] == 0 }

type enode struct {
	kind     ekind
	nullable bool
	set      byteSet // kBytes
	a, b     eid     // kConcat: a b; kNot, kRepeat: a
	subs     []eid   // kOr, kAnd: sorted, distinct
	min, max int32   // kRepeat
	// hasBool: the expression contains And or Not (its liveness needs a
	// search; without them every id but eNone matches something).
	hasBool bool
	// shape is a keyed hash of the expression's structure (children by
	// their shapes, Or and And as sets): equal across exprSets for equal
	// expressions, so caches shared by the Constraints of a Vocab can be
	// keyed by it.
	shape shape
	// wshape is shape with the counts of repeats that hold no And or Not
	// saturated at the exprSet's sat (beyond it no token can tell them
	// apart: each repetition takes a byte, and no token is longer), and
	// exact within And and Not (whose liveness may depend on far counts).
	// Two lexer states of equal wshapes walk the vocabulary alike.
	wshape shape
}

// shape is a 128-bit keyed structural hash.
type shape [2]uint64

// exprSet interns expressions and memoizes their derivatives. Not safe for
// concurrent use (the Constraint holding it serializes access).
type exprSet struct {
	// sat is where wshape saturates repeat counts (the longest token plus
	// one); 0: never.
	sat int32
	// over is set once the set holds maxExprNodes expressions: new ones
	// are then ∅, and the Constraint reports ErrTooComplex.
	over   bool
	seeds  *[2]maphash.Seed
	nodes  []enode
	index  map[string]eid
	deriv  map[uint64]eid // id<<8 | byte
	live   map[eid]bool
	parts  map[eid]*bytePartition
	conv   map[*Regex]eid // fromRegex's results: grammars share subtrees
	fin    map[eid]bool   // finite's results
	erased map[eid]eid    // erase's results
	key    []byte
}

// newExprSet is an exprSet whose shapes are keyed by fresh seeds.
func newExprSet() *exprSet {
	return newExprSetSeeded(&[2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, 0)
}

// newExprSetSeeded is an exprSet whose shapes are keyed by seeds (a
// Vocab's, so that its Constraints' shapes agree).
func newExprSetSeeded(seeds *[2]maphash.Seed, sat int32) *exprSet {
	s := &exprSet{seeds: seeds, sat: sat, index: make(map[string]eid), deriv: make(map[uint64]eid), live: make(map[eid]bool), parts: make(map[eid]*bytePartition), conv: make(map[*Regex]eid), fin: make(map[eid]bool), erased: make(map[eid]eid)}
	s.intern(enode{kind: kNone})
	s.intern(enode{kind: kEmpty, nullable: true})
	return s
}

func (s *exprSet) intern(n enode) eid {
	k := s.key[:0]
	k = append(k, byte(n.kind))
	switch n.kind {
	case kBytes:
		for _, w := range n.set {
			k = binary.LittleEndian.AppendUint64(k, w)
		}
	case kConcat:
		k = binary.AppendUvarint(k, uint64(n.a))
		k = binary.AppendUvarint(k, uint64(n.b))
	case kNot:
		k = binary.AppendUvarint(k, uint64(n.a))
	case kRepeat:
		k = binary.AppendUvarint(k, uint64(n.a))
		k = binary.AppendVarint(k, int64(n.min))
		k = binary.AppendVarint(k, int64(n.max))
	case kOr, kAnd:
		for _, x := range n.subs {
			k = binary.AppendUvarint(k, uint64(x))
		}
	}
	s.key = k
	if id, ok := s.index[string(k)]; ok {
		return id
	}
	if len(s.nodes) >= maxExprNodes {
		s.over = true
		return eNone
	}
	id := eid(len(s.nodes))
	n.shape, n.wshape = s.shapeOf(&n)
	s.nodes = append(s.nodes, n)
	s.index[string(k)] = id
	return id
}

// shapeOf hashes n's kind, payload and children's shapes: exactly, and
// with saturated counts (see enode.wshape).
func (s *exprSet) shapeOf(n *enode) (shape, shape) {
	b := make([]byte, 0, 64)
	b = append(b, byte(n.kind))
	var kids []eid
	switch n.kind {
	case kBytes:
		for _, w := range n.set {
			b = binary.LittleEndian.AppendUint64(b, w)
		}
	case kConcat:
		kids = []eid{n.a, n.b}
	case kNot, kRepeat:
		kids = []eid{n.a}
	case kOr, kAnd:
		kids = n.subs
	}
	one := func(sat bool) shape {
		b := b
		if n.kind == kRepeat {
			lo, hi := n.min, n.max
			if sat {
				lo = min(lo, s.sat)
				if hi > s.sat {
					hi = -1
				}
			}
			b = binary.LittleEndian.AppendUint32(b, uint32(lo))
			b = binary.LittleEndian.AppendUint32(b, uint32(hi))
		}
		ks := make([]shape, len(kids))
		for i, k := range kids {
			if sat {
				ks[i] = s.nodes[k].wshape
			} else {
				ks[i] = s.nodes[k].shape
			}
		}
		if n.kind == kOr || n.kind == kAnd {
			slices.SortFunc(ks, cmpShape)
		}
		for _, k := range ks {
			b = binary.LittleEndian.AppendUint64(b, k[0])
			b = binary.LittleEndian.AppendUint64(b, k[1])
		}
		return hashShape(s.seeds, b)
	}
	exact := one(false)
	if s.sat <= 0 || n.hasBool {
		return exact, exact
	}
	return exact, one(true)
}

func hashShape(seeds *[2]maphash.Seed, b []byte) shape {
	return shape{maphash.Bytes(seeds[0], b), maphash.Bytes(seeds[1], b)}
}

func cmpShape(a, b shape) int {
	if c := cmp.Compare(a[0], b[0]); c != 0 {
		return c
	}
	return cmp.Compare(a[1], b[1])
}

func (s *exprSet) node(id eid) *enode { return &s.nodes[id] }

func (s *exprSet) bytes(set byteSet) eid {
	if set.empty() {
		return eNone
	}
	return s.intern(enode{kind: kBytes, set: set})
}

func (s *exprSet) byteRange(lo, hi byte) eid {
	var set byteSet
	for w := range set {
		// bits lo…hi of word w (bytes 64w…64w+63)
		a, b := max(int(lo), 64*w), min(int(hi), 64*w+63)
		if a <= b {
			n := uint(b - a + 1)
			m := ^uint64(0)
			if n < 64 {
				m = (1<<n - 1)
			}
			set[w] = m << uint(a-64*w)
		}
	}
	return s.bytes(set)
}

func (s *exprSet) concat(a, b eid) eid {
	switch {
	case a == eNone || b == eNone:
		return eNone
	case a == eEmpty:
		return b
	case b == eEmpty:
		return a
	}
	na := s.node(a)
	if na.kind == kConcat {
		x, y := na.a, na.b
		return s.concat(x, s.concat(y, b))
	}
	nb := s.node(b)
	return s.intern(enode{kind: kConcat, a: a, b: b, nullable: na.nullable && nb.nullable, hasBool: na.hasBool || nb.hasBool})
}

func (s *exprSet) concatAll(ids ...eid) eid {
	r := eEmpty
	for i := len(ids) - 1; i >= 0; i-- {
		r = s.concat(ids[i], r)
	}
	return r
}

// or is the union of ids.
func (s *exprSet) or(ids ...eid) eid {
	var subs []eid
	var set byteSet
	nset := 0
	for _, id := range ids {
		n := s.node(id)
		switch n.kind {
		case kNone:
		case kOr:
			for _, x := range n.subs {
				if xn := s.node(x); xn.kind == kBytes {
					for i := range set {
						set[i] |= xn.set[i]
					}
					nset++
				} else {
					subs = append(subs, x)
				}
			}
		case kBytes:
			for i := range set {
				set[i] |= n.set[i]
			}
			nset++
		default:
			subs = append(subs, id)
		}
	}
	if nset > 0 {
		subs = append(subs, s.bytes(set))
	}
	slices.Sort(subs)
	subs = slices.Compact(subs)
	switch len(subs) {
	case 0:
		return eNone
	case 1:
		return subs[0]
	}
	n := enode{kind: kOr, subs: subs}
	for _, x := range subs {
		xn := s.node(x)
		n.nullable = n.nullable || xn.nullable
		n.hasBool = n.hasBool || xn.hasBool
	}
	return s.intern(n)
}

// and is the intersection of ids.
func (s *exprSet) and(ids ...eid) eid {
	var subs []eid
	for _, id := range ids {
		n := s.node(id)
		switch n.kind {
		case kNone:
			return eNone
		case kAnd:
			subs = append(subs, n.subs...)
		case kNot:
			if n.a == eNone {
				continue // r ∩ everything = r
			}
			subs = append(subs, id)
		default:
			subs = append(subs, id)
		}
	}
	slices.Sort(subs)
	subs = slices.Compact(subs)
	switch len(subs) {
	case 0:
		return s.not(eNone)
	case 1:
		return subs[0]
	}
	// ε ∩ r is ε or ∅; a byte set ∩ a byte set is their intersection.
	for _, x := range subs {
		if x == eEmpty {
			for _, y := range subs {
				if !s.node(y).nullable {
					return eNone
				}
			}
			return eEmpty
		}
	}
	n := enode{kind: kAnd, subs: subs, nullable: true, hasBool: true}
	for _, x := range subs {
		n.nullable = n.nullable && s.node(x).nullable
	}
	return s.intern(n)
}

func (s *exprSet) not(a eid) eid {
	n := s.node(a)
	if n.kind == kNot {
		return n.a
	}
	return s.intern(enode{kind: kNot, a: a, nullable: !n.nullable, hasBool: true})
}

func (s *exprSet) repeat(a eid, min, max int32) eid {
	n := s.node(a)
	if n.nullable {
		min = 0
	}
	switch {
	case max >= 0 && max < min:
		return eNone
	case max == 0 || a == eEmpty:
		return eEmpty
	case a == eNone:
		if min == 0 {
			return eEmpty
		}
		return eNone
	case min == 1 && max == 1:
		return a
	}
	return s.intern(enode{kind: kRepeat, a: a, min: min, max: max, nullable: min == 0, hasBool: n.hasBool})
}

// finite reports whether id's language is finite (no unbounded repeat, no
// complement), memoized.
func (s *exprSet) finite(id eid) bool {
	if v, ok := s.fin[id]; ok {
		return v
	}
	n := s.nodes[id]
	v := true
	switch n.kind {
	case kNot:
		v = false
	case kRepeat:
		v = n.max >= 0 && s.finite(n.a)
	case kConcat:
		v = s.finite(n.a) && s.finite(n.b)
	case kOr, kAnd:
		for _, x := range n.subs {
			v = v && s.finite(x)
		}
	}
	s.fin[id] = v
	return v
}

// erase is id with every complement of a finite language replaced by the
// universal language (a superset of id's language, memoized): the
// expression a mask walk of id's state mostly agrees with, since a
// derivative of such a complement is universal as soon as the text leaves
// the finite language's prefixes (a JSON key that is none of an object's
// known names, once it is none of their prefixes).
func (s *exprSet) erase(id eid) eid {
	if !s.nodes[id].hasBool {
		return id
	}
	if v, ok := s.erased[id]; ok {
		return v
	}
	n := s.nodes[id]
	var r eid
	switch n.kind {
	case kNot:
		if s.finite(n.a) {
			r = s.not(eNone)
		} else {
			r = s.not(s.erase(n.a))
			if s.erase(n.a) != n.a {
				r = id // complement of a superset is a subset: keep it exact
			}
		}
	case kConcat:
		r = s.concat(s.erase(n.a), s.erase(n.b))
	case kRepeat:
		r = s.repeat(s.erase(n.a), n.min, n.max)
	case kOr, kAnd:
		subs := make([]eid, len(n.subs))
		for i, x := range n.subs {
			subs[i] = s.erase(x)
		}
		if n.kind == kOr {
			r = s.or(subs...)
		} else {
			r = s.and(subs...)
		}
	default:
		r = id
	}
	s.erased[id] = r
	return r
}

// derive is the Brzozowski derivative of id by byte c: the expression
// matching {w : c·w ∈ L(id)}.
func (s *exprSet) derive(id eid, c byte) eid {
	if id <= eEmpty {
		return eNone
	}
	k := uint64(id)<<8 | uint64(c)
	if d, ok := s.deriv[k]; ok {
		return d
	}
	n := s.nodes[id] // copy: interning below may grow s.nodes
	var d eid
	switch n.kind {
	case kBytes:
		if n.set.has(c) {
			d = eEmpty
		}
	case kConcat:
		d = s.concat(s.derive(n.a, c), n.b)
		if s.node(n.a).nullable {
			d = s.or(d, s.derive(n.b, c))
		}
	case kOr:
		ds := make([]eid, len(n.subs))
		for i, x := range n.subs {
			ds[i] = s.derive(x, c)
		}
		d = s.or(ds...)
	case kAnd:
		ds := make([]eid, len(n.subs))
		for i, x := range n.subs {
			ds[i] = s.derive(x, c)
		}
		d = s.and(ds...)
	case kNot:
		d = s.not(s.derive(n.a, c))
	case kRepeat:
		min, max := n.min-1, n.max-1
		if min < 0 {
			min = 0
		}
		if n.max < 0 {
			max = -1
		}
		d = s.concat(s.derive(n.a, c), s.repeat(n.a, min, max))
	}
	s.deriv[k] = d
	return d
}

// maxExprNodes bounds the expressions (derivatives included) one
// Constraint may build.
const maxExprNodes = 1 << 20

// liveBudget bounds the derivatives explored to decide whether an
// expression with And or Not matches anything; past it, it is assumed to.
const liveBudget = 4096

// isLive reports whether id matches at least one byte string.
func (s *exprSet) isLive(id eid) bool { return s.isLiveIn(id, nil) }

// isLiveIn is isLive for a derivative of an expression whose byte classes
// are part (nil: id's own, computed).
func (s *exprSet) isLiveIn(id eid, part *bytePartition) bool {
	if id == eNone {
		return false
	}
	n := s.node(id)
	if !n.hasBool || n.nullable {
		return true
	}
	if v, ok := s.live[id]; ok {
		return v
	}
	// Breadth-first over derivatives by every byte, until a nullable one.
	// Depth first (a witness of a string-like language is found in about
	// as many steps as its shortest text is long), one byte per class,
	// looking one derivative ahead for a nullable one.
	if part == nil {
		part = s.partition(id)
	}
	reps := part.reps
	seen := map[eid]bool{id: true}
	stack := []eid{id}
	res := false
	for len(stack) > 0 && !res {
		if len(seen) > liveBudget {
			res = true
			break
		}
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range reps {
			d := s.derive(x, c)
			if d == eNone || seen[d] {
				continue
			}
			if n := s.node(d); n.nullable || !n.hasBool {
				res = true
				break
			}
			if v, ok := s.live[d]; ok {
				if v {
					res = true
					break
				}
				continue
			}
			seen[d] = true
			stack = append(stack, d)
		}
	}
	if !res {
		for x := range seen {
			s.live[x] = false
		}
	}
	s.live[id] = res
	return res
}

// fromRegex converts a code-point Regex to bytes (UTF-8).
func (s *exprSet) fromRegex(r *Regex) eid {
	if id, ok := s.conv[r]; ok {
		return id
	}
	id := s.convert(r)
	s.conv[r] = id
	return id
}

func (s *exprSet) convert(r *Regex) eid {
	switch r.Op {
	case OpNone:
		return eNone
	case OpEmpty:
		return eEmpty
	case OpBytes:
		var set byteSet
		for _, x := range r.Ranges {
			for c := x.Lo; c <= x.Hi && c <= 0xFF; c++ {
				set.add(byte(c))
			}
		}
		return s.bytes(set)
	case OpClass:
		var alts []eid
		for _, x := range r.Ranges {
			alts = s.utf8Range(alts, x.Lo, x.Hi)
		}
		return s.or(alts...)
	case OpConcat:
		ids := make([]eid, len(r.Subs))
		for i, x := range r.Subs {
			ids[i] = s.fromRegex(x)
		}
		return s.concatAll(ids...)
	case OpOr:
		ids := make([]eid, len(r.Subs))
		for i, x := range r.Subs {
			ids[i] = s.fromRegex(x)
		}
		return s.or(ids...)
	case OpAnd:
		ids := make([]eid, len(r.Subs))
		for i, x := range r.Subs {
			ids[i] = s.fromRegex(x)
		}
		return s.and(ids...)
	case OpNot:
		return s.not(s.fromRegex(r.Subs[0]))
	case OpRepeat:
		return s.repeat(s.fromRegex(r.Subs[0]), int32(r.Min), int32(r.Max))
	}
	return eNone
}

// utf8Range appends to alts byte sequences matching the UTF-8 encodings of
// the code points lo…hi (no surrogates), splitting the range where the
// encoding's length or leading bytes change (as RE2's UTF-8 compiler
// does).
func (s *exprSet) utf8Range(alts []eid, lo, hi rune) []eid {
	if lo > hi {
		return alts
	}
	// Split at encoding-length boundaries.
	for _, lim := range []rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= lim && hi > lim {
			alts = s.utf8Range(alts, lo, lim)
			return s.utf8Range(alts, lim+1, hi)
		}
	}
	if hi <= 0x7F {
		return append(alts, s.byteRange(byte(lo), byte(hi)))
	}
	// Split so that lo and hi differ only in a suffix of continuation
	// bytes that covers the full 0x80…0xBF range below the first differing
	// byte.
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1 // low 6·i bits
		if lo&^m != hi&^m {
			if lo&m != 0 {
				alts = s.utf8Range(alts, lo, lo|m)
				return s.utf8Range(alts, (lo|m)+1, hi)
			}
			if hi&m != m {
				alts = s.utf8Range(alts, lo, (hi&^m)-1)
				return s.utf8Range(alts, hi&^m, hi)
			}
		}
	}
	var a, b [utf8.UTFMax]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	seq := make([]eid, n)
	for i := range n {
		seq[i] = s.byteRange(a[i], b[i])
	}
	return append(alts, s.concatAll(seq...))
}

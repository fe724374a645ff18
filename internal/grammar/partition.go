package grammar

// bytePartition splits the 256 byte values into classes that no byte set of
// an expression tells apart: two bytes of one class have the same
// derivative, at the expression and at every derivative of it (derivatives
// are built from the expression's own byte sets), so one representative
// per class is enough when exploring them.
type bytePartition struct {
	class [256]uint8
	reps  []byte // one byte per class, the lowest
}

// refine is p split further by set (or by q's classes).
func (p *bytePartition) refineBy(in func(b byte) int) *bytePartition {
	var next [256][2]int16
	for i := range next {
		next[i] = [2]int16{-1, -1}
	}
	out := &bytePartition{}
	n := int16(0)
	for b := range 256 {
		k := in(byte(b))
		c := &next[p.class[b]]
		if k > 1 {
			panic("refineBy: key out of range")
		}
		if c[k] < 0 {
			c[k] = n
			n++
			out.reps = append(out.reps, byte(b))
		}
		out.class[b] = uint8(c[k])
	}
	return out
}

var wholePartition = &bytePartition{reps: []byte{0}}

// partition is the byte classes of e (memoized).
func (s *exprSet) partition(e eid) *bytePartition {
	if p, ok := s.parts[e]; ok {
		return p
	}
	seen := map[eid]bool{}
	sets := map[byteSet]bool{}
	var walk func(eid)
	walk = func(x eid) {
		if seen[x] {
			return
		}
		seen[x] = true
		n := &s.nodes[x]
		switch n.kind {
		case kBytes:
			sets[n.set] = true
		case kConcat:
			walk(n.a)
			walk(n.b)
		case kNot, kRepeat:
			walk(n.a)
		case kOr, kAnd:
			for _, y := range n.subs {
				walk(y)
			}
		}
	}
	walk(e)
	p := wholePartition
	for set := range sets {
		p = p.refineBy(func(b byte) int {
			if set.has(b) {
				return 1
			}
			return 0
		})
	}
	s.parts[e] = p
	return p
}

// join is the coarsest partition finer than both p and q.
func (p *bytePartition) join(q *bytePartition) *bytePartition {
	if len(q.reps) == 1 {
		return p
	}
	if len(p.reps) == 1 {
		return q
	}
	// Split p by each of q's classes in turn: classes of q as keys 0/1.
	out := p
	for c := range len(q.reps) {
		cls := uint8(c)
		out = out.refineBy(func(b byte) int {
			if q.class[b] == cls {
				return 1
			}
			return 0
		})
	}
	return out
}

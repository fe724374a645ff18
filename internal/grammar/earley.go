package grammar

import (
	"fmt"
)

// The parser: Earley's algorithm over lexemes, with Aycock and Horspool's
// (2002) handling of nullable nonterminals (predicting a nullable symbol
// also moves past it), so that one pass of prediction and completion
// closes a set.

// prod is a production lhs → rhs; a symbol ≥ 0 is a nonterminal, < 0 the
// lexeme −sym−1.
type prod struct {
	lhs int32
	rhs []int32
}

// maxSetItems bounds the items of one Earley set.
const maxSetItems = 1 << 16

type parser struct {
	over     bool // an Earley set reached maxSetItems or maxWork: see Constraint.Err
	maxWork  int  // maxSetWork (tests lower it)
	prods    []prod
	byLHS    [][]int32 // nonterminal → its productions
	nullable []bool    // per nonterminal
	names    []string
	accept   int32 // the production S' → start
	nLex     int
}

type item struct {
	prod, dot, origin int32
}

// eset is an Earley set: the items at one lexeme boundary. A set is
// immutable once closed and belongs to the chart below it: next memoizes
// the sets that scanning a lexeme set from it gives.
type eset struct {
	items   []item
	pos     int32             // its index in the chart
	waiting map[int32][]int32 // nonterminal → items with the dot before it
	allowed *lexSet           // lexemes that may come next
	accept  bool              // the text up to here is a whole text
	start   lexState          // the lexer's state at the start of the next lexeme (unknown until asked)
	next    map[string]*eset
	dead    map[string]bool
}

// newParser compiles g's rules (terminals given as lexeme indices by
// lexOf) into productions, dropping those that cannot derive any text. It
// reports a grammar whose start symbol derives no text.
func newParser(g *Grammar, lexOf func(*Regex) (int32, bool), nLex int) (*parser, error) {
	p := &parser{nLex: nLex, maxWork: maxSetWork}
	nRules := len(g.Rules)
	for _, r := range g.Rules {
		p.names = append(p.names, r.Name)
	}
	// Nullable lexemes become a nonterminal with an empty production and
	// one for the lexeme's non-empty strings (lexOf returns the latter).
	extra := map[int32]int32{}
	addProd := func(lhs int32, rhs []int32) { p.prods = append(p.prods, prod{lhs, rhs}) }
	nt := int32(nRules)
	for i, r := range g.Rules {
		for _, a := range r.Alts {
			rhs := make([]int32, 0, len(a))
			ok := true
			for _, s := range a {
				if s.Lex == nil {
					rhs = append(rhs, int32(s.Rule))
					continue
				}
				lx, nullable := lexOf(s.Lex)
				if !nullable {
					if lx < 0 {
						ok = false // matches nothing
						break
					}
					rhs = append(rhs, -lx-1)
					continue
				}
				x, seen := extra[lx]
				if !seen {
					x = nt
					nt++
					p.names = append(p.names, "lexeme?")
					extra[lx] = x
					addProd(x, nil)
					if lx >= 0 {
						addProd(x, []int32{-lx - 1})
					}
				}
				rhs = append(rhs, x)
			}
			if ok {
				addProd(int32(i), rhs)
			}
		}
	}
	p.accept = int32(len(p.prods))
	addProd(nt, []int32{int32(g.Start)})
	p.names = append(p.names, "start'")
	nt++

	// Keep the productions whose symbols all derive some text.
	productive := make([]bool, nt)
	for changed := true; changed; {
		changed = false
		for _, pr := range p.prods {
			if productive[pr.lhs] {
				continue
			}
			all := true
			for _, s := range pr.rhs {
				if s >= 0 && !productive[s] {
					all = false
					break
				}
			}
			if all {
				productive[pr.lhs] = true
				changed = true
			}
		}
	}
	if !productive[g.Start] {
		return nil, &Error{Msg: fmt.Sprintf("the grammar matches no text (rule %q derives no string)", g.Rules[g.Start].Name)}
	}
	kept := p.prods[:0]
	for i, pr := range p.prods {
		keep := productive[pr.lhs]
		for _, s := range pr.rhs {
			keep = keep && (s < 0 || productive[s])
		}
		if keep {
			if int32(i) == p.accept {
				p.accept = int32(len(kept))
			}
			kept = append(kept, pr)
		}
	}
	p.prods = kept
	p.byLHS = make([][]int32, nt)
	for i, pr := range p.prods {
		p.byLHS[pr.lhs] = append(p.byLHS[pr.lhs], int32(i))
	}
	p.nullable = make([]bool, nt)
	for changed := true; changed; {
		changed = false
		for _, pr := range p.prods {
			if p.nullable[pr.lhs] {
				continue
			}
			all := true
			for _, s := range pr.rhs {
				if s < 0 || !p.nullable[s] {
					all = false
					break
				}
			}
			if all {
				p.nullable[pr.lhs] = true
				changed = true
			}
		}
	}
	return p, nil
}

// chartView is a chart as a shared prefix (a matcher's) and a few sets
// after it (committed inside a token during a mask walk), so that a walk
// never copies the prefix.
type chartView struct {
	base, extra []*eset
}

func (v chartView) at(i int32) *eset {
	if int(i) < len(v.base) {
		return v.base[i]
	}
	return v.extra[int(i)-len(v.base)]
}

func (v chartView) top() *eset {
	if len(v.extra) > 0 {
		return v.extra[len(v.extra)-1]
	}
	return v.base[len(v.base)-1]
}

// push is v with s after it; v.extra must have spare capacity only if no
// other view shares it.
func (v chartView) push(s *eset) chartView {
	return chartView{v.base, append(v.extra[:len(v.extra):len(v.extra)], s)}
}

// maxSetWork bounds the completions one Earley set may take (items
// advanced over a completed nonterminal, summed): a few milliseconds a
// lexeme. JSON Schema grammars stay in the hundreds; a highly ambiguous
// grammar reaches it after about a thousand lexemes.
const maxSetWork = 1 << 18

// closer builds one Earley set.
type closer struct {
	work  int // completions so far (see maxSetWork)
	p     *parser
	chart chartView
	set   *eset
	seen  map[item]struct{}
	bits  []uint64
}

func (c *closer) add(it item) {
	if _, ok := c.seen[it]; ok {
		return
	}
	if len(c.set.items) >= maxSetItems {
		c.p.over = true
		return
	}
	c.seen[it] = struct{}{}
	c.set.items = append(c.set.items, it)
}

// close completes and predicts until the set is closed, then indexes it.
func (c *closer) close(l *lexer) *eset {
	s := c.set
	p := c.p
	for i := 0; i < len(s.items); i++ {
		it := s.items[i]
		pr := &p.prods[it.prod]
		if int(it.dot) == len(pr.rhs) {
			if it.prod == p.accept && it.origin == 0 {
				s.accept = true
			}
			if it.origin == s.pos {
				continue // nullable: moved past at prediction
			}
			o := c.chart.at(it.origin)
			ws := o.waiting[pr.lhs]
			if c.work += len(ws); c.work > c.p.maxWork {
				// An ambiguous grammar can make each set cost time in the
				// length of the text (and the text cubic time): stop, and
				// let the matcher report ErrTooComplex.
				c.p.over = true
				break
			}
			for _, j := range ws {
				w := o.items[j]
				c.add(item{w.prod, w.dot + 1, w.origin})
			}
			continue
		}
		sym := pr.rhs[it.dot]
		if sym < 0 {
			lx := -sym - 1
			c.bits[lx>>6] |= 1 << (lx & 63)
			continue
		}
		for _, q := range p.byLHS[sym] {
			c.add(item{q, 0, s.pos})
		}
		if p.nullable[sym] {
			c.add(item{it.prod, it.dot + 1, it.origin})
		}
	}
	s.waiting = make(map[int32][]int32)
	for i, it := range s.items {
		pr := &p.prods[it.prod]
		if int(it.dot) < len(pr.rhs) && pr.rhs[it.dot] >= 0 {
			s.waiting[pr.rhs[it.dot]] = append(s.waiting[pr.rhs[it.dot]], int32(i))
		}
	}
	s.allowed = l.internSet(c.bits)
	s.start = unknown
	return s
}

func (p *parser) newCloser(chart chartView, pos int32, nLexWords int) *closer {
	return &closer{p: p, chart: chart, set: &eset{pos: pos}, seen: make(map[item]struct{}), bits: make([]uint64, nLexWords)}
}

// initial is the first set of a chart.
func (p *parser) initial(l *lexer) *eset {
	c := p.newCloser(chartView{}, 0, (p.nLex+63)/64)
	c.add(item{p.accept, 0, 0})
	return c.close(l)
}

// scan is the set after lexeme set lx from the last set of chart, or nil
// if no item expects any of them. Results are memoized on that set.
func (p *parser) scan(chart chartView, lx *lexSet, l *lexer) *eset {
	s := chart.top()
	if n, ok := s.next[lx.key]; ok {
		return n
	}
	if s.dead[lx.key] {
		return nil
	}
	c := p.newCloser(chart, s.pos+1, len(lx.bits))
	for _, it := range s.items {
		pr := &p.prods[it.prod]
		if int(it.dot) < len(pr.rhs) {
			if sym := pr.rhs[it.dot]; sym < 0 && lx.has(-sym-1) {
				c.add(item{it.prod, it.dot + 1, it.origin})
			}
		}
	}
	if len(c.set.items) == 0 {
		if s.dead == nil {
			s.dead = make(map[string]bool)
		}
		s.dead[lx.key] = true
		return nil
	}
	n := c.close(l)
	if s.next == nil {
		s.next = make(map[string]*eset)
	}
	s.next[lx.key] = n
	return n
}

package grammar

import (
	"fmt"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// CompileGBNF compiles a llama.cpp GBNF grammar (llama.cpp's
// grammars/README.md): rules `name ::= alternatives` (names of letters,
// digits, - and _), string literals "…" and character classes […] / [^…]
// with the escapes \xHH \uXXXX \UXXXXXXXX \t \n \r \\ \" \[ \], . (any code
// point), grouping, |, the repetitions * + ? {m} {m,} {m,n} (counts up to
// MaxRepeat), # comments; a rule ends at a newline unless inside
// parentheses or after a |. The start rule is root.
//
// Every terminal is a single code point, so the grammar's meaning is exact
// under the engine's greedy lexing; repetitions become left-recursive
// rules named after their rule as llama.cpp names them (rule_N).
//
// Errors are *Error with Keyword "gbnf" and Path "line:col" (1-based, the
// column in code points): syntax errors, a rule defined twice, an
// undefined rule (named, at its first use), no root rule. Token matches
// (<…>, <[id]>, !<…>) wrap ErrUnsupported.
func CompileGBNF(src string) (*Grammar, error) {
	p := &gbnfParser{src: src, rules: map[string]int{}, chars: map[rune]*Regex{}}
	p.space(true)
	for p.pos < len(p.src) {
		if err := p.rule(); err != nil {
			return nil, err
		}
	}
	for _, i := range p.refOrder {
		if p.defAt[i] < 0 {
			return nil, p.errAt(p.refAt[i], "undefined rule %q", p.b.g.Rules[i].Name)
		}
	}
	root, ok := p.rules["root"]
	if !ok || p.defAt[root] < 0 {
		return nil, &Error{Keyword: "gbnf", Msg: "the grammar has no root rule"}
	}
	return p.b.Grammar(root)
}

type gbnfParser struct {
	src   string
	pos   int // byte offset
	b     Builder
	rules map[string]int // named rules by name
	// defAt and refAt are, per rule index, the offsets of its definition
	// (-1: none yet) and of its first use; refOrder lists named rules in
	// order of first use.
	defAt, refAt []int
	refOrder     []int
	chars        map[rune]*Regex // one Regex per distinct literal code point
	depth        int             // parentheses open
}

// errAt is a syntax error at byte offset off.
func (p *gbnfParser) errAt(off int, format string, args ...any) *Error {
	return &Error{Keyword: "gbnf", Path: lineCol(p.src, off), Msg: fmt.Sprintf(format, args...)}
}

// lineCol is the 1-based line:column (in code points) of byte offset off
// of src.
func lineCol(src string, off int) string {
	line, col := 1, 1
	for i, c := range src {
		if i >= off {
			break
		}
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return strconv.Itoa(line) + ":" + strconv.Itoa(col)
}

func (p *gbnfParser) peek() byte {
	if p.pos >= len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *gbnfParser) peekAt(i int) byte {
	if p.pos+i >= len(p.src) {
		return 0
	}
	return p.src[p.pos+i]
}

// space skips blanks and # comments, and line ends if newlines.
func (p *gbnfParser) space(newlines bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case newlines && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

func isGBNFWordChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isGBNFWordChar(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// ruleIndex is the index of the rule called name, created on first use.
func (p *gbnfParser) ruleIndex(name string, off int) int {
	if i, ok := p.rules[name]; ok {
		return i
	}
	i := p.newRule(name, off)
	p.rules[name] = i
	p.refOrder = append(p.refOrder, i)
	return i
}

func (p *gbnfParser) newRule(name string, off int) int {
	i := p.b.NewRule(name)
	p.defAt = append(p.defAt, -1)
	p.refAt = append(p.refAt, off)
	return i
}

// helper adds an anonymous rule named after rule owner, as llama.cpp
// names them.
func (p *gbnfParser) helper(owner int) int {
	i := p.newRule(fmt.Sprintf("%s_%d", p.b.g.Rules[owner].Name, p.b.NumRules()), p.pos)
	p.defAt[i] = p.pos
	return i
}

// rule parses `name ::= alternates` and its line end.
func (p *gbnfParser) rule() error {
	off := p.pos
	name := p.name()
	if name == "" {
		return p.errAt(off, "expected a rule name, found %q", p.rest())
	}
	i := p.ruleIndex(name, off)
	if p.defAt[i] >= 0 {
		return p.errAt(off, "rule %q is defined twice (first at %s)", name, lineCol(p.src, p.defAt[i]))
	}
	p.defAt[i] = off
	p.space(false)
	if p.pos+3 > len(p.src) || p.src[p.pos:p.pos+3] != "::=" {
		return p.errAt(p.pos, "expected ::= after the rule name %q", name)
	}
	p.pos += 3
	p.space(true)
	if err := p.alternates(i, false); err != nil {
		return err
	}
	switch p.peek() {
	case '\r':
		p.pos++
		if p.peek() == '\n' {
			p.pos++
		}
	case '\n':
		p.pos++
	case 0:
		if p.pos < len(p.src) {
			return p.errAt(p.pos, "unexpected NUL byte")
		}
	default:
		if p.peek() == ')' {
			return p.errAt(p.pos, "unmatched )")
		}
		return p.errAt(p.pos, "expected a newline or the end of the grammar, found %q", p.rest())
	}
	p.space(true)
	return nil
}

// rest is a short excerpt of the text at p.pos, for errors.
func (p *gbnfParser) rest() string {
	s := p.src[p.pos:]
	if len(s) > 12 {
		n := 12
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		s = s[:n] + "…"
	}
	return s
}

// alternates parses sequences separated by | as the alternatives of rule
// i.
func (p *gbnfParser) alternates(i int, nested bool) error {
	for {
		seq, err := p.sequence(i, nested)
		if err != nil {
			return err
		}
		p.b.AddAlt(i, seq...)
		if p.peek() != '|' {
			return nil
		}
		p.pos++
		p.space(true)
	}
}

// sequence parses the symbols of one alternative of rule owner.
func (p *gbnfParser) sequence(owner int, nested bool) ([]Sym, error) {
	var syms []Sym
	last := -1 // where the last item's symbols start
	for p.pos < len(p.src) {
		off := p.pos
		c := p.src[p.pos]
		switch {
		case c == '"':
			p.pos++
			last = len(syms)
			for {
				if p.pos >= len(p.src) {
					return nil, p.errAt(off, "unterminated string literal")
				}
				if p.src[p.pos] == '"' {
					p.pos++
					break
				}
				r, err := p.char()
				if err != nil {
					return nil, err
				}
				syms = append(syms, T(p.charRegex(r)))
			}
		case c == '[':
			r, err := p.class()
			if err != nil {
				return nil, err
			}
			last = len(syms)
			syms = append(syms, T(r))
		case c == '.':
			p.pos++
			last = len(syms)
			syms = append(syms, T(AnyChar()))
		case isGBNFWordChar(c):
			name := p.name()
			last = len(syms)
			syms = append(syms, N(p.ruleIndex(name, off)))
		case c == '(':
			if p.depth >= MaxNesting {
				return nil, p.errAt(off, "parentheses nested more than %d deep", MaxNesting)
			}
			p.pos++
			p.space(true)
			sub := p.helper(owner)
			p.depth++
			err := p.alternates(sub, true)
			p.depth--
			if err != nil {
				return nil, err
			}
			if p.peek() != ')' {
				if p.pos >= len(p.src) {
					return nil, p.errAt(off, "unclosed (")
				}
				return nil, p.errAt(p.pos, "expected ) to close the ( at %s, found %q", lineCol(p.src, off), p.rest())
			}
			p.pos++
			last = len(syms)
			syms = append(syms, N(sub))
		case c == '*' || c == '+' || c == '?' || c == '{':
			if last < 0 {
				return nil, p.errAt(off, "%c with nothing before it to repeat", c)
			}
			min, max, err := p.counts()
			if err != nil {
				return nil, err
			}
			item := append([]Sym(nil), syms[last:]...)
			rep := p.repeat(owner, item, min, max)
			syms = append(syms[:last], rep...)
		case c == '<' || c == '!' && p.peekAt(1) == '<':
			e := p.errAt(off, "token matches (<…>, <[id]>, !<…>) are not supported")
			e.Err = ErrUnsupported
			return nil, e
		default:
			return syms, nil
		}
		p.space(nested)
	}
	return syms, nil
}

// counts parses a repetition operator: * + ? {m} {m,} {m,n}.
func (p *gbnfParser) counts() (min, max int, err error) {
	off := p.pos
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '*':
		return 0, -1, nil
	case '+':
		return 1, -1, nil
	case '?':
		return 0, 1, nil
	}
	p.space(true)
	min, ok := p.int()
	if !ok {
		return 0, 0, p.errAt(p.pos, "expected a number after {")
	}
	max = min
	p.space(true)
	if p.peek() == ',' {
		p.pos++
		p.space(true)
		max = -1
		if n, ok := p.int(); ok {
			max = n
			p.space(true)
		}
	}
	if p.peek() != '}' {
		return 0, 0, p.errAt(p.pos, "expected } to close the { at %s", lineCol(p.src, off))
	}
	p.pos++
	if min > MaxRepeat || max > MaxRepeat {
		return 0, 0, p.errAt(off, "repetition count above %d", MaxRepeat)
	}
	if max >= 0 && max < min {
		return 0, 0, p.errAt(off, "repetition {%d,%d}: the maximum is below the minimum", min, max)
	}
	return min, max, nil
}

func (p *gbnfParser) int() (int, bool) {
	start := p.pos
	n := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		if n <= MaxRepeat {
			n = n*10 + int(p.src[p.pos]-'0')
		}
		p.pos++
	}
	return n, p.pos > start
}

// repeat returns symbols matching item between min and max times (max < 0:
// unbounded), adding helper rules to owner's family.
func (p *gbnfParser) repeat(owner int, item []Sym, min, max int) []Sym {
	return repeatSyms(&p.b, func() int { return p.helper(owner) }, item, min, max)
}

// repeatSyms returns symbols matching item min to max times (max < 0:
// unbounded), with the rules it needs from newRule. An unbounded
// repetition is left-recursive (X{m,}: R ::= X^m | R X). A bounded one is
// built from powers of two so that an Earley parser holds O(log² n) items
// per position where a chain of n optional items would hold O(n):
//
//	P₀ = X, Pⱼ ::= Pⱼ₋₁ Pⱼ₋₁                 (X repeated 2^j times)
//	X^m = the Pⱼ of m's set bits, highest first
//	B₁ ::= ε | X, Bₖ ::= Bₖ₋₁ | Pₖ₋₁ Bₖ₋₁    (X{0,2^k−1})
//	X{0,d} = Bₖ if d = 2^k−1, else U ::= Bₖ | Pₖ X{0,d−2^k}, 2^k−1 < d < 2^(k+1)−1
//
// Every length has one derivation (for an unambiguous X).
func repeatSyms(b *Builder, newRule func() int, item []Sym, min, max int) []Sym {
	if len(item) == 0 || max == 0 {
		return nil
	}
	x := item[0]
	if len(item) > 1 {
		i := newRule()
		b.AddAlt(i, item...)
		x = N(i)
	}
	rp := &repeater{b: b, newRule: newRule, pows: []Sym{x}}
	if max < 0 {
		r := newRule()
		b.AddAlt(r, rp.exact(min)...)
		b.AddAlt(r, N(r), x)
		return []Sym{N(r)}
	}
	syms := rp.exact(min)
	if max > min {
		syms = append(syms, rp.upTo(max-min))
	}
	if len(syms) > 1 {
		i := newRule()
		b.AddAlt(i, syms...)
		return []Sym{N(i)}
	}
	return syms
}

// repeater builds the rules of one bounded repetition (see repeatSyms).
type repeater struct {
	b       *Builder
	newRule func() int
	pows    []Sym // pows[j] = Pⱼ
	fulls   []Sym // fulls[k] = Bₖ (fulls[0] unused)
}

// pow is Pⱼ.
func (rp *repeater) pow(j int) Sym {
	for len(rp.pows) <= j {
		prev := rp.pows[len(rp.pows)-1]
		i := rp.newRule()
		rp.b.AddAlt(i, prev, prev)
		rp.pows = append(rp.pows, N(i))
	}
	return rp.pows[j]
}

// exact is X repeated m times.
func (rp *repeater) exact(m int) []Sym {
	var out []Sym
	for j := bits.Len(uint(m)) - 1; j >= 0; j-- {
		if m&(1<<j) != 0 {
			out = append(out, rp.pow(j))
		}
	}
	return out
}

// full is Bₖ (k ≥ 1): X{0,2^k−1}.
func (rp *repeater) full(k int) Sym {
	if len(rp.fulls) == 0 {
		i := rp.newRule()
		rp.b.AddAlt(i)
		rp.b.AddAlt(i, rp.pows[0])
		rp.fulls = []Sym{{}, N(i)}
	}
	for len(rp.fulls) <= k {
		j := len(rp.fulls)
		prev := rp.fulls[j-1]
		i := rp.newRule()
		rp.b.AddAlt(i, prev)
		rp.b.AddAlt(i, rp.pow(j-1), prev)
		rp.fulls = append(rp.fulls, N(i))
	}
	return rp.fulls[k]
}

// upTo is X{0,d}, d ≥ 1.
func (rp *repeater) upTo(d int) Sym {
	k := bits.Len(uint(d+1)) - 1 // 2^k − 1 ≤ d < 2^(k+1) − 1
	if d == 1<<k-1 {
		return rp.full(k)
	}
	i := rp.newRule()
	rp.b.AddAlt(i, rp.full(k))
	rest := d - 1<<k
	if rest == 0 {
		rp.b.AddAlt(i, rp.pow(k))
	} else {
		rp.b.AddAlt(i, rp.pow(k), rp.upTo(rest))
	}
	return N(i)
}

// charRegex is the lexeme of the code point r, one per distinct r.
func (p *gbnfParser) charRegex(r rune) *Regex {
	if x, ok := p.chars[r]; ok {
		return x
	}
	x := Class(RuneRange{r, r})
	p.chars[r] = x
	return x
}

// char parses one code point of a literal or a class, escaped or not.
func (p *gbnfParser) char() (rune, error) {
	off := p.pos
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n == 1 {
			return 0, p.errAt(off, "invalid UTF-8")
		}
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errAt(off, "\\ at the end of the grammar")
	}
	c := p.src[p.pos]
	p.pos++
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errAt(off, "\\%c needs %d hex digits", c, n)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil || v > utf8.MaxRune {
			return 0, p.errAt(off, "\\%c needs %d hex digits", c, n)
		}
		p.pos += n
		return rune(v), nil
	}
	switch c {
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	case 't':
		return '\t', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case '\\', '"', '[', ']':
		return rune(c), nil
	}
	return 0, p.errAt(off, "unknown escape \\%c", c)
}

// class parses […] or [^…] as one lexeme.
func (p *gbnfParser) class() (*Regex, error) {
	off := p.pos
	p.pos++ // [
	neg := false
	if p.peek() == '^' {
		neg = true
		p.pos++
	}
	var rs []RuneRange
	for {
		if p.pos >= len(p.src) {
			return nil, p.errAt(off, "unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		loOff := p.pos
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.peek() == '-' && p.peekAt(1) != ']' && p.pos+1 < len(p.src) {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errAt(loOff, "range out of order in character class")
			}
		}
		rs = append(rs, RuneRange{lo, hi})
	}
	if neg {
		return NotClass(rs...), nil
	}
	return Class(rs...), nil
}

package grammar

import (
	"fmt"
)

// Grammar is a context-free grammar over lexemes (see the package doc).
// Rules[Start] is the start symbol. A Grammar is immutable once built.
type Grammar struct {
	Rules []Rule
	Start int
	// Skip, if not nil, may occur between any two lexemes and at the
	// start and end of the text; the parser never sees it (flexible
	// whitespace in JSON, %ignore in Lark).
	Skip *Regex
}

// Rule is a nonterminal: its name (for errors) and its alternatives.
type Rule struct {
	Name string
	Alts []Alt
}

// Alt is one alternative of a rule: a sequence of symbols (empty: ε).
type Alt []Sym

// Sym is a grammar symbol: a lexeme (Lex not nil) or the nonterminal
// Rules[Rule].
type Sym struct {
	Rule int
	Lex  *Regex
}

// T is the terminal symbol matching lexeme r.
func T(r *Regex) Sym { return Sym{Lex: r} }

// N is the nonterminal symbol of rule i.
func N(i int) Sym { return Sym{Rule: i} }

// Builder builds a Grammar rule by rule.
type Builder struct {
	g Grammar
}

// NewRule adds a rule with no alternatives yet and returns its index.
func (b *Builder) NewRule(name string) int {
	b.g.Rules = append(b.g.Rules, Rule{Name: name})
	return len(b.g.Rules) - 1
}

// AddAlt adds an alternative to rule i.
func (b *Builder) AddAlt(i int, syms ...Sym) {
	b.g.Rules[i].Alts = append(b.g.Rules[i].Alts, Alt(syms))
}

// NumRules is the number of rules so far.
func (b *Builder) NumRules() int { return len(b.g.Rules) }

// SetSkip sets the grammar's Skip lexeme.
func (b *Builder) SetSkip(r *Regex) { b.g.Skip = r }

// Grammar returns the grammar with start rule start. It reports a rule
// without alternatives or a symbol naming no rule.
func (b *Builder) Grammar(start int) (*Grammar, error) {
	g := b.g
	g.Start = start
	if start < 0 || start >= len(g.Rules) {
		return nil, fmt.Errorf("grammar: start rule %d does not exist", start)
	}
	for _, r := range g.Rules {
		for _, a := range r.Alts {
			for _, s := range a {
				if s.Lex == nil && (s.Rule < 0 || s.Rule >= len(g.Rules)) {
					return nil, fmt.Errorf("grammar: rule %q names rule %d, which does not exist", r.Name, s.Rule)
				}
			}
		}
	}
	return &g, nil
}

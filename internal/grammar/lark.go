package grammar

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CompileLark compiles a grammar in the Lark dialect vLLM and llguidance
// take (lark-parser's grammar syntax; llguidance's docs/syntax.md):
//
//   - rules `name: expansions` (lowercase names; ?name and !name accepted,
//     they only shape Lark's parse trees), the start rule is start;
//   - terminals `NAME: expansions` (uppercase names), each compiled to one
//     Regex over the strings "…" ("…"i: case-insensitive), regexes /…/flags,
//     ranges "a".."z" and other terminals it uses (not recursively);
//   - in rules, inline strings and regexes and terminal names are lexemes,
//     lexed greedily (maximal munch, as Lark's contextual lexer);
//   - expansions: alternatives |, grouping (…), optional […] and ?, * and +,
//     counted repetition x ~ n, x ~ n..m and llguidance's x{n}, x{n,},
//     x{n,m}, x{,m} (counts up to MaxRepeat), aliases -> name (ignored);
//   - %ignore terminals (the Grammar's Skip; several are alternatives),
//     %import common.NAME [-> ALIAS] and %import common (A, B) for Lark's
//     common.lark terminals (WS, WS_INLINE, NEWLINE, CR, LF, DIGIT,
//     HEXDIGIT, INT, SIGNED_INT, DECIMAL, FLOAT, SIGNED_FLOAT, NUMBER,
//     SIGNED_NUMBER, LETTER, LCASE_LETTER, UCASE_LETTER, WORD, CNAME,
//     ESCAPED_STRING, SH_COMMENT, CPP_COMMENT, C_COMMENT, SQL_COMMENT);
//   - // and # comments; a newline ends a definition unless inside brackets
//     or before a |.
//
// /regex/ bodies use ParseRegex's ECMA-262 dialect (and Python's
// (?P<name>…) groups), anchored to the lexeme, with the flags i (case-insensitive), s (. matches newlines), m
// and u (no effect on an anchored lexeme).
//
// Errors are *Error with Keyword "lark" and Path "line:col". Features the
// engine does not implement wrap ErrUnsupported: %json, %llguidance,
// %regex, %declare, %override, %extend, imports other than common,
// priorities (name.N), templates, lexeme options (name[lazy]: …), special
// tokens <…>, grammar references @name, the & and ~ regex operators, the
// regex flag x, lazy quantifiers (*? +? ?? {n,m}?) in regexes (a lexeme
// matches longest-first, so /".*?"/ would not stop at the first quote).
func CompileLark(src string) (*Grammar, error) {
	toks, err := larkLex(src)
	if err != nil {
		return nil, err
	}
	p := &larkParser{src: src, toks: toks, defs: map[string]*larkDef{}}
	if err := p.grammar(); err != nil {
		return nil, err
	}
	return p.compile()
}

// Lark grammar tokens.
const (
	ltEOF     = iota
	ltNL      // end of a definition
	ltName    // rule or terminal name
	ltString  // "…" (str decoded, fold for the i suffix)
	ltRegex   // /…/flags (rx parsed)
	ltNum     // decimal number
	ltPunct   // one of : | ( ) [ ] { } , * + ? ~ . ! & and ".." "->"
	ltPercent // %directive
	ltSpecial // <…> or @name, unsupported
)

type larkTok struct {
	kind int
	text string // the source text (punctuation, name, directive)
	pos  int    // byte offset
	str  string
	fold bool
	rx   *Regex
	num  int
}

func larkErr(src string, off int, format string, args ...any) *Error {
	return &Error{Keyword: "lark", Path: lineCol(src, off), Msg: fmt.Sprintf(format, args...)}
}

func larkUnsupported(src string, off int, what string) *Error {
	e := larkErr(src, off, "%s is not supported", what)
	e.Err = ErrUnsupported
	return e
}

// larkLex cuts src into tokens. Newlines inside brackets, and before a |,
// are blanks.
func larkLex(src string) ([]larkTok, error) {
	var toks []larkTok
	depth := 0
	i := 0
	// skipBlank skips spaces, comments and (if nl) newlines from j.
	skipBlank := func(j int, nl bool) int {
		for j < len(src) {
			switch c := src[j]; {
			case c == ' ' || c == '\t' || c == '\f' || c == '\v':
				j++
			case c == '#' || c == '/' && j+1 < len(src) && src[j+1] == '/':
				for j < len(src) && src[j] != '\n' {
					j++
				}
			case nl && (c == '\n' || c == '\r'):
				j++
			default:
				return j
			}
		}
		return j
	}
	for {
		i = skipBlank(i, depth > 0)
		if i >= len(src) {
			break
		}
		start := i
		c := src[i]
		switch {
		case c == '\n' || c == '\r':
			i = skipBlank(i, true)
			if i < len(src) && src[i] == '|' {
				continue // a | on a following line continues the definition
			}
			if n := len(toks); n > 0 && toks[n-1].kind != ltNL {
				toks = append(toks, larkTok{kind: ltNL, pos: start})
			}
		case c == '"':
			s, fold, n, err := larkString(src, i)
			if err != nil {
				return nil, err
			}
			i = n
			toks = append(toks, larkTok{kind: ltString, pos: start, str: s, fold: fold, text: src[start:i]})
		case c == '/':
			rx, n, err := larkRegex(src, i)
			if err != nil {
				return nil, err
			}
			i = n
			toks = append(toks, larkTok{kind: ltRegex, pos: start, rx: rx, text: src[start:i]})
		case c >= '0' && c <= '9':
			for i < len(src) && src[i] >= '0' && src[i] <= '9' {
				i++
			}
			n, err := strconv.Atoi(src[start:i])
			if err != nil || n > MaxRepeat {
				return nil, larkErr(src, start, "the number %s is above %d", src[start:i], MaxRepeat)
			}
			toks = append(toks, larkTok{kind: ltNum, pos: start, num: n, text: src[start:i]})
		case c == '_' || c < utf8.RuneSelf && unicode.IsLetter(rune(c)):
			for i < len(src) && isLarkNameChar(src[i]) && !strings.HasPrefix(src[i:], "->") {
				i++
			}
			toks = append(toks, larkTok{kind: ltName, pos: start, text: src[start:i]})
		case c == '%':
			i++
			for i < len(src) && isLarkNameChar(src[i]) {
				i++
			}
			toks = append(toks, larkTok{kind: ltPercent, pos: start, text: src[start:i]})
		case c == '<' || c == '@':
			// <special token>, <[ids]>, @grammar: read whole, refused by
			// the parser.
			i++
			for i < len(src) && (c == '<' && src[i] != '>' && src[i] != '\n' || c == '@' && isLarkNameChar(src[i])) {
				i++
			}
			if c == '<' && i < len(src) && src[i] == '>' {
				i++
			}
			toks = append(toks, larkTok{kind: ltSpecial, pos: start, text: src[start:i]})
		case c == '.' && i+1 < len(src) && src[i+1] == '.', c == '-' && i+1 < len(src) && src[i+1] == '>':
			toks = append(toks, larkTok{kind: ltPunct, pos: start, text: src[i : i+2]})
			i += 2
		case strings.IndexByte(":|()[]{},*+?~.!&", c) >= 0:
			switch c {
			case '(', '[', '{':
				depth++
			case ')', ']', '}':
				if depth > 0 {
					depth--
				}
			}
			toks = append(toks, larkTok{kind: ltPunct, pos: start, text: string(c)})
			i++
		default:
			r, _ := utf8.DecodeRuneInString(src[i:])
			return nil, larkErr(src, start, "unexpected character %q", r)
		}
	}
	toks = append(toks, larkTok{kind: ltNL, pos: len(src)}, larkTok{kind: ltEOF, pos: len(src)})
	return toks, nil
}

func isLarkNameChar(c byte) bool {
	return c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isTerminalName reports whether a Lark name is a terminal's: its first
// letter (after leading underscores) is uppercase.
func isTerminalName(name string) bool {
	s := strings.TrimLeft(name, "_")
	return s != "" && s[0] >= 'A' && s[0] <= 'Z'
}

// larkString reads the string literal at src[i] (a ") and its i suffix,
// unescaping as Lark does: \\ \" \n \t \r \f \xHH \uXXXX \UXXXXXXXX;
// any other backslash stays itself.
func larkString(src string, i int) (s string, fold bool, end int, err error) {
	start := i
	i++
	var b strings.Builder
	for {
		if i >= len(src) || src[i] == '\n' {
			return "", false, 0, larkErr(src, start, "unterminated string")
		}
		c := src[i]
		if c == '"' {
			i++
			break
		}
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(src) {
			return "", false, 0, larkErr(src, start, "unterminated string")
		}
		e := src[i+1]
		i += 2
		hex := func(n int) error {
			if i+n > len(src) {
				return larkErr(src, i-2, "\\%c needs %d hex digits", e, n)
			}
			v, err := strconv.ParseUint(src[i:i+n], 16, 32)
			if err != nil || v > unicode.MaxRune {
				return larkErr(src, i-2, "\\%c needs %d hex digits", e, n)
			}
			b.WriteRune(rune(v))
			i += n
			return nil
		}
		switch e {
		case '\\', '"':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'x':
			err = hex(2)
		case 'u':
			err = hex(4)
		case 'U':
			err = hex(8)
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
		if err != nil {
			return "", false, 0, err
		}
	}
	if i < len(src) && src[i] == 'i' && (i+1 >= len(src) || !isLarkNameChar(src[i+1])) {
		fold = true
		i++
	}
	return b.String(), fold, i, nil
}

// larkRegex reads /body/flags at src[i] and parses the body.
func larkRegex(src string, i int) (*Regex, int, error) {
	start := i
	i++
	for {
		if i >= len(src) || src[i] == '\n' {
			return nil, 0, larkErr(src, start, "unterminated regex")
		}
		if src[i] == '\\' && i+1 < len(src) {
			i += 2
			continue
		}
		if src[i] == '/' {
			break
		}
		i++
	}
	body := src[start+1 : i]
	i++
	o := rxOptions{keyword: "lark", python: true, noLazy: true}
	for i < len(src) && src[i] >= 'a' && src[i] <= 'z' {
		switch src[i] {
		case 'i':
			o.fold = true
		case 's':
			o.dotAll = true
		case 'm', 'u':
		default:
			return nil, 0, larkUnsupported(src, i, "the regex flag "+string(src[i]))
		}
		i++
	}
	n, err := parseRx(body, o)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			off := start + 1
			if k, convErr := strconv.Atoi(strings.TrimPrefix(e.Path, "offset ")); convErr == nil {
				for ; k > 0 && off < i; k-- {
					_, w := utf8.DecodeRuneInString(src[off:])
					off += w
				}
			}
			return nil, 0, &Error{Keyword: "lark", Path: lineCol(src, off), Msg: "in " + src[start:i] + ": " + e.Msg, Err: e.Err}
		}
		return nil, 0, err
	}
	return Or(n.m[0][0], n.m[0][1], n.m[1][0], n.m[1][1]), i, nil
}

// larkExpr is a parsed expansion.
type larkExpr struct {
	op       int // lxAlt, lxSeq, lxRepeat, lxString, lxRegex, lxName, lxRange
	subs     []*larkExpr
	min, max int // lxRepeat
	str      string
	fold     bool
	rx       *Regex
	name     string
	lo, hi   rune
	pos      int
}

const (
	lxAlt = iota
	lxSeq
	lxRepeat
	lxString
	lxRegex
	lxName
	lxRange
)

// larkDef is a rule or terminal definition.
type larkDef struct {
	name string
	pos  int
	body *larkExpr
	// Terminals: their Regex once compiled, and whether compiling is under
	// way (a cycle).
	rx       *Regex
	visiting bool
	// Rules: their index in the Builder.
	rule int
}

type larkParser struct {
	src     string
	toks    []larkTok
	i       int
	defs    map[string]*larkDef
	order   []*larkDef // rules in order of definition
	ignores []*larkExpr
	b       Builder
	lits    map[string]*Regex // inline string lexemes, shared
	depth   int               // brackets open
}

func (p *larkParser) tok() *larkTok { return &p.toks[p.i] }

func (p *larkParser) errAt(off int, format string, args ...any) *Error {
	return larkErr(p.src, off, format, args...)
}

func (p *larkParser) isPunct(s string) bool {
	t := p.tok()
	return t.kind == ltPunct && t.text == s
}

func (p *larkParser) expectPunct(s string) error {
	if !p.isPunct(s) {
		return p.errAt(p.tok().pos, "expected %s, found %s", s, p.describe())
	}
	p.i++
	return nil
}

// describe names the current token for errors.
func (p *larkParser) describe() string {
	t := p.tok()
	switch t.kind {
	case ltEOF:
		return "the end of the grammar"
	case ltNL:
		return "the end of the line"
	}
	return strconv.Quote(t.text)
}

// grammar parses definitions and directives, one a line.
func (p *larkParser) grammar() error {
	for p.tok().kind != ltEOF {
		if p.tok().kind == ltNL {
			p.i++
			continue
		}
		if err := p.item(); err != nil {
			return err
		}
		if p.tok().kind != ltNL {
			return p.errAt(p.tok().pos, "expected the end of the line, found %s", p.describe())
		}
	}
	return nil
}

func (p *larkParser) item() error {
	t := p.tok()
	if t.kind == ltPercent {
		return p.directive()
	}
	if t.kind == ltPunct && (t.text == "?" || t.text == "!") {
		p.i++
	}
	t = p.tok()
	if t.kind != ltName {
		return p.errAt(t.pos, "expected a rule or terminal definition, found %s", p.describe())
	}
	p.i++
	switch {
	case p.isPunct("."):
		return larkUnsupported(p.src, p.tok().pos, "a priority ("+t.text+".N)")
	case p.isPunct("{"):
		return larkUnsupported(p.src, p.tok().pos, "a template ("+t.text+"{…})")
	case p.isPunct("["):
		return larkUnsupported(p.src, p.tok().pos, "a lexeme option ("+t.text+"[…])")
	}
	if err := p.expectPunct(":"); err != nil {
		return err
	}
	body, err := p.expansions()
	if err != nil {
		return err
	}
	return p.define(t.text, t.pos, body)
}

func (p *larkParser) define(name string, pos int, body *larkExpr) error {
	if d, ok := p.defs[name]; ok {
		return p.errAt(pos, "%s is defined twice (first at %s)", name, lineCol(p.src, d.pos))
	}
	d := &larkDef{name: name, pos: pos, body: body}
	p.defs[name] = d
	if !isTerminalName(name) {
		p.order = append(p.order, d)
	}
	return nil
}

func (p *larkParser) directive() error {
	t := p.tok()
	p.i++
	switch t.text {
	case "%ignore":
		e, err := p.expansions()
		if err != nil {
			return err
		}
		p.ignores = append(p.ignores, e)
		return nil
	case "%import":
		return p.importCommon(t.pos)
	case "%json", "%llguidance", "%regex", "%declare", "%override", "%extend", "%lark", "%if":
		return larkUnsupported(p.src, t.pos, t.text)
	}
	return p.errAt(t.pos, "unknown directive %s", t.text)
}

// importCommon parses the rest of %import common.NAME [-> ALIAS] or
// %import common (NAME, …).
func (p *larkParser) importCommon(pos int) error {
	t := p.tok()
	if t.kind != ltName {
		return p.errAt(t.pos, "expected a module name after %%import")
	}
	module := t.text
	p.i++
	if module != "common" {
		return larkUnsupported(p.src, t.pos, "%import from "+module+" (only common is built in)")
	}
	var names []*larkTok
	if p.isPunct(".") {
		p.i++
		if p.tok().kind != ltName {
			return p.errAt(p.tok().pos, "expected a name after common.")
		}
		names = append(names, p.tok())
		p.i++
		if p.isPunct("->") {
			p.i++
			alias := p.tok()
			if alias.kind != ltName {
				return p.errAt(alias.pos, "expected a name after ->")
			}
			p.i++
			return p.importOne(names[0], alias.text, alias.pos)
		}
	} else if p.isPunct("(") {
		p.i++
		for {
			if p.tok().kind != ltName {
				return p.errAt(p.tok().pos, "expected a name in the %%import list, found %s", p.describe())
			}
			names = append(names, p.tok())
			p.i++
			if p.isPunct(",") {
				p.i++
				continue
			}
			if err := p.expectPunct(")"); err != nil {
				return err
			}
			break
		}
	} else {
		return p.errAt(p.tok().pos, "expected common.NAME or common (NAME, …)")
	}
	for _, n := range names {
		if err := p.importOne(n, n.text, n.pos); err != nil {
			return err
		}
	}
	return nil
}

// larkCommon is lark-parser's grammars/common.lark, its terminals
// written as ECMA-262 regexes.
var larkCommon = map[string]string{
	"DIGIT":          `[0-9]`,
	"HEXDIGIT":       `[a-fA-F0-9]`,
	"INT":            `[0-9]+`,
	"SIGNED_INT":     `[+-]?[0-9]+`,
	"DECIMAL":        `[0-9]+\.[0-9]*|\.[0-9]+`,
	"FLOAT":          `[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?`,
	"SIGNED_FLOAT":   `[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)`,
	"NUMBER":         `[0-9]+|[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?`,
	"SIGNED_NUMBER":  `[+-]?([0-9]+|[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)`,
	"ESCAPED_STRING": `"([^"\\\n]|\\.)*"`,
	"LCASE_LETTER":   `[a-z]`,
	"UCASE_LETTER":   `[A-Z]`,
	"LETTER":         `[A-Za-z]`,
	"WORD":           `[A-Za-z]+`,
	"CNAME":          `[_A-Za-z][_A-Za-z0-9]*`,
	"WS_INLINE":      `[ \t]+`,
	"WS":             `[ \t\f\r\n]+`,
	"CR":             `\r`,
	"LF":             `\n`,
	"NEWLINE":        `(\r?\n)+`,
	"SH_COMMENT":     `#[^\n]*`,
	"CPP_COMMENT":    `\/\/[^\n]*`,
	"C_COMMENT":      `\/\*[^*]*\*+([^/*][^*]*\*+)*\/`,
	"SQL_COMMENT":    `--[^\n]*`,
}

func (p *larkParser) importOne(name *larkTok, as string, asPos int) error {
	src, ok := larkCommon[name.text]
	if !ok {
		return p.errAt(name.pos, "common.%s is not a terminal of Lark's common grammar", name.text)
	}
	n, err := parseRx(src, rxOptions{keyword: "lark"})
	if err != nil {
		return err // the table is fixed and parses
	}
	rx := Or(n.m[0][0], n.m[0][1], n.m[1][0], n.m[1][1])
	return p.define(as, asPos, &larkExpr{op: lxRegex, rx: rx, pos: name.pos})
}

// expansions parses alternatives separated by |.
func (p *larkParser) expansions() (*larkExpr, error) {
	pos := p.tok().pos
	var alts []*larkExpr
	for {
		a, err := p.expansion()
		if err != nil {
			return nil, err
		}
		if p.isPunct("->") {
			p.i++
			if p.tok().kind != ltName {
				return nil, p.errAt(p.tok().pos, "expected a name after ->")
			}
			p.i++
		}
		alts = append(alts, a)
		if !p.isPunct("|") {
			break
		}
		p.i++
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return &larkExpr{op: lxAlt, subs: alts, pos: pos}, nil
}

// expansion parses a sequence of items.
func (p *larkParser) expansion() (*larkExpr, error) {
	seq := &larkExpr{op: lxSeq, pos: p.tok().pos}
	for {
		t := p.tok()
		switch {
		case t.kind == ltString, t.kind == ltRegex, t.kind == ltName, t.kind == ltSpecial,
			t.kind == ltPercent,
			t.kind == ltPunct && (t.text == "(" || t.text == "[" || t.text == "~" || t.text == "&"):
		default:
			if len(seq.subs) == 1 {
				return seq.subs[0], nil
			}
			return seq, nil
		}
		e, err := p.expr()
		if err != nil {
			return nil, err
		}
		seq.subs = append(seq.subs, e)
	}
}

// expr parses an atom and its repetition operators.
func (p *larkParser) expr() (*larkExpr, error) {
	a, err := p.atom()
	if err != nil {
		return nil, err
	}
	for {
		t := p.tok()
		if t.kind != ltPunct {
			return a, nil
		}
		min, max := 0, 0
		switch t.text {
		case "*":
			min, max = 0, -1
			p.i++
		case "+":
			min, max = 1, -1
			p.i++
		case "?":
			min, max = 0, 1
			p.i++
		case "~":
			p.i++
			if min, err = p.number(); err != nil {
				return nil, err
			}
			max = min
			if p.isPunct("..") {
				p.i++
				if max, err = p.number(); err != nil {
					return nil, err
				}
			}
		case "{":
			p.i++
			if !p.isPunct(",") {
				if min, err = p.number(); err != nil {
					return nil, err
				}
			}
			max = min
			if p.isPunct(",") {
				p.i++
				max = -1
				if p.tok().kind == ltNum {
					max = p.tok().num
					p.i++
				}
			}
			if err := p.expectPunct("}"); err != nil {
				return nil, err
			}
		default:
			return a, nil
		}
		if max >= 0 && max < min {
			return nil, p.errAt(t.pos, "repetition %d..%d: the maximum is below the minimum", min, max)
		}
		a = &larkExpr{op: lxRepeat, subs: []*larkExpr{a}, min: min, max: max, pos: t.pos}
	}
}

func (p *larkParser) number() (int, error) {
	t := p.tok()
	if t.kind != ltNum {
		return 0, p.errAt(t.pos, "expected a number, found %s", p.describe())
	}
	p.i++
	return t.num, nil
}

func (p *larkParser) atom() (*larkExpr, error) {
	t := p.tok()
	switch t.kind {
	case ltString:
		p.i++
		if p.isPunct("..") {
			p.i++
			hi := p.tok()
			if hi.kind != ltString {
				return nil, p.errAt(hi.pos, "expected a string after ..")
			}
			p.i++
			lo, n1 := utf8.DecodeRuneInString(t.str)
			h, n2 := utf8.DecodeRuneInString(hi.str)
			if n1 == 0 || n1 != len(t.str) || n2 == 0 || n2 != len(hi.str) {
				return nil, p.errAt(t.pos, "a range's ends must be single characters")
			}
			if h < lo {
				return nil, p.errAt(t.pos, "range out of order")
			}
			return &larkExpr{op: lxRange, lo: lo, hi: h, pos: t.pos}, nil
		}
		return &larkExpr{op: lxString, str: t.str, fold: t.fold, pos: t.pos}, nil
	case ltRegex:
		p.i++
		return &larkExpr{op: lxRegex, rx: t.rx, pos: t.pos}, nil
	case ltName:
		p.i++
		return &larkExpr{op: lxName, name: t.text, pos: t.pos}, nil
	case ltSpecial:
		if t.text[0] == '@' {
			return nil, larkUnsupported(p.src, t.pos, "a grammar reference (@name)")
		}
		return nil, larkUnsupported(p.src, t.pos, "a special token (<…>)")
	case ltPercent:
		if t.text == "%json" || t.text == "%regex" {
			return nil, larkUnsupported(p.src, t.pos, t.text)
		}
		return nil, p.errAt(t.pos, "unexpected %s", t.text)
	}
	switch t.text {
	case "(", "[":
		if p.depth >= MaxNesting {
			return nil, p.errAt(t.pos, "brackets nested more than %d deep", MaxNesting)
		}
		p.i++
		p.depth++
		e, err := p.expansions()
		p.depth--
		if err != nil {
			return nil, err
		}
		if t.text == "(" {
			err = p.expectPunct(")")
		} else {
			err = p.expectPunct("]")
			e = &larkExpr{op: lxRepeat, subs: []*larkExpr{e}, min: 0, max: 1, pos: t.pos}
		}
		return e, err
	case "~":
		return nil, larkUnsupported(p.src, t.pos, "the regex negation ~")
	case "&":
		return nil, larkUnsupported(p.src, t.pos, "the regex intersection &")
	}
	return nil, p.errAt(t.pos, "unexpected %s", p.describe())
}

// compile builds the Grammar once every definition is read.
func (p *larkParser) compile() (*Grammar, error) {
	p.lits = map[string]*Regex{}
	start, ok := p.defs["start"]
	if !ok {
		return nil, &Error{Keyword: "lark", Msg: "the grammar has no start rule"}
	}
	var terms []*larkDef
	for _, d := range p.defs {
		if isTerminalName(d.name) {
			terms = append(terms, d)
		}
	}
	slices.SortFunc(terms, func(a, b *larkDef) int { return a.pos - b.pos })
	for _, d := range terms { // unused terminals are checked too
		if _, err := p.terminal(&larkExpr{op: lxName, name: d.name, pos: d.pos}); err != nil {
			return nil, err
		}
	}
	for _, d := range p.order {
		d.rule = p.b.NewRule(d.name)
	}
	for _, d := range p.order {
		alts, err := p.ruleAlts(d.body, d.rule)
		if err != nil {
			return nil, err
		}
		for _, a := range alts {
			p.b.AddAlt(d.rule, a...)
		}
	}
	var skips []*Regex
	for _, e := range p.ignores {
		r, err := p.terminal(e)
		if err != nil {
			return nil, err
		}
		skips = append(skips, r)
	}
	if len(skips) > 0 {
		p.b.SetSkip(Or(skips...))
	}
	return p.b.Grammar(start.rule)
}

// terminal compiles a terminal expansion to one Regex.
func (p *larkParser) terminal(e *larkExpr) (*Regex, error) {
	switch e.op {
	case lxAlt, lxSeq:
		subs := make([]*Regex, len(e.subs))
		for i, s := range e.subs {
			r, err := p.terminal(s)
			if err != nil {
				return nil, err
			}
			subs[i] = r
		}
		if e.op == lxAlt {
			return Or(subs...), nil
		}
		return Concat(subs...), nil
	case lxRepeat:
		r, err := p.terminal(e.subs[0])
		if err != nil {
			return nil, err
		}
		return Repeat(r, e.min, e.max), nil
	case lxString:
		return larkLit(e.str, e.fold), nil
	case lxRegex:
		return e.rx, nil
	case lxRange:
		return Class(RuneRange{e.lo, e.hi}), nil
	}
	d, ok := p.defs[e.name]
	switch {
	case !ok:
		return nil, p.errAt(e.pos, "undefined terminal %s", e.name)
	case !isTerminalName(e.name):
		return nil, p.errAt(e.pos, "a terminal cannot use the rule %s", e.name)
	case d.rx != nil:
		return d.rx, nil
	case d.visiting:
		return nil, p.errAt(e.pos, "terminal %s is recursive; terminals are regular (use a rule)", e.name)
	}
	d.visiting = true
	r, err := p.terminal(d.body)
	d.visiting = false
	if err != nil {
		return nil, err
	}
	d.rx = r
	return r, nil
}

// larkLit is the lexeme of a string literal (case-insensitive if fold).
func larkLit(s string, fold bool) *Regex {
	if !fold {
		return Lit(s)
	}
	var subs []*Regex
	for _, c := range s {
		subs = append(subs, Class(foldRanges([]RuneRange{{c, c}})...))
	}
	return Concat(subs...)
}

// ruleAlts compiles a rule expansion to alternatives of symbols, adding
// helper rules named after rule owner.
func (p *larkParser) ruleAlts(e *larkExpr, owner int) ([][]Sym, error) {
	if e.op != lxAlt {
		s, err := p.ruleSeq(e, owner)
		return [][]Sym{s}, err
	}
	alts := make([][]Sym, len(e.subs))
	for i, sub := range e.subs {
		s, err := p.ruleSeq(sub, owner)
		if err != nil {
			return nil, err
		}
		alts[i] = s
	}
	return alts, nil
}

func (p *larkParser) ruleSeq(e *larkExpr, owner int) ([]Sym, error) {
	if e.op != lxSeq {
		return p.ruleItem(e, owner)
	}
	var out []Sym
	for _, sub := range e.subs {
		s, err := p.ruleItem(sub, owner)
		if err != nil {
			return nil, err
		}
		out = append(out, s...)
	}
	return out, nil
}

func (p *larkParser) helper(owner int) int {
	return p.b.NewRule(fmt.Sprintf("%s_%d", p.b.g.Rules[owner].Name, p.b.NumRules()))
}

func (p *larkParser) ruleItem(e *larkExpr, owner int) ([]Sym, error) {
	switch e.op {
	case lxAlt:
		alts, err := p.ruleAlts(e, owner)
		if err != nil {
			return nil, err
		}
		h := p.helper(owner)
		for _, a := range alts {
			p.b.AddAlt(h, a...)
		}
		return []Sym{N(h)}, nil
	case lxSeq:
		return p.ruleSeq(e, owner)
	case lxRepeat:
		item, err := p.ruleItem(e.subs[0], owner)
		if err != nil {
			return nil, err
		}
		return repeatSyms(&p.b, func() int { return p.helper(owner) }, item, e.min, e.max), nil
	case lxString:
		if e.str == "" {
			return nil, nil
		}
		key := e.str
		if e.fold {
			key = "i" + key
		} else {
			key = "s" + key
		}
		r, ok := p.lits[key]
		if !ok {
			r = larkLit(e.str, e.fold)
			p.lits[key] = r
		}
		return []Sym{T(r)}, nil
	case lxRegex, lxRange:
		r, err := p.terminal(e)
		if err != nil {
			return nil, err
		}
		return []Sym{T(r)}, nil
	}
	d, ok := p.defs[e.name]
	if !ok {
		if isTerminalName(e.name) {
			return nil, p.errAt(e.pos, "undefined terminal %s", e.name)
		}
		return nil, p.errAt(e.pos, "undefined rule %s", e.name)
	}
	if isTerminalName(e.name) {
		r, err := p.terminal(e)
		if err != nil {
			return nil, err
		}
		return []Sym{T(r)}, nil
	}
	return []Sym{N(d.rule)}, nil
}

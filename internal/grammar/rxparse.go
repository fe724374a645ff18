package grammar

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNesting bounds how deep groups nest in a regex, GBNF or Lark source.
const MaxNesting = 1000

// MaxRepeat bounds the counts of a regex quantifier {n,m} and of GBNF's
// and Lark's counted repetitions: a larger count is an error.
const MaxRepeat = 10000

// ParseRegex parses pattern in the ECMA-262 regular expression dialect
// (what JSON Schema's pattern and vLLM's guided_regex take) and returns a
// Regex over code points matching the whole text: a leading ^ and a
// trailing $ are accepted and change nothing.
//
// Supported: literals; the escapes \d \D \w \W \s \S (ECMA's definitions:
// \d and \w are ASCII, \s includes the Unicode spaces and line
// terminators), \t \n \r \f \v \0 \xHH \uXXXX (surrogate pairs joined)
// \u{X…} \cX and identity escapes of punctuation; . (any code point but
// the line terminators \n \r U+2028 U+2029); classes with ranges,
// negation and escapes; groups (capturing, (?:…), named); alternation;
// the modifier groups (?i:…) (?s:…) (?-i:…) of ECMA-262 2025;
// the quantifiers * + ? {n} {n,} {n,m} and their lazy forms (same
// language); a { that does not start a quantifier is a literal (ECMA-262
// Annex B); \p{…} and \P{…} for the general categories (short and long
// names, optionally as General_Category=…/gc=…), scripts (Script=…/sc=…)
// and the binary properties Go's unicode package has, plus ASCII and Any.
//
// Errors are *Error with Keyword "regex" and Path "offset N" (N counts code
// points of pattern). Lookaround, backreferences, \b \B and ^ $ anywhere
// but at the edges of the pattern wrap ErrUnsupported; counts above
// MaxRepeat are errors.
func ParseRegex(pattern string) (*Regex, error) {
	n, err := parseRx(pattern, rxOptions{keyword: "regex"})
	if err != nil {
		return nil, err
	}
	return Or(n.m[0][0], n.m[0][1], n.m[1][0], n.m[1][1]), nil
}

// ParsePattern parses pattern as JSON Schema's pattern keyword reads it:
// the ECMA-262 dialect of ParseRegex, but not anchored. "abc" matches every
// text containing abc (as .*abc.* would, . here matching any code point,
// newlines included), "^abc" the texts starting with abc, "abc$" those
// ending with it; anchors on some branches of an alternation apply to
// those branches only. Errors are those of ParseRegex with Keyword
// "pattern".
func ParsePattern(pattern string) (*Regex, error) {
	n, err := parseRx(pattern, rxOptions{keyword: "pattern"})
	if err != nil {
		return nil, err
	}
	any := Star(AnyChar())
	return Or(
		n.m[1][1],
		Concat(n.m[1][0], any),
		Concat(any, n.m[0][1]),
		Concat(any, n.m[0][0], any),
	), nil
}

// rxOptions are the flags a regex is parsed with.
type rxOptions struct {
	keyword string // the Error keyword
	fold    bool   // i: case-insensitive
	dotAll  bool   // s: . matches line terminators too
	python  bool   // also accept Python's (?P<name>…) (Lark's regexes)
	// noLazy refuses lazy quantifiers: in a greedily lexed terminal they
	// would not stop where the author meant.
	noLazy bool
}

// rxNode is a parsed sub-pattern, split by the anchors its matches use:
// m[s][e] is the language of the paths through a ^ (s = 1) or not (s = 0)
// and through a $ (e = 1) or not. Anchors are only accepted where nothing
// that consumes text precedes a ^ or follows a $, so the split is exact.
type rxNode struct {
	m          [2][2]*Regex
	start, end bool // some path uses ^, $
	startOff   int  // the offset of such a ^
	endOff     int  // the offset of such a $
	nullOnly   bool // matches the empty string only (anchors, empty groups)
}

func plainNode(r *Regex) rxNode {
	return rxNode{m: [2][2]*Regex{{r, none}, {none, none}}}
}

type rxParser struct {
	src []rune
	pos int
	o   rxOptions
}

func parseRx(pattern string, o rxOptions) (rxNode, error) {
	p := &rxParser{src: []rune(pattern), o: o}
	n, err := p.disjunction(0)
	if err != nil {
		return rxNode{}, err
	}
	if p.pos < len(p.src) {
		// Only an unmatched ) stops a top-level disjunction.
		return rxNode{}, p.errAt(p.pos, "unmatched )")
	}
	return n, nil
}

func (p *rxParser) errAt(off int, format string, args ...any) *Error {
	return &Error{Keyword: p.o.keyword, Path: "offset " + strconv.Itoa(off), Msg: fmt.Sprintf(format, args...)}
}

func (p *rxParser) unsupported(off int, what string) *Error {
	e := p.errAt(off, "%s is not supported", what)
	e.Err = ErrUnsupported
	return e
}

func (p *rxParser) eof() bool { return p.pos >= len(p.src) }

func (p *rxParser) peek() rune {
	if p.eof() {
		return -1
	}
	return p.src[p.pos]
}

func (p *rxParser) peekAt(i int) rune {
	if p.pos+i >= len(p.src) {
		return -1
	}
	return p.src[p.pos+i]
}

// disjunction parses alternatives separated by | up to a ) or the end.
func (p *rxParser) disjunction(depth int) (rxNode, error) {
	var alts []rxNode
	for {
		a, err := p.alternative(depth)
		if err != nil {
			return rxNode{}, err
		}
		alts = append(alts, a)
		if p.peek() != '|' {
			break
		}
		p.pos++
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	out := rxNode{nullOnly: true}
	var subs [2][2][]*Regex
	for _, a := range alts {
		for s := range 2 {
			for e := range 2 {
				subs[s][e] = append(subs[s][e], a.m[s][e])
			}
		}
		if a.start && !out.start {
			out.start, out.startOff = true, a.startOff
		}
		if a.end && !out.end {
			out.end, out.endOff = true, a.endOff
		}
		out.nullOnly = out.nullOnly && a.nullOnly
	}
	for s := range 2 {
		for e := range 2 {
			out.m[s][e] = Or(subs[s][e]...)
		}
	}
	return out, nil
}

// alternative parses a sequence of terms up to a |, a ) or the end.
func (p *rxParser) alternative(depth int) (rxNode, error) {
	acc := rxNode{m: [2][2]*Regex{{empty, none}, {none, none}}, nullOnly: true}
	for !p.eof() {
		c := p.peek()
		if c == '|' {
			break
		}
		if c == ')' {
			if depth == 0 {
				return rxNode{}, p.errAt(p.pos, "unmatched )")
			}
			break
		}
		t, err := p.term(depth)
		if err != nil {
			return rxNode{}, err
		}
		if t.start && !acc.nullOnly {
			return rxNode{}, p.unsupported(t.startOff, "^ after the start of the pattern")
		}
		if acc.end && !t.nullOnly {
			return rxNode{}, p.unsupported(acc.endOff, "$ before the end of the pattern")
		}
		acc = concatNodes(acc, t)
	}
	return acc, nil
}

// concatNodes is a followed by b.
func concatNodes(a, b rxNode) rxNode {
	var subs [2][2][]*Regex
	for s1 := range 2 {
		for e1 := range 2 {
			if a.m[s1][e1].Op == OpNone {
				continue
			}
			for s2 := range 2 {
				for e2 := range 2 {
					if b.m[s2][e2].Op == OpNone {
						continue
					}
					s, e := s1|s2, e1|e2
					subs[s][e] = append(subs[s][e], Concat(a.m[s1][e1], b.m[s2][e2]))
				}
			}
		}
	}
	out := rxNode{nullOnly: a.nullOnly && b.nullOnly}
	for s := range 2 {
		for e := range 2 {
			out.m[s][e] = Or(subs[s][e]...)
		}
	}
	out.start, out.startOff = a.start, a.startOff
	if !out.start {
		out.start, out.startOff = b.start, b.startOff
	}
	out.end, out.endOff = b.end, b.endOff
	if !out.end {
		out.end, out.endOff = a.end, a.endOff
	}
	return out
}

// term parses an assertion or an atom with its quantifier.
func (p *rxParser) term(depth int) (rxNode, error) {
	off := p.pos
	c := p.peek()
	switch c {
	case '^':
		p.pos++
		n := rxNode{m: [2][2]*Regex{{none, none}, {empty, none}}, start: true, startOff: off, nullOnly: true}
		if p.atQuantifier() {
			return rxNode{}, p.errAt(p.pos, "nothing to repeat")
		}
		return n, nil
	case '$':
		p.pos++
		n := rxNode{m: [2][2]*Regex{{none, empty}, {none, none}}, end: true, endOff: off, nullOnly: true}
		if p.atQuantifier() {
			return rxNode{}, p.errAt(p.pos, "nothing to repeat")
		}
		return n, nil
	case '*', '+', '?':
		return rxNode{}, p.errAt(off, "nothing to repeat")
	case '{':
		if _, _, ok, err := p.tryBraces(); err != nil || ok {
			p.pos = off
			return rxNode{}, p.errAt(off, "nothing to repeat")
		}
		p.pos = off
	}
	atom, err := p.atom(depth)
	if err != nil {
		return rxNode{}, err
	}
	qoff := p.pos
	min, max, ok, err := p.quantifier()
	if err != nil {
		return rxNode{}, err
	}
	if !ok {
		return atom, nil
	}
	if p.atQuantifier() {
		return rxNode{}, p.errAt(p.pos, "nothing to repeat")
	}
	if atom.start || atom.end {
		if max < 0 || max > 1 {
			return rxNode{}, p.unsupported(qoff, "repeating a group that contains ^ or $")
		}
		if min == 0 {
			atom.m[0][0] = Or(empty, atom.m[0][0])
			atom.nullOnly = false
		}
		return atom, nil
	}
	return plainNode(Repeat(atom.m[0][0], min, max)), nil
}

// atQuantifier reports whether a quantifier starts at p.pos.
func (p *rxParser) atQuantifier() bool {
	switch p.peek() {
	case '*', '+', '?':
		return true
	case '{':
		save := p.pos
		_, _, ok, err := p.tryBraces()
		p.pos = save
		return ok || err != nil
	}
	return false
}

// quantifier parses an optional quantifier and its lazy ?.
func (p *rxParser) quantifier() (min, max int, ok bool, err error) {
	switch p.peek() {
	case '*':
		p.pos++
		min, max, ok = 0, -1, true
	case '+':
		p.pos++
		min, max, ok = 1, -1, true
	case '?':
		p.pos++
		min, max, ok = 0, 1, true
	case '{':
		save := p.pos
		min, max, ok, err = p.tryBraces()
		if err != nil {
			return 0, 0, false, err
		}
		if !ok {
			p.pos = save
			return 0, 0, false, nil
		}
	default:
		return 0, 0, false, nil
	}
	if p.peek() == '?' {
		if p.o.noLazy {
			return 0, 0, false, p.unsupported(p.pos, "a lazy quantifier in a lexeme (lexemes match longest-first)")
		}
		p.pos++ // lazy: the same language
	}
	return min, max, true, nil
}

// tryBraces parses {n}, {n,} or {n,m} at p.pos. ok is false (and p.pos
// undefined) if the text there is not of that form: then the { is a
// literal.
func (p *rxParser) tryBraces() (min, max int, ok bool, err error) {
	off := p.pos
	p.pos++ // {
	min, okMin := p.decimal()
	if !okMin {
		return 0, 0, false, nil
	}
	max = min
	if p.peek() == ',' {
		p.pos++
		if p.peek() == '}' {
			max = -1
		} else {
			var okMax bool
			max, okMax = p.decimal()
			if !okMax {
				return 0, 0, false, nil
			}
		}
	}
	if p.peek() != '}' {
		return 0, 0, false, nil
	}
	p.pos++
	if min > MaxRepeat || max > MaxRepeat {
		return 0, 0, false, p.errAt(off, "repetition count above %d", MaxRepeat)
	}
	if max >= 0 && max < min {
		return 0, 0, false, p.errAt(off, "numbers out of order in {%d,%d}", min, max)
	}
	return min, max, true, nil
}

// decimal reads digits, saturating above MaxRepeat.
func (p *rxParser) decimal() (int, bool) {
	start := p.pos
	n := 0
	for c := p.peek(); c >= '0' && c <= '9'; c = p.peek() {
		if n <= MaxRepeat {
			n = n*10 + int(c-'0')
		}
		p.pos++
	}
	return n, p.pos > start
}

// atom parses one atom: a character, a class, an escape, ., or a group.
func (p *rxParser) atom(depth int) (rxNode, error) {
	off := p.pos
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '.':
		if p.o.dotAll {
			return plainNode(AnyChar()), nil
		}
		return plainNode(NotClass(lineTerminators...)), nil
	case '[':
		rs, err := p.class(off)
		if err != nil {
			return rxNode{}, err
		}
		return plainNode(Class(rs...)), nil
	case '\\':
		return p.atomEscape(off)
	case '(':
		return p.group(off, depth)
	}
	return plainNode(p.char(c)), nil
}

// char is the regex of the literal code point c (its case variants too
// under the i flag).
func (p *rxParser) char(c rune) *Regex {
	rs := []RuneRange{{c, c}}
	if p.o.fold {
		rs = foldRanges(rs)
	}
	return Class(rs...)
}

func (p *rxParser) group(off, depth int) (rxNode, error) {
	if depth >= MaxNesting {
		return rxNode{}, p.errAt(off, "groups nested more than %d deep", MaxNesting)
	}
	if p.peek() == '?' {
		switch {
		case p.peekAt(1) == ':':
			p.pos += 2
		case p.peekAt(1) == '=':
			return rxNode{}, p.unsupported(off, "lookahead (?=…)")
		case p.peekAt(1) == '!':
			return rxNode{}, p.unsupported(off, "negative lookahead (?!…)")
		case p.peekAt(1) == '<' && p.peekAt(2) == '=':
			return rxNode{}, p.unsupported(off, "lookbehind (?<=…)")
		case p.peekAt(1) == '<' && p.peekAt(2) == '!':
			return rxNode{}, p.unsupported(off, "negative lookbehind (?<!…)")
		case p.peekAt(1) == '<', p.peekAt(1) == 'P' && p.peekAt(2) == '<' && p.o.python:
			if p.peekAt(1) == 'P' {
				p.pos++ // Python's (?P<name>…)
			}
			p.pos += 2
			start := p.pos
			for !p.eof() && p.peek() != '>' {
				c := p.peek()
				if !(c == '_' || c == '$' || unicode.IsLetter(c) || (p.pos > start && unicode.IsDigit(c))) {
					return rxNode{}, p.errAt(p.pos, "invalid character %q in a group name", c)
				}
				p.pos++
			}
			if p.eof() || p.pos == start {
				return rxNode{}, p.errAt(off, "invalid group name")
			}
			p.pos++ // >
		case p.peekAt(1) == 'P' && p.peekAt(2) == '<':
			return rxNode{}, p.errAt(off, "(?P<name>…) is Python's syntax; ECMA-262 writes (?<name>…)")
		default:
			return p.modifierGroup(off, depth)
		}
	}
	n, err := p.disjunction(depth + 1)
	if err != nil {
		return rxNode{}, err
	}
	if p.peek() != ')' {
		return rxNode{}, p.errAt(off, "unterminated group")
	}
	p.pos++
	return n, nil
}

// modifierGroup parses (?flags:…) or (?flags-flags:…) after its (, the
// ECMA-262 (2025) pattern modifiers, for the flags i and s.
func (p *rxParser) modifierGroup(off, depth int) (rxNode, error) {
	p.pos++ // ?
	saved := p.o
	on := true
	seen := map[rune]bool{}
	for {
		c := p.peek()
		switch {
		case c == ':' && len(seen) > 0:
			p.pos++
			n, err := p.disjunction(depth + 1)
			p.o = saved
			if err != nil {
				return rxNode{}, err
			}
			if p.peek() != ')' {
				return rxNode{}, p.errAt(off, "unterminated group")
			}
			p.pos++
			return n, nil
		case c == '-' && on:
			on = false
			p.pos++
			continue
		case c == 'i' || c == 's':
			if seen[c] {
				return rxNode{}, p.errAt(p.pos, "the flag %c is repeated in a modifier group", c)
			}
			seen[c] = true
			if c == 'i' {
				p.o.fold = on
			} else {
				p.o.dotAll = on
			}
			p.pos++
			continue
		case c == 'm':
			return rxNode{}, p.unsupported(off, "the modifier m (multiline)")
		}
		p.o = saved
		return rxNode{}, p.unsupported(off, "the group modifier (?"+string(p.src[off+2:p.pos])+string(c)+"…")
	}
}

// atomEscape parses the escape after a \ outside a class.
func (p *rxParser) atomEscape(off int) (rxNode, error) {
	if p.eof() {
		return rxNode{}, p.errAt(off, "\\ at the end of the pattern")
	}
	switch c := p.peek(); {
	case c == 'b':
		return rxNode{}, p.unsupported(off, "the word boundary \\b")
	case c == 'B':
		return rxNode{}, p.unsupported(off, "the non-word-boundary \\B")
	case c >= '1' && c <= '9':
		return rxNode{}, p.unsupported(off, "the backreference \\"+string(c))
	case c == 'k' && p.peekAt(1) == '<':
		return rxNode{}, p.unsupported(off, "the named backreference \\k<…>")
	}
	rs, neg, err := p.escape(off, false)
	if err != nil {
		return rxNode{}, err
	}
	if neg {
		return plainNode(NotClass(rs...)), nil
	}
	return plainNode(Class(rs...)), nil
}

var (
	lineTerminators = []RuneRange{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}
	digitRanges     = []RuneRange{{'0', '9'}}
	wordRanges      = []RuneRange{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	// spaceRanges is ECMA-262's WhiteSpace and LineTerminator: tab, LF,
	// VT, FF, CR, space, U+00A0, U+FEFF and the category Zs (U+1680,
	// U+2000…U+200A, U+202F, U+205F, U+3000), U+2028, U+2029.
	spaceRanges = []RuneRange{{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680},
		{0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}}
)

// escape parses the escape after a \ (p.pos is past the \), inside a
// class or not. It returns a set of code points and whether the escape
// denotes its complement (\D \W \S \P).
func (p *rxParser) escape(off int, inClass bool) (rs []RuneRange, neg bool, err error) {
	c := p.src[p.pos]
	p.pos++
	single := func(r rune) ([]RuneRange, bool, error) {
		rs := []RuneRange{{r, r}}
		if p.o.fold {
			rs = foldRanges(rs)
		}
		return rs, false, nil
	}
	switch c {
	case 'd':
		return digitRanges, false, nil
	case 'D':
		return digitRanges, true, nil
	case 'w':
		return wordRanges, false, nil
	case 'W':
		return wordRanges, true, nil
	case 's':
		return spaceRanges, false, nil
	case 'S':
		return spaceRanges, true, nil
	case 't':
		return single('\t')
	case 'n':
		return single('\n')
	case 'r':
		return single('\r')
	case 'f':
		return single('\f')
	case 'v':
		return single('\v')
	case 'b':
		if inClass {
			return single('\b')
		}
	case '0':
		if d := p.peek(); d >= '0' && d <= '9' {
			return nil, false, p.unsupported(off, "the octal escape \\0"+string(d))
		}
		return single(0)
	case 'c':
		if l := p.peek(); l >= 'a' && l <= 'z' || l >= 'A' && l <= 'Z' {
			p.pos++
			return single(l % 32)
		}
		return nil, false, p.errAt(off, "\\c must be followed by a letter")
	case 'x':
		v, ok := p.hex(2)
		if !ok {
			return nil, false, p.errAt(off, "\\x must be followed by two hex digits")
		}
		return single(v)
	case 'u':
		v, err := p.unicodeEscape(off)
		if err != nil {
			return nil, false, err
		}
		return single(v)
	case 'p', 'P':
		rs, err := p.property(off)
		if err != nil {
			return nil, false, err
		}
		if p.o.fold {
			rs = foldRanges(rs)
		}
		return rs, c == 'P', nil
	case '-':
		return single('-')
	}
	if c < utf8.RuneSelf && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
		return nil, false, p.errAt(off, "unknown escape \\%c", c)
	}
	return single(c)
}

// hex reads exactly n hex digits.
func (p *rxParser) hex(n int) (rune, bool) {
	if p.pos+n > len(p.src) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.src[p.pos:p.pos+n]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.pos += n
	return rune(v), true
}

// unicodeEscape parses XXXX or {X…} after \u, joining a surrogate pair
// written as two escapes.
func (p *rxParser) unicodeEscape(off int) (rune, error) {
	if p.peek() == '{' {
		end := p.pos + 1
		for end < len(p.src) && p.src[end] != '}' {
			end++
		}
		if end >= len(p.src) || end == p.pos+1 || end-p.pos-1 > 8 {
			return 0, p.errAt(off, "invalid \\u{…} escape")
		}
		v, err := strconv.ParseUint(string(p.src[p.pos+1:end]), 16, 32)
		if err != nil || v > unicode.MaxRune {
			return 0, p.errAt(off, "invalid \\u{…} escape")
		}
		p.pos = end + 1
		return rune(v), nil
	}
	v, ok := p.hex(4)
	if !ok {
		return 0, p.errAt(off, "\\u must be followed by four hex digits or {…}")
	}
	if v >= 0xD800 && v <= 0xDBFF && p.peek() == '\\' && p.peekAt(1) == 'u' {
		save := p.pos
		p.pos += 2
		if lo, ok := p.hex(4); ok && lo >= 0xDC00 && lo <= 0xDFFF {
			return 0x10000 + (v-0xD800)<<10 + (lo - 0xDC00), nil
		}
		p.pos = save
	}
	return v, nil
}

// class parses a character class after its [ and returns its code points
// (complemented if it starts with ^).
func (p *rxParser) class(off int) ([]RuneRange, error) {
	neg := false
	if p.peek() == '^' {
		neg = true
		p.pos++
	}
	var set []RuneRange
	for {
		if p.eof() {
			return nil, p.errAt(off, "unterminated character class")
		}
		if p.peek() == ']' {
			p.pos++
			break
		}
		loOff := p.pos
		lo, loSet, err := p.classAtom()
		if err != nil {
			return nil, err
		}
		if p.peek() == '-' && p.peekAt(1) != ']' && p.peekAt(1) != -1 {
			p.pos++
			hi, hiSet, err := p.classAtom()
			if err != nil {
				return nil, err
			}
			if loSet == nil && hiSet == nil {
				if hi < lo {
					return nil, p.errAt(loOff, "range out of order in character class")
				}
				set = append(set, RuneRange{lo, hi})
				continue
			}
			// Annex B: a range with a class escape at either end is the
			// union of its ends and a literal -.
			set = append(set, RuneRange{'-', '-'})
			set = appendAtom(set, lo, loSet)
			set = appendAtom(set, hi, hiSet)
			continue
		}
		set = appendAtom(set, lo, loSet)
	}
	if p.o.fold {
		set = foldRanges(set)
	}
	set = normRanges(set, unicode.MaxRune)
	if neg {
		return complementRanges(set), nil
	}
	return set, nil
}

func appendAtom(set []RuneRange, c rune, cs []RuneRange) []RuneRange {
	if cs != nil {
		return append(set, cs...)
	}
	return append(set, RuneRange{c, c})
}

// classAtom parses one class member: a code point (set nil) or a class
// escape such as \d (set not nil).
func (p *rxParser) classAtom() (c rune, set []RuneRange, err error) {
	off := p.pos
	c = p.src[p.pos]
	p.pos++
	if c != '\\' {
		return c, nil, nil
	}
	if p.eof() {
		return 0, nil, p.errAt(off, "\\ at the end of the pattern")
	}
	if d := p.peek(); d == 'B' {
		return 0, nil, p.errAt(off, "\\B in a character class")
	} else if d >= '1' && d <= '9' {
		return 0, nil, p.unsupported(off, "the octal or back reference \\"+string(d))
	}
	fold := p.o.fold
	p.o.fold = false // the whole class is folded at its end
	rs, neg, err := p.escape(off, true)
	p.o.fold = fold
	if err != nil {
		return 0, nil, err
	}
	if neg {
		return 0, complementRanges(normRanges(rs, unicode.MaxRune)), nil
	}
	if len(rs) == 1 && rs[0].Lo == rs[0].Hi && p.src[off+1] != 'p' && p.src[off+1] != 'P' {
		return rs[0].Lo, nil, nil
	}
	return 0, rs, nil
}

// complementRanges is the set of code points not in rs (sorted, merged).
func complementRanges(rs []RuneRange) []RuneRange {
	out := []RuneRange{}
	next := rune(0)
	for _, r := range rs {
		if r.Lo > next {
			out = append(out, RuneRange{next, r.Lo - 1})
		}
		next = r.Hi + 1
	}
	if next <= unicode.MaxRune {
		out = append(out, RuneRange{next, unicode.MaxRune})
	}
	return out
}

// foldRanges adds to rs the simple case variants (unicode.SimpleFold
// orbits) of its code points.
func foldRanges(rs []RuneRange) []RuneRange {
	out := append([]RuneRange(nil), rs...)
	for _, r := range rs {
		for _, cr := range unicode.CaseRanges {
			lo, hi := maxRune(r.Lo, rune(cr.Lo)), minRune(r.Hi, rune(cr.Hi))
			for c := lo; c <= hi; c++ {
				for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
					out = append(out, RuneRange{f, f})
				}
			}
		}
	}
	return normRanges(out, unicode.MaxRune)
}

// property parses {Name} or {Name=Value} after \p and returns its code
// points.
func (p *rxParser) property(off int) ([]RuneRange, error) {
	if p.peek() != '{' {
		return nil, p.errAt(off, "\\p must be followed by {property}")
	}
	end := p.pos + 1
	for end < len(p.src) && p.src[end] != '}' {
		end++
	}
	if end >= len(p.src) {
		return nil, p.errAt(off, "unterminated \\p{…}")
	}
	body := string(p.src[p.pos+1 : end])
	p.pos = end + 1
	name, value, hasValue := strings.Cut(body, "=")
	var t *unicode.RangeTable
	switch {
	case hasValue && (name == "General_Category" || name == "gc"):
		t = generalCategory(value)
	case hasValue && (name == "Script" || name == "sc"):
		t = unicode.Scripts[value]
	case hasValue:
		return nil, p.unsupported(off, "the Unicode property "+name)
	case name == "Any":
		return []RuneRange{{0, unicode.MaxRune}}, nil
	case name == "ASCII":
		return []RuneRange{{0, 0x7F}}, nil
	default:
		if t = generalCategory(name); t == nil {
			t = unicode.Properties[name]
		}
	}
	if t == nil {
		return nil, p.unsupported(off, "the Unicode property \\p{"+body+"}")
	}
	return tableRanges(t), nil
}

// generalCategoryNames maps the long names of Unicode general categories
// (Unicode's PropertyValueAliases.txt, as ECMA-262 accepts them) to the
// short ones of Go's unicode.Categories.
var generalCategoryNames = map[string]string{
	"Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
	"Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
	"Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
	"Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
	"Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
	"Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
	"Final_Punctuation": "Pf", "Other_Punctuation": "Po",
	"Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So",
	"Separator": "Z", "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp",
	"Other": "C", "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co",
}

func generalCategory(name string) *unicode.RangeTable {
	if short, ok := generalCategoryNames[name]; ok {
		name = short
	}
	return unicode.Categories[name]
}

// tableRanges lists t's code points as ranges.
func tableRanges(t *unicode.RangeTable) []RuneRange {
	var out []RuneRange
	add := func(lo, hi, stride uint32) {
		if stride == 1 {
			out = append(out, RuneRange{rune(lo), rune(hi)})
			return
		}
		for c := lo; c <= hi; c += stride {
			out = append(out, RuneRange{rune(c), rune(c)})
		}
	}
	for _, r := range t.R16 {
		add(uint32(r.Lo), uint32(r.Hi), uint32(r.Stride))
	}
	for _, r := range t.R32 {
		add(r.Lo, r.Hi, r.Stride)
	}
	return normRanges(out, unicode.MaxRune)
}

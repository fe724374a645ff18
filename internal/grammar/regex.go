package grammar

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// RxOp is the kind of a Regex node.
type RxOp uint8

// Regex node kinds.
const (
	// OpNone matches nothing (the empty language ∅).
	OpNone RxOp = iota
	// OpEmpty matches the empty string only (ε).
	OpEmpty
	// OpClass matches one code point in Ranges (UTF-8 encoded).
	OpClass
	// OpBytes matches one byte in Ranges (each Lo, Hi ≤ 0xFF); for raw
	// bytes that are not UTF-8 (GBNF's \x escapes above 0x7F).
	OpBytes
	// OpConcat matches Subs in sequence.
	OpConcat
	// OpOr matches any of Subs.
	OpOr
	// OpAnd matches what every one of Subs matches (intersection).
	OpAnd
	// OpNot matches every byte string Subs[0] does not (complement).
	OpNot
	// OpRepeat matches Subs[0] between Min and Max times (Max < 0:
	// unbounded).
	OpRepeat
)

// RuneRange is the closed range of code points (or bytes, in an OpBytes
// node) Lo…Hi.
type RuneRange struct{ Lo, Hi rune }

// Regex is a regular expression as a tree. Nodes are immutable once built;
// build them with the constructors below, which simplify as they go (∅ and
// ε absorbed, nested Or and Concat flattened).
type Regex struct {
	Op       RxOp
	Subs     []*Regex
	Ranges   []RuneRange // OpClass, OpBytes: sorted, disjoint, not adjacent
	Min, Max int         // OpRepeat
}

var (
	none  = &Regex{Op: OpNone}
	empty = &Regex{Op: OpEmpty}
)

// None is the regex matching nothing.
func None() *Regex { return none }

// Empty is the regex matching only the empty string.
func Empty() *Regex { return empty }

// Lit matches the string s exactly (its UTF-8 bytes; invalid bytes of s
// are matched as themselves).
func Lit(s string) *Regex {
	if s == "" {
		return empty
	}
	subs := make([]*Regex, 0, len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			subs = append(subs, Bytes(RuneRange{rune(s[i]), rune(s[i])}))
		} else {
			subs = append(subs, Class(RuneRange{r, r}))
		}
		i += n
	}
	return Concat(subs...)
}

// LitBytes matches the byte string b exactly.
func LitBytes(b []byte) *Regex {
	subs := make([]*Regex, len(b))
	for i, c := range b {
		subs[i] = Bytes(RuneRange{rune(c), rune(c)})
	}
	return Concat(subs...)
}

// normRanges sorts and merges ranges, clipping them to [0, max].
func normRanges(rs []RuneRange, max rune) []RuneRange {
	out := make([]RuneRange, 0, len(rs))
	for _, r := range rs {
		r.Lo = maxRune(r.Lo, 0)
		r.Hi = minRune(r.Hi, max)
		if r.Lo <= r.Hi {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b RuneRange) int { return int(a.Lo - b.Lo) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.Lo <= merged[n-1].Hi+1 {
			merged[n-1].Hi = maxRune(merged[n-1].Hi, r.Hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

func minRune(a, b rune) rune {
	if a < b {
		return a
	}
	return b
}

func maxRune(a, b rune) rune {
	if a > b {
		return a
	}
	return b
}

// Class matches one code point in any of rs (surrogates U+D800…U+DFFF
// never match: they have no UTF-8 form).
func Class(rs ...RuneRange) *Regex {
	var cut []RuneRange
	for _, r := range rs {
		if r.Lo <= 0xDFFF && r.Hi >= 0xD800 {
			if r.Lo < 0xD800 {
				cut = append(cut, RuneRange{r.Lo, 0xD7FF})
			}
			if r.Hi > 0xDFFF {
				cut = append(cut, RuneRange{0xE000, r.Hi})
			}
			continue
		}
		cut = append(cut, r)
	}
	n := normRanges(cut, utf8.MaxRune)
	if len(n) == 0 {
		return none
	}
	return &Regex{Op: OpClass, Ranges: n}
}

// NotClass matches one code point in none of rs.
func NotClass(rs ...RuneRange) *Regex {
	n := normRanges(rs, utf8.MaxRune)
	var out []RuneRange
	next := rune(0)
	for _, r := range n {
		if r.Lo > next {
			out = append(out, RuneRange{next, r.Lo - 1})
		}
		next = r.Hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, RuneRange{next, utf8.MaxRune})
	}
	return Class(out...)
}

// AnyChar matches any one code point.
func AnyChar() *Regex { return Class(RuneRange{0, utf8.MaxRune}) }

// Bytes matches one byte in any of rs (0…0xFF).
func Bytes(rs ...RuneRange) *Regex {
	n := normRanges(rs, 0xFF)
	if len(n) == 0 {
		return none
	}
	return &Regex{Op: OpBytes, Ranges: n}
}

// Concat matches subs in sequence.
func Concat(subs ...*Regex) *Regex {
	var flat []*Regex
	for _, s := range subs {
		switch s.Op {
		case OpNone:
			return none
		case OpEmpty:
		case OpConcat:
			flat = append(flat, s.Subs...)
		default:
			flat = append(flat, s)
		}
	}
	switch len(flat) {
	case 0:
		return empty
	case 1:
		return flat[0]
	}
	return &Regex{Op: OpConcat, Subs: flat}
}

// Or matches any of subs.
func Or(subs ...*Regex) *Regex {
	var flat []*Regex
	for _, s := range subs {
		switch s.Op {
		case OpNone:
		case OpOr:
			flat = append(flat, s.Subs...)
		default:
			flat = append(flat, s)
		}
	}
	switch len(flat) {
	case 0:
		return none
	case 1:
		return flat[0]
	}
	return &Regex{Op: OpOr, Subs: flat}
}

// And matches what all of subs match.
func And(subs ...*Regex) *Regex {
	var flat []*Regex
	for _, s := range subs {
		switch s.Op {
		case OpNone:
			return none
		case OpAnd:
			flat = append(flat, s.Subs...)
		default:
			flat = append(flat, s)
		}
	}
	switch len(flat) {
	case 0:
		return Star(Bytes(RuneRange{0, 0xFF}))
	case 1:
		return flat[0]
	}
	// One character of every class is one character of their
	// intersection: no And is needed (nor its liveness search).
	allClass := true
	for _, s := range flat {
		allClass = allClass && s.Op == OpClass
	}
	if allClass {
		ranges := flat[0].Ranges
		for _, s := range flat[1:] {
			ranges = intersectRanges(ranges, s.Ranges)
		}
		return Class(ranges...)
	}
	return &Regex{Op: OpAnd, Subs: flat}
}

// intersectRanges is the intersection of two sorted, disjoint range lists.
func intersectRanges(a, b []RuneRange) []RuneRange {
	var out []RuneRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := maxRune(a[i].Lo, b[j].Lo), minRune(a[i].Hi, b[j].Hi)
		if lo <= hi {
			out = append(out, RuneRange{lo, hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

// Not matches every byte string r does not match.
func Not(r *Regex) *Regex {
	if r.Op == OpNot {
		return r.Subs[0]
	}
	return &Regex{Op: OpNot, Subs: []*Regex{r}}
}

// Repeat matches r min to max times (max < 0: any number ≥ min).
func Repeat(r *Regex, min, max int) *Regex {
	switch {
	case max >= 0 && max < min:
		return none
	case max == 0:
		return empty
	case r.Op == OpEmpty:
		return empty
	case r.Op == OpNone:
		if min == 0 {
			return empty
		}
		return none
	case min == 1 && max == 1:
		return r
	}
	return &Regex{Op: OpRepeat, Subs: []*Regex{r}, Min: min, Max: max}
}

// Star is Repeat(r, 0, -1).
func Star(r *Regex) *Regex { return Repeat(r, 0, -1) }

// Plus is Repeat(r, 1, -1).
func Plus(r *Regex) *Regex { return Repeat(r, 1, -1) }

// Opt is Repeat(r, 0, 1).
func Opt(r *Regex) *Regex { return Repeat(r, 0, 1) }

// String writes r in a regex-like notation (for errors and tests).
func (r *Regex) String() string {
	var b strings.Builder
	r.write(&b)
	return b.String()
}

func (r *Regex) write(b *strings.Builder) {
	switch r.Op {
	case OpNone:
		b.WriteString("∅")
	case OpEmpty:
		b.WriteString("ε")
	case OpClass, OpBytes:
		if r.Op == OpClass && len(r.Ranges) == 1 && r.Ranges[0].Lo == r.Ranges[0].Hi {
			fmt.Fprintf(b, "%q", string(r.Ranges[0].Lo))
			return
		}
		if r.Op == OpBytes {
			b.WriteString("b")
		}
		b.WriteByte('[')
		for _, x := range r.Ranges {
			if x.Lo == x.Hi {
				fmt.Fprintf(b, "%#x", x.Lo)
			} else {
				fmt.Fprintf(b, "%#x-%#x", x.Lo, x.Hi)
			}
			b.WriteByte(' ')
		}
		b.WriteByte(']')
	case OpConcat, OpOr, OpAnd:
		sep := map[RxOp]string{OpConcat: " ", OpOr: "|", OpAnd: "&"}[r.Op]
		b.WriteByte('(')
		for i, s := range r.Subs {
			if i > 0 {
				b.WriteString(sep)
			}
			s.write(b)
		}
		b.WriteByte(')')
	case OpNot:
		b.WriteString("~(")
		r.Subs[0].write(b)
		b.WriteByte(')')
	case OpRepeat:
		r.Subs[0].write(b)
		fmt.Fprintf(b, "{%d,%d}", r.Min, r.Max)
	}
}

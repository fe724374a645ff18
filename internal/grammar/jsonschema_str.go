package grammar

import (
	"fmt"
	"unicode/utf8"
)

// JSON string contents. A string lexeme admits one encoding universe: a
// character other than `"`, `\` and the controls U+0000…U+001F raw (UTF-8),
// or an escape: `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`, or `\u00XX` (any hex
// case) for a control character. Every admitted encoding decodes to one
// character, so a constraint on the decoded text (a pattern, a length, a
// list of names) becomes an exact constraint on the encoded text by
// encodeJSONLang. \u escapes of other characters are not admitted (serde_json
// and Python's json with ensure_ascii=False never write them).

var (
	hexDigit = Class(RuneRange{'0', '9'}, RuneRange{'a', 'f'}, RuneRange{'A', 'F'})
	// jsonRawChar is a character written as itself inside a string.
	jsonRawChar = NotClass(RuneRange{0, 0x1F}, RuneRange{'"', '"'}, RuneRange{'\\', '\\'})
)

// jsonStrChar is one character of a string's contents, raw or escaped.
func jsonStrChar() *Regex {
	return Or(
		jsonRawChar,
		Concat(Lit(`\`), Class(RuneRange{'"', '"'}, RuneRange{'\\', '\\'}, RuneRange{'/', '/'},
			RuneRange{'b', 'b'}, RuneRange{'f', 'f'}, RuneRange{'n', 'n'}, RuneRange{'r', 'r'}, RuneRange{'t', 't'})),
		Concat(Lit(`\u00`), Class(RuneRange{'0', '1'}), hexDigit),
	)
}

// hexCase matches hex digit d (0…15) in either case.
func hexCase(d rune) *Regex {
	if d < 10 {
		return Class(RuneRange{'0' + d, '0' + d})
	}
	return Class(RuneRange{'a' + d - 10, 'a' + d - 10}, RuneRange{'A' + d - 10, 'A' + d - 10})
}

// jsonEscapes is the admitted encodings of character c when it needs (or
// may have) an escape, or nil.
func jsonEscapes(c rune) *Regex {
	var alts []*Regex
	switch c {
	case '"':
		alts = append(alts, Lit(`\"`))
	case '\\':
		alts = append(alts, Lit(`\\`))
	case '/':
		alts = append(alts, Lit(`\/`))
	case '\b':
		alts = append(alts, Lit(`\b`))
	case '\f':
		alts = append(alts, Lit(`\f`))
	case '\n':
		alts = append(alts, Lit(`\n`))
	case '\r':
		alts = append(alts, Lit(`\r`))
	case '\t':
		alts = append(alts, Lit(`\t`))
	}
	if c < 0x20 {
		alts = append(alts, Concat(Lit(`\u00`), hexCase(c>>4), hexCase(c&15)))
	}
	return Or(alts...)
}

// encodeJSONClass is the encodings of the characters of ranges.
func encodeJSONClass(ranges []RuneRange) *Regex {
	alts := []*Regex{And(Class(ranges...), jsonRawChar)}
	for _, r := range ranges {
		for _, c := range []rune{'"', '\\', '/'} {
			if r.Lo <= c && c <= r.Hi {
				alts = append(alts, jsonEscapes(c))
			}
		}
		for c := max(r.Lo, 0); c <= min(r.Hi, 0x1F); c++ {
			alts = append(alts, jsonEscapes(c))
		}
	}
	return Or(alts...)
}

// encodeJSONLang maps a regex over decoded string contents to the regex of
// their admitted encodings. Raw-byte nodes (OpBytes) are an error.
func encodeJSONLang(r *Regex, memo map[*Regex]*Regex) (*Regex, error) {
	if e, ok := memo[r]; ok {
		return e, nil
	}
	var out *Regex
	switch r.Op {
	case OpNone, OpEmpty:
		out = r
	case OpClass:
		if len(r.Ranges) == 1 && r.Ranges[0].Lo == r.Ranges[0].Hi && r.Ranges[0].Lo >= 0x20 &&
			r.Ranges[0].Lo != '"' && r.Ranges[0].Lo != '\\' && r.Ranges[0].Lo != '/' {
			out = r
		} else {
			out = encodeJSONClass(r.Ranges)
		}
	case OpBytes:
		return nil, fmt.Errorf("raw bytes cannot be matched inside a JSON string")
	case OpConcat, OpOr, OpAnd:
		subs := make([]*Regex, len(r.Subs))
		for i, s := range r.Subs {
			e, err := encodeJSONLang(s, memo)
			if err != nil {
				return nil, err
			}
			subs[i] = e
		}
		switch r.Op {
		case OpConcat:
			out = Concat(subs...)
		case OpOr:
			out = Or(subs...)
		default:
			out = And(subs...)
		}
	case OpNot:
		e, err := encodeJSONLang(r.Subs[0], memo)
		if err != nil {
			return nil, err
		}
		out = And(Not(e), Star(jsonStrChar()))
	case OpRepeat:
		e, err := encodeJSONLang(r.Subs[0], memo)
		if err != nil {
			return nil, err
		}
		out = Repeat(e, r.Min, r.Max)
	}
	memo[r] = out
	return out, nil
}

// rxMatchString reports whether r matches s whole.
func rxMatchString(r *Regex, s string) bool {
	ex := newExprSet()
	id := ex.fromRegex(r)
	for i := 0; i < len(s) && id != eNone; i++ {
		id = ex.derive(id, s[i])
	}
	return ex.node(id).nullable
}

// rxIsEmpty reports whether r certainly matches nothing (an expression
// too costly to decide is taken to match something).
func rxIsEmpty(r *Regex) bool {
	ex := newExprSet()
	return !ex.isLive(ex.fromRegex(r))
}

// runeCount is the length of s in code points, JSON Schema's string length.
func runeCount(s string) int { return utf8.RuneCountInString(s) }

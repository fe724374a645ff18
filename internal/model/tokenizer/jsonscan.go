package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A hand-written reader for the large parts of tokenizer.json: the model's
// vocab (an object of token → id) and merges (a list of "a b" strings or of
// ["a", "b"] pairs), and the objects that hold them, split into members
// without decoding. With encoding/json's reflection and its repeated
// validation of the whole document, Load took about twice as long (Llama
// 3: 9 MB, 128k tokens, 280k merges). It accepts the JSON (RFC 8259) of
// those shapes; anything else is an error naming the byte offset.
type jsonReader struct {
	data []byte
	pos  int
}

func (r *jsonReader) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", r.pos, fmt.Sprintf(format, args...))
}

func (r *jsonReader) skipSpace() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end (a NUL byte,
// invalid wherever JSON allows white space, also reads as 0).
func (r *jsonReader) peek() byte {
	r.skipSpace()
	if r.pos >= len(r.data) {
		return 0
	}
	return r.data[r.pos]
}

func (r *jsonReader) expect(c byte) error {
	if r.peek() != c {
		if r.pos >= len(r.data) {
			return r.errorf("unexpected end, want %q", c)
		}
		return r.errorf("got %q, want %q", r.data[r.pos], c)
	}
	r.pos++
	return nil
}

// end checks that only white space is left.
func (r *jsonReader) end() error {
	r.skipSpace()
	if r.pos < len(r.data) {
		return r.errorf("unexpected %q after the value", r.data[r.pos])
	}
	return nil
}

// str reads a JSON string.
func (r *jsonReader) str() (string, error) {
	if err := r.expect('"'); err != nil {
		return "", err
	}
	start := r.pos
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			s := r.data[start:r.pos]
			r.pos++
			if !utf8.Valid(s) {
				return "", r.errorf("string is not valid UTF-8")
			}
			return string(s), nil
		case c == '\\':
			return r.escapedStr(start)
		case c < 0x20:
			return "", r.errorf("control character %#x in a string", c)
		}
		r.pos++
	}
	return "", r.errorf("unterminated string")
}

// escapedStr finishes a string holding escapes, from its first byte start.
func (r *jsonReader) escapedStr(start int) (string, error) {
	var b strings.Builder
	b.Write(r.data[start:r.pos])
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			r.pos++
			s := b.String()
			if !utf8.ValidString(s) {
				return "", r.errorf("string is not valid UTF-8")
			}
			return s, nil
		case c < 0x20:
			return "", r.errorf("control character %#x in a string", c)
		case c != '\\':
			b.WriteByte(c)
			r.pos++
			continue
		}
		if r.pos+1 >= len(r.data) {
			return "", r.errorf("unterminated escape")
		}
		e := r.data[r.pos+1]
		r.pos += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			u, err := r.hex4()
			if err != nil {
				return "", err
			}
			ch := rune(u)
			if utf16.IsSurrogate(ch) {
				// A surrogate pair; a lone surrogate becomes U+FFFD,
				// as in encoding/json.
				ch = utf8.RuneError
				if r.pos+1 < len(r.data) && r.data[r.pos] == '\\' && r.data[r.pos+1] == 'u' {
					save := r.pos
					r.pos += 2
					lo, err := r.hex4()
					if err != nil {
						return "", err
					}
					if dec := utf16.DecodeRune(rune(u), rune(lo)); dec != utf8.RuneError {
						ch = dec
					} else {
						r.pos = save
					}
				}
			}
			b.WriteRune(ch)
		default:
			return "", r.errorf("invalid escape \\%c", e)
		}
	}
	return "", r.errorf("unterminated string")
}

func (r *jsonReader) hex4() (uint16, error) {
	if r.pos+4 > len(r.data) {
		return 0, r.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(r.data[r.pos:r.pos+4]), 16, 16)
	if err != nil {
		return 0, r.errorf("invalid \\u escape %q", r.data[r.pos:r.pos+4])
	}
	r.pos += 4
	return uint16(v), nil
}

// id reads a non-negative integer that fits an int32.
func (r *jsonReader) id() (int32, error) {
	r.skipSpace()
	start := r.pos
	for r.pos < len(r.data) && r.data[r.pos] >= '0' && r.data[r.pos] <= '9' {
		r.pos++
	}
	if r.pos == start {
		return 0, r.errorf("want a token id (a non-negative integer)")
	}
	if r.data[start] == '0' && r.pos-start > 1 {
		return 0, r.errorf("invalid number %q", r.data[start:r.pos])
	}
	v, err := strconv.ParseInt(string(r.data[start:r.pos]), 10, 32)
	if err != nil {
		return 0, r.errorf("token id %s out of range", r.data[start:r.pos])
	}
	return int32(v), nil
}

// parseVocab reads a vocab object {"token": id, …}. A repeated token keeps
// its last id, as with encoding/json.
func parseVocab(raw []byte) (map[string]int32, error) {
	r := &jsonReader{data: raw}
	if err := r.expect('{'); err != nil {
		return nil, err
	}
	vocab := make(map[string]int32, len(raw)/12)
	if r.peek() == '}' {
		r.pos++
		return vocab, r.end()
	}
	for {
		tok, err := r.str()
		if err != nil {
			return nil, err
		}
		if err := r.expect(':'); err != nil {
			return nil, err
		}
		id, err := r.id()
		if err != nil {
			return nil, fmt.Errorf("token %q: %w", tok, err)
		}
		vocab[tok] = id
		switch r.peek() {
		case ',':
			r.pos++
		case '}':
			r.pos++
			return vocab, r.end()
		default:
			return nil, r.errorf("want ',' or '}' in the vocab")
		}
	}
}

// parseMergeList reads merges: a list of strings "a b" (split at the first
// space) or of pairs ["a", "b"].
func parseMergeList(raw []byte) ([][2]string, error) {
	r := &jsonReader{data: raw}
	if err := r.expect('['); err != nil {
		return nil, err
	}
	var pairs [][2]string
	if r.peek() == ']' {
		r.pos++
		return pairs, r.end()
	}
	for {
		var p [2]string
		switch r.peek() {
		case '"':
			s, err := r.str()
			if err != nil {
				return nil, err
			}
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("merge %d %q is not two tokens separated by a space", len(pairs), s)
			}
			p = [2]string{a, b}
		case '[':
			r.pos++
			var err error
			if p[0], err = r.str(); err != nil {
				return nil, err
			}
			if err := r.expect(','); err != nil {
				return nil, err
			}
			if p[1], err = r.str(); err != nil {
				return nil, err
			}
			if err := r.expect(']'); err != nil {
				return nil, fmt.Errorf("merge %d is not a pair: %w", len(pairs), err)
			}
		default:
			return nil, r.errorf("merge %d: want a string \"a b\" or a pair [\"a\", \"b\"]", len(pairs))
		}
		pairs = append(pairs, p)
		switch r.peek() {
		case ',':
			r.pos++
		case ']':
			r.pos++
			return pairs, r.end()
		default:
			return nil, r.errorf("want ',' or ']' in the merges")
		}
	}
}

// maxJSONDepth bounds the nesting skipValue accepts.
const maxJSONDepth = 512

// skipValue moves past one JSON value, checking its syntax (strings are
// not decoded).
func (r *jsonReader) skipValue(depth int) error {
	if depth > maxJSONDepth {
		return r.errorf("nested deeper than %d", maxJSONDepth)
	}
	switch c := r.peek(); {
	case c == '"':
		r.pos++
		for r.pos < len(r.data) {
			switch b := r.data[r.pos]; {
			case b == '"':
				r.pos++
				return nil
			case b == '\\':
				r.pos += 2
			case b < 0x20:
				return r.errorf("control character %#x in a string", b)
			default:
				r.pos++
			}
		}
		return r.errorf("unterminated string")
	case c == '{' || c == '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		r.pos++
		if r.peek() == closer {
			r.pos++
			return nil
		}
		for {
			if c == '{' {
				if r.peek() != '"' {
					return r.errorf("want an object key")
				}
				if err := r.skipValue(depth + 1); err != nil {
					return err
				}
				if err := r.expect(':'); err != nil {
					return err
				}
			}
			if err := r.skipValue(depth + 1); err != nil {
				return err
			}
			switch r.peek() {
			case ',':
				r.pos++
			case closer:
				r.pos++
				return nil
			default:
				return r.errorf("want ',' or %q", closer)
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		start := r.pos
		for r.pos < len(r.data) && strings.IndexByte("+-.eE0123456789", r.data[r.pos]) >= 0 {
			r.pos++
		}
		if _, err := strconv.ParseFloat(string(r.data[start:r.pos]), 64); err != nil {
			return r.errorf("invalid number %q", r.data[start:r.pos])
		}
		return nil
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if strings.HasPrefix(string(r.data[r.pos:min(len(r.data), r.pos+5)]), lit) {
				r.pos += len(lit)
				return nil
			}
		}
		if r.pos >= len(r.data) {
			return r.errorf("unexpected end")
		}
		return r.errorf("unexpected %q", r.data[r.pos])
	}
}

// objectMembers splits a JSON object into its members' raw values, without
// decoding them. A repeated key keeps its last value, as with encoding/json.
func objectMembers(raw []byte) (map[string][]byte, error) {
	r := &jsonReader{data: raw}
	if err := r.expect('{'); err != nil {
		return nil, err
	}
	members := map[string][]byte{}
	if r.peek() == '}' {
		r.pos++
		return members, r.end()
	}
	for {
		key, err := r.str()
		if err != nil {
			return nil, err
		}
		if err := r.expect(':'); err != nil {
			return nil, err
		}
		start := r.peekPos()
		if err := r.skipValue(1); err != nil {
			return nil, fmt.Errorf("%q: %w", key, err)
		}
		members[key] = raw[start:r.pos]
		switch r.peek() {
		case ',':
			r.pos++
		case '}':
			r.pos++
			return members, r.end()
		default:
			return nil, r.errorf("want ',' or '}'")
		}
	}
}

// peekPos skips white space and returns the position of the next value.
func (r *jsonReader) peekPos() int {
	r.skipSpace()
	return r.pos
}

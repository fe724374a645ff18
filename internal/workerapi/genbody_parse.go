package workerapi

import (
	"strconv"
)

// parseGenerateBody decodes data, a leg body as AppendJSON writes it, into
// b without reflection. Keys may come in any order, with any JSON
// whitespace, and a repeated key's last value wins, as with encoding/json.
// It reports false, leaving b alone, for anything else: an unknown key
// (encoding/json would also match it case-insensitively), a string with an
// escape or a byte outside printable ASCII, null (but for an array), a number that is not
// plain for its field (a fraction or exponent for an integer, out of
// range), or malformed JSON. The caller then decodes with encoding/json,
// so a body always decodes as encoding/json decodes it; the fuzz test
// FuzzParseGenerateBody holds the two to that.
func parseGenerateBody(data []byte, b *GenerateBody) bool {
	p := bodyParser{data: data}
	var out GenerateBody
	p.ws()
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.peek() == '}' {
		p.i++
	} else {
		for {
			p.ws()
			key, ok := p.str()
			if !ok {
				return false
			}
			p.ws()
			if !p.byte(':') {
				return false
			}
			p.ws()
			if !p.field(key, &out) {
				return false
			}
			p.ws()
			if p.byte(',') {
				continue
			}
			if p.byte('}') {
				break
			}
			return false
		}
	}
	p.ws()
	if p.i != len(p.data) {
		return false
	}
	*b = out
	return true
}

type bodyParser struct {
	data []byte
	i    int
}

func (p *bodyParser) peek() byte {
	if p.i < len(p.data) {
		return p.data[p.i]
	}
	return 0
}

func (p *bodyParser) ws() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *bodyParser) byte(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (p *bodyParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			s := string(p.data[start:p.i])
			p.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
		p.i++
	}
	return "", false
}

// number returns the next JSON number literal and whether it is an integer
// (no fraction or exponent); ok is false if it is not a JSON number.
func (p *bodyParser) number() (lit []byte, integer, ok bool) {
	start := p.i
	_ = p.byte('-')
	switch c := p.peek(); {
	case c == '0':
		p.i++
	case c >= '1' && c <= '9':
		for c := p.peek(); c >= '0' && c <= '9'; c = p.peek() {
			p.i++
		}
	default:
		return nil, false, false
	}
	integer = true
	if p.byte('.') {
		integer = false
		if !p.digits() {
			return nil, false, false
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		integer = false
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		if !p.digits() {
			return nil, false, false
		}
	}
	return p.data[start:p.i], integer, true
}

// digits reads one or more decimal digits.
func (p *bodyParser) digits() bool {
	n := 0
	for c := p.peek(); c >= '0' && c <= '9'; c = p.peek() {
		p.i++
		n++
	}
	return n > 0
}

// integer reads a JSON integer literal (no fraction or exponent).
func (p *bodyParser) integer() (string, bool) {
	lit, integer, ok := p.number()
	return string(lit), ok && integer
}

// signed reads an integer literal within bits, as encoding/json does for
// an int field.
func (p *bodyParser) signed(bits int) (int64, bool) {
	s, ok := p.integer()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, bits)
	return v, err == nil
}

// unsigned reads an integer literal within bits, as encoding/json does for
// a uint field.
func (p *bodyParser) unsigned(bits int) (uint64, bool) {
	s, ok := p.integer()
	if !ok {
		return 0, false
	}
	u, err := strconv.ParseUint(s, 10, bits)
	return u, err == nil
}

// intInto reads an int field into dst.
func (p *bodyParser) intInto(dst *int) bool {
	v, ok := p.signed(strconv.IntSize)
	*dst = int(v)
	return ok
}

func (p *bodyParser) float32() (float32, bool) {
	lit, _, ok := p.number()
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(lit), 32)
	return float32(f), err == nil
}

func (p *bodyParser) bool() (bool, bool) {
	switch {
	case p.lit("true"):
		return true, true
	case p.lit("false"):
		return false, true
	}
	return false, false
}

func (p *bodyParser) lit(s string) bool {
	if len(p.data)-p.i >= len(s) && string(p.data[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// int32s reads an array of int32s ([] is empty, null is nil, as
// encoding/json).
func (p *bodyParser) int32s() ([]int32, bool) {
	if p.lit("null") {
		return nil, true
	}
	if !p.byte('[') {
		return nil, false
	}
	out := make([]int32, 0, 16)
	p.ws()
	if p.byte(']') {
		return out, true
	}
	for {
		p.ws()
		v, ok := p.signed(32)
		if !ok {
			return nil, false
		}
		out = append(out, int32(v))
		p.ws()
		if p.byte(',') {
			continue
		}
		if p.byte(']') {
			return out, true
		}
		return nil, false
	}
}

// field reads the value of key into b.
func (p *bodyParser) field(key string, b *GenerateBody) bool {
	var ok bool
	switch key {
	case "rid":
		b.RID, ok = p.str()
	case "room":
		b.Room, ok = p.str()
	case "prefill_kv_addr":
		b.PrefillKVAddr, ok = p.str()
	case "gen":
		var u uint64
		u, ok = p.unsigned(32)
		b.Gen = uint32(u)
	case "input_ids":
		b.InputIDs, ok = p.int32s()
	case "stop_token_ids":
		b.StopTokenIDs, ok = p.int32s()
	case "max_tokens":
		ok = p.intInto(&b.MaxTokens)
	case "top_k":
		ok = p.intInto(&b.TopK)
	case "min_tokens":
		ok = p.intInto(&b.MinTokens)
	case "continued_tokens":
		ok = p.intInto(&b.ContinuedTokens)
	case "seed":
		b.Seed, ok = p.unsigned(64)
	case "temperature":
		b.Temperature, ok = p.float32()
	case "top_p":
		b.TopP, ok = p.float32()
	case "ignore_eos":
		b.IgnoreEOS, ok = p.bool()
	case "buffered":
		b.Buffered, ok = p.bool()
	}
	return ok
}

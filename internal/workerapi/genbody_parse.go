package workerapi

import (
	"io"
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

// int reads an integer literal within bits (signed unless unsigned).
func (p *bodyParser) int(bits int, unsigned bool) (int64, uint64, bool) {
	lit, integer, ok := p.number()
	if !ok || !integer {
		return 0, 0, false
	}
	s := string(lit)
	if unsigned {
		u, err := strconv.ParseUint(s, 10, bits)
		return 0, u, err == nil
	}
	v, err := strconv.ParseInt(s, 10, bits)
	return v, 0, err == nil
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
		v, _, ok := p.int(32, false)
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
		_, u, ok = p.int(32, true)
		b.Gen = uint32(u)
	case "input_ids":
		b.InputIDs, ok = p.int32s()
	case "stop_token_ids":
		b.StopTokenIDs, ok = p.int32s()
	case "max_tokens", "top_k", "min_tokens":
		var v int64
		v, _, ok = p.int(strconv.IntSize, false)
		switch key {
		case "max_tokens":
			b.MaxTokens = int(v)
		case "top_k":
			b.TopK = int(v)
		default:
			b.MinTokens = int(v)
		}
	case "seed":
		b.Seed, ok = p.seed()
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

func (p *bodyParser) seed() (uint64, bool) {
	_, u, ok := p.int(64, true)
	return u, ok
}

// ReadSized reads r to its end into a buffer of the announced size n (a
// Content-Length; < 0 or beyond 1 GiB: unknown), allocated once when the
// announcement is right and at most MaxSizedPrealloc, where io.ReadAll
// would grow a buffer from 512 bytes. Beyond MaxSizedPrealloc the buffer
// grows (doubling, up to n) only as the bytes arrive, so a claim of a
// large body that never comes costs no more than MaxSizedPrealloc. A body
// longer than announced is still read whole; one shorter is
// io.ErrUnexpectedEOF, with what it had.
func ReadSized(r io.Reader, n int64) ([]byte, error) {
	if n < 0 || n > 1<<30 {
		return io.ReadAll(r)
	}
	buf := make([]byte, 0, min(n, MaxSizedPrealloc))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= n {
				// Announced size reached: look for more (a longer body).
				var one [1]byte
				switch m, err := r.Read(one[:]); {
				case m == 1:
					more, err := io.ReadAll(r)
					return append(append(buf, one[0]), more...), err
				case err != nil && err != io.EOF:
					return buf, err
				case err == io.EOF:
					return buf, nil
				}
				continue
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), n))
			copy(grown, buf)
			buf = grown
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		switch {
		case err == io.EOF:
			if int64(len(buf)) < n {
				return buf, io.ErrUnexpectedEOF
			}
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
}

// MaxSizedPrealloc bounds the buffer ReadSized allocates for a body's
// announced size before its bytes arrive (1 MiB: a leg of a 128K-token
// prompt, at up to 7 bytes a token id, is under it).
const MaxSizedPrealloc = 1 << 20

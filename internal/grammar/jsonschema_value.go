package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jkind is the type of a JSON value.
type jkind uint8

const (
	jNull jkind = iota
	jBool
	jNum
	jStr
	jArr
	jObj
)

// jval is a JSON value that keeps the order of an object's members (a
// schema's property order is the order of its "properties").
type jval struct {
	k    jkind
	b    bool
	s    string // jStr: the string; jNum: the number's text
	arr  []*jval
	keys []string
	vals []*jval
}

// get is the member key of object v, or nil.
func (v *jval) get(key string) *jval {
	if v == nil || v.k != jObj {
		return nil
	}
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

// maxJSONDepth bounds the nesting of a schema document.
const maxJSONDepth = 256

// parseJSONValue parses one JSON text keeping member order.
func parseJSONValue(data []byte) (*jval, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := readJSONValue(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("text after the JSON value")
	}
	return v, nil
}

func readJSONValue(d *json.Decoder, depth int) (*jval, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested more than %d deep", maxJSONDepth)
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case nil:
		return &jval{k: jNull}, nil
	case bool:
		return &jval{k: jBool, b: t}, nil
	case json.Number:
		return &jval{k: jNum, s: string(t)}, nil
	case string:
		return &jval{k: jStr, s: t}, nil
	case json.Delim:
		switch t {
		case '[':
			v := &jval{k: jArr}
			for d.More() {
				e, err := readJSONValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				v.arr = append(v.arr, e)
			}
			_, err := d.Token()
			return v, err
		case '{':
			v := &jval{k: jObj}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				e, err := readJSONValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				dup := false
				for i, old := range v.keys {
					if old == k {
						v.vals[i], dup = e, true
					}
				}
				if !dup {
					v.keys = append(v.keys, k)
					v.vals = append(v.vals, e)
				}
			}
			_, err := d.Token()
			return v, err
		}
	}
	return nil, fmt.Errorf("unexpected JSON token %v", t)
}

// rat is the number's exact value (nil if v is not a number).
func (v *jval) rat() *big.Rat {
	if v == nil || v.k != jNum {
		return nil
	}
	r, ok := new(big.Rat).SetString(v.s)
	if !ok {
		return nil
	}
	return r
}

// jsonEqual is JSON Schema's equality: numbers by value, objects regardless
// of member order.
func jsonEqual(a, b *jval) bool {
	if a.k != b.k {
		return false
	}
	switch a.k {
	case jNull:
		return true
	case jBool:
		return a.b == b.b
	case jStr:
		return a.s == b.s
	case jNum:
		ra, rb := a.rat(), b.rat()
		return ra != nil && rb != nil && ra.Cmp(rb) == 0
	case jArr:
		if len(a.arr) != len(b.arr) {
			return false
		}
		for i := range a.arr {
			if !jsonEqual(a.arr[i], b.arr[i]) {
				return false
			}
		}
		return true
	case jObj:
		if len(a.keys) != len(b.keys) {
			return false
		}
		for i, k := range a.keys {
			o := b.get(k)
			if o == nil || !jsonEqual(a.vals[i], o) {
				return false
			}
		}
		return true
	}
	return false
}

// jsonQuote is s as a JSON string in the canonical form the grammar's
// string lexemes admit: raw UTF-8, `\"`, `\\`, the short escapes of
// control characters and \u00XX for the other ones.
func jsonQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else if r == utf8.RuneError {
				b.WriteString(`\ufffd`)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// String writes v as compact JSON (for error messages).
func (v *jval) String() string {
	var b strings.Builder
	v.write(&b)
	return b.String()
}

func (v *jval) write(b *strings.Builder) {
	switch v.k {
	case jNull:
		b.WriteString("null")
	case jBool:
		b.WriteString(strconv.FormatBool(v.b))
	case jNum:
		b.WriteString(v.s)
	case jStr:
		b.WriteString(jsonQuote(v.s))
	case jArr:
		b.WriteByte('[')
		for i, e := range v.arr {
			if i > 0 {
				b.WriteByte(',')
			}
			e.write(b)
		}
		b.WriteByte(']')
	case jObj:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonQuote(k))
			b.WriteByte(':')
			v.vals[i].write(b)
		}
		b.WriteByte('}')
	}
}

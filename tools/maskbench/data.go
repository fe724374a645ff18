package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// testFile is one MaskBench file: a schema and its instances.
type testFile struct {
	// Schema is the schema's text as the file holds it (key order kept).
	Schema json.RawMessage `json:"schema"`
	Meta   struct {
		Features []string `json:"features"`
	} `json:"meta"`
	Tests []testCase `json:"tests"`
}

// testCase is one instance: Data must be accepted iff Valid.
type testCase struct {
	Description string          `json:"description"`
	Valid       bool            `json:"valid"`
	Data        json.RawMessage `json:"data"`
}

// readTestFile reads and parses a MaskBench file.
func readTestFile(path string) (*testFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f testFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(f.Schema) == 0 {
		return nil, fmt.Errorf("%s: no schema", path)
	}
	return &f, nil
}

// listFiles returns the *.json files of dir whose base names match re (nil:
// all), sorted by name.
func listFiles(dir string, re *regexp.Regexp) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".json") {
			continue
		}
		if re != nil && !re.MatchString(n) {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	sort.Strings(out)
	return out, nil
}

// splitOf is the split a file belongs to: the part of its base name before
// "---" (Github_easy---o10008.json is Github_easy), else the part before the
// first "_" (BFCL_simple_3.json is BFCL, JME_7.json is JME).
func splitOf(path string) string {
	n := filepath.Base(path)
	if i := strings.Index(n, "---"); i > 0 {
		return n[:i]
	}
	if i := strings.IndexByte(n, '_'); i > 0 {
		return n[:i]
	}
	return strings.TrimSuffix(n, ".json")
}

// serializer writes an instance as text before it is tokenized.
type serializer struct {
	// compact writes no whitespace (serde_json::to_string, llguidance's
	// json_stats); otherwise ", " and ": " separate items and keys from
	// values, as Python's json.dumps(data, indent=None) does (MaskBench's
	// runner).
	compact bool
}

// serialize re-encodes the JSON text data as MaskBench's runner does with
// json.dumps(data, indent=None, ensure_ascii=False) after json.loads: keys
// in file order (a repeated key keeps its first place and its last value),
// non-ASCII characters written as themselves, control characters escaped
// as \n, \r, \t, \b, \f or \u00xx, integers as written, other numbers in
// Python's repr (1e-05, 100000.0).
func (s serializer) serialize(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", fmt.Errorf("trailing data after the instance")
	}
	var b strings.Builder
	if err := s.write(&b, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

// member is one key of an object, in order.
type member struct {
	key string
	val any
}

// decodeValue reads one value: nil, bool, json.Number, string, []any or
// []member.
func decodeValue(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		case '{':
			obj := []member{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				key := k.(string)
				found := false
				for i := range obj {
					if obj[i].key == key {
						obj[i].val, found = v, true
						break
					}
				}
				if !found {
					obj = append(obj, member{key, v})
				}
			}
			_, err := dec.Token()
			return obj, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

func (s serializer) write(b *strings.Builder, v any) error {
	comma, colon := ", ", ": "
	if s.compact {
		comma, colon = ",", ":"
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case string:
		writePyString(b, v)
	case json.Number:
		n, err := pyNumber(string(v))
		if err != nil {
			return err
		}
		b.WriteString(n)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(comma)
			}
			if err := s.write(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case []member:
		b.WriteByte('{')
		for i, m := range v {
			if i > 0 {
				b.WriteString(comma)
			}
			writePyString(b, m.key)
			b.WriteString(colon)
			if err := s.write(b, m.val); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected value %T", v)
	}
	return nil
}

// writePyString writes s quoted as Python's json module does with
// ensure_ascii=False.
func writePyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			_, n := utf8.DecodeRuneInString(s[i:])
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		switch c {
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
			if c < 0x20 {
				fmt.Fprintf(b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
		i++
	}
	b.WriteByte('"')
}

// pyNumber is the JSON number literal lit as Python writes it back after
// reading it: an integer literal as an int (its digits, -0 as 0), any other
// as a float in repr form — the shortest digits that round-trip, in
// positional notation with at least one decimal when the decimal exponent
// is in [-4, 16), else as d.ddde±XX (CPython's float_repr_style "short").
func pyNumber(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0", nil
		}
		return lit, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !math.IsInf(f, 0) {
		return "", err
	}
	if math.IsInf(f, 0) {
		// Python reads an overflowing literal as inf and json.dumps
		// writes Infinity, which is not JSON.
		if f > 0 {
			return "Infinity", nil
		}
		return "-Infinity", nil
	}
	return pyFloatRepr(f), nil
}

// pyFloatRepr is Python's repr of a finite float.
func pyFloatRepr(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	neg := strings.HasPrefix(e, "-")
	if neg {
		e = e[1:]
	}
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	decpt := exp + 1 // digits d1d2... times 10^(decpt-len)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if decpt > -4 && decpt <= 16 {
		switch {
		case decpt <= 0:
			b.WriteString("0.")
			b.WriteString(strings.Repeat("0", -decpt))
			b.WriteString(digits)
		case decpt >= len(digits):
			b.WriteString(digits)
			b.WriteString(strings.Repeat("0", decpt-len(digits)))
			b.WriteString(".0")
		default:
			b.WriteString(digits[:decpt])
			b.WriteByte('.')
			b.WriteString(digits[decpt:])
		}
		return b.String()
	}
	b.WriteByte(digits[0])
	if len(digits) > 1 {
		b.WriteByte('.')
		b.WriteString(digits[1:])
	}
	b.WriteByte('e')
	if exp < 0 {
		b.WriteByte('-')
		exp = -exp
	} else {
		b.WriteByte('+')
	}
	if exp < 10 {
		b.WriteByte('0')
	}
	b.WriteString(strconv.Itoa(exp))
	return b.String()
}

// jsonPosition describes the byte at offset off of the JSON text text: the
// JSON pointer of the value it is in (for an object key, of the member it
// names) and what it is part of ("object key", "string", "number",
// "literal", or the punctuation: "',' (next item)", "'}' (end of object)",
// "']' (end of array)", "':'", "'{'", "'['"); "end of text" at len(text).
func jsonPosition(text string, off int) (pointer, what string) {
	type frame struct {
		obj  bool
		key  string
		idx  int
		want bool // an object's next string is a key
	}
	var stack []frame
	ptr := func(extra ...string) string {
		var b strings.Builder
		for _, f := range stack {
			b.WriteByte('/')
			if f.obj {
				b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(f.key))
			} else {
				b.WriteString(strconv.Itoa(f.idx))
			}
		}
		for _, e := range extra {
			b.WriteByte('/')
			b.WriteString(e)
		}
		return b.String()
	}
	if off >= len(text) {
		return ptr(), "end of text"
	}
	for i := 0; i < len(text); {
		c := text[i]
		start := i
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			if off < i {
				return ptr(), "whitespace"
			}
			continue
		case c == '"':
			i++
			for i < len(text) && text[i] != '"' {
				if text[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i+1, len(text))
			isKey := len(stack) > 0 && stack[len(stack)-1].obj && stack[len(stack)-1].want
			if isKey {
				k, err := strconv.Unquote(text[start:i])
				if err != nil {
					k = text[start+1 : max(start+1, i-1)]
				}
				stack[len(stack)-1].key = k
				stack[len(stack)-1].want = false
				if off < i {
					return ptr(), "object key"
				}
				continue
			}
			if off < i {
				return ptr(), "string"
			}
			continue
		case c == '{' || c == '[':
			i++
			if off < i {
				return ptr(), fmt.Sprintf("'%c'", c)
			}
			stack = append(stack, frame{obj: c == '{', want: true})
			continue
		case c == '}' || c == ']':
			i++
			if off < i {
				if len(stack) > 0 {
					stack = stack[:len(stack)-1] // the container's own pointer
				}
				if c == '}' {
					return ptr(), "'}' (end of object)"
				}
				return ptr(), "']' (end of array)"
			}
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			continue
		case c == ',':
			i++
			if off < i {
				return ptr(), "',' (next item)"
			}
			if len(stack) > 0 {
				f := &stack[len(stack)-1]
				if f.obj {
					f.want = true
				} else {
					f.idx++
				}
			}
			continue
		case c == ':':
			i++
			if off < i {
				return ptr(), "':'"
			}
			continue
		}
		for i < len(text) && strings.IndexByte(" \t\n\r,:]}[{\"", text[i]) < 0 {
			i++
		}
		if i == start {
			i++
		}
		if off < i {
			if c == '-' || c >= '0' && c <= '9' {
				return ptr(), "number"
			}
			return ptr(), "literal"
		}
	}
	return ptr(), "end of text"
}

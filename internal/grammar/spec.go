package grammar

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Kind is the dialect of a constraint.
type Kind uint8

// Constraint dialects.
const (
	// KindNone is no constraint.
	KindNone Kind = iota
	// KindJSONSchema: Source is a JSON Schema (draft 2020-12 keywords;
	// see CompileJSONSchema for what is supported).
	KindJSONSchema
	// KindJSONObject: any JSON object (OpenAI's json_object); Source is
	// empty.
	KindJSONObject
	// KindRegex: Source is a regex in the JSON Schema pattern dialect
	// (ECMA-262), matched against the whole output (anchored).
	KindRegex
	// KindChoice: Source is a JSON array of strings; the output is one of
	// them.
	KindChoice
	// KindGBNF: Source is a llama.cpp GBNF grammar whose start rule is
	// root.
	KindGBNF
	// KindLark: Source is a Lark-style EBNF grammar (vLLM's and
	// llguidance's dialect) whose start rule is start.
	KindLark
)

var kindNames = [...]string{"none", "json_schema", "json_object", "regex", "choice", "gbnf", "lark"}

// String is the kind's name as the worker API writes it.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, n := range kindNames {
		if string(b) == n {
			*k = Kind(i)
			return nil
		}
	}
	return fmt.Errorf("unknown constraint kind %q", b)
}

// Spec is a constraint as a request states it, in the form the router
// sends to workers. Its zero value is no constraint.
type Spec struct {
	Kind Kind `json:"kind"`
	// Source is the schema, regex, choice list or grammar text.
	Source string `json:"source,omitempty"`
	// FlexibleWhitespace lets JSON have whitespace between its lexemes
	// (JSON kinds only). The default is compact JSON, as OpenAI's strict
	// mode emits: no whitespace outside strings.
	FlexibleWhitespace bool `json:"flexible_whitespace,omitempty"`
	// AnyPropertyOrder lets a JSON object's members come in any order
	// (JSON kinds only; see JSONOptions.AnyPropertyOrder). The default
	// writes them in the schema's order, as llguidance documents it.
	AnyPropertyOrder bool `json:"any_property_order,omitempty"`
}

// MaxSourceBytes bounds a Spec's Source (a schema, a grammar).
const MaxSourceBytes = 1 << 20

// IsZero reports whether s is no constraint.
func (s Spec) IsZero() bool { return s.Kind == KindNone }

// Digest is a hex SHA-256 of the spec's kind, options and source: the key
// of compiled-grammar caches and part of a request's binding under PD.
// The zero Spec's digest is "".
func (s Spec) Digest() string {
	if s.IsZero() {
		return ""
	}
	h := sha256.New()
	opts := byte(0)
	if s.FlexibleWhitespace {
		opts |= 1
	}
	if s.AnyPropertyOrder {
		opts |= 2
	}
	h.Write([]byte{byte(s.Kind), opts})
	h.Write([]byte(s.Source))
	return hex.EncodeToString(h.Sum(nil))
}

// Error is a constraint that cannot be compiled: Keyword names what is
// wrong or not supported (a JSON Schema keyword, a regex feature, a grammar
// rule), Path where it is (a JSON pointer into a schema, a line:col into a
// grammar), Msg why.
type Error struct {
	Keyword string
	Path    string
	Msg     string
	// Err, if not nil, is the cause errors.Is and errors.As see through
	// Unwrap (ErrUnsupported for a feature the engine does not implement).
	Err error
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	s := "grammar: "
	if e.Keyword != "" {
		s += e.Keyword + ": "
	}
	if e.Path != "" {
		s += "at " + e.Path + ": "
	}
	return s + e.Msg
}

// ErrUnsupported is wrapped by errors for features the engine does not
// implement (as opposed to invalid constraints).
var ErrUnsupported = errors.New("not supported")

// Compile parses and compiles s. Errors are *Error, naming the keyword or
// feature at fault.
func Compile(s Spec) (*Grammar, error) {
	if len(s.Source) > MaxSourceBytes {
		return nil, &Error{Msg: fmt.Sprintf("constraint is %d bytes, more than the limit of %d", len(s.Source), MaxSourceBytes)}
	}
	switch s.Kind {
	case KindJSONSchema:
		return CompileJSONSchema([]byte(s.Source), JSONOptions{FlexibleWhitespace: s.FlexibleWhitespace, AnyPropertyOrder: s.AnyPropertyOrder})
	case KindJSONObject:
		return CompileJSONSchema([]byte(`{"type":"object"}`), JSONOptions{FlexibleWhitespace: s.FlexibleWhitespace, AnyPropertyOrder: s.AnyPropertyOrder})
	case KindRegex:
		r, err := ParseRegex(s.Source)
		if err != nil {
			return nil, err
		}
		var b Builder
		start := b.NewRule("start")
		b.AddAlt(start, T(r))
		return b.Grammar(start)
	case KindChoice:
		var choices []string
		if err := json.Unmarshal([]byte(s.Source), &choices); err != nil {
			return nil, &Error{Keyword: "choice", Msg: "must be a JSON array of strings: " + err.Error()}
		}
		if len(choices) == 0 {
			return nil, &Error{Keyword: "choice", Msg: "must list at least one string"}
		}
		alts := make([]*Regex, len(choices))
		for i, c := range choices {
			alts[i] = Lit(c)
		}
		var b Builder
		start := b.NewRule("start")
		b.AddAlt(start, T(Or(alts...)))
		return b.Grammar(start)
	case KindGBNF:
		return CompileGBNF(s.Source)
	case KindLark:
		return CompileLark(s.Source)
	case KindNone:
		return nil, &Error{Msg: "no constraint"}
	}
	return nil, &Error{Msg: fmt.Sprintf("unknown constraint kind %d", s.Kind)}
}

package grammar

// JSON Schema to Grammar.
//
// What shaped the design (llguidance's converter and docs, MaskBench's data
// and runners):
//   - llguidance fixes property order: "properties" in schema order, then
//     "required" names not among them, then additional/patternProperties
//     keys in any order; allOf merges left schema first. We do the same by
//     default. MaskBench reordered instances only for schemas llguidance
//     compiles, so on the others a fixed order refuses valid instances:
//     AnyPropertyOrder (JSON Schema's own semantics) is for such runs.
//   - Its runner (json_stats) feeds serde_json's compact text; MaskBench's
//     Python runner json.dumps (", " and ": ", ensure_ascii=False, floats
//     in repr: 1e-05). Strings are raw UTF-8 with \n-style and \u00XX
//     escapes of controls only, so that is the string lexemes' universe.
//   - llguidance's whitespace is flexible by default (we: compact unless
//     FlexibleWhitespace); it refuses unknown formats (we: annotations,
//     as 2020-12 and the reference validators have it), takes oneOf as
//     anyOf only when provably equivalent (we: exact, each branch with the
//     negation of the branches it may overlap), and merges sibling keywords
//     with $ref (we: also, except drafts 4–7, which ignore them).
//
// A schema is normalized to a node (a type set and per-type constraints;
// unions for anyOf/oneOf/if/dependencies), nodes are merged for allOf and
// sibling keywords, and each node becomes a rule. Lexemes: { } [ ] , :
// each; a whole string is one lexeme carrying its length, pattern and
// format; numbers (with their bounds) and true/false/null. Lists are
// left-recursive; counted items and members are bounded rule chains.

import (
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// JSONOptions are the choices CompileJSONSchema leaves to the caller.
type JSONOptions struct {
	// FlexibleWhitespace allows JSON whitespace ([ \t\n\r]+) between
	// lexemes; else the text is compact (no whitespace outside strings).
	FlexibleWhitespace bool
	// StrictFormats refuses a "format" that is not enforced instead of
	// taking it as an annotation.
	StrictFormats bool
	// AnyPropertyOrder admits an object's members in any order (JSON
	// Schema's own semantics) instead of the fixed order, for objects with
	// at most maxAnyOrderRequired required properties (and, under
	// minProperties/maxProperties, at most maxAnyOrderStates counted
	// states); others keep the fixed order. Named members may then repeat.
	AnyPropertyOrder bool
}

// Limits of CompileJSONSchema; exceeding one is an *Error.
const (
	// maxSchemaNesting bounds the depth of nested subschemas.
	maxSchemaNesting = 128
	// maxRefExpansions bounds the $ref targets expanded for merging.
	maxRefExpansions = 5000
	// maxMergeDepth bounds the recursion of merging two schemas.
	maxMergeDepth = 48
	// maxUnionAlts bounds the branches of an anyOf after distributing
	// sibling keywords and allOf over it.
	maxUnionAlts = 2048
	// maxCountChain bounds minItems/maxItems/minProperties/maxProperties
	// expanded into rule chains.
	maxCountChain = 4096
	// maxStringLength bounds minLength and maxLength (a counted
	// repetition the lexer unrolls as the string grows).
	maxStringLength = 1 << 24
	// maxPatternOverlap bounds the patternProperties whose overlaps are
	// enumerated (2^n sets).
	maxPatternOverlap = 4
	// maxAnyOrderRequired bounds the required properties of an object
	// emitted in any order (2^n rules).
	maxAnyOrderRequired = 10
	// maxNegatedPatterns bounds the negated unbounded patterns (from oneOf
	// and not) on one string: the lexer's states multiply with each.
	maxNegatedPatterns = 2
	// maxAnyOrderStates bounds the rules of one object emitted in any
	// order under minProperties/maxProperties (required sets × counts).
	maxAnyOrderStates = 4096
	// maxWitnesses bounds the negated member constraints (someExtras) on
	// one object.
	maxWitnesses = 3
	// maxJSONRules bounds the rules of the grammar.
	maxJSONRules = 200000
)

// CompileJSONSchema compiles a JSON Schema (draft 2020-12 keywords, with
// draft 4–2019 forms of items, additionalItems, definitions, dependencies
// and boolean exclusiveMinimum/Maximum; a keyword newer than the declared
// $schema draft is an unknown keyword there) to a Grammar of the JSON
// texts it validates.
//
// Enforced: type (single and lists), enum, const, properties, required,
// additionalProperties (default true), patternProperties, propertyNames
// (string constraints), minProperties/maxProperties, items, prefixItems,
// additionalItems, contains (minContains 0 or 1), minItems/maxItems,
// minLength/maxLength (code points), pattern, format (date-time, date,
// time, duration, email, hostname, ipv4, ipv6, uuid, uri, uri-reference,
// json-pointer, relative-json-pointer; other formats are annotations
// unless StrictFormats), minimum/maximum/exclusiveMinimum/
// exclusiveMaximum, multipleOf (integers dividing a power of 10, and
// 10^-m), allOf, anyOf, oneOf (exact: each branch with the negation of the
// branches it may overlap), not (of type, required, properties,
// additionalProperties, patternProperties, propertyNames, enum/const of
// scalars, pattern, format, bounds, lengths, counts, multipleOf, items,
// contains, anyOf, allOf, oneOf, not, $ref), if/then/else,
// dependencies/dependentRequired/dependentSchemas, $ref to JSON pointers
// and anchors in the document (recursion allowed), uniqueItems (items
// from an enumeration of at most 8 values, or at most one item). Refused:
// other uniqueItems, minContains above 1, maxContains,
// unevaluated*, $dynamicRef, remote references, the formats regex, iri,
// iri-reference, idn-email, idn-hostname and uri-template, and the
// negations not listed. Annotations and unknown keywords are ignored.
//
// Errors are *Error with Keyword the JSON Schema keyword and Path a JSON
// pointer into the schema; unsupported features wrap ErrUnsupported; the
// limits (nesting, $ref expansions, union branches, counted repetitions,
// rules) are errors too.
func CompileJSONSchema(schema []byte, o JSONOptions) (*Grammar, error) {
	root, err := parseJSONValue(schema)
	if err != nil {
		return nil, &Error{Keyword: "json_schema", Msg: "invalid JSON: " + err.Error()}
	}
	c := &jsCompiler{
		root:      root,
		o:         o,
		defs:      map[string]*node{},
		resolving: map[string]bool{},
		rules:     map[*node]int{},
		refRules:  map[string]int{},
		encMemo:   map[*Regex]*Regex{},
		strChar:   jsonStrChar(),
		anyRule:   -1,
	}
	c.draft = 2020
	if sv := root.get("$schema"); sv != nil && sv.k == jStr {
		for _, d := range []struct {
			s string
			n int
		}{{"draft-03", 3}, {"draft-04", 4}, {"draft-05", 5}, {"draft-06", 6}, {"draft-07", 7}, {"2019-09", 2019}} {
			if strings.Contains(sv.s, d.s) {
				c.draft = d.n
			}
		}
	}
	c.legacyRef = c.draft <= 7
	if id := root.get("$id"); id != nil && id.k == jStr {
		c.baseID = strings.TrimSuffix(id.s, "#")
	} else if id := root.get("id"); id != nil && id.k == jStr {
		c.baseID = strings.TrimSuffix(id.s, "#")
	}
	n, err := c.normalize(root, "#", 0)
	if err != nil {
		return nil, err
	}
	start, err := c.emit(n)
	if err != nil {
		return nil, err
	}
	if o.FlexibleWhitespace {
		c.b.SetSkip(Plus(Class(RuneRange{' ', ' '}, RuneRange{'\t', '\t'}, RuneRange{'\n', '\n'}, RuneRange{'\r', '\r'})))
	}
	g, err := c.b.Grammar(start)
	if err != nil {
		return nil, err
	}
	if !productive(g)[start] {
		return nil, &Error{Keyword: "json_schema", Path: "#", Msg: "the schema admits no JSON value"}
	}
	return g, nil
}

// productive marks the rules that derive some text.
func productive(g *Grammar) []bool {
	p := make([]bool, len(g.Rules))
	for changed := true; changed; {
		changed = false
		for i, r := range g.Rules {
			if p[i] {
				continue
			}
			for _, a := range r.Alts {
				ok := true
				for _, s := range a {
					if s.Lex != nil && s.Lex.Op == OpNone || s.Lex == nil && !p[s.Rule] {
						ok = false
						break
					}
				}
				if ok {
					p[i], changed = true, true
					break
				}
			}
		}
	}
	return p
}

// Type set bits. tNum is every number (integers included); tInt alone is
// the integers.
type tset uint8

const (
	tNull tset = 1 << iota
	tBool
	tObj
	tArr
	tStr
	tInt
	tNum
	tAll = tNull | tBool | tObj | tArr | tStr | tInt | tNum
)

// and intersects type sets.
func (a tset) and(b tset) tset {
	r := a & b &^ (tInt | tNum)
	switch an, bn := a&(tInt|tNum), b&(tInt|tNum); {
	case an&tNum != 0 && bn&tNum != 0:
		r |= tNum | tInt
	case an != 0 && bn != 0:
		r |= tInt
	}
	return r
}

var typeNames = map[string]tset{
	"null": tNull, "boolean": tBool, "object": tObj, "array": tArr,
	"string": tStr, "integer": tInt, "number": tNum | tInt,
}

// node is a normalized schema. A node with ref set is a pure reference
// (resolved lazily, so recursion works); one with alts is a union.
type node struct {
	path    string
	ref     string
	lazy    *lazyMerge // a merge deferred until emission
	alts    []*node
	isUnion bool

	types   tset
	hasEnum bool
	enum    []*jval

	minLen, maxLen int
	patterns       []*Regex

	lo, hi      *numBound
	numPatterns []*Regex // more constraints on a number's text (multipleOf)

	props     []prop
	required  []string
	addl      *node // nil: any value
	patProps  []patProp
	propNames *node
	minProps  int
	maxProps  int

	prefix   []*node
	items    *node // nil: any value
	contains *node // nil: no constraint; else some element matches it
	unique   bool  // uniqueItems
	// someExtras: for each, some member's name is not among its names
	// nor matches its patterns (and matches match), and its value matches
	// val (negations of additionalProperties, patternProperties,
	// propertyNames).
	someExtras []*extraWitness
	minItems   int
	maxItems   int
}

// lazyMerge is the intersection of a and b, computed (done) once the
// schemas they refer to are normalized.
type lazyMerge struct {
	a, b, done *node
}

// extraWitness is a member an object must have: a name outside names and
// pats, a value matching val.
type extraWitness struct {
	names []string
	pats  []*Regex
	match *Regex // if not nil, the name matches it
	val   *node
}

// admits reports whether name may be the witness's name.
func (w *extraWitness) admits(name string) bool {
	if slices.Contains(w.names, name) || w.match != nil && !rxMatchString(w.match, name) {
		return false
	}
	for _, p := range w.pats {
		if rxMatchString(p, name) {
			return false
		}
	}
	return true
}

type prop struct {
	name string
	s    *node
}

type patProp struct {
	src string
	rx  *Regex
	s   *node
}

func anyNode(path string) *node {
	return &node{path: path, types: tAll, maxLen: -1, maxProps: -1, maxItems: -1}
}

func neverNode(path string) *node {
	return &node{path: path, maxLen: -1, maxProps: -1, maxItems: -1}
}

// trivial reports whether n admits every value.
func (n *node) trivial() bool {
	return n.ref == "" && n.lazy == nil && !n.isUnion && n.types == tAll && !n.hasEnum && n.minLen == 0 && n.maxLen < 0 &&
		len(n.patterns) == 0 && len(n.numPatterns) == 0 && n.lo == nil && n.hi == nil && len(n.props) == 0 && len(n.required) == 0 &&
		n.addl == nil && len(n.patProps) == 0 && n.propNames == nil && n.minProps == 0 && n.maxProps < 0 &&
		len(n.prefix) == 0 && n.items == nil && n.contains == nil && len(n.someExtras) == 0 && !n.unique && n.minItems == 0 && n.maxItems < 0
}

// never reports whether n certainly admits nothing.
func (n *node) never() bool {
	if n.ref != "" || n.lazy != nil {
		return false
	}
	if n.isUnion {
		return len(n.alts) == 0
	}
	return n.types == 0
}

type jsCompiler struct {
	root       *jval
	o          JSONOptions
	baseID     string
	legacyRef  bool // drafts 4–7: keywords beside $ref are ignored
	draft      int  // the $schema's draft: 4, 6, 7, 2019 or 2020 (default)
	anchors    map[string]string
	defs       map[string]*node
	resolving  map[string]bool
	expansions int
	lazyMerges int
	b          Builder
	rules      map[*node]int
	refRules   map[string]int
	encMemo    map[*Regex]*Regex
	strChar    *Regex
	anyRule    int
}

func errAt(kw, path, format string, args ...any) *Error {
	if path == "" {
		path = "#"
	}
	return &Error{Keyword: kw, Path: path, Msg: fmt.Sprintf(format, args...)}
}

func unsupportedAt(kw, path, format string, args ...any) error {
	return &Error{Keyword: kw, Path: ptrOr(path), Msg: fmt.Sprintf(format, args...), Err: ErrUnsupported}
}

func ptrOr(p string) string {
	if p == "" {
		return "#"
	}
	return p
}

// jsonPtrEscape escapes a key for a JSON pointer.
func jsonPtrEscape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// annotationKeywords have no effect on validity.
var annotationKeywords = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true, "$comment": true,
	"$schema": true, "$id": true, "id": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"contentMediaType": true, "contentEncoding": true, "contentSchema": true, "$anchor": true,
	"$dynamicAnchor": true, "$recursiveAnchor": true, "$vocabulary": true, "$defs": true, "definitions": true,
	"example": true,
}

// refusedKeywords are assertions that are not enforced.
var refusedKeywords = map[string]bool{
	"maxContains": true, "unevaluatedProperties": true, "unevaluatedItems": true,
	"$dynamicRef": true, "$recursiveRef": true,
}

// keywordSince is the draft that introduced a keyword; under an older
// declared $schema it is an unknown keyword, an annotation, as validators
// of that draft treat it.
var keywordSince = map[string]int{
	"const": 6, "contains": 6, "propertyNames": 6, "if": 7, "then": 7, "else": 7,
	"dependentRequired": 2019, "dependentSchemas": 2019, "minContains": 2019, "maxContains": 2019,
	"unevaluatedProperties": 2019, "unevaluatedItems": 2019, "$anchor": 2019, "$recursiveRef": 2019,
	"prefixItems": 2020, "$dynamicRef": 2020,
}

// ignored reports whether keyword kw has no meaning in the declared draft.
func (c *jsCompiler) ignored(kw string) bool {
	d, ok := keywordSince[kw]
	return ok && c.draft < d
}

// knownKeywords are the keywords normalize reads.
var knownKeywords = map[string]bool{
	"type": true, "enum": true, "const": true, "properties": true, "required": true,
	"additionalProperties": true, "patternProperties": true, "propertyNames": true,
	"minProperties": true, "maxProperties": true, "items": true, "prefixItems": true,
	"additionalItems": true, "minItems": true, "maxItems": true, "uniqueItems": true,
	"minLength": true, "maxLength": true, "pattern": true, "format": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	"multipleOf": true, "allOf": true, "anyOf": true, "oneOf": true, "not": true, "$ref": true,
	"if": true, "then": true, "else": true, "dependencies": true, "dependentRequired": true,
	"dependentSchemas": true, "contains": true, "minContains": true,
}

// onlyAnnotations reports whether v's keywords other than except have no
// effect on validity.
func onlyAnnotations(v *jval, except string) bool {
	for _, k := range v.keys {
		if k != except && knownKeywords[k] || refusedKeywords[k] {
			return false
		}
	}
	return true
}

// refTarget is the JSON pointer ref names, as a fragment ("#", "#/…").
func (c *jsCompiler) refTarget(r *jval, path string) (string, error) {
	if r.k != jStr {
		return "", errAt("$ref", path, "must be a string")
	}
	s := r.s
	i := strings.IndexByte(s, '#')
	base, frag := s, ""
	if i >= 0 {
		base, frag = s[:i], s[i+1:]
	}
	if base != "" && base != c.baseID {
		return "", unsupportedAt("$ref", path, "reference %q is not within the document (remote references)", s)
	}
	f, err := url.PathUnescape(frag)
	if err != nil {
		return "", errAt("$ref", path, "bad fragment in %q", s)
	}
	if f != "" && f[0] != '/' {
		if c.anchors == nil {
			c.anchors = map[string]string{}
			indexAnchors(c.root, "#", c.anchors, 0)
		}
		if t, ok := c.anchors[f]; ok {
			return t, nil
		}
		return "", errAt("$ref", path, "no schema has the anchor of %q", s)
	}
	return "#" + f, nil
}

// indexAnchors maps the anchors of the subschemas of v ("$anchor": "a",
// or "$id"/"id": "#a" as drafts 4–7 write it) to their JSON pointers.
func indexAnchors(v *jval, ptr string, out map[string]string, depth int) {
	if depth > maxJSONDepth {
		return
	}
	switch v.k {
	case jObj:
		for _, k := range []string{"$anchor", "$id", "id"} {
			if a := v.get(k); a != nil && a.k == jStr {
				name := a.s
				if k != "$anchor" {
					i := strings.IndexByte(name, '#')
					if i < 0 || i == len(name)-1 {
						continue
					}
					name = name[i+1:]
				}
				if _, dup := out[name]; !dup {
					out[name] = ptr
				}
			}
		}
		for i, k := range v.keys {
			indexAnchors(v.vals[i], ptr+"/"+jsonPtrEscape(k), out, depth+1)
		}
	case jArr:
		for i, e := range v.arr {
			indexAnchors(e, ptr+"/"+strconv.Itoa(i), out, depth+1)
		}
	}
}

// lookup resolves fragment ptr ("#", "#/…") in the document.
func (c *jsCompiler) lookup(ptr, path string) (*jval, error) {
	v := c.root
	if ptr == "#" {
		return v, nil
	}
	for _, tok := range strings.Split(ptr[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v.k {
		case jObj:
			v = v.get(tok)
		case jArr:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v.arr) {
				v = nil
			} else {
				v = v.arr[i]
			}
		default:
			v = nil
		}
		if v == nil {
			return nil, errAt("$ref", path, "%s does not exist in the schema", ptr)
		}
	}
	return v, nil
}

// resolve normalizes the schema at ptr (memoized).
func (c *jsCompiler) resolve(ptr, path string) (*node, error) {
	if n, ok := c.defs[ptr]; ok {
		return n, nil
	}
	if c.resolving[ptr] {
		return nil, unsupportedAt("$ref", path, "%s refers to itself through sibling keywords or allOf", ptr)
	}
	c.expansions++
	if c.expansions > maxRefExpansions {
		return nil, errAt("$ref", path, "more than %d references expanded", maxRefExpansions)
	}
	v, err := c.lookup(ptr, path)
	if err != nil {
		return nil, err
	}
	c.resolving[ptr] = true
	n, err := c.normalize(v, ptr, 0)
	delete(c.resolving, ptr)
	if err != nil {
		return nil, err
	}
	c.defs[ptr] = n
	return n, nil
}

// deref follows pure references to a node with content.
func (c *jsCompiler) deref(n *node) (*node, error) {
	for i := 0; n.ref != "" || n.lazy != nil; i++ {
		if i > 100 {
			return nil, errAt("$ref", n.path, "a cycle of references")
		}
		if l := n.lazy; l != nil {
			if l.done == nil {
				if c.lazyMerges++; c.lazyMerges > maxRefExpansions {
					return nil, unsupportedAt("allOf", n.path, "more than %d deferred merges of recursive schemas", maxRefExpansions)
				}
				m, err := c.merge(l.a, l.b, 0)
				if err != nil {
					return nil, err
				}
				l.done = m
			}
			n = l.done
			continue
		}
		var err error
		if n, err = c.resolve(n.ref, n.path); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// pending reports whether n cannot be expanded yet: a reference to a
// schema being normalized, or a merge deferred for that reason.
func (c *jsCompiler) pending(n *node) bool {
	return n.ref != "" && c.resolving[n.ref] || n.lazy != nil && n.lazy.done == nil
}

func nonNegInt(v *jval, kw, path string) (int, error) {
	r := v.rat()
	if r == nil || !r.IsInt() || r.Sign() < 0 {
		return 0, errAt(kw, path, "must be a non-negative integer")
	}
	if !r.Num().IsInt64() || r.Num().Int64() > 1<<31 {
		return 1 << 31, nil
	}
	return int(r.Num().Int64()), nil
}

// applicator is an allOf/anyOf/oneOf/$ref group met while reading a
// schema's keywords, merged in order.
type applicator struct {
	n      *node
	before bool // written before "properties"
	oneOf  bool
}

// normalize reads the schema v at path.
func (c *jsCompiler) normalize(v *jval, path string, depth int) (*node, error) {
	if depth > maxSchemaNesting {
		return nil, errAt("json_schema", path, "subschemas nested more than %d deep", maxSchemaNesting)
	}
	switch v.k {
	case jBool:
		if v.b {
			return anyNode(path), nil
		}
		return neverNode(path), nil
	case jObj:
	default:
		return nil, errAt("json_schema", path, "a schema must be an object or a boolean")
	}
	if r := v.get("$ref"); r != nil {
		t, err := c.refTarget(r, path+"/$ref")
		if err != nil {
			return nil, err
		}
		if c.legacyRef || onlyAnnotations(v, "$ref") {
			return &node{path: path + "/$ref", ref: t}, nil
		}
	}
	n := anyNode(path)
	var apps []applicator
	seenProps := false
	var multipleOf *big.Rat
	uniqueItems := false
	sub := func(kw string, x *jval) (*node, error) {
		return c.normalize(x, path+"/"+kw, depth+1)
	}
	for i, kw := range v.keys {
		x := v.vals[i]
		kp := path + "/" + jsonPtrEscape(kw)
		if c.ignored(kw) {
			continue
		}
		switch kw {
		case "type":
			var names []*jval
			if x.k == jArr {
				names = x.arr
			} else {
				names = []*jval{x}
			}
			var t tset
			for _, nm := range names {
				b, ok := typeNames[nm.s]
				if nm.k != jStr || !ok {
					return nil, errAt("type", kp, "unknown type %s", nm)
				}
				t |= b
			}
			n.types = n.types.and(t)
		case "enum", "const":
			vals := []*jval{x}
			if kw == "enum" {
				if x.k != jArr {
					return nil, errAt(kw, kp, "must be an array")
				}
				vals = x.arr
			}
			if n.hasEnum {
				n.enum = intersectValues(n.enum, vals)
			} else {
				n.hasEnum, n.enum = true, vals
			}
		case "properties":
			if x.k != jObj {
				return nil, errAt(kw, kp, "must be an object")
			}
			seenProps = true
			for j, name := range x.keys {
				s, err := c.normalize(x.vals[j], kp+"/"+jsonPtrEscape(name), depth+1)
				if err != nil {
					return nil, err
				}
				n.props = append(n.props, prop{name, s})
			}
		case "required":
			if x.k != jArr {
				return nil, errAt(kw, kp, "must be an array of strings")
			}
			for _, e := range x.arr {
				if e.k != jStr {
					return nil, errAt(kw, kp, "must be an array of strings")
				}
				if !slices.Contains(n.required, e.s) {
					n.required = append(n.required, e.s)
				}
			}
		case "additionalProperties":
			s, err := sub(kw, x)
			if err != nil {
				return nil, err
			}
			if !s.trivial() {
				n.addl = s
			}
		case "patternProperties":
			if x.k != jObj {
				return nil, errAt(kw, kp, "must be an object")
			}
			for j, src := range x.keys {
				rx, err := ParsePattern(src)
				if err != nil {
					return nil, wrapRxErr(err, kw, kp+"/"+jsonPtrEscape(src))
				}
				s, err := c.normalize(x.vals[j], kp+"/"+jsonPtrEscape(src), depth+1)
				if err != nil {
					return nil, err
				}
				n.patProps = append(n.patProps, patProp{src, rx, s})
			}
		case "propertyNames":
			s, err := sub(kw, x)
			if err != nil {
				return nil, err
			}
			if !s.trivial() {
				n.propNames = s
			}
		case "minProperties", "maxProperties", "minItems", "maxItems", "minLength", "maxLength":
			k, err := nonNegInt(x, kw, kp)
			if err != nil {
				return nil, err
			}
			switch kw {
			case "minProperties":
				n.minProps = k
			case "maxProperties":
				n.maxProps = k
			case "minItems":
				n.minItems = k
			case "maxItems":
				n.maxItems = k
			case "minLength":
				n.minLen = k
			case "maxLength":
				n.maxLen = k
			}
		case "items":
			if x.k == jArr {
				for j, e := range x.arr {
					s, err := c.normalize(e, kp+"/"+strconv.Itoa(j), depth+1)
					if err != nil {
						return nil, err
					}
					n.prefix = append(n.prefix, s)
				}
				if ai := v.get("additionalItems"); ai != nil {
					s, err := sub("additionalItems", ai)
					if err != nil {
						return nil, err
					}
					if !s.trivial() {
						n.items = s
					}
				}
			} else {
				s, err := sub(kw, x)
				if err != nil {
					return nil, err
				}
				if !s.trivial() {
					n.items = s
				}
			}
		case "prefixItems":
			if x.k != jArr {
				return nil, errAt(kw, kp, "must be an array")
			}
			for j, e := range x.arr {
				s, err := c.normalize(e, kp+"/"+strconv.Itoa(j), depth+1)
				if err != nil {
					return nil, err
				}
				n.prefix = append(n.prefix, s)
			}
		case "additionalItems":
			// Read with an array-valued items; otherwise it has no effect.
		case "contains":
			if mc := v.get("minContains"); mc != nil && !c.ignored("minContains") {
				k, err := nonNegInt(mc, "minContains", path+"/minContains")
				if err != nil {
					return nil, err
				}
				if k == 0 {
					continue
				}
				if k > 1 {
					return nil, unsupportedAt("minContains", path+"/minContains", "only minContains 0 and 1 are enforced")
				}
			}
			s, err := sub(kw, x)
			if err != nil {
				return nil, err
			}
			n.contains = s
		case "minContains":
			// Read with contains.
		case "pattern":
			if x.k != jStr {
				return nil, errAt(kw, kp, "must be a string")
			}
			rx, err := ParsePattern(x.s)
			if err != nil {
				return nil, wrapRxErr(err, kw, kp)
			}
			n.patterns = append(n.patterns, rx)
		case "format":
			if x.k != jStr {
				return nil, errAt(kw, kp, "must be a string")
			}
			rx, ok, err := formatRegex(x.s)
			if err != nil {
				if errors.Is(err, ErrUnsupported) {
					return nil, unsupportedAt(kw, kp, "format %q is not enforced", x.s)
				}
				return nil, errAt(kw, kp, "format %q: %v", x.s, err)
			}
			if ok {
				n.patterns = append(n.patterns, rx)
			} else if c.o.StrictFormats {
				return nil, unsupportedAt(kw, kp, "format %q is not enforced", x.s)
			}
		case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
			if x.k == jBool {
				continue // draft 4: read with minimum/maximum
			}
			r := x.rat()
			if r == nil {
				return nil, errAt(kw, kp, "must be a number")
			}
			exc := strings.HasPrefix(kw, "exclusive")
			if kw == "minimum" || kw == "maximum" {
				if e := v.get("exclusive" + strings.ToUpper(kw[:1]) + kw[1:]); e != nil && e.k == jBool && e.b {
					exc = true
				}
			}
			b := &numBound{r, exc}
			if kw == "minimum" || kw == "exclusiveMinimum" {
				n.lo = tighterLo(n.lo, b)
			} else {
				n.hi = tighterHi(n.hi, b)
			}
		case "multipleOf":
			r := x.rat()
			if r == nil || r.Sign() <= 0 {
				return nil, errAt(kw, kp, "must be a positive number")
			}
			multipleOf = r
		case "uniqueItems":
			if x.k != jBool {
				return nil, errAt(kw, kp, "must be a boolean")
			}
			uniqueItems = x.b
		case "allOf", "anyOf", "oneOf":
			if x.k != jArr || len(x.arr) == 0 {
				return nil, errAt(kw, kp, "must be a non-empty array")
			}
			var subs []*node
			for j, e := range x.arr {
				s, err := c.normalize(e, kp+"/"+strconv.Itoa(j), depth+1)
				if err != nil {
					return nil, err
				}
				subs = append(subs, s)
			}
			var a *node
			switch kw {
			case "allOf":
				a = subs[0]
				for _, s := range subs[1:] {
					m, err := c.merge(a, s, 0)
					if err != nil {
						return nil, err
					}
					a = m
				}
			case "anyOf":
				a = &node{path: kp, isUnion: true, alts: subs}
			case "oneOf":
				a = &node{path: kp, isUnion: true, alts: subs}
			}
			apps = append(apps, applicator{a, !seenProps, kw == "oneOf"})
		case "$ref":
			t, err := c.refTarget(x, kp)
			if err != nil {
				return nil, err
			}
			apps = append(apps, applicator{&node{path: kp, ref: t}, !seenProps, false})
		case "not":
			s, err := c.negate(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			apps = append(apps, applicator{s, !seenProps, false})
		case "if":
			// if I then T else E: (I and T) or (not I and E).
			th, el := v.get("then"), v.get("else")
			if th == nil && el == nil {
				continue
			}
			in, err := sub(kw, x)
			if err != nil {
				return nil, err
			}
			ni, err := c.negate(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			u := &node{path: kp, isUnion: true}
			for _, br := range []struct {
				cond *node
				kw   string
				s    *jval
			}{{in, "then", th}, {ni, "else", el}} {
				b := br.cond
				if br.s != nil {
					s, err := sub(br.kw, br.s)
					if err != nil {
						return nil, err
					}
					if b, err = c.merge(b, s, 0); err != nil {
						return nil, err
					}
				}
				if !b.never() {
					u.alts = append(u.alts, b)
				}
			}
			apps = append(apps, applicator{u, false, false})
		case "then", "else":
			// Read with if.
		case "dependencies", "dependentRequired", "dependentSchemas":
			// Name a present: (a absent) or (the dependency holds).
			if x.k != jObj {
				return nil, errAt(kw, kp, "must be an object")
			}
			for j, a := range x.keys {
				d := x.vals[j]
				dp := kp + "/" + jsonPtrEscape(a)
				absent := anyNode(dp)
				absent.props = []prop{{a, neverNode(dp)}}
				present := anyNode(dp)
				present.required = []string{a}
				if d.k == jArr && kw != "dependentSchemas" {
					for _, e := range d.arr {
						if e.k != jStr {
							return nil, errAt(kw, dp, "must list property names")
						}
						if !slices.Contains(present.required, e.s) {
							present.required = append(present.required, e.s)
						}
					}
				} else if kw != "dependentRequired" {
					s, err := c.normalize(d, dp, depth+1)
					if err != nil {
						return nil, err
					}
					if present, err = c.merge(present, s, 0); err != nil {
						return nil, err
					}
				} else {
					return nil, errAt(kw, dp, "must list property names")
				}
				u := &node{path: dp, isUnion: true, alts: []*node{absent}}
				if !present.never() {
					u.alts = append(u.alts, present)
				}
				apps = append(apps, applicator{u, false, false})
			}
		default:
			if refusedKeywords[kw] {
				return nil, unsupportedAt(kw, kp, "keyword is not enforced")
			}
		}
	}
	if multipleOf != nil && n.types&(tInt|tNum) != 0 {
		rx, intOnly, ok := multipleOfRegex(multipleOf)
		if !ok {
			return nil, unsupportedAt("multipleOf", path+"/multipleOf", "only multipleOf of an integer dividing a power of 10, or of 10^-m, is enforced")
		}
		if intOnly {
			// Integral numbers, written as integers (see emit).
			n.types &^= tNum
		}
		if rx != nil {
			n.numPatterns = append(n.numPatterns, rx)
		}
	}
	if uniqueItems && n.types&tArr != 0 && (n.maxItems < 0 || n.maxItems > 1) {
		n.unique = true
	}
	// oneOf is the union of its branches, each with the negation of the
	// branches it is not provably disjoint from (with the sibling
	// keywords): oneOf [A, B] is (A and not B) or (B and not A).
	for ai := range apps {
		a := &apps[ai]
		if !a.oneOf {
			continue
		}
		if len(a.n.alts) > maxOneOfBranches {
			// Each pair of branches is compared: beyond this the compile
			// alone would cost seconds (1,000 branches: 5 s).
			return nil, unsupportedAt("oneOf", a.n.path, "%d branches, more than %d", len(a.n.alts), maxOneOfBranches)
		}
		subs := make([]*node, len(a.n.alts))
		for j, s := range a.n.alts {
			m, err := c.merge(n, s, 0)
			if err != nil {
				return nil, err
			}
			subs[j] = m
		}
		raw := v.get("oneOf").arr
		u := &node{path: a.n.path, isUnion: true}
		for j := range subs {
			b := a.n.alts[j]
			for k := range subs {
				if k == j {
					continue
				}
				d, err := c.disjoint(subs[j], subs[k], 0)
				if err != nil {
					return nil, err
				}
				if d {
					continue
				}
				ng, err := c.negate(raw[k], a.n.path+"/"+strconv.Itoa(k), depth+1)
				if err != nil {
					return nil, unsupportedAt("oneOf", a.n.path, "branches %d and %d may both match, and the negation of branch %d is not enforced (%v)", j, k, k, err)
				}
				if b, err = c.merge(b, ng, 0); err != nil {
					return nil, err
				}
			}
			if !b.never() {
				u.alts = append(u.alts, b)
			}
		}
		a.n = u
	}
	acc := n
	for _, a := range apps {
		var err error
		if a.before {
			acc, err = c.merge(a.n, acc, 0)
		} else {
			acc, err = c.merge(acc, a.n, 0)
		}
		if err != nil {
			return nil, err
		}
	}
	return acc, nil
}

// wrapRxErr gives a pattern error the keyword and path it came from.
func wrapRxErr(err error, kw, path string) error {
	var e *Error
	if errors.As(err, &e) {
		msg := e.Msg
		if e.Path != "" {
			msg = e.Path + ": " + msg
		}
		return &Error{Keyword: kw, Path: path, Msg: msg, Err: e.Err}
	}
	return &Error{Keyword: kw, Path: path, Msg: err.Error()}
}

func intersectValues(a, b []*jval) []*jval {
	var out []*jval
	for _, x := range a {
		for _, y := range b {
			if jsonEqual(x, y) {
				out = append(out, x)
				break
			}
		}
	}
	return out
}

func tighterLo(a, b *numBound) *numBound {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	switch a.v.Cmp(b.v) {
	case 1:
		return a
	case -1:
		return b
	}
	return &numBound{a.v, a.exc || b.exc}
}

func tighterHi(a, b *numBound) *numBound {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	switch a.v.Cmp(b.v) {
	case -1:
		return a
	case 1:
		return b
	}
	return &numBound{a.v, a.exc || b.exc}
}

func minMax(a, b int) int {
	if a < 0 {
		return b
	}
	if b < 0 {
		return a
	}
	return min(a, b)
}

// mergeOpt merges two optional schemas (nil: any value).
func (c *jsCompiler) mergeOpt(a, b *node, depth int) (*node, error) {
	if a == nil {
		return b, nil
	}
	if b == nil {
		return a, nil
	}
	return c.merge(a, b, depth)
}

// merge is the intersection of a and b; a's property order comes first.
func (c *jsCompiler) merge(a, b *node, depth int) (*node, error) {
	if depth > maxMergeDepth {
		return nil, unsupportedAt("allOf", a.path, "schemas merged more than %d deep (recursive schemas under allOf or sibling keywords)", maxMergeDepth)
	}
	if a == b || a.ref != "" && a.ref == b.ref {
		return a, nil
	}
	if a.trivial() {
		return b, nil
	}
	if b.trivial() {
		return a, nil
	}
	if c.pending(a) || c.pending(b) {
		// A recursive schema merged inside itself: merged when emitted.
		return &node{path: a.path, lazy: &lazyMerge{a: a, b: b}}, nil
	}
	var err error
	if a, err = c.deref(a); err != nil {
		return nil, err
	}
	if b, err = c.deref(b); err != nil {
		return nil, err
	}
	if a.never() || b.never() {
		return neverNode(a.path), nil
	}
	if a.isUnion || b.isUnion {
		as, bs := []*node{a}, []*node{b}
		if a.isUnion {
			as = a.alts
		}
		if b.isUnion {
			bs = b.alts
		}
		u := &node{path: a.path, isUnion: true}
		for _, x := range as {
			for _, y := range bs {
				m, err := c.merge(x, y, depth+1)
				if err != nil {
					return nil, err
				}
				if !m.never() {
					u.alts = append(u.alts, m)
				}
				if len(u.alts) > maxUnionAlts {
					return nil, errAt("anyOf", a.path, "more than %d alternatives after merging", maxUnionAlts)
				}
			}
		}
		return u, nil
	}
	r := &node{path: a.path}
	r.types = a.types.and(b.types)
	switch {
	case a.hasEnum && b.hasEnum:
		r.hasEnum, r.enum = true, intersectValues(a.enum, b.enum)
	case a.hasEnum:
		r.hasEnum, r.enum = true, a.enum
	case b.hasEnum:
		r.hasEnum, r.enum = true, b.enum
	}
	r.minLen = max(a.minLen, b.minLen)
	r.maxLen = minMax(a.maxLen, b.maxLen)
	r.patterns = append(slices.Clip(a.patterns), b.patterns...)
	r.numPatterns = append(slices.Clip(a.numPatterns), b.numPatterns...)
	r.lo = tighterLo(a.lo, b.lo)
	r.hi = tighterHi(a.hi, b.hi)
	// Objects.
	if len(a.patProps) > 0 && len(b.patProps) > 0 && (a.addl != nil || b.addl != nil) {
		// A name matching a pattern of one side only would need the other
		// side's additionalProperties, which a pattern list cannot say.
		return nil, unsupportedAt("patternProperties", b.path, "merging two schemas that both have patternProperties, with additionalProperties")
	}
	for _, p := range a.props {
		other, err := c.keySchema(b, p.name)
		if err != nil {
			return nil, err
		}
		m, err := c.mergeOpt(p.s, other, depth+1)
		if err != nil {
			return nil, err
		}
		r.props = append(r.props, prop{p.name, m})
	}
	for _, p := range b.props {
		if a.hasProp(p.name) {
			continue
		}
		other, err := c.keySchema(a, p.name)
		if err != nil {
			return nil, err
		}
		m, err := c.mergeOpt(other, p.s, depth+1)
		if err != nil {
			return nil, err
		}
		r.props = append(r.props, prop{p.name, m})
	}
	if r.addl, err = c.mergeOpt(a.addl, b.addl, depth+1); err != nil {
		return nil, err
	}
	for _, pp := range a.patProps {
		m, err := c.mergeOpt(pp.s, b.addl, depth+1)
		if err != nil {
			return nil, err
		}
		r.patProps = append(r.patProps, patProp{pp.src, pp.rx, m})
	}
	for _, pp := range b.patProps {
		m, err := c.mergeOpt(a.addl, pp.s, depth+1)
		if err != nil {
			return nil, err
		}
		r.patProps = append(r.patProps, patProp{pp.src, pp.rx, m})
	}
	if r.propNames, err = c.mergeOpt(a.propNames, b.propNames, depth+1); err != nil {
		return nil, err
	}
	r.required = slices.Clip(a.required)
	for _, q := range b.required {
		if !slices.Contains(r.required, q) {
			r.required = append(r.required, q)
		}
	}
	r.minProps = max(a.minProps, b.minProps)
	r.maxProps = minMax(a.maxProps, b.maxProps)
	// Arrays.
	for i := 0; i < max(len(a.prefix), len(b.prefix)); i++ {
		m, err := c.mergeOpt(a.itemAt(i), b.itemAt(i), depth+1)
		if err != nil {
			return nil, err
		}
		if m == nil {
			m = anyNode(a.path)
		}
		r.prefix = append(r.prefix, m)
	}
	if r.items, err = c.mergeOpt(a.items, b.items, depth+1); err != nil {
		return nil, err
	}
	if a.contains != nil && b.contains != nil {
		return nil, unsupportedAt("contains", b.path, "two contains constraints on one array")
	}
	r.someExtras = append(slices.Clip(a.someExtras), b.someExtras...)
	if len(r.someExtras) > maxWitnesses {
		return nil, unsupportedAt("not", b.path, "more than %d negated member constraints on one object", maxWitnesses)
	}
	r.contains = a.contains
	if b.contains != nil {
		r.contains = b.contains
	}
	r.unique = a.unique || b.unique
	r.minItems = max(a.minItems, b.minItems)
	r.maxItems = minMax(a.maxItems, b.maxItems)
	return r, nil
}

func (n *node) hasProp(name string) bool {
	for _, p := range n.props {
		if p.name == name {
			return true
		}
	}
	return false
}

// itemAt is the schema of array element i (nil: any).
func (n *node) itemAt(i int) *node {
	if i < len(n.prefix) {
		return n.prefix[i]
	}
	return n.items
}

// keySchema is the schema n gives a member named name (nil: any value).
func (c *jsCompiler) keySchema(n *node, name string) (*node, error) {
	for _, p := range n.props {
		if p.name == name {
			return p.s, nil
		}
	}
	var out *node
	matched := false
	for _, pp := range n.patProps {
		if rxMatchString(pp.rx, name) {
			matched = true
			var err error
			if out, err = c.mergeOpt(out, pp.s, 0); err != nil {
				return nil, err
			}
		}
	}
	if matched {
		return out, nil
	}
	return n.addl, nil
}

// maxOneOfBranches bounds the branches of a oneOf, whose pairs are all
// compared for disjointness.
const maxOneOfBranches = 128

// disjoint reports whether no value is admitted by both a and b (false
// when that cannot be shown).
func (c *jsCompiler) disjoint(a, b *node, depth int) (bool, error) {
	if depth > 8 || c.pending(a) || c.pending(b) {
		return false, nil
	}
	var err error
	if a, err = c.deref(a); err != nil {
		return false, err
	}
	if b, err = c.deref(b); err != nil {
		return false, err
	}
	if a.never() || b.never() {
		return true, nil
	}
	if a.isUnion || b.isUnion {
		as, bs := []*node{a}, []*node{b}
		if a.isUnion {
			as = a.alts
		}
		if b.isUnion {
			bs = b.alts
		}
		for _, x := range as {
			for _, y := range bs {
				d, err := c.disjoint(x, y, depth+1)
				if err != nil || !d {
					return false, err
				}
			}
		}
		return true, nil
	}
	t := a.types.and(b.types)
	if t == 0 {
		return true, nil
	}
	// Enumerations: no value of one is valid in the other.
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		if p[0].hasEnum {
			all := true
			for _, v := range p[0].enum {
				ok, err := c.validate(p[1], v, 0)
				if err != nil {
					return false, nil
				}
				ok2, err := c.validate(p[0], v, 0)
				if err != nil {
					return false, nil
				}
				if ok && ok2 {
					all = false
					break
				}
			}
			if all {
				return true, nil
			}
		}
	}
	if t&^tObj != 0 {
		// Other types in common: only numeric ranges are compared.
		if t&^(tInt|tNum) == 0 && rangesDisjoint(a, b) {
			return true, nil
		}
		return false, nil
	}
	// Objects only: a property one requires and the other forbids, or both
	// require with disjoint schemas.
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		for _, q := range p[0].required {
			ks, err := c.keySchema(p[1], q)
			if err != nil {
				return false, nil
			}
			if ks != nil && ks.never() {
				return true, nil
			}
			if slices.Contains(p[1].required, q) && ks != nil {
				ka, err := c.keySchema(p[0], q)
				if err != nil || ka == nil {
					continue
				}
				d, err := c.disjoint(ka, ks, depth+1)
				if err == nil && d {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// rangesDisjoint reports whether a's and b's numeric ranges do not meet.
func rangesDisjoint(a, b *node) bool {
	below := func(hi, lo *numBound) bool {
		if hi == nil || lo == nil {
			return false
		}
		c := hi.v.Cmp(lo.v)
		return c < 0 || c == 0 && (hi.exc || lo.exc)
	}
	return below(a.hi, b.lo) || below(b.hi, a.lo)
}

// validate reports whether v is valid against n (for enumerations and
// literal names; the error is for what it cannot decide).
func (c *jsCompiler) validate(n *node, v *jval, depth int) (bool, error) {
	if depth > maxSchemaNesting {
		return false, errAt("enum", n.path, "value nested too deep")
	}
	n, err := c.deref(n)
	if err != nil {
		return false, err
	}
	if n.isUnion {
		for _, a := range n.alts {
			ok, err := c.validate(a, v, depth+1)
			if err != nil || ok {
				return ok, err
			}
		}
		return false, nil
	}
	if n.hasEnum && !slices.ContainsFunc(n.enum, func(e *jval) bool { return jsonEqual(e, v) }) {
		return false, nil
	}
	switch v.k {
	case jNull:
		return n.types&tNull != 0, nil
	case jBool:
		return n.types&tBool != 0, nil
	case jStr:
		if n.types&tStr == 0 {
			return false, nil
		}
		l := runeCount(v.s)
		if l < n.minLen || n.maxLen >= 0 && l > n.maxLen {
			return false, nil
		}
		for _, p := range n.patterns {
			if !rxMatchString(p, v.s) {
				return false, nil
			}
		}
		return true, nil
	case jNum:
		r := v.rat()
		if r == nil {
			return false, nil
		}
		if n.types&tNum == 0 && !(n.types&tInt != 0 && r.IsInt()) {
			return false, nil
		}
		if n.lo != nil && (r.Cmp(n.lo.v) < 0 || n.lo.exc && r.Cmp(n.lo.v) == 0) {
			return false, nil
		}
		if n.hi != nil && (r.Cmp(n.hi.v) > 0 || n.hi.exc && r.Cmp(n.hi.v) == 0) {
			return false, nil
		}
		for _, p := range n.numPatterns {
			if !rxMatchString(p, v.s) {
				return false, nil
			}
		}
		return true, nil
	case jArr:
		if n.types&tArr == 0 || len(v.arr) < n.minItems || n.maxItems >= 0 && len(v.arr) > n.maxItems {
			return false, nil
		}
		for i, e := range v.arr {
			if s := n.itemAt(i); s != nil {
				ok, err := c.validate(s, e, depth+1)
				if err != nil || !ok {
					return ok, err
				}
			}
		}
		if n.unique {
			for i := range v.arr {
				for j := i + 1; j < len(v.arr); j++ {
					if jsonEqual(v.arr[i], v.arr[j]) {
						return false, nil
					}
				}
			}
		}
		if n.contains != nil {
			for _, e := range v.arr {
				ok, err := c.validate(n.contains, e, depth+1)
				if err != nil || ok {
					return ok, err
				}
			}
			return false, nil
		}
		return true, nil
	case jObj:
		if n.types&tObj == 0 || len(v.keys) < n.minProps || n.maxProps >= 0 && len(v.keys) > n.maxProps {
			return false, nil
		}
		for _, q := range n.required {
			if v.get(q) == nil {
				return false, nil
			}
		}
		for _, w := range n.someExtras {
			found := false
			for i, k := range v.keys {
				if w.admits(k) {
					ok, err := c.validate(w.val, v.vals[i], depth+1)
					if err != nil {
						return false, err
					}
					if ok {
						found = true
						break
					}
				}
			}
			if !found {
				return false, nil
			}
		}
		for i, k := range v.keys {
			if n.propNames != nil {
				ok, err := c.validate(n.propNames, &jval{k: jStr, s: k}, depth+1)
				if err != nil || !ok {
					return ok, err
				}
			}
			for _, s := range c.keySchemasAll(n, k) {
				ok, err := c.validate(s, v.vals[i], depth+1)
				if err != nil || !ok {
					return ok, err
				}
			}
		}
		return true, nil
	}
	return false, nil
}

// keySchemasAll lists every schema n applies to a member named name.
func (c *jsCompiler) keySchemasAll(n *node, name string) []*node {
	var out []*node
	matched := false
	for _, p := range n.props {
		if p.name == name {
			out = append(out, p.s)
			matched = true
		}
	}
	for _, pp := range n.patProps {
		if rxMatchString(pp.rx, name) {
			out = append(out, pp.s)
			matched = true
		}
	}
	if !matched && n.addl != nil {
		out = append(out, n.addl)
	}
	return out
}

// ---- Emission ----

func (c *jsCompiler) newRule(name string) (int, error) {
	if c.b.NumRules() >= maxJSONRules {
		return 0, errAt("json_schema", "", "the grammar needs more than %d rules", maxJSONRules)
	}
	return c.b.NewRule(name), nil
}

// emitOpt is emit with nil meaning any value.
func (c *jsCompiler) emitOpt(n *node) (int, error) {
	if n == nil {
		return c.emitAny()
	}
	return c.emit(n)
}

func (c *jsCompiler) emitAny() (int, error) {
	if c.anyRule >= 0 {
		return c.anyRule, nil
	}
	n := anyNode("")
	r, err := c.emit(n)
	c.anyRule = r
	return r, err
}

// emit returns the rule of the values n admits.
func (c *jsCompiler) emit(n *node) (int, error) {
	if r, ok := c.rules[n]; ok {
		return r, nil
	}
	if n.ref != "" {
		if r, ok := c.refRules[n.ref]; ok {
			c.rules[n] = r
			return r, nil
		}
		r, err := c.newRule(n.ref)
		if err != nil {
			return 0, err
		}
		c.refRules[n.ref] = r
		c.rules[n] = r
		t, err := c.resolve(n.ref, n.path)
		if err != nil {
			return 0, err
		}
		tr, err := c.emit(t)
		if err != nil {
			return 0, err
		}
		c.b.AddAlt(r, N(tr))
		return r, nil
	}
	if n.lazy != nil {
		r, err := c.newRule(ptrOr(n.path) + " merged")
		if err != nil {
			return 0, err
		}
		c.rules[n] = r
		m, err := c.deref(n)
		if err != nil {
			return 0, err
		}
		mr, err := c.emit(m)
		if err != nil {
			return 0, err
		}
		c.b.AddAlt(r, N(mr))
		return r, nil
	}
	r, err := c.newRule(ptrOr(n.path))
	if err != nil {
		return 0, err
	}
	c.rules[n] = r
	if n.trivial() && c.anyRule < 0 {
		c.anyRule = r
	}
	if n.isUnion {
		for _, a := range n.alts {
			ar, err := c.emit(a)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(r, N(ar))
		}
		return r, nil
	}
	if n.types == 0 {
		return r, nil
	}
	if n.hasEnum {
		for _, v := range n.enum {
			ok, err := c.validate(n, v, 0)
			if err != nil {
				return 0, err
			}
			if ok {
				c.b.AddAlt(r, c.literal(v)...)
			}
		}
		return r, nil
	}
	if n.types&tNull != 0 {
		c.b.AddAlt(r, T(Lit("null")))
	}
	if n.types&tBool != 0 {
		c.b.AddAlt(r, T(Or(Lit("true"), Lit("false"))))
	}
	if n.types&tStr != 0 {
		lx, err := c.stringLexeme(n)
		if err != nil {
			return 0, err
		}
		c.b.AddAlt(r, T(lx))
	}
	if n.types&(tInt|tNum) != 0 {
		var lx *Regex
		if n.types&tNum != 0 {
			var ok bool
			if lx, ok = numberRange(n.lo, n.hi); !ok {
				return 0, unsupportedAt("minimum", n.path, "a bound without a finite decimal expansion")
			}
		} else {
			// Integers are written canonically, without a fraction: from
			// draft 6 on 6000.0 is an integer too, but clients parse an
			// integer field into an integer type (Go's encoding/json
			// refuses 6000.0 for an int), so the grammar never writes it.
			lx = integerRange(n.lo, n.hi)
		}
		if len(n.numPatterns) > 0 {
			lx = And(append([]*Regex{lx}, n.numPatterns...)...)
		}
		if lx.Op != OpNone {
			c.b.AddAlt(r, T(lx))
		}
	}
	if n.types&tObj != 0 {
		if err := c.emitObject(n, r); err != nil {
			return 0, err
		}
	}
	if n.types&tArr != 0 {
		if err := c.emitArray(n, r); err != nil {
			return 0, err
		}
	}
	return r, nil
}

// quoted is the lexeme of a string whose decoded contents match content.
func (c *jsCompiler) quoted(content *Regex) (*Regex, error) {
	e, err := encodeJSONLang(content, c.encMemo)
	if err != nil {
		return nil, err
	}
	return Concat(Lit(`"`), e, Lit(`"`)), nil
}

// stringLexeme is the lexeme of the strings n admits (length in code
// points, patterns and formats over the decoded contents).
func (c *jsCompiler) stringLexeme(n *node) (*Regex, error) {
	if n.minLen > maxStringLength {
		return nil, unsupportedAt("minLength", n.path, "string lengths above %d", maxStringLength)
	}
	maxLen := n.maxLen
	if maxLen > maxStringLength {
		return nil, unsupportedAt("maxLength", n.path, "string lengths above %d", maxStringLength)
	}
	negated := 0
	for _, p := range n.patterns {
		if p.Op == OpNot && hasUnboundedRepeat(p) {
			negated++
		}
	}
	if negated > maxNegatedPatterns {
		return nil, unsupportedAt("pattern", n.path, "%d negated patterns on one string (from oneOf or not): more than %d make the lexer too large", negated, maxNegatedPatterns)
	}
	var parts []*Regex
	if n.minLen > 0 || maxLen >= 0 || len(n.patterns) == 0 {
		parts = append(parts, Repeat(c.strChar, n.minLen, maxLen))
	}
	// Without a length bound, the encoded patterns alone are the lexeme:
	// each is made of encoded characters only (a subset of strChar*), so
	// intersecting with strChar* would add an And (and its liveness
	// searches and exact cache keys) for nothing.
	for _, p := range n.patterns {
		e, err := encodeJSONLang(p, c.encMemo)
		if err != nil {
			return nil, errAt("pattern", n.path, "%v", err)
		}
		parts = append(parts, e)
	}
	return Concat(Lit(`"`), And(parts...), Lit(`"`)), nil
}

// hasUnboundedRepeat reports whether r contains a repetition without an
// upper bound (an unanchored pattern does).
func hasUnboundedRepeat(r *Regex) bool {
	if r.Op == OpRepeat && r.Max < 0 {
		return true
	}
	for _, s := range r.Subs {
		if hasUnboundedRepeat(s) {
			return true
		}
	}
	return false
}

// literal is the symbols of the JSON text of v.
func (c *jsCompiler) literal(v *jval) []Sym {
	switch v.k {
	case jNull:
		return []Sym{T(Lit("null"))}
	case jBool:
		return []Sym{T(Lit(strconv.FormatBool(v.b)))}
	case jStr:
		q, _ := c.quoted(Lit(v.s))
		return []Sym{T(q)}
	case jNum:
		return []Sym{T(numberLiteral(v))}
	case jArr:
		out := []Sym{T(Lit("["))}
		for i, e := range v.arr {
			if i > 0 {
				out = append(out, T(Lit(",")))
			}
			out = append(out, c.literal(e)...)
		}
		return append(out, T(Lit("]")))
	case jObj:
		out := []Sym{T(Lit("{"))}
		for i, k := range v.keys {
			if i > 0 {
				out = append(out, T(Lit(",")))
			}
			q, _ := c.quoted(Lit(k))
			out = append(out, T(q), T(Lit(":")))
			out = append(out, c.literal(v.vals[i])...)
		}
		return append(out, T(Lit("}")))
	}
	return nil
}

// numberLiteral matches the spellings of number v a client expects: as
// written, and its canonical form (an integral value without fraction,
// another in plain decimal).
func numberLiteral(v *jval) *Regex {
	alts := []*Regex{Lit(v.s)}
	r := v.rat()
	if r == nil {
		return alts[0]
	}
	if r.IsInt() {
		alts = append(alts, Lit(r.Num().String()))
	} else {
		neg := r.Sign() < 0
		ip, f, ok := decParts(new(big.Rat).Abs(r))
		if ok {
			s := ip.String() + "." + f
			if neg {
				s = "-" + s
			}
			alts = append(alts, Lit(s))
		}
	}
	return Or(alts...)
}

// keyContent is the regex of the decoded names n's propertyNames admits
// (nil: any).
func (c *jsCompiler) keyContent(n *node) (*Regex, error) {
	if n.propNames == nil {
		return nil, nil
	}
	pn, err := c.deref(n.propNames)
	if err != nil {
		return nil, err
	}
	if pn.isUnion {
		return nil, unsupportedAt("propertyNames", pn.path, "a union of name schemas")
	}
	if pn.types&tStr == 0 {
		return None(), nil
	}
	if pn.hasEnum {
		var alts []*Regex
		for _, v := range pn.enum {
			if ok, err := c.validate(pn, v, 0); err == nil && ok {
				alts = append(alts, Lit(v.s))
			}
		}
		return Or(alts...), nil
	}
	if pn.maxLen > maxStringLength || pn.minLen > maxStringLength {
		return nil, unsupportedAt("maxLength", pn.path, "name lengths above %d", maxStringLength)
	}
	parts := []*Regex{Repeat(AnyChar(), pn.minLen, pn.maxLen)}
	parts = append(parts, pn.patterns...)
	return And(parts...), nil
}

// witVariant is a member (or an additional member) that is the witness of
// the someExtras of set mask at once: rule is its value (or whole member)
// rule.
type witVariant struct {
	mask int
	rule int
}

// member is a named property as the object grammar emits it.
type member struct {
	key  *Regex
	val  int
	req  bool
	wits []witVariant // the member as witness of sets of someExtras
}

// emitObject adds n's object alternative to rule r.
func (c *jsCompiler) emitObject(n *node, r int) error {
	var members []member
	var names []*Regex
	keyRx, err := c.keyContent(n)
	if err != nil {
		return err
	}
	nameOK := func(name string) (bool, error) {
		if n.propNames == nil {
			return true, nil
		}
		return c.validate(n.propNames, &jval{k: jStr, s: name}, 0)
	}
	addMember := func(name string, s *node, req bool) (bool, error) {
		ok, err := nameOK(name)
		if err != nil {
			return false, err
		}
		// A named property matched by patternProperties satisfies both.
		for _, pp := range n.patProps {
			if rxMatchString(pp.rx, name) {
				if s, err = c.mergeOpt(s, pp.s, 0); err != nil {
					return false, err
				}
			}
		}
		names = append(names, Lit(name))
		if !ok || s != nil && s.never() {
			return !req, nil
		}
		v, err := c.emitOpt(s)
		if err != nil {
			return false, err
		}
		k, err := c.quoted(Lit(name))
		if err != nil {
			return false, err
		}
		var wits []witVariant
		for mask := 1; mask < 1<<len(n.someExtras); mask++ {
			ws := s
			ok := true
			for wi, w := range n.someExtras {
				if mask&(1<<wi) == 0 {
					continue
				}
				if !w.admits(name) {
					ok = false
					break
				}
				if ws, err = c.mergeOpt(ws, w.val, 0); err != nil {
					return false, err
				}
			}
			if !ok || ws != nil && ws.never() {
				continue
			}
			rule, err := c.emitOpt(ws)
			if err != nil {
				return false, err
			}
			wits = append(wits, witVariant{mask, rule})
		}
		members = append(members, member{k, v, req, wits})
		return true, nil
	}
	for _, p := range n.props {
		ok, err := addMember(p.name, p.s, slices.Contains(n.required, p.name))
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
	}
	for _, q := range n.required {
		if n.hasProp(q) {
			continue
		}
		var s *node
		if !slices.ContainsFunc(n.patProps, func(pp patProp) bool { return rxMatchString(pp.rx, q) }) {
			s = n.addl
		}
		ok, err := addMember(q, s, true)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
	}
	// Other names: patternProperties (a name matching one pattern only)
	// and additionalProperties (a name matching none).
	var extra []member
	var extraContent []*Regex
	var extraSchema []*node
	base := []*Regex{}
	if keyRx != nil {
		base = append(base, keyRx)
	}
	if len(names) > 0 {
		base = append(base, Not(Or(names...)))
	}
	var pats []*Regex
	for _, pp := range n.patProps {
		pats = append(pats, pp.rx)
	}
	// A name matching the patterns of set S (a bit mask) gets all their
	// schemas; with many patterns, names matching several are left out.
	for set := 1; set < 1<<len(pats); set++ {
		if len(pats) > maxPatternOverlap && set&(set-1) != 0 {
			continue
		}
		parts := slices.Clip(base)
		var s *node
		for i, pp := range n.patProps {
			if set&(1<<i) == 0 {
				parts = append(parts, Not(pp.rx))
				continue
			}
			parts = append(parts, pp.rx)
			if s, err = c.mergeOpt(s, pp.s, 0); err != nil {
				return err
			}
		}
		if s != nil && s.never() {
			continue
		}
		content := And(parts...)
		if set&(set-1) != 0 && rxIsEmpty(content) {
			continue
		}
		k, err := c.quoted(content)
		if err != nil {
			return errAt("patternProperties", n.path, "%v", err)
		}
		v, err := c.emitOpt(s)
		if err != nil {
			return err
		}
		extra = append(extra, member{key: k, val: v})
		extraContent = append(extraContent, content)
		extraSchema = append(extraSchema, s)
	}
	if n.addl == nil || !n.addl.never() {
		parts := slices.Clip(base)
		if len(pats) > 0 {
			parts = append(parts, Not(Or(pats...)))
		}
		content := And(parts...)
		if len(parts) == 0 {
			content = Star(AnyChar())
		}
		k, err := c.quoted(content)
		if err != nil {
			return err
		}
		v, err := c.emitOpt(n.addl)
		if err != nil {
			return err
		}
		extra = append(extra, member{key: k, val: v})
		extraContent = append(extraContent, content)
		extraSchema = append(extraSchema, n.addl)
	}
	// The witnesses of sets of someExtras among the other names.
	var witRules []witVariant
	for mask := 1; mask < 1<<len(n.someExtras); mask++ {
		rule := -1
		for i, content := range extraContent {
			vs := extraSchema[i]
			kc := content
			for wi, w := range n.someExtras {
				if mask&(1<<wi) == 0 {
					continue
				}
				if vs, err = c.mergeOpt(vs, w.val, 0); err != nil {
					return err
				}
				var ex []*Regex
				for _, nm := range w.names {
					ex = append(ex, Lit(nm))
				}
				ex = append(ex, w.pats...)
				if len(ex) > 0 {
					kc = And(kc, Not(Or(ex...)))
				}
				if w.match != nil {
					kc = And(kc, w.match)
				}
			}
			if vs != nil && vs.never() {
				continue
			}
			k, err := c.quoted(kc)
			if err != nil {
				return err
			}
			v, err := c.emitOpt(vs)
			if err != nil {
				return err
			}
			if rule < 0 {
				if rule, err = c.newRule(fmt.Sprintf("%s witness member %#x", ptrOr(n.path), mask)); err != nil {
					return err
				}
			}
			c.b.AddAlt(rule, T(k), T(Lit(":")), N(v))
		}
		if rule >= 0 {
			witRules = append(witRules, witVariant{mask, rule})
		}
	}
	var extraRule = -1
	if len(extra) > 0 {
		if extraRule, err = c.newRule(ptrOr(n.path) + " additional member"); err != nil {
			return err
		}
		for _, e := range extra {
			c.b.AddAlt(extraRule, T(e.key), T(Lit(":")), N(e.val))
		}
	}
	minP, maxP := n.minProps, n.maxProps
	nW := len(n.someExtras)
	fullW := 1<<nW - 1
	if c.o.AnyPropertyOrder {
		// Required members and the witness are bits of the tracked set.
		var mems []orderMem
		nbits := 0
		for _, m := range members {
			b := 0
			if m.req {
				b = 1 << nbits
				nbits++
			}
			mems = append(mems, orderMem{[]Sym{T(m.key), T(Lit(":")), N(m.val)}, b})
		}
		if extraRule >= 0 {
			mems = append(mems, orderMem{[]Sym{N(extraRule)}, 0})
		}
		wshift := nbits
		nbits += len(n.someExtras)
		for i, m := range members {
			// A required member as a witness sets both bits.
			for _, wv := range m.wits {
				mems = append(mems, orderMem{[]Sym{T(m.key), T(Lit(":")), N(wv.rule)}, wv.mask<<wshift | mems[i].bit})
			}
		}
		for _, wv := range witRules {
			mems = append(mems, orderMem{[]Sym{N(wv.rule)}, wv.mask << wshift})
		}
		counted := minP > 0 || maxP >= 0
		capK := max(minP, 1)
		if maxP >= 0 {
			capK = maxP
		}
		if nbits <= maxAnyOrderRequired && (!counted || (1<<nbits)*(capK+1) <= maxAnyOrderStates) {
			return c.emitObjectAnyOrder(r, n.path, mems, nbits, minP, maxP)
		}
	}
	hasMax := maxP >= 0
	capK := max(minP, 1)
	if hasMax {
		capK = maxP
	}
	if capK > maxCountChain || (len(members)+1)*(capK+1) > maxJSONRules/4 {
		return unsupportedAt("maxProperties", n.path, "property counts too large to expand")
	}
	step := func(k int) int {
		if !hasMax && k == capK {
			return k
		}
		return k + 1
	}
	canEmit := func(k int) bool { return !hasMax || k < maxP }
	comma := T(Lit(","))
	// A(k, seen): the additional members after k members, seen the set of
	// someExtras witnesses met already. Past the counted part, Tail(need)
	// is the members that still bring the witnesses of need:
	// Tail(need) ::= ε (need empty) | Tail(need) "," extra |
	// Tail(need - j) "," witness j.
	tMemo := map[int]int{}
	var ruleTail func(need int) (int, error)
	ruleTail = func(need int) (int, error) {
		if x, ok := tMemo[need]; ok {
			return x, nil
		}
		x, err := c.newRule(fmt.Sprintf("%s more members needing %#x", ptrOr(n.path), need))
		if err != nil {
			return 0, err
		}
		tMemo[need] = x
		if need == 0 {
			c.b.AddAlt(x)
		}
		if extraRule >= 0 {
			c.b.AddAlt(x, N(x), comma, N(extraRule))
		}
		for _, wv := range witRules {
			if need&wv.mask == wv.mask {
				prev, err := ruleTail(need &^ wv.mask)
				if err != nil {
					return 0, err
				}
				c.b.AddAlt(x, N(prev), comma, N(wv.rule))
			}
		}
		return x, nil
	}
	aMemo := map[[2]int]int{}
	var ruleA func(k, seen int) (int, error)
	ruleA = func(k, seen int) (int, error) {
		if !hasMax && k == capK && canEmit(k) {
			return ruleTail(fullW &^ seen) // k ≥ 1: members here follow a comma
		}
		if x, ok := aMemo[[2]int{k, seen}]; ok {
			return x, nil
		}
		x, err := c.newRule(fmt.Sprintf("%s members>=%d seen=%#x", ptrOr(n.path), k, seen))
		if err != nil {
			return 0, err
		}
		aMemo[[2]int{k, seen}] = x
		if k >= minP && seen == fullW {
			c.b.AddAlt(x)
		}
		if !canEmit(k) {
			return x, nil
		}
		var sep []Sym
		if k > 0 {
			sep = []Sym{comma}
		}
		if extraRule >= 0 {
			next, err := ruleA(step(k), seen)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(x, append(slices.Clip(sep), N(extraRule), N(next))...)
		}
		for _, wv := range witRules {
			if seen&wv.mask == 0 {
				next, err := ruleA(step(k), seen|wv.mask)
				if err != nil {
					return 0, err
				}
				c.b.AddAlt(x, append(slices.Clip(sep), N(wv.rule), N(next))...)
			}
		}
		return x, nil
	}
	// R(i, k, seen): members i… after k members.
	rMemo := map[[3]int]int{}
	var ruleR func(i, k, seen int) (int, error)
	ruleR = func(i, k, seen int) (int, error) {
		if i == len(members) {
			return ruleA(k, seen)
		}
		if x, ok := rMemo[[3]int{i, k, seen}]; ok {
			return x, nil
		}
		x, err := c.newRule(fmt.Sprintf("%s member %d after %d seen=%d", ptrOr(n.path), i, k, seen))
		if err != nil {
			return 0, err
		}
		rMemo[[3]int{i, k, seen}] = x
		m := members[i]
		if !m.req {
			skip, err := ruleR(i+1, k, seen)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(x, N(skip))
		}
		if canEmit(k) {
			var sep []Sym
			if k > 0 {
				sep = []Sym{comma}
			}
			next, err := ruleR(i+1, step(k), seen)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(x, append(slices.Clip(sep), T(m.key), T(Lit(":")), N(m.val), N(next))...)
			for _, wv := range m.wits {
				if seen&wv.mask == 0 {
					next, err := ruleR(i+1, step(k), seen|wv.mask)
					if err != nil {
						return 0, err
					}
					c.b.AddAlt(x, append(slices.Clip(sep), T(m.key), T(Lit(":")), N(wv.rule), N(next))...)
				}
			}
		}
		return x, nil
	}
	body, err := ruleR(0, 0, 0)
	if err != nil {
		return err
	}
	c.b.AddAlt(r, T(Lit("{")), N(body), T(Lit("}")))
	return nil
}

// orderMem is a member of an object emitted in any order: its symbols and
// the bits of the tracked set it sets (a required member, the witness).
type orderMem struct {
	syms []Sym
	bit  int
}

// emitObjectAnyOrder adds to rule r an object whose members come in any
// order: L(S, k) is a non-empty member list in which the required members
// of set S (a bit mask) appear, k members long (k only tracked, up to a
// cap, under minProperties/maxProperties), L(S, k) ::= member |
// L(S', k-1) "," member, and the object is "{" L(all required, k) "}" for
// the admitted k (or "{}"). Named members may repeat.
func (c *jsCompiler) emitObjectAnyOrder(r int, path string, mems []orderMem, nbits int, minP, maxP int) error {
	full := 1<<nbits - 1
	// Counts: 1…capK; without maxProperties, capK stands for "capK or
	// more".
	hasMax := maxP >= 0
	capK := 1
	if minP > 0 || hasMax {
		capK = max(minP, 1)
		if hasMax {
			capK = maxP
		}
	}
	if full == 0 && minP == 0 {
		c.b.AddAlt(r, T(Lit("{")), T(Lit("}")))
	}
	if len(mems) == 0 || capK == 0 {
		return nil
	}
	rules := make([][]int, full+1)
	for set := 0; set <= full; set++ {
		rules[set] = make([]int, capK+1)
		for k := 1; k <= capK; k++ {
			x, err := c.newRule(fmt.Sprintf("%s members with required set %#x, count %d", ptrOr(path), set, k))
			if err != nil {
				return err
			}
			rules[set][k] = x
		}
	}
	comma := T(Lit(","))
	for set := 0; set <= full; set++ {
		for _, m := range mems {
			if m.bit&set != m.bit {
				continue
			}
			if m.bit == set {
				c.b.AddAlt(rules[set][1], m.syms...)
			}
			// The sets before m: set less any part of m's bits.
			for sub := m.bit; ; sub = (sub - 1) & m.bit {
				prev := set ^ sub
				for k := 2; k <= capK; k++ {
					c.b.AddAlt(rules[set][k], append([]Sym{N(rules[prev][k-1]), comma}, m.syms...)...)
				}
				if !hasMax {
					// The last count also stands for more.
					c.b.AddAlt(rules[set][capK], append([]Sym{N(rules[prev][capK]), comma}, m.syms...)...)
				}
				if sub == 0 {
					break
				}
			}
		}
	}
	for k := max(minP, 1); k <= capK; k++ {
		c.b.AddAlt(r, T(Lit("{")), N(rules[full][k]), T(Lit("}")))
	}
	return nil
}

// emitArray adds n's array alternative to rule r.
func (c *jsCompiler) emitArray(n *node, r int) error {
	if n.unique {
		return c.emitArrayUnique(n, r)
	}
	if n.contains != nil {
		return c.emitArrayContains(n, r)
	}
	minI, maxI := n.minItems, n.maxItems
	hasMax := maxI >= 0
	capK := max(minI, len(n.prefix), 1)
	if hasMax {
		capK = maxI
	}
	if capK > maxCountChain {
		kw := "minItems"
		if hasMax {
			kw = "maxItems"
		}
		return unsupportedAt(kw, n.path, "item counts above %d", maxCountChain)
	}
	if hasMax && minI > maxI {
		return nil
	}
	comma := T(Lit(","))
	memo := map[int]int{}
	var ruleE func(k int) (int, error)
	ruleE = func(k int) (int, error) {
		if x, ok := memo[k]; ok {
			return x, nil
		}
		x, err := c.newRule(fmt.Sprintf("%s items>=%d", ptrOr(n.path), k))
		if err != nil {
			return 0, err
		}
		memo[k] = x
		if k >= minI {
			c.b.AddAlt(x)
		}
		if hasMax && k >= maxI {
			return x, nil
		}
		el := n.itemAt(k)
		if el != nil && el.never() {
			return x, nil
		}
		er, err := c.emitOpt(el)
		if err != nil {
			return 0, err
		}
		if !hasMax && k == capK {
			c.b.AddAlt(x, N(x), comma, N(er)) // k ≥ 1
			return x, nil
		}
		next, err := ruleE(k + 1)
		if err != nil {
			return 0, err
		}
		if k > 0 {
			c.b.AddAlt(x, comma, N(er), N(next))
		} else {
			c.b.AddAlt(x, N(er), N(next))
		}
		return x, nil
	}
	body, err := ruleE(0)
	if err != nil {
		return err
	}
	c.b.AddAlt(r, T(Lit("[")), N(body), T(Lit("]")))
	return nil
}

// emitArrayContains adds n's array alternative to rule r when some element
// must match n.contains: E(k, seen) is the elements from k on, seen telling
// whether one before matched; past the counted part, R1 = ("," el)* and
// R0 = R1 "," elC R1, elC being an element that matches.
func (c *jsCompiler) emitArrayContains(n *node, r int) error {
	minI, maxI := n.minItems, n.maxItems
	hasMax := maxI >= 0
	capK := max(minI, len(n.prefix), 1)
	if hasMax {
		capK = maxI
	}
	if capK > maxCountChain {
		return unsupportedAt("maxItems", n.path, "item counts above %d", maxCountChain)
	}
	comma := T(Lit(","))
	// elem returns the rules of element k (any) and of element k matching
	// contains, -1 for none.
	elem := func(k int) (int, int, error) {
		el := n.itemAt(k)
		ar, cr := -1, -1
		if el == nil || !el.never() {
			x, err := c.emitOpt(el)
			if err != nil {
				return 0, 0, err
			}
			ar = x
		}
		m, err := c.mergeOpt(el, n.contains, 0)
		if err != nil {
			return 0, 0, err
		}
		if !m.never() {
			if cr, err = c.emit(m); err != nil {
				return 0, 0, err
			}
		}
		return ar, cr, nil
	}
	memo := map[[2]int]int{}
	var ruleE func(k, seen int) (int, error)
	ruleE = func(k, seen int) (int, error) {
		if x, ok := memo[[2]int{k, seen}]; ok {
			return x, nil
		}
		x, err := c.newRule(fmt.Sprintf("%s items>=%d seen=%d", ptrOr(n.path), k, seen))
		if err != nil {
			return 0, err
		}
		memo[[2]int{k, seen}] = x
		ar, cr, err := elem(k)
		if err != nil {
			return 0, err
		}
		if !hasMax && k == capK {
			// x is R(seen); R1 is the seen rule at capK.
			r1, err := ruleE(k, 1)
			if err != nil {
				return 0, err
			}
			if seen == 1 {
				c.b.AddAlt(x)
				if ar >= 0 {
					c.b.AddAlt(x, N(x), comma, N(ar))
				}
			} else if cr >= 0 {
				c.b.AddAlt(x, N(r1), comma, N(cr), N(r1))
			}
			return x, nil
		}
		if k >= minI && seen == 1 {
			c.b.AddAlt(x)
		}
		if hasMax && k >= maxI {
			return x, nil
		}
		var sep []Sym
		if k > 0 {
			sep = []Sym{comma}
		}
		if ar >= 0 {
			next, err := ruleE(k+1, seen)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(x, append(slices.Clip(sep), N(ar), N(next))...)
		}
		if cr >= 0 && seen == 0 {
			next, err := ruleE(k+1, 1)
			if err != nil {
				return 0, err
			}
			c.b.AddAlt(x, append(slices.Clip(sep), N(cr), N(next))...)
		}
		return x, nil
	}
	body, err := ruleE(0, 0)
	if err != nil {
		return err
	}
	c.b.AddAlt(r, T(Lit("[")), N(body), T(Lit("]")))
	return nil
}

// maxUniqueValues bounds the values of an enumerated item type whose
// arrays are emitted with unique items (2^n rules).
const maxUniqueValues = 8

// emitArrayUnique adds n's array alternative to rule r when items are
// unique: only for items from an enumeration of at most maxUniqueValues
// values. L(S) is a list of the distinct values of set S (a bit mask),
// L({v}) ::= v and L(S) ::= L(S - v) "," v.
func (c *jsCompiler) emitArrayUnique(n *node, r int) error {
	refuse := func() error {
		return unsupportedAt("uniqueItems", n.path, "unique items are enforced only for items from an enumeration of at most %d values", maxUniqueValues)
	}
	if len(n.prefix) > 0 || n.contains != nil || n.items == nil {
		return refuse()
	}
	it, err := c.deref(n.items)
	if err != nil {
		return err
	}
	var vals []*jval
	switch {
	case it.isUnion || !it.hasEnum:
		if it.isUnion || it.types != tBool || it.trivial() {
			return refuse()
		}
		vals = []*jval{{k: jBool, b: false}, {k: jBool, b: true}}
	default:
		for _, v := range it.enum {
			ok, err := c.validate(it, v, 0)
			if err != nil {
				return err
			}
			if ok && !slices.ContainsFunc(vals, func(x *jval) bool { return jsonEqual(x, v) }) {
				vals = append(vals, v)
			}
		}
	}
	if len(vals) > maxUniqueValues {
		return refuse()
	}
	maxI := n.maxItems
	if maxI < 0 || maxI > len(vals) {
		maxI = len(vals)
	}
	if n.minItems == 0 {
		c.b.AddAlt(r, T(Lit("[")), T(Lit("]")))
	}
	full := 1<<len(vals) - 1
	rules := make([]int, full+1)
	for set := 1; set <= full; set++ {
		x, err := c.newRule(fmt.Sprintf("%s unique items %#x", ptrOr(n.path), set))
		if err != nil {
			return err
		}
		rules[set] = x
	}
	for set := 1; set <= full; set++ {
		for i, v := range vals {
			b := 1 << i
			if set&b == 0 {
				continue
			}
			if set == b {
				c.b.AddAlt(rules[set], c.literal(v)...)
			} else {
				c.b.AddAlt(rules[set], append([]Sym{N(rules[set^b]), T(Lit(","))}, c.literal(v)...)...)
			}
		}
		if k := bitsCount(set); k >= max(n.minItems, 1) && k <= maxI {
			c.b.AddAlt(r, T(Lit("[")), N(rules[set]), T(Lit("]")))
		}
	}
	return nil
}

// bitsCount is the number of bits set in x.
func bitsCount(x int) int {
	k := 0
	for ; x != 0; x &= x - 1 {
		k++
	}
	return k
}

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
)

// This file prepares a tool's parameters for the schema of a constrained
// tool_choice (toolRequest.schema): it checks that they are the schema of
// an object, as OpenAI requires, and moves their local $refs to where they
// sit inside the schema of "required", which holds every tool's parameters.

// jnode is a JSON value that keeps the order of object keys (property
// order is the order the grammar writes properties in).
type jnode struct {
	// kind is '{' (keys, vals), '[' (vals), or 0 for a scalar (raw).
	kind  byte
	keys  []string
	vals  []*jnode
	raw   string // a scalar's JSON text ("" for containers)
	str   string // a string scalar's value
	isStr bool
}

// maxParamsDepth bounds the nesting of a tool's parameters read here (the
// grammar compiler has its own, lower bound; this one only keeps the
// recursion finite).
const maxParamsDepth = 1000

// parseJNode reads one JSON value from raw (numbers kept as written).
func parseJNode(raw []byte) (*jnode, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	n, err := readJNode(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("text after the JSON value")
	}
	return n, nil
}

func readJNode(dec *json.Decoder, depth int) (*jnode, error) {
	if depth > maxParamsDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxParamsDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		n := &jnode{kind: byte(t)}
		for dec.More() {
			if n.kind == '{' {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			v, err := readJNode(dec, depth+1)
			if err != nil {
				return nil, err
			}
			n.vals = append(n.vals, v)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &jnode{raw: string(AppendJSONString(nil, t, false)), str: t, isStr: true}, nil
	case json.Number:
		return &jnode{raw: string(t)}, nil
	case bool:
		return &jnode{raw: strconv.FormatBool(t)}, nil
	case nil:
		return &jnode{raw: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected %v", tok)
}

// get is the value of key k of object n (nil if absent).
func (n *jnode) get(k string) *jnode {
	for i, key := range n.keys {
		if key == k {
			return n.vals[i]
		}
	}
	return nil
}

// appendTo appends n as compact JSON.
func (n *jnode) appendTo(b []byte) []byte {
	switch n.kind {
	case '{':
		b = append(b, '{')
		for i, k := range n.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONString(b, k, false)
			b = append(b, ':')
			b = n.vals[i].appendTo(b)
		}
		return append(b, '}')
	case '[':
		b = append(b, '[')
		for i, v := range n.vals {
			if i > 0 {
				b = append(b, ',')
			}
			b = v.appendTo(b)
		}
		return append(b, ']')
	}
	return append(b, n.raw...)
}

// objectKeywords are the JSON Schema keywords that constrain objects only:
// a schema with one of them and no type is taken as an object's.
var objectKeywords = []string{"properties", "required", "additionalProperties", "patternProperties",
	"propertyNames", "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies"}

// toolParameters checks raw, a tool's parameters, and returns the schema
// of its arguments: absent, null or {} is a function without parameters
// (emptyParameters); a schema without "type" that has an object keyword
// gets "type": "object" (first); any other schema must have type
// "object" exactly, since arguments are a JSON object (OpenAI's rule).
// The schema is compacted; the error is the reason, to follow the field's
// name.
func toolParameters(raw json.RawMessage) (json.RawMessage, error) {
	if isNull(raw) {
		return json.RawMessage(emptyParameters), nil
	}
	if firstByte(raw) != '{' {
		return nil, errors.New("must be a JSON Schema object")
	}
	n, err := parseJNode(raw)
	if err != nil {
		return nil, fmt.Errorf("must be a JSON Schema object: %v", err)
	}
	if len(n.keys) == 0 {
		return json.RawMessage(emptyParameters), nil
	}
	t := n.get("type")
	if t == nil {
		for _, k := range objectKeywords {
			if n.get(k) != nil {
				n.keys = append([]string{"type"}, n.keys...)
				n.vals = append([]*jnode{{raw: `"object"`, str: "object", isStr: true}}, n.vals...)
				return n.appendTo(nil), nil
			}
		}
		return nil, errors.New(`must be the schema of an object ("type": "object"): the arguments of a call are a JSON object`)
	}
	if !t.isStr || t.str != "object" {
		return nil, fmt.Errorf(`must be the schema of an object ("type": "object"), got type %s`, t.appendTo(nil))
	}
	return n.appendTo(nil), nil
}

// Keywords whose value maps names to schemas, and keywords whose value is
// data (never a schema, so a "$ref" in it is not a reference).
var (
	schemaMapKeywords = map[string]bool{"properties": true, "patternProperties": true, "$defs": true,
		"definitions": true, "dependentSchemas": true, "dependencies": true}
	dataKeywords = map[string]bool{"enum": true, "const": true, "default": true, "examples": true, "example": true}
)

// pointerToken escapes a key or index as a token of a JSON pointer in a
// URI fragment: RFC 6901's ~0 and ~1, then % as %25 (the fragment is
// percent-decoded before the pointer is read).
func pointerToken(k string) string {
	k = strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
	return strings.ReplaceAll(k, "%", "%25")
}

// rebaseRefs moves the local references of schema raw, a tool's parameters,
// to the place at (a JSON pointer, "/items/anyOf/3/properties/parameters")
// where the parameters sit in a larger schema: "#" becomes "#"+at,
// "#/$defs/A" "#"+at+"/$defs/A", an anchor ("#name", "$anchor" or an "$id"
// of "#name" in the parameters) the pointer to the schema that declares
// it, and the same with the parameters' own "$id" before the "#". Other
// references (remote ones) are left alone. It returns the schema
// compacted; the error names an anchor the parameters do not declare.
func rebaseRefs(raw json.RawMessage, at string) (json.RawMessage, error) {
	n, err := parseJNode(raw)
	if err != nil {
		return nil, err
	}
	base := ""
	if n.kind == '{' {
		for _, k := range []string{"$id", "id"} {
			if id := n.get(k); id != nil && id.isStr {
				base, _, _ = strings.Cut(id.str, "#")
				break
			}
		}
	}
	anchors := map[string]string{}
	walkSchema(n, "", func(s *jnode, ptr string) error {
		for _, k := range []string{"$anchor", "$id", "id"} {
			a := s.get(k)
			if a == nil || !a.isStr {
				continue
			}
			name := a.str
			if k != "$anchor" {
				i := strings.IndexByte(name, '#')
				if i < 0 || i == len(name)-1 {
					continue
				}
				name = name[i+1:]
			}
			if _, dup := anchors[name]; !dup {
				anchors[name] = ptr
			}
		}
		return nil
	})
	err = walkSchema(n, "", func(s *jnode, _ string) error {
		r := s.get("$ref")
		if r == nil || !r.isStr {
			return nil
		}
		doc, frag, hasFrag := strings.Cut(r.str, "#")
		if doc != "" && (base == "" || doc != base) {
			return nil // remote: the compiler refuses it
		}
		target := ""
		switch f, err := url.PathUnescape(frag); {
		case !hasFrag || frag == "" || frag[0] == '/':
			target = "#" + at + frag
		case err != nil:
			return fmt.Errorf("$ref %q has a bad fragment", r.str)
		default:
			ptr, ok := anchors[f]
			if !ok {
				return fmt.Errorf("$ref %q names an anchor no schema in them declares", r.str)
			}
			target = "#" + at + ptr
		}
		*r = jnode{raw: string(AppendJSONString(nil, target, false)), str: target, isStr: true}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return n.appendTo(nil), nil
}

// walkSchema calls f on every schema object of schema n (n itself, the
// values of properties, $defs and the like, the schemas of applicators
// and of unknown keywords), with its JSON pointer below ptr; it does not
// enter data (enum, const, default, examples). It stops at f's first
// error.
func walkSchema(n *jnode, ptr string, f func(s *jnode, ptr string) error) error {
	switch n.kind {
	case '[':
		for i, v := range n.vals {
			if err := walkSchema(v, ptr+"/"+strconv.Itoa(i), f); err != nil {
				return err
			}
		}
		return nil
	case '{':
	default:
		return nil
	}
	if err := f(n, ptr); err != nil {
		return err
	}
	for i, k := range n.keys {
		v, p := n.vals[i], ptr+"/"+pointerToken(k)
		switch {
		case dataKeywords[k]:
		case schemaMapKeywords[k] && v.kind == '{':
			for j, name := range v.keys {
				if err := walkSchema(v.vals[j], p+"/"+pointerToken(name), f); err != nil {
					return err
				}
			}
		default:
			if err := walkSchema(v, p, f); err != nil {
				return err
			}
		}
	}
	return nil
}

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// This file prepares a tool's parameters for the schema of a constrained
// tool_choice (toolRequest.schema): it checks that they are the schema of
// an object, as OpenAI requires.

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

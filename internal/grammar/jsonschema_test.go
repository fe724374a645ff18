package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonByteVocab has one token per byte and an EOS token (256).
func jsonByteVocab(t *testing.T) *Vocab {
	t.Helper()
	toks := make([][]byte, 257)
	for i := range 256 {
		toks[i] = []byte{byte(i)}
	}
	toks[256] = []byte("<eos>")
	v, err := NewVocab(toks, []int32{256})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// jsonAccepts reports whether g accepts text whole, fed byte by byte.
func jsonAccepts(t *testing.T, c *Constraint, text string) bool {
	t.Helper()
	m := c.NewMatcher()
	for i := 0; i < len(text); i++ {
		if !m.AcceptBytes([]byte{text[i]}) {
			return false
		}
	}
	return m.CanEnd()
}

// validates reports whether the reference validator finds text valid
// against schema.
func validates(t *testing.T, schema, text string) bool {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	comp := jsonschema.NewCompiler()
	comp.AssertFormat()
	if err := comp.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("schema.json")
	if err != nil {
		t.Fatalf("reference compile %s: %v", schema, err)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return false
	}
	return sch.Validate(inst) == nil
}

type jsonCase struct {
	name   string
	schema string
	ok     []string // accepted, and valid
	bad    []string // refused, and invalid
	order  []string // refused though valid: not in the enforced property order
	// strict are refused where validators disagree (MaskBench's labels
	// follow jsonschema-rs, stricter there than santhosh-tekuri's).
	strict []string
}

var jsonCases = []jsonCase{
	{name: "any", schema: `{}`,
		ok:  []string{`1`, `"x"`, `null`, `true`, `{"a":[1,{"b":null}]}`, `[]`, `-0.5e10`, `"\u001f\n\"\\\/é😀"`},
		bad: []string{`nul`, `{"a"}`, `[1,]`, `01`, `"\x"`, "\"\x01\"", `tru`, `{,}`}},
	{name: "false", schema: `{"anyOf":[false,{"type":"null"}]}`, ok: []string{`null`}, bad: []string{`1`, `{}`}},
	{name: "types", schema: `{"type":["integer","null","boolean"]}`,
		ok: []string{`0`, `-12`, `null`, `false`}, bad: []string{`1.5`, `"1"`, `[]`, `{}`, `00`, `1.`}},
	{name: "number", schema: `{"type":"number"}`,
		ok: []string{`0`, `-1.25`, `1e5`, `2E-3`, `0.0`}, bad: []string{`.5`, `1.`, `+1`, `1e`, `NaN`}},
	{name: "string lengths", schema: `{"type":"string","minLength":2,"maxLength":3}`,
		ok:  []string{`"ab"`, `"abc"`, `"é😀"`, `"\n\t"`, `"\u0001x"`, `"a\"b"`},
		bad: []string{`"a"`, `"abcd"`, `"\n\t\r\b"`, `""`, `"😀"`}},
	{name: "pattern", schema: `{"type":"string","pattern":"^[a-c]+\"?$"}`,
		ok: []string{`"abc"`, `"a\""`}, bad: []string{`"abd"`, `""`, `"a\"\""`}},
	{name: "pattern unanchored", schema: `{"type":"string","pattern":"x/y"}`,
		ok: []string{`"ax/yb"`, `"x\/y"`}, bad: []string{`"xy"`}},
	{name: "pattern with newline class", schema: `{"type":"string","pattern":"^\\s*$"}`,
		ok: []string{`"  \n\t"`, `"\u000a"`}, bad: []string{`"a"`}},
	{name: "enum", schema: `{"enum":["a","b\"c",1,null,{"x":[1]},1.5]}`,
		ok:  []string{`"a"`, `"b\"c"`, `1`, `null`, `{"x":[1]}`, `1.5`},
		bad: []string{`"c"`, `2`, `{"x":[2]}`, `"b"`}},
	{name: "enum with type", schema: `{"type":"string","enum":["a",1,"bb"],"maxLength":1}`,
		ok: []string{`"a"`}, bad: []string{`1`, `"bb"`}},
	{name: "const", schema: `{"const":"x\ny"}`, ok: []string{`"x\ny"`, `"x\u000ay"`}, bad: []string{`"xy"`}},
	{name: "integer range", schema: `{"type":"integer","minimum":-15,"exclusiveMaximum":120}`,
		ok:  []string{`-15`, `-9`, `0`, `7`, `99`, `119`, `100`},
		bad: []string{`-16`, `-150`, `120`, `200`, `1000`, `1.5`}},
	{name: "integer draft4 zero fraction", schema: `{"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"}`,
		ok: []string{`6`}, strict: []string{`6.0`}},
	{name: "integer draft4 exclusive", schema: `{"$schema":"http://json-schema.org/draft-04/schema#","type":"integer","minimum":5,"exclusiveMinimum":true}`,
		ok: []string{`6`, `60`}, bad: []string{`5`, `-6`, `0`}},
	{name: "number range", schema: `{"type":"number","minimum":-1.5,"maximum":2.25}`,
		ok:  []string{`-1.5`, `-1.49`, `0`, `-0.0`, `2`, `2.25`, `2.2500`, `1.999`, `-1`, `-1.5000`},
		bad: []string{`-1.51`, `2.26`, `3`, `-2`, `2.2501`, `10`}},
	{name: "number non-negative", schema: `{"type":"number","minimum":0}`,
		ok: []string{`0`, `1e-06`, `2.5E+30`, `0e5`, `-0`}, bad: []string{`-1e-06`, `-1`}},
	{name: "number probability", schema: `{"type":"number","exclusiveMinimum":0,"maximum":1}`,
		ok: []string{`1e-06`, `1`, `0.5`, `2e-1`}, bad: []string{`0e-5`, `12e-1`, `1e+2`, `-1e-6`, `1.5`}},
	{name: "number exclusive", schema: `{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1}`,
		ok: []string{`0.5`, `0.001`, `0.999`}, bad: []string{`0`, `1`, `0.0`, `1.0`, `-0.5`, `-0`}},
	{name: "multipleOf 4", schema: `{"type":"integer","multipleOf":4,"maximum":200}`,
		ok: []string{`0`, `4`, `-8`, `100`, `116`, `200`}, bad: []string{`2`, `6`, `102`, `-10`, `204`}},
	{name: "multipleOf 0.01", schema: `{"type":"number","multipleOf":0.01}`,
		ok: []string{`1`, `1.5`, `-2.25`, `3.10`, `0.070`}, bad: []string{`1.005`, `0.001`}},
	{name: "multipleOf 1", schema: `{"$schema":"http://json-schema.org/draft-04/schema#","type":"number","multipleOf":1,"minimum":0}`, ok: []string{`3`, `6000`}, bad: []string{`3.5`, `-1`}},
	{name: "object order and required", schema: `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"],"additionalProperties":false}`,
		ok:    []string{`{"b":"x"}`, `{"a":1,"b":"x"}`},
		bad:   []string{`{}`, `{"a":1}`, `{"b":"x","c":1}`, `{"a":"1","b":"x"}`, `{"a":1,,"b":"x"}`},
		order: []string{`{"b":"x","a":1}`, `{"b":"x","b":"y"}`}},
	{name: "additional properties", schema: `{"properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}}`,
		ok:  []string{`{}`, `{"a":1}`, `{"a":1,"x":"y","z":"w"}`, `{"x":"y"}`},
		bad: []string{`{"a":"s"}`, `{"x":1}`, `{"x":"y","a":"s"}`, `{"\u0061":"s"}`}},
	{name: "required not in properties", schema: `{"required":["z"],"additionalProperties":{"type":"integer"}}`,
		ok: []string{`{"z":1}`, `{"z":1,"y":2}`}, bad: []string{`{}`, `{"z":"a"}`, `{"y":1}`}},
	{name: "pattern properties", schema: `{"properties":{"ab":{"type":"integer"},"ac":{"minimum":2}},"patternProperties":{"^a":{"type":"string"},"c$":{"maxLength":3}},"additionalProperties":false}`,
		ok: []string{`{"ax":"s"}`, `{"ac":"s"}`, `{"ac":"s","abc":"sss"}`}, bad: []string{`{"ab":1}`, `{"ab":"s"}`, `{"ax":1}`, `{"b":"s"}`, `{"abc":"ssss"}`, `{"ac":"ssss"}`}},
	{name: "pattern properties merged", schema: `{"allOf":[{"patternProperties":{"^a":{"type":"integer"}}},{"patternProperties":{"b$":{"minimum":3}}}]}`,
		ok: []string{`{"ax":1}`, `{"ab":3}`, `{"xb":"s"}`, `{"x":null}`}, bad: []string{`{"ab":2}`, `{"ab":"s"}`, `{"ax":"s"}`, `{"xb":1}`}},
	{name: "property names", schema: `{"type":"object","propertyNames":{"maxLength":2}}`,
		ok: []string{`{"ab":1}`, `{}`}, bad: []string{`{"abc":1}`}},
	{name: "min max properties", schema: `{"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2}`,
		ok: []string{`{"a":1}`, `{"a":1,"b":2}`}, bad: []string{`{}`, `{"a":1,"b":2,"c":3}`}},
	{name: "min properties optional", schema: `{"type":"object","properties":{"a":{},"b":{}},"additionalProperties":false,"minProperties":1}`,
		ok: []string{`{"a":1}`, `{"b":1}`, `{"a":1,"b":2}`}, bad: []string{`{}`}},
	{name: "array items", schema: `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}`,
		ok: []string{`[1,2]`, `[1,2,3]`}, bad: []string{`[]`, `[1]`, `[1,2,3,4]`, `[1,"a"]`, `[1,,2]`}},
	{name: "array unbounded", schema: `{"type":"array","items":{"type":"integer"},"minItems":1}`,
		ok: []string{`[1]`, `[1,2,3,4,5,6]`}, bad: []string{`[]`, `[1,2,]`}},
	{name: "prefixItems", schema: `{"prefixItems":[{"type":"string"},{"type":"integer"}],"items":false}`,
		ok: []string{`[]`, `["a"]`, `["a",1]`}, bad: []string{`["a",1,2]`, `[1]`}},
	{name: "tuple draft4", schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"array","items":[{"type":"string"}],"additionalItems":{"type":"null"}}`,
		ok: []string{`["a",null,null]`}, bad: []string{`["a",1]`}},
	{name: "contains", schema: `{"type":"array","items":{"type":"integer"},"contains":{"minimum":10}}`,
		ok: []string{`[10]`, `[1,2,30]`, `[11,1]`, `[1,20,3,4,5]`}, bad: []string{`[]`, `[1]`, `[1,2,3]`, `[10,"a"]`}},
	{name: "contains bounded", schema: `{"type":"array","contains":{"const":"x"},"maxItems":2}`,
		ok: []string{`["x"]`, `[1,"x"]`}, bad: []string{`[1,2]`, `[1,2,"x"]`}},
	{name: "not items", schema: `{"type":"array","not":{"items":{"type":"integer"}}}`,
		ok: []string{`["a"]`, `[1,null]`}, bad: []string{`[]`, `[1,2]`}},
	{name: "unique enum items", schema: `{"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true,"minItems":1}`,
		ok: []string{`["a"]`, `["c","a"]`, `["b","c","a"]`}, bad: []string{`[]`, `["a","a"]`, `["a","b","a"]`, `["d"]`}},
	{name: "anyOf", schema: `{"anyOf":[{"type":"string","maxLength":1},{"type":"integer","minimum":10}]}`,
		ok: []string{`"a"`, `10`, `123`}, bad: []string{`"ab"`, `9`, `null`}},
	{name: "oneOf disjoint types", schema: `{"oneOf":[{"type":"string"},{"type":"array","items":{"type":"string"}}]}`,
		ok: []string{`"a"`, `["a"]`}, bad: []string{`1`, `[1]`}},
	{name: "oneOf tagged", schema: `{"type":"object","oneOf":[{"properties":{"k":{"const":"a"},"x":{"type":"integer"}},"required":["k"]},{"properties":{"k":{"const":"b"}},"required":["k"]}]}`,
		ok: []string{`{"k":"a","x":1}`, `{"k":"b","x":"s"}`}, bad: []string{`{"k":"c"}`, `{"k":"a","x":"s"}`}},
	{name: "oneOf exact", schema: `{"type":"object","properties":{"r":{},"l":{},"w":{}},"oneOf":[{"required":["r"]},{"required":["l","w"]}]}`,
		ok: []string{`{"r":1}`, `{"l":1,"w":2}`, `{"r":1,"l":1}`}, bad: []string{`{}`, `{"r":1,"l":1,"w":2}`, `{"l":1}`}},
	{name: "oneOf overlapping enums", schema: `{"oneOf":[{"enum":["a","b"]},{"enum":["b","c"]},{"type":"integer"}]}`,
		ok: []string{`"a"`, `"c"`, `3`}, bad: []string{`"b"`, `"d"`, `null`}},
	{name: "oneOf number integer", schema: `{"oneOf":[{"type":"number"},{"type":"integer"}]}`,
		ok: []string{`1.5`, `-0.25`}, bad: []string{`1`, `"a"`, `null`}},
	{name: "allOf merge", schema: `{"allOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]}`,
		ok: []string{`{"a":1,"b":"x"}`, `{"a":1,"b":"x","c":null}`}, bad: []string{`{"a":1}`, `{"a":"1","b":"x"}`}},
	{name: "sibling anyOf", schema: `{"type":"object","properties":{"t":{"type":"string"}},"anyOf":[{"required":["t"]},{"required":["u"]}]}`,
		ok: []string{`{"t":"x"}`, `{"u":1}`}, bad: []string{`{}`, `{"t":1}`}},
	{name: "recursive ref", schema: `{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"additionalProperties":false}},"$ref":"#/$defs/n"}`,
		ok: []string{`{"v":1,"kids":[{"v":2,"kids":[]},{"kids":[{"v":3}]}]}`}, bad: []string{`{"kids":[{"v":"x"}]}`, `{"kids":[{"w":1}]}`}},
	{name: "recursive ref under allOf", schema: `{"definitions":{"C":{"type":"object","maxProperties":1},"F":{"type":"object","properties":{"k":{"allOf":[{"$ref":"#/definitions/F"},{"$ref":"#/definitions/C"}]}},"additionalProperties":false}},"$ref":"#/definitions/F"}`,
		ok: []string{`{}`, `{"k":{}}`, `{"k":{"k":{"k":{}}}}`}, bad: []string{`{"k":1}`, `{"k":{"x":1}}`, `{"x":{}}`}},
	{name: "anchor ref", schema: `{"$defs":{"a":{"$anchor":"num","type":"integer"}},"properties":{"x":{"$ref":"#num"}}}`,
		ok: []string{`{"x":1}`}, bad: []string{`{"x":"1"}`}},
	{name: "root ref", schema: `{"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}},"additionalProperties":false}`,
		ok: []string{`{"kids":[{},{"kids":[{}]}]}`}, bad: []string{`{"kids":[1]}`, `{"kids":[{"x":1}]}`}},
	{name: "ref with siblings", schema: `{"definitions":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/definitions/s","maxLength":2}}}`,
		ok: []string{`{"a":"xy"}`}, bad: []string{`{"a":"xyz"}`, `{"a":1}`}},
	{name: "draft 7 ref siblings ignored", schema: `{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/definitions/s","maxLength":2}}}`,
		ok: []string{`{"a":"xyz"}`}, bad: []string{`{"a":1}`}},
	{name: "if then else", schema: `{"type":"object","properties":{"k":{"enum":["a","b"]},"v":{}},"if":{"properties":{"k":{"const":"a"}}},"then":{"properties":{"v":{"type":"integer"}}},"else":{"properties":{"v":{"type":"string"}}}}`,
		ok: []string{`{"k":"a","v":1}`, `{"k":"b","v":"s"}`, `{"v":1}`}, bad: []string{`{"k":"a","v":"s"}`, `{"k":"b","v":1}`, `{"v":"s"}`}},
	{name: "dependencies", schema: `{"properties":{"a":{},"b":{},"c":{"type":"integer"}},"dependencies":{"a":["b"],"b":{"required":["c"]}}}`,
		ok: []string{`{}`, `{"a":1,"b":2,"c":3}`, `{"c":1}`, `{"b":1,"c":2}`}, bad: []string{`{"a":1}`, `{"a":1,"b":2}`, `{"b":1}`}},
	{name: "draft 4 ignores if and const", schema: `{"$schema":"http://json-schema.org/draft-04/schema#","properties":{"a":{"const":1}},"if":{"type":"object"},"then":{"required":["b"]}}`,
		ok: []string{`{"a":2}`, `{}`}, bad: []string{`{"a":"x"`}},
	{name: "not", schema: `{"not":{"type":["string","null"]}}`, ok: []string{`1`, `{}`}, bad: []string{`"a"`, `null`}},
	{name: "not required", schema: `{"properties":{"a":{}},"not":{"required":["a","b"]}}`,
		ok: []string{`{}`, `{"a":1}`, `{"b":1}`}, bad: []string{`{"a":1,"b":2}`, `1`}},
	{name: "not enum pattern", schema: `{"not":{"anyOf":[{"enum":["x",null]},{"pattern":"^a"}]}}`,
		ok: []string{`"y"`, `"ba"`}, bad: []string{`"x"`, `null`, `"ab"`, `1`, `true`}},
	{name: "not bounds", schema: `{"not":{"type":"number","minimum":3,"maxLength":2}}`,
		ok: []string{`2`, `2.5`, `"abc"`, `{}`, `"ab"`}, bad: []string{`3`, `40`}},
	{name: "not numbers", schema: `{"type":"number","not":{"enum":[1,0,-2.5]}}`,
		ok: []string{`2`, `1.5`, `-2.25`}, bad: []string{`1`, `1.00`, `0`, `-0.0`, `-2.50`, `1e0`}},
	{name: "not true", schema: `{"not":{"const":true}}`, ok: []string{`false`, `1`, `"true"`}, bad: []string{`true`}},
	{name: "not format", schema: `{"type":"string","not":{"format":"date"}}`, ok: []string{`"x"`, `"2020-13-01"`}, bad: []string{`"2020-01-01"`}},
	{name: "not multipleOf", schema: `{"type":"number","not":{"multipleOf":5}}`, ok: []string{`3`, `12`, `5.5`}, bad: []string{`5`, `10`, `-15`, `0`}},
	{name: "not multipleOf 0.1", schema: `{"type":"number","not":{"multipleOf":0.1}}`, ok: []string{`0.05`, `1.01`}, bad: []string{`1`, `0.1`, `2.30`}},
	{name: "not oneOf", schema: `{"type":"integer","not":{"oneOf":[{"minimum":5},{"maximum":10}]}}`, ok: []string{`5`, `7`, `10`}, bad: []string{`4`, `11`}},
	{name: "not additionalProperties", schema: `{"type":"object","properties":{"a":{}},"not":{"properties":{"a":{}},"patternProperties":{"^x":{}},"additionalProperties":{"type":"integer"}}}`,
		ok: []string{`{"b":"s"}`, `{"a":1,"b":null,"c":2}`, `{"c":1,"b":true}`}, bad: []string{`{}`, `{"a":"s"}`, `{"b":1}`, `{"x":"s"}`, `{"a":1,"b":2}`}},
	{name: "oneOf closed objects", schema: `{"oneOf":[{"type":"object","properties":{"a":{}},"additionalProperties":false},{"type":"object","properties":{"b":{}},"additionalProperties":false}]}`,
		ok: []string{`{"a":1}`, `{"b":1}`}, bad: []string{`{}`, `{"a":1,"b":2}`, `{"c":1}`}},
	{name: "not patternProperties", schema: `{"type":"object","properties":{"ax":{"type":"integer"}},"not":{"patternProperties":{"^a":{"type":"string"}}}}`,
		ok: []string{`{"ab":1}`, `{"ax":2}`, `{"b":"s","ab":null}`}, bad: []string{`{}`, `{"ab":"s"}`, `{"b":1}`, `{"ax":"s"}`}},
	{name: "not propertyNames", schema: `{"type":"object","properties":{"abc":{}},"not":{"propertyNames":{"maxLength":2}}}`,
		ok: []string{`{"abc":1}`, `{"a":1,"xyz":2}`}, bad: []string{`{}`, `{"ab":1}`}},
	{name: "oneOf three closed objects", schema: `{"type":"object","oneOf":[{"properties":{"a":{}},"additionalProperties":false},{"properties":{"b":{}},"additionalProperties":false},{"properties":{"c":{}},"additionalProperties":false}]}`,
		ok: []string{`{"a":1}`, `{"b":1}`, `{"c":[]}`}, bad: []string{`{}`, `{"a":1,"b":1}`, `{"d":1}`}},
	{name: "not not", schema: `{"not":{"not":{"type":"string","minLength":2}}}`,
		ok: []string{`"ab"`}, bad: []string{`"a"`, `1`}},
	{name: "not properties", schema: `{"type":"object","not":{"properties":{"a":{"const":"x"}}}}`,
		ok: []string{`{"a":2}`}, bad: []string{`{}`, `{"a":"x"}`}},
	{name: "format date-time", schema: `{"type":"string","format":"date-time"}`,
		ok: []string{`"2024-02-29T12:30:00Z"`, `"2024-01-31T00:00:00.123+05:30"`}, bad: []string{`"2024-13-01T00:00:00Z"`, `"2024-04-31T00:00:00Z"`, `"2024-01-01"`}},
	{name: "format misc", schema: `{"type":"array","prefixItems":[{"format":"uuid"},{"format":"ipv4"},{"format":"email"},{"format":"date"},{"format":"ipv6"}]}`,
		ok:  []string{`["123e4567-e89b-12d3-a456-426614174000","192.168.0.1","a.b@example.com","2020-01-01","::1"]`},
		bad: []string{`["123e4567","192.168.0.1"]`, `["123e4567-e89b-12d3-a456-426614174000","256.1.1.1"]`, `["123e4567-e89b-12d3-a456-426614174000","1.1.1.1","a@"]`}},
	{name: "format uri-reference", schema: `{"type":"string","format":"uri-reference"}`,
		ok: []string{`"Web"`, `"../a/b?x=1#f"`, `"http://x.org/a"`, `""`, `"//host/p"`}, bad: []string{`"://"`}},
	{name: "unknown format", schema: `{"type":"string","format":"int32"}`, ok: []string{`"x"`}, bad: []string{`1`}},
}

func TestJSONSchemaCases(t *testing.T) {
	v := jsonByteVocab(t)
	for _, tc := range jsonCases {
		for _, o := range []JSONOptions{{}, {FlexibleWhitespace: true}, {AnyPropertyOrder: true}} {
			flexible := o.FlexibleWhitespace
			t.Run(fmt.Sprintf("%s/%+v", tc.name, o), func(t *testing.T) {
				g, err := CompileJSONSchema([]byte(tc.schema), o)
				if err != nil {
					t.Fatalf("compile %s: %v", tc.schema, err)
				}
				c, err := NewConstraint(g, v)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range tc.ok {
					if !validates(t, tc.schema, s) {
						t.Errorf("test data: %s is not valid against %s", s, tc.schema)
					}
					if !jsonAccepts(t, c, s) {
						t.Errorf("refused %s", s)
					}
				}
				for _, s := range tc.bad {
					if validates(t, tc.schema, s) {
						t.Errorf("test data: %s is valid against %s", s, tc.schema)
					}
					if jsonAccepts(t, c, s) {
						t.Errorf("accepted %s", s)
					}
				}
				for _, s := range tc.strict {
					if jsonAccepts(t, c, s) {
						t.Errorf("accepted %s", s)
					}
				}
				for _, s := range tc.order {
					if !validates(t, tc.schema, s) {
						t.Errorf("test data: %s is not valid against %s", s, tc.schema)
					}
					if jsonAccepts(t, c, s) != o.AnyPropertyOrder {
						t.Errorf("accepted %s out of property order: %v", s, !o.AnyPropertyOrder)
					}
				}
				if flexible && len(tc.ok) > 0 {
					spaced := strings.NewReplacer(",", ", ", ":", " : ", "{", "{ ", "[", "[\n\t").Replace(tc.ok[0])
					if !strings.Contains(tc.ok[0], `"`) && !jsonAccepts(t, c, " "+spaced+"\r\n") {
						t.Errorf("refused %q with whitespace", spaced)
					}
				} else if !flexible {
					for _, s := range tc.ok {
						if i := strings.IndexAny(s, "{["); i >= 0 && jsonAccepts(t, c, s[:i+1]+" "+s[i+1:]) {
							t.Errorf("compact grammar accepted whitespace in %s", s)
						}
					}
				}
			})
		}
	}
}

func TestJSONSchemaAnyPropertyOrder(t *testing.T) {
	v := jsonByteVocab(t)
	schema := `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{}},"required":["a","b"],"additionalProperties":{"type":"null"}}`
	g, err := CompileJSONSchema([]byte(schema), JSONOptions{AnyPropertyOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConstraint(g, v)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`{"a":1,"b":"x"}`, `{"b":"x","a":1}`, `{"c":[],"b":"x","z":null,"a":1}`, `{"z":null,"a":1,"c":1,"b":""}`} {
		if !validates(t, schema, s) || !jsonAccepts(t, c, s) {
			t.Errorf("refused %s", s)
		}
	}
	for _, s := range []string{`{}`, `{"a":1}`, `{"b":"x","c":1}`, `{"b":"x","a":"1"}`, `{"a":1,"b":"x","z":1}`, `{"a":1,"b":"x",}`, `{,"a":1,"b":"x"}`} {
		if validates(t, schema, s) || jsonAccepts(t, c, s) {
			t.Errorf("accepted %s", s)
		}
	}
}

func TestJSONSchemaAnyPropertyOrderCounted(t *testing.T) {
	v := jsonByteVocab(t)
	schema := `{"type":"object","properties":{"a":{},"b":{}},"required":["a"],"minProperties":2,"maxProperties":3}`
	g, err := CompileJSONSchema([]byte(schema), JSONOptions{AnyPropertyOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConstraint(g, v)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`{"b":1,"a":1}`, `{"x":1,"a":1}`, `{"x":1,"a":1,"y":2}`} {
		if !validates(t, schema, s) || !jsonAccepts(t, c, s) {
			t.Errorf("refused %s", s)
		}
	}
	for _, s := range []string{`{}`, `{"a":1}`, `{"b":1,"x":2}`, `{"a":1,"b":1,"x":1,"y":2}`} {
		if validates(t, schema, s) || jsonAccepts(t, c, s) {
			t.Errorf("accepted %s", s)
		}
	}
}

func TestJSONSchemaErrors(t *testing.T) {
	for _, tc := range []struct {
		schema, keyword, path string
		unsupported           bool
	}{
		{`{"type":"object","properties":{"a":{"not":{"multipleOf":3}}}}`, "not", "#/properties/a/not/multipleOf", true},
		{`{"$ref":"http://example.com/s.json"}`, "$ref", "#/$ref", true},
		{`{"$ref":"#/definitions/missing"}`, "$ref", "#/$ref", false},
		{`{"oneOf":[{"type":"array"},{"items":[{"type":"string"}]}]}`, "oneOf", "#/oneOf", true},
		{`{"items":{"uniqueItems":true}}`, "uniqueItems", "#/items", true},
		{`{"if":{"multipleOf":3},"then":{"minimum":2}}`, "multipleOf", "#/if/multipleOf", true},
		{`{"contains":{"type":"string"},"maxContains":2}`, "maxContains", "#/maxContains", true},
		{`{"type":"integer","multipleOf":3}`, "multipleOf", "#/multipleOf", true},
		{`{"type":"number","multipleOf":0.25}`, "multipleOf", "#/multipleOf", true},
		{`{"format":"idn-email"}`, "format", "#/format", true},
		{`{"type":"strin"}`, "type", "#/type", false},
		{`{"pattern":"(?<=a)b"}`, "pattern", "#/pattern", true},
		{`{"minLength":-1}`, "minLength", "#/minLength", false},
		{`{"type":"string","enum":[1,2]}`, "json_schema", "#", false},
		{`{"$defs":{"a":{"allOf":[{"$ref":"#/$defs/a"},{"properties":{"x":{"$ref":"#/$defs/a"}}}]}},"$ref":"#/$defs/a"}`, "allOf", "", true},
		{`{"maxItems":100000}`, "maxItems", "#", true},
		{`[`, "json_schema", "", false},
	} {
		_, err := CompileJSONSchema([]byte(tc.schema), JSONOptions{})
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: error %v, want *Error", tc.schema, err)
			continue
		}
		if e.Keyword != tc.keyword || tc.path != "" && e.Path != tc.path {
			t.Errorf("%s: keyword %q at %q (%v), want %q at %q", tc.schema, e.Keyword, e.Path, err, tc.keyword, tc.path)
		}
		if errors.Is(err, ErrUnsupported) != tc.unsupported {
			t.Errorf("%s: unsupported %v, want %v (%v)", tc.schema, errors.Is(err, ErrUnsupported), tc.unsupported, err)
		}
	}
	if _, err := CompileJSONSchema([]byte(`{"format":"int32"}`), JSONOptions{StrictFormats: true}); err == nil {
		t.Error("StrictFormats accepted an unknown format")
	}
}

// TestJSONSchemaFile compiles the schema of the MaskBench file named by
// $JSONSCHEMA_FILE and runs its instances through the matcher (a byte per
// token), reporting compile time and each instance's outcome.
func TestJSONSchemaFile(t *testing.T) {
	path := os.Getenv("JSONSCHEMA_FILE")
	if path == "" {
		t.Skip("JSONSCHEMA_FILE not set")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Schema json.RawMessage `json:"schema"`
		Tests  []struct {
			Valid bool            `json:"valid"`
			Data  json.RawMessage `json:"data"`
		} `json:"tests"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	g, err := CompileJSONSchema(f.Schema, JSONOptions{FlexibleWhitespace: true, AnyPropertyOrder: os.Getenv("JSONSCHEMA_ANYORDER") != ""})
	if err != nil {
		t.Logf("compile %v: %v", time.Since(t0), err)
		return
	}
	t.Logf("compile %v: %d rules", time.Since(t0), len(g.Rules))
	c, err := NewConstraint(g, jsonByteVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range f.Tests {
		t0 := time.Now()
		m := c.NewMatcher()
		got := true
		for j := 0; j < len(tc.Data) && got; j++ {
			t1 := time.Now()
			got = m.AcceptBytes(tc.Data[j : j+1])
			if !got {
				t.Logf("instance %d: refused byte %d after %q", i, j, tc.Data[max(0, j-80):j+1])
			}
			if d := time.Since(t1); d > 100*time.Millisecond {
				t.Logf("instance %d: byte %d %q took %v after %q", i, j, tc.Data[j], d, tc.Data[max(0, j-60):j])
			}
		}
		got = got && m.CanEnd()
		t.Logf("instance %d valid=%v accepted=%v in %v", i, tc.Valid, got, time.Since(t0))
	}
}

// TestJSONSchemaCompileDir compiles the schema of every MaskBench file in
// $JSONSCHEMA_DIR and reports the refusals by keyword, with examples.
func TestJSONSchemaCompileDir(t *testing.T) {
	dir := os.Getenv("JSONSCHEMA_DIR")
	if dir == "" {
		t.Skip("JSONSCHEMA_DIR not set")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	byKw := map[string][]string{}
	ok := 0
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Schema json.RawMessage `json:"schema"`
		}
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		_, err = CompileJSONSchema(f.Schema, JSONOptions{FlexibleWhitespace: true, AnyPropertyOrder: true})
		var ge *Error
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ge):
			byKw[ge.Keyword] = append(byKw[ge.Keyword], e.Name()+": "+err.Error())
		default:
			byKw["?"] = append(byKw["?"], e.Name()+": "+err.Error())
		}
	}
	t.Logf("%d of %d compiled", ok, len(ents))
	if out := os.Getenv("JSONSCHEMA_ERRORS"); out != "" {
		var all []string
		for _, l := range byKw {
			all = append(all, l...)
		}
		if err := os.WriteFile(out, []byte(strings.Join(all, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for kw, l := range byKw {
		t.Logf("%4d %s", len(l), kw)
		for _, x := range l[:min(len(l), 4)] {
			t.Logf("       %.300s", x)
		}
	}
}

package grammar

import (
	"strings"
	"testing"
)

// TestJSONSchemaWritesWhatClientsRead: the grammar leaves out texts that
// are valid JSON Schema instances but break clients that read them —
// integers with a zero fraction (Go's encoding/json refuses 6000.0 for an
// int), exponents a float64 cannot hold, leap seconds at other times than
// 23:59:60 UTC, email local parts over 64 characters.
func TestJSONSchemaWritesWhatClientsRead(t *testing.T) {
	for _, c := range []struct {
		schema  string
		ok, bad []string
	}{
		{`{"type":"integer"}`, []string{`6000`, `-1`}, []string{`6000.0`, `1.00`}},
		{`{"const":5}`, []string{`5`}, []string{`5.0`}},
		{`{"enum":[1,2.50]}`, []string{`1`, `2.50`, `2.5`}, []string{`1.0`}},
		{`{"type":"number","multipleOf":1}`, []string{`3`}, []string{`3.0`}},
		{`{"type":"number"}`, []string{`1e308`, `1e-308`, `2.5E+010`, `1e00`}, []string{`1e309`, `1e-309`, `1143985e6021`}},
		{`{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1}`, []string{`0.5`}, []string{`9.758e-75935068275512`}},
		{`{"type":"string","format":"time"}`, []string{`"23:59:59Z"`}, []string{`"22:14:60+21:01"`}},
		{`{"type":"string","format":"email"}`, []string{`"a.b@example.com"`}, []string{`"` + strings.Repeat("a", 65) + `@example.com"`}},
	} {
		g, err := Compile(Spec{Kind: KindJSONSchema, Source: c.schema})
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		for _, s := range c.ok {
			if ok, _ := MatchString(g, s); !ok {
				t.Errorf("%s refused %s", c.schema, s)
			}
		}
		for _, s := range c.bad {
			if ok, _ := MatchString(g, s); ok {
				t.Errorf("%s admitted %s", c.schema, s)
			}
		}
	}
}

// TestOneOfBranchBound: a oneOf of more than maxOneOfBranches branches is
// refused naming oneOf (its pairwise comparison would take seconds).
func TestOneOfBranchBound(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"oneOf":[`)
	for i := range maxOneOfBranches + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"const":` + strings.Repeat("1", 1+i%5) + `}`)
	}
	b.WriteString(`]}`)
	_, err := Compile(Spec{Kind: KindJSONSchema, Source: b.String()})
	if e, ok := err.(*Error); !ok || e.Keyword != "oneOf" {
		t.Fatalf("error %v, want one naming oneOf", err)
	}
}

package grammar

import "testing"

// TestSpecAnyPropertyOrder: the option reaches the JSON Schema compiler
// and the digest, so a worker never reuses the other mode's grammar.
func TestSpecAnyPropertyOrder(t *testing.T) {
	schema := `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]}`
	fixed := Spec{Kind: KindJSONSchema, Source: schema}
	any := fixed
	any.AnyPropertyOrder = true
	if fixed.Digest() == any.Digest() {
		t.Fatal("the two orders have one digest")
	}
	for _, c := range []struct {
		s    Spec
		text string
		want bool
	}{{fixed, `{"a":1,"b":2}`, true}, {fixed, `{"b":2,"a":1}`, false}, {any, `{"b":2,"a":1}`, true}, {any, `{"b":2}`, false}} {
		g, err := Compile(c.s)
		if err != nil {
			t.Fatal(err)
		}
		if ok, _ := MatchString(g, c.text); ok != c.want {
			t.Errorf("any order %v: %s matched %v, want %v", c.s.AnyPropertyOrder, c.text, ok, c.want)
		}
	}
}

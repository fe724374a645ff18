package grammar

import "testing"

// BenchmarkInsideWalkLlama3 is one uncached walk of the whole Llama 3 trie
// from inside a JSON string (nearly every token allowed): the cost of a
// mask at a lexer state seen for the first time.
func BenchmarkInsideWalkLlama3(b *testing.B) {
	_, v := llama3Vocab(b)
	c, err := NewConstraint(jsonGrammar(b, false), v)
	if err != nil {
		b.Fatal(err)
	}
	m := c.NewMatcher()
	if !m.AcceptBytes([]byte(`{"a`)) {
		b.Fatal("refused")
	}
	c.walkInside(m.lex) // build the lexer's transitions once
	for b.Loop() {
		c.walkInside(m.lex)
	}
	b.ReportMetric(float64(len(v.trie.nodes)), "nodes")
}

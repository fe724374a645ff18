package grammar

import (
	"math/rand/v2"
	"testing"
)

// listGrammar is "[" digits ("," digits)* "]" with optional spaces as Skip,
// the list written left-recursively.
func listGrammar(t testing.TB, skip bool) *Grammar {
	t.Helper()
	var b Builder
	start := b.NewRule("list")
	items := b.NewRule("items")
	num := Plus(Class(RuneRange{'0', '9'}))
	b.AddAlt(start, T(Lit("[")), T(Lit("]")))
	b.AddAlt(start, T(Lit("[")), N(items), T(Lit("]")))
	b.AddAlt(items, T(num))
	b.AddAlt(items, N(items), T(Lit(",")), T(num))
	if skip {
		b.SetSkip(Plus(Lit(" ")))
	}
	g, err := b.Grammar(start)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestMatchStringList(t *testing.T) {
	g := listGrammar(t, false)
	for s, want := range map[string]bool{
		"[]": true, "[1]": true, "[12,3,456]": true,
		"": false, "[": false, "[,]": false, "[1,]": false, "[1 ,2]": false, "[1]]": false, "x": false,
	} {
		got, err := MatchString(g, s)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("MatchString(%q) = %v, want %v", s, got, want)
		}
	}
	g = listGrammar(t, true)
	for s, want := range map[string]bool{
		" [ 1 , 2 ] ": true, "[1 2]": false, "[12 ]": true, "[1 2 ,3]": false,
	} {
		if got, _ := MatchString(g, s); got != want {
			t.Errorf("skip: MatchString(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestMatchStringAmbiguousLeftRecursive: Earley handles ambiguous and
// left-recursive grammars (E → E + E | n).
func TestMatchStringAmbiguousLeftRecursive(t *testing.T) {
	var b Builder
	e := b.NewRule("e")
	b.AddAlt(e, N(e), T(Lit("+")), N(e))
	b.AddAlt(e, T(Lit("n")))
	g, _ := b.Grammar(e)
	for s, want := range map[string]bool{"n": true, "n+n+n+n": true, "n+": false, "+n": false, "nn": false} {
		if got, _ := MatchString(g, s); got != want {
			t.Errorf("MatchString(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestNullableLexemeAndRules: a lexeme matching ε and a nullable rule.
func TestNullableLexemeAndRules(t *testing.T) {
	var b Builder
	s := b.NewRule("s")
	opt := b.NewRule("opt")
	b.AddAlt(opt)
	b.AddAlt(opt, T(Lit("x")))
	b.AddAlt(s, T(Lit("a")), N(opt), T(Star(Lit("b"))), T(Lit("c")))
	g, _ := b.Grammar(s)
	for str, want := range map[string]bool{"ac": true, "axc": true, "abbc": true, "axbc": true, "abxc": false, "a": false} {
		if got, _ := MatchString(g, str); got != want {
			t.Errorf("MatchString(%q) = %v, want %v", str, got, want)
		}
	}
}

func TestNoTextGrammar(t *testing.T) {
	var b Builder
	s := b.NewRule("s")
	b.AddAlt(s, N(s), T(Lit("a")))
	g, _ := b.Grammar(s)
	if _, err := NewConstraint(g, mustByteVocab(t)); err == nil {
		t.Fatal("a grammar with no finite text compiled")
	}
}

func mustByteVocab(t testing.TB) *Vocab {
	v, err := byteVocab()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// randomVocab is n random byte strings over alphabet (1…maxLen bytes),
// plus every single byte of alphabet, and an EOS token last.
func randomVocab(t testing.TB, r *rand.Rand, alphabet string, n, maxLen int) *Vocab {
	var toks [][]byte
	for i := range len(alphabet) {
		toks = append(toks, []byte{alphabet[i]})
	}
	for range n {
		l := 1 + r.IntN(maxLen)
		b := make([]byte, l)
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		toks = append(toks, b)
	}
	toks = append(toks, nil)
	v, err := NewVocab(toks, []int32{int32(len(toks) - 1)})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkMasks walks random outputs through c and checks, at every step, that
// FillMask agrees with Accept on a clone for every token and with CanEnd
// for EOS.
func checkMasks(t *testing.T, c *Constraint, r *rand.Rand, walks, steps int) {
	t.Helper()
	v := c.Vocab()
	mask := make([]uint64, v.MaskWords())
	for w := range walks {
		m := c.NewMatcher()
		var out []byte
		for step := range steps {
			m.FillMask(mask)
			var allowed []int32
			for id := range int32(v.Size()) {
				bit := mask[id>>6]&(1<<(id&63)) != 0
				ok := m.Clone().Accept(id)
				if bit != ok {
					t.Fatalf("walk %d step %d after %q: token %d %q: mask %v, Accept %v", w, step, out, id, v.Token(id), bit, ok)
				}
				if bit {
					allowed = append(allowed, id)
				}
			}
			if len(allowed) == 0 {
				t.Fatalf("walk %d step %d after %q: no token allowed", w, step, out)
			}
			id := allowed[r.IntN(len(allowed))]
			if !m.Accept(id) {
				t.Fatalf("Accept(%d) refused an allowed token", id)
			}
			if m.Done() {
				break
			}
			out = append(out, v.Token(id)...)
		}
	}
}

func TestMaskAgreesWithAccept(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, skip := range []bool{false, true} {
		g := listGrammar(t, skip)
		v := randomVocab(t, r, "[],0123 x", 300, 5)
		c, err := NewConstraint(g, v)
		if err != nil {
			t.Fatal(err)
		}
		checkMasks(t, c, r, 20, 30)
	}
}

// TestMaskAgreesWithAcceptJSON exercises tokens that cross several lexeme
// boundaries (`"},{"` and the like) and the mask caches' deeper walks.
func TestMaskAgreesWithAcceptJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, skip := range []bool{false, true} {
		v := randomVocab(t, r, `{}[]":,ab1-. etrufnls\`, 1200, 6)
		c, err := NewConstraint(jsonGrammar(t, skip), v)
		if err != nil {
			t.Fatal(err)
		}
		checkMasks(t, c, r, 12, 40)
	}
}

// TestSharedInsideCache: a second Constraint over the same Vocab takes its
// per-state masks from the Vocab's shared cache, and they are right.
func TestSharedInsideCache(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	v := randomVocab(t, r, `{}[]":,ab1-. etrufnls\`, 1200, 6)
	c1, err := NewConstraint(jsonGrammar(t, true), v)
	if err != nil {
		t.Fatal(err)
	}
	checkMasks(t, c1, r, 6, 40)
	if len(v.shared.m) == 0 {
		t.Fatal("nothing published to the shared cache")
	}
	c2, err := NewConstraint(jsonGrammar(t, true), v)
	if err != nil {
		t.Fatal(err)
	}
	m := c2.NewMatcher()
	if !m.AcceptBytes([]byte(`{"ab`)) {
		t.Fatal("refused")
	}
	c2.mu.Lock()
	e := c2.fromShared(m.lex)
	c2.mu.Unlock()
	if e == nil {
		t.Fatal("the string state of a second constraint missed the shared cache")
	}
	checkMasks(t, c2, r, 8, 40)
}

// TestTooComplex: a lexeme whose automaton is exponential ((a|b)*a(a|b){20}
// has 2^21 states) runs into the lexer-state bound, and Err says so
// instead of the engine growing without end.
func TestTooComplex(t *testing.T) {
	var b Builder
	s := b.NewRule("s")
	ab := Class(RuneRange{'a', 'b'})
	b.AddAlt(s, T(Concat(Star(ab), Lit("a"), Repeat(ab, 20, 20))))
	g, _ := b.Grammar(s)
	c, err := NewConstraint(g, mustByteVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMatcher()
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 1<<16 && m.Err() == nil; i++ {
		m.AcceptBytes([]byte{"ab"[r.IntN(2)]})
	}
	if m.Err() != ErrTooComplex {
		t.Fatalf("Err = %v after 64Ki bytes, want ErrTooComplex", m.Err())
	}
}

// TestConcurrentMatchers runs matchers of two Constraints over one Vocab
// on several goroutines (the race detector checks the locking).
func TestConcurrentMatchers(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	v := randomVocab(t, r, `{}[]":,ab1-. etrufnls\`, 2000, 6)
	var cs []*Constraint
	for _, skip := range []bool{false, true} {
		c, err := NewConstraint(jsonGrammar(t, skip), v)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	errs := make(chan string, 8)
	for g := range 8 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(g), 11))
			m := cs[g%2].NewMatcher()
			mask := make([]uint64, v.MaskWords())
			for range 60 {
				m.FillMask(mask)
				var allowed []int32
				for id := range int32(v.Size()) {
					if mask[id>>6]&(1<<(id&63)) != 0 {
						allowed = append(allowed, id)
					}
				}
				if len(allowed) == 0 {
					errs <- "no token allowed"
					return
				}
				id := allowed[r.IntN(len(allowed))]
				if !m.Clone().Accept(id) || !m.Accept(id) {
					errs <- "an allowed token was refused"
					return
				}
				if m.Done() {
					break
				}
			}
			errs <- ""
		}()
	}
	for range 8 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}

// TestAndOfClasses: an intersection of character classes is a class (no
// And node, so no liveness search and shared masks).
func TestAndOfClasses(t *testing.T) {
	r := And(Class(RuneRange{'a', 'z'}, RuneRange{'0', '9'}), NotClass(RuneRange{'x', 'x'}), Class(RuneRange{'5', 'y'}))
	want := Class(RuneRange{'5', '9'}, RuneRange{'a', 'w'}, RuneRange{'y', 'y'})
	if r.Op != OpClass || r.String() != want.String() {
		t.Fatalf("And of classes = %v, want %v", r, want)
	}
	if And(Class(RuneRange{'a', 'b'}), Class(RuneRange{'c', 'd'})).Op != OpNone {
		t.Fatal("disjoint classes do not intersect to nothing")
	}
}

// TestSaturatedCounts: lexer states that differ only in repeat counts
// beyond the longest token share their cached walks, and the masks stay
// exact (FillMask agrees with Accept) as the counts run down below it.
func TestSaturatedCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 15))
	v := randomVocab(t, r, `ab"`, 400, 5) // longest token 5 bytes: saturation at 6
	var b Builder
	s := b.NewRule("s")
	item := b.NewRule("item")
	b.AddAlt(item, T(Concat(Lit(`"`), Repeat(Class(RuneRange{'a', 'b'}), 0, 17), Lit(`"`))))
	b.AddAlt(s, N(item))
	b.AddAlt(s, N(s), N(item))
	g, _ := b.Grammar(s)
	c, err := NewConstraint(g, v)
	if err != nil {
		t.Fatal(err)
	}
	checkMasks(t, c, r, 40, 40)
	m := c.NewMatcher()
	m.AcceptBytes([]byte(`"`))
	first := m.lex
	m.AcceptBytes([]byte(`a`))
	if c.lx.states[first].shape != c.lx.states[m.lex].shape {
		t.Fatal("{0,17} and {0,16} remaining have different walk shapes")
	}
	for range 12 {
		m.AcceptBytes([]byte(`b`))
	}
	if c.lx.states[first].shape == c.lx.states[m.lex].shape {
		t.Fatal("4 left to go shares the walk shape of 17")
	}
}

func TestValidate(t *testing.T) {
	for src, ok := range map[string]bool{`a|b`: true, `[^\s\S]`: false, `(?:)x{0}`: true} {
		g, err := Compile(Spec{Kind: KindRegex, Source: src})
		if err != nil {
			t.Fatalf("Compile(%q): %v", src, err)
		}
		if err := g.Validate(); (err == nil) != ok {
			t.Errorf("Validate(%q) = %v, want ok %v", src, err, ok)
		}
	}
	g, err := Compile(Spec{Kind: KindGBNF, Source: `root ::= root "a"`})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Validate(); err == nil {
		t.Error("a grammar with no finite text validated")
	}
}

// TestAmbiguousBounded: a highly ambiguous grammar (S → S S S | S S | a |
// ε) costs Earley time growing with the text at every lexeme; the
// completions bound stops it with ErrTooComplex instead of the worker
// spending minutes a token (the bound is lowered here to keep the test
// short).
func TestAmbiguousBounded(t *testing.T) {
	g, err := Compile(Spec{Kind: KindGBNF, Source: "root ::= s\ns ::= s s s | s s | \"a\" | \"\""})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConstraint(g, mustByteVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	c.p.maxWork = 1 << 12
	m := c.NewMatcher()
	n := 0
	for ; n < 2000 && m.Err() == nil; n++ {
		if !m.AcceptBytes([]byte("a")) && m.Err() == nil {
			t.Fatalf("byte %d refused", n)
		}
	}
	if m.Err() != ErrTooComplex {
		t.Fatalf("Err = %v after %d bytes, want ErrTooComplex", m.Err(), n)
	}
}

// TestErasedComplements: a key lexeme that must be none of some known
// names (And(name, Not(names)), as JSON Schema's additional properties
// compile) takes its masks from the plain name state plus a walk of the
// names' prefixes (viaErased), and they agree with Accept.
func TestErasedComplements(t *testing.T) {
	for _, bare := range []bool{false, true} {
		testErasedComplements(t, bare)
	}
}

func testErasedComplements(t *testing.T, bare bool) {
	r := rand.New(rand.NewPCG(16, 17))
	v := randomVocab(t, r, `{}:1abc",`, 2500, 6)
	var b Builder
	obj := b.NewRule("obj")
	members := b.NewRule("members")
	names := Or(Lit("ab"), Lit("abc"), Lit("b"), Lit("ca"))
	name := Plus(Class(RuneRange{'a', 'c'}))
	other := Concat(Lit(`"`), And(name, Not(names)), Lit(`"`))
	if bare {
		other = And(name, Not(names)) // the complement ends the lexeme
	}
	known := Concat(Lit(`"`), Or(Lit("ab"), Lit("abc")), Lit(`"`))
	b.AddAlt(obj, T(Lit("{")), N(members), T(Lit("}")))
	b.AddAlt(members, T(known), T(Lit(":")), T(Lit("1")))
	b.AddAlt(members, T(other), T(Lit(":")), T(Lit("11")))
	b.AddAlt(members, N(members), T(Lit(",")), T(other), T(Lit(":")), T(Lit("11")))
	g, err := b.Grammar(obj)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConstraint(g, v)
	if err != nil {
		t.Fatal(err)
	}
	checkMasks(t, c, r, 40, 30)
	if bare {
		return
	}
	m := c.NewMatcher()
	if !m.AcceptBytes([]byte(`{"`)) {
		t.Fatal("refused")
	}
	c.mu.Lock()
	e := c.viaErased(m.lex)
	c.mu.Unlock()
	if e == nil {
		t.Fatal("the key state was not taken from its erased state")
	}
	for _, bad := range []string{`{"b":11}`, `{"ab":11}`, `{"ca":11}`} {
		if ok, _ := MatchString(g, bad); ok {
			t.Errorf("%s matched: a known name as another key", bad)
		}
	}
	for _, good := range []string{`{"ab":1}`, `{"bb":11}`, `{"cab":11}`, `{"a":11}`} {
		if ok, _ := MatchString(g, good); !ok {
			t.Errorf("%s refused", good)
		}
	}
}

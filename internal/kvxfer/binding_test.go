package kvxfer

import (
	"slices"
	"testing"
)

var testFP = Fingerprint{Model: "m", Digest: "sha256:0", Layers: 2, KVHeads: 2, HeadDim: 16, DType: "bf16", PageSize: 4}

func ids(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// TestChainSeedCoversTheFingerprint: every field of the fingerprint
// changes the seed, so chains of models whose KV differs never meet.
func TestChainSeedCoversTheFingerprint(t *testing.T) {
	base := ChainSeed(testFP)
	if ChainSeed(testFP) != base {
		t.Fatal("the seed is not a function of the fingerprint")
	}
	changes := map[string]func(*Fingerprint){
		"model":     func(f *Fingerprint) { f.Model = "n" },
		"digest":    func(f *Fingerprint) { f.Digest = "sha256:1" },
		"layers":    func(f *Fingerprint) { f.Layers++ },
		"kv_heads":  func(f *Fingerprint) { f.KVHeads++ },
		"head_dim":  func(f *Fingerprint) { f.HeadDim++ },
		"dtype":     func(f *Fingerprint) { f.DType = "f16" },
		"page_size": func(f *Fingerprint) { f.PageSize++ },
		// Strings are length-prefixed: moving a byte from one field to the
		// next is another fingerprint.
		"field boundary": func(f *Fingerprint) { f.Model, f.Digest = "msha256:0", "" },
	}
	for name, change := range changes {
		fp := testFP
		change(&fp)
		if ChainSeed(fp) == base {
			t.Errorf("changing %s leaves the seed unchanged", name)
		}
	}
}

// TestPromptChain: page i's hash names the model and every token up to the
// end of page i: the chain of a prompt is a prefix of the chain of any
// longer prompt over its full pages (what a prefix cache looks up), and any
// change to a token changes the hash of its page and of every later page.
func TestPromptChain(t *testing.T) {
	seed := ChainSeed(testFP)
	prompt := ids(1, 10) // pages of 4: [1..4] [5..8] [9 10]
	chain := AppendPromptChain(nil, seed, prompt, 4)
	if len(chain) != 3 {
		t.Fatalf("%d hashes for 3 pages", len(chain))
	}
	want := []PageHash{ChainPage(seed, prompt[:4])}
	want = append(want, ChainPage(want[0], prompt[4:8]))
	want = append(want, ChainPage(want[1], prompt[8:]))
	if !slices.Equal(chain, want) {
		t.Fatalf("chain %v, want %v", chain, want)
	}
	longer := AppendPromptChain(nil, seed, ids(1, 13), 4)
	if !slices.Equal(longer[:2], chain[:2]) {
		t.Error("full pages of a common prefix hash differently")
	}
	if longer[2] == chain[2] {
		t.Error("a partial page hashes like the full page that extends it")
	}
	for pos := range prompt {
		changed := slices.Clone(prompt)
		changed[pos]++
		c := AppendPromptChain(nil, seed, changed, 4)
		for p := range c {
			if same := c[p] == chain[p]; same != (p < pos/4) {
				t.Errorf("token %d changed: page %d hash same=%v", pos, p, same)
			}
		}
	}
	if other := AppendPromptChain(nil, ChainSeed(Fingerprint{Model: "other"}), prompt, 4); other[0] == chain[0] {
		t.Error("another model's first page hashes the same")
	}
	if got := AppendPromptChain(chain[:1:1], seed, prompt, 4); !slices.Equal(got[1:], chain) || got[0] != chain[0] {
		t.Error("AppendPromptChain does not append")
	}
	if got := AppendPromptChain(nil, seed, nil, 4); len(got) != 0 {
		t.Errorf("an empty prompt has %d page hashes", len(got))
	}
	// Pages longer than the stack buffer hash the same way.
	big := ids(7, 200)
	if a, b := ChainPage(seed, big), ChainPage(seed, slices.Clone(big)); a != b || a == ChainPage(seed, big[:199]) {
		t.Error("a 200-token page does not hash by its tokens")
	}
}

// TestBindKV: the binding changes with the room, the gen, the prompt's
// length, the number of pages, any page's hash and the constraint.
func TestBindKV(t *testing.T) {
	seed := ChainSeed(testFP)
	rg := RoomGen{Room: Room{1, 2, 3}, Gen: 1}
	chain := AppendPromptChain(nil, seed, ids(1, 10), 4)
	base := BindKV(rg, 10, chain)
	if BindKV(rg, 10, slices.Clone(chain)) != base {
		t.Fatal("the binding is not a function of its inputs")
	}
	other := map[string]Binding{
		"room":       BindKV(RoomGen{Room: Room{1, 2, 4}, Gen: 1}, 10, chain),
		"gen":        BindKV(RoomGen{Room: rg.Room, Gen: 2}, 10, chain),
		"tokens":     BindKV(rg, 9, chain),
		"pages":      BindKV(rg, 10, chain[:2]),
		"prompt":     BindKV(rg, 10, AppendPromptChain(nil, seed, ids(2, 10), 4)),
		"model":      BindKV(rg, 10, AppendPromptChain(nil, ChainSeed(Fingerprint{}), ids(1, 10), 4)),
		"order":      BindKV(rg, 10, []PageHash{chain[1], chain[0], chain[2]}),
		"constraint": BindKVConstrained(rg, 10, chain, "ab"),
	}
	if BindKVConstrained(rg, 10, chain, "") != base {
		t.Error("no constraint does not bind as BindKV")
	}
	if BindKVConstrained(rg, 10, chain, "ab") == BindKVConstrained(rg, 10, chain, "ac") {
		t.Error("two constraints bind the same")
	}
	for name, b := range other {
		if b == base {
			t.Errorf("another %s binds the same", name)
		}
	}
}

// TestBindingPinned pins the hash definitions: a worker of another build
// must compute the same page hashes and bindings, so a change here is a
// change of the protocol (bump ProtocolVersion). The values were computed
// apart from this package, with Python's hashlib from the definitions in
// binding.go (domain strings, little-endian fields, length-prefixed
// strings, SHA-256 cut to 16 bytes).
func TestBindingPinned(t *testing.T) {
	seed := ChainSeed(testFP)
	chain := AppendPromptChain(nil, seed, ids(1, 10), 4)
	b := BindKV(RoomGen{Room: Room{15: 1}, Gen: 1}, 10, chain)
	const (
		wantSeed    = "60e0f0c324d4fb6bead49078c0bede00"
		wantLast    = "4a9e80f89038342ed8225f74c75972ce"
		wantBinding = "16f45adc48b33ed4e25eb61f92a190fc"
	)
	if seed.String() != wantSeed || chain[2].String() != wantLast || b.String() != wantBinding {
		t.Fatalf("seed %s, last page %s, binding %s", seed, chain[2], b)
	}
	// The digest of grammar.Spec{Kind: KindChoice, Source: `["yes","no"]`}.
	const digest = "f530fc07f4ba6e0b094312d1408484edca2d184d9f22e48613817442fcb97022"
	if c := BindKVConstrained(RoomGen{Room: Room{15: 1}, Gen: 1}, 10, chain, digest); c.String() != "e7bcc16680402b935ea13ba207447695" {
		t.Fatalf("constrained binding %s", c)
	}
}

func BenchmarkPromptChain(b *testing.B) {
	seed := ChainSeed(testFP)
	prompt := ids(0, 8192)
	var chain []PageHash
	b.SetBytes(int64(4 * len(prompt)))
	for b.Loop() {
		chain = AppendPromptChain(chain[:0], seed, prompt, 16)
		_ = BindKV(RoomGen{}, uint32(len(prompt)), chain)
	}
}

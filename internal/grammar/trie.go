package grammar

import (
	"bytes"
	"slices"
)

// trie is the vocabulary's byte strings as a trie laid out in depth-first
// order: node i's subtree is nodes i…end[i]−1, so a walk that rejects a
// node skips its subtree with one assignment. Node 0 is the root (the empty
// string). Tokens whose byte strings are equal share a node.
type trie struct {
	b        []byte   // the byte on the edge into node i
	parent   []int32  // node i's parent (−1 for the root)
	depth    []uint16 // node i's depth (root 0)
	end      []int32  // one past node i's subtree
	tokLo    []int32  // toks[tokLo[i]:tokLo[i+1]] end at node i
	toks     []int32
	maxDepth int
	// packed[i] is b[i] | depth[i]<<8, and tok1[i] the token ending at
	// node i (−1 none, −2 several: see toks), for the walks' inner loops.
	packed []uint32
	tok1   []int32
	// nodes holds packed, end and tok1 side by side for the full walk.
	nodes []tnode
}

// tnode is a trie node as the full walk reads it: one load for the three.
type tnode struct {
	p   uint32 // byte | depth<<8
	end int32
	tok int32
}

// buildTrie builds the trie of tokens, leaving out empty strings and the
// EOS ids (which a matcher allows by itself).
func buildTrie(tokens [][]byte, isEOS []bool) *trie {
	ids := make([]int32, 0, len(tokens))
	for i, t := range tokens {
		if len(t) > 0 && !isEOS[i] && len(t) <= maxTokenBytes {
			ids = append(ids, int32(i))
		}
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(tokens[a], tokens[b]) })
	t := &trie{}
	var stack []int32
	newNode := func(c byte, d int) int32 {
		p := int32(-1)
		if len(stack) > 0 {
			p = stack[len(stack)-1]
		}
		t.parent = append(t.parent, p)
		t.b = append(t.b, c)
		t.depth = append(t.depth, uint16(d))
		t.end = append(t.end, 0)
		t.tokLo = append(t.tokLo, int32(len(t.toks)))
		t.maxDepth = max(t.maxDepth, d)
		return int32(len(t.b) - 1)
	}
	stack = append(stack, newNode(0, 0))
	var prev []byte
	for _, id := range ids {
		s := tokens[id]
		lcp := 0
		for lcp < len(s) && lcp < len(prev) && s[lcp] == prev[lcp] {
			lcp++
		}
		for len(stack) > lcp+1 {
			t.end[stack[len(stack)-1]] = int32(len(t.b))
			stack = stack[:len(stack)-1]
		}
		for d := lcp; d < len(s); d++ {
			stack = append(stack, newNode(s[d], d+1))
		}
		// Tokens are added in node order, so each node's run is contiguous.
		t.toks = append(t.toks, id)
		prev = s
	}
	for len(stack) > 0 {
		t.end[stack[len(stack)-1]] = int32(len(t.b))
		stack = stack[:len(stack)-1]
	}
	// tokLo[i] was the count before node i was created; a node's tokens
	// were appended while it was the newest node, so the run of node i is
	// toks[tokLo[i]:tokLo[i+1]].
	t.tokLo = append(t.tokLo, int32(len(t.toks)))
	t.nodes = make([]tnode, len(t.b))
	t.packed = make([]uint32, len(t.b))
	t.tok1 = make([]int32, len(t.b))
	for i := range t.b {
		t.packed[i] = uint32(t.b[i]) | uint32(t.depth[i])<<8
		switch n := t.tokLo[i+1] - t.tokLo[i]; n {
		case 0:
			t.tok1[i] = -1
		case 1:
			t.tok1[i] = t.toks[t.tokLo[i]]
		default:
			t.tok1[i] = -2
		}
		t.nodes[i] = tnode{t.packed[i], t.end[i], t.tok1[i]}
	}
	return t
}

// maxTokenBytes is the longest token a grammar may allow (longer ones,
// which no common vocabulary has, are never allowed): the walks keep
// their states in a [256] array indexed by depth.
const maxTokenBytes = 255

// setToks sets in mask the bits of the tokens ending at node i.
func (t *trie) setToks(mask []uint64, i int32) {
	switch id := t.tok1[i]; {
	case id >= 0:
		mask[id>>6] |= 1 << (id & 63)
	case id == -2:
		for _, id := range t.toks[t.tokLo[i]:t.tokLo[i+1]] {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
}

package grammar

import (
	"bytes"
	"slices"
)

// trie is the vocabulary's byte strings as a trie laid out in depth-first
// order: node i's subtree is nodes i…nodes[i].end−1, so a walk that rejects
// a node skips its subtree with one assignment. Node 0 is the root (the
// empty string). Tokens whose byte strings are equal share a node.
type trie struct {
	// nodes holds, per node, its edge byte and depth, the end of its
	// subtree and the token ending there: one load for the walks.
	nodes    []tnode
	parent   []int32 // node i's parent (−1 for the root)
	tokLo    []int32 // toks[tokLo[i]:tokLo[i+1]] end at node i
	toks     []int32
	maxDepth int
}

// tnode is a trie node as the walks read it.
type tnode struct {
	p   uint32 // the edge byte into the node | its depth<<8 (root 0)
	end int32  // one past the node's subtree
	tok int32  // the token ending at the node: −1 none, −2 several (see toks)
}

func (n *tnode) byte() byte { return byte(n.p) }
func (n *tnode) depth() int { return int(n.p >> 8) }

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
		t.nodes = append(t.nodes, tnode{p: uint32(c) | uint32(d)<<8})
		t.tokLo = append(t.tokLo, int32(len(t.toks)))
		t.maxDepth = max(t.maxDepth, d)
		return int32(len(t.nodes) - 1)
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
			t.nodes[stack[len(stack)-1]].end = int32(len(t.nodes))
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
		t.nodes[stack[len(stack)-1]].end = int32(len(t.nodes))
		stack = stack[:len(stack)-1]
	}
	// tokLo[i] was the count before node i was created; a node's tokens
	// were appended while it was the newest node, so the run of node i is
	// toks[tokLo[i]:tokLo[i+1]].
	t.tokLo = append(t.tokLo, int32(len(t.toks)))
	for i := range t.nodes {
		switch n := t.tokLo[i+1] - t.tokLo[i]; n {
		case 0:
			t.nodes[i].tok = -1
		case 1:
			t.nodes[i].tok = t.toks[t.tokLo[i]]
		default:
			t.nodes[i].tok = -2
		}
	}
	return t
}

// setToks sets in mask the bits of the tokens ending at node i.
func (t *trie) setToks(mask []uint64, i int32) {
	switch id := t.nodes[i].tok; {
	case id >= 0:
		mask[id>>6] |= 1 << (id & 63)
	case id == -2:
		for _, id := range t.toks[t.tokLo[i]:t.tokLo[i+1]] {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
}

// maxTokenBytes is the longest token a grammar may allow (longer ones,
// which no common vocabulary has, are never allowed): the walks keep
// their states in a [256] array indexed by depth.
const maxTokenBytes = 255

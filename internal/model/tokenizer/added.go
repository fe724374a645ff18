package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's "added_tokens" (Hugging Face
// tokenizers' AddedToken): a token matched in the text before any other
// processing, special (BOS, EOS, chat markup) or not (Qwen's "<think>").
type addedToken struct {
	ID      int32  `json:"id"`
	Content string `json:"content"`
	// SingleWord: match only where no word character touches either end.
	SingleWord bool `json:"single_word"`
	// LStrip, RStrip: the match swallows the white space on its left or
	// right.
	LStrip bool `json:"lstrip"`
	RStrip bool `json:"rstrip"`
	// Normalized: match against the normalized text (the content is
	// normalized too), not the raw text.
	Normalized bool `json:"normalized"`
	Special    bool `json:"special"`
}

// segment is a piece of the input: an added token (id >= 0) or text to
// normalize, pre-tokenize and tokenize with the model (id < 0).
type segment struct {
	text string
	id   int32
}

// trie finds added tokens in text: leftmost match first and, among the
// matches starting there, the longest, like the Aho-Corasick automaton
// (MatchKind::LeftmostLongest) of tokenizers' AddedVocabulary.
type trie struct {
	// edges maps node<<8 | byte to the child node; node 0 is the root.
	edges map[uint32]int32
	// tok[node] is the index (in addedVocab.tokens) of the token ending
	// at node, or -1.
	tok []int32
	// first marks the bytes that start some token.
	first [256]bool
}

func newTrie() *trie { return &trie{edges: map[uint32]int32{}, tok: []int32{-1}} }

func (t *trie) add(s string, tokIndex int32) {
	if s == "" {
		return
	}
	t.first[s[0]] = true
	node := int32(0)
	for i := 0; i < len(s); i++ {
		key := uint32(node)<<8 | uint32(s[i])
		child, ok := t.edges[key]
		if !ok {
			child = int32(len(t.tok))
			t.tok = append(t.tok, -1)
			t.edges[key] = child
		}
		node = child
	}
	if t.tok[node] < 0 { // the first token with this content wins
		t.tok[node] = tokIndex
	}
}

// longestAt returns the token index and end of the longest token at s[i:],
// or -1.
func (t *trie) longestAt(s string, i int) (tok int32, end int) {
	tok, node := -1, int32(0)
	for j := i; j < len(s); j++ {
		child, ok := t.edges[uint32(node)<<8|uint32(s[j])]
		if !ok {
			break
		}
		node = child
		if t.tok[node] >= 0 {
			tok, end = t.tok[node], j+1
		}
	}
	return tok, end
}

func (t *trie) empty() bool { return len(t.tok) == 1 }

// addedVocab holds the added tokens and their matchers.
type addedVocab struct {
	tokens []addedToken
	// raw matches the tokens with normalized == false in the input text;
	// norm the others in the normalized text between them.
	raw, norm *trie
	// special holds the ids of the tokens marked special.
	special map[int32]bool
}

func newAddedVocab(tokens []addedToken, n normalizer) *addedVocab {
	v := &addedVocab{tokens: tokens, raw: newTrie(), norm: newTrie(), special: map[int32]bool{}}
	for i, tok := range tokens {
		if tok.Special {
			v.special[tok.ID] = true
		}
		if tok.Normalized {
			content := tok.Content
			if n != nil {
				content = n.normalize(content)
			}
			v.norm.add(content, int32(i))
		} else {
			v.raw.add(tok.Content, int32(i))
		}
	}
	return v
}

// appendSegments appends the segments of text: added tokens, and the
// (normalized) text between them, following tokenizers'
// AddedVocabulary::extract_and_normalize: the non-normalized tokens are
// found in the raw text, the text between them is normalized, and the
// normalized tokens are found in that. Empty text segments are dropped.
func (v *addedVocab) appendSegments(dst []segment, text string, n normalizer) []segment {
	start := len(dst)
	dst = v.split(dst, text, v.raw)
	if n == nil && v.norm.empty() {
		return dst
	}
	// Normalize the text segments and split them on the normalized tokens.
	var tmp []segment
	tmp = append(tmp, dst[start:]...)
	dst = dst[:start]
	for _, seg := range tmp {
		if seg.id >= 0 {
			dst = append(dst, seg)
			continue
		}
		s := seg.text
		if n != nil {
			s = n.normalize(s)
		}
		dst = v.split(dst, s, v.norm)
	}
	return dst
}

// split appends the segments of s cut at the tokens of t, applying their
// single_word, lstrip and rstrip options as tokenizers'
// AddedVocabulary::find_matches does.
func (v *addedVocab) split(dst []segment, s string, t *trie) []segment {
	if t.empty() {
		if s != "" {
			dst = append(dst, segment{text: s, id: -1})
		}
		return dst
	}
	done := 0 // s[:done] is in dst
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		ti, end := t.longestAt(s, i)
		if ti < 0 {
			i++
			continue
		}
		tok := &v.tokens[ti]
		start, stop := i, end
		i = end // a rejected match is skipped whole, as in find_iter
		if tok.SingleWord {
			if start > 0 && endsWithWord(s[:start]) || stop < len(s) && startsWithWord(s[stop:]) {
				continue
			}
		}
		if tok.LStrip {
			start = max(trailingSpaceStart(s[:start]), done)
		}
		if tok.RStrip {
			stop += leadingSpaceLen(s[stop:])
			i = stop
		}
		start = max(start, done)
		if done < start {
			dst = append(dst, segment{text: s[done:start], id: -1})
		}
		dst = append(dst, segment{text: s[start:stop], id: tok.ID})
		done = stop
	}
	if done < len(s) {
		dst = append(dst, segment{text: s[done:], id: -1})
	}
	return dst
}

// isWordChar reports whether r is matched by \w of Rust's regex crate
// (Unicode: Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control), which tokenizers uses for single_word.
func isWordChar(r rune) bool {
	if r < utf8.RuneSelf {
		return r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Join_Control, r)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// trailingSpaceStart returns where the white space (Unicode White_Space)
// at the end of s starts.
func trailingSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= size
	}
	return i
}

// leadingSpaceLen returns the length of the white space at the start of s.
func leadingSpaceLen(s string) int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += size
	}
	return i
}

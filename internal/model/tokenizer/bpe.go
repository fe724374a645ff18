package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// Cache bounds of the BPE model, those of Hugging Face tokenizers
// (tokenizers/src/models/bpe/model.rs: DEFAULT_CACHE_CAPACITY 10_000,
// MAX_LENGTH 256).
const (
	// cacheCapacity is the number of pre-tokens whose ids are cached.
	cacheCapacity = 10000
	// cacheMaxWordBytes is the longest pre-token cached, in bytes.
	cacheMaxWordBytes = 256
)

// bpe is the BPE model of tokenizer.json (tokenizers/src/models/bpe/).
type bpe struct {
	vocab map[string]int32
	// merges maps a pair of ids (left<<32 | right) to its merge: the rank
	// (position in the merges list; lower merges first) in the high 32
	// bits, the id of the merged token in the low 32 bits.
	merges map[uint64]uint64
	unk    int32 // -1: none
	fuse   bool  // fuse_unk: consecutive unknown characters give one unk
	// byteFallback: an unknown character is written as its bytes' tokens
	// "<0x..>".
	byteFallback bool
	// ignoreMerges: a pre-token that is in the vocabulary is one token.
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	// byteLevel: pre-tokens are turned into byte-level characters
	// (ByteLevel pre-tokenizer) before the vocabulary lookup.
	byteLevel bool
	alpha     *byteAlphabet
	// byteIDs[b] is the id of the byte-level character of byte b, or -1
	// (used when byteLevel and no prefix or suffix).
	byteIDs [256]int32

	cacheMu sync.RWMutex
	cache   map[string][]int32 // nil: caching disabled
}

// bpeJSON holds the fields of a BPE model in tokenizer.json.
type bpeJSON struct {
	Type                    string
	Dropout                 *float64
	UnkToken                *string
	ContinuingSubwordPrefix *string
	EndOfWordSuffix         *string
	FuseUnk                 bool
	ByteFallback            bool
	IgnoreMerges            bool
	Vocab                   []byte
	Merges                  []byte
}

// parseBPE builds the model of tokenizer.json's "model".
func parseBPE(raw []byte, byteLevel bool) (*bpe, error) {
	members, err := objectMembers(raw)
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	j := bpeJSON{Vocab: members["vocab"], Merges: members["merges"]}
	for _, f := range []struct {
		key string
		dst any
	}{
		{"type", &j.Type}, {"dropout", &j.Dropout}, {"unk_token", &j.UnkToken},
		{"continuing_subword_prefix", &j.ContinuingSubwordPrefix}, {"end_of_word_suffix", &j.EndOfWordSuffix},
		{"fuse_unk", &j.FuseUnk}, {"byte_fallback", &j.ByteFallback}, {"ignore_merges", &j.IgnoreMerges},
	} {
		if v, ok := members[f.key]; ok && !isNull(v) {
			if err := json.Unmarshal(v, f.dst); err != nil {
				return nil, fmt.Errorf("model: %s: %v", f.key, err)
			}
		}
	}
	switch {
	case j.Type == "BPE", j.Type == "" && j.Merges != nil:
	case j.Type == "":
		return nil, fmt.Errorf("model: no type and no merges; only BPE models are supported")
	default:
		return nil, fmt.Errorf("model: unsupported type %q (only BPE is supported)", j.Type)
	}
	if j.Dropout != nil && *j.Dropout > 0 {
		return nil, fmt.Errorf("model: BPE dropout %g is not supported (it makes tokenization random)", *j.Dropout)
	}
	if isNull(j.Vocab) {
		return nil, fmt.Errorf("model: no vocab")
	}
	vocab, err := parseVocab(j.Vocab)
	if err != nil {
		return nil, fmt.Errorf("model: vocab: %v", err)
	}
	if len(vocab) == 0 {
		return nil, fmt.Errorf("model: empty vocab")
	}
	m := &bpe{
		vocab:        vocab,
		unk:          -1,
		fuse:         j.FuseUnk,
		byteFallback: j.ByteFallback,
		ignoreMerges: j.IgnoreMerges,
		byteLevel:    byteLevel,
		cache:        make(map[string][]int32),
	}
	if j.ContinuingSubwordPrefix != nil {
		m.prefix = *j.ContinuingSubwordPrefix
	}
	if j.EndOfWordSuffix != nil {
		m.suffix = *j.EndOfWordSuffix
	}
	if j.UnkToken != nil {
		id, ok := vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model: unk_token %q is not in the vocab", *j.UnkToken)
		}
		m.unk = id
	}
	if byteLevel {
		m.alpha = newByteAlphabet()
		for b := range m.byteIDs {
			id, ok := vocab[string(m.alpha.toRune[b])]
			if !ok {
				id = -1
			}
			m.byteIDs[b] = id
		}
	}
	var pairs [][2]string
	if !isNull(j.Merges) {
		if pairs, err = parseMergeList(j.Merges); err != nil {
			return nil, fmt.Errorf("model: merges: %v", err)
		}
	}
	m.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, ok := vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("model: merge %d (%q %q): %q is not in the vocab", rank, p[0], p[1], p[0])
		}
		b, ok := vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("model: merge %d (%q %q): %q is not in the vocab", rank, p[0], p[1], p[1])
		}
		right := p[1]
		if m.prefix != "" {
			right = strings.TrimPrefix(right, m.prefix)
		}
		c, ok := vocab[p[0]+right]
		if !ok {
			return nil, fmt.Errorf("model: merge %d (%q %q): %q is not in the vocab", rank, p[0], p[1], p[0]+right)
		}
		// A repeated pair keeps its last rank, as tokenizers' HashMap does.
		m.merges[uint64(a)<<32|uint64(uint32(b))] = uint64(rank)<<32 | uint64(uint32(c))
	}
	return m, nil
}

// bpeScratch is the working memory of one tokenize call.
type bpeScratch struct {
	syms  []symbol
	heap  mergeHeap
	bytes []byte
}

// symbol is one token of a word being merged (tokenizers' Symbol): a doubly
// linked list over a slice, dead once merged into its left neighbour.
type symbol struct {
	id         int32
	prev, next int32 // -1: none
	dead       bool
}

// appendTokens appends the ids of the pre-token word, with the cache.
func (m *bpe) appendTokens(dst []int32, word string, sc *bpeScratch) []int32 {
	cacheable := m.cache != nil && len(word) <= cacheMaxWordBytes
	if cacheable {
		m.cacheMu.RLock()
		ids, ok := m.cache[word]
		m.cacheMu.RUnlock()
		if ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	dst = m.tokenize(dst, word, sc)
	if cacheable {
		ids := append([]int32(nil), dst[start:]...)
		m.cacheMu.Lock()
		if len(m.cache) >= cacheCapacity {
			// Bounded: start afresh rather than track recency.
			clear(m.cache)
		}
		m.cache[strings.Clone(word)] = ids
		m.cacheMu.Unlock()
	}
	return dst
}

// tokenize appends the ids of word, following tokenizers' BPE::tokenize:
// with ignore_merges a word in the vocabulary is one token; otherwise each
// character becomes a symbol (unknown ones byte tokens with byte_fallback,
// else the unk token, else nothing) and merges are applied lowest rank
// first (Word::merge_all).
func (m *bpe) tokenize(dst []int32, word string, sc *bpeScratch) []int32 {
	if word == "" {
		return dst
	}
	if !m.byteLevel {
		if m.ignoreMerges {
			if id, ok := m.vocab[word]; ok {
				return append(dst, id)
			}
		}
		return m.mergeChars(dst, word, sc)
	}
	mapped := func() string {
		sc.bytes = m.alpha.appendRunes(sc.bytes[:0], word)
		return string(sc.bytes)
	}
	if m.ignoreMerges {
		sc.bytes = m.alpha.appendRunes(sc.bytes[:0], word)
		if id, ok := m.vocab[string(sc.bytes)]; ok {
			return append(dst, id)
		}
	}
	if m.prefix != "" || m.suffix != "" {
		return m.mergeChars(dst, mapped(), sc)
	}
	// Fast path: one symbol per byte, from a table.
	sc.syms = sc.syms[:0]
	for i := 0; i < len(word); i++ {
		id := m.byteIDs[word[i]]
		if id < 0 {
			// The vocabulary lacks a byte: take the general path,
			// which knows unk and byte fallback.
			return m.mergeChars(dst, mapped(), sc)
		}
		sc.syms = append(sc.syms, symbol{id: id})
	}
	return m.merge(dst, sc)
}

// mergeChars builds the symbols of text one character at a time
// (tokenizers' BPE::merge_word) and merges them.
func (m *bpe) mergeChars(dst []int32, text string, sc *bpeScratch) []int32 {
	sc.syms = sc.syms[:0]
	unk, unkPending := int32(-1), false
	flushUnk := func() {
		if unkPending {
			sc.syms = append(sc.syms, symbol{id: unk})
			unkPending = false
		}
	}
	var buf []byte
	for i := 0; i < len(text); {
		_, size := utf8.DecodeRuneInString(text[i:])
		s := text[i : i+size]
		if m.prefix != "" || m.suffix != "" {
			buf = buf[:0]
			if i > 0 {
				buf = append(buf, m.prefix...)
			}
			buf = append(buf, s...)
			if i+size == len(text) {
				buf = append(buf, m.suffix...)
			}
			s = string(buf)
		}
		i += size
		if id, ok := m.vocab[s]; ok {
			flushUnk()
			sc.syms = append(sc.syms, symbol{id: id})
			continue
		}
		if m.byteFallback {
			if ids, ok := m.byteTokens(s); ok {
				flushUnk()
				for _, id := range ids {
					sc.syms = append(sc.syms, symbol{id: id})
				}
				continue
			}
		}
		if m.unk >= 0 {
			if unkPending && !m.fuse {
				flushUnk()
			}
			unk, unkPending = m.unk, true
		}
		// Without an unk token the character is dropped, as in
		// tokenizers.
	}
	flushUnk()
	return m.merge(dst, sc)
}

// byteTokens returns the ids of the tokens "<0xXX>" of the bytes of s, if
// the vocabulary has all of them.
func (m *bpe) byteTokens(s string) ([]int32, bool) {
	ids := make([]int32, 0, len(s))
	for i := 0; i < len(s); i++ {
		id, ok := m.vocab[fmt.Sprintf("<0x%02X>", s[i])]
		if !ok {
			return nil, false
		}
		ids = append(ids, id)
	}
	return ids, true
}

// merge applies the merges to sc.syms and appends the resulting ids. The
// order is that of tokenizers' Word::merge_all: a min-heap of candidate
// pairs by (rank, position); an entry whose pair no longer yields the same
// merged token is stale and skipped. O(n log n) in the word length.
func (m *bpe) merge(dst []int32, sc *bpeScratch) []int32 {
	syms := sc.syms
	n := len(syms)
	for i := range syms {
		syms[i].prev, syms[i].next = int32(i-1), int32(i+1)
	}
	if n > 0 {
		syms[n-1].next = -1
	}
	h := sc.heap[:0]
	for i := 0; i+1 < n; i++ {
		if mv, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, mergeCand{rank: uint32(mv >> 32), pos: int32(i), id: int32(uint32(mv))})
		}
	}
	h.init()
	for len(h) > 0 {
		top := h.pop()
		left := &syms[top.pos]
		if left.dead || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		mv, ok := m.merges[pairKey(left.id, right.id)]
		if !ok || int32(uint32(mv)) != top.id {
			continue // stale
		}
		left.id = top.id
		right.dead = true
		left.next = right.next
		if left.next >= 0 {
			syms[left.next].prev = top.pos
		}
		if left.prev >= 0 {
			if mv, ok := m.merges[pairKey(syms[left.prev].id, left.id)]; ok {
				h.push(mergeCand{rank: uint32(mv >> 32), pos: left.prev, id: int32(uint32(mv))})
			}
		}
		if left.next >= 0 {
			if mv, ok := m.merges[pairKey(left.id, syms[left.next].id)]; ok {
				h.push(mergeCand{rank: uint32(mv >> 32), pos: top.pos, id: int32(uint32(mv))})
			}
		}
	}
	sc.heap = h
	for i := 0; i >= 0 && i < n; i = int(syms[i].next) {
		dst = append(dst, syms[i].id)
	}
	return dst
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// mergeCand is a candidate merge of the symbol at pos with its right
// neighbour into token id.
type mergeCand struct {
	rank uint32
	pos  int32
	id   int32
}

func (a mergeCand) less(b mergeCand) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// mergeHeap is a binary min-heap of candidates (no container/heap: it
// would box every element).
type mergeHeap []mergeCand

func (h mergeHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	*h = s[:last]
	h.down(0)
	return top
}

func (h mergeHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		small := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			small = r
		}
		if !h[small].less(h[i]) {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

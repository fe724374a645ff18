package tokenizer

import (
	"container/heap"
	"fmt"
	"strings"
	"unicode/utf8"
)

// spmModel is a SentencePiece vocabulary tokenized as llama.cpp's
// llm_tokenizer_spm does (llama-vocab.cpp) for GGUF files of
// tokenizer.ggml.model "llama": the text (spaces written as "▁", U+2581)
// is cut into UTF-8 characters, and the adjacent pair whose concatenation
// is the vocabulary token of highest score (ties: the leftmost) is merged
// until no pair is a token; a final piece that is not a token is split
// back along its merges, and characters that are not tokens become their
// bytes' "<0xXX>" tokens (or unk).
type spmModel struct {
	vocab    map[string]int32
	scores   []float32
	byteID   [256]int32 // -1: no byte token
	unk      int32      // -1: none
	addSpace bool       // add_space_prefix: a space before text that follows the start or a special token
}

// newSPMTokenizer builds a Tokenizer over a SentencePiece vocabulary.
// Control, user-defined and unknown tokens are matched in the text first.
func newSPMTokenizer(tokens []string, scores []float32, types []int32, unk int32, addSpace bool) *Tokenizer {
	m := &spmModel{vocab: make(map[string]int32, len(tokens)), scores: scores, unk: unk, addSpace: addSpace}
	for i := range m.byteID {
		m.byteID[i] = -1
	}
	var added []addedToken
	t := &Tokenizer{spm: m, bos: -1, vocabSize: len(tokens), idTokens: tokens, idText: make([]string, len(tokens))}
	t.pool.New = func() any { return new(encodeScratch) }
	for i, tok := range tokens {
		if _, dup := m.vocab[tok]; !dup {
			m.vocab[tok] = int32(i)
		}
		text := strings.ReplaceAll(tok, "▁", " ")
		switch types[i] {
		case ggufByte:
			if len(tok) == 6 && tok[:3] == "<0x" && tok[5] == '>' {
				if b, ok := hexByte(tok[3], tok[4]); ok {
					m.byteID[b] = int32(i)
					text = string([]byte{b})
				}
			}
		case ggufControl, ggufUserDefined, ggufUnknown:
			added = append(added, addedToken{ID: int32(i), Content: tok, Special: types[i] != ggufUserDefined})
			text = tok
		}
		t.idText[i] = text
	}
	t.added = newAddedVocab(added, nil)
	return t
}

// encodeSPM is Encode for a SentencePiece vocabulary (llama.cpp's
// tokenize_impl for LLAMA_VOCAB_TYPE_SPM): special tokens written in the
// text are recognised, and each piece of text between them gets a leading
// space when add_space_prefix is set and it comes first or after a special
// token.
func (t *Tokenizer) encodeSPM(text string, addSpecial bool) []int32 {
	ids := make([]int32, 0, len(text)/2+2)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	prevSpecial := true
	var st spmState
	for _, seg := range t.added.appendSegments(nil, text, nil) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			prevSpecial = true
			continue
		}
		s := seg.text
		if t.spm.addSpace && prevSpecial {
			s = " " + s
		}
		ids = t.spm.tokenize(ids, strings.ReplaceAll(s, " ", "▁"), &st)
		prevSpecial = false
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids
}

// spmSymbol is a piece of the text being merged: text[start:start+n].
type spmSymbol struct {
	start, n   int
	prev, next int
}

// spmBigram is a candidate merge of symbols left and right (size bytes).
type spmBigram struct {
	left, right int
	score       float32
	size        int
}

// spmQueue is a max-heap of bigrams: highest score first, then leftmost.
type spmQueue []spmBigram

func (q spmQueue) Len() int { return len(q) }
func (q spmQueue) Less(i, j int) bool {
	return q[i].score > q[j].score || q[i].score == q[j].score && q[i].left < q[j].left
}
func (q spmQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *spmQueue) Push(x any)   { *q = append(*q, x.(spmBigram)) }
func (q *spmQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// spmState is the working memory of one tokenize call.
type spmState struct {
	text  string
	syms  []spmSymbol
	queue spmQueue
	rev   map[string][2]int
}

// tokenize appends the ids of text (spaces already "▁").
func (m *spmModel) tokenize(dst []int32, text string, st *spmState) []int32 {
	if text == "" {
		return dst
	}
	st.text = text
	st.syms = st.syms[:0]
	for off := 0; off < len(text); {
		_, n := utf8.DecodeRuneInString(text[off:])
		i := len(st.syms)
		next := i + 1
		if off+n == len(text) {
			next = -1
		}
		st.syms = append(st.syms, spmSymbol{start: off, n: n, prev: i - 1, next: next})
		off += n
	}
	st.queue = st.queue[:0]
	st.rev = make(map[string][2]int)
	for i := 1; i < len(st.syms); i++ {
		m.tryBigram(st, i-1, i)
	}
	for st.queue.Len() > 0 {
		b := heap.Pop(&st.queue).(spmBigram)
		l, r := &st.syms[b.left], &st.syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // a symbol was merged since
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			st.syms[r.next].prev = b.left
		}
		m.tryBigram(st, l.prev, b.left)
		m.tryBigram(st, b.left, l.next)
	}
	for i := 0; i >= 0; i = st.syms[i].next {
		dst = m.resegment(dst, st, i)
	}
	return dst
}

// tryBigram queues the merge of symbols left and right if their text is a
// token.
func (m *spmModel) tryBigram(st *spmState, left, right int) {
	if left < 0 || right < 0 {
		return
	}
	l, r := st.syms[left], st.syms[right]
	text := st.text[l.start : r.start+r.n]
	id, ok := m.vocab[text]
	if !ok {
		return
	}
	heap.Push(&st.queue, spmBigram{left: left, right: right, score: m.scores[id], size: len(text)})
	st.rev[text] = [2]int{left, right}
}

// resegment appends the ids of symbol i: its token, else the tokens of the
// two symbols it was merged from, else its bytes.
func (m *spmModel) resegment(dst []int32, st *spmState, i int) []int32 {
	s := st.syms[i]
	text := st.text[s.start : s.start+s.n]
	if id, ok := m.vocab[text]; ok {
		return append(dst, id)
	}
	if p, ok := st.rev[text]; ok {
		dst = m.resegment(dst, st, p[0])
		return m.resegment(dst, st, p[1])
	}
	for j := 0; j < len(text); j++ {
		id := m.byteID[text[j]]
		if id < 0 {
			id = m.unk
		}
		if id >= 0 {
			dst = append(dst, id)
		}
	}
	return dst
}

// String describes the model, for errors.
func (m *spmModel) String() string { return fmt.Sprintf("SentencePiece (%d tokens)", len(m.scores)) }

package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// ggufPreRegex maps tokenizer.ggml.pre values of llama.cpp
// (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_*) to the pre-tokenizer of the
// Hugging Face tokenizer.json they were converted from (as JSON), and
// whether merges are ignored for words in the vocabulary (llama.cpp sets
// ignore_merges for the Llama 3 pre-tokenizer, as its tokenizer.json does).
var ggufPre = map[string]struct {
	pre          string
	norm         string
	ignoreMerges bool
}{
	"default": {pre: gpt2Pre}, "gpt-2": {pre: gpt2Pre}, "gpt2": {pre: gpt2Pre},
	"llama3": {pre: llama3Pre, ignoreMerges: true}, "llama-bpe": {pre: llama3Pre, ignoreMerges: true},
	"llama-v3": {pre: llama3Pre, ignoreMerges: true}, "smaug-bpe": {pre: llama3Pre},
	"qwen2": {pre: qwen2Pre, norm: `{"type":"NFC"}`}, "deepseek-r1-qwen": {pre: qwen2Pre, norm: `{"type":"NFC"}`},
	"smollm": {pre: smollmPre},
}

// Pre-tokenizers of the tokenizer.json files behind the tokenizer.ggml.pre
// names: GPT-2's ByteLevel with its regex; Llama 3's and Qwen2's Split
// regexes (digits in threes, or one at a time) then ByteLevel; SmolLM's
// single digits then GPT-2's ByteLevel.
const (
	gpt2Pre   = `{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}`
	llama3Pre = `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}`
	qwen2Pre  = `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}`
	smollmPre = `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}]}`
)

// maxGGUFVocab bounds tokenizer.ggml.tokens.
const maxGGUFVocab = 1 << 22

// FromGGUF builds the tokenizer of a GGUF file from its metadata
// (llama.cpp's keys, llama-vocab.cpp):
//
//   - tokenizer.ggml.model "gpt2": byte-level BPE with tokenizer.ggml.tokens
//     and tokenizer.ggml.merges ("left right"), pre-tokenized as
//     tokenizer.ggml.pre names (default/gpt-2, llama-bpe/llama3, qwen2,
//     smollm);
//   - tokenizer.ggml.model "llama": a SentencePiece vocabulary with
//     tokenizer.ggml.scores, tokenized as llama.cpp's llm_tokenizer_spm does
//     (see spm.go);
//
// with tokenizer.ggml.token_type (control, user-defined and unknown tokens
// are matched in the text first, like added tokens), bos/eos/unk/pad
// token ids, add_bos_token / add_eos_token (llama.cpp's defaults: BOS for
// SentencePiece, not for BPE), add_space_prefix (SentencePiece; default
// true) and the chat template tokenizer.chat_template.
//
// It returns an error naming the key for a missing or ill-typed key, an
// unsupported model or pre-tokenizer, lengths that disagree, a merge or
// token id outside the vocabulary.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	t, err := fromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

func fromGGUF(f *gguf.File) (*Tokenizer, error) {
	kind, ok, err := f.String("tokenizer.ggml.model")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("no tokenizer.ggml.model")
	}
	tv, ok := f.Value("tokenizer.ggml.tokens")
	if !ok {
		return nil, errors.New("no tokenizer.ggml.tokens")
	}
	tokens, isStrs := tv.([]string)
	if !isStrs || len(tokens) == 0 || len(tokens) > maxGGUFVocab {
		return nil, fmt.Errorf("tokenizer.ggml.tokens: want 1 to %d strings", maxGGUFVocab)
	}
	n := len(tokens)
	types := make([]int32, n)
	for i := range types {
		types[i] = ggufNormal
	}
	if v, ok := f.Value("tokenizer.ggml.token_type"); ok {
		tt, isI32 := v.([]int32)
		if !isI32 || len(tt) != n {
			return nil, fmt.Errorf("tokenizer.ggml.token_type: want %d int32 values (one per token)", n)
		}
		types = tt
	}
	id := func(key string) (int32, error) {
		v, ok, err := f.Uint(key)
		if err != nil {
			return -1, err
		}
		if !ok {
			return -1, nil
		}
		if v >= uint64(n) {
			return -1, fmt.Errorf("%s %d is outside the vocabulary [0, %d)", key, v, n)
		}
		return int32(v), nil
	}
	flag := func(key string, def bool) (bool, error) {
		v, ok, err := f.Bool(key)
		if !ok {
			return def, err
		}
		return v, err
	}
	bos, err := id("tokenizer.ggml.bos_token_id")
	if err != nil {
		return nil, err
	}
	unk, err := id("tokenizer.ggml.unknown_token_id")
	if err != nil {
		return nil, err
	}
	var eos []int32
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		e, err := id(k)
		if err != nil {
			return nil, err
		}
		if e >= 0 {
			eos = append(eos, e)
		}
	}

	var t *Tokenizer
	switch kind {
	case "gpt2":
		if t, err = ggufBPE(f, tokens, types); err != nil {
			return nil, err
		}
	case "llama":
		sc, ok := f.Value("tokenizer.ggml.scores")
		scores, isF32 := sc.([]float32)
		if !ok || !isF32 || len(scores) != n {
			return nil, fmt.Errorf("tokenizer.ggml.scores: want %d float32 values (one per token)", n)
		}
		space, err := flag("tokenizer.ggml.add_space_prefix", true)
		if err != nil {
			return nil, err
		}
		t = newSPMTokenizer(tokens, scores, types, unk, space)
	default:
		return nil, fmt.Errorf("tokenizer.ggml.model %q is not supported; want gpt2 (BPE) or llama (SentencePiece)", kind)
	}
	t.bos = bos
	for _, e := range eos {
		t.addEOS(e)
	}
	addBOS, err := flag("tokenizer.ggml.add_bos_token", kind == "llama")
	if err != nil {
		return nil, err
	}
	addEOS, err := flag("tokenizer.ggml.add_eos_token", false)
	if err != nil {
		return nil, err
	}
	if addBOS && bos >= 0 {
		t.prefix = []int32{bos}
	}
	if addEOS && len(eos) > 0 {
		t.suffix = []int32{eos[0]}
	}
	c := &chatTemplate{vars: map[string]jinja.Value{}}
	for key, tid := range map[string]int32{"bos_token": bos, "unk_token": unk} {
		if tid >= 0 {
			c.vars[key] = jinja.NewString(tokens[tid])
		}
	}
	if len(eos) > 0 {
		c.vars["eos_token"] = jinja.NewString(tokens[eos[0]])
	}
	switch tmpl, ok, err := f.String("tokenizer.chat_template"); {
	case err != nil:
		return nil, err
	case !ok:
		c.err = errors.New("the model has no chat template (the GGUF file has no tokenizer.chat_template)")
	default:
		if c.tmpl, err = jinja.Compile(tmpl); err != nil {
			c.err = fmt.Errorf("tokenizer.chat_template cannot be compiled: %w", err)
		}
	}
	t.chat = c
	return t, nil
}

// ggufBPE builds a byte-level BPE tokenizer from GGUF metadata, through the
// same pipeline as a tokenizer.json (build).
func ggufBPE(f *gguf.File, tokens []string, types []int32) (*Tokenizer, error) {
	preName, ok, err := f.String("tokenizer.ggml.pre")
	if err != nil {
		return nil, err
	}
	if !ok {
		preName = "default"
	}
	pre, known := ggufPre[preName]
	if !known {
		var names []string
		for k := range ggufPre {
			names = append(names, k)
		}
		return nil, fmt.Errorf("tokenizer.ggml.pre %q is not supported (supported: %s)", preName, strings.Join(sortedStrings(names), ", "))
	}
	mv, ok := f.Value("tokenizer.ggml.merges")
	merges, isStrs := mv.([]string)
	if !ok || !isStrs {
		return nil, errors.New("tokenizer.ggml.merges: want a list of strings (\"left right\")")
	}
	vocab := make(map[string]int32, len(tokens))
	var added []addedToken
	for i, tok := range tokens {
		if _, dup := vocab[tok]; !dup {
			vocab[tok] = int32(i)
		}
		switch types[i] {
		case ggufControl, ggufUserDefined, ggufUnknown:
			added = append(added, addedToken{ID: int32(i), Content: tok, Special: types[i] != ggufUserDefined})
		}
	}
	pairs := make([][2]string, len(merges))
	for i, m := range merges {
		l, r, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer.ggml.merges[%d] %q is not \"left right\"", i, m)
		}
		pairs[i] = [2]string{l, r}
	}
	model, err := json.Marshal(map[string]any{"type": "BPE", "vocab": vocab, "merges": pairs, "ignore_merges": pre.ignoreMerges})
	if err != nil {
		return nil, err
	}
	j := &tokenizerJSON{AddedTokens: added, PreTokenizer: json.RawMessage(pre.pre), Model: model,
		Decoder: json.RawMessage(`{"type":"ByteLevel"}`)}
	if pre.norm != "" {
		j.Normalizer = json.RawMessage(pre.norm)
	}
	t, err := build(j)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.ggml (%s): %v", preName, err)
	}
	// Every id keeps its own string, repeated strings included.
	if t.vocabSize < len(tokens) {
		t.idTokens = append(t.idTokens, make([]string, len(tokens)-t.vocabSize)...)
		t.idText = append(t.idText, make([]string, len(tokens)-t.vocabSize)...)
		t.vocabSize = len(tokens)
	}
	alpha := newByteAlphabet()
	dec := decoderSpec{byteLevel: true}
	for i, tok := range tokens {
		t.idTokens[i] = tok
		t.idText[i] = string(dec.tokenBytes(tok, alpha))
	}
	return t, nil
}

func sortedStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}

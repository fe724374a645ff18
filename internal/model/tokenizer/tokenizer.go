// Package tokenizer implements model.Tokenizer for the byte-level BPE
// tokenizers of Hugging Face models (Llama 3, Qwen2/2.5/3, GPT-2 and their
// kin), read from a model directory's tokenizer.json and
// tokenizer_config.json.
//
// Tokenization follows Hugging Face tokenizers (the Rust crate behind
// transformers' fast tokenizers; module paths below are in
// github.com/huggingface/tokenizers, tokenizers/src/):
//
//  1. added tokens (tokenizer/added_vocabulary.rs) are found first, special
//     or not, honouring single_word, lstrip, rstrip and normalized;
//  2. the text between them is normalized (normalizers/: NFC, NFD, NFKC,
//     NFKD, Sequence);
//  3. pre-tokenized (pre_tokenizers/: Sequence, Split with a regex or string
//     and any behaviour and invert, ByteLevel with add_prefix_space and
//     use_regex);
//  4. each pre-token is mapped to byte-level characters and tokenized by the
//     BPE model (models/bpe/: merges lowest rank first, ignore_merges,
//     byte_fallback, unk_token, fuse_unk, continuing_subword_prefix,
//     end_of_word_suffix);
//  5. with addSpecial the post-processor (processors/: TemplateProcessing,
//     ByteLevel, Bert, Roberta, Sequence) adds its special tokens.
//
// Decoding (decoders/: ByteLevel, ByteFallback, Fuse) concatenates the
// tokens' bytes; see Decode and NewDecoder. Chat templates are rendered with
// github.com/ardanlabs/jinja like transformers' apply_chat_template, with
// the request's options (no generation prompt, continuing the final
// message, a template of its own, template kwargs); see ApplyChatTemplate
// and RenderChat.
//
// The fixtures under testdata hold the real Llama 3 and Qwen3 tokenizer
// files and what transformers.js computes from them
// (tools/tokenizer-fixtures/gen.mjs); the tests require exact equality.
//
// Anything the package does not implement (Unigram, WordPiece or WordLevel
// models, other normalizers, pre-tokenizers, post-processors or decoders)
// is rejected by Load with an error naming the file and the component.
//
// Known differences from Hugging Face tokenizers (the Rust crate):
//   - the contractions group (?i:'s|…) of Llama 3 and Qwen folds ASCII case
//     only, as regexp2 and transformers.js do; Oniguruma also folds U+017F
//     (ſ) to s, so "'ſ" is one pre-token there and two here;
//   - Split patterns other than the GPT-2 family run on regexp2 (.NET
//     syntax) rather than Oniguruma; the common constructs (lookaround,
//     \p{…}, Unicode \s) agree;
//   - with the ByteFallback decoder, ill-formed UTF-8 gives one U+FFFD per
//     maximal ill-formed subsequence, where tokenizers gives one per byte
//     of the byte-token run;
//   - Decode never applies transformers' clean_up_tokenization_spaces
//     (which would break decode(encode(s)) == s), as vLLM's incremental
//     detokenizer does not.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

// Tokenizer is a loaded tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	added     *addedVocab
	norm      normalizer   // nil: none
	pre       preTokenizer // nil: none
	model     *bpe
	spm       *spmModel // a SentencePiece vocabulary (GGUF files) instead of model
	vocabSize int
	// idTokens[id] is the token string of id ("" for unused ids).
	idTokens []string
	// idText[id] is what id decodes to: bytes, not always valid UTF-8.
	idText []string
	// prefix and suffix are added around a sequence with addSpecial.
	prefix, suffix []int32

	bos       int32 // -1: none
	eos       []int32
	chat      *chatTemplate
	templates TemplateCache // of the templates requests bring
	pool      sync.Pool     // of *encodeScratch
}

var _ model.Tokenizer = (*Tokenizer)(nil)

// encodeScratch is the working memory of one Encode call.
type encodeScratch struct {
	segs   []segment
	pieces []string
	spans  []span
	bpe    bpeScratch
}

// tokenizerJSON holds the parts of tokenizer.json, undecoded.
type tokenizerJSON struct {
	AddedTokens   []addedToken
	Normalizer    json.RawMessage
	PreTokenizer  json.RawMessage
	Model         json.RawMessage
	PostProcessor json.RawMessage
	Decoder       json.RawMessage
}

// splitTokenizerJSON splits tokenizer.json into its parts.
func splitTokenizerJSON(data []byte) (*tokenizerJSON, error) {
	members, err := objectMembers(data)
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	j := &tokenizerJSON{
		Normalizer:    members["normalizer"],
		PreTokenizer:  members["pre_tokenizer"],
		Model:         members["model"],
		PostProcessor: members["post_processor"],
		Decoder:       members["decoder"],
	}
	if v := members["added_tokens"]; !isNull(v) {
		if err := json.Unmarshal(v, &j.AddedTokens); err != nil {
			return nil, fmt.Errorf("added_tokens: %v", err)
		}
	}
	return j, nil
}

// Load reads the tokenizer of the model directory dir:
//
//   - tokenizer.json (required): the Hugging Face tokenizers pipeline;
//   - tokenizer_config.json (required): chat_template (a string, or a list
//     of {name, template} of which "default" is used), bos_token, eos_token
//     and the other special tokens (strings or AddedToken objects), and
//     add_bos_token / add_eos_token;
//   - chat_template.jinja (optional): the chat template, used when
//     tokenizer_config.json has none (as newer transformers save it);
//   - generation_config.json (optional): its eos_token_id (a number or a
//     list) is added to EOS.
//
// Truncation and padding settings in tokenizer.json are ignored. A chat
// template that cannot be compiled does not fail Load: ApplyChatTemplate
// returns the error.
func Load(dir string) (*Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	j, err := splitTokenizerJSON(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %v", path, err)
	}
	t, err := build(j)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %v", path, err)
	}
	cfg, err := readConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %v", err)
	}
	if err := t.configure(cfg); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %v", filepath.Join(dir, "tokenizer_config.json"), err)
	}
	gen, err := readGenerationEOS(dir)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %v", err)
	}
	for _, id := range gen {
		if id < 0 || int(id) >= t.vocabSize {
			return nil, fmt.Errorf("tokenizer: %s: eos_token_id %d is outside the vocabulary [0, %d)",
				filepath.Join(dir, "generation_config.json"), id, t.vocabSize)
		}
		t.addEOS(id)
	}
	return t, nil
}

// build assembles the pipeline of tokenizer.json.
func build(j *tokenizerJSON) (*Tokenizer, error) {
	if isNull(j.Model) {
		return nil, errors.New("no model")
	}
	norm, err := parseNormalizer(j.Normalizer)
	if err != nil {
		return nil, err
	}
	pre, byteLevel, err := parsePreTokenizer(j.PreTokenizer)
	if err != nil {
		return nil, err
	}
	m, err := parseBPE(j.Model, byteLevel)
	if err != nil {
		return nil, err
	}
	dec, err := parseDecoder(j.Decoder)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{norm: norm, pre: pre, model: m, bos: -1}
	t.pool.New = func() any { return new(encodeScratch) }

	for _, id := range m.vocab {
		t.vocabSize = max(t.vocabSize, int(id)+1)
	}
	seen := map[string]bool{}
	var added []addedToken
	for _, a := range j.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("added token %q has negative id %d", a.Content, a.ID)
		}
		if a.Content == "" || seen[a.Content] {
			continue // as tokenizers, which ignores empty and repeated tokens
		}
		seen[a.Content] = true
		added = append(added, a)
		t.vocabSize = max(t.vocabSize, int(a.ID)+1)
	}
	t.added = newAddedVocab(added, norm)

	t.idTokens = make([]string, t.vocabSize)
	for tok, id := range m.vocab {
		t.idTokens[id] = tok
	}
	for _, a := range added {
		t.idTokens[a.ID] = a.Content
	}
	alpha := m.alpha
	if alpha == nil {
		alpha = newByteAlphabet()
	}
	t.idText = make([]string, t.vocabSize)
	for id, tok := range t.idTokens {
		t.idText[id] = string(dec.tokenBytes(tok, alpha))
	}

	t.prefix, t.suffix, err = parsePostProcessor(j.PostProcessor)
	if err != nil {
		return nil, err
	}
	for _, id := range append(append([]int32(nil), t.prefix...), t.suffix...) {
		if id < 0 || int(id) >= t.vocabSize {
			return nil, fmt.Errorf("post_processor: token id %d is outside the vocabulary [0, %d)", id, t.vocabSize)
		}
	}
	return t, nil
}

// tokenID returns the id of a token string: an added token's, else the
// model vocabulary's (tokenizer/added_vocabulary.rs: AddedVocabulary::token_to_id).
func (t *Tokenizer) tokenID(tok string) (int32, bool) {
	for _, a := range t.added.tokens {
		if a.Content == tok {
			return a.ID, true
		}
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// Encode tokenizes text. Added tokens written in the text (special ones
// such as "<|eot_id|>" included) are always recognised. With addSpecial the
// post-processor's special tokens are added: Llama 3's TemplateProcessing
// adds <|begin_of_text|>; a ByteLevel post-processor (as in the Llama 3
// fixture and Qwen) adds nothing, like Hugging Face. text must be valid
// UTF-8.
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	if !utf8.ValidString(text) {
		i := 0
		for i < len(text) {
			r, size := utf8.DecodeRuneInString(text[i:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			i += size
		}
		return nil, fmt.Errorf("text is not valid UTF-8 (byte %d)", i)
	}
	if t.spm != nil {
		return t.encodeSPM(text, addSpecial), nil
	}
	sc := t.pool.Get().(*encodeScratch)
	defer t.pool.Put(sc)

	ids := make([]int32, 0, len(t.prefix)+len(text)/3+len(t.suffix)+1)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	sc.segs = t.added.appendSegments(sc.segs[:0], text, t.norm)
	for _, seg := range sc.segs {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		if t.pre == nil {
			ids = t.model.appendTokens(ids, seg.text, &sc.bpe)
			continue
		}
		sc.pieces = t.pre.appendPieces(sc.pieces[:0], seg.text, &sc.spans)
		for _, p := range sc.pieces {
			ids = t.model.appendTokens(ids, p, &sc.bpe)
		}
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	// Do not keep references to text in the pooled scratch.
	clear(sc.segs)
	clear(sc.pieces)
	return ids, nil
}

// VocabSize returns the number of token ids of the tokenizer: one more than
// the largest id of the vocabulary and the added tokens. A model's
// embedding may have more rows (Qwen3: 151669 here, 151936 in the model).
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS returns the id of tokenizer_config.json's bos_token, if it has one.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }

// EOS returns the ids that end generation: tokenizer_config.json's
// eos_token, then the eos_token_id of generation_config.json if the
// directory has one (Llama 3 Instruct lists <|eot_id|> there). The slice is
// a copy.
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

// TokenString returns the token string of id, for debugging: byte-level
// characters as in tokenizer.json (e.g. "Ġhello" for " hello") or an added
// token's content; "" for an id outside [0, VocabSize()) or unused.
func (t *Tokenizer) TokenString(id int32) string {
	if id < 0 || int(id) >= len(t.idTokens) {
		return ""
	}
	return t.idTokens[id]
}

func (t *Tokenizer) addEOS(id int32) {
	for _, e := range t.eos {
		if e == id {
			return
		}
	}
	t.eos = append(t.eos, id)
}

// readGenerationEOS returns the eos_token_id of dir/generation_config.json,
// or nil if there is no such file.
func readGenerationEOS(dir string) ([]int32, error) {
	path := filepath.Join(dir, "generation_config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var g struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %v", path, err)
	}
	if isNull(g.EOS) {
		return nil, nil
	}
	var one int32
	if err := json.Unmarshal(g.EOS, &one); err == nil {
		return []int32{one}, nil
	}
	var list []int32
	if err := json.Unmarshal(g.EOS, &list); err != nil {
		return nil, fmt.Errorf("%s: eos_token_id must be a token id or a list of them, got %s", path, g.EOS)
	}
	return list, nil
}

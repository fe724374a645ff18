package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
)

// decoderSpec is the decoder of tokenizer.json (tokenizers/src/decoders/),
// reduced to what byte-level models use: each token stands for a fixed
// string of bytes, so decoding is concatenation and can stream.
type decoderSpec struct {
	// byteLevel maps a token's characters back to bytes (ByteLevel).
	byteLevel bool
	// byteFallback turns a token "<0xXX>" into byte XX (ByteFallback).
	byteFallback bool
}

// parseDecoder reads tokenizer.json's "decoder". Supported: ByteLevel,
// ByteFallback, Fuse (a no-op when tokens are concatenated anyway) and
// Sequence of these.
func parseDecoder(raw json.RawMessage) (decoderSpec, error) {
	var spec decoderSpec
	if isNull(raw) {
		return spec, fmt.Errorf("decoder: none (null) is not supported; byte-level models have a ByteLevel decoder")
	}
	if err := addDecoder(raw, &spec); err != nil {
		return spec, err
	}
	return spec, nil
}

func addDecoder(raw json.RawMessage, spec *decoderSpec) error {
	var head struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("decoder: %v", err)
	}
	switch head.Type {
	case "ByteLevel":
		spec.byteLevel = true
	case "ByteFallback":
		spec.byteFallback = true
	case "Fuse":
	case "Sequence":
		for _, d := range head.Decoders {
			if err := addDecoder(d, spec); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("decoder: unsupported type %q (supported: ByteLevel, ByteFallback, Fuse, Sequence)", head.Type)
	}
	return nil
}

// tokenBytes returns the bytes token tok decodes to.
func (d decoderSpec) tokenBytes(tok string, alpha *byteAlphabet) []byte {
	if d.byteFallback && len(tok) == 6 && tok[:3] == "<0x" && tok[5] == '>' {
		if b, ok := hexByte(tok[3], tok[4]); ok {
			return []byte{b}
		}
	}
	if d.byteLevel {
		return alpha.decodeToken(tok)
	}
	return []byte(tok)
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexDigit(hi)
	l, ok2 := hexDigit(lo)
	return h<<4 | l, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Decode returns the text of ids: the bytes of their tokens, concatenated,
// as UTF-8 with every maximal ill-formed subsequence replaced by U+FFFD (as
// tokenizers' decode with skip_special_tokens=false, without transformers'
// clean_up_tokenization_spaces). Special tokens appear as their content,
// e.g. "<|eot_id|>"; ids outside [0, VocabSize()) are skipped.
func (t *Tokenizer) Decode(ids []int32) string {
	var raw []byte
	for _, id := range ids {
		raw = append(raw, t.textOf(id)...)
	}
	if utf8.Valid(raw) {
		return string(raw)
	}
	out, _ := appendUTF8(nil, raw, true)
	return string(out)
}

// textOf returns the bytes id decodes to ("" for an id out of range).
func (t *Tokenizer) textOf(id int32) string {
	if id < 0 || int(id) >= len(t.idText) {
		return ""
	}
	return t.idText[id]
}

// TokenBytes returns the bytes id decodes to (model.Tokenizer): a special
// token's content, nil for an id outside [0, VocabSize()).
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.idText) {
		return nil
	}
	return []byte(t.idText[id])
}

// IsSpecial reports whether id is a special token (model.SpecialTokens):
// an added token marked special, or a GGUF vocabulary's control or
// unknown token.
func (t *Tokenizer) IsSpecial(id int32) bool { return t.added != nil && t.added.special[id] }

// NewDecoder returns a streaming decoder for one output (it is not safe for
// concurrent use; the Tokenizer may serve any number of them).
func (t *Tokenizer) NewDecoder() model.Decoder { return &streamDecoder{t: t} }

// streamDecoder implements model.Decoder. The concatenation of what Add and
// Flush return is exactly Decode of all the ids added.
type streamDecoder struct {
	t       *Tokenizer
	pending []byte // bytes of an incomplete UTF-8 character (at most 3)
	out     []byte
}

// Add appends token id and returns the text it completes. Bytes that begin
// a UTF-8 character not yet complete are held back; bytes that can no
// longer form one come out as U+FFFD. Special tokens come out as their
// content (e.g. "<|eot_id|>"): the caller decides which to hide (the front
// end drops the EOS that ends a stream). An id outside [0, VocabSize())
// adds nothing.
func (d *streamDecoder) Add(id int32) string {
	b := d.t.textOf(id)
	if len(d.pending) == 0 && utf8.ValidString(b) {
		return b
	}
	d.pending = append(d.pending, b...)
	var n int
	d.out, n = appendUTF8(d.out[:0], d.pending, false)
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return string(d.out)
}

// Flush returns the held-back bytes, if any, as U+FFFD and resets the
// decoder.
func (d *streamDecoder) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	d.out, _ = appendUTF8(d.out[:0], d.pending, true)
	d.pending = d.pending[:0]
	return string(d.out)
}

package tokenizer

import (
	"encoding/json"
	"fmt"

	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites text before pre-tokenization (Hugging Face
// tokenizers' Normalizer, tokenizers/src/normalizers/). It is applied to
// each piece of text between added tokens, as tokenizers'
// AddedVocabulary::extract_and_normalize does.
type normalizer interface {
	normalize(s string) string
}

// unicodeNorm is one of the NFC, NFD, NFKC and NFKD normalizers.
type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string { return n.form.String(s) }

// sequenceNorm applies normalizers in order.
type sequenceNorm []normalizer

func (n sequenceNorm) normalize(s string) string {
	for _, x := range n {
		s = x.normalize(s)
	}
	return s
}

// parseNormalizer builds the normalizer of tokenizer.json's "normalizer"
// (nil for JSON null).
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var head struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("normalizer: %v", err)
	}
	switch head.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Sequence":
		var seq sequenceNorm
		for _, r := range head.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("normalizer: unsupported type %q (supported: NFC, NFD, NFKC, NFKD, Sequence)", head.Type)
}

package tokenizer

import (
	"encoding/json"
	"fmt"
)

// parsePostProcessor reads tokenizer.json's "post_processor" and returns the
// ids it adds before and after a single sequence when special tokens are
// requested (tokenizers/src/processors/). ByteLevel adds nothing (it only
// adjusts offsets); TemplateProcessing adds the special tokens of its
// "single" template; BertProcessing and RobertaProcessing add cls before
// and sep after; Sequence applies its processors in order.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []int32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var head struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
		Sep []json.RawMessage `json:"sep"`
		Cls []json.RawMessage `json:"cls"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, nil, fmt.Errorf("post_processor: %v", err)
	}
	switch head.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		for _, r := range head.Processors {
			p, s, err := parsePostProcessor(r)
			if err != nil {
				return nil, nil, err
			}
			prefix = append(append([]int32(nil), p...), prefix...)
			suffix = append(suffix, s...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		if head.Single == nil {
			return nil, nil, fmt.Errorf("post_processor TemplateProcessing: no single template")
		}
		seenA := false
		for _, piece := range head.Single {
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" || seenA {
					return nil, nil, fmt.Errorf("post_processor TemplateProcessing: single template must hold sequence A once, got %q", piece.Sequence.ID)
				}
				seenA = true
			case piece.SpecialToken != nil:
				st, ok := head.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("post_processor TemplateProcessing: special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				if seenA {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return nil, nil, fmt.Errorf("post_processor TemplateProcessing: unsupported template piece")
			}
		}
		if !seenA {
			return nil, nil, fmt.Errorf("post_processor TemplateProcessing: single template has no sequence A")
		}
		return prefix, suffix, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := pairID(head.Cls)
		if err != nil {
			return nil, nil, fmt.Errorf("post_processor %s: cls: %v", head.Type, err)
		}
		sep, err := pairID(head.Sep)
		if err != nil {
			return nil, nil, fmt.Errorf("post_processor %s: sep: %v", head.Type, err)
		}
		return []int32{cls}, []int32{sep}, nil
	}
	return nil, nil, fmt.Errorf("post_processor: unsupported type %q (supported: ByteLevel, TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)", head.Type)
}

// pairID reads the id of a ["token", id] pair.
func pairID(pair []json.RawMessage) (int32, error) {
	var id int32
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, fmt.Errorf("want [token, id]: %v", err)
	}
	return id, nil
}

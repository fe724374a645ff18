package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// A preTokenizer cuts a piece of normalized text into smaller pieces, the
// "words" the model tokenizes one at a time (Hugging Face tokenizers'
// PreTokenizer, tokenizers/src/pre_tokenizers/).
type preTokenizer interface {
	// appendPieces appends the non-empty pieces of s to dst.
	appendPieces(dst []string, s string, scratch *[]span) []string
}

// splitBehavior is what a Split does with the matches of its pattern
// (tokenizers' SplitDelimiterBehavior).
type splitBehavior int

const (
	behaviorRemoved            splitBehavior = iota // drop matches
	behaviorIsolated                                // matches are pieces of their own
	behaviorMergedWithPrevious                      // a match joins the piece before it
	behaviorMergedWithNext                          // a match joins the piece after it
	behaviorContiguous                              // adjacent matches join into one piece
)

var behaviorNames = map[string]splitBehavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// splitPre is the Split pre-tokenizer: it cuts at the matches of a pattern.
type splitPre struct {
	pat      pattern
	behavior splitBehavior
	// invert swaps matches and the text between them.
	invert bool
}

func (p *splitPre) appendPieces(dst []string, s string, scratch *[]span) []string {
	if s == "" {
		return dst
	}
	matches := p.pat.appendMatches((*scratch)[:0], s)
	*scratch = matches
	return appendSplits(dst, s, matches, p.behavior, p.invert)
}

// appendSplits appends the pieces of s cut at matches (sorted, disjoint)
// with behavior, following tokenizers' NormalizedString::split: the matches
// and the gaps between them cover s; invert swaps which is which; the
// behavior decides which pieces are kept or joined; empty pieces are dropped.
func appendSplits(dst []string, s string, matches []span, behavior splitBehavior, invert bool) []string {
	// pieceStart is the start of the pending piece; havePiece tells
	// whether one is pending (it ends where the next piece starts).
	pieceStart, havePiece := 0, false
	prevMatch := false
	emit := func(start, end int) {
		if end > start {
			dst = append(dst, s[start:end])
		}
	}
	// part handles one element [start, end) of the cover.
	part := func(start, end int, isMatch bool) {
		if invert {
			isMatch = !isMatch
		}
		switch behavior {
		case behaviorRemoved:
			if !isMatch {
				emit(start, end)
			}
		case behaviorIsolated:
			emit(start, end)
		case behaviorMergedWithPrevious:
			// A match extends the previous piece unless that
			// piece was itself a match.
			if isMatch && !prevMatch && havePiece {
				// extend: nothing to do, the pending piece grows
			} else {
				if havePiece {
					emit(pieceStart, start)
				}
				pieceStart, havePiece = start, true
			}
		case behaviorMergedWithNext:
			// A match starts a piece that the next non-match joins.
			if !isMatch && prevMatch && havePiece {
				// join the pending match
			} else {
				if havePiece {
					emit(pieceStart, start)
				}
				pieceStart, havePiece = start, true
			}
		case behaviorContiguous:
			if havePiece && isMatch == prevMatch {
				// extend the run
			} else {
				if havePiece {
					emit(pieceStart, start)
				}
				pieceStart, havePiece = start, true
			}
		}
		prevMatch = isMatch
	}
	prev := 0
	for _, m := range matches {
		if m.start > prev {
			part(prev, m.start, false)
		}
		part(m.start, m.end, true)
		prev = m.end
	}
	if prev < len(s) {
		part(prev, len(s), false)
	}
	if havePiece {
		emit(pieceStart, len(s))
	}
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer
// (tokenizers/src/pre_tokenizers/byte_level.rs): it optionally prefixes each
// piece with a space and splits it with the GPT-2 pattern. Its mapping of
// bytes to printable characters is done by the model, which looks the
// mapped pieces up in its vocabulary.
type byteLevelPre struct {
	addPrefixSpace bool
	gpt2           *splitPre // nil unless use_regex
}

func (p *byteLevelPre) appendPieces(dst []string, s string, scratch *[]span) []string {
	if s == "" {
		return dst
	}
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if p.gpt2 == nil {
		return append(dst, s)
	}
	return p.gpt2.appendPieces(dst, s, scratch)
}

// sequencePre applies pre-tokenizers one after the other to every piece.
type sequencePre []preTokenizer

func (p sequencePre) appendPieces(dst []string, s string, scratch *[]span) []string {
	start := len(dst)
	dst = append(dst, s)
	var tmp []string
	for _, pt := range p {
		tmp = append(tmp[:0], dst[start:]...)
		dst = dst[:start]
		for _, piece := range tmp {
			dst = pt.appendPieces(dst, piece, scratch)
		}
	}
	return dst
}

// parsePreTokenizer builds the pre-tokenizer of tokenizer.json's
// "pre_tokenizer" (nil for JSON null). It reports whether the pipeline ends
// with ByteLevel, which must then be its last step.
func parsePreTokenizer(raw json.RawMessage) (pt preTokenizer, byteLevel bool, err error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var flat []preTokenizer
	if err := flattenPre(raw, &flat, &byteLevel); err != nil {
		return nil, false, err
	}
	switch len(flat) {
	case 0:
		return nil, byteLevel, nil
	case 1:
		return flat[0], byteLevel, nil
	}
	return sequencePre(flat), byteLevel, nil
}

func flattenPre(raw json.RawMessage, out *[]preTokenizer, byteLevel *bool) error {
	var head struct {
		Type          string            `json:"type"`
		Pretokenizers []json.RawMessage `json:"pretokenizers"`
		Pattern       struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		} `json:"pattern"`
		Behavior       string `json:"behavior"`
		Invert         bool   `json:"invert"`
		AddPrefixSpace *bool  `json:"add_prefix_space"`
		UseRegex       *bool  `json:"use_regex"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("pre_tokenizer: %v", err)
	}
	if *byteLevel {
		return fmt.Errorf("pre_tokenizer: %s after ByteLevel is not supported (ByteLevel must be the last step)", head.Type)
	}
	switch head.Type {
	case "Sequence":
		for _, r := range head.Pretokenizers {
			if err := flattenPre(r, out, byteLevel); err != nil {
				return err
			}
		}
	case "Split":
		pat, err := compilePattern(head.Pattern.String, head.Pattern.Regex)
		if err != nil {
			return fmt.Errorf("pre_tokenizer Split: %v", err)
		}
		b, ok := behaviorNames[head.Behavior]
		if !ok {
			return fmt.Errorf("pre_tokenizer Split: unsupported behavior %q", head.Behavior)
		}
		*out = append(*out, &splitPre{pat: pat, behavior: b, invert: head.Invert})
	case "ByteLevel":
		// Defaults as in tokenizers' ByteLevel::default().
		p := &byteLevelPre{addPrefixSpace: head.AddPrefixSpace == nil || *head.AddPrefixSpace}
		if head.UseRegex == nil || *head.UseRegex {
			p.gpt2 = &splitPre{pat: &gptPattern{}, behavior: behaviorIsolated}
		}
		if p.addPrefixSpace || p.gpt2 != nil {
			*out = append(*out, p)
		} // else it only maps bytes, which the model does
		*byteLevel = true
	default:
		return fmt.Errorf("pre_tokenizer: unsupported type %q (supported: Sequence, Split, ByteLevel)", head.Type)
	}
	return nil
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw []byte) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

package openai

import (
	"bytes"
	"slices"

	"github.com/pdserve/pdserve/internal/model"
)

// output turns the engine's tokens into the text and token ids the client
// sees: it detokenizes incrementally, applies stop strings, and (while
// streaming) holds back any suffix that could still become a stop string.
type output struct {
	dec         model.Decoder // nil without a tokenizer: no text
	stops       [][]byte
	maxStop     int
	includeStop bool
	// minTokens: stop strings are looked for only in text that arrives
	// after that many tokens (vLLM's detokenizer, which checks only while
	// the output is longer than min_tokens).
	minTokens int
	// noText holds the ids never rendered: EOS (unless ignore_eos) and
	// stop_token_ids, which end the output when drawn; special reports the
	// tokenizer's special tokens, never rendered either (vLLM's
	// skip_special_tokens, its default).
	noText  []int32
	special func(int32) bool

	text     []byte  // the output text so far (after a stop match: truncated)
	ids      []int32 // every token counted (sent or to be sent)
	textSent int     // bytes of text handed out by take
	idsSent  int     // ids handed out by take
	// toks holds the counted tokens with their logprobs when keepToks
	// (the request asked for logprobs); cum is the sum of their logprobs
	// (best_of's ranking).
	keepToks bool
	toks     []Token
	cum      float64
	// The stream's state: the choice's first event was sent (with the
	// echo and the prompt's ids), its last (with its finish reason), and
	// the text offset of its next logprob token.
	firstSent, finSent bool
	offset             int

	finished bool
	finish   string // "stop" or "length" (or what the engine said) once finished
	// cached is the prompt tokens the engine's prefix cache saved, from its
	// last chunk.
	cached int
	// stopped: the front end ended the request (a stop string matched
	// before the engine finished); the engine must be told with Stop, or
	// with StopChoice (choiceStopped) for one choice of several.
	stopped, choiceStopped bool
}

func newOutput(tok model.Tokenizer, req *request, eos []int32) *output {
	o := &output{includeStop: req.includeStopStr, minTokens: req.minTokens, keepToks: req.logprobs}
	if tok != nil {
		o.dec = tok.NewDecoder()
		if st, ok := tok.(model.SpecialTokens); ok {
			o.special = st.IsSpecial
			if keep := req.keepSpecial; len(keep) > 0 {
				// The tool-call parser reads these markers in the text.
				o.special = func(id int32) bool { return st.IsSpecial(id) && !slices.Contains(keep, id) }
			}
		}
	}
	for _, s := range req.stop {
		o.stops = append(o.stops, []byte(s))
		o.maxStop = max(o.maxStop, len(s))
	}
	if !req.ignoreEOS {
		o.noText = append(o.noText, eos...)
	}
	o.noText = append(o.noText, req.stopTokenIDs...)
	return o
}

// add consumes one chunk of the engine. Tokens after the output finished are
// ignored (not counted). It reports whether the output is finished now.
func (o *output) add(c Chunk) bool {
	if o.finished {
		return true
	}
	for _, t := range c.Tokens {
		if o.finished {
			break
		}
		o.ids = append(o.ids, t.ID)
		o.cum += float64(t.Logprob)
		if o.keepToks {
			o.toks = append(o.toks, t)
		}
		if o.dec == nil {
			continue
		}
		if slices.Contains(o.noText, t.ID) || (o.special != nil && o.special(t.ID)) {
			continue // counted but not shown
		}
		o.appendText(o.dec.Add(t.ID))
	}
	if c.CachedTokens > 0 {
		o.cached = c.CachedTokens
	}
	if c.FinishReason != "" {
		if !o.finished && o.dec != nil {
			o.appendText(o.dec.Flush())
		}
		if !o.finished {
			o.finished = true
			o.finish = c.FinishReason
		}
		// The engine finished with this chunk too: nothing to stop.
		o.stopped = false
	}
	return o.finished
}

// appendText adds s to the text and looks for a stop string that ends in it.
func (o *output) appendText(s string) {
	if s == "" || o.finished {
		return
	}
	// A match not found before must end in s, so it starts at most
	// maxStop-1 bytes before s.
	from := max(0, len(o.text)-(o.maxStop-1))
	o.text = append(o.text, s...)
	if len(o.stops) == 0 || len(o.ids) <= o.minTokens {
		return
	}
	at, n := -1, 0
	for _, stop := range o.stops {
		if i := bytes.Index(o.text[from:], stop); i >= 0 && (at < 0 || from+i < at) {
			at, n = from+i, len(stop)
		}
	}
	if at < 0 {
		return
	}
	if o.includeStop {
		at += n
	}
	o.text = o.text[:at]
	o.finished, o.finish, o.stopped = true, "stop", true
}

// heldBack returns the length of the longest suffix of the text that is a
// proper prefix of a stop string: text that may not be sent yet.
func (o *output) heldBack() int {
	best := 0
	for _, stop := range o.stops {
		for k := min(len(stop)-1, len(o.text)); k > best; k-- {
			if o.text[len(o.text)-k] == stop[0] && bytes.HasSuffix(o.text, stop[:k]) {
				best = k
				break
			}
		}
	}
	return best
}

// take returns the text and ids not handed out yet that may be sent: all of
// them once finished, else all but a possible stop-string prefix of text;
// and with keepToks the tokens of those ids.
func (o *output) take() (string, []int32, []Token) {
	// A stop match never cuts into text already sent (that text was not a
	// stop-string prefix), so start ≤ len(o.text); min and max only keep
	// the slicing safe.
	start := min(o.textSent, len(o.text))
	end := len(o.text)
	if !o.finished {
		end = max(start, end-o.heldBack())
	}
	text := string(o.text[start:end])
	o.textSent = end
	ids := slices.Clone(o.ids[o.idsSent:])
	var toks []Token
	if o.keepToks {
		toks = o.toks[o.idsSent:]
	}
	o.idsSent = len(o.ids)
	return text, ids, toks
}

// all returns the whole text and ids (for a response that is not streamed).
func (o *output) all() (string, []int32) {
	return string(o.text), o.ids
}

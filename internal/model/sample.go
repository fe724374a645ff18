package model

import (
	"fmt"
	"math"
	"slices"
)

// SamplingParams controls token choice. Its JSON form (the worker API's)
// uses the OpenAI/SGLang names.
type SamplingParams struct {
	// Temperature 0 means greedy (argmax).
	Temperature float32 `json:"temperature"`
	// TopP in (0, 1]; 1 keeps every token.
	TopP float32 `json:"top_p,omitempty"`
	// TopK ≤ 0 keeps every token.
	TopK int `json:"top_k,omitempty"`
	// Seed keys the randomness; with Step it fully determines the draw.
	Seed uint64 `json:"seed"`

	// The fields below are the logit processors and logprob settings. Their
	// zero values change nothing, so a request that sets none samples as
	// before they existed. They apply in this order (vLLM's): bans
	// (a grammar's SeqInput.Mask first, then SeqInput.Ban, AllowedTokenIDs,
	// BadWords) set logits to −∞; then
	// RepetitionPenalty, FrequencyPenalty and PresencePenalty; then
	// LogitBias; then temperature; then MinP, TopK and TopP.

	// MinP in [0, 1]: tokens whose probability (after temperature) is
	// below MinP × the most likely token's are not drawn (vLLM's min_p).
	MinP float32 `json:"min_p,omitempty"`
	// PresencePenalty and FrequencyPenalty in [−2, 2] are OpenAI's: the
	// logit of a token that occurs c > 0 times in the output so far is
	// lowered by PresencePenalty + c × FrequencyPenalty.
	PresencePenalty  float32 `json:"presence_penalty,omitempty"`
	FrequencyPenalty float32 `json:"frequency_penalty,omitempty"`
	// RepetitionPenalty in (0, 2], 0 or 1 off, is CTRL's (Keskar et al.
	// 2019, as Hugging Face applies it): the logit l of every token that
	// occurs in the prompt or the output so far becomes l/RepetitionPenalty
	// if l > 0, else l×RepetitionPenalty.
	RepetitionPenalty float32 `json:"repetition_penalty,omitempty"`
	// LogitBias adds Bias to the logit of token ID (OpenAI's logit_bias,
	// −100…100), sorted by ID, each ID once.
	LogitBias []LogitBias `json:"logit_bias,omitempty"`
	// AllowedTokenIDs, if not empty, are the only tokens that may be drawn
	// (vLLM's allowed_token_ids).
	AllowedTokenIDs []int32 `json:"allowed_token_ids,omitempty"`
	// BadWords are token sequences that may not be generated (vLLM's
	// bad_words, tokenized): a sequence's last token is banned at a step
	// where the output ends with the rest of it (a one-token sequence is
	// always banned).
	BadWords [][]int32 `json:"bad_words_ids,omitempty"`
	// TopLogprobs (0…MaxLogprobs) asks for that many most likely tokens
	// with each sampled token (SeqOutput.Top).
	TopLogprobs int `json:"top_logprobs,omitempty"`
	// LogprobsMode says which distribution SeqOutput.Logprob and Top are
	// of: the model's (raw, the default) or the one drawn from (processed).
	LogprobsMode LogprobsMode `json:"logprobs_mode,omitempty"`
}

// Validate reports parameters out of range, naming the parameter.
func (p SamplingParams) Validate() error {
	switch {
	case math.IsNaN(float64(p.Temperature)) || p.Temperature < 0 || p.Temperature > 100:
		return fmt.Errorf("temperature must be in [0, 100], got %v", p.Temperature)
	case math.IsNaN(float64(p.TopP)) || p.TopP <= 0 || p.TopP > 1:
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("min_p must be in [0, 1], got %v", p.MinP)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return fmt.Errorf("presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return fmt.Errorf("frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case !(p.RepetitionPenalty >= 0) || math.IsInf(float64(p.RepetitionPenalty), 0):
		return fmt.Errorf("repetition_penalty must be a positive number, got %v", p.RepetitionPenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxLogprobs:
		return fmt.Errorf("top_logprobs must be in [0, %d], got %d", MaxLogprobs, p.TopLogprobs)
	case p.LogprobsMode > LogprobsProcessed:
		return fmt.Errorf("unknown logprobs mode %d", p.LogprobsMode)
	}
	for i, b := range p.LogitBias {
		switch {
		case b.ID < 0:
			return fmt.Errorf("logit_bias: %d is not a token id", b.ID)
		case i > 0 && b.ID <= p.LogitBias[i-1].ID:
			return fmt.Errorf("logit_bias must be sorted by token id, each once (%d after %d)", b.ID, p.LogitBias[i-1].ID)
		case !(b.Bias >= -100 && b.Bias <= 100):
			return fmt.Errorf("logit_bias of token %d must be in [-100, 100], got %v", b.ID, b.Bias)
		}
	}
	for _, id := range p.AllowedTokenIDs {
		if id < 0 {
			return fmt.Errorf("allowed_token_ids: %d is not a token id", id)
		}
	}
	for i, w := range p.BadWords {
		if len(w) == 0 {
			return fmt.Errorf("bad_words[%d] is empty", i)
		}
		for _, id := range w {
			if id < 0 {
				return fmt.Errorf("bad_words[%d]: %d is not a token id", i, id)
			}
		}
	}
	return nil
}

// TokenIDs calls f with every token id p names (logit_bias,
// allowed_token_ids, bad_words), so that a caller who knows the vocabulary
// can refuse ids outside it; f returns false to stop.
func (p *SamplingParams) TokenIDs(f func(id int32) bool) {
	for _, b := range p.LogitBias {
		if !f(b.ID) {
			return
		}
	}
	for _, id := range p.AllowedTokenIDs {
		if !f(id) {
			return
		}
	}
	for _, w := range p.BadWords {
		for _, id := range w {
			if !f(id) {
				return
			}
		}
	}
}

// NeedsHistory reports whether sampling reads SeqInput.Prompt or Output:
// a penalty or bad words are set.
func (p *SamplingParams) NeedsHistory() bool {
	return p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1) ||
		len(p.BadWords) > 0
}

// splitmix64 is Steele, Lea and Flood's SplitMix64 finalizer ("Fast
// splittable pseudorandom number generators", OOPSLA 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Uniform returns the draw in [0, 1) for (seed, step): the same on every
// worker, so prefill (step 0) and decode (steps ≥ 1) sample exactly as a
// colocated worker does.
func Uniform(seed uint64, step int) float64 {
	return float64(splitmix64(seed^splitmix64(uint64(step)+1))>>11) / (1 << 53)
}

// Sample picks a token from logits ([vocab] float32) and returns it with its
// log-probability under softmax(logits): SampleSeq for a sequence with
// sampling parameters p at step step and nothing else set. sc holds
// buffers between calls so that a sampler allocates nothing once warm; nil
// allocates them per call.
//
// Greedy (Temperature 0) returns the lowest id among equal maxima. Otherwise
// it applies temperature, keeps the TopK most likely tokens, then the
// smallest set whose probability reaches TopP, and inverts the CDF at
// Uniform(Seed, step) over ids sorted by probability (ties by id), with the
// fixed arithmetic SampleSeq documents, so every worker draws the same
// token.
func Sample(logits []float32, p SamplingParams, step int, sc *SampleScratch) (int32, float32) {
	return SampleBan(logits, p, nil, step, sc)
}

// SampleBan is Sample with the token ids in ban never drawn (SampleSeq with
// SeqInput.Ban): their logits count as −∞ for the draw (temperature, TopK
// and TopP then apply to the others, as vLLM's MinTokensLogitsProcessor
// does for min_tokens), while the returned log-probability stays the
// token's under softmax of the unmodified logits (vLLM's default "raw"
// logprobs). Ids outside the vocabulary are ignored, and a ban that would
// leave no token is ignored whole. A nil ban draws exactly as Sample.
func SampleBan(logits []float32, p SamplingParams, ban []int32, step int, sc *SampleScratch) (int32, float32) {
	in := SeqInput{Sampling: p, Ban: ban, Step: step}
	out := SampleSeq(logits, &in, sc)
	return out.Token, out.Logprob
}

// descKey maps a logit to a key whose ascending order is the logits'
// descending order (−0 and +0 equal, as they compare).
func descKey(l float32) uint32 {
	b := math.Float32bits(l)
	if b == 0x80000000 {
		b = 0
	}
	if b&0x80000000 != 0 {
		b = ^b // negative: larger magnitude sorts later in ascending order
	} else {
		b ^= 0x80000000
	}
	return ^b
}

// sortByLogit returns all ids ordered by logit descending, ties by id
// ascending, in sc.ids: an LSD radix sort of descKey<<32|id
// over the key's bits (three stable passes of 11, 11 and 10 bits; the ids
// start in ascending order, so ties keep it). With finite, the ids whose
// logit is −∞ are left out (the order's tail, which a draw never takes:
// a grammar's mask leaves most of a vocabulary there), unless every logit
// is −∞.
func sortByLogit(logits []float32, sc *SampleScratch, finite bool) []int32 {
	n := len(logits)
	bufs := &sc.keys
	for i := range bufs {
		if cap(bufs[i]) < n {
			bufs[i] = make([]uint64, n)
		}
	}
	a, b := bufs[0][:n], bufs[1][:n]
	k := 0
	for i, l := range logits {
		if !finite || !math.IsInf(float64(l), -1) {
			a[k] = uint64(descKey(l))<<32 | uint64(i)
			k++
		}
	}
	if k == 0 {
		return sortByLogit(logits, sc, false)
	}
	n, a, b = k, a[:k], b[:k]
	var count [1 << 11]int
	for _, shift := range [...]uint{32, 43, 54} {
		clear(count[:])
		for _, v := range a {
			count[v>>shift&(1<<11-1)]++
		}
		if count[a[0]>>shift&(1<<11-1)] == n {
			continue // every key has the same digit: this pass keeps the order
		}
		pos := 0
		for d, c := range count {
			count[d] = pos
			pos += c
		}
		for _, v := range a {
			d := v >> shift & (1<<11 - 1)
			b[count[d]] = v
			count[d]++
		}
		a, b = b, a
	}
	if cap(sc.ids) < n {
		sc.ids = make([]int32, n)
	}
	ids := sc.ids[:n]
	for i, v := range a {
		ids[i] = int32(uint32(v))
	}
	return ids
}

// SampleScratch is the working memory of SampleSeq, Sample and
// ScorePosition, reused between calls by one goroutine at a time: [vocab]
// ids, two [vocab] float64 buffers (exponentials, candidate probabilities)
// and two [vocab] uint64 buffers (radix sort keys), about 36 bytes per
// vocabulary entry, and when logit processors are used [vocab] processed
// logits, counts and flags (9 bytes more). The zero value is ready to use.
type SampleScratch struct {
	masked  []float32 // processed logits
	ids     []int32   // candidate order
	heap    []int32   // the most likely tokens (Top)
	count   []int32   // per token: occurrences in a history; zero between calls
	allowed []bool    // per token: in AllowedTokenIDs; false between calls
	soft    []int32   // the tokens ban's other bans set (to undo them)
	probs   [2][]float64
	keys    [2][]uint64
}

// before reports whether id i comes before id j in candidate order: higher
// logit first, then lower id.
func before(logits []float32, i, j int32) bool {
	if logits[i] != logits[j] {
		return logits[i] > logits[j]
	}
	return i < j
}

// topK returns the k (0 < k < len(logits)) first ids in candidate order,
// in that order: a heap of the best k seen (its root the worst of them),
// then a sort of the k.
func topK(logits []float32, k int, scratch []int32) []int32 {
	if cap(scratch) < k {
		scratch = make([]int32, k)
	}
	h := scratch[:k]
	for i := range h {
		h[i] = int32(i)
	}
	// Min-heap by candidate order: h[0] is the last in order.
	worse := func(i, j int32) bool { return before(logits, j, i) }
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= k {
				return
			}
			if c+1 < k && worse(h[c+1], h[c]) {
				c++
			}
			if !worse(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	// Every id in the heap is below id, so id comes before the root
	// exactly when its logit is higher.
	worst := logits[h[0]]
	for id := k; id < len(logits); id++ {
		if l := logits[id]; l > worst {
			h[0] = int32(id)
			down(0)
			worst = logits[h[0]]
		}
	}
	slices.SortFunc(h, func(a, b int32) int { return cmpCandidates(logits, a, b) })
	return h
}

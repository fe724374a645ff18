package model

import (
	"math"
	"slices"
)

// SampleSeq samples the next token of one sequence from its logits
// ([vocab] float32, the model's row after the sequence's last token) as in
// asks (in.Sampling, in.Mask, in.Ban, in.Step, in.Forks, and in.Prompt and in.Output
// when a penalty or bad words need them), and returns it with its
// log-probability and, if Sampling.TopLogprobs > 0, the most likely tokens.
// It is a pure function of (logits, in): prefill draws the first token and
// decode the others exactly as a colocated worker does. logits is not
// modified. sc holds buffers between calls so that a sampler allocates
// nothing once warm (only the result's Top and Forks slices, when asked
// for); nil allocates them per call.
//
// # Processing
//
// The logits are processed in vLLM's order, on a copy in sc (none is made
// when no processor is set):
//
//  1. Bans set a logit to −∞: with in.Mask, every id whose bit is clear;
//     the ids of in.Ban; with AllowedTokenIDs, every id not listed; for each
//     of BadWords w, its last token w[k−1] when in.Output ends with w[:k−1]
//     (always for a one-token word). Ids outside the vocabulary are ignored.
//     The mask is a hard constraint and applies first: it never gives way.
//     If no token it allows has a finite logit, the tokens it allows are
//     drawn as equals (their logits set to 0), so the drawn token is always
//     one it allows (a mask that allows no token of the vocabulary is the
//     caller's error; the draw is then the lowest id). AllowedTokenIDs
//     applies next unless it would leave every token at −∞, and then the
//     other bans (in.Ban, BadWords) unless together they would (counting
//     only tokens not −∞ already): min_tokens' EOS ban yields to a grammar
//     that allows only EOS.
//  2. RepetitionPenalty r (0 and 1: off), once per distinct token of
//     in.Prompt ∪ in.Output: l > 0 ? l/r : l×r (float32).
//  3. FrequencyPenalty f and PresencePenalty q, for each token occurring c >
//     0 times in in.Output: l = (l − float32(c)×f) − q (float32, the two
//     subtractions as vLLM's apply_penalties does them).
//  4. LogitBias: l += Bias (float32).
//
// # Drawing
//
// With Temperature 0 the token is the argmax of the processed logits (the
// lowest id among equal maxima). Otherwise, with candidate ids c_0, c_1, …
// ordered by processed logit descending, ties by id ascending (all ids, or
// the TopK first; a trailing run of −∞ dropped, keeping at least one), m the
// highest processed logit and T the temperature, p_i = exp((l(c_i) − m)/T)
// in float64 (x/1 = x exactly, so at T = 1 these are the exponentials of
// the raw log Z when no processor is set):
//
//   - min_p keeps the candidates before the first one with p_i < MinP × p_0
//     (probabilities after temperature, relative to the most likely; a
//     prefix, since p_i decreases along the order), then TopK keeps at most
//     TopK of them (the candidate order is already cut there);
//   - z = Σ p_i over those, added in order; top_p keeps the first i+1 whose
//     running Σ p_j/z (added in order) reaches TopP (all if none does), and
//     z_k = Σ p_i over the kept ones, added in order;
//   - fork f draws with u = Uniform(ForkSeed(Seed, f), Step)·z_k and walks u
//     down by p_0, p_1, … until it is negative (the last kept candidate if it
//     never is).
//
// Finding the order costs O(vocab): a heap of TopK ids, or without TopK a
// stable radix sort of the logits' bits. Fork 0 (ForkSeed(Seed, 0) = Seed)
// is the result's Token; with in.Forks > 1, forks 1…Forks−1 are in the
// result's Forks, drawn from the same processed logits and order.
//
// # Log-probabilities
//
// With LogprobsRaw (the default), Logprob and Top are of softmax of the
// unmodified logits: l − log Z with log Z = M + log Σ exp(l − M) (M the
// highest logit, exponentials added in id order, float64). With
// LogprobsProcessed they are of the distribution drawn from: at
// temperature 0, softmax of the processed logits (the same formula over
// them); otherwise (l − m)/T − log z_k for a kept candidate and −∞ for
// every other token. Top lists the TopLogprobs most likely tokens of that
// distribution (ties by lower id; in processed mode the tokens the draw
// excludes follow the kept ones in processed-logit order, with −∞), found
// by a heap of TopLogprobs ids over the vocabulary, O(vocab·log N), or read
// off the candidate order when it is already sorted that far. Each log Z
// is computed once per call.
//
// A request that sets none of the logit processors and no logprob option
// draws exactly as Sample and SampleBan always have (they call SampleSeq).
func SampleSeq(logits []float32, in *SeqInput, sc *SampleScratch) SeqOutput {
	V := len(logits)
	if V == 0 {
		return SeqOutput{}
	}
	if sc == nil {
		sc = new(SampleScratch)
	}
	p := &in.Sampling
	proc := process(logits, in, sc)
	plain := &proc[0] == &logits[0] // no processor changed a logit
	raw := p.LogprobsMode != LogprobsProcessed
	nTop := min(max(p.TopLogprobs, 0), V)
	forks := max(in.Forks, 1)

	maxI := 0
	for i, l := range proc {
		if l > proc[maxI] {
			maxI = i
		}
	}
	maxP := float64(proc[maxI])
	var rawLogZ float64
	if raw && !plain {
		rawLogZ = logSumExp(logits)
	}

	if p.Temperature == 0 {
		// Greedy: the logprobs are of the raw logits (raw mode, computed
		// above when processors changed them) or of the processed ones
		// (processed mode; the same as raw when no processor applies).
		dist := proc
		var logZ float64
		switch {
		case raw && !plain:
			dist, logZ = logits, rawLogZ
		default:
			var sum float64
			for _, l := range proc {
				sum += math.Exp(float64(l) - maxP)
			}
			logZ = maxP + math.Log(sum)
		}
		tok := int32(maxI)
		lp := float32(float64(dist[tok]) - logZ)
		var top []TokenLogprob
		if nTop > 0 {
			ids := topN(dist, nTop, sc)
			top = make([]TokenLogprob, nTop*forks)
			for i, id := range ids {
				top[i] = TokenLogprob{ID: id, Logprob: float32(float64(dist[id]) - logZ)}
			}
		}
		return forkOutputs(forks, top, nTop, func(int) (int32, float32) { return tok, lp })
	}

	t := float64(p.Temperature)
	bufs := &sc.probs
	for i := range bufs {
		if cap(bufs[i]) < V {
			bufs[i] = make([]float64, V)
		}
	}
	// e[id] = e^(logit − max), kept at temperature 1, where it is also the
	// candidates' p (x/1 = x exactly).
	var e []float64
	if raw && plain {
		var sum float64
		if t == 1 {
			e = bufs[0][:V]
			for i, l := range logits {
				e[i] = math.Exp(float64(l) - maxP)
				sum += e[i]
			}
		} else {
			for _, l := range logits {
				sum += math.Exp(float64(l) - maxP)
			}
		}
		rawLogZ = maxP + math.Log(sum)
	}
	if cap(sc.ids) < V {
		sc.ids = make([]int32, V)
	}
	var ord []int32 // candidate order, before −∞ are dropped
	switch {
	case p.TopK > 0 && p.TopK <= V/16:
		ord = topK(proc, p.TopK, sc.ids)
	case p.TopK > 0 && p.TopK < V:
		ord = sortByLogit(proc, sc, !plain)
		ord = ord[:min(p.TopK, len(ord))]
	default:
		// Processors may set logits to −∞ (bans, a grammar's mask):
		// those are left out of the sort.
		ord = sortByLogit(proc, sc, !plain)
	}
	idx := ord
	for len(idx) > 1 && math.IsInf(float64(proc[idx[len(idx)-1]]), -1) {
		idx = idx[:len(idx)-1]
	}
	probs := bufs[1][:len(idx)] // p_i in candidate order
	for i, id := range idx {
		if e != nil {
			probs[i] = e[id]
		} else {
			probs[i] = math.Exp((float64(proc[id]) - maxP) / t)
		}
	}
	n := len(idx)
	if minP := float64(p.MinP); minP > 0 {
		for i := 1; i < n; i++ {
			if probs[i] < minP*probs[0] {
				n = i
				break
			}
		}
	}
	var z float64
	for i := range n {
		z += probs[i]
	}
	topP := float64(p.TopP)
	if topP <= 0 || topP > 1 {
		topP = 1
	}
	keep, cum := n, 0.0
	var zk float64 // Σ p_i for i < keep, in order
	for i := range n {
		pi := probs[i]
		zk += pi
		cum += pi / z
		if cum >= topP {
			keep = i + 1
			break
		}
	}
	logZk := math.Log(zk)
	lpOf := func(id int32) float32 {
		if raw {
			return float32(float64(logits[id]) - rawLogZ)
		}
		return float32((float64(proc[id])-maxP)/t - logZk)
	}
	var top []TokenLogprob
	if nTop > 0 {
		top = make([]TokenLogprob, nTop*forks)
		switch {
		case raw && (!plain || len(ord) < nTop):
			for i, id := range topN(logits, nTop, sc) {
				top[i] = TokenLogprob{ID: id, Logprob: float32(float64(logits[id]) - rawLogZ)}
			}
		default:
			// The candidate order is the processed order (the raw one when
			// plain); the first keep are the kept candidates.
			ids := ord
			if len(ids) < nTop {
				ids = topN(proc, nTop, sc)
			}
			for i, id := range ids[:nTop] {
				lp := float32(math.Inf(-1))
				if raw || i < keep {
					lp = lpOf(id)
				}
				top[i] = TokenLogprob{ID: id, Logprob: lp}
			}
		}
	}
	return forkOutputs(forks, top, nTop, func(f int) (int32, float32) {
		u := Uniform(ForkSeed(p.Seed, f), in.Step) * zk
		for i := range keep {
			u -= probs[i]
			if u < 0 {
				return idx[i], lpOf(idx[i])
			}
		}
		return idx[keep-1], lpOf(idx[keep-1])
	})
}

// forkOutputs builds the result of forks draws, draw(f) giving fork f's
// token and log-probability; top holds the first nTop alternatives, shared
// by every fork's distribution, in room for forks copies.
func forkOutputs(forks int, top []TokenLogprob, nTop int, draw func(f int) (int32, float32)) SeqOutput {
	tok, lp := draw(0)
	out := SeqOutput{Token: tok, Logprob: lp}
	if nTop > 0 {
		out.Top = top[:nTop:nTop]
	}
	if forks <= 1 {
		return out
	}
	out.Forks = make([]SeqOutput, forks-1)
	for f := 1; f < forks; f++ {
		tok, lp := draw(f)
		o := &out.Forks[f-1]
		o.Token, o.Logprob = tok, lp
		if nTop > 0 {
			o.Top = top[f*nTop : (f+1)*nTop : (f+1)*nTop]
			copy(o.Top, out.Top)
		}
	}
	return out
}

// logSumExp is log Σ exp(l) over x: M + log Σ exp(l − M) with M the
// highest value, the exponentials added in id order in float64.
func logSumExp(x []float32) float64 {
	m := float64(x[0])
	for _, l := range x {
		m = max(m, float64(l))
	}
	var sum float64
	for _, l := range x {
		sum += math.Exp(float64(l) - m)
	}
	return m + math.Log(sum)
}

// process returns the logits SampleSeq draws from: logits itself when in
// sets no ban, penalty or bias (or they change nothing), else a copy in sc
// with them applied (see SampleSeq).
func process(logits []float32, in *SeqInput, sc *SampleScratch) []float32 {
	p := &in.Sampling
	rp := p.RepetitionPenalty
	rep := rp != 0 && rp != 1
	pen := p.FrequencyPenalty != 0 || p.PresencePenalty != 0
	bans := in.Mask != nil || len(in.Ban) > 0 || len(p.AllowedTokenIDs) > 0 || len(p.BadWords) > 0
	if !bans && !rep && !pen && len(p.LogitBias) == 0 {
		return logits
	}
	V := len(logits)
	if cap(sc.masked) < V {
		sc.masked = make([]float32, V)
	}
	proc := sc.masked[:V]
	copy(proc, logits)
	if bans && !ban(proc, logits, in, sc) && !rep && !pen && len(p.LogitBias) == 0 {
		return logits
	}
	if rep || pen {
		if cap(sc.count) < V {
			sc.count = make([]int32, V)
		}
	}
	count := sc.count
	inVocab := func(t int32) bool { return t >= 0 && int(t) < V }
	if rep {
		// count[t] marks a token already penalized; cleared afterwards.
		for _, hist := range [2][]int32{in.Prompt, in.Output} {
			for _, t := range hist {
				if inVocab(t) && count[t] == 0 {
					count[t] = 1
					if l := proc[t]; l > 0 {
						proc[t] = l / rp
					} else {
						proc[t] = l * rp
					}
				}
			}
		}
		for _, hist := range [2][]int32{in.Prompt, in.Output} {
			for _, t := range hist {
				if inVocab(t) {
					count[t] = 0
				}
			}
		}
	}
	if pen {
		fp, pp := p.FrequencyPenalty, p.PresencePenalty
		for _, t := range in.Output {
			if inVocab(t) {
				count[t]++
			}
		}
		for _, t := range in.Output {
			if inVocab(t) && count[t] > 0 {
				proc[t] -= float32(count[t]) * fp
				proc[t] -= pp
				count[t] = 0
			}
		}
	}
	for _, b := range p.LogitBias {
		if inVocab(b.ID) {
			proc[b.ID] += b.Bias
		}
	}
	return proc
}

// ban applies in's bans to proc (a copy of logits) and reports whether any
// applies. in.Mask is a hard constraint that never gives way (when no token
// it allows has a finite logit, those tokens get logit 0). allowed_token_ids
// is hard too, after it: it is ignored only when it would leave no token
// (an allowed list of ids outside the vocabulary or the mask). The other
// bans (SeqInput.Ban: min_tokens' EOS and stop tokens; bad_words) give way
// to both: when they would leave no token, they are all ignored and the
// allowed tokens stay the only candidates.
func ban(proc, logits []float32, in *SeqInput, sc *SampleScratch) bool {
	V := len(proc)
	live := 0 // tokens not −∞
	for _, l := range proc {
		live += int(b2i(!math.IsInf(float64(l), -1)))
	}
	all := live
	set := func(id int32) bool {
		if id >= 0 && int(id) < V && !math.IsInf(float64(proc[id]), -1) {
			proc[id] = float32(math.Inf(-1))
			live--
			return true
		}
		return false
	}
	changed := false
	if mask := in.Mask; mask != nil {
		for id := range int32(V) {
			if !maskHas(mask, id) {
				set(id)
			}
		}
		if live == 0 {
			// No allowed token has a finite logit: they are drawn as equals.
			for id := range int32(V) {
				if maskHas(mask, id) {
					proc[id] = 0
					live++
					changed = true
				}
			}
		}
	}
	p := &in.Sampling
	if len(p.AllowedTokenIDs) > 0 && anyLive(proc, p.AllowedTokenIDs) {
		if cap(sc.allowed) < V {
			sc.allowed = make([]bool, V)
		}
		allowed := sc.allowed[:V]
		for _, id := range p.AllowedTokenIDs {
			if id >= 0 && int(id) < V {
				allowed[id] = true
			}
		}
		for id := range int32(V) {
			if !allowed[id] {
				set(id)
			}
		}
		for _, id := range p.AllowedTokenIDs {
			if id >= 0 && int(id) < V {
				allowed[id] = false
			}
		}
	}
	soft := sc.soft[:0] // the tokens the other bans set, to undo them
	for _, id := range in.Ban {
		if set(id) {
			soft = append(soft, id)
		}
	}
	out := in.Output
	for _, w := range p.BadWords {
		k := len(w)
		if k == 0 || k-1 > len(out) || !slices.Equal(out[len(out)-(k-1):], w[:k-1]) {
			continue
		}
		if set(w[k-1]) {
			soft = append(soft, w[k-1])
		}
	}
	if live == 0 {
		for _, id := range soft {
			proc[id] = logits[id]
			if changed {
				proc[id] = 0 // the mask's equal logits (all that was live)
			}
		}
		live += len(soft)
	}
	sc.soft = soft[:0]
	return changed || live < all
}

// anyLive reports whether one of ids is in the vocabulary with a logit
// not −∞ in proc.
func anyLive(proc []float32, ids []int32) bool {
	for _, id := range ids {
		if id >= 0 && int(id) < len(proc) && !math.IsInf(float64(proc[id]), -1) {
			return true
		}
	}
	return false
}

// maskHas reports whether mask allows token id: bit id%64 of word id/64
// (false past the mask's end).
func maskHas(mask []uint64, id int32) bool {
	w := int(id) >> 6
	return w < len(mask) && mask[w]>>(uint(id)&63)&1 != 0
}

// ScorePosition returns the prompt logprobs of one position: target's
// log-probability and rank under softmax of logits ([vocab], the model's
// row there), and the len(top) most likely tokens, written into top
// (most likely first, ties by lower id) and returned as Top (nil when top
// is empty). Prompt logprobs are always of the model's raw distribution
// (vLLM's prompt_logprobs ignore logits processors and the logprobs mode):
// l − log Z with log Z = M + log Σ exp(l − M), M the highest logit, the sum
// by expSum (within 10^−15 relative of SampleSeq's, which adds math.Exp
// terms in order for bit-compatibility with earlier releases; the two
// logprobs of one token agree to float32 rounding). Rank is 1 + the number
// of tokens before target in candidate order (a higher logit, or an equal
// one and a lower id). A target outside the vocabulary gives the zero
// value. It allocates nothing; sc may be nil.
func ScorePosition(logits []float32, target int32, top []TokenLogprob, sc *SampleScratch) PositionLogprobs {
	return ScorePositionWith(logits, target, top, sc, nil)
}

// ScorePositionWith is ScorePosition with Σ exp(l − M) computed by sumExp,
// for a model with a faster way (vector kernels) to compute it: sumExp(x,
// M) must return the sum over x, and may overwrite x (ScorePositionWith
// reads logits only before calling it). nil means expSum.
func ScorePositionWith(logits []float32, target int32, top []TokenLogprob, sc *SampleScratch,
	sumExp func(x []float32, m float32) float64) PositionLogprobs {
	V := len(logits)
	if target < 0 || int(target) >= V {
		return PositionLogprobs{}
	}
	lt := logits[target]
	maxI := 0 // the first of the highest logits: the most likely token
	rank := int32(1)
	for i, l := range logits[:target] {
		if l > logits[maxI] {
			maxI = i
		}
		rank += b2i(l >= lt)
	}
	for i, l := range logits[target:] {
		if l > logits[maxI] {
			maxI = int(target) + i
		}
		rank += b2i(l > lt)
	}
	m := logits[maxI]
	n := min(len(top), V)
	switch {
	case n == 1:
		top[0] = TokenLogprob{ID: int32(maxI), Logprob: m}
	case n > 1:
		if sc == nil {
			sc = new(SampleScratch)
		}
		for i, id := range topN(logits, n, sc) {
			top[i] = TokenLogprob{ID: id, Logprob: logits[id]}
		}
	}
	var sum float64
	if sumExp != nil {
		sum = sumExp(logits, m)
	} else {
		sum = expSum(logits, float64(m))
	}
	logZ := float64(m) + math.Log(sum)
	res := PositionLogprobs{Token: TokenLogprob{ID: target, Logprob: float32(float64(lt) - logZ)}, Rank: rank}
	if n > 0 {
		for i := range top[:n] {
			top[i].Logprob = float32(float64(top[i].Logprob) - logZ)
		}
		res.Top = top[:n:n]
	}
	return res
}

// b2i is 1 for true, 0 for false (compiled without a branch).
func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// topN returns the n (0 < n ≤ len(x)) first ids of x in candidate order
// (higher value first, ties by lower id), in that order, in sc.heap.
func topN(x []float32, n int, sc *SampleScratch) []int32 {
	if n >= len(x) {
		if cap(sc.heap) < len(x) {
			sc.heap = make([]int32, len(x))
		}
		h := sc.heap[:len(x)]
		for i := range h {
			h[i] = int32(i)
		}
		slices.SortFunc(h, func(a, b int32) int { return cmpCandidates(x, a, b) })
		return h
	}
	sc.heap = topK(x, n, sc.heap)
	return sc.heap[:n]
}

// cmpCandidates orders ids i and j in candidate order: −1 if i comes first.
func cmpCandidates(x []float32, i, j int32) int {
	if before(x, i, j) {
		return -1
	}
	if i == j {
		return 0
	}
	return 1
}

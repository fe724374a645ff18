package llama

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// buffers are a Model instance's activations and per-worker scratch, grown
// as batches need and reused across Forward calls. Shapes are for a batch
// of T tokens (all the sequences' tokens, concatenated) and R logit rows.
type buffers struct {
	x    []float32 // residual stream [T, hidden]
	h    []float32 // normalised input of a sublayer [T, hidden]
	q    []float32 // queries [T, heads, headDim]
	k, v []float32 // keys and values [T, kvHeads, headDim]
	att  []float32 // attention output [T, heads, headDim]
	tmp  []float32 // sublayer output before the residual add [T, hidden]
	gate []float32 // [T, inter]; silu(gate)·up after the MLP's first half
	up   []float32 // [T, inter]
	cos  []float32 // RoPE [T, d/2], d the rotated dimensions (Config.ropeDims)
	sin  []float32
	// cosL and sinL are the sliding layers' RoPE [T, d/2] when their
	// base differs (Model.ropeLocal).
	cosL, sinL []float32
	sel        []float32 // final-normalised rows that need logits [R, hidden]
	lgt        []float32 // logits [R, vocab]

	pos    []int32 // position of each token [T]
	seqOf  []int32 // sequence of each token [T]
	lrows  []logitRow
	ltoks  []int                      // token of each logit row of a block [R]
	scores [][]model.PositionLogprobs // by sequence: Forward's prompt scores
	tops   [][]model.TokenLogprob     // by sequence: room for their top alternatives
	scr    []scratch
	q8     q8Acts     // a linear layer's input quantized for the 32-element block types
	q8k    q8KActs    // … and for Q4_K/Q6_K weights
	moe    moeBuffers // a mixture-of-experts MLP's (moe.go)

	// The step's parallel loops, reused so a Forward allocates nothing
	// once its buffers have grown.
	lin    linJob
	outs   [3]linOut
	attn   attnJob
	tok    tokJob
	sample sampleJob
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Forward runs one batched step (see model.Model): it writes the KV of every
// sequence's tokens into its pages and, for sequences with Sample set, picks
// the next token with model.SampleSeq from the logits after the last token,
// and for sequences with Score set computes the prompt logprobs
// (model.ScorePositionWith, the exponentials summed by the kernels' expf)
// of the logits after each scored token (out[i] is zero for the others).
// Logits are computed only for those rows, at most maxLogitRows at a time.
//
// It first checks the whole batch and returns an error, having written
// nothing, for: a closed model, a pool whose geometry differs from
// Info().Geometry, len(out) ≠ len(seqs), a negative Pos, no tokens,
// Pos+len(Tokens) > ContextLen, a token id outside [0, VocabSize), too few
// pages, a page id outside the pool, a page listed twice among the pages
// covering one sequence, a page that one sequence writes and another covers,
// invalid sampling parameters (TopP 0 is read as 1, as model.Sample
// does), and the other fields model.BatchCheck refuses (forks, prompt
// scores, token ids outside the vocabulary). If ctx ends during the step it
// returns ctx.Err(); the KV of the batch's tokens may then be partly
// written, and out is not set.
//
// Results do not depend on the batch: a sequence gets bit-identical KV,
// tokens, logprobs and scores alone or with others, prefilled whole or in
// chunks.
func (m *Model) Forward(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput, out []model.SeqOutput) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.check(pool, seqs, len(out)); err != nil {
		return err
	}
	if len(seqs) == 0 {
		return nil
	}
	b := &m.buf
	m.planLogitRows(seqs)
	tm := startTeam(m.threadCount())
	defer tm.stop()
	if err := m.run(ctx, tm, pool, seqs); err != nil {
		return err
	}
	for i := range out {
		out[i] = model.SeqOutput{}
	}
	defer func() { clear(b.scores); clear(b.tops) }() // they belong to out now
	for r0 := 0; r0 < len(b.lrows); r0 += maxLogitRows {
		if err := ctx.Err(); err != nil {
			return err
		}
		rows := b.lrows[r0:min(r0+maxLogitRows, len(b.lrows))]
		b.ltoks = b.ltoks[:0]
		for _, r := range rows {
			b.ltoks = append(b.ltoks, r.tok)
		}
		logits := m.logitRows(tm, b.ltoks)
		b.sample = sampleJob{m: m, scr: b.scr, logits: logits, vocab: m.info.VocabSize, rows: rows, seqs: seqs, out: out, scores: b.scores, tops: b.tops}
		tm.parallelFor(len(rows), 1, &b.sample)
		b.sample = sampleJob{}
	}
	for i, sc := range b.scores {
		out[i].Scores = sc
	}
	return nil
}

// maxLogitRows bounds the logit rows computed at once ([maxLogitRows,
// vocab] float32: 50 MB for a 49152-token vocabulary): a prompt scored at
// every position runs its classifier in blocks of that many rows, enough
// for the matrix kernels' long-batch path (widenMinTokens).
const maxLogitRows = 256

// logitRow is a token whose logits a step needs: to sample its sequence's
// next token, to score a prompt position, or both.
type logitRow struct {
	tok    int  // index among the batch's tokens
	seq    int  // its sequence
	sample bool // sample seq's next token here (its last token)
	// score ≥ 0: the index in Tokens of a scored position, whose top
	// alternatives go to top[topOff:topOff+ScoreTop] of the sequence.
	score  int
	topOff int
}

// planLogitRows lists the logit rows of seqs in b.lrows (in token order)
// and allocates the prompt scores of the sequences that ask (b.scores).
func (m *Model) planLogitRows(seqs []model.SeqInput) {
	b := &m.buf
	b.lrows = b.lrows[:0]
	if cap(b.scores) < len(seqs) {
		b.scores = make([][]model.PositionLogprobs, len(seqs))
		b.tops = make([][]model.TokenLogprob, len(seqs))
	}
	b.scores, b.tops = b.scores[:len(seqs)], b.tops[:len(seqs)]
	t := 0
	for i := range seqs {
		s := &seqs[i]
		last := len(s.Tokens) - 1
		sampled := false
		if s.Score != nil {
			b.scores[i] = make([]model.PositionLogprobs, len(s.Tokens))
			off := 0
			for j, target := range s.Score {
				if target < 0 {
					continue
				}
				sample := s.Sample && j == last
				sampled = sampled || sample
				b.lrows = append(b.lrows, logitRow{tok: t + j, seq: i, sample: sample, score: j, topOff: off})
				off += s.ScoreTop
			}
			if off > 0 {
				b.tops[i] = make([]model.TokenLogprob, off)
			}
		}
		if s.Sample && !sampled {
			b.lrows = append(b.lrows, logitRow{tok: t + last, seq: i, sample: true, score: -1})
		}
		t += len(s.Tokens)
	}
}

// sampleJob samples and scores the logit rows of a block, one row per
// index. A row both sampled and scored is sampled first (scoring
// overwrites the row).
type sampleJob struct {
	m      *Model
	scr    []scratch
	logits []float32 // [R, vocab]
	vocab  int
	rows   []logitRow
	seqs   []model.SeqInput
	out    []model.SeqOutput
	scores [][]model.PositionLogprobs
	tops   [][]model.TokenLogprob
}

func (j *sampleJob) run(w, lo, hi int) {
	sc := &j.scr[w]
	V := j.vocab
	for r := lo; r < hi; r++ {
		row := &j.rows[r]
		s := &j.seqs[row.seq]
		x := j.logits[r*V : (r+1)*V]
		if row.sample {
			j.out[row.seq] = model.SampleSeq(x, s, &sc.sample)
		}
		if row.score >= 0 {
			var top []model.TokenLogprob
			if n := s.ScoreTop; n > 0 {
				top = j.tops[row.seq][row.topOff : row.topOff+n : row.topOff+n]
			}
			j.scores[row.seq][row.score] = model.ScorePositionWith(x, s.Score[row.score], top, &sc.sample, j.m.sumExp)
		}
	}
}

// ForwardLogits runs one batched step like Forward (same checks, same KV
// writes; Sample and Sampling are ignored) and returns the logits after
// every token: logits[i] is [len(seqs[i].Tokens), VocabSize], row-major,
// natural-log scale up to a constant (softmax gives the probabilities). It
// is for scoring and tests.
func (m *Model) ForwardLogits(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput) ([][]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	plain := make([]model.SeqInput, len(seqs))
	for i, s := range seqs {
		plain[i] = model.SeqInput{Pages: s.Pages, Pos: s.Pos, Tokens: s.Tokens}
	}
	if err := m.check(pool, plain, len(plain)); err != nil {
		return nil, err
	}
	tm := startTeam(m.threadCount())
	defer tm.stop()
	if err := m.run(ctx, tm, pool, plain); err != nil {
		return nil, err
	}
	b := &m.buf
	b.ltoks = b.ltoks[:0]
	for t := range len(b.pos) {
		b.ltoks = append(b.ltoks, t)
	}
	logits := m.logitRows(tm, b.ltoks)
	V := m.info.VocabSize
	res := make([][]float32, len(seqs))
	off := 0
	for i, s := range seqs {
		n := len(s.Tokens) * V
		res[i] = append([]float32(nil), logits[off:off+n]...)
		off += n
	}
	return res, nil
}

// run computes the batch (already checked) on team tm, up to the last
// layer's residual stream b.x [T, hidden]; logitRows then computes the
// logits of the rows that need them.
//
// Shapes: T = Σ len(Tokens); per layer (transformers' LlamaDecoderLayer):
//
//	h = RMSNorm(x)·g₁                      [T, hidden]
//	q, k, v = h·Wqᵀ(+b), h·Wkᵀ(+b), h·Wvᵀ(+b)   [T, heads·hd], [T, kvHeads·hd] ×2
//	q, k = RMSNorm(q)·g_q, RMSNorm(k)·g_k  per head of hd values (Qwen3 only)
//	q, k = RoPE(q), RoPE(k)                at each token's position
//	KV pages ← k, v                        (then attention reads them back)
//	a = softmax(q·Kᵀ/√hd, causal)·V        [T, heads·hd]  (sliding layers: the last W positions)
//	x += a·Woᵀ(+b)
//	h = RMSNorm(x)·g₂
//	x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ        (a mixture of experts: moe.go)
//
// then (logitRows) logits = RMSNorm(x)·g_final·W_lmᵀ for the requested rows. Each line
// is one parallel loop over the team (q, k and v together; the norms, RoPE
// and KV writes per token only for long batches); the residual adds and the
// SwiGLU product are done by the tasks of the matrix before them.
func (m *Model) run(ctx context.Context, tm *team, pool *kvcache.Pool, seqs []model.SeqInput) error {
	cfg := &m.w.cfg
	H, D, I := cfg.HiddenSize, cfg.HeadDim, cfg.IntermediateSize
	if cfg.Experts > 0 {
		I = 0 // no dense MLP (moeMLP has its own buffers)
	}
	qDim, kvDim := cfg.Heads*D, cfg.KVHeads*D
	T := 0
	for i := range seqs {
		T += len(seqs[i].Tokens)
	}
	b := &m.buf
	b.x, b.h, b.tmp = grow(b.x, T*H), grow(b.h, T*H), grow(b.tmp, T*H)
	b.q, b.att = grow(b.q, T*qDim), grow(b.att, T*qDim)
	b.k, b.v = grow(b.k, T*kvDim), grow(b.v, T*kvDim)
	b.gate, b.up = grow(b.gate, T*I), grow(b.up, T*I)
	rd := cfg.ropeDims()
	b.cos, b.sin = grow(b.cos, T*rd/2), grow(b.sin, T*rd/2)
	for len(b.scr) < tm.size() {
		b.scr = append(b.scr, scratch{})
	}
	if cap(b.pos) < T {
		b.pos, b.seqOf = make([]int32, T), make([]int32, T)
	}
	b.pos, b.seqOf = b.pos[:T], b.seqOf[:T]

	// Embeddings, positions, RoPE angles.
	t := 0
	for i := range seqs {
		s := &seqs[i]
		for j, tok := range s.Tokens {
			b.pos[t] = int32(s.Pos + j)
			b.seqOf[t] = int32(i)
			dst := b.x[t*H : (t+1)*H]
			copy(dst, m.w.embed.Row(int(tok), dst)) // a no-op when Row widened into dst
			if cfg.EmbedScale {
				// Gemma: ×√hidden (llama.cpp's ggml_scale by sqrtf(n_embd);
				// transformers' normalizer in the activations' dtype).
				es := float32(math.Sqrt(float64(H)))
				for i := range dst {
					dst[i] *= es
				}
			}
			t++
		}
	}
	if cfg.GGMLNumerics {
		ropeTableGGML(b.cos, b.sin, b.pos, m.ropeGlobal)
	} else {
		ropeTable(b.cos, b.sin, b.pos, m.invFreq)
	}
	if s := m.ropeScale; s != 1 {
		// LongRoPE's attention factor (ggml's mscale: cosf(θ)·mscale).
		for i := range b.cos {
			b.cos[i] *= s
			b.sin[i] *= s
		}
	}
	if m.ropeLocal != nil {
		b.cosL, b.sinL = grow(b.cosL, T*rd/2), grow(b.sinL, T*rd/2)
		if cfg.GGMLNumerics {
			ropeTableGGML(b.cosL, b.sinL, b.pos, m.ropeLocal)
		} else {
			ropeTable(b.cosL, b.sinL, b.pos, m.invFreqLocal)
		}
	}

	ks := m.ks
	b.attn = attnJob{ks: ks, scr: b.scr, pool: pool, seqs: seqs, q: b.q, att: b.att, pos: b.pos, seqOf: b.seqOf,
		heads: cfg.Heads, kvH: cfg.KVHeads, d: D, scale: m.attnScale, softcap: cfg.AttnSoftcap}
	b.tok = tokJob{m: m, pool: pool, seqs: seqs, T: T}
	defer func() { b.attn, b.tok, b.lin = attnJob{}, tokJob{}, linJob{} }() // drop references to the caller's data
	glu := gluSiLU
	if cfg.GeluTanh {
		glu = gluGELUTanh
		if cfg.GGMLNumerics {
			glu = gluGELUTanhGGML
		}
	}
	lin := func(x []float32, resid []float32, gated bool, outs ...linOut) {
		n := copy(b.outs[:], outs)
		b.lin = linJob{ks: ks, scr: b.scr, x: x, T: T, outs: b.outs[:n], resid: resid, swiglu: gated, glu: glu, geluTab: m.w.geluTab, q8: &b.q8, q8k: &b.q8k}
		linear(tm, &b.lin)
	}
	// Gemma2 normalises each sublayer's output before its residual add:
	// the output matrix writes b.tmp, and a per-token loop adds it.
	var oResid []float32
	if !cfg.PostNorms {
		oResid = b.x
	}
	tokGrain := max(1, 256/max(1, H/64)) // tokens per task of the per-token loops

	// Pages are written from the first layer on; mark them even if ctx ends
	// the step early, so version-keyed caches of the pool see the change.
	defer m.markWritten(pool, seqs)
	for li := range m.w.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		ly := &m.w.layers[li]
		b.tok.li, b.tok.op = li, tokAttnNorm
		tm.parallelFor(T, tokGrain, &b.tok)
		lin(b.h, nil, false, linOut{ly.q, ly.qb, b.q}, linOut{ly.k, ly.kb, b.k}, linOut{ly.v, ly.vb, b.v})
		b.tok.op = tokRopeKV
		tm.parallelFor(T, tokGrain, &b.tok)
		b.attn.li, b.attn.window = li, 0
		if cfg.SlidingLayers != nil && cfg.SlidingLayers[li] {
			b.attn.window = cfg.SlidingWindow
		}
		tm.parallelFor(b.attn.tasks(T), 1, &b.attn)
		lin(b.att, oResid, false, linOut{ly.o, ly.ob, b.tmp})
		if cfg.PostNorms {
			b.tok.op = tokAttnPost
			tm.parallelFor(T, tokGrain, &b.tok)
		}

		b.tok.op = tokMLPNorm
		tm.parallelFor(T, tokGrain, &b.tok)
		if cfg.Experts > 0 {
			m.moeMLP(tm, ly, T) // x += MoE(h)
			continue
		}
		lin(b.h, nil, true, linOut{ly.gate, ly.gateB, b.gate}, linOut{ly.up, ly.upB, b.up})
		lin(b.gate, oResid, false, linOut{ly.down, ly.downB, b.tmp})
		if cfg.PostNorms {
			b.tok.op = tokMLPPost
			tm.parallelFor(T, tokGrain, &b.tok)
		}
	}
	return ctx.Err()
}

// logitRows returns the logits after the tokens toks (indices into the
// batch run just computed): [len(toks), vocab] = RMSNorm(x[t])·g_final·
// W_lmᵀ, a view of the instance's buffer. Each row is computed alone
// (per-row norm, batch-invariant kernels), so a token's logits do not
// depend on which other rows are computed with it.
func (m *Model) logitRows(tm *team, toks []int) []float32 {
	cfg := &m.w.cfg
	H, V := cfg.HiddenSize, cfg.VocabSize
	b := &m.buf
	R := len(toks)
	b.sel = grow(b.sel, R*H)
	for r, t := range toks {
		rmsNorm(b.sel[r*H:(r+1)*H], b.x[t*H:(t+1)*H], 1, H, m.w.norm, cfg.RMSNormEps, cfg.GGMLNumerics)
	}
	b.lgt = grow(b.lgt, R*V)
	if R > 0 {
		b.lin = linJob{ks: m.ks, scr: b.scr, x: b.sel, T: R, outs: append(b.outs[:0], linOut{w: m.w.lmHead, dst: b.lgt}), q8: &b.q8, q8k: &b.q8k}
		linear(tm, &b.lin)
		b.lin = linJob{}
		if c := cfg.FinalSoftcap; c > 0 {
			softcapRow(b.lgt, c)
		}
	}
	return b.lgt
}

// sumExp returns Σ exp(x_i − mx) over x, overwriting x with the terms
// (model.ScorePositionWith's sum for prompt scores): each term is expf
// (the kernels' e^x, the same bits on every kernel set), added in blocks of
// expBlock elements, element i of a block to lane i mod 16 in order, each
// block's lanes reduced by the canonical tree in float32 and the blocks'
// sums added in float64.
func (m *Model) sumExp(x []float32, mx float32) float64 {
	var sum float64
	for lo := 0; lo < len(x); lo += expBlock {
		blk := x[lo:min(lo+expBlock, len(x))]
		a := expArgs{x: unsafe.Pointer(&blk[0]), m: mx}
		done := 0
		if ks := m.ks; ks != nil {
			done = len(blk)
			if !ks.expTail {
				done = len(blk) / 16 * 16
			}
			if done > 0 {
				a.n = uintptr(done)
				ks.expSum(&a)
			}
		}
		for i := done; i < len(blk); i++ {
			e := expf(blk[i] - mx)
			blk[i] = e
			a.lanes[i%16] += e
		}
		sum += float64(reduce16(&a.lanes))
	}
	return sum
}

// expBlock is the block of sumExp: 8 terms per float32 lane before the
// float64 sum, so its rounding stays near float32's own.
const expBlock = 128

// tokJob runs the per-token steps of a layer over a range of tokens.
type tokJob struct {
	m    *Model
	pool *kvcache.Pool
	seqs []model.SeqInput
	T    int
	li   int
	op   int
}

// tokJob operations.
const (
	tokAttnNorm = iota // h = RMSNorm(x)·input_layernorm
	tokRopeKV          // (Qwen3: RMS-normalise each head of q and k,) rotate q and k, store k and v in the pages
	tokMLPNorm         // h = RMSNorm(x)·post_attention_layernorm
	tokAttnPost        // Gemma2: x += RMSNorm(tmp)·post_attention_layernorm
	tokMLPPost         // Gemma2: x += RMSNorm(tmp)·post_feedforward_layernorm
)

func (j *tokJob) run(_, lo, hi int) {
	m := j.m
	cfg := &m.w.cfg
	b := &m.buf
	H, D := cfg.HiddenSize, cfg.HeadDim
	ly := &m.w.layers[j.li]
	switch j.op {
	case tokAttnNorm:
		rmsNorm(b.h[lo*H:hi*H], b.x[lo*H:hi*H], hi-lo, H, ly.attnNorm, cfg.RMSNormEps, cfg.GGMLNumerics)
	case tokMLPNorm:
		rmsNorm(b.h[lo*H:hi*H], b.x[lo*H:hi*H], hi-lo, H, ly.mlpNorm, cfg.RMSNormEps, cfg.GGMLNumerics)
	case tokAttnPost, tokMLPPost:
		g := ly.attnPostNorm
		if j.op == tokMLPPost {
			g = ly.mlpPostNorm
		}
		rmsNorm(b.tmp[lo*H:hi*H], b.tmp[lo*H:hi*H], hi-lo, H, g, cfg.RMSNormEps, cfg.GGMLNumerics)
		addInPlace(b.x[lo*H:hi*H], b.tmp[lo*H:hi*H])
	case tokRopeKV:
		rd := cfg.ropeDims()
		qDim, kvDim, half := cfg.Heads*D, cfg.KVHeads*D, rd/2
		if cfg.QKNorm {
			// Every head is a row of D values; normalised in place
			// (rmsNorm reads each element before writing it).
			rmsNorm(b.q[lo*qDim:hi*qDim], b.q[lo*qDim:hi*qDim], (hi-lo)*cfg.Heads, D, ly.qNorm, cfg.RMSNormEps, cfg.GGMLNumerics)
			rmsNorm(b.k[lo*kvDim:hi*kvDim], b.k[lo*kvDim:hi*kvDim], (hi-lo)*cfg.KVHeads, D, ly.kNorm, cfg.RMSNormEps, cfg.GGMLNumerics)
		}
		cos, sin := b.cos, b.sin
		if m.ropeLocal != nil && cfg.SlidingLayers[j.li] {
			cos, sin = b.cosL, b.sinL
		}
		applyRope(b.q[lo*qDim:hi*qDim], hi-lo, cfg.Heads, D, rd, cos[lo*half:hi*half], sin[lo*half:hi*half], cfg.RopeInterleaved)
		applyRope(b.k[lo*kvDim:hi*kvDim], hi-lo, cfg.KVHeads, D, rd, cos[lo*half:hi*half], sin[lo*half:hi*half], cfg.RopeInterleaved)
		if m.qScale != 0 {
			// llama.cpp's gemma2, gemma3 and phi3 scale q before q·k
			// (ggml_scale), not the scores.
			for i, v := range b.q[lo*qDim : hi*qDim] {
				b.q[lo*qDim+i] = v * m.qScale
			}
		}
		dt := j.pool.Geometry().DType
		for t := lo; t < hi; t++ {
			s := &j.seqs[b.seqOf[t]]
			p := int(b.pos[t])
			encodeKV(m.ks, dt, kvSlot(j.pool, s.Pages, p, j.li, 0), b.k[t*kvDim:(t+1)*kvDim])
			encodeKV(m.ks, dt, kvSlot(j.pool, s.Pages, p, j.li, 1), b.v[t*kvDim:(t+1)*kvDim])
		}
	}
}

// kvSlot returns the bytes of position p's entry in the K (kv=0) or V (kv=1)
// segment of layer li: [kvHeads, headDim] elements of the pool's dtype.
func kvSlot(pool *kvcache.Pool, pages []kvcache.PageID, p, li, kv int) []byte {
	ps := pool.PageSize()
	sb := pool.SlotBytes()
	seg := pool.Segment(pages[p/ps], li, kv)
	s := p % ps
	return seg[s*sb : (s+1)*sb]
}

// encodeKV writes src into dst bytes in KV dtype dt (rounding to nearest
// even for F16 and BF16). With kernel set ks (nil: pure Go), F16 rounds in
// the narrowF16 kernel, which gives F32ToF16's bits.
func encodeKV(ks *kernelSet, dt kvcache.DType, dst []byte, src []float32) {
	switch dt {
	case kvcache.F32:
		copy(unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(dst))), len(src)), src)
	case kvcache.BF16:
		d := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst))), len(src))
		for i, v := range src {
			d[i] = F32ToBF16(v)
		}
	case kvcache.F16:
		d := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst))), len(src))
		i := 0
		if ks != nil {
			if n := len(src) / ks.narrowWidth * ks.narrowWidth; n > 0 {
				ks.narrowF16(&narrowArgs{src: unsafe.Pointer(&src[0]), dst: unsafe.Pointer(&d[0]), n: uintptr(n)})
				i = n
			}
		}
		for ; i < len(src); i++ {
			d[i] = F32ToF16(src[i])
		}
	}
}

// markWritten calls pool.MarkWritten once for each page the batch wrote.
func (m *Model) markWritten(pool *kvcache.Pool, seqs []model.SeqInput) {
	ps := pool.PageSize()
	for i := range seqs {
		s := &seqs[i]
		for k := s.Pos / ps; k <= (s.Pos+len(s.Tokens)-1)/ps; k++ {
			pool.MarkWritten(s.Pages[k])
		}
	}
}

// poolCache holds what Forward's validation keeps per pool.
type poolCache struct {
	batch *model.BatchCheck
}

// maxPools bounds how many pools' caches an instance keeps; a worker has
// one pool, tests a few.
const maxPools = 4

func (m *Model) cacheFor(pool *kvcache.Pool) *poolCache {
	if c, ok := m.caches[pool]; ok {
		return c
	}
	if len(m.caches) >= maxPools {
		clear(m.caches)
	}
	c := &poolCache{batch: model.NewBatchCheck(pool.Total())}
	m.caches[pool] = c
	return c
}

// check validates a batch (see Forward and model.BatchCheck). m.mu is held.
func (m *Model) check(pool *kvcache.Pool, seqs []model.SeqInput, nOut int) error {
	if m.closed {
		return errClosed
	}
	var bc *model.BatchCheck // Check needs none to refuse a nil pool
	if pool != nil {
		bc = m.cacheFor(pool).batch
	}
	if err := bc.Check(pool, m.info, seqs, nOut); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	return nil
}

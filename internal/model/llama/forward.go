package llama

import (
	"context"
	"fmt"
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
	cos  []float32 // RoPE [T, headDim/2]
	sin  []float32
	sel  []float32 // final-normalised rows that need logits [R, hidden]
	lgt  []float32 // logits [R, vocab]

	pos   []int32 // position of each token [T]
	seqOf []int32 // sequence of each token [T]
	last  []int   // index of each sequence's last token [len(seqs)]
	rows  []int   // sequences that sample [R]
	scr   []scratch
	q8    q8Acts  // a linear layer's input quantized for Q8_0/Q4_0 weights
	q8k   q8KActs // … and for Q4_K/Q6_K weights

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
// the next token with model.Sample from the logits after the last token
// (out[i] is zero for the others).
//
// It first checks the whole batch and returns an error, having written
// nothing, for: a closed model, a pool whose geometry differs from
// Info().Geometry, len(out) ≠ len(seqs), a negative Pos, no tokens,
// Pos+len(Tokens) > ContextLen, a token id outside [0, VocabSize), too few
// pages, a page id outside the pool, a page listed twice among the pages
// covering one sequence, a page that one sequence writes and another covers,
// and invalid sampling parameters (TopP 0 is read as 1, as model.Sample
// does). If ctx ends during the step it returns ctx.Err(); the KV of the
// batch's tokens may then be partly written, and out is not set.
//
// Results do not depend on the batch: a sequence gets bit-identical KV and
// tokens alone or with others, prefilled whole or in chunks.
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
	b.rows = b.rows[:0]
	for i := range seqs {
		if seqs[i].Sample {
			b.rows = append(b.rows, i)
		}
	}
	tm := startTeam(m.threadCount())
	defer tm.stop()
	logits, err := m.run(ctx, tm, pool, seqs, b.rows, false)
	if err != nil {
		return err
	}
	for i := range out {
		out[i] = model.SeqOutput{}
	}
	b.sample = sampleJob{scr: b.scr, logits: logits, vocab: m.info.VocabSize, rows: b.rows, seqs: seqs, out: out}
	tm.parallelFor(len(b.rows), 1, &b.sample)
	b.sample = sampleJob{}
	return nil
}

// sampleJob samples the logit rows of a step, one row per index.
type sampleJob struct {
	scr    []scratch
	logits []float32 // [R, vocab]
	vocab  int
	rows   []int // sequence of each logit row
	seqs   []model.SeqInput
	out    []model.SeqOutput
}

func (j *sampleJob) run(w, lo, hi int) {
	sc := &j.scr[w]
	V := j.vocab
	for r := lo; r < hi; r++ {
		i := j.rows[r]
		p := j.seqs[i].Sampling
		if p.TopP == 0 {
			p.TopP = 1
		}
		tok, lp := model.SampleBan(j.logits[r*V:(r+1)*V], p, j.seqs[i].Ban, j.seqs[i].Step, &sc.sample)
		j.out[i] = model.SeqOutput{Token: tok, Logprob: lp}
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
	logits, err := m.run(ctx, tm, pool, plain, nil, true)
	if err != nil {
		return nil, err
	}
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

// run computes the batch (already checked) on team tm. It returns the
// logits of the last token of seqs[i] for each i in rows, or of every token
// if all is set: [R, vocab], a view of the instance's buffer.
//
// Shapes: T = Σ len(Tokens); per layer (transformers' LlamaDecoderLayer):
//
//	h = RMSNorm(x)·g₁                      [T, hidden]
//	q, k, v = h·Wqᵀ(+b), h·Wkᵀ(+b), h·Wvᵀ(+b)   [T, heads·hd], [T, kvHeads·hd] ×2
//	q, k = RoPE(q), RoPE(k)                at each token's position
//	KV pages ← k, v                        (then attention reads them back)
//	a = softmax(q·Kᵀ/√hd, causal)·V        [T, heads·hd]
//	x += a·Woᵀ(+b)
//	h = RMSNorm(x)·g₂
//	x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ
//
// then logits = RMSNorm(x)·g_final·W_lmᵀ for the requested rows. Each line
// is one parallel loop over the team (q, k and v together; the norms, RoPE
// and KV writes per token only for long batches); the residual adds and the
// SwiGLU product are done by the tasks of the matrix before them.
func (m *Model) run(ctx context.Context, tm *team, pool *kvcache.Pool, seqs []model.SeqInput, rows []int, all bool) ([]float32, error) {
	cfg := &m.w.cfg
	H, D, I := cfg.HiddenSize, cfg.HeadDim, cfg.IntermediateSize
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
	b.cos, b.sin = grow(b.cos, T*D/2), grow(b.sin, T*D/2)
	for len(b.scr) < tm.size() {
		b.scr = append(b.scr, scratch{})
	}
	if cap(b.pos) < T {
		b.pos, b.seqOf = make([]int32, T), make([]int32, T)
	}
	b.pos, b.seqOf = b.pos[:T], b.seqOf[:T]
	if cap(b.last) < len(seqs) {
		b.last = make([]int, len(seqs))
	}
	b.last = b.last[:len(seqs)]

	// Embeddings, positions, RoPE angles.
	t := 0
	for i := range seqs {
		s := &seqs[i]
		for j, tok := range s.Tokens {
			b.pos[t] = int32(s.Pos + j)
			b.seqOf[t] = int32(i)
			dst := b.x[t*H : (t+1)*H]
			copy(dst, m.w.embed.Row(int(tok), dst)) // a no-op when Row widened into dst
			t++
		}
		b.last[i] = t - 1
	}
	if cfg.GGMLNumerics {
		ropeTableGGML(b.cos, b.sin, b.pos, cfg)
	} else {
		ropeTable(b.cos, b.sin, b.pos, m.invFreq)
	}

	ks := m.ks
	b.attn = attnJob{ks: ks, scr: b.scr, pool: pool, seqs: seqs, q: b.q, att: b.att, pos: b.pos, seqOf: b.seqOf,
		heads: cfg.Heads, kvH: cfg.KVHeads, d: D}
	b.tok = tokJob{m: m, pool: pool, seqs: seqs, T: T}
	defer func() { b.attn, b.tok, b.lin = attnJob{}, tokJob{}, linJob{} }() // drop references to the caller's data
	lin := func(x []float32, resid []float32, swiglu bool, outs ...linOut) {
		n := copy(b.outs[:], outs)
		b.lin = linJob{ks: ks, scr: b.scr, x: x, T: T, outs: b.outs[:n], resid: resid, swiglu: swiglu, q8: &b.q8, q8k: &b.q8k}
		linear(tm, &b.lin)
	}
	tokGrain := max(1, 256/max(1, H/64)) // tokens per task of the per-token loops

	eps := cfg.RMSNormEps
	// Pages are written from the first layer on; mark them even if ctx ends
	// the step early, so version-keyed caches of the pool see the change.
	defer m.markWritten(pool, seqs)
	for li := range m.w.layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ly := &m.w.layers[li]
		b.tok.li, b.tok.op = li, tokAttnNorm
		tm.parallelFor(T, tokGrain, &b.tok)
		lin(b.h, nil, false, linOut{ly.q, ly.qb, b.q}, linOut{ly.k, ly.kb, b.k}, linOut{ly.v, ly.vb, b.v})
		b.tok.op = tokRopeKV
		tm.parallelFor(T, tokGrain, &b.tok)
		b.attn.li = li
		tm.parallelFor(b.attn.tasks(T), 1, &b.attn)
		lin(b.att, b.x, false, linOut{ly.o, ly.ob, b.tmp})

		b.tok.op = tokMLPNorm
		tm.parallelFor(T, tokGrain, &b.tok)
		lin(b.h, nil, true, linOut{ly.gate, ly.gateB, b.gate}, linOut{ly.up, ly.upB, b.up})
		lin(b.gate, b.x, false, linOut{ly.down, ly.downB, b.tmp})
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Final norm and classifier on the rows that need logits.
	var R int
	if all {
		R = T
		b.sel = grow(b.sel, R*H)
		rmsNorm(b.sel, b.x, T, H, m.w.norm, eps, cfg.GGMLNumerics)
	} else {
		R = len(rows)
		b.sel = grow(b.sel, R*H)
		for r, i := range rows {
			l := b.last[i]
			rmsNorm(b.sel[r*H:(r+1)*H], b.x[l*H:(l+1)*H], 1, H, m.w.norm, eps, cfg.GGMLNumerics)
		}
	}
	V := cfg.VocabSize
	b.lgt = grow(b.lgt, R*V)
	if R > 0 {
		b.lin = linJob{ks: ks, scr: b.scr, x: b.sel, T: R, outs: append(b.outs[:0], linOut{w: m.w.lmHead, dst: b.lgt}), q8: &b.q8, q8k: &b.q8k}
		linear(tm, &b.lin)
	}
	return b.lgt, nil
}

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
	tokRopeKV          // rotate q and k, store k and v in the pages
	tokMLPNorm         // h = RMSNorm(x)·post_attention_layernorm
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
	case tokRopeKV:
		qDim, kvDim, half := cfg.Heads*D, cfg.KVHeads*D, D/2
		applyRope(b.q[lo*qDim:hi*qDim], hi-lo, cfg.Heads, D, b.cos[lo*half:hi*half], b.sin[lo*half:hi*half], cfg.RopeInterleaved)
		applyRope(b.k[lo*kvDim:hi*kvDim], hi-lo, cfg.KVHeads, D, b.cos[lo*half:hi*half], b.sin[lo*half:hi*half], cfg.RopeInterleaved)
		dt := j.pool.Geometry().DType
		for t := lo; t < hi; t++ {
			s := &j.seqs[b.seqOf[t]]
			p := int(b.pos[t])
			encodeKV(dt, kvSlot(j.pool, s.Pages, p, j.li, 0), b.k[t*kvDim:(t+1)*kvDim])
			encodeKV(dt, kvSlot(j.pool, s.Pages, p, j.li, 1), b.v[t*kvDim:(t+1)*kvDim])
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
// even for F16 and BF16).
func encodeKV(dt kvcache.DType, dst []byte, src []float32) {
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
		for i, v := range src {
			d[i] = F32ToF16(v)
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

package llama

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/viterin/vek/vek32"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// buffers are a Model instance's activations, grown as batches need and
// reused across Forward calls. Shapes are for a batch of T tokens (all the
// sequences' tokens, concatenated) and R logit rows.
type buffers struct {
	x    []float32 // residual stream [T, hidden]
	h    []float32 // normalised input of a sublayer [T, hidden]
	q    []float32 // queries [T, heads, headDim]
	k, v []float32 // keys and values [T, kvHeads, headDim]
	att  []float32 // attention output [T, heads, headDim]
	tmp  []float32 // sublayer output before the residual add [T, hidden]
	gate []float32 // [T, inter]
	up   []float32 // [T, inter]
	cos  []float32 // RoPE [T, headDim/2]
	sin  []float32
	sel  []float32 // final-normalised rows that need logits [R, hidden]
	lgt  []float32 // logits [R, vocab]

	pos    []int32 // position of each token [T]
	seqOf  []int32 // sequence of each token [T]
	tiles  [][]float32
	scores [][]float32 // per worker: attention scores [heads/kvHeads, context]
	kvRows [][]float32 // per worker: widened K rows of one page [pageSize, headDim]
	vals   [][]float32 // per worker: one KV head's V rows of a sequence [context, headDim]
	sample []int32     // model.Sample's scratch [vocab]
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func growPerWorker(b [][]float32, workers, n int) [][]float32 {
	for len(b) < workers {
		b = append(b, nil)
	}
	for i := range b[:workers] {
		b[i] = grow(b[i], n)
	}
	return b
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
	var rows []int
	for i := range seqs {
		if seqs[i].Sample {
			rows = append(rows, i)
		}
	}
	logits, err := m.run(ctx, pool, seqs, rows, false)
	if err != nil {
		return err
	}
	V := m.info.VocabSize
	if cap(m.buf.sample) < V {
		m.buf.sample = make([]int32, V)
	}
	for i := range out {
		out[i] = model.SeqOutput{}
	}
	for r, i := range rows {
		p := seqs[i].Sampling
		if p.TopP == 0 {
			p.TopP = 1
		}
		tok, lp := model.Sample(logits[r*V:(r+1)*V], p, seqs[i].Step, m.buf.sample)
		out[i] = model.SeqOutput{Token: tok, Logprob: lp}
	}
	return nil
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
	logits, err := m.run(ctx, pool, plain, nil, true)
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

// run computes the batch (already checked). It returns the logits of the
// last token of seqs[i] for each i in rows, or of every token if all is set:
// [R, vocab], a view of the instance's buffer.
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
// then logits = RMSNorm(x)·g_final·W_lmᵀ for the requested rows.
func (m *Model) run(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput, rows []int, all bool) ([]float32, error) {
	cfg := &m.w.cfg
	H, D, I := cfg.HiddenSize, cfg.HeadDim, cfg.IntermediateSize
	qDim, kvDim := cfg.Heads*D, cfg.KVHeads*D
	T := 0
	maxCtx := 0
	for i := range seqs {
		T += len(seqs[i].Tokens)
		maxCtx = max(maxCtx, seqs[i].Pos+len(seqs[i].Tokens))
	}
	tm := startTeam(m.threadCount())
	defer tm.stop()
	nw := tm.size()

	b := &m.buf
	b.x, b.h, b.tmp = grow(b.x, T*H), grow(b.h, T*H), grow(b.tmp, T*H)
	b.q, b.att = grow(b.q, T*qDim), grow(b.att, T*qDim)
	b.k, b.v = grow(b.k, T*kvDim), grow(b.v, T*kvDim)
	b.gate, b.up = grow(b.gate, T*I), grow(b.up, T*I)
	b.cos, b.sin = grow(b.cos, T*D/2), grow(b.sin, T*D/2)
	b.tiles = growPerWorker(b.tiles, nw, rowTile*max(H, qDim, I))
	b.scores = growPerWorker(b.scores, nw, (cfg.Heads/cfg.KVHeads)*maxCtx)
	b.kvRows = growPerWorker(b.kvRows, nw, pool.PageSize()*D)
	b.vals = growPerWorker(b.vals, nw, maxCtx*D)
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
			t++
		}
	}
	ropeTable(b.cos, b.sin, b.pos, m.invFreq)

	eps := cfg.RMSNormEps
	// Pages are written from the first layer on; mark them even if ctx ends
	// the step early, so version-keyed caches of the pool see the change.
	defer m.markWritten(pool, seqs)
	for li := range m.w.layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ly := &m.w.layers[li]
		rmsNorm(b.h, b.x, T, H, ly.attnNorm, eps)
		linear(tm, b.tiles, b.q, b.h, T, ly.q, ly.qb)
		linear(tm, b.tiles, b.k, b.h, T, ly.k, ly.kb)
		linear(tm, b.tiles, b.v, b.h, T, ly.v, ly.vb)
		applyRope(b.q, T, cfg.Heads, D, b.cos, b.sin)
		applyRope(b.k, T, cfg.KVHeads, D, b.cos, b.sin)
		m.writeKV(pool, seqs, li)
		m.attention(tm, pool, seqs, li, T)
		linear(tm, b.tiles, b.tmp, b.att, T, ly.o, ly.ob)
		addInPlace(b.x, b.tmp)

		rmsNorm(b.h, b.x, T, H, ly.mlpNorm, eps)
		linear(tm, b.tiles, b.gate, b.h, T, ly.gate, ly.gateB)
		linear(tm, b.tiles, b.up, b.h, T, ly.up, ly.upB)
		grain := max(1, (1<<14)/I)
		tm.parallelFor(T, grain, func(_, lo, hi int) {
			siluMul(b.gate[lo*I:hi*I], b.up[lo*I:hi*I])
		})
		linear(tm, b.tiles, b.tmp, b.gate, T, ly.down, ly.downB)
		addInPlace(b.x, b.tmp)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Final norm and classifier on the rows that need logits.
	var R int
	if all {
		R = T
		b.sel = grow(b.sel, R*H)
		rmsNorm(b.sel, b.x, T, H, m.w.norm, eps)
	} else {
		R = len(rows)
		b.sel = grow(b.sel, R*H)
		last := make([]int, len(seqs))
		t := 0
		for i := range seqs {
			t += len(seqs[i].Tokens)
			last[i] = t - 1
		}
		for r, i := range rows {
			rmsNorm(b.sel[r*H:(r+1)*H], b.x[last[i]*H:(last[i]+1)*H], 1, H, m.w.norm, eps)
		}
	}
	V := cfg.VocabSize
	b.lgt = grow(b.lgt, R*V)
	if R > 0 {
		linear(tm, b.tiles, b.lgt, b.sel, R, m.w.lmHead, nil)
	}
	return b.lgt, nil
}

// addInPlace adds y to x element-wise.
func addInPlace(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
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

// writeKV stores the batch's keys and values of layer li in the pages, in
// the pool's dtype (page layout [layer][k|v][slot][kv_heads][head_dim]).
func (m *Model) writeKV(pool *kvcache.Pool, seqs []model.SeqInput, li int) {
	b := &m.buf
	kvDim := m.w.cfg.KVHeads * m.w.cfg.HeadDim
	dt := pool.Geometry().DType
	t := 0
	for i := range seqs {
		s := &seqs[i]
		for j := range s.Tokens {
			p := s.Pos + j
			encodeKV(dt, kvSlot(pool, s.Pages, p, li, 0), b.k[t*kvDim:(t+1)*kvDim])
			encodeKV(dt, kvSlot(pool, s.Pages, p, li, 1), b.v[t*kvDim:(t+1)*kvDim])
			t++
		}
	}
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

// kvRows returns the rows of KV head g for the first n slots of a K or V
// segment seg ([pageSize, kvHeads, headDim] in dtype dt): row s is
// rows[s·stride : s·stride+headDim]. For F32 it is a view of the page; for
// F16 and BF16 the rows are widened into scratch (n·headDim floats).
func kvRows(dt kvcache.DType, seg []byte, g, n, kvHeads, headDim int, scratch []float32) (rows []float32, stride int) {
	stride = kvHeads * headDim
	switch dt {
	case kvcache.F32:
		all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(seg))), len(seg)/4)
		return all[g*headDim:], stride
	default:
		all := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(seg))), len(seg)/2)
		wdt := BF16
		if dt == kvcache.F16 {
			wdt = F16
		}
		for s := range n {
			o := s*stride + g*headDim
			widen(wdt, scratch[s*headDim:(s+1)*headDim], all[o:o+headDim])
		}
		return scratch, headDim
	}
}

// attention computes b.att for every token of the batch from b.q and the
// KV in the pages (layer li), causally: the token at position p attends to
// positions 0…p of its sequence. Work is split over (token, KV head) pairs;
// a pair computes the heads/kvHeads query heads that share the KV head
// (grouped-query attention), so each K and V row is read once for them.
// Scores are q·k/√headDim (Vaswani et al., "Attention Is All You Need",
// 2017), softmax in float64 sums; the output of the group's heads is
// P[heads, n]·V[n, headDim] over the V rows gathered from the pages.
func (m *Model) attention(tm *team, pool *kvcache.Pool, seqs []model.SeqInput, li, T int) {
	cfg := &m.w.cfg
	b := &m.buf
	D, KV := cfg.HeadDim, cfg.KVHeads
	G := cfg.Heads / KV
	qDim := cfg.Heads * D
	ps := pool.PageSize()
	dt := pool.Geometry().DType
	scale := float32(1 / math.Sqrt(float64(D)))
	grain := 1
	if T*KV*D*8 < minParallelFlops {
		grain = T * KV
	}
	tm.parallelFor(T*KV, grain, func(w, lo, hi int) {
		for task := lo; task < hi; task++ {
			t, g := task/KV, task%KV
			pages := seqs[b.seqOf[t]].Pages
			n := int(b.pos[t]) + 1
			sc := b.scores[w][:G*n]
			q := b.q[t*qDim : (t+1)*qDim]
			vs := b.vals[w][:n*D]
			for pg := 0; pg*ps < n; pg++ {
				ns := min(ps, n-pg*ps)
				rows, stride := kvRows(dt, pool.Segment(pages[pg], li, 0), g, ns, KV, D, b.kvRows[w])
				for s := range ns {
					k := rows[s*stride : s*stride+D]
					for gi := range G {
						h := g*G + gi
						sc[gi*n+pg*ps+s] = dot(q[h*D:(h+1)*D], k) * scale
					}
				}
				// Gather the group's V rows of this page into vs [n, D].
				rows, stride = kvRows(dt, pool.Segment(pages[pg], li, 1), g, ns, KV, D, vs[pg*ps*D:])
				if dt == kvcache.F32 { // a view of the page, not yet in vs
					for s := range ns {
						copy(vs[(pg*ps+s)*D:(pg*ps+s+1)*D], rows[s*stride:s*stride+D])
					}
				}
			}
			for gi := range G {
				softmax(sc[gi*n : (gi+1)*n])
			}
			// att[t, g·G+gi, :] = Σ_j p[gi, j]·v[j, :], at most 3 heads per
			// call so that vek multiplies on this goroutine.
			a := b.att[t*qDim+g*G*D : t*qDim+(g+1)*G*D]
			for h0 := 0; h0 < G; h0 += 3 {
				h1 := min(h0+3, G)
				vek32.MatMul_Into(a[h0*D:h1*D], sc[h0*n:h1*n], vs, n)
			}
		}
	})
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

// errInput formats Forward's input errors.
func errInput(seq int, format string, args ...any) error {
	return fmt.Errorf("llama: seq %d: %s", seq, fmt.Sprintf(format, args...))
}

// poolCache holds the per-pool stamps Forward's validation uses to find
// aliased pages in O(pages covered).
type poolCache struct {
	stamp  []uint64 // by page id: epoch of the last visit
	wstamp []uint64 // by page id: batch epoch in which a seq writes it
	wowner []int32  // by page id: that seq
	epoch  uint64
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
	n := pool.Total()
	c := &poolCache{stamp: make([]uint64, n), wstamp: make([]uint64, n), wowner: make([]int32, n)}
	m.caches[pool] = c
	return c
}

// check validates a batch (see Forward). m.mu is held.
func (m *Model) check(pool *kvcache.Pool, seqs []model.SeqInput, nOut int) error {
	if m.closed {
		return errClosed
	}
	if pool == nil {
		return errors.New("llama: nil pool")
	}
	if g := pool.Geometry(); g != m.info.Geometry {
		return fmt.Errorf("llama: pool KV geometry %+v does not match the model's %+v", g, m.info.Geometry)
	}
	if nOut != len(seqs) {
		return fmt.Errorf("llama: %d outputs for %d sequences", nOut, len(seqs))
	}
	total := pool.Total()
	V := m.info.VocabSize
	for i := range seqs {
		s := &seqs[i]
		switch {
		case s.Pos < 0:
			return errInput(i, "negative position %d", s.Pos)
		case len(s.Tokens) == 0:
			return errInput(i, "no tokens")
		case s.Pos+len(s.Tokens) > m.info.ContextLen:
			return errInput(i, "position %d + %d tokens = %d exceeds the context length %d",
				s.Pos, len(s.Tokens), s.Pos+len(s.Tokens), m.info.ContextLen)
		}
		for j, t := range s.Tokens {
			if t < 0 || int(t) >= V {
				return errInput(i, "token %d at index %d out of range [0, %d)", t, j, V)
			}
		}
		n := s.Pos + len(s.Tokens)
		if need := pool.PagesFor(n); len(s.Pages) < need {
			return errInput(i, "%d pages hold %d tokens; positions 0…%d need %d",
				len(s.Pages), len(s.Pages)*pool.PageSize(), n-1, need)
		}
		for _, id := range s.Pages[:pool.PagesFor(n)] {
			if id < 0 || int(id) >= total {
				return errInput(i, "page %d outside the pool's pages [0, %d)", id, total)
			}
		}
		if s.Sample {
			p := s.Sampling
			if p.TopP == 0 {
				p.TopP = 1
			}
			if err := p.Validate(); err != nil {
				return errInput(i, "%v", err)
			}
		}
	}
	return m.checkAliasing(pool, seqs)
}

// checkAliasing rejects a page listed twice among the pages covering one
// sequence, and a page written by one sequence and covered by another.
// Pages only read may be shared (a common prefix).
func (m *Model) checkAliasing(pool *kvcache.Pool, seqs []model.SeqInput) error {
	c := m.cacheFor(pool)
	ps := pool.PageSize()
	c.epoch++
	batch := c.epoch
	for i := range seqs {
		s := &seqs[i]
		c.epoch++
		covered := s.Pages[:pool.PagesFor(s.Pos+len(s.Tokens))]
		for _, id := range covered {
			if c.stamp[id] == c.epoch {
				return errInput(i, "page %d listed twice", id)
			}
			c.stamp[id] = c.epoch
		}
		for _, id := range covered[s.Pos/ps:] {
			if c.wstamp[id] == batch {
				return errInput(i, "page %d is also written by seq %d", id, c.wowner[id])
			}
			c.wstamp[id] = batch
			c.wowner[id] = int32(i)
		}
	}
	for i := range seqs {
		s := &seqs[i]
		for _, id := range s.Pages[:s.Pos/ps] {
			if c.wstamp[id] == batch && int(c.wowner[id]) != i {
				return errInput(i, "reads page %d that seq %d writes", id, c.wowner[id])
			}
		}
	}
	return nil
}

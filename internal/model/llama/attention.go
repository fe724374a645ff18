package llama

import (
	"unsafe"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// attnJob computes causal grouped-query attention for every token of the
// batch from the queries and the KV in the pages of one layer (Vaswani et
// al., "Attention Is All You Need", 2017; Ainslie et al., "GQA", 2023). A
// task is one token and a subgroup of sub query heads that share a KV head:
// with sub = G = heads/kvHeads (the forward pass's choice), each K and V row
// is read, and widened from BF16 or F16, once for all of them; a smaller
// sub splits the work finer with the same result (the tests check sub = 1).
//
// For the token at position p of its sequence, query head h, KV head g:
//
//	s[j] = dot(k_j, q_h) · (1/√headDim)   lo ≤ j ≤ p  (canonical dot, simd.go)
//	s[j] = c·tanh(s[j]/c)                          (Gemma2 soft-capping only)
//	a    = softmax(s)                              (float64 sums, see softmax)
//	out  = Σ_j a[j]·v_j                            (canonical weighted sum)
//
// where lo = 0, or lo = max(0, p−W+1) in a layer with a sliding window of
// W positions (window: the position sees itself and the W−1 before it,
// llama.cpp's LLAMA_SWA_TYPE_STANDARD mask), reading K and V rows in place
// in the pages (F32, BF16 or F16). Nothing depends on the other tokens of
// the batch or on the task split.
type attnJob struct {
	ks    *kernelSet
	scr   []scratch
	pool  *kvcache.Pool
	seqs  []model.SeqInput
	li    int
	q     []float32 // [T, heads, headDim]
	att   []float32 // [T, heads, headDim]
	pos   []int32   // [T]
	seqOf []int32   // [T]
	heads int
	kvH   int
	d     int
	sub   int // query heads per task: a divisor of heads/kvHeads (0 means all)
	// scale multiplies the scores (Model.attnScale); softcap, if > 0,
	// soft-caps them (Gemma2's attn_logit_softcapping).
	scale   float32
	softcap float64
	// window, if > 0, is the sliding window of layer li (see Config.SlidingLayers).
	window int
}

// tasks returns the number of tasks (T·heads/sub).
func (j *attnJob) tasks(T int) int {
	if j.sub == 0 {
		j.sub = j.heads / j.kvH
	}
	return T * j.heads / j.sub
}

func (j *attnJob) run(w, lo, hi int) {
	per := j.heads / j.sub // tasks per token
	for task := lo; task < hi; task++ {
		t, h0 := task/per, task%per*j.sub
		if next := task + 1; j.ks != nil && next < len(j.pos)*per {
			j.prefetch(next/per, next%per*j.sub)
		}
		j.one(&j.scr[w], t, h0, h0+j.sub)
	}
}

// prefetch asks for the K and V rows that the task of token t and query
// heads from h0 reads (its KV head's rows of every page in its context)
// to be brought into L2 (PREFETCHT1), to arrive while the task before it
// runs: a worker runs consecutive tasks (team), and the rows of a decode
// step's KV, 90–135 MiB in F32 at 128–192 tokens of context and batch 16,
// come from memory. Into L2, not L1: a prefetch into L1 holds one of the
// core's few L1 miss buffers (see prefetch512), and a task asks for up to
// 2·n rows of 2–4 lines. On Zen 4 (BenchmarkAttentionBatch16, one worker)
// this cut attention's CPU time per step by about a quarter for F32 and a
// third for F16; PREFETCHT0 gained nothing.
func (j *attnJob) prefetch(t, h0 int) {
	D, KV := j.d, j.kvH
	g := h0 / (j.heads / KV)
	pages := j.seqs[j.seqOf[t]].Pages
	n := int(j.pos[t]) + 1
	lo := 0
	if j.window > 0 {
		lo = max(0, n-j.window)
	}
	ps := j.pool.PageSize()
	eb := kvBytes(j.pool.Geometry().DType)
	rowStride := KV * D * eb
	for p0 := lo / ps * ps; p0 < n; p0 += ps {
		skip := max(0, lo-p0) // rows of the page before the window
		for kv := range 2 {
			j.ks.prefetchRows(&prefetchArgs{p: unsafe.Pointer(&j.pool.Segment(pages[p0/ps], j.li, kv)[g*D*eb+skip*rowStride]),
				s: uintptr(rowStride), rows: uintptr(min(ps, n-p0) - skip), bytes: uintptr(D * eb)})
		}
	}
}

// kvBytes is the size of a KV element of dtype dt.
func kvBytes(dt kvcache.DType) int {
	if dt == kvcache.F32 {
		return 4
	}
	return 2
}

// one computes token t's attention for query heads [h0, h1), which share
// one KV head.
func (j *attnJob) one(sc *scratch, t, h0, h1 int) {
	D, KV := j.d, j.kvH
	g := h0 / (j.heads / KV)
	G := h1 - h0
	qDim := j.heads * D
	pages := j.seqs[j.seqOf[t]].Pages
	n := int(j.pos[t]) + 1
	lo := 0 // the first position the token sees
	if j.window > 0 {
		lo = max(0, n-j.window)
	}
	np := (n+3)&^3 + 4 // scores row stride, with room for a tile's padding
	sc.scores = grow(sc.scores, G*np)
	s := sc.scores
	q := j.q[t*qDim : (t+1)*qDim]
	out := j.att[t*qDim+h0*D : t*qDim+h1*D]
	ps := j.pool.PageSize()
	dt := j.pool.Geometry().DType
	eb := kvBytes(dt)
	rowStride := KV * D * eb // bytes between a page's slots
	// base returns the address of KV head g's row in slot 0 of page pg.
	base := func(pg, kv int) unsafe.Pointer {
		return unsafe.Pointer(&j.pool.Segment(pages[pg], j.li, kv)[g*D*eb])
	}
	ks := j.ks
	if ks != nil && ((D%16 != 0 && !(ks.anyN && ks.pvMasked)) || !ks.tileDT[dt] || !ks.pvDT[dt]) {
		ks = nil
	}

	// Scores, page by page.
	if ks == nil {
		sc.kv = grow(sc.kv, D)
		for jj := lo; jj < n; jj++ {
			k := kvRow(dt, unsafe.Add(base(jj/ps, 0), (jj%ps)*rowStride), D, sc.kv)
			for gi := range G {
				h := h0 + gi
				s[gi*np+jj] = dotGo(k, q[h*D:(h+1)*D])
			}
		}
	} else {
		R, V := ks.rows, ks.vecs
		a := tileArgs{n: uintptr(D), os: uintptr(4 * np)}
		for g0 := 0; g0 < G; g0 += V {
			nv := min(V, G-g0)
			for v := range nv {
				a.x[v] = unsafe.Pointer(&q[(h0+g0+v)*D])
			}
			for p0 := lo / ps * ps; p0 < n; p0 += ps {
				b := base(p0/ps, 0)
				m := min(ps, n-p0) // rows in this page
				// A group cut short by the end of the page repeats its last
				// row; its extra scores land in the next page's slots (then
				// overwritten) or in the padding.
				for i := max(0, lo-p0); i < m; i += R {
					for r := range R {
						a.w[r] = unsafe.Add(b, min(i+r, m-1)*rowStride)
					}
					a.out = unsafe.Pointer(&s[g0*np+p0+i])
					ks.tile(dt, nv, &a)
				}
			}
		}
	}
	for gi := range G {
		row := s[gi*np+lo : gi*np+n]
		for i := range row {
			row[i] *= j.scale
		}
		if j.softcap > 0 {
			softcapRow(row, j.softcap)
		}
		softmax(j.ks, row)
	}

	// Weighted sum of the V rows, page by page.
	clear(out)
	if ks == nil {
		sc.kv = grow(sc.kv, D)
		for gi := range G {
			weightedGo(out[gi*D:(gi+1)*D], s[gi*np+lo:gi*np+n], func(jj int) []float32 {
				jj += lo
				return kvRow(dt, unsafe.Add(base(jj/ps, 1), (jj%ps)*rowStride), D, sc.kv)
			})
		}
		return
	}
	const maxHeads = 6 // of a pv kernel
	for p0 := lo / ps * ps; p0 < n; p0 += ps {
		skip := max(0, lo-p0) // rows of the page before the window
		a := pvArgs{vs: uintptr(rowStride), n: uintptr(min(ps, n-p0) - skip), ps: uintptr(4 * np), os: uintptr(4 * D)}
		v0 := unsafe.Add(base(p0/ps, 1), skip*rowStride)
		for g0 := 0; g0 < G; g0 += maxHeads {
			nh := min(maxHeads, G-g0)
			d := 0
			for _, c := range ks.pvChunks {
				for ; d+16*c <= D; d += 16 * c {
					a.v = unsafe.Add(v0, d*eb)
					a.p = unsafe.Pointer(&s[g0*np+p0+skip])
					a.out = unsafe.Pointer(&out[g0*D+d])
					ks.pv(dt, c, nh, &a)
				}
			}
			if d < D { // the last 1–15 columns, masked
				a.v = unsafe.Add(v0, d*eb)
				a.p = unsafe.Pointer(&s[g0*np+p0+skip])
				a.out = unsafe.Pointer(&out[g0*D+d])
				a.cols = uintptr(D - d)
				ks.pv(dt, 0, nh, &a)
			}
		}
	}
}

// kvRow returns the D elements at p (dtype dt) as float32: a view for F32,
// otherwise widened into dst.
func kvRow(dt DType, p unsafe.Pointer, D int, dst []float32) []float32 {
	if dt == F32 {
		return unsafe.Slice((*float32)(p), D)
	}
	dst = dst[:D]
	widen(dt, dst, unsafe.Slice((*uint16)(p), D))
	return dst
}

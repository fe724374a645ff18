package llama

import (
	"fmt"
	"math"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// # Mixture of experts
//
// A mixture-of-experts MLP (transformers' Qwen3MoeSparseMoeBlock and
// MixtralSparseMoeBlock; llama.cpp's build_moe_ffn with softmax gating, as
// its qwen3moe and llama architectures call it) replaces a layer's MLP by
// E experts, each a SwiGLU MLP of width F, and a router [E, hidden]. For a
// token whose normalised input is h [hidden]:
//
//	p = softmax(h·Routerᵀ)                   [E]
//	s₀ … s_{k−1} = the k experts of largest p, largest first
//	w_i = p[s_i]  (÷ Σ_i p[s_i] with NormTopK; the sum at least 2⁻¹⁴, as llama.cpp clamps it)
//	x += Σ_i w_i · Down_{s_i}(silu(Gate_{s_i}·h) ⊙ Up_{s_i}·h)
//
// The softmax is ggml's soft_max (the maximum subtracted, expf, the sum in
// float64, the terms multiplied by the float32 reciprocal); ties in p go to
// the lower expert index; the weighted outputs are added in rank order,
// w_i·y_i rounded to float32 first, and their sum then added to x, as
// llama.cpp's graph does (ggml_mul, then ggml_add over the ranks, then the
// residual add). Softmax-then-top-k with renormalisation (Qwen3-MoE with
// norm_topk_prob, llama.cpp's qwen3moe and llama) is the same function as
// the top-k-then-softmax of Mistral's reference Mixtral code up to
// rounding: p[s_i]/Σp[s_j] = e^{l_i}/Σe^{l_j} over the chosen logits l.
//
// Each expert is computed only for the tokens routed to it, batched by
// expert: the batch's (token, rank) pairs are sorted by expert (a counting
// sort, tokens in batch order within an expert), each token's input row is
// gathered into a matrix [T·k, hidden] in that order, and one parallel loop
// runs every routed expert's gate and up over its rows (the tasks of all
// experts together), a second its down projection; a per-token loop then
// adds the weighted outputs to the residual stream. Every row of a matrix
// product is computed by the batch-invariant kernels of the dense layers,
// so a token's result does not depend on which other tokens share its
// experts, the batch, the chunking or the thread count.

// expert is one expert of a mixture-of-experts layer: a SwiGLU MLP
// (gate, up [F, hidden], down [hidden, F]).
type expert struct {
	gate, up, down *tensor
}

// expertViews splits a stacked expert tensor [E, rows, cols] (a GGUF
// ffn_*_exps tensor) into E matrices [rows, cols], views of its data.
func expertViews(t *tensor) ([]*tensor, error) {
	if len(t.Shape) != 3 {
		return nil, fmt.Errorf("tensor %q has %d dimensions, want 3 (experts, rows, columns)", t.Name, len(t.Shape))
	}
	E, rows, cols := t.Shape[0], t.Shape[1], t.Shape[2]
	out := make([]*tensor, E)
	for e := range out {
		v := &tensor{Name: fmt.Sprintf("%s[%d]", t.Name, e), DType: t.DType, Quant: t.Quant, Shape: []int{rows, cols}, rowBytes: t.rowBytes}
		n := rows * cols
		switch {
		case t.quantized():
			v.q = t.q[e*rows*t.rowBytes : (e+1)*rows*t.rowBytes]
		case t.DType == F32:
			v.f32 = t.f32[e*n : (e+1)*n]
		default:
			v.u16 = t.u16[e*n : (e+1)*n]
		}
		out[e] = v
	}
	return out, nil
}

// stackExperts returns the matrices ts (each [rows, cols], of one dtype,
// not quantized) as one tensor [len(ts)·rows, cols] of that dtype (a
// copy): the rows of a GGUF ffn_*_exps tensor.
func stackExperts(name string, ts []*tensor) (*tensor, error) {
	rows, cols, dt := ts[0].Rows(), ts[0].Cols(), ts[0].DType
	st := &tensor{Name: name, DType: dt, Shape: []int{len(ts) * rows, cols}}
	for _, t := range ts {
		if t.quantized() || t.DType != dt || t.Rows() != rows || t.Cols() != cols {
			return nil, fmt.Errorf("llama: the experts of %s differ in type or shape", name)
		}
		if dt == F32 {
			st.f32 = append(st.f32, t.f32...)
		} else {
			st.u16 = append(st.u16, t.u16...)
		}
	}
	return st, nil
}

// moeBuffers are a Model instance's mixture-of-experts activations, grown
// as batches need. N = T·k rows: the batch's (token, rank) pairs sorted by
// expert.
type moeBuffers struct {
	logits  []float32 // router logits [T, E], then the probabilities
	sel     []int32   // chosen experts [T, k], by rank
	wt      []float32 // their weights [T, k]
	off     []int     // first row of each expert [E+1]
	fill    []int     // rows placed so far per expert [E]
	rowTok  []int32   // token of each row [N]
	slotRow []int32   // row of each (token, rank) [T·k]
	xs      []float32 // gathered inputs [N, hidden]
	gate    []float32 // [N, F]; silu(gate)·up after the first loop
	up      []float32 // [N, F]
	ys      []float32 // expert outputs [N, hidden]
	q8      q8Acts    // xs, then gate, quantized for the 32-element block types
	q8k     q8KActs   // … and for the K-quants
	lins    []moeLin  // one per routed expert
	job     moeJob
	gather  gatherJob
	comb    combineJob
}

// moeLin is one routed expert's linear job and its outputs.
type moeLin struct {
	lin  linJob
	outs [2]linOut
	q8   q8Acts  // view of moeBuffers.q8: the expert's rows
	q8k  q8KActs // view of moeBuffers.q8k
}

// moeJob runs the linear jobs of the routed experts as one parallel loop:
// task i belongs to the expert whose first task is the largest first[e] ≤ i.
type moeJob struct {
	lins  []moeLin
	first []int // first task of each expert; first[len(lins)] = total
}

func (j *moeJob) run(w, lo, hi int) {
	e := 0
	for task := lo; task < hi; task++ {
		for task >= j.first[e+1] {
			e++
		}
		j.lins[e].lin.run(w, task-j.first[e], task-j.first[e]+1)
	}
}

// gatherJob copies each row's token input: xs[r] = h[rowTok[r]].
type gatherJob struct {
	xs, h  []float32
	rowTok []int32
	H      int
}

func (j *gatherJob) run(_, lo, hi int) {
	H := j.H
	for r := lo; r < hi; r++ {
		t := int(j.rowTok[r])
		copy(j.xs[r*H:(r+1)*H], j.h[t*H:(t+1)*H])
	}
}

// combineJob adds each token's weighted expert outputs to the residual
// stream: x[t] += Σ_i float32(w_i·ys[slotRow[t,i]]), in rank order.
type combineJob struct {
	x, ys, wt []float32
	slotRow   []int32
	H, k      int
}

func (j *combineJob) run(_, lo, hi int) {
	H, k := j.H, j.k
	for t := lo; t < hi; t++ {
		x := j.x[t*H : (t+1)*H]
		y0 := j.ys[int(j.slotRow[t*k])*H:][:H]
		w0 := j.wt[t*k]
		for i := range x {
			s := float32(y0[i] * w0)
			for r := 1; r < k; r++ {
				s += float32(j.ys[int(j.slotRow[t*k+r])*H+i] * j.wt[t*k+r])
			}
			x[i] += s
		}
	}
}

// route picks the experts of one token from its router logits l [E]
// (overwritten with the probabilities) into sel and wt [k] (see the
// package comment above).
func route(l []float32, sel []int32, wt []float32, norm bool) {
	mx := float32(math.Inf(-1))
	for _, v := range l {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range l {
		e := expf(v - mx)
		l[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range l {
		l[i] *= inv
	}
	for r := range sel {
		best := -1
		for e, p := range l {
			if best >= 0 && p <= l[best] || taken(sel[:r], e) {
				continue
			}
			best = e
		}
		sel[r], wt[r] = int32(best), l[best]
	}
	if !norm {
		return
	}
	var s float64
	for _, w := range wt {
		s += float64(w)
	}
	d := max(float32(s), 6.103515625e-5) // llama.cpp's clamp: the smallest normal float16
	for r := range wt {
		wt[r] /= d
	}
}

// taken reports whether expert e is in sel.
func taken(sel []int32, e int) bool {
	for _, s := range sel {
		if int(s) == e {
			return true
		}
	}
	return false
}

// moeMLP computes layer ly's mixture-of-experts MLP for the T tokens of the
// batch from their normalised inputs b.h [T, hidden] and adds it to the
// residual stream b.x.
func (m *Model) moeMLP(tm *team, ly *layer, T int) {
	cfg := &m.w.cfg
	H, E, K, F := cfg.HiddenSize, cfg.Experts, cfg.ExpertsUsed, cfg.ExpertIntermediate
	b := &m.buf
	mb := &b.moe
	N := T * K
	mb.logits = grow(mb.logits, T*E)
	mb.wt = grow(mb.wt, N)
	if cap(mb.sel) < N {
		mb.sel, mb.rowTok, mb.slotRow = make([]int32, N), make([]int32, N), make([]int32, N)
	}
	mb.sel, mb.rowTok, mb.slotRow = mb.sel[:N], mb.rowTok[:N], mb.slotRow[:N]
	if len(mb.off) != E+1 {
		mb.off, mb.fill, mb.lins = make([]int, E+1), make([]int, E), make([]moeLin, E)
		mb.job.first = make([]int, E+1)
	}

	// Router logits, then each token's experts.
	b.lin = linJob{ks: m.ks, scr: b.scr, x: b.h, T: T, outs: append(b.outs[:0], linOut{w: ly.router, dst: mb.logits}), q8: &b.q8, q8k: &b.q8k}
	linear(tm, &b.lin)
	b.lin = linJob{}
	for t := range T {
		route(mb.logits[t*E:(t+1)*E], mb.sel[t*K:(t+1)*K], mb.wt[t*K:(t+1)*K], cfg.NormTopK)
	}

	// Sort the (token, rank) pairs by expert, tokens in order.
	clear(mb.off)
	for _, e := range mb.sel {
		mb.off[e+1]++
	}
	for e := range E {
		mb.off[e+1] += mb.off[e]
	}
	clear(mb.fill)
	for i, e := range mb.sel {
		r := mb.off[e] + mb.fill[e]
		mb.fill[e]++
		mb.rowTok[r] = int32(i / K)
		mb.slotRow[i] = int32(r)
	}
	mb.xs = grow(mb.xs, N*H)
	mb.gather = gatherJob{xs: mb.xs, h: b.h, rowTok: mb.rowTok, H: H}
	tm.parallelFor(N, max(1, 8192/H), &mb.gather)

	// Gate and up of every routed expert, then down.
	mb.gate, mb.up, mb.ys = grow(mb.gate, N*F), grow(mb.up, N*F), grow(mb.ys, N*H)
	m.runExperts(tm, ly, mb.xs, N, H, func(ex *expert, o0, n int, outs []linOut) []linOut {
		return append(outs, linOut{w: ex.gate, dst: mb.gate[o0*F : (o0+n)*F]}, linOut{w: ex.up, dst: mb.up[o0*F : (o0+n)*F]})
	})
	m.runExperts(tm, ly, mb.gate, N, F, func(ex *expert, o0, n int, outs []linOut) []linOut {
		return append(outs, linOut{w: ex.down, dst: mb.ys[o0*H : (o0+n)*H]})
	})

	mb.comb = combineJob{x: b.x, ys: mb.ys, wt: mb.wt, slotRow: mb.slotRow, H: H, k: K}
	tm.parallelFor(T, max(1, 256/max(1, H/64)), &mb.comb)
	mb.gather, mb.comb = gatherJob{}, combineJob{}
}

// runExperts runs one linear step of every routed expert as one parallel
// loop: x [N, in] holds the rows sorted by expert (moeBuffers.off), and
// outs gives an expert's outputs for its rows [o0, o0+n) — gate and up
// (computed as silu(gate)·up) or down.
func (m *Model) runExperts(tm *team, ly *layer, x []float32, N, in int, outs func(ex *expert, o0, n int, outs []linOut) []linOut) {
	b := &m.buf
	mb := &b.moe
	// Quantize every row once for the experts' weight types.
	var q8, q8k, perm bool
	for e := range ly.experts {
		if mb.off[e+1] == mb.off[e] {
			continue
		}
		for _, o := range outs(&ly.experts[e], 0, 0, mb.lins[0].outs[:0]) {
			w := o.w
			q8 = q8 || w.quantized() && usesQ8(w.Quant)
			q8k = q8k || w.quantized() && usesQ8K(w.Quant)
			perm = perm || w.quantized() && w.Quant == gguf.IQ4_XS
		}
	}
	if q8 {
		mb.q8.reset(N, in)
		b.lin.qj = quantJob{a: &mb.q8, x: x}
		tm.parallelFor(N, max(1, 8192/in), &b.lin.qj)
	}
	if q8k {
		mb.q8k.reset(N, in, perm)
		b.lin.qkj = quantKJob{a: &mb.q8k, x: x}
		tm.parallelFor(N, max(1, 8192/in), &b.lin.qkj)
	}
	b.lin = linJob{}
	active := 0
	total := 0
	for e := range ly.experts {
		o0, n := mb.off[e], mb.off[e+1]-mb.off[e]
		if n == 0 {
			continue
		}
		ml := &mb.lins[active]
		os := outs(&ly.experts[e], o0, n, ml.outs[:0])
		if q8 {
			ml.q8 = q8Acts{n: mb.q8.n, nb: mb.q8.nb, blk: mb.q8.blk[o0*mb.q8.nb : (o0+n)*mb.q8.nb]}
		}
		if q8k {
			ml.q8k = mb.q8k.rows(o0, n)
		}
		ml.lin = linJob{ks: m.ks, scr: b.scr, x: x[o0*in : (o0+n)*in], T: n, outs: os, swiglu: len(os) == 2, glu: gluSiLU, q8: &ml.q8, q8k: &ml.q8k}
		mb.job.first[active] = total
		total += ml.lin.tasks()
		active++
	}
	mb.job.first[active] = total
	mb.job.lins = mb.lins[:active]
	tm.parallelFor(total, 1, &mb.job)
	for i := range mb.job.lins {
		mb.job.lins[i].lin = linJob{}
	}
	mb.job.lins = nil
}

// writeExperts appends the mixture-of-experts tensors of layer ly (name
// prefix p, "blk.N.") for WriteGGUF: ffn_gate_inp [experts, hidden] in F32
// (llama.cpp's quantizer never quantizes the router), and each of
// ffn_gate_exps, ffn_up_exps and ffn_down_exps written by mat as the
// experts' matrices stacked, then given its 3 dimensions {cols, rows,
// experts} (innermost first). Quantization is per row, so the stacked
// matrix is quantized as each expert alone would be.
func writeExperts(ly *layer, p string, mat func(name string, t *tensor, permuteHeads int), tensors *[]gguf.Tensor) error {
	E, H := ly.router.Rows(), ly.router.Cols()
	*tensors = append(*tensors, gguf.Tensor{Name: p + "ffn_gate_inp.weight", Type: gguf.F32, Dims: []uint64{uint64(H), uint64(E)}, Data: F32Bytes(ly.router.Float32())})
	for _, s := range []struct {
		name string
		pick func(ex *expert) *tensor
	}{
		{"ffn_gate_exps.weight", func(ex *expert) *tensor { return ex.gate }},
		{"ffn_up_exps.weight", func(ex *expert) *tensor { return ex.up }},
		{"ffn_down_exps.weight", func(ex *expert) *tensor { return ex.down }},
	} {
		ts := make([]*tensor, E)
		for e := range ly.experts {
			ts[e] = s.pick(&ly.experts[e])
		}
		st, err := stackExperts(p+s.name, ts)
		if err != nil {
			return err
		}
		n := len(*tensors)
		mat(p+s.name, st, 0)
		if len(*tensors) == n+1 {
			(*tensors)[n].Dims = []uint64{uint64(ts[0].Cols()), uint64(ts[0].Rows()), uint64(E)}
		}
	}
	return nil
}

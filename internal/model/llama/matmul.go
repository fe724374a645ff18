package llama

import (
	"unsafe"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// Linear layers on the canonical kernels (simd.go).
//
// A linear layer over a batch is dst[t, r] = dot(W[r], x[t]) (+ bias[r]) for
// T tokens: x [T, in], W [out, in] (PyTorch's nn.Linear layout), dst
// [T, out]. Work is split into tasks of blockRows weight rows, each computing
// its rows for every token, so each weight byte is read from memory once per
// batch; tasks of the matrices that read the same activations (q, k and v;
// gate and up) form one parallel loop. Inside a task, a token block small
// enough for L1 is streamed past groups of kernelSet.rows rows, kernelSet.vecs
// tokens per kernel call.

// blockRows is the number of weight rows in one task: small enough that a
// layer has tens of tasks to balance over the team, large enough that a
// task's widened rows (blockRows·in float32, ≤ 200 KB for in ≤ 1536) are
// reused from L2 across a long batch.
const blockRows = 32

// widenMinTokens is the batch from which a task widens its BF16/F16 rows to
// float32 once (into scratch, in Go) and runs the float32 kernel, instead
// of widening inside the kernel for every group of tokens: only long
// prefills gain (about 10% at 512 tokens; at 16 tokens the Go widening
// would cost more than the whole product). Either way the result is the
// same (widening is exact).
const widenMinTokens = 256

// l1Budget is how many bytes of activations a token block keeps in L1.
const l1Budget = 32 << 10

// scratch is one worker's scratch, grown as batches need and reused across
// Forward calls.
type scratch struct {
	rows   []float32           // widened weight rows of a task [blockRows, in]
	row    []float32           // one widened row (pure-Go path) [in]
	res    [24]float32         // results of a tile cut short by the end of a block [vecs, rows]
	scores []float32           // attention scores [group heads, context rounded up to 4]
	kv     []float32           // pure-Go attention: widened K or V rows [context, headDim]
	sample model.SampleScratch // model.Sample's buffers
}

// matRows computes dst[t·ds + r] = dot(W[r], x[t·in:(t+1)·in]) for t < T and
// r0 ≤ r < r1, with r1 − r0 ≤ blockRows and in = w.Cols().
func matRows(ks *kernelSet, sc *scratch, dst []float32, ds int, x []float32, T int, w *tensor, r0, r1 int) {
	in := w.Cols()
	if ks == nil || (in%16 != 0 && !ks.anyN) {
		matRowsGo(sc, dst, ds, x, T, w, r0, r1)
		return
	}
	kdt := w.DType
	var base unsafe.Pointer
	var rowBytes uintptr
	switch {
	case !ks.tileDT[kdt] || (T >= widenMinTokens && w.DType != F32):
		sc.rows = grow(sc.rows, (r1-r0)*in)
		if w.DType == F32 {
			copy(sc.rows, w.f32[r0*in:r1*in])
		} else {
			widen(w.DType, sc.rows, w.u16[r0*in:r1*in])
		}
		kdt = F32
		base, rowBytes = unsafe.Pointer(&sc.rows[0]), uintptr(4*in)
	case w.DType == F32:
		base, rowBytes = unsafe.Pointer(&w.f32[r0*in]), uintptr(4*in)
	default:
		base, rowBytes = unsafe.Pointer(&w.u16[r0*in]), uintptr(2*in)
	}
	R, V := ks.rows, ks.vecs
	tb := max(V, l1Budget/(4*in)/V*V)
	a := tileArgs{n: uintptr(in)}
	nrows := r1 - r0
	for t0 := 0; t0 < T; t0 += tb {
		t1 := min(t0+tb, T)
		for i := 0; i < nrows; i += R {
			nr := min(R, nrows-i)
			for k := range R {
				a.w[k] = unsafe.Add(base, uintptr(i+min(k, nr-1))*rowBytes)
			}
			a.pf = uintptr(base) + uintptr(i+R)*rowBytes // may be past the rows: only prefetched
			for t := t0; t < t1; t += V {
				nv := min(V, t1-t)
				for j := range nv {
					a.x[j] = unsafe.Pointer(&x[(t+j)*in])
				}
				if nr == R {
					a.out, a.os = unsafe.Pointer(&dst[t*ds+r0+i]), uintptr(4*ds)
					ks.tile(kdt, nv, &a)
					continue
				}
				// Rows past the block were duplicates; keep the real ones.
				a.out, a.os = unsafe.Pointer(&sc.res[0]), uintptr(4*R)
				ks.tile(kdt, nv, &a)
				for j := range nv {
					o := (t+j)*ds + r0 + i
					copy(dst[o:o+nr], sc.res[j*R:j*R+nr])
				}
			}
		}
	}
}

// matRowsGo is matRows on the pure-Go kernels.
func matRowsGo(sc *scratch, dst []float32, ds int, x []float32, T int, w *tensor, r0, r1 int) {
	in := w.Cols()
	sc.row = grow(sc.row, in)
	for r := r0; r < r1; r++ {
		row := w.Row(r, sc.row)
		for t := range T {
			dst[t*ds+r] = dotGo(row, x[t*in:(t+1)*in])
		}
	}
}

// linOut is one matrix of a linear job: dst [T, rows] = x·Wᵀ (+ bias).
type linOut struct {
	w    *tensor
	bias []float32 // [rows] or nil
	dst  []float32
}

// linJob is one parallel loop of linear layers over the same activations
// x [T, in]. Its tasks are the row blocks of each output in turn. With
// resid set (one output), each task then adds its block to resid [T, rows]:
// the residual connection x += sublayer(x). With swiglu set (outputs gate
// and up of equal shape), a task computes the same block of both and sets
// gate = act(gate)·up there, act chosen by glu (SiLU, or Gemma's gelu).
type linJob struct {
	ks     *kernelSet
	scr    []scratch
	x      []float32
	T      int
	outs   []linOut
	resid  []float32
	swiglu bool
	glu    int // the gated activation with swiglu: gluSiLU, gluGELUTanh or gluGELUTanhGGML
	// geluTab is ggml's float16 gelu table for gluGELUTanhGGML.
	geluTab []uint16
	first   [4]int // first task of each output; first[len(outs)] = total
	// q8 receives x quantized for the 32-element block types (nil: allocated
	// when needed); qj is the loop that fills it.
	q8 *q8Acts
	qj quantJob
	// q8k and qkj are the same for all K-quant outputs (Q8_K).
	q8k *q8KActs
	qkj quantKJob
}

// tasks prepares the job and returns its number of tasks.
func (j *linJob) tasks() int {
	n := 0
	outs := j.outs
	if j.swiglu {
		outs = outs[:1]
	}
	for i, o := range outs {
		j.first[i] = n
		n += (o.w.Rows() + blockRows - 1) / blockRows
	}
	j.first[len(outs)] = n
	return n
}

func (j *linJob) run(w, lo, hi int) {
	sc := &j.scr[w]
	for task := lo; task < hi; task++ {
		oi := 0
		for task >= j.first[oi+1] {
			oi++
		}
		o := &j.outs[oi]
		rows := o.w.Rows()
		r0 := (task - j.first[oi]) * blockRows
		r1 := min(r0+blockRows, rows)
		j.mat(sc, o, r0, r1)
		addBias(o.dst, rows, j.T, o.bias, r0, r1)
		switch {
		case j.swiglu:
			up := &j.outs[1]
			j.mat(sc, up, r0, r1)
			addBias(up.dst, rows, j.T, up.bias, r0, r1)
			for t := range j.T {
				g, u := o.dst[t*rows+r0:t*rows+r1], up.dst[t*rows+r0:t*rows+r1]
				if j.glu == gluSiLU {
					siluMul(j.ks, g, u)
				} else {
					geluMul(g, u, j.geluTab)
				}
			}
		case j.resid != nil:
			for t := range j.T {
				addInPlace(j.resid[t*rows+r0:t*rows+r1], o.dst[t*rows+r0:t*rows+r1])
			}
		}
	}
}

// Gated activations of a linJob (glu).
const (
	gluSiLU         = iota // silu(gate)·up: siluMul
	gluGELUTanh            // gelu_tanh(gate)·up in float64: geluMul
	gluGELUTanhGGML        // … through ggml's float16 table: geluMul with geluTab
)

// mat computes rows [r0, r1) of output o.
func (j *linJob) mat(sc *scratch, o *linOut, r0, r1 int) {
	switch {
	case o.w.quantized() && usesQ8K(o.w.Quant):
		matRowsK(j.ks, o.dst, o.w.Rows(), j.q8k, j.T, o.w, r0, r1)
		return
	case o.w.quantized():
		matRowsQ(j.ks, sc, o.dst, o.w.Rows(), j.q8, j.T, o.w, r0, r1)
		return
	}
	matRows(j.ks, sc, o.dst, o.w.Rows(), j.x, j.T, o.w, r0, r1)
}

// addBias adds bias[r] to dst[t·ds + r] for t < T, r0 ≤ r < r1 (nothing if
// bias is nil).
func addBias(dst []float32, ds, T int, bias []float32, r0, r1 int) {
	if bias == nil {
		return
	}
	for t := range T {
		d := dst[t*ds+r0 : t*ds+r1]
		for i := range d {
			d[i] += bias[r0+i]
		}
	}
}

// linear runs j on the team (or inline when it is small), first
// quantizing x if an output has quantized weights.
func linear(tm *team, j *linJob) {
	n := j.tasks()
	in := j.outs[0].w.Cols()
	var q8, q8k, perm bool
	for _, o := range j.outs {
		q8 = q8 || o.w.quantized() && usesQ8(o.w.Quant)
		q8k = q8k || o.w.quantized() && usesQ8K(o.w.Quant)
		perm = perm || o.w.quantized() && o.w.Quant == gguf.IQ4_XS
	}
	if q8 {
		if j.q8 == nil {
			j.q8 = new(q8Acts)
		}
		j.q8.reset(j.T, in)
		j.qj = quantJob{a: j.q8, x: j.x}
		tm.parallelFor(j.T, max(1, 8192/in), &j.qj)
	}
	if q8k {
		if j.q8k == nil {
			j.q8k = new(q8KActs)
		}
		j.q8k.reset(j.T, in, perm)
		j.qkj = quantKJob{a: j.q8k, x: j.x}
		tm.parallelFor(j.T, max(1, 8192/in), &j.qkj)
	}
	grain := 1
	if j.T*in*blockRows*n < minParallelFlops {
		grain = n
	}
	tm.parallelFor(n, grain, j)
}

// minParallelFlops is the work (multiply-adds) below which a loop runs on
// the caller alone: handing it to the team would cost more than it saves.
const minParallelFlops = 1 << 15

// addInPlace adds y to x element-wise.
func addInPlace(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
	}
}

package llama

import (
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// fmaExact is a·b + c rounded once to float32, through big.Float.
func fmaExact(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(2000).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(2000).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(2000).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	check := func(a, b, c float32) {
		t.Helper()
		want := fmaExact(a, b, c)
		if got := fma32(a, b, c); math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), want %g (%#x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	// Double rounding through float64 goes wrong here: the exact sum lies
	// just below the midpoint between y and its successor, float64 rounds
	// it onto the midpoint, and ties-to-even then picks the successor (y
	// is odd).
	y := math.Float32frombits(0x3f800001) // 1 + 2^-23
	a := float32(1 + math.Ldexp(1, -23))
	b := float32((1 - math.Ldexp(1, -23)) * math.Ldexp(1, -24)) // half of y's ulp, less 2^-46 of it
	if naive := float32(float64(a)*float64(b) + float64(y)); naive == fmaExact(a, b, y) {
		t.Fatal("the hard case is not hard: naive rounding agrees")
	}
	check(a, b, y)
	check(-a, b, -y)
	rng := rand.New(rand.NewPCG(7, 7))
	rnd := func() float32 {
		return float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
	}
	for range 30000 {
		a, b := rnd(), rnd()
		var c float32
		switch rng.IntN(3) {
		case 0:
			c = rnd()
		case 1: // cancellation
			c = -float32(float64(a) * float64(b))
		default: // near a float32 midpoint
			p := float64(a) * float64(b)
			c = float32(-p + math.Ldexp(float64(rng.IntN(5)-2), math.Ilogb(p)-24))
		}
		check(a, b, c)
	}
	// Signed zeros: the bits must match exactly, the sign included.
	for _, c := range [][3]float32{{0, 0, 0}, {negZero, 1, 0}, {negZero, 1, negZero}, {1, negZero, negZero}, {negZero, negZero, negZero},
		{1, float32(math.Inf(1)), 1}, {3e38, 3e38, 0}, {1e-30, 1e-30, 1e-45}} {
		want := fmaExact(c[0], c[1], c[2])
		if got := fma32(c[0], c[1], c[2]); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), want %g (%#x)", c[0], c[1], c[2], got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	if math.Float32bits(fma32(negZero, 1, negZero)) != 0x80000000 {
		t.Fatal("fma32(−0, 1, −0) is not −0")
	}
}

// negZero is −0 as a float32 (the Go constant -0.0 is +0).
var negZero = float32(math.Copysign(0, -1))

// kernelSets returns the assembly kernel sets this CPU runs, widest first.
func kernelSets(t testing.TB) []*kernelSet {
	var sets []*kernelSet
	for _, limit := range []int{2, 1} {
		ks := kernelSetFor(limit)
		if ks != nil && (len(sets) == 0 || sets[len(sets)-1].name != ks.name) {
			sets = append(sets, ks)
		}
	}
	if len(sets) == 0 {
		t.Log("no assembly kernels on this CPU: only the pure-Go path is tested")
	}
	return sets
}

// randRows returns rows×cols values of dt (as stored) and their float32
// values; a few are exactly zero or negative zero.
func randRows(rng *rand.Rand, dt DType, rows, cols int) (*tensor, []float32) {
	tn, f := randTensor(rng, dt, rows, cols)
	return tn, f
}

func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// TestTileKernels checks every tile kernel against the pure-Go dot product
// bit for bit, for every vector count and all row/vector positions.
func TestTileKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, ks := range kernelSets(t) {
		for _, dt := range []DType{F32, BF16, F16} {
			if !ks.tileDT[dt] {
				continue
			}
			ns := []int{16, 64, 576, 1552}
			if ks.anyN {
				ns = append(ns, 1, 8, 15, 17, 172, 1557)
			}
			for _, n := range ns {
				w, wf := randRows(rng, dt, ks.rows, n)
				xs := make([][]float32, ks.vecs)
				for v := range xs {
					xs[v] = randVec(rng, n)
				}
				for nv := 1; nv <= ks.vecs; nv++ {
					var a tileArgs
					a.n = uintptr(n)
					for r := range ks.rows {
						if dt == F32 {
							a.w[r] = unsafe.Pointer(&w.f32[r*n])
						} else {
							a.w[r] = unsafe.Pointer(&w.u16[r*n])
						}
					}
					for v := range nv {
						a.x[v] = unsafe.Pointer(&xs[v][0])
					}
					out := make([]float32, nv*ks.rows+1)
					a.out, a.os = unsafe.Pointer(&out[0]), uintptr(4*ks.rows)
					ks.tile(dt, nv, &a)
					for v := range nv {
						for r := range ks.rows {
							want := dotGo(wf[r*n:(r+1)*n], xs[v])
							if got := out[v*ks.rows+r]; math.Float32bits(got) != math.Float32bits(want) {
								t.Fatalf("%s %v n=%d vecs=%d: [%d,%d] = %v, Go %v", ks.name, dt, n, nv, v, r, got, want)
							}
						}
					}
					if out[nv*ks.rows] != 0 {
						t.Fatalf("%s %v vecs=%d wrote past its results", ks.name, dt, nv)
					}
				}
			}
		}
	}
}

// TestPVKernels checks every weighted-sum kernel against the pure-Go loop
// bit for bit, including accumulation across calls.
func TestPVKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, ks := range kernelSets(t) {
		for _, dt := range []DType{F32, BF16, F16} {
			chunks := ks.pvChunks
			if ks.pvMasked {
				chunks = append(chunks[:len(chunks):len(chunks)], 0)
			}
			for _, c := range chunks {
				if !ks.pvDT[dt] {
					continue
				}
				cols := 16 * c
				if c == 0 {
					cols = 1 + rng.IntN(15)
				}
				const rows, stride = 37, 3 // rows of `stride·cols` elements; the kernel reads the first cols
				vt, vf := randRows(rng, dt, rows, stride*cols)
				for G := 1; G <= 6; G++ {
					p := randVec(rng, G*rows)
					got := randVec(rng, G*cols)
					want := append([]float32(nil), got...)
					for h := range G {
						weightedGo(want[h*cols:(h+1)*cols], p[h*rows:(h+1)*rows], func(j int) []float32 {
							return vf[j*stride*cols:]
						})
					}
					// Two calls (rows 0–19, 20–36) continue the same chains.
					for _, part := range [][2]int{{0, 20}, {20, rows}} {
						a := pvArgs{vs: uintptr(stride * cols * dtSize(dt)), n: uintptr(part[1] - part[0]),
							p: unsafe.Pointer(&p[part[0]]), ps: uintptr(4 * rows), out: unsafe.Pointer(&got[0]), os: uintptr(4 * cols), cols: uintptr(cols)}
						if dt == F32 {
							a.v = unsafe.Pointer(&vt.f32[part[0]*stride*cols])
						} else {
							a.v = unsafe.Pointer(&vt.u16[part[0]*stride*cols])
						}
						ks.pv(dt, c, G, &a)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s %v C=%d G=%d: out[%d] = %v, Go %v", ks.name, dt, c, G, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

func dtSize(dt DType) int { return dt.Size() }

// TestLinear checks the linear driver against a float64 loop (tolerance) for
// every weight dtype, sizes that leave partial tiles and blocks, bias and
// residual, on 1 or 3 workers; and that every kernel path (pure Go
// included) and every batch gives each output the same bits: row t of a
// batch of T equals the same token computed alone.
func TestLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	paths := append([]*kernelSet{nil}, kernelSets(t)...)
	for _, dt := range []DType{F32, BF16, F16} {
		for _, sz := range [][3]int{{1, 1, 1}, {5, 37, 19}, {3, 70, 130}, {17, 64, 576}, {9, 67, 48}, {13, 45, 32}} {
			T, out, in := sz[0], sz[1], sz[2]
			w, wf := randTensor(rng, dt, out, in)
			x := randVec(rng, T*in)
			bias := make([]float32, out)
			for i := range bias {
				bias[i] = float32(i)
			}
			resid0 := randVec(rng, T*out)
			var ref []float32
			for _, ks := range paths {
				for _, threads := range []int{1, 3} {
					tm := startTeam(threads)
					dst := make([]float32, T*out)
					resid := append([]float32(nil), resid0...)
					j := &linJob{ks: ks, scr: make([]scratch, threads), x: x, T: T, outs: []linOut{{w, bias, dst}}, resid: resid}
					linear(tm, j)
					// One token at a time.
					single := make([]float32, T*out)
					for tt := range T {
						j := &linJob{ks: ks, scr: make([]scratch, threads), x: x[tt*in : (tt+1)*in], T: 1, outs: []linOut{{w, bias, single[tt*out : (tt+1)*out]}}}
						linear(tm, j)
					}
					tm.stop()
					name := "go"
					if ks != nil {
						name = ks.name
					}
					for tt := range T {
						for r := range out {
							var want float64
							for i := range in {
								want += float64(x[tt*in+i]) * float64(wf[r*in+i])
							}
							want += float64(bias[r])
							got := dst[tt*out+r]
							if math.Abs(float64(got)-want) > 1e-5*math.Sqrt(float64(in))*4 {
								t.Fatalf("%s %v %v threads %d: dst[%d,%d] = %v, want %v", name, dt, sz, threads, tt, r, got, want)
							}
							if math.Float32bits(single[tt*out+r]) != math.Float32bits(got) {
								t.Fatalf("%s %v %v: token %d row %d: %v in a batch of %d, %v alone", name, dt, sz, tt, r, got, T, single[tt*out+r])
							}
							if resid[tt*out+r] != resid0[tt*out+r]+got {
								t.Fatalf("%s %v %v: residual [%d,%d] = %v, want %v + %v", name, dt, sz, tt, r, resid[tt*out+r], resid0[tt*out+r], got)
							}
						}
					}
					if ref == nil {
						ref = dst
					}
					for i := range ref {
						if math.Float32bits(ref[i]) != math.Float32bits(dst[i]) {
							t.Fatalf("%v %v: %s gives dst[%d] = %v, pure Go %v", dt, sz, name, i, dst[i], ref[i])
						}
					}
				}
			}
			ref = nil
		}
	}
}

// TestAttentionPaths checks that attention gives the same bits on every
// kernel path and KV dtype, for tokens alone or batched, with a context
// spanning several pages, and matches a float64 computation.
func TestAttentionPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, kvdt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		for _, shape := range [][3]int{{9, 3, 64}, {4, 2, 16}, {8, 1, 8}, {14, 2, 32}} {
			heads, kvH, D := shape[0], shape[1], shape[2]
			geo := kvcache.Geometry{Layers: 1, KVHeads: kvH, HeadDim: D, DType: kvdt}
			pool, err := kvcache.NewPool(geo, 16, int64(8*16*geo.BytesPerToken()))
			if err != nil {
				t.Fatal(err)
			}
			pages, _ := pool.Alloc(5)
			const n = 70 // positions 0..69 over 5 pages
			for p := range n {
				for kv := range 2 {
					encodeKV(nil, kvdt, kvSlot(pool, pages, p, 0, kv), randVec(rng, kvH*D))
				}
			}
			T := 4
			pos := []int32{0, 15, 16, 69}
			seqOf := make([]int32, T)
			q := randVec(rng, T*heads*D)
			seqs := []model.SeqInput{{Pages: pages}}
			var ref []float32
			for _, ks := range append([]*kernelSet{nil}, kernelSets(t)...) {
				att := make([]float32, T*heads*D)
				j := &attnJob{ks: ks, scr: make([]scratch, 2), pool: pool, seqs: seqs, q: q, att: att, pos: pos, seqOf: seqOf, heads: heads, kvH: kvH, d: D, scale: float32(1 / math.Sqrt(float64(D)))}
				tm := startTeam(2)
				tm.parallelFor(j.tasks(T), 1, j)
				// Token 3 alone, at a different place.
				alone := make([]float32, heads*D)
				j1 := &attnJob{ks: ks, scr: make([]scratch, 2), pool: pool, seqs: seqs, q: q[3*heads*D:], att: alone, pos: pos[3:], seqOf: seqOf[3:], heads: heads, kvH: kvH, d: D, sub: 1, scale: float32(1 / math.Sqrt(float64(D)))}
				tm.parallelFor(j1.tasks(1), 1, j1)
				tm.stop()
				for i, v := range alone {
					if math.Float32bits(v) != math.Float32bits(att[3*heads*D+i]) {
						t.Fatalf("%v %v: token 3 alone differs at %d", kvdt, shape, i)
					}
				}
				if ref == nil {
					ref = att
					checkAttention(t, pool, pages, q, att, pos, heads, kvH, D)
					continue
				}
				for i := range ref {
					if math.Float32bits(ref[i]) != math.Float32bits(att[i]) {
						t.Fatalf("%v %v: %s gives att[%d] = %v, pure Go %v", kvdt, shape, ks.name, i, att[i], ref[i])
					}
				}
			}
		}
	}
}

// checkAttention compares att with a float64 computation from the pages.
func checkAttention(t *testing.T, pool *kvcache.Pool, pages []kvcache.PageID, q, att []float32, pos []int32, heads, kvH, D int) {
	t.Helper()
	dt := pool.Geometry().DType
	row := func(p, kv, g int) []float32 {
		b := kvSlot(pool, pages, p, 0, kv)
		return append([]float32(nil), kvRow(dt, unsafe.Pointer(&b[g*D*kvBytes(pool.Geometry().DType)]), D, make([]float32, D))...)
	}
	G := heads / kvH
	for ti, p := range pos {
		n := int(p) + 1
		for h := range heads {
			g := h / G
			s := make([]float64, n)
			m := math.Inf(-1)
			for j := range n {
				k := row(j, 0, g)
				for d := range D {
					s[j] += float64(q[ti*heads*D+h*D+d]) * float64(k[d])
				}
				s[j] /= math.Sqrt(float64(D))
				m = max(m, s[j])
			}
			var z float64
			for j := range s {
				s[j] = math.Exp(s[j] - m)
				z += s[j]
			}
			for d := range D {
				var want float64
				for j := range n {
					want += s[j] / z * float64(row(j, 1, g)[d])
				}
				if got := att[ti*heads*D+h*D+d]; math.Abs(float64(got)-want) > 1e-5 {
					t.Fatalf("token %d head %d dim %d: %v, want %v", ti, h, d, got, want)
				}
			}
		}
	}
}

// BenchmarkKernels measures the tile kernels alone on one thread: GFLOP/s
// (2 per multiply-add) and GB/s of weight bytes read, for a weight matrix
// of 1536 rows × 576 (3.5 MB in BF16: from L3, as in decode) and 1, 6 or
// 16 vectors.
func BenchmarkKernels(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, in = 1536, 576
	for _, ks := range append(kernelSets(b), nil) {
		name := "go"
		if ks != nil {
			name = ks.name
		}
		for _, dt := range []DType{BF16, F32} {
			w, _ := randTensor(rng, dt, rows, in)
			for _, T := range []int{1, 6, 16} {
				if ks == nil && T > 1 {
					continue
				}
				b.Run(name+"/"+dt.String()+"/T"+itoaT(T), func(b *testing.B) {
					x := randVec(rng, T*in)
					dst := make([]float32, T*rows)
					var sc scratch
					for range b.N {
						for r0 := 0; r0 < rows; r0 += blockRows {
							matRows(ks, &sc, dst, rows, x, T, w, r0, r0+blockRows)
						}
					}
					s := b.Elapsed().Seconds()
					b.ReportMetric(float64(2*T*rows*in)*float64(b.N)/s/1e9, "GFLOP/s")
					b.ReportMetric(float64(rows*in*dt.Size())*float64(b.N)/s/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkLinear measures the linear driver on the SmolLM2 MLP shape
// ([T, 576] · [576, 1536]) on GOMAXPROCS workers and reports GFLOP/s.
func BenchmarkLinear(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []DType{F32, BF16} {
		w, _ := randTensor(rng, dt, 1536, 576)
		for _, T := range []int{1, 16, 64, 512} {
			b.Run(dt.String()+"/T"+itoaT(T), func(b *testing.B) {
				x := randVec(rng, T*576)
				dst := make([]float32, T*1536)
				tm := startTeam(runtime.GOMAXPROCS(0))
				defer tm.stop()
				j := &linJob{ks: kernelSetFor(2), scr: make([]scratch, tm.size())}
				b.ResetTimer()
				for range b.N {
					j.x, j.T, j.outs = x, T, []linOut{{w: w, dst: dst}}
					linear(tm, j)
				}
				b.ReportMetric(float64(2*T*576*1536)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkTeam measures the cost of one empty parallel loop.
func BenchmarkTeam(b *testing.B) {
	tm := startTeam(runtime.GOMAXPROCS(0))
	defer tm.stop()
	body := loopFunc(func(w, lo, hi int) {})
	for range b.N {
		tm.parallelFor(tm.size(), 1, body)
	}
}

// TestExpf checks expf's accuracy against math.Exp over its range, and its
// clamping.
func TestExpf(t *testing.T) {
	worst := 0.0
	for i := range 300001 {
		x := float32(-87 + 175*float64(i)/300000)
		got, want := float64(expf(x)), math.Exp(float64(x))
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1))) - float32(want))
		if e := math.Abs(got-want) / ulp; e > worst {
			worst = e
		}
	}
	if worst > 3 {
		t.Errorf("expf is off by %.2f ulp at worst", worst)
	}
	if expf(-1000) != expf(-87) || expf(1000) != expf(88) || math.IsInf(float64(expf(88)), 0) {
		t.Errorf("clamping: expf(-1000) = %v, expf(1000) = %v", expf(-1000), expf(1000))
	}
}

// TestSoftmaxSiluPaths checks that softmax and SwiGLU give the same bits on
// every kernel set as in pure Go, for lengths with and without tails.
func TestSoftmaxSiluPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	for _, n := range []int{1, 7, 16, 17, 100, 512, 1536, 1543} {
		x := randVec(rng, n)
		for i := range x {
			x[i] *= 10
		}
		x[0] = -200 // clamped
		up := randVec(rng, n)
		ref := append([]float32(nil), x...)
		softmax(nil, ref)
		refS := append([]float32(nil), x...)
		siluMul(nil, refS, up)
		var sum float64
		for i, v := range ref {
			sum += float64(v)
			g := float64(x[i])
			if want := g / (1 + math.Exp(-g)) * float64(up[i]); math.Abs(float64(refS[i])-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("silu(%v)·%v = %v, want %v", x[i], up[i], refS[i], want)
			}
		}
		if math.Abs(sum-1) > 1e-5 {
			t.Fatalf("n=%d: softmax sums to %v", n, sum)
		}
		for _, ks := range kernelSets(t) {
			got := append([]float32(nil), x...)
			softmax(ks, got)
			gotS := append([]float32(nil), x...)
			siluMul(ks, gotS, up)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(ref[i]) || math.Float32bits(gotS[i]) != math.Float32bits(refS[i]) {
					t.Fatalf("%s n=%d [%d]: softmax %v (Go %v), silu %v (Go %v)", ks.name, n, i, got[i], ref[i], gotS[i], refS[i])
				}
			}
		}
	}
}

// TestArgLayout checks the argument block offsets the assembly (asmgen)
// assumes.
func TestArgLayout(t *testing.T) {
	var a tileArgs
	var p pvArgs
	var e expArgs
	var s siluArgs
	var q qtileArgs
	var nw narrowArgs
	var pa prefetchArgs
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"tileArgs.x", unsafe.Offsetof(a.x), 32}, {"tileArgs.n", unsafe.Offsetof(a.n), 80},
		{"tileArgs.out", unsafe.Offsetof(a.out), 88}, {"tileArgs.os", unsafe.Offsetof(a.os), 96},
		{"tileArgs.pf", unsafe.Offsetof(a.pf), 104},
		{"pvArgs.vs", unsafe.Offsetof(p.vs), 8}, {"pvArgs.n", unsafe.Offsetof(p.n), 16},
		{"pvArgs.p", unsafe.Offsetof(p.p), 24}, {"pvArgs.ps", unsafe.Offsetof(p.ps), 32},
		{"pvArgs.out", unsafe.Offsetof(p.out), 40}, {"pvArgs.os", unsafe.Offsetof(p.os), 48},
		{"expArgs.n", unsafe.Offsetof(e.n), 8}, {"expArgs.m", unsafe.Offsetof(e.m), 16},
		{"expArgs.lanes", unsafe.Offsetof(e.lanes), 24},
		{"siluArgs.u", unsafe.Offsetof(s.u), 8}, {"siluArgs.n", unsafe.Offsetof(s.n), 16},
		{"qtileArgs.x", unsafe.Offsetof(q.x), 32}, {"qtileArgs.nb", unsafe.Offsetof(q.nb), 64},
		{"qtileArgs.out", unsafe.Offsetof(q.out), 72}, {"qtileArgs.os", unsafe.Offsetof(q.os), 80},
		{"qtileArgs.pf", unsafe.Offsetof(q.pf), 88},
		{"narrowArgs.dst", unsafe.Offsetof(nw.dst), 8}, {"narrowArgs.n", unsafe.Offsetof(nw.n), 16},
		{"prefetchArgs.s", unsafe.Offsetof(pa.s), 8}, {"prefetchArgs.rows", unsafe.Offsetof(pa.rows), 16},
		{"prefetchArgs.bytes", unsafe.Offsetof(pa.bytes), 24},
	} {
		if c.got != c.want {
			t.Errorf("%s at offset %d, the assembly reads %d", c.name, c.got, c.want)
		}
	}
}

// BenchmarkStream measures the linear driver on one token against a 256 MB
// BF16 matrix (rows of 576 or 1536, as SmolLM2's), so from memory as in
// batch-1 decode: GB/s of weights read, on 1 and 2 workers.
func BenchmarkStream(b *testing.B) {
	for _, in := range []int{576, 1536} {
		rows := (256 << 20) / 2 / in
		u := make([]uint16, rows*in)
		for i := range u {
			u[i] = 0x3f80
		}
		w := &tensor{DType: BF16, Shape: []int{rows, in}, u16: u}
		x := make([]float32, in)
		dst := make([]float32, rows)
		for _, th := range []int{1, 2} {
			b.Run(itoaT(in)+"/threads"+itoaT(th), func(b *testing.B) {
				tm := startTeam(th)
				defer tm.stop()
				j := &linJob{ks: kernelSetFor(2), scr: make([]scratch, th), x: x, T: 1, outs: []linOut{{w: w, dst: dst}}}
				b.ResetTimer()
				for range b.N {
					linear(tm, j)
				}
				b.ReportMetric(float64(rows*in*2)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkAttentionDecode measures one layer's attention for one token at
// 256 positions of context (SmolLM2's 9 query and 3 KV heads of 64) with
// each KV dtype, on 1 and 2 workers, with the widest kernels.
func BenchmarkAttentionDecode(b *testing.B) {
	heads, kvH, D := 9, 3, 64
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		rng := rand.New(rand.NewPCG(9, 9))
		geo := kvcache.Geometry{Layers: 1, KVHeads: kvH, HeadDim: D, DType: dt}
		pool, err := kvcache.NewPool(geo, 16, int64(600*geo.BytesPerToken()))
		if err != nil {
			b.Fatal(err)
		}
		pages, _ := pool.Alloc(32)
		const n = 256
		for p := range n {
			for kv := range 2 {
				encodeKV(nil, dt, kvSlot(pool, pages, p, 0, kv), randVec(rng, kvH*D))
			}
		}
		j := &attnJob{ks: kernelSetFor(2), scr: make([]scratch, 2), pool: pool, seqs: []model.SeqInput{{Pages: pages}},
			q: randVec(rng, heads*D), att: make([]float32, heads*D), pos: []int32{n - 1}, seqOf: []int32{0}, heads: heads, kvH: kvH, d: D, scale: float32(1 / math.Sqrt(float64(D)))}
		for _, th := range []int{1, 2} {
			b.Run(dt.String()+"/threads"+itoaT(th), func(b *testing.B) {
				tm := startTeam(th)
				defer tm.stop()
				for range b.N {
					tm.parallelFor(j.tasks(1), 1, j)
				}
			})
		}
	}
}

// BenchmarkEncodeKV measures writing one token's K or V for SmolLM2's 3
// KV heads of 64 into a slot of each dtype (ns per 192 values), in pure Go
// and with the widest kernels.
func BenchmarkEncodeKV(b *testing.B) {
	src := randVec(rand.New(rand.NewPCG(10, 10)), 192)
	for _, ks := range []*kernelSet{nil, kernelSetFor(2)} {
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
			dst := make([]byte, len(src)*dt.Size())
			b.Run(kernelName(ks)+"/"+dt.String(), func(b *testing.B) {
				for range b.N {
					encodeKV(ks, dt, dst, src)
				}
			})
		}
	}
}

// BenchmarkAttentionBatch16 measures one decode step's attention for 16
// sequences with 160 tokens of context each over SmolLM2's 30 layers (9
// query and 3 KV heads of 64) with each KV dtype on 1 and 2 workers and the
// widest kernels: the KV (75 MiB in F32) does not stay in the caches, and
// between layers a 16 MiB buffer is read as the layers' weights would
// (untimed). It reports attention wall and CPU µs per step.
func BenchmarkAttentionBatch16(b *testing.B) {
	const layers, heads, kvH, D, seqs, n = 30, 9, 3, 64, 16, 160
	evict := make([]byte, 16<<20)
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.F16} {
		rng := rand.New(rand.NewPCG(11, 11))
		geo := kvcache.Geometry{Layers: layers, KVHeads: kvH, HeadDim: D, DType: dt}
		pool, err := kvcache.NewPool(geo, 16, int64(seqs*(n+16)*geo.BytesPerToken()))
		if err != nil {
			b.Fatal(err)
		}
		in := make([]model.SeqInput, seqs)
		pos, seqOf := make([]int32, seqs), make([]int32, seqs)
		for i := range in {
			pages, ok := pool.Alloc(pool.PagesFor(n))
			if !ok {
				b.Fatal("pool exhausted")
			}
			in[i] = model.SeqInput{Pages: pages}
			for li := range layers {
				for p := range n {
					for kv := range 2 {
						encodeKV(nil, dt, kvSlot(pool, pages, p, li, kv), randVec(rng, kvH*D))
					}
				}
			}
			pos[i], seqOf[i] = n-1, int32(i)
		}
		j := &attnJob{ks: kernelSetFor(2), scr: make([]scratch, 2), pool: pool, seqs: in,
			q: randVec(rng, seqs*heads*D), att: make([]float32, seqs*heads*D), pos: pos, seqOf: seqOf, heads: heads, kvH: kvH, d: D, scale: float32(1 / math.Sqrt(float64(D)))}
		for _, th := range []int{1, 2} {
			b.Run(dt.String()+"/threads"+itoaT(th), func(b *testing.B) {
				tm := startTeam(th)
				defer tm.stop()
				var d, cpu time.Duration
				var sink byte
				for range b.N {
					for li := range layers {
						for i := 0; i < len(evict); i += 64 {
							sink += evict[i]
						}
						j.li = li
						start, cpu0 := time.Now(), processCPU()
						tm.parallelFor(j.tasks(seqs), 1, j)
						d += time.Since(start)
						cpu += processCPU() - cpu0
					}
				}
				evict[0] = sink
				b.ReportMetric(float64(d.Microseconds())/float64(b.N), "µs/step")
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/step")
			})
		}
	}
}

package llama

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// TestQuantizeRoundTrip checks ggml's reference quantizers through
// dequantRow: Q8_0 within half a step (d/2) of each value, Q4_0, Q4_1,
// Q5_0 and Q5_1 within one step, and exact for values already on the grid;
// and QuantizeIQ4NL within half its grid's widest gap.
func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randVec(rng, 32*20)
	x[5], x[40] = 0, negZero
	for i := 64; i < 96; i++ {
		x[i] = 0 // an all-zero block
	}
	for _, c := range []struct {
		typ  gguf.Type
		q    func([]float32) []byte
		step func(d float32) float64
	}{{gguf.Q8_0, QuantizeQ8_0, func(d float32) float64 { return float64(d) / 2 * 1.07 }}, {gguf.Q4_0, QuantizeQ4_0, oneStep},
		{gguf.Q5_0, QuantizeQ5_0, oneStep}, {gguf.Q5_1, QuantizeQ5_1, oneStep}, {gguf.Q4_1, QuantizeQ4_1, oneStep},
		// IQ4_NL's grid has gaps of up to 24 steps of d.
		{gguf.IQ4_NL, QuantizeIQ4NL, func(d float32) float64 { return 12 * math.Abs(float64(d)) }}} {
		b := c.q(x)
		if len(b) != len(x)/32*c.typ.BlockBytes() {
			t.Fatalf("%s: %d bytes", c.typ, len(b))
		}
		y := make([]float32, len(x))
		dequantRow(c.typ, b, y)
		for i := range x {
			d := f16At(b, i/32*c.typ.BlockBytes())
			if e := math.Abs(float64(y[i] - x[i])); e > c.step(d)*1.01+1e-7 {
				t.Fatalf("%s: element %d: %v → %v (scale %v)", c.typ, i, x[i], y[i], d)
			}
		}
		if c.typ == gguf.IQ4_NL {
			continue // its scale is fitted: values on the grid may get another
		}
		// Values on the grid come back exactly.
		again := c.q(y)
		z := make([]float32, len(y))
		dequantRow(c.typ, again, z)
		for i := range y {
			if z[i] != y[i] {
				t.Fatalf("%s: requantizing element %d: %v → %v", c.typ, i, y[i], z[i])
			}
		}
	}
}

func oneStep(d float32) float64 { return math.Abs(float64(d)) }

// TestDequantQ5Layout checks dequantRow on hand-made Q4_1, Q5_0, Q5_1 and
// IQ4_NL blocks against ggml's dequantize_row_* formulas: element i < 16 from the
// low nibble of qs[i], element i+16 from its high nibble, and for Q5 the
// fifth bit of element k from bit k of qh (little-endian).
func TestDequantQ5Layout(t *testing.T) {
	const d, m = 0.5, -3.0 // exact in binary16
	var qs [16]byte
	for i := range qs {
		qs[i] = byte(i) | byte(15-i)<<4
	}
	const qh = 0x80010003 // elements 0, 1, 16 and 31
	hi := func(k int) int { return qh >> k & 1 }
	q5 := func(k int) int {
		if k < 16 {
			return k | hi(k)<<4
		}
		return 15 - (k - 16) | hi(k)<<4
	}
	blk := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	h16 := func(v float32) []byte { u := F32ToF16(v); return []byte{byte(u), byte(u >> 8)} }
	qhb := []byte{qh & 255, qh >> 8 & 255, qh >> 16 & 255, qh >> 24}
	for _, c := range []struct {
		typ  gguf.Type
		data []byte
		want func(k int) float32
	}{
		{gguf.Q5_0, blk(h16(d), qhb, qs[:]), func(k int) float32 { return d * float32(q5(k)-16) }},
		{gguf.Q5_1, blk(h16(d), h16(m), qhb, qs[:]), func(k int) float32 { return d*float32(q5(k)) + m }},
		{gguf.Q4_1, blk(h16(d), h16(m), qs[:]), func(k int) float32 { return d*float32(q5(k)&15) + m }},
		{gguf.IQ4_NL, blk(h16(d), qs[:]), func(k int) float32 {
			grid := [16]float32{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} // ggml-common.h kvalues_iq4nl
			return d * grid[q5(k)&15]
		}},
	} {
		if len(c.data) != c.typ.BlockBytes() {
			t.Fatalf("%s: block of %d bytes", c.typ, len(c.data))
		}
		got := Dequantize(c.typ, c.data, 32)
		for k := range 32 {
			if got[k] != c.want(k) {
				t.Fatalf("%s: element %d = %v, want %v", c.typ, k, got[k], c.want(k))
			}
		}
	}
}

// TestQ8Activations checks the activation quantization: quants within
// [−127, 127], the block's largest magnitude at ±127, the lane sums, and
// dequantized values within half a step.
func TestQ8Activations(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	const T, n = 3, 96
	x := randVec(rng, T*n)
	for i := 32; i < 64; i++ {
		x[i] = 0
	}
	var a q8Acts
	a.reset(T, n)
	a.quantizeRows(x, 0, T)
	for k := range T * n / 32 {
		blk := &a.blk[k]
		qs := blk.qs[:]
		d := blk.d8[0]
		var big int8
		for i, q := range qs {
			big = max(big, q, -q)
			if e := math.Abs(float64(d)*float64(q) - float64(x[32*k+i])); e > float64(d)*0.502+1e-9 {
				t.Fatalf("block %d element %d: %v → %d·%v", k, i, x[32*k+i], q, d)
			}
		}
		if k != 1 && big != 127 || k == 1 && (big != 0 || d != 0) {
			t.Fatalf("block %d: largest quant %d, scale %v", k, big, d)
		}
		for j := range 8 {
			s := int32(qs[4*j]) + int32(qs[4*j+1]) + int32(qs[4*j+2]) + int32(qs[4*j+3])
			if blk.ls[j] != -s || blk.d8[j] != d {
				t.Fatalf("block %d lane %d: sum %d (want %d), scale %v", k, j, -blk.ls[j], s, blk.d8[j])
			}
		}
	}
}

// TestDotQ8 checks the canonical quantized dot product against a float64
// sum over the dequantized weights and activations.
func TestDotQ8(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, typ := range qtileKinds {
		for _, n := range []int{32, 64, 96, 576} {
			w := typeQuantize(typ, randVec(rng, n))
			wf := make([]float32, n)
			dequantRow(typ, w, wf)
			x := randVec(rng, 2*n)
			var a q8Acts
			a.reset(2, n)
			a.quantizeRows(x, 0, 2)
			for tok := range 2 {
				var want, mag float64
				for i := range n {
					blk := &a.blk[(tok*n+i)/32]
					xv := float64(blk.d8[0]) * float64(blk.qs[i%32])
					want += float64(wf[i]) * xv
					mag += math.Abs(float64(wf[i]) * xv)
				}
				got := dotQ8Go(typ, w, &a, tok)
				if e := math.Abs(float64(got) - want); e > 1e-6*mag {
					t.Fatalf("%s n=%d: %v, want %v", typ, n, got, want)
				}
			}
		}
	}
}

func typeQuantize(t gguf.Type, x []float32) []byte {
	switch t {
	case gguf.Q8_0:
		return QuantizeQ8_0(x)
	case gguf.Q4_0:
		return QuantizeQ4_0(x)
	case gguf.Q5_0:
		return QuantizeQ5_0(x)
	case gguf.Q5_1:
		return QuantizeQ5_1(x)
	case gguf.Q4_1:
		return QuantizeQ4_1(x)
	case gguf.IQ4_NL:
		return QuantizeIQ4NL(x)
	}
	panic("typeQuantize: " + t.String())
}

// TestQTileKernels checks every integer tile kernel against the pure-Go
// canonical dot product bit for bit, for every activation row count (1 to
// 4 in one call, and 9 in calls of 4, 4 and 1), row lengths of 1 to 48
// blocks, and a partial row group.
func TestQTileKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, ks := range kernelSets(t) {
		if ks.qisa == 0 {
			continue
		}
		for _, typ := range qtileKinds {
			for _, tb := range []struct{ nb, T int }{{1, 9}, {2, 1}, {3, 2}, {18, 3}, {18, 4}, {18, 9}, {48, 1}, {48, 9}} {
				nb, T := tb.nb, tb.T
				n := 32 * nb
				const rows = 7
				wf := randVec(rng, rows*n)
				for i := range wf[:n] {
					wf[i] *= 1e-3 // a row of tiny weights
				}
				w, err := newQuantTensor("w", typ, []int{rows, n}, typeQuantize(typ, wf))
				if err != nil {
					t.Fatal(err)
				}
				x := randVec(rng, T*n)
				x[5] = 1e4 // one block dominated by a large value
				var a q8Acts
				a.reset(T, n)
				a.quantizeRows(x, 0, T)
				want := make([]float32, T*rows)
				matRowsQ(nil, nil, want, rows, &a, T, w, 0, rows)
				got := make([]float32, T*rows)
				var sc scratch
				matRowsQ(ks, &sc, got, rows, &a, T, w, 0, rows)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %s nb=%d T=%d: [%d, %d] = %v, Go %v", ks.name, typ, nb, T, i/rows, i%rows, got[i], want[i])
					}
				}
			}
		}
	}
}

// BenchmarkQKernels measures the integer tile kernels alone on one thread:
// GB/s of weight bytes for a 1536 × 576 matrix (1.5 MB in Q8_0: from L2/L3,
// as in decode), 1 or 16 activation rows; and the activation quantization.
func BenchmarkQKernels(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, n = 1536, 576
	for _, ks := range append(kernelSets(b), nil) {
		name := "go"
		if ks != nil {
			name = ks.name
		}
		for _, typ := range qtileKinds {
			w, err := newQuantTensor("w", typ, []int{rows, n}, typeQuantize(typ, randVec(rng, rows*n)))
			if err != nil {
				b.Fatal(err)
			}
			for _, T := range []int{1, 16} {
				if ks == nil && T > 1 {
					continue
				}
				b.Run(name+"/"+typ.String()+"/T"+itoaT(T), func(b *testing.B) {
					var a q8Acts
					a.reset(T, n)
					a.quantizeRows(randVec(rng, T*n), 0, T)
					dst := make([]float32, T*rows)
					var sc scratch
					for range b.N {
						for r0 := 0; r0 < rows; r0 += blockRows {
							matRowsQ(ks, &sc, dst, rows, &a, T, w, r0, r0+blockRows)
						}
					}
					s := b.Elapsed().Seconds()
					b.ReportMetric(float64(len(w.q))*float64(b.N)/s/1e9, "GB/s")
					b.ReportMetric(float64(2*T*rows*n)*float64(b.N)/s/1e9, "GOP/s")
				})
			}
		}
	}
	b.Run("quantize/T16", func(b *testing.B) {
		x := randVec(rng, 16*1536)
		var a q8Acts
		a.reset(16, 1536)
		for range b.N {
			a.quantizeRows(x, 0, 16)
		}
		b.ReportMetric(float64(16*1536)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
	})
}

// BenchmarkStreamQ measures batch-1 decode's memory side: the linear
// driver on one token against a 256 MB matrix of each weight type (rows of
// 1536, SmolLM2's ffn_down; and 576 for Q8_0 and Q4_0, its other
// matrices), on the widest kernels, 1 and 2 workers, as GB/s of weight
// bytes streamed; and memread, a plain loop summing the 256 MB as uint64
// words, the bandwidth the kernels can at best reach. Besides GB/s of wall
// time it reports GB per CPU second (all threads), the steadier figure on a
// shared machine. (The weights repeat 64 quantized rows: the contents do
// not change the instruction stream.)
func BenchmarkStreamQ(b *testing.B) {
	const size = 256 << 20
	threads := []int{1, 2}
	b.Run("memread", func(b *testing.B) {
		buf := make([]uint64, size/8)
		for i := range buf {
			buf[i] = uint64(i)
		}
		for _, th := range threads {
			b.Run("threads"+itoaT(th), func(b *testing.B) {
				tm := startTeam(th)
				defer tm.stop()
				j := &sumJob{buf: buf, sums: make([]uint64, 8*th)}
				cpu0 := processCPU()
				for range b.N {
					tm.parallelFor(len(buf)/(1<<15), 1, j)
				}
				reportStream(b, size, processCPU()-cpu0)
			})
		}
	})
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range []struct {
		typ gguf.Type
		in  int
	}{{gguf.Q8_0, 576}, {gguf.Q8_0, 1536}, {gguf.Q4_0, 576}, {gguf.Q4_0, 1536}, {gguf.Q4_K, 1536}, {gguf.Q6_K, 1536}} {
		rowBytes := int(c.typ.RowBytes(uint64(c.in)))
		rows := size / rowBytes
		var quant func([]float32) []byte
		switch c.typ {
		case gguf.Q8_0:
			quant = QuantizeQ8_0
		case gguf.Q4_0:
			quant = QuantizeQ4_0
		case gguf.Q4_K:
			quant = QuantizeQ4K
		default:
			quant = QuantizeQ6K
		}
		pat := quant(randVec(rng, 64*c.in))
		raw := make([]byte, rows*rowBytes)
		for i := 0; i < len(raw); i += len(pat) {
			copy(raw[i:], pat)
		}
		w, err := newQuantTensor("w", c.typ, []int{rows, c.in}, raw)
		if err != nil {
			b.Fatal(err)
		}
		x := randVec(rng, c.in)
		dst := make([]float32, rows)
		for _, th := range threads {
			b.Run(c.typ.String()+"/"+itoaT(c.in)+"/threads"+itoaT(th), func(b *testing.B) {
				tm := startTeam(th)
				defer tm.stop()
				j := &linJob{ks: kernelSetFor(2), scr: make([]scratch, th), x: x, T: 1, outs: []linOut{{w: w, dst: dst}}}
				b.ResetTimer()
				cpu0 := processCPU()
				for range b.N {
					linear(tm, j)
				}
				reportStream(b, len(raw), processCPU()-cpu0)
			})
		}
	}
}

// reportStream reports GB/s of wall time and GB per CPU second for b.N
// reads of bytes bytes that took cpu.
func reportStream(b *testing.B, bytes int, cpu time.Duration) {
	gb := float64(bytes) * float64(b.N) / 1e9
	b.ReportMetric(gb/b.Elapsed().Seconds(), "GB/s")
	if cpu > 0 {
		b.ReportMetric(gb/cpu.Seconds(), "GB/cpu-s")
	}
}

// sumJob sums chunks of 2^15 words of buf, four independent sums per
// worker so that the loop is bound by loads, not by an add chain.
type sumJob struct {
	buf  []uint64
	sums []uint64 // 8 per worker (a cache line each, no false sharing)
}

func (j *sumJob) run(w, lo, hi int) {
	var s0, s1, s2, s3 uint64
	b := j.buf[lo<<15 : hi<<15]
	for i := 0; i+4 <= len(b); i += 4 {
		s0 += b[i]
		s1 += b[i+1]
		s2 += b[i+2]
		s3 += b[i+3]
	}
	j.sums[8*w] += s0 + s1 + s2 + s3
}

// TestTensorTypeFallback checks some of the types WriteGGUF picks in
// llama.cpp's K-quant mixes, and those for rows that are not a multiple of
// the block: llama.cpp's Q5_0 for Q4_K, Q5_1 for
// Q5_K, Q4_0 for Q3_K and Q2_K, Q8_0 for Q6_K and IQ4_NL for IQ4_XS (rows
// of 576, SmolLM2's), F32 for
// the 32-element types and for rows not a multiple of 32.
func TestTensorTypeFallback(t *testing.T) {
	for _, c := range []struct {
		ft         FileType
		name       string
		cols       int
		classifier bool
		want       gguf.Type
		gqa        int
	}{
		{FileQ4_KM, "blk.0.attn_q.weight", 576, false, gguf.Q5_0, 1},
		{FileQ4_KM, "blk.0.attn_q.weight", 512, false, gguf.Q4_K, 1},
		{FileQ4_KM, "output.weight", 576, true, gguf.Q8_0, 1},
		{FileQ4_KM, "blk.0.ffn_down.weight", 48, false, gguf.F32, 1},
		{FileQ5_0, "blk.0.attn_q.weight", 576, false, gguf.Q5_0, 1},
		{FileQ5_1, "blk.0.attn_q.weight", 48, false, gguf.F32, 1},
		{FileQ4_1, "blk.0.attn_q.weight", 64, false, gguf.Q4_1, 1},
		{FileQ5_KM, "blk.0.attn_q.weight", 576, false, gguf.Q5_1, 1},
		{FileQ5_KM, "blk.0.attn_q.weight", 512, false, gguf.Q5_K, 1},
		{FileQ5_KM, "output.weight", 576, true, gguf.Q8_0, 1},
		{FileQ3_KM, "blk.0.attn_q.weight", 576, false, gguf.Q4_0, 1},
		{FileQ3_KM, "blk.0.attn_q.weight", 512, false, gguf.Q3_K, 1},
		{FileQ3_KM, "blk.0.attn_v.weight", 576, false, gguf.Q5_1, 1},
		{FileQ3_KM, "blk.0.ffn_down.weight", 48, false, gguf.F32, 1},
		{FileQ3_KM, "token_embd.weight", 512, true, gguf.Q6_K, 1},
		{FileQ2_K, "blk.0.attn_q.weight", 576, false, gguf.Q4_0, 1},
		{FileQ2_K, "blk.0.attn_q.weight", 512, false, gguf.Q2_K, 1},
		{FileQ2_K, "blk.0.attn_v.weight", 512, false, gguf.Q3_K, 3},
		{FileQ2_K, "blk.0.attn_v.weight", 512, false, gguf.Q4_K, 4},
		{FileQ2_K, "blk.0.ffn_down.weight", 512, false, gguf.Q3_K, 1},
		{FileIQ4XS, "blk.0.attn_q.weight", 576, false, gguf.IQ4_NL, 1},
		{FileIQ4XS, "blk.0.attn_q.weight", 512, false, gguf.IQ4_XS, 1},
		{FileIQ4XS, "blk.0.attn_q.weight", 48, false, gguf.F32, 1},
		{FileIQ4XS, "blk.0.attn_v.weight", 512, false, gguf.IQ4_XS, 3},
		{FileIQ4XS, "blk.0.attn_v.weight", 512, false, gguf.Q5_K, 4},
		{FileIQ4XS, "blk.0.attn_v.weight", 576, false, gguf.Q5_1, 4},
		{FileIQ4XS, "blk.0.ffn_down.weight", 512, false, gguf.IQ4_XS, 1},
		{FileIQ4XS, "output.weight", 512, true, gguf.Q6_K, 1},
	} {
		if got := tensorType(c.ft, c.name, c.cols, 0, 2, c.gqa, c.classifier); got != c.want {
			t.Errorf("%s %s cols %d: %s, want %s", c.ft, c.name, c.cols, got, c.want)
		}
	}
	// IQ4_XS: ffn_down is Q5_K in the first eighth of the layers only.
	for layer, want := range []gguf.Type{gguf.Q5_K, gguf.Q5_K, gguf.IQ4_XS, gguf.IQ4_XS} {
		if got := tensorType(FileIQ4XS, "blk.N.ffn_down.weight", 512, layer, 16, 1, false); got != want {
			t.Errorf("IQ4_XS ffn_down of layer %d of 16: %s, want %s", layer, got, want)
		}
	}
}

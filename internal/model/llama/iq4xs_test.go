package llama

import (
	"encoding/binary"
	"testing"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// TestIQ4XSLayout packs two IQ4_XS blocks by hand from ggml-common.h's
// block_iq4_xs (d, scales_h, scales_l, qs; sub-block j's elements 0–15 in
// the low nibbles of qs[16j…], 16–31 in the high ones) and checks
// Dequantize against d·(ls_j − 32)·kvalues_iq4nl[nibble] for each element.
func TestIQ4XSLayout(t *testing.T) {
	const nb = 2
	raw := make([]byte, nb*136)
	want := make([]float32, nb*256)
	for b := range nb {
		blk := raw[136*b : 136*b+136]
		d := float32(0.5 + 0.25*float32(b))
		binary.LittleEndian.PutUint16(blk, F32ToF16(d))
		var sh uint16
		for j := range 8 {
			ls := uint8((7*j + 3 + 11*b) % 64) // every 6-bit value class: low and high bits both vary
			blk[4+j/2] |= (ls & 15) << (4 * (j % 2))
			sh |= uint16(ls>>4) << (2 * j)
			for i := range 32 {
				nib := uint8((5*i + 3*j + b) % 16)
				if i < 16 {
					blk[8+16*j+i] |= nib
				} else {
					blk[8+16*j+i-16] |= nib << 4
				}
				want[256*b+32*j+i] = d * float32(int(ls)-32) * float32(kvaluesIQ4NL[nib])
			}
		}
		binary.LittleEndian.PutUint16(blk[2:], sh)
	}
	got := Dequantize(gguf.IQ4_XS, raw, nb*256)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("element %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// TestQuantizeIQ4XSScales checks QuantizeIQ4XS's block header: a block of
// zeros has d = −0 (ggml's −max_scale/32 of max_scale 0), every scale
// stored as 32 (0 after the bias) and every index 8 (the grid point 1,
// nearest 0); and in a block whose sub-block j holds values up to (j+1)/8
// the largest sub-block's scale is stored as 0 (−32, d < 0) and the
// smaller ones in order.
func TestQuantizeIQ4XSScales(t *testing.T) {
	x := make([]float32, 512)
	for j := range 8 {
		for i := range 32 {
			x[256+32*j+i] = float32(j+1) / 8 * float32(i-16) / 16
		}
	}
	q := QuantizeIQ4XS(x)
	zero := q[:136]
	if h := binary.LittleEndian.Uint16(zero); h != 0x8000 {
		t.Fatalf("zero block: d %#04x, want 0x8000", h)
	}
	if sc := iq4xsScales(zero); sc != [8]int32{} {
		t.Fatalf("zero block: scales %v, want all 0", sc)
	}
	for i, v := range zero[8:] {
		if v != 0x88 {
			t.Fatalf("zero block: qs[%d] = %#x, want 0x88", i, v)
		}
	}
	blk := q[136:]
	if d := f16At(blk, 0); d >= 0 {
		t.Fatalf("d = %v, want < 0 (the largest scale at −32)", d)
	}
	sc := iq4xsScales(blk)
	if sc[7] != -32 {
		t.Fatalf("largest sub-block's scale %d, want −32", sc[7])
	}
	for j := range 7 {
		if sc[j] <= sc[j+1] {
			t.Fatalf("scales %v: want decreasing (growing magnitude, negative)", sc)
		}
	}
}

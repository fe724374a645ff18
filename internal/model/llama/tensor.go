package llama

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// tensor is a weight matrix or vector kept in its stored dtype (usually a
// view into a memory-mapped checkpoint). Matrices use PyTorch's nn.Linear
// layout [out, in]: row r holds the weights of output r.
type tensor struct {
	Name  string
	DType DType // float element type, unless quantized (q != nil)
	// Quant is the block format of a quantized tensor (Q8_0, Q4_0, Q4_1,
	// Q5_0, Q5_1, IQ4_NL, Q4_K, Q6_K; see quant.go), when q != nil.
	Quant gguf.Type
	// Shape is [rows, cols] for a matrix, [n] for a vector.
	Shape    []int
	f32      []float32 // the elements when DType is F32
	u16      []uint16  // the bit patterns when DType is F16 or BF16
	q        []byte    // the blocks of a quantized tensor, rows of rowBytes
	rowBytes int
}

// quantized reports whether the tensor holds quantized blocks.
func (t *tensor) quantized() bool { return t.q != nil }

// typeName is the tensor's element type as GGUF names it.
func (t *tensor) typeName() string {
	if t.quantized() {
		return t.Quant.String()
	}
	return safetensorsName(t.DType)
}

// Rows is Shape[0].
func (t *tensor) Rows() int { return t.Shape[0] }

// Cols is the length of a row: Shape[1] for a matrix, Shape[0] for a vector.
func (t *tensor) Cols() int { return t.Shape[len(t.Shape)-1] }

// Row returns row r as float32: a view of the tensor for F32 (do not write
// it), otherwise dst[:Cols] filled with the widened values. dst may be nil
// for F32; otherwise it needs room for Cols values.
func (t *tensor) Row(r int, dst []float32) []float32 {
	c := t.Cols()
	if t.quantized() {
		dst = dst[:c]
		dequantRow(t.Quant, t.q[r*t.rowBytes:(r+1)*t.rowBytes], dst)
		return dst
	}
	if t.DType == F32 {
		return t.f32[r*c : (r+1)*c : (r+1)*c]
	}
	dst = dst[:c]
	widen(t.DType, dst, t.u16[r*c:(r+1)*c])
	return dst
}

// Float32 returns a copy of the whole tensor as float32.
func (t *tensor) Float32() []float32 {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	out := make([]float32, n)
	if t.quantized() {
		c := t.Cols()
		for r := range n / c {
			t.Row(r, out[r*c:(r+1)*c])
		}
		return out
	}
	if t.DType == F32 {
		copy(out, t.f32)
	} else {
		widen(t.DType, out, t.u16)
	}
	return out
}

// newTensor builds a tensor over raw little-endian bytes, without copying
// when they are aligned for the element type (they are in files written with
// 8-byte-aligned data, which is the usual case), with a copy otherwise.
func newTensor(name string, dt DType, shape []int, raw []byte) (*tensor, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(raw) != n*dt.Size() {
		return nil, fmt.Errorf("tensor %q: %s %v needs %d bytes, got %d", name, safetensorsName(dt), shape, n*dt.Size(), len(raw))
	}
	t := &tensor{Name: name, DType: dt, Shape: append([]int(nil), shape...)}
	switch dt {
	case F32:
		t.f32 = f32View(raw)
	case F16, BF16:
		t.u16 = u16View(raw)
	default:
		return nil, fmt.Errorf("tensor %q: unsupported dtype %s", name, safetensorsName(dt))
	}
	return t, nil
}

// newQuantTensor builds a quantized tensor over raw blocks (a view).
func newQuantTensor(name string, qt gguf.Type, shape []int, raw []byte) (*tensor, error) {
	if e, _ := quantBlock(qt); e == 0 {
		return nil, fmt.Errorf("tensor %q: unsupported type %s", name, qt)
	}
	cols := shape[len(shape)-1]
	rows := 1
	for _, d := range shape[:len(shape)-1] {
		rows *= d
	}
	rb := int(qt.RowBytes(uint64(cols)))
	if cols%qt.BlockSize() != 0 || len(raw) != rows*rb {
		return nil, fmt.Errorf("tensor %q: %s %v needs %d bytes, got %d", name, qt, shape, rows*rb, len(raw))
	}
	return &tensor{Name: name, Quant: qt, Shape: append([]int(nil), shape...), q: raw, rowBytes: rb}, nil
}

// f32View reinterprets little-endian binary32 bytes as []float32, or decodes
// a copy when b is not 4-byte aligned. Callers must not write the result.
// (The package requires a little-endian host; see Load.)
func f32View(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 == 0 {
		return unsafe.Slice((*float32)(p), len(b)/4)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// u16View reinterprets little-endian 16-bit values as []uint16, or decodes a
// copy when b is not 2-byte aligned.
func u16View(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%2 == 0 {
		return unsafe.Slice((*uint16)(p), len(b)/2)
	}
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// isLittleEndian reports whether the host stores integers little-endian, as
// the zero-copy views above (and the safetensors and KV byte layouts) assume.
func isLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

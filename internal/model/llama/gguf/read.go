package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Limits of what Parse accepts, beyond the bytes of the file: ggml's
// GGML_MAX_DIMS, and bounds generous for any real model that keep a
// corrupt file from costing more than a few times its size.
const (
	// MaxDims is the most dimensions a tensor may have (GGML_MAX_DIMS).
	MaxDims = 4
	// MaxNameBytes bounds a tensor name (ggml allows 63 bytes).
	MaxNameBytes = 1024
	// MaxAlignment bounds general.alignment.
	MaxAlignment = 1 << 16
)

// TensorInfo describes a tensor of a parsed file.
type TensorInfo struct {
	Name string
	Type Type
	// Dims are in ggml order, innermost first: a PyTorch [rows, cols]
	// matrix is {cols, rows}.
	Dims []uint64
	// Offset is the data's offset from the start of the file.
	Offset uint64
	// Data is the tensor's bytes: a view of the buffer given to Parse.
	Data []byte
}

// Elements is the product of the dimensions.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed GGUF file.
type File struct {
	Version uint32
	// Alignment is general.alignment, or the default 32.
	Alignment uint64
	// KV holds the metadata in file order.
	KV []KV
	// Tensors are the tensor descriptions in file order.
	Tensors []TensorInfo
	// DataOffset is where the data section starts.
	DataOffset uint64

	kv      map[string]int
	tensors map[string]int
}

// Value returns the value of key, if present.
func (f *File) Value(key string) (any, bool) {
	i, ok := f.kv[key]
	if !ok {
		return nil, false
	}
	return f.KV[i].Value, true
}

// Tensor returns the tensor named name, if present.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensors[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// String returns the string value of key: ok is false if it is absent; an
// error names the key if it has another type.
func (f *File) String(key string) (v string, ok bool, err error) {
	x, ok := f.Value(key)
	if !ok {
		return "", false, nil
	}
	v, isStr := x.(string)
	if !isStr {
		return "", true, fmt.Errorf("gguf: %s is %s, want a string", key, typeName(x))
	}
	return v, true, nil
}

// Uint returns the value of key as an unsigned integer: any integer type
// with a non-negative value. ok is false if it is absent; an error names the
// key if it has another type or a negative value.
func (f *File) Uint(key string) (v uint64, ok bool, err error) {
	x, ok := f.Value(key)
	if !ok {
		return 0, false, nil
	}
	var s int64
	switch x := x.(type) {
	case uint8:
		return uint64(x), true, nil
	case uint16:
		return uint64(x), true, nil
	case uint32:
		return uint64(x), true, nil
	case uint64:
		return x, true, nil
	case int8:
		s = int64(x)
	case int16:
		s = int64(x)
	case int32:
		s = int64(x)
	case int64:
		s = x
	default:
		return 0, true, fmt.Errorf("gguf: %s is %s, want an unsigned integer", key, typeName(x))
	}
	if s < 0 {
		return 0, true, fmt.Errorf("gguf: %s is %d, want a non-negative integer", key, s)
	}
	return uint64(s), true, nil
}

// Float returns the value of key as a float64 (float32, float64 or an
// integer). ok is false if it is absent; an error names the key if it has
// another type.
func (f *File) Float(key string) (v float64, ok bool, err error) {
	x, ok := f.Value(key)
	if !ok {
		return 0, false, nil
	}
	switch x := x.(type) {
	case float32:
		return float64(x), true, nil
	case float64:
		return x, true, nil
	}
	if u, _, err := f.Uint(key); err == nil {
		return float64(u), true, nil
	}
	return 0, true, fmt.Errorf("gguf: %s is %s, want a number", key, typeName(x))
}

// Bool returns the boolean value of key. ok is false if it is absent; an
// error names the key if it has another type.
func (f *File) Bool(key string) (v bool, ok bool, err error) {
	x, ok := f.Value(key)
	if !ok {
		return false, false, nil
	}
	v, isBool := x.(bool)
	if !isBool {
		return false, true, fmt.Errorf("gguf: %s is %s, want a bool", key, typeName(x))
	}
	return v, true, nil
}

// typeName describes a metadata value's type for errors.
func typeName(x any) string {
	switch x.(type) {
	case string:
		return "a string"
	case bool:
		return "a bool"
	case float32, float64:
		return "a float"
	case uint8, int8, uint16, int16, uint32, int32, uint64, int64:
		return "an integer"
	}
	return fmt.Sprintf("an array (%T)", x)
}

// reader decodes little-endian values from b, tracking the offset; every
// read checks the bytes that remain.
type reader struct {
	b   []byte
	off uint64
}

var errShort = errors.New("truncated")

func (r *reader) left() uint64 { return uint64(len(r.b)) - r.off }

func (r *reader) take(n uint64) ([]byte, error) {
	if n > r.left() {
		return nil, errShort
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b, nil
}

func (r *reader) u8() (uint8, error) {
	b, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) u16() (uint16, error) {
	b, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64() (uint64, error) {
	b, err := r.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// str reads a gguf_string: a uint64 length and that many bytes.
func (r *reader) str() (string, error) {
	n, err := r.u64()
	if err != nil {
		return "", err
	}
	if n > r.left() {
		return "", fmt.Errorf("string of %d bytes with %d left in the file: %w", n, r.left(), errShort)
	}
	b, _ := r.take(n)
	return string(b), nil
}

// scalarSize is the encoded size of a scalar metadata type, 0 for string
// and array (and unknown types).
func scalarSize(t uint32) uint64 {
	switch t {
	case typeUint8, typeInt8, typeBool:
		return 1
	case typeUint16, typeInt16:
		return 2
	case typeUint32, typeInt32, typeFloat32:
		return 4
	case typeUint64, typeInt64, typeFloat64:
		return 8
	}
	return 0
}

// scalar reads one value of scalar type t.
func (r *reader) scalar(t uint32) (any, error) {
	switch t {
	case typeUint8:
		return r.u8()
	case typeInt8:
		v, err := r.u8()
		return int8(v), err
	case typeBool:
		v, err := r.u8()
		if err == nil && v > 1 {
			return nil, fmt.Errorf("bool byte %d (want 0 or 1)", v)
		}
		return v == 1, err
	case typeUint16:
		return r.u16()
	case typeInt16:
		v, err := r.u16()
		return int16(v), err
	case typeUint32:
		return r.u32()
	case typeInt32:
		v, err := r.u32()
		return int32(v), err
	case typeFloat32:
		v, err := r.u32()
		return math.Float32frombits(v), err
	case typeUint64:
		return r.u64()
	case typeInt64:
		v, err := r.u64()
		return int64(v), err
	case typeFloat64:
		v, err := r.u64()
		return math.Float64frombits(v), err
	case typeString:
		return r.str()
	}
	return nil, fmt.Errorf("unknown value type %d", t)
}

// array reads an array of element type et and n elements, after checking
// that the file holds that many.
func (r *reader) array(et uint32, n uint64) (any, error) {
	if et == typeArray {
		return nil, errors.New("nested arrays are not supported")
	}
	each := scalarSize(et)
	if et == typeString {
		each = 8 // each string has a length
	}
	if each == 0 {
		return nil, fmt.Errorf("unknown array element type %d", et)
	}
	if n > r.left()/each {
		return nil, fmt.Errorf("array of %d elements of type %d with %d bytes left in the file: %w", n, et, r.left(), errShort)
	}
	switch et {
	case typeString:
		return readSlice[string](r, n, et)
	case typeUint8:
		return readSlice[uint8](r, n, et)
	case typeInt8:
		return readSlice[int8](r, n, et)
	case typeBool:
		return readSlice[bool](r, n, et)
	case typeUint16:
		return readSlice[uint16](r, n, et)
	case typeInt16:
		return readSlice[int16](r, n, et)
	case typeUint32:
		return readSlice[uint32](r, n, et)
	case typeInt32:
		return readSlice[int32](r, n, et)
	case typeFloat32:
		return readSlice[float32](r, n, et)
	case typeUint64:
		return readSlice[uint64](r, n, et)
	case typeInt64:
		return readSlice[int64](r, n, et)
	default: // typeFloat64
		return readSlice[float64](r, n, et)
	}
}

func readSlice[T any](r *reader, n uint64, et uint32) ([]T, error) {
	out := make([]T, n)
	for i := range out {
		v, err := r.scalar(et)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = v.(T)
	}
	return out, nil
}

// Parse parses a GGUF file (versions 2 and 3, little-endian) held whole in
// b. It returns an error, naming the field, for: a file shorter than its
// header, a wrong magic, an unsupported version; a count, string or array
// longer than the bytes that remain; an unknown metadata type, a nested
// array, a duplicate key; a general.alignment that is not a power of two
// (up to MaxAlignment); a tensor with no or more than MaxDims dimensions, a
// zero dimension, too many elements, an unknown type, an innermost
// dimension that is not a multiple of its type's block size, a misaligned
// offset, data past the end of the file or not where the tensor before it
// ends (llama.cpp's rule), and a duplicate name.
func Parse(b []byte) (*File, error) {
	r := &reader{b: b}
	if len(b) < 24 {
		return nil, fmt.Errorf("gguf: truncated: %d bytes, a GGUF header needs 24", len(b))
	}
	magic, _ := r.u32()
	if magic != Magic {
		return nil, fmt.Errorf("gguf: not a GGUF file: magic %q, want \"GGUF\"", b[:4])
	}
	f := &File{Alignment: Alignment, kv: map[string]int{}, tensors: map[string]int{}}
	f.Version, _ = r.u32()
	switch {
	case f.Version == 1:
		return nil, errors.New("gguf: version 1 (32-bit counts) is not supported; re-convert the model")
	case f.Version != 2 && f.Version != 3:
		return nil, fmt.Errorf("gguf: unsupported version %d (want 2 or 3; a byte-swapped version means a big-endian file)", f.Version)
	}
	nt, _ := r.u64()
	nkv, _ := r.u64()
	// Each key/value takes at least 13 bytes (key length, type, one byte),
	// each tensor info at least 36 (name length, dimension count, one
	// dimension, type, offset).
	if nkv > r.left()/13 {
		return nil, fmt.Errorf("gguf: metadata count %d does not fit in the file's %d bytes", nkv, len(b))
	}
	if nt > r.left()/36 {
		return nil, fmt.Errorf("gguf: tensor count %d does not fit in the file's %d bytes", nt, len(b))
	}
	f.KV = make([]KV, 0, nkv)
	for i := range nkv {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %d: key: %w", i, err)
		}
		if _, dup := f.kv[key]; dup {
			return nil, fmt.Errorf("gguf: metadata key %q appears twice", key)
		}
		t, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %s: type: %w", key, err)
		}
		var v any
		if t == typeArray {
			var et uint32
			var n uint64
			if et, err = r.u32(); err == nil {
				if n, err = r.u64(); err == nil {
					v, err = r.array(et, n)
				}
			}
		} else {
			v, err = r.scalar(t)
		}
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %s: %w", key, err)
		}
		f.kv[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	if a, ok := f.Value("general.alignment"); ok {
		u, isU32 := a.(uint32)
		if !isU32 || u == 0 || u&(u-1) != 0 || u > MaxAlignment {
			return nil, fmt.Errorf("gguf: general.alignment %v: want a uint32 power of two up to %d", a, MaxAlignment)
		}
		f.Alignment = uint64(u)
	}
	f.Tensors = make([]TensorInfo, 0, nt)
	for i := range nt {
		ti, err := r.tensorInfo(f.Alignment)
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %d%s: %w", i, quoted(ti.Name), err)
		}
		if _, dup := f.tensors[ti.Name]; dup {
			return nil, fmt.Errorf("gguf: tensor %q appears twice", ti.Name)
		}
		f.tensors[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	f.DataOffset = align(r.off, f.Alignment)
	if nt > 0 && f.DataOffset > uint64(len(b)) {
		return nil, fmt.Errorf("gguf: truncated: the data section would start at byte %d of %d", f.DataOffset, len(b))
	}
	data := uint64(len(b)) - min(f.DataOffset, uint64(len(b)))
	var next uint64 // where the next tensor's data must start
	for i := range f.Tensors {
		t := &f.Tensors[i]
		size := t.Type.RowBytes(t.Elements())
		rel := t.Offset
		if rel > data || size > data-rel {
			return nil, fmt.Errorf("gguf: tensor %q: data [%d, %d) of the data section lies past its end (%d bytes): truncated file?",
				t.Name, rel, rel+size, data)
		}
		// As llama.cpp's gguf_init_from_file_impl: the tensors' data
		// follow each other in the order of their descriptions, each
		// padded to the alignment — so a type or shape changed in a
		// description (its size with it) cannot go unnoticed.
		if rel != next {
			prev := "the data section's start"
			if i > 0 {
				prev = fmt.Sprintf("the end of %q before it, aligned", f.Tensors[i-1].Name)
			}
			return nil, fmt.Errorf("gguf: tensor %q has offset %d in the data section, expected %d (%s): the type or shape of one of them does not match the data", t.Name, rel, next, prev)
		}
		next = align(rel+size, f.Alignment)
		t.Offset = f.DataOffset + rel
		t.Data = b[t.Offset : t.Offset+size : t.Offset+size]
	}
	return f, nil
}

func quoted(name string) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf(" (%q)", name)
}

// tensorInfo reads one tensor description; its Offset is relative to the
// data section.
func (r *reader) tensorInfo(alignment uint64) (TensorInfo, error) {
	var ti TensorInfo
	n, err := r.u64()
	if err != nil {
		return ti, fmt.Errorf("name: %w", err)
	}
	if n > MaxNameBytes {
		return ti, fmt.Errorf("name of %d bytes (at most %d)", n, MaxNameBytes)
	}
	nb, err := r.take(n)
	if err != nil {
		return ti, fmt.Errorf("name: %w", err)
	}
	ti.Name = string(nb)
	nd, err := r.u32()
	if err != nil {
		return ti, fmt.Errorf("dimension count: %w", err)
	}
	if nd == 0 || nd > MaxDims {
		return ti, fmt.Errorf("%d dimensions (want 1 to %d)", nd, MaxDims)
	}
	elems := uint64(1)
	for range nd {
		d, err := r.u64()
		if err != nil {
			return ti, fmt.Errorf("dimensions: %w", err)
		}
		if d == 0 {
			return ti, fmt.Errorf("dimension %d of %d is zero", len(ti.Dims), nd)
		}
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64/8 {
			return ti, fmt.Errorf("dimensions %v: too many elements", append(ti.Dims, d))
		}
		elems = lo
		ti.Dims = append(ti.Dims, d)
	}
	t, err := r.u32()
	if err != nil {
		return ti, fmt.Errorf("type: %w", err)
	}
	ti.Type = Type(t)
	if !ti.Type.Known() {
		return ti, fmt.Errorf("unknown ggml type %d", t)
	}
	if bs := uint64(ti.Type.BlockSize()); ti.Dims[0]%bs != 0 {
		return ti, fmt.Errorf("type %s needs rows of a multiple of %d elements, got %d", ti.Type, bs, ti.Dims[0])
	}
	if ti.Offset, err = r.u64(); err != nil {
		return ti, fmt.Errorf("offset: %w", err)
	}
	if ti.Offset%alignment != 0 {
		return ti, fmt.Errorf("offset %d is not a multiple of the alignment %d", ti.Offset, alignment)
	}
	return ti, nil
}

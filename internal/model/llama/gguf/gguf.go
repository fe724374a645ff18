// Package gguf writes and reads the header of GGUF files (version 3), the
// model file format of ggml and llama.cpp: a header of typed metadata
// key/values and tensor descriptions, then the tensor data, each tensor at
// an offset aligned to general.alignment (32 bytes by default).
//
// It is the minimal subset pdserve needs to hand its checkpoints to
// llama.cpp for comparisons (see llama.ExportGGUF): scalar, string and array
// metadata, and F32, F16 and BF16 tensors. The format is described in
// ggml's docs/gguf.md.
//
// # Concurrency and ownership
//
// Functions hold no state; Write reads the tensors' data while it runs and
// keeps nothing.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Magic is "GGUF" read as a little-endian uint32.
const Magic = 0x46554747

// Version is the format version Write produces.
const Version = 3

// Alignment is the default (and Write's) data alignment in bytes.
const Alignment = 32

// Type is a ggml tensor element type (enum ggml_type).
type Type uint32

// Tensor element types.
const (
	F32  Type = 0
	F16  Type = 1
	BF16 Type = 30
)

// Size is the size of one element in bytes.
func (t Type) Size() int {
	if t == F32 {
		return 4
	}
	return 2
}

// Metadata value types (enum gguf_type).
const (
	typeUint8   = 0
	typeInt8    = 1
	typeUint16  = 2
	typeInt16   = 3
	typeUint32  = 4
	typeInt32   = 5
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
	typeUint64  = 10
	typeInt64   = 11
	typeFloat64 = 12
)

// KV is one metadata entry. Value is one of uint32, int32, uint64, float32,
// bool, string, []string, []float32 or []int32.
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor. Dims are in ggml order, innermost first: a PyTorch
// [rows, cols] matrix is Dims {cols, rows}. Data holds the elements,
// little-endian, innermost dimension contiguous.
type Tensor struct {
	Name string
	Type Type
	Dims []uint64
	Data []byte
}

func (t *Tensor) elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Write writes a GGUF file: the metadata in order, the tensor infos, and the
// tensors' data aligned to Alignment. It checks that each tensor's data
// matches its type and dimensions.
func Write(w io.Writer, kvs []KV, tensors []Tensor) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	e := &encoder{w: bw}
	e.u32(Magic)
	e.u32(Version)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		if err := e.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: %s: %w", kv.Key, err)
		}
	}
	var off uint64
	for i := range tensors {
		t := &tensors[i]
		if uint64(len(t.Data)) != t.elements()*uint64(t.Type.Size()) {
			return fmt.Errorf("gguf: tensor %s: %d bytes for %v elements of type %d", t.Name, len(t.Data), t.Dims, t.Type)
		}
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off = align(off + uint64(len(t.Data)))
	}
	e.pad()
	for i := range tensors {
		e.write(tensors[i].Data)
		e.pad()
	}
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

func align(n uint64) uint64 { return (n + Alignment - 1) / Alignment * Alignment }

type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (e *encoder) write(b []byte) {
	if e.err != nil {
		return
	}
	var n int
	n, e.err = e.w.Write(b)
	e.n += uint64(n)
}

func (e *encoder) u32(v uint32) { e.write(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *encoder) u64(v uint64) { e.write(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.write([]byte(s)) }
func (e *encoder) pad()         { e.write(make([]byte, align(e.n)-e.n)) }

func (e *encoder) value(v any) error {
	switch v := v.(type) {
	case uint32:
		e.u32(typeUint32)
		e.u32(v)
	case int32:
		e.u32(typeInt32)
		e.u32(uint32(v))
	case uint64:
		e.u32(typeUint64)
		e.u64(v)
	case float32:
		e.u32(typeFloat32)
		e.u32(math.Float32bits(v))
	case bool:
		e.u32(typeBool)
		if v {
			e.write([]byte{1})
		} else {
			e.write([]byte{0})
		}
	case string:
		e.u32(typeString)
		e.str(v)
	case []string:
		e.u32(typeArray)
		e.u32(typeString)
		e.u64(uint64(len(v)))
		for _, s := range v {
			e.str(s)
		}
	case []float32:
		e.u32(typeArray)
		e.u32(typeFloat32)
		e.u64(uint64(len(v)))
		for _, f := range v {
			e.u32(math.Float32bits(f))
		}
	case []int32:
		e.u32(typeArray)
		e.u32(typeInt32)
		e.u64(uint64(len(v)))
		for _, i := range v {
			e.u32(uint32(i))
		}
	default:
		return fmt.Errorf("unsupported metadata value %T", v)
	}
	return nil
}

// TensorInfo describes a tensor in a file read by ReadHeader.
type TensorInfo struct {
	Name   string
	Type   Type
	Dims   []uint64
	Offset uint64 // from the start of the file
}

// Header is what ReadHeader returns: the metadata (arrays as []any of their
// elements' Go values) and the tensors.
type Header struct {
	Version uint32
	KV      map[string]any
	Keys    []string // in file order
	Tensors []TensorInfo
}

// ReadHeader parses a GGUF file's header (any version ≥ 2, little-endian).
func ReadHeader(r io.Reader) (*Header, error) {
	d := &decoder{r: bufio.NewReader(r)}
	if m := d.u32(); d.err == nil && m != Magic {
		return nil, fmt.Errorf("gguf: bad magic %#x", m)
	}
	h := &Header{Version: d.u32(), KV: map[string]any{}}
	nt, nkv := d.u64(), d.u64()
	if d.err != nil {
		return nil, d.err
	}
	if h.Version < 2 || nkv > 1<<20 || nt > 1<<20 {
		return nil, fmt.Errorf("gguf: unsupported version %d or counts %d, %d", h.Version, nkv, nt)
	}
	for range nkv {
		k := d.str()
		v := d.value(d.u32())
		if d.err != nil {
			return nil, d.err
		}
		h.KV[k] = v
		h.Keys = append(h.Keys, k)
	}
	alignment := uint64(Alignment)
	if a, ok := h.KV["general.alignment"].(uint32); ok && a > 0 {
		alignment = uint64(a)
	}
	for range nt {
		ti := TensorInfo{Name: d.str()}
		nd := d.u32()
		if nd > 8 {
			return nil, fmt.Errorf("gguf: tensor %q has %d dimensions", ti.Name, nd)
		}
		for range nd {
			ti.Dims = append(ti.Dims, d.u64())
		}
		ti.Type = Type(d.u32())
		ti.Offset = d.u64()
		h.Tensors = append(h.Tensors, ti)
	}
	if d.err != nil {
		return nil, d.err
	}
	start := (d.n + alignment - 1) / alignment * alignment
	for i := range h.Tensors {
		h.Tensors[i].Offset += start
	}
	return h, nil
}

type decoder struct {
	r   *bufio.Reader
	n   uint64
	err error
}

func (d *decoder) read(n int) []byte {
	if d.err != nil {
		return make([]byte, n)
	}
	b := make([]byte, n)
	_, d.err = io.ReadFull(d.r, b)
	d.n += uint64(n)
	return b
}

func (d *decoder) u32() uint32 { return binary.LittleEndian.Uint32(d.read(4)) }
func (d *decoder) u64() uint64 { return binary.LittleEndian.Uint64(d.read(8)) }

func (d *decoder) str() string {
	n := d.u64()
	if n > 1<<24 {
		d.err = errors.Join(d.err, fmt.Errorf("gguf: string of %d bytes", n))
		return ""
	}
	return string(d.read(int(n)))
}

func (d *decoder) value(t uint32) any {
	switch t {
	case typeUint8, typeInt8, typeBool:
		b := d.read(1)[0]
		switch t {
		case typeBool:
			return b != 0
		case typeInt8:
			return int8(b)
		}
		return b
	case typeUint16:
		return binary.LittleEndian.Uint16(d.read(2))
	case typeInt16:
		return int16(binary.LittleEndian.Uint16(d.read(2)))
	case typeUint32:
		return d.u32()
	case typeInt32:
		return int32(d.u32())
	case typeFloat32:
		return math.Float32frombits(d.u32())
	case typeUint64:
		return d.u64()
	case typeInt64:
		return int64(d.u64())
	case typeFloat64:
		return math.Float64frombits(d.u64())
	case typeString:
		return d.str()
	case typeArray:
		et, n := d.u32(), d.u64()
		if n > 1<<24 || et == typeArray {
			d.err = errors.Join(d.err, fmt.Errorf("gguf: array of %d elements of type %d", n, et))
			return nil
		}
		out := make([]any, 0, n)
		for range n {
			if d.err != nil {
				break
			}
			out = append(out, d.value(et))
		}
		return out
	}
	d.err = errors.Join(d.err, fmt.Errorf("gguf: unknown value type %d", t))
	return nil
}

// Package gguf reads and writes GGUF files (version 3; version 2 is read
// too), the model file format of ggml and llama.cpp: a header of typed
// metadata key/values and tensor descriptions, then the tensor data, each
// tensor at an offset aligned to general.alignment (32 bytes by default).
// The format is described in ggml's docs/gguf.md; element types and their
// block layouts are ggml's enum ggml_type (ggml.h) and type_traits
// (ggml.c).
//
// [Parse] reads a whole file held in memory (usually memory-mapped by the
// caller) and validates everything a reader relies on: magic and version,
// every count, string and array length against the bytes that remain (so a
// claim is never allocated before the bytes behind it are known to exist),
// unknown metadata or tensor types, tensor shapes, and every tensor's data
// range against the file. Errors name the field. [Write] writes a file.
//
// # Concurrency and ownership
//
// Functions hold no state. A File's tensors' Data are views into the bytes
// given to Parse; metadata values are copies.
package gguf

import (
	"bufio"
	"encoding/binary"
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

// Tensor element types (ggml.h). Quantized types store blocks of
// BlockSize elements in BlockBytes bytes; the layouts of the ones pdserve
// computes with are in package llama (quant.go).
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// typeTraits are ggml's type_traits: name, elements per block, bytes per
// block.
var typeTraits = map[Type]struct {
	name         string
	block, bytes int
}{
	F32: {"F32", 1, 4}, F16: {"F16", 1, 2}, Q4_0: {"Q4_0", 32, 18}, Q4_1: {"Q4_1", 32, 20},
	Q5_0: {"Q5_0", 32, 22}, Q5_1: {"Q5_1", 32, 24}, Q8_0: {"Q8_0", 32, 34}, Q8_1: {"Q8_1", 32, 36},
	Q2_K: {"Q2_K", 256, 84}, Q3_K: {"Q3_K", 256, 110}, Q4_K: {"Q4_K", 256, 144}, Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210}, Q8_K: {"Q8_K", 256, 292}, IQ2_XXS: {"IQ2_XXS", 256, 66}, IQ2_XS: {"IQ2_XS", 256, 74},
	IQ3_XXS: {"IQ3_XXS", 256, 98}, IQ1_S: {"IQ1_S", 256, 50}, IQ4_NL: {"IQ4_NL", 32, 18}, IQ3_S: {"IQ3_S", 256, 110},
	IQ2_S: {"IQ2_S", 256, 82}, IQ4_XS: {"IQ4_XS", 256, 136}, I8: {"I8", 1, 1}, I16: {"I16", 1, 2},
	I32: {"I32", 1, 4}, I64: {"I64", 1, 8}, F64: {"F64", 1, 8}, IQ1_M: {"IQ1_M", 256, 56},
	BF16: {"BF16", 1, 2}, TQ1_0: {"TQ1_0", 256, 54}, TQ2_0: {"TQ2_0", 256, 66}, MXFP4: {"MXFP4", 32, 17},
}

// Known reports whether t is a ggml type this package knows the layout of.
func (t Type) Known() bool { _, ok := typeTraits[t]; return ok }

// String is ggml's name of the type ("Q8_0"), or "type(N)".
func (t Type) String() string {
	if tr, ok := typeTraits[t]; ok {
		return tr.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements in one block (1 for F32, F16, BF16;
// 32 for Q8_0 and Q4_0; 256 for the K-quants), 0 for an unknown type.
func (t Type) BlockSize() int { return typeTraits[t].block }

// BlockBytes is the size of one block in bytes, 0 for an unknown type.
func (t Type) BlockBytes() int { return typeTraits[t].bytes }

// RowBytes is the size of n elements (a multiple of BlockSize) in bytes.
func (t Type) RowBytes(n uint64) uint64 {
	tr := typeTraits[t]
	if tr.block == 0 {
		return 0
	}
	return n / uint64(tr.block) * uint64(tr.bytes)
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

// KV is one metadata entry. Write takes a Value of uint32, int32, uint64,
// float32, bool, string, []string, []float32 or []int32. Parse gives
// uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32,
// float64, bool or string, and arrays as a slice of those ([]string,
// []float32, []int32, …).
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor to write. Dims are in ggml order, innermost first: a
// PyTorch [rows, cols] matrix is Dims {cols, rows}. Data holds the
// elements (or blocks), little-endian, innermost dimension contiguous.
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
// tensors' data aligned to Alignment. It checks that each tensor's type is
// known, that its innermost dimension is a multiple of the type's block
// size, and that its data matches its type and dimensions.
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
		if !t.Type.Known() || len(t.Dims) == 0 || t.Dims[0]%uint64(t.Type.BlockSize()) != 0 {
			return fmt.Errorf("gguf: tensor %s: type %s cannot hold dimensions %v", t.Name, t.Type, t.Dims)
		}
		if want := t.Type.RowBytes(t.elements()); uint64(len(t.Data)) != want {
			return fmt.Errorf("gguf: tensor %s: %d bytes for %v elements of type %s (want %d)", t.Name, len(t.Data), t.Dims, t.Type, want)
		}
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off = align(off+uint64(len(t.Data)), Alignment)
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

func align(n, a uint64) uint64 { return (n + a - 1) / a * a }

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
func (e *encoder) pad()         { e.write(make([]byte, align(e.n, Alignment)-e.n)) }

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

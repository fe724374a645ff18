package llama

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
)

// The safetensors format (https://github.com/huggingface/safetensors, "Format"
// in its README): an 8-byte little-endian unsigned header length N, then N
// bytes of UTF-8 JSON mapping each tensor name to
// {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]} (plus
// an optional "__metadata__" object of strings), then the data. Offsets are
// relative to the first byte after the header; tensors are row-major,
// little-endian.

// maxHeaderBytes bounds the JSON header we accept (the reference
// implementation's limit is 100 MB).
const maxHeaderBytes = 100 << 20

// stEntry is one tensor of a safetensors header.
type stEntry struct {
	name       string
	dtype      string // as written, e.g. "BF16"
	shape      []int
	begin, end int64 // byte offsets into the data section
}

// stFile is one opened safetensors file: its bytes (mapped) and its header.
type stFile struct {
	path    string
	data    []byte // the data section (after the header)
	header  []byte // the JSON header, for the digest
	size    int64  // file size in bytes
	entries map[string]*stEntry
	release func() error
}

// openSafetensors maps path and parses its header. It returns an error for a
// file shorter than its header says, a header that is not the JSON object of
// the format, and a tensor whose byte range is inverted, extends past the end
// of the file (a truncated file) or does not match its dtype and shape.
func openSafetensors(path string) (_ *stFile, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if size < 8 {
		return nil, fmt.Errorf("%s: %d bytes is too short for a safetensors file (truncated?)", path, size)
	}
	buf, release, err := mapFile(f, size)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = release()
		}
	}()
	n := binary.LittleEndian.Uint64(buf[:8])
	if n > maxHeaderBytes || n > uint64(size-8) {
		return nil, fmt.Errorf("%s: header length %d does not fit in the file's %d bytes (truncated or not safetensors?)", path, n, size)
	}
	header := buf[8 : 8+n]
	data := buf[8+n:]
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: bad safetensors header: %w", path, err)
	}
	st := &stFile{path: path, data: data, header: header, size: size, entries: make(map[string]*stEntry, len(raw)), release: release}
	for name, msg := range raw {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %q: bad header entry: %w", path, name, err)
		}
		if len(e.Offsets) != 2 {
			return nil, fmt.Errorf("%s: tensor %q: data_offsets has %d values, want 2", path, name, len(e.Offsets))
		}
		begin, end := e.Offsets[0], e.Offsets[1]
		if begin < 0 || end < begin {
			return nil, fmt.Errorf("%s: tensor %q: bad data_offsets [%d, %d]", path, name, begin, end)
		}
		if end > int64(len(data)) {
			return nil, fmt.Errorf("%s: tensor %q: data ends at byte %d of the data section, but the file holds only %d data bytes (truncated file?)",
				path, name, end, len(data))
		}
		shape := make([]int, len(e.Shape))
		elems := int64(1)
		for i, d := range e.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, fmt.Errorf("%s: tensor %q: bad dimension %d in shape %v", path, name, d, e.Shape)
			}
			shape[i] = int(d)
			// Checked before multiplying: the product must not wrap around
			// (a shape of 2^64 elements would otherwise claim 0 bytes).
			if d != 0 && elems > math.MaxInt64/8/d {
				return nil, fmt.Errorf("%s: tensor %q: shape %v is too large", path, name, e.Shape)
			}
			elems *= d
		}
		if dt, err := parseDType(e.DType); err == nil {
			if want := elems * int64(dt.Size()); end-begin != want {
				return nil, fmt.Errorf("%s: tensor %q: %s %v needs %d bytes, but its data_offsets [%d, %d] hold %d",
					path, name, e.DType, e.Shape, want, begin, end, end-begin)
			}
		}
		st.entries[name] = &stEntry{name: name, dtype: e.DType, shape: shape, begin: begin, end: end}
	}
	return st, nil
}

// close unmaps the file; tensors read from it must not be used afterwards.
func (f *stFile) close() error { return f.release() }

// names lists the file's tensors, sorted.
func (f *stFile) names() []string {
	out := make([]string, 0, len(f.entries))
	for n := range f.entries {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// SafetensorsTensor is one tensor to write with WriteSafetensors.
type SafetensorsTensor struct {
	Name  string
	DType DType
	// Shape is the row-major shape, e.g. [out, in] for a linear layer.
	Shape []int
	// Data holds the elements, little-endian: product(Shape) × DType.Size()
	// bytes. See F32Bytes, BF16Bytes and F16Bytes.
	Data []byte
}

// WriteSafetensors writes tensors in the safetensors format (see the comment
// at the top of this file), in the given order, with optional string
// metadata. The header is padded with spaces so that the data section starts
// at a multiple of 8 bytes, which keeps every tensor of an 8-byte-aligned
// layout aligned for its element type. It returns an error for a duplicate
// or empty name, an unknown dtype, or data whose length does not match the
// shape.
func WriteSafetensors(w io.Writer, tensors []SafetensorsTensor, metadata map[string]string) error {
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			hdr.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata)
		if err != nil {
			return err
		}
		sep()
		hdr.WriteString(`"__metadata__":`)
		hdr.Write(m)
	}
	seen := make(map[string]bool, len(tensors))
	var off int64
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" || seen[t.Name] {
			return fmt.Errorf("safetensors: bad or duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		if t.DType.Size() == 0 {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %s", t.Name, safetensorsName(t.DType))
		}
		elems := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			elems *= int64(d)
		}
		if want := elems * int64(t.DType.Size()); int64(len(t.Data)) != want {
			return fmt.Errorf("safetensors: tensor %q: %s %v needs %d bytes, got %d", t.Name, safetensorsName(t.DType), t.Shape, want, len(t.Data))
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return err
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		sh, err := json.Marshal(shape)
		if err != nil {
			return err
		}
		sep()
		hdr.Write(name)
		hdr.WriteString(`:{"dtype":"` + safetensorsName(t.DType) + `","shape":`)
		hdr.Write(sh)
		hdr.WriteString(`,"data_offsets":[` + strconv.FormatInt(off, 10) + `,` + strconv.FormatInt(off+int64(len(t.Data)), 10) + `]}`)
		off += int64(len(t.Data))
	}
	hdr.WriteByte('}')
	for (8+hdr.Len())%8 != 0 {
		hdr.WriteByte(' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	if _, err := bw.Write(n[:]); err != nil {
		return err
	}
	if _, err := bw.Write(hdr.Bytes()); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := bw.Write(t.Data); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// WriteSafetensorsFile writes tensors to path (see WriteSafetensors),
// creating or truncating it.
func WriteSafetensorsFile(path string, tensors []SafetensorsTensor, metadata map[string]string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return WriteSafetensors(f, tensors, metadata)
}

// F32Bytes encodes v as little-endian binary32 values.
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// BF16Bytes rounds v to bfloat16 (see F32ToBF16) and encodes it little-endian.
func BF16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(x))
	}
	return b
}

// F16Bytes rounds v to binary16 (see F32ToF16) and encodes it little-endian.
func F16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(x))
	}
	return b
}

// errNotFound marks a tensor missing from the checkpoint.
var errNotFound = errors.New("not found")

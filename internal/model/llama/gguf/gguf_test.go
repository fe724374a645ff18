package gguf

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sample is a small valid file: metadata of every type Write supports, an
// F32 matrix, a BF16 vector and a Q8_0 row.
func sample(t testing.TB) ([]KV, []Tensor, []byte) {
	kvs := []KV{
		{"general.architecture", "llama"}, {"a.u32", uint32(7)}, {"a.i32", int32(-3)}, {"a.u64", uint64(1 << 40)},
		{"a.f32", float32(1.5)}, {"a.bool", true}, {"a.strs", []string{"x", "yz"}}, {"a.f32s", []float32{1, -2}},
		{"a.i32s", []int32{4, -5}},
	}
	f32 := make([]byte, 4*3*2)
	binary.LittleEndian.PutUint32(f32[4:], 0x3f800000)
	bf := []byte{1, 2, 3, 4, 5, 6}
	q8 := make([]byte, 34)
	for i := range q8 {
		q8[i] = byte(i)
	}
	tensors := []Tensor{{Name: "m", Type: F32, Dims: []uint64{3, 2}, Data: f32}, {Name: "v", Type: BF16, Dims: []uint64{3}, Data: bf},
		{Name: "q", Type: Q8_0, Dims: []uint64{32, 1}, Data: q8}}
	var buf bytes.Buffer
	if err := Write(&buf, kvs, tensors); err != nil {
		t.Fatal(err)
	}
	return kvs, tensors, buf.Bytes()
}

// TestRoundTrip writes metadata of every supported type and three tensors,
// and parses them back.
func TestRoundTrip(t *testing.T) {
	kvs, tensors, raw := sample(t)
	f, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := []KV{
		{"general.architecture", "llama"}, {"a.u32", uint32(7)}, {"a.i32", int32(-3)}, {"a.u64", uint64(1 << 40)},
		{"a.f32", float32(1.5)}, {"a.bool", true}, {"a.strs", []string{"x", "yz"}}, {"a.f32s", []float32{1, -2}},
		{"a.i32s", []int32{4, -5}},
	}
	if d := cmp.Diff(want, f.KV); d != "" || f.Version != 3 || len(f.KV) != len(kvs) {
		t.Fatalf("metadata (-want +got):\n%s", d)
	}
	for i, ti := range f.Tensors {
		if ti.Offset%Alignment != 0 || ti.Name != tensors[i].Name || ti.Type != tensors[i].Type || !cmp.Equal(ti.Dims, tensors[i].Dims) {
			t.Fatalf("tensor %d: %+v", i, ti)
		}
		if !bytes.Equal(ti.Data, tensors[i].Data) || !bytes.Equal(raw[ti.Offset:ti.Offset+uint64(len(ti.Data))], ti.Data) {
			t.Fatalf("tensor %s data %v, want %v", ti.Name, ti.Data, tensors[i].Data)
		}
	}
	if s, ok, err := f.String("general.architecture"); s != "llama" || !ok || err != nil {
		t.Errorf("String = %q %v %v", s, ok, err)
	}
	if u, ok, err := f.Uint("a.u32"); u != 7 || !ok || err != nil {
		t.Errorf("Uint = %d %v %v", u, ok, err)
	}
	if _, _, err := f.Uint("a.i32"); err == nil || !strings.Contains(err.Error(), "a.i32 is -3") {
		t.Errorf("Uint of a negative value: %v", err)
	}
	if _, _, err := f.String("a.u32"); err == nil || !strings.Contains(err.Error(), "a.u32 is an integer, want a string") {
		t.Errorf("String of an integer: %v", err)
	}
	if v, ok, err := f.Float("a.u32"); v != 7 || !ok || err != nil {
		t.Errorf("Float of an integer = %v %v %v", v, ok, err)
	}
	if _, ok, _ := f.Bool("missing"); ok {
		t.Error("a missing key was found")
	}
	for _, bad := range []Tensor{{Name: "bad", Type: F32, Dims: []uint64{2}, Data: []byte{1}},
		{Name: "q", Type: Q8_0, Dims: []uint64{16}, Data: make([]byte, 17)}, {Name: "u", Type: 99, Dims: []uint64{1}, Data: []byte{0}}} {
		if err := Write(&bytes.Buffer{}, nil, []Tensor{bad}); err == nil {
			t.Errorf("tensor %+v was written", bad)
		}
	}
}

// le builds little-endian headers by hand.
type le struct{ bytes.Buffer }

func (b *le) u32(v uint32) *le { _ = binary.Write(b, binary.LittleEndian, v); return b }
func (b *le) u64(v uint64) *le { _ = binary.Write(b, binary.LittleEndian, v); return b }
func (b *le) str(s string) *le { b.u64(uint64(len(s))); b.WriteString(s); return b }

// header starts a v3 file with nt tensors and nkv metadata entries.
func header(nt, nkv uint64) *le {
	b := &le{}
	b.u32(Magic).u32(3).u64(nt).u64(nkv)
	return b
}

// TestParseRejects checks that every kind of malformed file is refused with
// an error naming what is wrong.
func TestParseRejects(t *testing.T) {
	_, _, good := sample(t)
	tensor := func(name string, dims []uint64, typ uint32, off uint64) *le {
		b := header(1, 0)
		b.str(name).u32(uint32(len(dims)))
		for _, d := range dims {
			b.u64(d)
		}
		b.u32(typ).u64(off)
		for b.Len()%32 != 0 {
			b.WriteByte(0)
		}
		return b
	}
	withData := func(b *le, n int) []byte { return append(b.Bytes(), make([]byte, n)...) }
	type parseCase struct {
		name string
		data []byte
		want string
	}
	cases := []parseCase{
		{"empty", nil, "truncated: 0 bytes"},
		{"short", good[:20], "truncated: 20 bytes"},
		{"magic", append([]byte("GGML"), good[4:]...), `not a GGUF file: magic "GGML"`},
		{"version 1", header(0, 0).Bytes()[:4:4], "truncated"},
		{"version 1 full", append(append([]byte{}, good[:4]...), append([]byte{1, 0, 0, 0}, good[8:]...)...), "version 1"},
		{"version 9", append(append([]byte{}, good[:4]...), append([]byte{9, 0, 0, 0}, good[8:]...)...), "unsupported version 9"},
		{"big-endian", append(append([]byte{}, good[:4]...), append([]byte{0, 0, 0, 3}, good[8:]...)...), "big-endian"},
		{"huge kv count", header(0, 1<<60).Bytes(), "metadata count 1152921504606846976 does not fit"},
		{"huge tensor count", header(1<<40, 0).Bytes(), "tensor count 1099511627776 does not fit"},
		{"truncated key", append(header(0, 1).u64(100).Bytes(), make([]byte, 20)...), "metadata 0: key: string of 100 bytes"},
		{"unknown value type", header(0, 1).str("k").u32(77).Bytes(), "metadata k: unknown value type 77"},
		{"huge string", header(0, 1).str("k").u32(typeString).u64(1 << 50).Bytes(), "metadata k: string of 1125899906842624 bytes"},
		{"huge array", header(0, 1).str("k").u32(typeArray).u32(typeUint32).u64(1 << 40).Bytes(), "metadata k: array of 1099511627776 elements"},
		{"huge string array", header(0, 1).str("k").u32(typeArray).u32(typeString).u64(1 << 40).Bytes(), "array of 1099511627776 elements"},
		{"nested array", header(0, 1).str("k").u32(typeArray).u32(typeArray).u64(1).Bytes(), "nested arrays"},
		{"truncated array", header(0, 1).str("k").u32(typeArray).u32(typeString).u64(2).str("a").u64(5).Bytes(), "element 1"},
		{"bad bool", header(0, 1).str("k").u32(typeBool).Bytes(), "truncated"},
		{"duplicate key", header(0, 2).str("k").u32(typeUint32).u32(1).str("k").u32(typeUint32).u32(2).Bytes(), `key "k" appears twice`},
		{"alignment type", header(0, 1).str("general.alignment").u32(typeUint64).u64(32).Bytes(), "general.alignment 32: want a uint32 power of two"},
		{"alignment value", header(0, 1).str("general.alignment").u32(typeUint32).u32(48).Bytes(), "general.alignment 48"},
		{"no dims", withData(tensor("t", nil, 0, 0), 64), `tensor 0 ("t"): 0 dimensions`},
		{"five dims", withData(tensor("t", []uint64{1, 1, 1, 1, 1}, 0, 0), 64), "5 dimensions"},
		{"zero dim", withData(tensor("t", []uint64{4, 0}, 0, 0), 64), "dimension 1 of 2 is zero"},
		{"zero first dim", withData(tensor("t", []uint64{0, 4}, 0, 0), 64), "dimension 0 of 2 is zero"},
		{"overflow", withData(tensor("t", []uint64{1 << 32, 1 << 32}, 0, 0), 64), "too many elements"},
		{"unknown type", withData(tensor("t", []uint64{4}, 5, 0), 64), "unknown ggml type 5"},
		{"partial block", withData(tensor("t", []uint64{48, 2}, uint32(Q8_0), 0), 256), "Q8_0 needs rows of a multiple of 32 elements, got 48"},
		{"misaligned", withData(tensor("t", []uint64{4}, 0, 4), 64), "offset 4 is not a multiple of the alignment 32"},
		{"past the end", withData(tensor("t", []uint64{32, 4}, uint32(Q4_0), 0), 71), `tensor "t": data [0, 72) of the data section lies past its end (71 bytes)`},
		{"offset past the end", withData(tensor("t", []uint64{4}, 0, 1<<40), 64), "lies past its end"},
		{"long name", withData(tensor(strings.Repeat("n", 2000), []uint64{4}, 0, 0), 64), "name of 2000 bytes"},
		{"no data section", tensor("t", []uint64{4}, 0, 0).Bytes()[:60], "the data section would start at byte 64 of 60"},
	}
	two := header(2, 0)
	for _, n := range []string{"a", "a"} {
		two.str(n).u32(1).u64(8).u32(0).u64(0)
	}
	cases = append(cases, parseCase{"duplicate tensor", withData(two, 64), `tensor "a" appears twice`})
	ov := header(2, 0)
	ov.str("a").u32(1).u64(16).u32(0).u64(0)
	ov.str("b").u32(1).u64(8).u32(0).u64(32)
	cases = append(cases, parseCase{"overlap", withData(ov, 128), `tensor "b" has offset 32 in the data section, expected 64`})
	// A gap: a's type says 8 bytes where the file gives it 32 (a type
	// changed in place to a smaller one).
	gap := header(2, 0)
	gap.str("a").u32(1).u64(2).u32(0).u64(0)
	gap.str("b").u32(1).u64(8).u32(0).u64(64)
	cases = append(cases, parseCase{"gap", withData(gap, 128), `tensor "b" has offset 64 in the data section, expected 32`})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse(c.data)
			if err == nil {
				t.Fatalf("parsed: %+v", f)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
	// Every truncation of a valid file short of its last tensor's data is
	// refused, without a panic (only the final padding may go).
	pf, err := Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	last := pf.Tensors[len(pf.Tensors)-1]
	for n := range int(last.Offset) + len(last.Data) {
		if _, err := Parse(good[:n]); err == nil {
			t.Fatalf("a file truncated to %d of %d bytes parsed", n, len(good))
		}
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts is
// consistent: every tensor's data lies inside the input and matches its
// type and dimensions. The seed corpus (testdata/fuzz/FuzzParse) holds
// valid files and damaged ones.
func FuzzParse(f *testing.F) {
	_, _, good := sample(f)
	f.Add(good)
	f.Add(good[:100])
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := Parse(data)
		if err != nil {
			return
		}
		for _, ti := range pf.Tensors {
			if ti.Offset+uint64(len(ti.Data)) > uint64(len(data)) || uint64(len(ti.Data)) != ti.Type.RowBytes(ti.Elements()) {
				t.Fatalf("tensor %q: %d bytes at %d of %d", ti.Name, len(ti.Data), ti.Offset, len(data))
			}
			if ti.Offset%pf.Alignment != 0 {
				t.Fatalf("tensor %q misaligned", ti.Name)
			}
		}
	})
}

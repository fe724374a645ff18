package gguf

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRoundTrip writes metadata of every supported type and two tensors,
// and reads the header back.
func TestRoundTrip(t *testing.T) {
	kvs := []KV{
		{"general.architecture", "llama"}, {"a.u32", uint32(7)}, {"a.i32", int32(-3)}, {"a.u64", uint64(1 << 40)},
		{"a.f32", float32(1.5)}, {"a.bool", true}, {"a.strs", []string{"x", "yz"}}, {"a.f32s", []float32{1, -2}},
		{"a.i32s", []int32{4, -5}},
	}
	f32 := make([]byte, 4*3*2)
	binary.LittleEndian.PutUint32(f32[4:], 0x3f800000)
	bf := []byte{1, 2, 3, 4, 5, 6}
	tensors := []Tensor{{Name: "m", Type: F32, Dims: []uint64{3, 2}, Data: f32}, {Name: "v", Type: BF16, Dims: []uint64{3}, Data: bf}}
	var buf bytes.Buffer
	if err := Write(&buf, kvs, tensors); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"general.architecture": "llama", "a.u32": uint32(7), "a.i32": int32(-3), "a.u64": uint64(1 << 40),
		"a.f32": float32(1.5), "a.bool": true, "a.strs": []any{"x", "yz"}, "a.f32s": []any{float32(1), float32(-2)},
		"a.i32s": []any{int32(4), int32(-5)},
	}
	if d := cmp.Diff(want, h.KV); d != "" || h.Version != 3 || len(h.Keys) != len(kvs) {
		t.Fatalf("metadata (-want +got):\n%s", d)
	}
	for i, ti := range h.Tensors {
		if ti.Offset%Alignment != 0 || ti.Name != tensors[i].Name || ti.Type != tensors[i].Type || !cmp.Equal(ti.Dims, tensors[i].Dims) {
			t.Fatalf("tensor %d: %+v", i, ti)
		}
		if got := buf.Bytes()[ti.Offset : ti.Offset+uint64(len(tensors[i].Data))]; !bytes.Equal(got, tensors[i].Data) {
			t.Fatalf("tensor %s data %v, want %v", ti.Name, got, tensors[i].Data)
		}
	}
	if err := Write(&buf, nil, []Tensor{{Name: "bad", Type: F32, Dims: []uint64{2}, Data: []byte{1}}}); err == nil {
		t.Fatal("a tensor with the wrong data size was written")
	}
}

package llama

import (
	"bytes"
	"encoding/binary"
	"math/big"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenSafetensors feeds arbitrary files to the safetensors loader. It
// must never panic or allocate by what a header claims; a file it accepts
// has every tensor's bytes inside its data section, matching dtype and
// shape.
func FuzzOpenSafetensors(f *testing.F) {
	var good bytes.Buffer
	if err := WriteSafetensors(&good, []SafetensorsTensor{
		{Name: "a", DType: F32, Shape: []int{2, 2}, Data: F32Bytes([]float32{1, 2, 3, 4})},
		{Name: "b", DType: BF16, Shape: []int{3}, Data: BF16Bytes([]float32{1, 2, 3})},
	}, map[string]string{"format": "pt"}); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	hdr := func(json string) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, uint64(len(json))), json...)
	}
	f.Add(hdr(`{"x":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,0]}}`))
	f.Add(hdr(`{"x":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,16]}}`))
	f.Add(hdr(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}`))
	f.Add(hdr(`{"x":{"dtype":"F32","shape":[536870912,1073741824,32],"data_offsets":[0,0]}}`)) // 2^64 elements: 0 mod 2^64
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	path := filepath.Join(f.TempDir(), "model.safetensors")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := openSafetensors(path)
		if err != nil {
			return
		}
		defer st.close()
		for _, name := range st.names() {
			e := st.entries[name]
			if e.begin < 0 || e.end < e.begin || e.end > int64(len(st.data)) {
				t.Fatalf("tensor %q: accepted range [%d, %d] of %d data bytes", name, e.begin, e.end, len(st.data))
			}
			if dt, err := parseDType(e.dtype); err == nil {
				n := new(big.Int).SetInt64(int64(dt.Size()))
				for _, d := range e.shape {
					n.Mul(n, big.NewInt(int64(d)))
				}
				if n.Cmp(big.NewInt(e.end-e.begin)) != 0 {
					t.Fatalf("tensor %q: %s %v accepted for %d bytes, needs %s", name, e.dtype, e.shape, e.end-e.begin, n)
				}
			}
		}
	})
}

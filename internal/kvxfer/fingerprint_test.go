package kvxfer

import "testing"

func TestFingerprintMismatch(t *testing.T) {
	a := Fingerprint{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageSize: 16}
	if a.Mismatch(a) != "" {
		t.Fatal("equal fingerprints mismatch")
	}
	b := a
	b.PageSize, b.DType = 32, "f32"
	if got := a.Mismatch(b); got != "dtype bf16 vs f32, page_size 16 vs 32" {
		t.Fatalf("mismatch %q", got)
	}
}

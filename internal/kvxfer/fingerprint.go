package kvxfer

import "fmt"

// Fingerprint is what two workers compare in the KV channel handshake (and
// the router before it pairs them): two workers may exchange KV only if the
// KV one computes is laid out and valued exactly as the other would compute
// it. Every field is part of that promise.
type Fingerprint struct {
	Model    string // the served model's name
	Digest   string // identifies the weights (model.Info.Digest)
	Layers   int
	KVHeads  int
	HeadDim  int
	DType    string // the KV cache's element type, e.g. "bf16"
	PageSize int    // tokens per KV page
}

// Mismatch returns "" when f and o can exchange KV, or a message naming every
// field that differs, e.g. "page_size 16 vs 32".
func (f Fingerprint) Mismatch(o Fingerprint) string {
	var diffs []string
	add := func(name string, a, b any) {
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s %v vs %v", name, a, b))
		}
	}
	add("model", f.Model, o.Model)
	add("digest", f.Digest, o.Digest)
	add("layers", f.Layers, o.Layers)
	add("kv_heads", f.KVHeads, o.KVHeads)
	add("head_dim", f.HeadDim, o.HeadDim)
	add("dtype", f.DType, o.DType)
	add("page_size", f.PageSize, o.PageSize)
	if len(diffs) == 0 {
		return ""
	}
	s := diffs[0]
	for _, d := range diffs[1:] {
		s += ", " + d
	}
	return s
}

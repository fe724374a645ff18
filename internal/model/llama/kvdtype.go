package llama

import "github.com/pdserve/pdserve/internal/kvcache"

// DefaultKVDType is the KV cache element type `pdserve --kv-cache-dtype
// auto` (the default) gives a checkpoint model: F16, llama.cpp's default
// too (llama_context_default_params' type_k and type_v, llama-context.cpp).
// It halves F32's bytes per token (twice the sequences in a pool of the
// same size, half the bytes on the KV channel) and keeps 11 significant
// bits where BF16 keeps 8: on the eight stories260K references
// (llamatest.References: greedy continuations of up to 48 tokens that
// llama.cpp computed with an F32 KV cache) an F16 cache gives every token,
// a BF16 one diverges in four. BF16 is the cheaper one to widen in the
// attention kernels (F16 decodes ~0.9× as fast as F32 at batch 16 and 128
// tokens of context on Zen 4, docs/performance.md). Options.KVDType's zero
// value stays F32.
const DefaultKVDType = kvcache.F16

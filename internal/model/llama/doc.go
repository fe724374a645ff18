// Package llama runs Llama-architecture language models on the CPU: Llama 2
// and 3, SmolLM and SmolLM2, Qwen2 and Qwen2.5, Mistral (without a sliding
// window shorter than the context) and TinyLlama, from Hugging Face
// checkpoints (config.json + safetensors).
//
// # Overview
//
// [Load] reads a checkpoint directory into a [Model], which implements
// [model.Model]. The forward pass is transformers' modeling_llama.py:
// RMSNorm, rotary position embeddings in the rotate-half layout (with
// rope_theta and "linear" or "llama3" rope_scaling), grouped-query attention
// with optional q/k/v (and o) biases, a SwiGLU MLP, and a classifier tied to
// the token embedding or separate. Computation is float32; weights stay in
// their stored dtype (F32, F16 or BF16, memory-mapped) and are widened to
// float32 inside the matrix kernels, a tile of rows at a time.
//
// A Forward call runs a whole batch — prefill chunks (Pos plus several
// tokens) and decode steps (one token) together — as one matrix of T tokens:
// each linear layer is a [T, in]·[in, out] product that reads every weight
// row once per batch. Attention reads and writes the KV cache in the
// worker's pool pages (layout [layer][k|v][slot][kv_heads][head_dim], in the
// pool's dtype: F32 by default, BF16 or F16 by option). Logits are computed
// only for the tokens that are sampled.
//
// Every output element is a single dot product over its full reduction
// dimension, so results are bit-identical whatever the batch, chunking or
// thread count: PD disaggregated output equals colocated output.
//
// [WriteSafetensors] writes checkpoints (used by the llama2c converter and
// test helpers).
//
// # Concurrency
//
// A Model instance runs one Forward at a time (concurrent calls are
// serialised on a lock); Info and Tokenizer may be called from any
// goroutine. During a Forward the instance computes on a team of goroutines
// (Options.Threads, default GOMAXPROCS) that it starts at the beginning of
// the call and stops before returning, so an idle model holds no goroutines.
// [Model.Clone] makes another instance over the same weights for another
// worker; instances run concurrently.
//
// # Ownership
//
// Weights are memory-mapped read-only and shared by all clones of a Load;
// the last [Model.Close] unmaps them. Forward writes only the slots of the
// positions it is asked to write, and calls Pool.MarkWritten for each page
// it wrote. Forward does not retain the pool or the SeqInputs.
package llama

// Package sim is the simulated model: no weights, a byte tokenizer, KV bytes
// that are a deterministic function of (token, position, layer), and a next
// token that is a deterministic function of the KV bytes actually present in
// the pool pages.
//
// # Overview
//
// [New] builds a [Model] from a [Config]. The model implements
// [model.Model]:
//
//   - Vocabulary: token ids 0…255 are the bytes of UTF-8 text, [EOS] (256)
//     ends generation; [VocabSize] is 257. There is no BOS. The tokenizer
//     encodes text as its bytes and renders chats as
//     "<|role|>\ncontent\n" per message followed by "<|assistant|>\n",
//     honouring model.ChatOptions as a real model's tokenizer does (a
//     request's template and kwargs are rendered by the same
//     tokenizer.RenderChat).
//
//   - KV bytes: for a token written at position p, each of its 2 × Layers
//     segment slots (page layout [layer][k|v][slot][kv_heads][head_dim], see
//     package kvcache) receives SlotBytes bytes that depend only on
//     (token, p, layer, k|v): a window of a per-model pseudo-random table
//     (SplitMix64 output) chosen by a hash of those four values, whose first
//     8 bytes are replaced by the hash itself. Filling is a memory copy: a token
//     costs about as much as copying its BytesPerToken (128 KiB at the
//     default geometry).
//
//   - Next token: every filled slot (position < n = Pos+len(Tokens)) has a
//     64-bit digest of its bytes across all its segments: Σ w_j·(2j+1) mod
//     2^64 over its 64-bit words w_j, then mixed. The slot digests d_t of
//     positions 0…n-1 give the sequence digest D = mix(Σ d_t·(2t+1) mod 2^64,
//     n); the logits of 30 text tokens (lowercase letters, space, ".,'") and
//     EOS are a hash of (D, token id) scaled to [0, 4), every other token's is
//     −30; under a grammar's mask (SeqInput.Mask) the other printable ASCII
//     bytes it allows are hashed to [0, 4) as well, so structured output
//     (JSON's braces, quotes and digits) comes as readily as text and
//     ends. [model.SampleSeq] turns them into a token, so every sampling
//     parameter (temperature, top_p, top_k, min_p, penalties, bias, bans,
//     seed, forks, top logprobs) behaves as for any model; Step and the
//     sampling parameters enter only there. EOS never comes in the first
//     [MinOutput] (4) output tokens: at Step < MinOutput it is banned from
//     the draw as min_tokens bans it (SeqInput.Ban), the logits unchanged,
//     so an answer is never empty (a first chat neither; the ban yields to
//     a mask that allows only EOS) and, EOS being one
//     of 31 equally likely candidates after that, ends about 30 tokens
//     later. Step is the same on prefill and decode workers, so PD output
//     still equals colocated output. Prompt logprobs (SeqInput.Score)
//     at the position after Tokens[j] are [model.ScorePosition] of the
//     logits of D for the first Pos+j+1 positions: exactly those a decode
//     step there samples from. A lost, misplaced or corrupted page changes
//     D; one changed byte in a filled slot always does, because an odd weight
//     times a one-byte change is never 0 mod 2^64 and the mixes are
//     bijections. Bytes of unfilled slots are never read.
//
//   - Cost: the model records the digest of each slot it writes (computed
//     from prefix sums of the table, without reading the bytes back) and
//     hashes a slot's bytes only when the page's pool.Version says someone
//     else wrote it. Sums over full pages are cached too, so a decode step
//     costs O(n/PageSize + PageSize) small integer operations beyond writing
//     the new token.
//
//   - Latency: [Model.Forward] sleeps [Model.StepLatency] (prefill time per
//     prefill token plus one decode step time if the batch decodes) before it
//     computes, through the injectable [Config.Sleep].
//
// Digests do not depend on the page size or on page ids, so a sequence gives
// the same tokens in any pool, with chunked or whole prefill, and after its
// pages were copied byte for byte to another worker (PD disaggregation).
//
// # Concurrency
//
// Info and Tokenizer may be called from any goroutine; the tokenizer is
// stateless (each Decoder is for one goroutine). Forward is safe for
// concurrent use but serialises its computation on one lock; the latency
// sleep runs outside the lock.
//
// # Ownership
//
// The model caches slot digests per pool page and trusts pool.Version: every
// writer of page bytes other than this model (the KV channel receiver, a
// test) must call Pool.MarkWritten after writing, or the model keeps using
// the digests of the old bytes. The model writes only the slots of the
// positions it is asked to write and calls MarkWritten for each page it
// wrote. It keeps caches for at most a few pools (see maxPools) and drops them
// all when it sees a new pool beyond that.
package sim

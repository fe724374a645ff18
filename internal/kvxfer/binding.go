package kvxfer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// What ties a room's KV to the request it was computed for.
//
// The KV of a prompt page is a function of the model and of every token up
// to the end of that page (attention reads all earlier positions), and of
// nothing else. A PageHash names exactly that: a chain over the pages of a
// prompt, h(0) = ChainPage(ChainSeed(fingerprint), tokens of page 0) and
// h(i) = ChainPage(h(i-1), tokens of page i), the form of vLLM's prefix
// cache block hashes (hash of the parent block's hash and the block's
// tokens, v1/core/kv_cache_utils.py hash_block_tokens) with the model
// fingerprint as the root, so that hashes of different models never meet.
// A prefix cache indexes full pages by these hashes; a worker records the
// hash of the tokens it computed into each page when it computes it.
//
// A Binding (carried in KV_DONE) hashes the room, the gen, the prompt's
// length and the PageHash of every page of the prompt. The sender builds it
// from the hashes recorded with the pages it sends; the receiver builds it
// from its own request (room, gen, token ids, fingerprint). They are equal
// only if the KV is this attempt's and was computed for this prompt by this
// model, so a relabelled stream, pages of another request and a cache entry
// filed under the wrong key all fail the check.
//
// Hash: SHA-256 (FIPS 180-4) truncated to its first 128 bits (a truncated
// hash as in NIST SP 800-107 §5.1), each use prefixed with its own domain
// string. 128 bits keep accidental collisions out of reach (2^64 hashes for
// an even chance) at half the memory of a full digest per page.

// PageHash names the KV of one prompt page: the chained hash of the model
// fingerprint and the prompt's tokens up to the end of the page.
type PageHash [16]byte

// Binding is what KV_DONE carries to bind a transfer to its request: see
// BindKV.
type Binding [16]byte

// String is the binding as 32 lowercase hex digits.
func (b Binding) String() string { return hex.EncodeToString(b[:]) }

// String is the page hash as 32 lowercase hex digits.
func (h PageHash) String() string { return hex.EncodeToString(h[:]) }

const (
	seedDomain    = "pdserve kv chain seed v1\x00"
	pageDomain    = "pdserve kv page v1\x00"
	bindingDomain = "pdserve kv binding v1\x00"
)

// ChainSeed is the root of every page chain of a model served with fp:
// the hash of every field of the fingerprint (so two workers' chains agree
// exactly when their KV is interchangeable, see Fingerprint).
func ChainSeed(fp Fingerprint) PageHash {
	b := make([]byte, 0, len(seedDomain)+3*2+len(fp.Model)+len(fp.Digest)+len(fp.DType)+4*8)
	b = append(b, seedDomain...)
	b = appendString(b, fp.Model)
	b = appendString(b, fp.Digest)
	b = appendInt(b, fp.Layers)
	b = appendInt(b, fp.KVHeads)
	b = appendInt(b, fp.HeadDim)
	b = appendString(b, fp.DType)
	b = appendInt(b, fp.PageSize)
	return truncate(sha256.Sum256(b))
}

// ChainPage is the hash of a page holding tokens (at most one page of
// them; the last page of a prompt may hold fewer) after the page hashed
// parent (ChainSeed for the first page).
func ChainPage(parent PageHash, tokens []int32) PageHash {
	var stack [len(pageDomain) + 16 + 4 + 4*64]byte
	b := append(stack[:0], pageDomain...)
	b = append(b, parent[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return truncate(sha256.Sum256(b))
}

// AppendPromptChain appends to dst the hashes of the pages of a prompt of
// tokens, pageSize tokens per page (the last page may be partial), chained
// from seed, and returns the extended slice: ⌈len(tokens)/pageSize⌉ hashes.
// pageSize must be positive.
func AppendPromptChain(dst []PageHash, seed PageHash, tokens []int32, pageSize int) []PageHash {
	h := seed
	for i := 0; i < len(tokens); i += pageSize {
		h = ChainPage(h, tokens[i:min(i+pageSize, len(tokens))])
		dst = append(dst, h)
	}
	return dst
}

// BindKV is the binding of a transfer: the room and gen it is for, the
// number of prompt tokens and the hash of every page of the prompt, in
// order, whether or not the page travels in this transfer (a receiver that
// already holds a cached prefix still binds the whole prompt).
func BindKV(rg RoomGen, nTokens uint32, pages []PageHash) Binding {
	return BindKVConstrained(rg, nTokens, pages, "")
}

// BindKVConstrained is BindKV for a request whose output is constrained by
// a grammar whose spec has digest constraint (grammar.Spec.Digest; "" for
// none, which gives BindKV's binding): prefill drew the first token under
// that grammar, and decode goes on under the grammar it was sent, so the
// two must be the same one. The digest's length and bytes are hashed after
// the pages (whose count precedes them, so the encoding is unambiguous).
func BindKVConstrained(rg RoomGen, nTokens uint32, pages []PageHash, constraint string) Binding {
	h := sha256.New()
	var b [len(bindingDomain) + 16 + 4 + 4 + 4]byte
	p := append(b[:0], bindingDomain...)
	p = append(p, rg.Room[:]...)
	p = binary.LittleEndian.AppendUint32(p, rg.Gen)
	p = binary.LittleEndian.AppendUint32(p, nTokens)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(pages)))
	h.Write(p)
	for i := range pages {
		h.Write(pages[i][:])
	}
	if constraint != "" {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(constraint)))
		h.Write(n[:])
		h.Write([]byte(constraint))
	}
	var sum [sha256.Size]byte
	return Binding(truncate([sha256.Size]byte(h.Sum(sum[:0]))))
}

func truncate(sum [sha256.Size]byte) PageHash {
	var h PageHash
	copy(h[:], sum[:])
	return h
}

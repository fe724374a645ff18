package sim

import (
	"encoding/binary"
	"math/bits"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// golden is 2^64/φ rounded to odd, SplitMix64's stream increment (Steele,
// Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014).
const golden = 0x9e3779b97f4a7c15

// mix64 is the SplitMix64 output function (same source): a bijection on
// uint64 that spreads every input bit over the output.
func mix64(x uint64) uint64 {
	x += golden
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Domain separators for the hashes below (arbitrary odd constants; changing
// any of them changes every output and needs a new digestVersion).
const (
	saltTable  = 0x5ad1_6e0d_2b3f_0001 // noise table stream
	saltToken  = 0x6b43_a9b5_1f1e_0003 // (token, position) seed
	saltSlot   = 0x2545_f491_4f6c_dd1d // slot digest finaliser
	saltLength = 0x7c15_9e37_79b9_0005 // sequence length in D
	saltLogit  = 0x3c6e_f372_fe94_f82b // (D, token id) → logit
)

// minTableWords is the least size of the noise table in 64-bit words
// (512 KiB), large enough that windows of one slot rarely coincide.
const minTableWords = 1 << 16

// kvTable is a model's read-only noise: a SplitMix64 stream and its prefix
// sums, from which a slot's bytes are copied and its digest computed in O(1).
type kvTable struct {
	words int      // table length in 64-bit words
	bytes []byte   // the words, little-endian
	p0    []uint64 // p0[i] = Σ_{k<i} w_k            (mod 2^64)
	p1    []uint64 // p1[i] = Σ_{k<i} w_k · (2k + 1) (mod 2^64)
}

// slotLayout is the per-token part of a geometry that the fill and hash
// loops need.
type slotLayout struct {
	layers    int
	slotBytes int  // bytes of one token in one segment: KVHeads × HeadDim × dtype size
	wps       int  // 64-bit words per segment slot, the last one zero-padded: ceil(slotBytes / 8)
	whole     bool // slotBytes is a multiple of 8, so digests come from the prefix sums
}

func newSlotLayout(g kvcache.Geometry) slotLayout {
	sb := g.KVHeads * g.HeadDim * g.DType.Size()
	return slotLayout{layers: g.Layers, slotBytes: sb, wps: (sb + 7) / 8, whole: sb%8 == 0}
}

func newKVTable(wps int) kvTable {
	n := max(minTableWords, 16*wps)
	t := kvTable{words: n, bytes: make([]byte, 8*n), p0: make([]uint64, n+1), p1: make([]uint64, n+1)}
	for i := range n {
		w := mix64(saltTable + uint64(i)*golden)
		binary.LittleEndian.PutUint64(t.bytes[8*i:], w)
		t.p0[i+1] = t.p0[i] + w
		t.p1[i+1] = t.p1[i] + w*(2*uint64(i)+1)
	}
	return t
}

// Slot digests.
//
// The raw digest of a token's slot is Σ_j w_j · (2j + 1) mod 2^64 over the
// 64-bit little-endian words w_j of its bytes in segment order: segment
// g = 2·layer + kv contributes words j = g·wps … g·wps + wps − 1, a trailing
// partial word zero-padded. Changing one byte by δ changes one word by
// δ·2^(8b), b < 8, whose 2-adic valuation is below 64; the odd weight keeps
// it so, hence the sum always changes. The stored digest is mix64 of the raw
// sum (a bijection), XOR saltSlot.

// hashSeg returns the raw-digest contribution of one segment slot whose first
// word has global index j0, reading its bytes.
func hashSeg(src []byte, j0 int) uint64 {
	var s0, s1, s2, s3 uint64
	w := 2*uint64(j0) + 1
	for len(src) >= 32 {
		s0 += binary.LittleEndian.Uint64(src) * w
		s1 += binary.LittleEndian.Uint64(src[8:]) * (w + 2)
		s2 += binary.LittleEndian.Uint64(src[16:]) * (w + 4)
		s3 += binary.LittleEndian.Uint64(src[24:]) * (w + 6)
		w += 8
		src = src[32:]
	}
	for len(src) >= 8 {
		s0 += binary.LittleEndian.Uint64(src) * w
		w += 2
		src = src[8:]
	}
	if len(src) > 0 {
		var tail [8]byte
		copy(tail[:], src)
		s0 += binary.LittleEndian.Uint64(tail[:]) * w
	}
	return s0 + s1 + s2 + s3
}

// finishSlot turns a raw slot sum into the stored slot digest.
func finishSlot(raw uint64) uint64 { return mix64(raw ^ saltSlot) }

// fillSeg writes the bytes of segment slot g (segment index 2·layer + kv) for
// seed into dst (len slotBytes) and returns its raw-digest contribution. The
// bytes are the table window at word offset o = ⌊seed · span / 2^64⌋ (Lemire's
// multiply-shift range reduction) with the first min(8, slotBytes) bytes
// replaced by seed, little-endian.
func (t *kvTable) fillSeg(l slotLayout, dst []byte, seed uint64, g int) uint64 {
	span := uint64(t.words - l.wps + 1)
	o, _ := bits.Mul64(seed, span)
	copy(dst, t.bytes[8*o:8*o+uint64(l.slotBytes)])
	if !l.whole {
		var hdr [8]byte
		binary.LittleEndian.PutUint64(hdr[:], seed)
		copy(dst, hdr[:])
		return hashSeg(dst, g*l.wps)
	}
	w0 := binary.LittleEndian.Uint64(dst)
	binary.LittleEndian.PutUint64(dst, seed)
	// Σ_i T[o+i]·(base + 2i + 1) = Σ_i T[o+i]·(2(o+i) + 1) + (base − 2o)·Σ_i T[o+i]
	// with base = 2·g·wps; then swap the first word's w0 for seed (weight base + 1).
	n := uint64(l.wps)
	base := 2 * uint64(g) * n
	s0 := t.p0[o+n] - t.p0[o]
	s1 := t.p1[o+n] - t.p1[o]
	return s1 + (base-2*o)*s0 + (seed-w0)*(base+1)
}

// tokenSeed keys the KV bytes of token tok at position pos.
func tokenSeed(tok int32, pos int) uint64 {
	return mix64(mix64(uint64(uint32(tok))^saltToken) ^ uint64(pos))
}

// segSeed keys segment g (2·layer + kv) of a token keyed by ts.
func segSeed(ts uint64, g int) uint64 { return mix64(ts + uint64(g)*golden) }

// writeSlot writes the KV of token tok at position pos into slot s of page id
// and returns the slot digest. The caller calls MarkWritten.
func (m *Model) writeSlot(pool *kvcache.Pool, id kvcache.PageID, s int, tok int32, pos int) uint64 {
	l := m.lay
	ts := tokenSeed(tok, pos)
	lo, hi := s*l.slotBytes, (s+1)*l.slotBytes
	var raw uint64
	for layer := range l.layers {
		for kv := range 2 {
			g := 2*layer + kv
			raw += m.tab.fillSeg(l, pool.Segment(id, layer, kv)[lo:hi], segSeed(ts, g), g)
		}
	}
	return finishSlot(raw)
}

// readSlot returns the digest of the bytes in slot s of page id.
func (m *Model) readSlot(pool *kvcache.Pool, id kvcache.PageID, s int) uint64 {
	l := m.lay
	lo, hi := s*l.slotBytes, (s+1)*l.slotBytes
	var raw uint64
	for layer := range l.layers {
		for kv := range 2 {
			g := 2*layer + kv
			raw += hashSeg(pool.Segment(id, layer, kv)[lo:hi], g*l.wps)
		}
	}
	return finishSlot(raw)
}

// Digest caches.

// maxPools bounds how many pools' caches a model keeps; one worker has one
// pool, tests a few.
const maxPools = 4

// pageDigests caches the slot digests of one page, valid while the pool's
// Version of the page equals version.
type pageDigests struct {
	version uint64
	known   []bool   // per slot: digest[s] is the digest of the slot's bytes
	digest  []uint64 // per slot
	// agg = Σ_s digest[s]·(2(aggBase+s) + 1) over all slots, when aggOK.
	aggOK   bool
	aggBase int
	agg     uint64
}

// poolCache is what a model keeps per pool: page digests and Forward's
// batch check.
type poolCache struct {
	pages []*pageDigests // by page id; nil until used
	batch *model.BatchCheck
}

func newPoolCache(pool *kvcache.Pool) *poolCache {
	n := pool.Total()
	return &poolCache{pages: make([]*pageDigests, n), batch: model.NewBatchCheck(n)}
}

// cacheFor returns the cache of pool, creating it (and dropping all others if
// maxPools are kept).
func (m *Model) cacheFor(pool *kvcache.Pool) *poolCache {
	if c, ok := m.caches[pool]; ok {
		return c
	}
	if len(m.caches) >= maxPools {
		clear(m.caches)
	}
	c := newPoolCache(pool)
	m.caches[pool] = c
	return c
}

// page returns the digests of page id, emptied if the page was written since.
func (c *poolCache) page(pool *kvcache.Pool, id kvcache.PageID) *pageDigests {
	v := pool.Version(id)
	pd := c.pages[id]
	if pd == nil {
		ps := pool.PageSize()
		pd = &pageDigests{version: v, known: make([]bool, ps), digest: make([]uint64, ps)}
		c.pages[id] = pd
		return pd
	}
	if pd.version != v {
		clear(pd.known)
		pd.aggOK = false
		pd.version = v
	}
	return pd
}

// slot returns the digest of slot s of page id, hashing its bytes if they
// changed since the digest was recorded.
func (m *Model) slot(pool *kvcache.Pool, pd *pageDigests, id kvcache.PageID, s int) uint64 {
	if !pd.known[s] {
		pd.digest[s] = m.readSlot(pool, id, s)
		pd.known[s] = true
	}
	return pd.digest[s]
}

// writeKV writes the KV of seq's tokens, recording their digests and marking
// each page written.
func (m *Model) writeKV(pool *kvcache.Pool, c *poolCache, pages []kvcache.PageID, pos int, toks []int32) {
	ps := pool.PageSize()
	n := pos + len(toks)
	for t := pos; t < n; {
		k := t / ps
		id := pages[k]
		pd := c.page(pool, id)
		for end := min(n, (k+1)*ps); t < end; t++ {
			s := t - k*ps
			pd.digest[s] = m.writeSlot(pool, id, s, toks[t-pos], t)
			pd.known[s] = true
		}
		pd.aggOK = false
		pool.MarkWritten(id)
		pd.version = pool.Version(id)
	}
}

// seqDigest returns D for the first n positions of a sequence: the slot
// digests d_t weighted by (2t + 1), summed mod 2^64 (so one changed digest
// always changes the sum), then mixed with n. It reads only filled slots.
func (m *Model) seqDigest(pool *kvcache.Pool, c *poolCache, pages []kvcache.PageID, n int) uint64 {
	return finishSeq(m.seqSum(pool, c, pages, n), n)
}

// finishSeq turns the weighted sum of n slot digests into D.
func finishSeq(sum uint64, n int) uint64 { return mix64(sum ^ mix64(uint64(n)^saltLength)) }

// seqSum is Σ d_t·(2t + 1) mod 2^64 over the first n positions of a
// sequence, the sum in seqDigest.
func (m *Model) seqSum(pool *kvcache.Pool, c *poolCache, pages []kvcache.PageID, n int) uint64 {
	ps := pool.PageSize()
	var sum uint64
	full := n / ps
	for k := range full {
		id := pages[k]
		pd := c.page(pool, id)
		base := k * ps
		if !pd.aggOK || pd.aggBase != base {
			var agg uint64
			for s := range ps {
				agg += m.slot(pool, pd, id, s) * (2*uint64(base+s) + 1)
			}
			pd.agg, pd.aggBase, pd.aggOK = agg, base, true
		}
		sum += pd.agg
	}
	if rest := n - full*ps; rest > 0 {
		id := pages[full]
		pd := c.page(pool, id)
		for s := range rest {
			t := full*ps + s
			sum += m.slot(pool, pd, id, s) * (2*uint64(t) + 1)
		}
	}
	return sum
}

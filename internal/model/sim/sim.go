package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// digestVersion names the algorithm that turns tokens into KV bytes and KV
// bytes into tokens; it is part of Info.Digest and changes whenever either
// changes, so workers running different versions refuse each other's KV.
const digestVersion = "sim-v3"

// MinOutput is the number of output tokens before EOS can come: at output
// steps 0…MinOutput−1 the sampler never draws EOS (it is banned as
// min_tokens bans it, SeqInput.Ban), so every answer has at least MinOutput
// tokens unless max_tokens or a stop ends it sooner. The logits themselves
// are unchanged, so logprobs and prompt logprobs do not depend on the step.
const MinOutput = 4

// textTokens are the byte tokens that get finite logits besides EOS: the
// lowercase letters, space and four punctuation marks (30 tokens).
const textTokens = "abcdefghijklmnopqrstuvwxyz .,'"

// Logit values. Text tokens and EOS draw uniformly from [0, logitSpan);
// every other token gets offLogit. With 31 candidates of equal chance, EOS is
// the greedy choice with probability 1/31, so greedy outputs average about 30
// tokens after the first MinOutput (which are never EOS). offLogit is −30 rather than −Inf so that every logprob is finite;
// e^−30 ≈ 1e−13, so the 226 other tokens together hold < 1e−10 of the mass.
const (
	logitSpan = 4
	offLogit  = -30
)

// Under a grammar's mask (model.SeqInput.Mask), the printable ASCII bytes
// other than textTokens that it allows (braces, quotes, digits, colons,
// capitals: 65 tokens) draw their logits as text tokens do, in [0,
// logitSpan), rather than offLogit. The simulated model then behaves as a
// model asked for the format would: the structure a grammar needs is as
// likely as text where it is allowed, so constrained outputs end (a JSON
// string closes after about 90 characters on average) instead of running
// into max_tokens. Without a mask the logits are as before.

// Model is the simulated model. Create it with New.
type Model struct {
	cfg  Config
	info model.Info
	lay  slotLayout
	tab  kvTable
	// textKeys[i] keys the logit of token textIDs[i].
	textIDs  []int32
	textKeys []uint64
	// structIDs are the printable ASCII tokens not in textTokens (the
	// ones a mask lets draw as text), structKeys[i] keying structIDs[i].
	structIDs  []int32
	structKeys []uint64
	tok        byteTokenizer

	mu      sync.Mutex // guards the fields below
	caches  map[*kvcache.Pool]*poolCache
	logits  []float32           // [VocabSize], Forward's scratch
	ban     []int32             // Forward's scratch: a sequence's Ban plus EOS
	scratch model.SampleScratch // model.Sample's buffers
}

var _ model.Model = (*Model)(nil)

// New validates cfg, fills its defaults and builds the model. It returns an
// error naming the offending field for an invalid geometry, a negative
// context length or a negative latency.
func New(cfg Config) (*Model, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	lay := newSlotLayout(cfg.Geometry)
	m := &Model{
		cfg:    cfg,
		lay:    lay,
		tab:    newKVTable(lay.wps),
		caches: make(map[*kvcache.Pool]*poolCache),
		logits: make([]float32, VocabSize),
		tok:    newByteTokenizer(),
	}
	for i := range len(textTokens) {
		m.textIDs = append(m.textIDs, int32(textTokens[i]))
	}
	m.textIDs = append(m.textIDs, EOS)
	for _, id := range m.textIDs {
		m.textKeys = append(m.textKeys, mix64(uint64(id)^saltLogit))
	}
	for b := byte(' '); b <= '~'; b++ {
		if strings.IndexByte(textTokens, b) >= 0 {
			continue
		}
		id := int32(b)
		m.structIDs = append(m.structIDs, id)
		m.structKeys = append(m.structKeys, mix64(uint64(id)^saltLogit))
	}
	m.info = model.Info{
		Name:       cfg.Name,
		Geometry:   cfg.Geometry,
		ContextLen: cfg.ContextLen,
		VocabSize:  VocabSize,
		Digest:     digestOf(cfg),
	}
	return m, nil
}

// digestOf derives Info.Digest from what determines the KV bytes and how they
// are read: the algorithm version, the name and the geometry. Context length
// and latency do not change KV, so they are left out.
func digestOf(cfg Config) string {
	g := cfg.Geometry
	canon := fmt.Sprintf("%s\x00name=%s\x00layers=%d\x00kv_heads=%d\x00head_dim=%d\x00dtype=%s",
		digestVersion, cfg.Name, g.Layers, g.KVHeads, g.HeadDim, g.DType)
	sum := sha256.Sum256([]byte(canon))
	return digestVersion + "-" + hex.EncodeToString(sum[:8])
}

// Info describes the model; EOS is a fresh slice on every call.
func (m *Model) Info() model.Info {
	info := m.info
	info.EOS = []int32{EOS}
	return info
}

// Tokenizer returns the byte tokenizer (see package doc).
func (m *Model) Tokenizer() model.Tokenizer { return m.tok }

// isDecode reports whether s is a decode sequence: one token after at least
// one position already in the cache.
func isDecode(s *model.SeqInput) bool { return s.Pos > 0 && len(s.Tokens) == 1 }

// StepLatency is the simulated time of one Forward over seqs: the
// profile's step time if Config.Profile is set, otherwise
// PrefillPerToken × (tokens of the prefill sequences) + DecodePerStep if any
// sequence decodes. A sequence decodes when it has one token and Pos > 0;
// every other sequence (a first chunk, a later chunk of several tokens, a
// one-token prompt) is prefill work and counts all its tokens. The model
// follows the usual GPU cost split: prefill is compute-bound, linear in
// tokens; a decode step is memory-bound, roughly constant for small batches.
func (m *Model) StepLatency(seqs []model.SeqInput) time.Duration {
	if m.cfg.Profile != nil {
		return m.cfg.Profile.StepTime(seqs)
	}
	var prefill int
	decode := false
	for i := range seqs {
		if isDecode(&seqs[i]) {
			decode = true
		} else {
			prefill += len(seqs[i].Tokens)
		}
	}
	d := m.cfg.PrefillPerToken * time.Duration(prefill)
	if decode {
		d += m.cfg.DecodePerStep
	}
	return d
}

// Forward runs one batched step (see model.Model). It checks every sequence
// first and returns an error, having written nothing, for: a pool whose
// geometry differs from the model's, len(out) ≠ len(seqs), a negative Pos, no
// tokens, Pos+len(Tokens) > ContextLen, a token id outside [0, VocabSize),
// too few pages, a page id outside the pool, a page listed twice among the
// pages covering one sequence, a page that one sequence writes and another
// covers, or invalid sampling parameters of a sampling sequence (TopP 0 is
// read as 1, as model.Sample does). Then it sleeps StepLatency(seqs),
// returning ctx.Err() without writing if ctx ends first, writes the KV of
// every token, and sets out[i] for sampling sequences (zero otherwise).
func (m *Model) Forward(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput, out []model.SeqOutput) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.check(pool, seqs, out); err != nil {
		return err
	}
	if d := m.StepLatency(seqs); d > 0 {
		if err := m.cfg.Sleep(ctx, d); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cacheFor(pool)
	for i := range seqs {
		s := &seqs[i]
		m.writeKV(pool, c, s.Pages, s.Pos, s.Tokens)
	}
	for i := range seqs {
		s := &seqs[i]
		var scores []model.PositionLogprobs
		if s.Score != nil {
			scores = m.score(pool, c, s)
		}
		if !s.Sample {
			out[i] = model.SeqOutput{Scores: scores}
			continue
		}
		d := m.seqDigest(pool, c, s.Pages, s.Pos+len(s.Tokens))
		m.fillLogits(d)
		if s.Mask != nil {
			m.fillMasked(d, s.Mask)
		}
		in := s
		if s.Step < MinOutput {
			m.ban = append(append(m.ban[:0], s.Ban...), EOS)
			early := *s
			early.Ban = m.ban
			in = &early
		}
		out[i] = model.SampleSeq(m.logits, in, &m.scratch)
		out[i].Scores = scores
	}
	return nil
}

// score returns the prompt logprobs s.Score asks for: entry j from the
// logits after Tokens[j], those a decode step at position Pos+j+1 would
// sample from (fillLogits of the digest of positions 0…Pos+j), computed
// from one running sum of the slot digests. The KV of s is written.
func (m *Model) score(pool *kvcache.Pool, c *poolCache, s *model.SeqInput) []model.PositionLogprobs {
	scores := make([]model.PositionLogprobs, len(s.Tokens))
	n := 0
	for _, t := range s.Score {
		if t >= 0 {
			n++
		}
	}
	top := make([]model.TokenLogprob, n*s.ScoreTop)
	ps := pool.PageSize()
	sum := m.seqSum(pool, c, s.Pages, s.Pos)
	for j, target := range s.Score {
		t := s.Pos + j
		pd := c.page(pool, s.Pages[t/ps])
		sum += m.slot(pool, pd, s.Pages[t/ps], t%ps) * (2*uint64(t) + 1)
		if target < 0 {
			continue
		}
		m.fillLogits(finishSeq(sum, t+1))
		scores[j] = model.ScorePosition(m.logits, target, top[:s.ScoreTop:s.ScoreTop], &m.scratch)
		top = top[s.ScoreTop:]
	}
	return scores
}

// fillMasked gives the structIDs that mask allows their logits for
// sequence digest d (after fillLogits), drawn as text tokens' are.
func (m *Model) fillMasked(d uint64, mask []uint64) {
	for i, id := range m.structIDs {
		if int(id>>6) < len(mask) && mask[id>>6]>>(id&63)&1 != 0 {
			u := float64(mix64(d^m.structKeys[i])>>11) / (1 << 53)
			m.logits[id] = float32(u * logitSpan)
		}
	}
}

// fillLogits sets m.logits for sequence digest d.
func (m *Model) fillLogits(d uint64) {
	for i := range m.logits {
		m.logits[i] = offLogit
	}
	for i, id := range m.textIDs {
		u := float64(mix64(d^m.textKeys[i])>>11) / (1 << 53)
		m.logits[id] = float32(u * logitSpan)
	}
}

// check validates a Forward call without touching page bytes
// (model.BatchCheck).
func (m *Model) check(pool *kvcache.Pool, seqs []model.SeqInput, out []model.SeqOutput) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var bc *model.BatchCheck // Check needs none to refuse a nil pool
	if pool != nil {
		bc = m.cacheFor(pool).batch
	}
	if err := bc.Check(pool, m.info, seqs, len(out)); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}

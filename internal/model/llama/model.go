package llama

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// Options tune Load. The zero value is valid.
type Options struct {
	// Name is the served model name; "" means the checkpoint directory's
	// base name (e.g. "SmolLM2-135M-Instruct").
	Name string
	// KVDType is the element type of the KV cache pages; 0 means F32, which
	// stores keys and values exactly as computed. BF16 and F16 halve the
	// pool's bytes per token at the cost of rounding K and V (to nearest,
	// ties to even, as they are written); pdserve gives DefaultKVDType.
	KVDType kvcache.DType
	// ContextLen is the maximum positions of a sequence, in tokens; 0 means
	// max_position_embeddings (or the sliding window, if smaller, for a
	// model whose every layer slides: see Config.SlidingLayers). It may
	// not exceed that. For Phi-3's LongRoPE it also chooses the factors
	// (the long ones above original_max_position_embeddings, as llama.cpp
	// does), and with them the KV the model writes and its Info.Digest.
	ContextLen int
	// Threads is the number of goroutines a Forward computes on; 0 means
	// runtime.GOMAXPROCS(0) at the time of the call.
	Threads int
	// Kernels chooses the instruction set of the matrix kernels (see
	// KernelChoices): "" or KernelsAuto for the widest the CPU has,
	// KernelsAVX512, KernelsAVX2 (an error if the CPU lacks it) or
	// KernelsGo. Every choice computes the same bits; the narrower ones are
	// for benchmarks and for checking that.
	Kernels string
	// LoadTokenizer loads the tokenizer of a checkpoint directory that has a
	// tokenizer.json (cmd/pdserve passes internal/model/tokenizer's Load);
	// nil, or a directory without tokenizer.json, means no tokenizer
	// (Tokenizer returns nil: token-id prompts only). If the tokenizer has a
	// method EOS() []int32, those ids join Info.EOS; if it has VocabSize()
	// int, it must not exceed the model's vocab_size.
	LoadTokenizer func(dir string) (model.Tokenizer, error)
	// LoadGGUFTokenizer builds the tokenizer of a GGUF file from its
	// tokenizer.ggml.* metadata (cmd/pdserve passes
	// internal/model/tokenizer's FromGGUF); nil, or a file without
	// tokenizer.ggml.model, means no tokenizer. The same EOS and VocabSize
	// rules as for LoadTokenizer apply.
	LoadGGUFTokenizer func(f *gguf.File) (model.Tokenizer, error)
}

// Model is a Llama-architecture model on the CPU. It implements
// model.Model. Create it with Load; Clone makes more instances over the
// same weights; Close each one.
type Model struct {
	w       *weights
	info    model.Info
	tok     model.Tokenizer
	threads int
	ks      *kernelSet // nil: pure Go
	invFreq []float64  // RoPE inverse frequencies [headDim/2] (of ropeGlobal)
	// ropeGlobal is the RoPE configuration of the (global) layers and
	// ropeScale the factor of their cos and sin (globalRope: the
	// configuration itself and 1, except for LongRoPE).
	ropeGlobal *Config
	ropeScale  float32
	// ropeLocal is the RoPE configuration of the sliding layers when it
	// differs from the others' (localRope; Gemma3), with its inverse
	// frequencies invFreqLocal; else nil.
	ropeLocal    *Config
	invFreqLocal []float64
	// attnScale multiplies the attention scores (1/√headDim, or Gemma2's
	// query_pre_attn_scalar^−½); qScale, if not 0, multiplies the queries
	// instead (Gemma2 from GGUF, as llama.cpp does) and attnScale is 1.
	attnScale, qScale float32

	mu     sync.Mutex // serialises Forward and guards the fields below
	closed bool
	caches map[*kvcache.Pool]*poolCache
	buf    buffers
}

var _ model.Model = (*Model)(nil)

// Load reads a model: a Hugging Face checkpoint directory, or a GGUF file
// (see loadGGUF in gguf_load.go).
//
// From a directory it reads config.json (and generation_config.json if
// present), the weights in model.safetensors or in shards listed by
// model.safetensors.index.json (memory-mapped, kept in their dtype: F32,
// F16 or BF16), and tokenizer.json through opts.LoadTokenizer.
//
// It returns an error, never panics, for: a missing file; an unsupported
// architecture, activation or rope_scaling; inconsistent sizes in
// config.json; a tensor that is missing, has an unsupported dtype, a shape
// other than config.json implies, or data past the end of its file (a
// truncated download); tensors the configuration does not use; invalid
// options; a tokenizer that fails to load; and a big-endian host.
func Load(path string, opts Options) (*Model, error) {
	if !isLittleEndian() {
		return nil, errors.New("llama: this package needs a little-endian CPU (safetensors, GGUF and KV pages are little-endian)")
	}
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return loadGGUF(path, opts)
	}
	dir := path
	cfg, rawCfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := checkOptions(&cfg, &opts); err != nil {
		return nil, err
	}
	var tok model.Tokenizer
	if opts.LoadTokenizer != nil {
		tpath := filepath.Join(dir, "tokenizer.json")
		if _, err := os.Stat(tpath); err == nil {
			t, err := opts.LoadTokenizer(dir)
			if err != nil {
				return nil, fmt.Errorf("llama: tokenizer: %w", err)
			}
			tok = t
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("llama: %w", err)
		}
	}
	w, err := loadWeights(dir, cfg, rawCfg)
	if err != nil {
		return nil, err
	}
	m, err := newModel(w, tok, dir, opts)
	if err != nil {
		_ = w.release()
		return nil, err
	}
	return m, nil
}

// checkOptions validates opts against cfg and fills in the defaults.
func checkOptions(cfg *Config, opts *Options) error {
	if opts.KVDType == 0 {
		opts.KVDType = kvcache.F32
	}
	geo := kvcache.Geometry{Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: opts.KVDType}
	if err := geo.Validate(); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	ctxLen := cfg.MaxPositions
	if cfg.SlidingWindow > 0 && cfg.SlidingWindow < ctxLen && cfg.SlidingLayers == nil {
		ctxLen = cfg.SlidingWindow
	}
	switch {
	case opts.ContextLen < 0:
		return fmt.Errorf("llama: context length must not be negative, got %d", opts.ContextLen)
	case opts.ContextLen > ctxLen:
		return fmt.Errorf("llama: context length %d exceeds the model's %d positions", opts.ContextLen, ctxLen)
	case opts.ContextLen == 0:
		opts.ContextLen = ctxLen
	}
	if opts.Threads < 0 {
		return fmt.Errorf("llama: threads must not be negative, got %d", opts.Threads)
	}
	if _, err := chooseKernels(opts.Kernels); err != nil {
		return err
	}
	return nil
}

// newModel builds the first instance over loaded weights (opts checked by
// checkOptions). tok may be nil; its EOS ids join the configuration's.
func newModel(w *weights, tok model.Tokenizer, path string, opts Options) (*Model, error) {
	cfg := &w.cfg
	ks, err := chooseKernels(opts.Kernels)
	if err != nil {
		return nil, err
	}
	name := opts.Name
	if name == "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("llama: %w", err)
		}
		name = filepath.Base(abs)
		if strings.HasSuffix(strings.ToLower(name), ".gguf") {
			name = name[:len(name)-len(".gguf")]
		}
	}
	eos := cfg.EOS
	if tok != nil {
		if e, ok := tok.(interface{ EOS() []int32 }); ok {
			eos = mergeIDs(eos, e.EOS())
		}
		if v, ok := tok.(interface{ VocabSize() int }); ok && v.VocabSize() > cfg.VocabSize {
			return nil, fmt.Errorf("llama: the tokenizer has %d tokens, but the model's vocab_size is %d", v.VocabSize(), cfg.VocabSize)
		}
	}
	for _, id := range eos {
		if int(id) >= cfg.VocabSize {
			return nil, fmt.Errorf("llama: EOS token id %d is outside the vocabulary [0, %d)", id, cfg.VocabSize)
		}
	}
	geo := kvcache.Geometry{Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: opts.KVDType}
	rope, ropeScale, long := globalRope(cfg, opts.ContextLen)
	digest := w.digest
	if long {
		digest += "+rope-long" // other RoPE factors, other KV: never paired with the short ones
	}
	m := &Model{
		w:   w,
		tok: tok,
		info: model.Info{Name: name, Geometry: geo, ContextLen: opts.ContextLen, VocabSize: cfg.VocabSize,
			EOS: eos, Digest: digest},
		threads:    opts.Threads,
		ks:         ks,
		invFreq:    ropeInvFreq(rope),
		ropeGlobal: rope,
		ropeScale:  ropeScale,
		caches:     make(map[*kvcache.Pool]*poolCache),
	}
	if m.ropeLocal = localRope(cfg); m.ropeLocal != nil {
		m.invFreqLocal = ropeInvFreq(m.ropeLocal)
	}
	m.attnScale, m.qScale = attentionScales(cfg)
	return m, nil
}

// attentionScales returns Model.attnScale and qScale for cfg.
func attentionScales(cfg *Config) (attn, q float32) {
	switch {
	case cfg.QueryScale == 0:
		return float32(1 / math.Sqrt(float64(cfg.HeadDim))), 0
	case cfg.GGMLNumerics:
		return 1, float32(cfg.QueryScale)
	default:
		return float32(cfg.QueryScale), 0
	}
}

// Clone returns a new instance over the same weights (shared read-only,
// mapped once), with its own buffers, for another worker: each instance runs
// one Forward at a time, and instances run concurrently. It returns an error
// if m is closed.
func (m *Model) Clone() (*Model, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed
	}
	m.w.refs.Add(1)
	return &Model{w: m.w, tok: m.tok, info: m.info, threads: m.threads, ks: m.ks, invFreq: m.invFreq,
		ropeLocal: m.ropeLocal, invFreqLocal: m.invFreqLocal, ropeGlobal: m.ropeGlobal, ropeScale: m.ropeScale,
		attnScale: m.attnScale, qScale: m.qScale, caches: make(map[*kvcache.Pool]*poolCache)}, nil
}

// Close releases the instance; the weights are unmapped when the last
// instance sharing them is closed. Forward on a closed instance returns an
// error. Close is idempotent. Tokenizer stays usable after Close.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.buf = buffers{}
	m.caches = nil
	return m.w.release()
}

var errClosed = errors.New("llama: model is closed")

// Info describes the model; EOS is a fresh slice on every call.
func (m *Model) Info() model.Info {
	info := m.info
	info.EOS = append([]int32(nil), m.info.EOS...)
	return info
}

// Config is the model's configuration as read from config.json.
func (m *Model) Config() Config { return m.w.cfg }

// WeightBytes is the size of all tensors in the checkpoint, in bytes: about
// what one batch-1 decode step reads.
func (m *Model) WeightBytes() int64 { return m.w.bytes }

// Kernels is the instruction set of the kernels the model computes with:
// KernelsAVX512, KernelsAVX2 or KernelsGo.
func (m *Model) Kernels() string { return kernelName(m.ks) }

// Tokenizer returns the tokenizer loaded through Options.LoadTokenizer, or
// nil (token-id prompts only).
func (m *Model) Tokenizer() model.Tokenizer {
	if m.tok == nil {
		return nil
	}
	return m.tok
}

// threadCount is the size of a Forward's team.
func (m *Model) threadCount() int {
	if m.threads > 0 {
		return m.threads
	}
	return runtime.GOMAXPROCS(0)
}

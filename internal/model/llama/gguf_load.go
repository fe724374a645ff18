package llama

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// GGUF architectures (general.architecture) and the Hugging Face
// architecture each stands for. llama.cpp's llama architecture (which its
// converter also uses for Mistral) stores q and k in Meta's interleaved
// RoPE layout; qwen2, qwen3 and gemma2 keep Hugging Face's rotate-half layout
// (llama.cpp's LLAMA_ROPE_TYPE_NORM and LLAMA_ROPE_TYPE_NEOX,
// llama-model.cpp).
var ggufArchs = map[string]struct {
	hf          string
	interleaved bool
}{
	"llama":    {archLlama, true},
	"mistral":  {archMistral, true},
	"qwen2":    {archQwen2, false},
	"qwen3":    {archQwen3, false},
	"qwen3moe": {archQwen3MoE, false},
	"gemma2":   {archGemma2, false},
	"gemma3":   {archGemma3, false},
	"phi3":     {archPhi3, false},
}

// ggufMatrixTypes are the tensor types a GGUF model's matrices may have.
var ggufMatrixTypes = []gguf.Type{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0, gguf.Q4_0, gguf.Q4_1, gguf.Q5_0, gguf.Q5_1, gguf.IQ4_NL, gguf.IQ4_XS, gguf.Q2_K, gguf.Q3_K, gguf.Q4_K, gguf.Q5_K, gguf.Q6_K}

// ggufConfig reads the model configuration from a GGUF file's metadata,
// with llama.cpp's key names (llama-arch.cpp, LLM_KV_*) under the
// architecture's prefix: block_count, embedding_length,
// feed_forward_length, context_length, attention.head_count,
// attention.head_count_kv (default head_count),
// attention.layer_norm_rms_epsilon, rope.freq_base (default 10000),
// rope.dimension_count and attention.key_length / value_length (each, if
// present, must be the head dimension), rope.scaling.type ("none" or
// "linear", with rope.scaling.factor) and, for mistral and gemma2,
// attention.sliding_window (gemma2: see ggufGemma2 for its other keys, and
// attention.sliding_window_pattern, default 2: the sliding layers of
// swaPattern; gemma3: ggufGemma3; phi3: ggufPhi3). vocab_size is {arch}.vocab_size, else the
// length of tokenizer.ggml.tokens, else the rows of token_embd.weight. BOS
// and EOS are tokenizer.ggml.bos_token_id and eos_token_id (with eot and
// eom). Errors name the key.
func ggufConfig(f *gguf.File) (Config, error) {
	arch, ok, err := f.String("general.architecture")
	if err != nil {
		return Config{}, err
	}
	if !ok {
		return Config{}, errors.New("no general.architecture")
	}
	a, ok := ggufArchs[arch]
	if !ok {
		return Config{}, fmt.Errorf("general.architecture %q is not supported; want llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3 or phi3", arch)
	}
	c := Config{Architecture: a.hf, RopeInterleaved: a.interleaved, GGMLNumerics: true, BOS: -1, RMSNormEps: 1e-5, RopeTheta: 10000,
		QKNorm: a.hf == archQwen3 || a.hf == archQwen3MoE}
	var errs []error
	num := func(key string, required bool, max uint64) int {
		v, ok, err := f.Uint(arch + "." + key)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !ok && required:
			errs = append(errs, fmt.Errorf("no %s.%s", arch, key))
		case ok && (v == 0 || v > max):
			errs = append(errs, fmt.Errorf("%s.%s is %d, want 1 to %d", arch, key, v, max))
		}
		return int(v)
	}
	const big = 1 << 24
	c.Layers = num("block_count", true, 4096)
	c.HiddenSize = num("embedding_length", true, big)
	c.IntermediateSize = num("feed_forward_length", arch != "qwen3moe", big)
	c.MaxPositions = num("context_length", true, 1<<30)
	c.Heads = num("attention.head_count", true, 4096)
	c.KVHeads = num("attention.head_count_kv", false, 4096)
	keyLen := num("attention.key_length", false, big)
	valLen := num("attention.value_length", false, big)
	ropeDim := num("rope.dimension_count", false, big)
	// Expert counts: required for qwen3moe; a llama file has experts only if
	// llama.expert_count is there and not 0 (some converters write 0 for a
	// dense model).
	var experts, expertsUsed, expertFF int
	if arch == "qwen3moe" || arch == "llama" {
		count := func(key string) int {
			v, ok, err := f.Uint(arch + "." + key)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !ok && arch == "qwen3moe":
				errs = append(errs, fmt.Errorf("no %s.%s", arch, key))
			case v > maxExperts:
				errs = append(errs, fmt.Errorf("%s.%s is %d, want at most %d", arch, key, v, maxExperts))
			}
			return int(min(v, maxExperts+1))
		}
		experts, expertsUsed = count("expert_count"), count("expert_used_count")
		if arch == "qwen3moe" || experts > 0 {
			expertFF = num("expert_feed_forward_length", false, big)
		}
	}
	window := 0
	if arch == "mistral" || arch == "gemma2" {
		window = num("attention.sliding_window", false, 1<<30)
	}
	swaPeriod := 2 // gemma2's default sliding_window_pattern
	if arch == "gemma2" {
		if _, ok := f.Value("gemma2.attention.sliding_window_pattern"); ok {
			swaPeriod = num("attention.sliding_window_pattern", false, 4096)
		}
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if eps, ok, err := f.Float(arch + ".attention.layer_norm_rms_epsilon"); err != nil {
		return Config{}, err
	} else if !ok {
		return Config{}, fmt.Errorf("no %s.attention.layer_norm_rms_epsilon", arch)
	} else if !(eps > 0) || eps > 1 {
		return Config{}, fmt.Errorf("%s.attention.layer_norm_rms_epsilon is %v, want a small positive number", arch, eps)
	} else {
		c.RMSNormEps = eps
	}
	if th, ok, err := f.Float(arch + ".rope.freq_base"); err != nil {
		return Config{}, err
	} else if ok {
		if !(th > 0) || math.IsInf(th, 0) {
			return Config{}, fmt.Errorf("%s.rope.freq_base is %v, want a positive number", arch, th)
		}
		c.RopeTheta = th
	}
	if c.HiddenSize%c.Heads != 0 && keyLen == 0 {
		return Config{}, fmt.Errorf("%s.embedding_length %d is not a multiple of %s.attention.head_count %d (and there is no attention.key_length)",
			arch, c.HiddenSize, arch, c.Heads)
	}
	c.HeadDim = c.HiddenSize / c.Heads
	if keyLen != 0 {
		c.HeadDim = keyLen
	}
	if valLen != 0 && valLen != c.HeadDim {
		return Config{}, fmt.Errorf("%s.attention.value_length %d differs from the key length %d; not supported", arch, valLen, c.HeadDim)
	}
	if ropeDim != 0 && ropeDim != c.HeadDim {
		if ropeDim > c.HeadDim || ropeDim%2 != 0 {
			return Config{}, fmt.Errorf("%s.rope.dimension_count %d: want an even number up to the head dimension %d", arch, ropeDim, c.HeadDim)
		}
		c.RopeDim = ropeDim // partial rotary embeddings
	}
	if c.HeadDim%2 != 0 {
		return Config{}, fmt.Errorf("the head dimension %d is odd (RoPE rotates pairs)", c.HeadDim)
	}
	if c.Heads%c.KVHeads != 0 {
		return Config{}, fmt.Errorf("%s.attention.head_count %d is not a multiple of %s.attention.head_count_kv %d", arch, c.Heads, arch, c.KVHeads)
	}
	if typ, ok, err := f.String(arch + ".rope.scaling.type"); err != nil {
		return Config{}, err
	} else if ok && typ != "none" {
		if typ != "linear" {
			return Config{}, fmt.Errorf("%s.rope.scaling.type %q is not supported; want none or linear", arch, typ)
		}
		factor, _, err := f.Float(arch + ".rope.scaling.factor")
		if err != nil {
			return Config{}, err
		}
		if !(factor > 0) {
			return Config{}, fmt.Errorf("%s.rope.scaling.factor is %v, want a positive number", arch, factor)
		}
		c.RopeScaling = &RopeScaling{Type: "linear", Factor: factor}
	}
	c.SlidingWindow = window
	if experts > 0 || arch == "qwen3moe" {
		if err := ggufExperts(&c, arch, experts, expertsUsed, expertFF); err != nil {
			return Config{}, err
		}
	}
	switch arch {
	case "gemma2":
		if err := ggufGemma2(f, &c); err != nil {
			return Config{}, err
		}
		c.SlidingLayers = swaPattern(c.Layers, swaPeriod)
	case "gemma3":
		if err := ggufGemma3(f, &c); err != nil {
			return Config{}, err
		}
	case "phi3":
		if err := ggufPhi3(f, &c); err != nil {
			return Config{}, err
		}
	}
	if v, ok, err := f.Uint(arch + ".vocab_size"); err != nil {
		return Config{}, err
	} else if ok {
		c.VocabSize = int(min(v, math.MaxInt32))
	} else if toks, ok := f.Value("tokenizer.ggml.tokens"); ok {
		if s, isStrs := toks.([]string); isStrs {
			c.VocabSize = len(s)
		}
	}
	if c.VocabSize == 0 {
		if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 {
			c.VocabSize = int(min(t.Dims[1], math.MaxInt32))
		}
	}
	if c.VocabSize <= 0 {
		return Config{}, fmt.Errorf("no vocabulary size: no %s.vocab_size, tokenizer.ggml.tokens or token_embd.weight", arch)
	}
	if v, ok, err := f.Uint("tokenizer.ggml.bos_token_id"); err != nil {
		return Config{}, err
	} else if ok {
		c.BOS = int32(min(v, math.MaxInt32))
	}
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		v, ok, err := f.Uint(k)
		if err != nil {
			return Config{}, err
		}
		if ok {
			if v >= uint64(c.VocabSize) {
				return Config{}, fmt.Errorf("%s %d is outside the vocabulary [0, %d)", k, v, c.VocabSize)
			}
			c.EOS = mergeIDs(c.EOS, []int32{int32(v)})
		}
	}
	if c.BOS >= int32(c.VocabSize) {
		return Config{}, fmt.Errorf("tokenizer.ggml.bos_token_id %d is outside the vocabulary [0, %d)", c.BOS, c.VocabSize)
	}
	return c, nil
}

// ggufExperts sets the mixture-of-experts fields of c from a GGUF file's
// {arch}.expert_count, expert_used_count and expert_feed_forward_length
// (absent: feed_forward_length / expert_used_count, llama.cpp's default for
// qwen3moe; a llama file's experts are as wide as feed_forward_length, as
// llama.cpp's llama architecture reads Mixtral's). llama.cpp's qwen3moe and
// llama always renormalise the chosen experts' weights (build_moe_ffn with
// norm_w).
func ggufExperts(c *Config, arch string, experts, used, ff int) error {
	c.Experts, c.ExpertsUsed, c.NormTopK = experts, used, true
	switch {
	case arch == "llama":
		c.ExpertIntermediate = c.IntermediateSize
	case ff != 0:
		c.ExpertIntermediate = ff
	case used > 0:
		c.ExpertIntermediate = c.IntermediateSize / used
	}
	if c.IntermediateSize == 0 {
		c.IntermediateSize = c.ExpertIntermediate
	}
	if err := checkExperts(c); err != nil {
		return fmt.Errorf("%s: %w", arch, err)
	}
	return nil
}

// ggufGemma2 sets the Gemma2 fields of c as llama.cpp's gemma2 reads them
// (src/models/gemma2.cpp): sliding window 4096 unless
// gemma2.attention.sliding_window says otherwise (in the layers ggufConfig
// sets from the sliding_window_pattern), soft-capping from
// gemma2.attn_logit_softcapping and gemma2.final_logit_softcapping (both
// required: llama.cpp divides by them), and the attention scale
// 1/√head_dim — 1/√(embedding_length/head_count) for the 46-layer 27B
// model, whose query_pre_attn_scalar is not its head_dim (llama.cpp's rule,
// from gemma_pytorch's config). The RMSNorm gains are read as stored (the
// converter added 1).
//
// With f nil it only derives the attention scale (gemma2Exportable).
func ggufGemma2(f *gguf.File, c *Config) error {
	c.EmbedScale, c.GeluTanh, c.PostNorms = true, true, true
	if c.SlidingWindow == 0 {
		c.SlidingWindow = 4096
	}
	d := c.HeadDim
	if c.Layers == 46 {
		d = c.HiddenSize / c.Heads
	}
	c.QueryScale = float64(1 / float32(math.Sqrt(float64(float32(d)))))
	if f == nil {
		return nil
	}
	for _, k := range []struct {
		key string
		dst *float64
	}{{"gemma2.attn_logit_softcapping", &c.AttnSoftcap}, {"gemma2.final_logit_softcapping", &c.FinalSoftcap}} {
		v, ok, err := f.Float(k.key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no %s", k.key)
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s is %v, want a positive number", k.key, v)
		}
		*k.dst = v
	}
	return nil
}

// loadGGUF loads a GGUF file (version 2 or 3), memory-mapped: the
// configuration from its metadata (ggufConfig), the tokenizer through
// opts.LoadGGUFTokenizer (from tokenizer.ggml.*; none if that is nil or
// the file has no tokenizer.ggml.model), and the tensors with llama.cpp's
// names: token_embd, output_norm, output (absent: tied to token_embd),
// rope_freqs (optional), and blk.N.{attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down} with attn_q/k/v
// biases for qwen2 (and optionally for llama and qwen3), attn_q_norm and
// attn_k_norm ([head_dim]) for qwen3 and gemma3, post_attention_norm and
// post_ffw_norm for gemma2 and gemma3, a fused blk.N.attn_qkv ([q; k; v]
// rows) in place of attn_q, attn_k and attn_v for any architecture (phi3's
// converter writes it), for phi3 an ffn_up of [gate; up] rows without
// ffn_gate, and for a mixture of experts (qwen3moe, or llama with
// llama.expert_count) ffn_gate_inp and the stacked ffn_gate_exps,
// ffn_up_exps and ffn_down_exps instead of ffn_gate, ffn_up and ffn_down
// (ggufExperts). Matrices may be F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K; norms and biases F32, F16
// or BF16.
//
// It returns an error, never panics, for a file that gguf.Parse refuses
// (truncated, wrong magic or version, bad counts, types, shapes or data
// ranges), an unsupported architecture or configuration, a missing tensor,
// a tensor of an unsupported type or of a shape other than the
// configuration implies, and tensors the configuration does not use.
func loadGGUF(path string, opts Options) (_ *Model, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	data, release, err := mapFile(fh, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	w := &weights{ggufRelease: release}
	w.refs.Store(1)
	defer func() {
		if err != nil {
			_ = w.release()
		}
	}()
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", path, err)
	}
	cfg, err := ggufConfig(f)
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", path, err)
	}
	w.cfg = cfg
	if err := checkOptions(&w.cfg, &opts); err != nil {
		return nil, err
	}
	var tok model.Tokenizer
	if _, has := f.Value("tokenizer.ggml.model"); has && opts.LoadGGUFTokenizer != nil {
		t, err := opts.LoadGGUFTokenizer(f)
		if err != nil {
			return nil, fmt.Errorf("llama: %s: tokenizer: %w", path, err)
		}
		tok = t
	}
	if err := w.fromGGUF(f); err != nil {
		return nil, fmt.Errorf("llama: %s: %w", path, err)
	}
	if w.cfg.GeluTanh {
		w.geluTab = geluTableGGML()
	}
	w.digest = ggufDigest(data, f)
	return newModel(w, tok, path, opts)
}

// fromGGUF fills w's tensors from f (w.cfg set).
func (w *weights) fromGGUF(f *gguf.File) error {
	cfg := &w.cfg
	used := map[string]bool{}
	get := func(name string, matrix bool, shape ...int) (*tensor, error) {
		ti, ok := f.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("tensor %q %w in the file", name, errNotFound)
		}
		used[name] = true
		// GGUF dimensions are innermost first.
		dims := make([]int, len(ti.Dims))
		for i, d := range ti.Dims {
			dims[len(dims)-1-i] = int(d)
		}
		if !slices.Equal(dims, shape) {
			return nil, fmt.Errorf("tensor %q has shape %v, but the metadata implies %v", name, dims, shape)
		}
		switch ti.Type {
		case gguf.F32:
			return newTensor(name, F32, shape, ti.Data)
		case gguf.F16:
			return newTensor(name, F16, shape, ti.Data)
		case gguf.BF16:
			return newTensor(name, BF16, shape, ti.Data)
		}
		if matrix {
			if e, _ := quantBlock(ti.Type); e != 0 {
				return newQuantTensor(name, ti.Type, shape, ti.Data)
			}
		}
		want := "F32, F16 or BF16"
		if matrix {
			var names []string
			for _, t := range ggufMatrixTypes {
				names = append(names, t.String())
			}
			want = strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("tensor %q has type %s, which pdserve does not compute with (want %s)", name, ti.Type, want)
	}
	vec := func(name string, n int, optional bool) ([]float32, error) {
		if _, ok := f.Tensor(name); !ok && optional {
			return nil, nil
		}
		t, err := get(name, false, n)
		if err != nil {
			return nil, err
		}
		return t.Float32(), nil
	}
	H, D, I := cfg.HiddenSize, cfg.HeadDim, cfg.IntermediateSize
	qDim, kvDim := cfg.Heads*D, cfg.KVHeads*D
	var err error
	if w.embed, err = get("token_embd.weight", true, cfg.VocabSize, H); err != nil {
		return err
	}
	if w.norm, err = vec("output_norm.weight", H, false); err != nil {
		return err
	}
	if _, ok := f.Tensor("output.weight"); ok {
		if w.lmHead, err = get("output.weight", true, cfg.VocabSize, H); err != nil {
			return err
		}
	} else {
		cfg.TieEmbeddings = true
		w.lmHead = w.embed
	}
	if rf, err := vec("rope_freqs.weight", cfg.ropeDims()/2, true); err != nil {
		return err
	} else if rf != nil {
		cfg.RopeFactors = make([]float64, len(rf))
		for i, v := range rf {
			if !(v > 0) {
				return fmt.Errorf("tensor \"rope_freqs.weight\" holds %v, want positive factors", v)
			}
			cfg.RopeFactors[i] = float64(v)
		}
	}
	if cfg.Architecture == archPhi3 {
		if err := w.phi3LongRope(f, vec); err != nil {
			return err
		}
	}
	_, qb := f.Tensor("blk.0.attn_q.bias")
	cfg.QKVBias = cfg.Architecture == archQwen2 || qb
	_, cfg.OBias = f.Tensor("blk.0.attn_output.bias")
	w.layers = make([]layer, cfg.Layers)
	for i := range w.layers {
		ly := &w.layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		mat := func(dst **tensor, name string, rows, cols int) {
			if err == nil {
				*dst, err = get(p+name+".weight", true, rows, cols)
			}
		}
		v := func(dst *[]float32, name string, n int) {
			if err == nil {
				*dst, err = vec(p+name, n, false)
			}
		}
		v(&ly.attnNorm, "attn_norm.weight", H)
		v(&ly.mlpNorm, "ffn_norm.weight", H)
		if cfg.PostNorms {
			v(&ly.attnPostNorm, "post_attention_norm.weight", H)
			v(&ly.mlpPostNorm, "post_ffw_norm.weight", H)
		}
		if _, fused := f.Tensor(p + "attn_qkv.weight"); fused {
			// One [q; k; v] matrix (llama.cpp's create_tensor_qkv accepts
			// it for every architecture; phi3's converter writes it).
			var qkv *tensor
			mat(&qkv, "attn_qkv", qDim+2*kvDim, H)
			if err == nil {
				s := splitRows(qkv, []int{qDim, kvDim, kvDim}, []string{"[q]", "[k]", "[v]"})
				ly.q, ly.k, ly.v = s[0], s[1], s[2]
			}
		} else {
			mat(&ly.q, "attn_q", qDim, H)
			mat(&ly.k, "attn_k", kvDim, H)
			mat(&ly.v, "attn_v", kvDim, H)
		}
		mat(&ly.o, "attn_output", H, qDim)
		if cfg.Experts > 0 {
			if err == nil {
				err = w.ggufExperts(ly, p, get)
			}
		} else if cfg.Architecture == archPhi3 {
			// phi3's ffn_up is [gate; up] (LLM_FFN_SWIGLU: silu of the
			// first half times the second).
			var gateUp *tensor
			mat(&gateUp, "ffn_up", 2*I, H)
			if err == nil {
				s := splitRows(gateUp, []int{I, I}, []string{"[gate]", "[up]"})
				ly.gate, ly.up = s[0], s[1]
			}
			mat(&ly.down, "ffn_down", H, I)
		} else {
			mat(&ly.gate, "ffn_gate", I, H)
			mat(&ly.up, "ffn_up", I, H)
			mat(&ly.down, "ffn_down", H, I)
		}
		if cfg.QKVBias {
			v(&ly.qb, "attn_q.bias", qDim)
			v(&ly.kb, "attn_k.bias", kvDim)
			v(&ly.vb, "attn_v.bias", kvDim)
		}
		if cfg.OBias {
			v(&ly.ob, "attn_output.bias", H)
		}
		if cfg.QKNorm {
			v(&ly.qNorm, "attn_q_norm.weight", D)
			v(&ly.kNorm, "attn_k_norm.weight", D)
		}
		if err != nil {
			return err
		}
	}
	var extra []string
	for _, ti := range f.Tensors {
		if !used[ti.Name] {
			extra = append(extra, ti.Name)
		}
		w.bytes += int64(len(ti.Data))
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		more := ""
		if len(extra) > 3 {
			more = fmt.Sprintf(" and %d more", len(extra)-3)
			extra = extra[:3]
		}
		return fmt.Errorf("the file has tensors the %s architecture does not use: %q%s", cfg.Architecture, extra, more)
	}
	return nil
}

// ggufExperts reads the router and experts of layer ly (tensor name prefix
// p, "blk.N."): ffn_gate_inp [experts, hidden] and the stacked
// ffn_gate_exps, ffn_up_exps [experts, F, hidden] and ffn_down_exps
// [experts, hidden, F], split into one matrix per expert.
func (w *weights) ggufExperts(ly *layer, p string, get func(name string, matrix bool, shape ...int) (*tensor, error)) error {
	cfg := &w.cfg
	H, E, F := cfg.HiddenSize, cfg.Experts, cfg.ExpertIntermediate
	var err error
	if ly.router, err = get(p+"ffn_gate_inp.weight", true, E, H); err != nil {
		return err
	}
	ly.experts = make([]expert, E)
	for _, s := range []struct {
		name       string
		rows, cols int
		dst        func(ex *expert) **tensor
	}{
		{"ffn_gate_exps", F, H, func(ex *expert) **tensor { return &ex.gate }},
		{"ffn_up_exps", F, H, func(ex *expert) **tensor { return &ex.up }},
		{"ffn_down_exps", H, F, func(ex *expert) **tensor { return &ex.down }},
	} {
		t, err := get(p+s.name+".weight", true, E, s.rows, s.cols)
		if err != nil {
			return err
		}
		views, err := expertViews(t)
		if err != nil {
			return err
		}
		for e, v := range views {
			*s.dst(&ly.experts[e]) = v
		}
	}
	return nil
}

// ggufDigest hashes (SHA-256) the digest version, the file's size, its
// whole header (metadata and tensor infos) and the first and last 64 KiB of
// its data: like digestOf, a few hundred KiB that tell any two models apart.
func ggufDigest(data []byte, f *gguf.File) string {
	h := sha256.New()
	put := func(b []byte) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte(digestVersion + "-gguf"))
	put([]byte(fmt.Sprint(len(data))))
	hdr := data[:min(uint64(len(data)), f.DataOffset)]
	put(hdr)
	body := data[len(hdr):]
	put(body[:min(len(body), fingerprintBytes)])
	put(body[max(0, len(body)-fingerprintBytes):])
	return digestVersion + "-" + hex.EncodeToString(h.Sum(nil)[:12])
}

package llama

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
)

// Checkpoint file names (the Hugging Face layout).
const (
	singleFile = "model.safetensors"
	indexFile  = "model.safetensors.index.json"
)

// layer holds one decoder layer's weights (transformers' LlamaDecoderLayer).
// Linear weights are [out, in]; biases are nil when the layer has none.
type layer struct {
	attnNorm []float32 // input_layernorm [hidden]
	mlpNorm  []float32 // post_attention_layernorm [hidden] (Gemma2: pre_feedforward_layernorm)
	// Gemma2's norms of the attention and MLP outputs [hidden]
	// (post_attention_layernorm, post_feedforward_layernorm), else nil.
	attnPostNorm, mlpPostNorm []float32

	q, k, v, o     *tensor   // [heads·headDim, hidden], [kvHeads·headDim, hidden] ×2, [hidden, heads·headDim]
	qb, kb, vb, ob []float32 // biases (Qwen2: q, k, v; Llama attention_bias: all four)
	qNorm, kNorm   []float32 // per-head RMSNorm gains of q and k [headDim] (Qwen3), else nil

	gate, up, down    *tensor   // [inter, hidden] ×2, [hidden, inter]
	gateB, upB, downB []float32 // biases (Llama mlp_bias)

	// A mixture-of-experts layer's router [experts, hidden] (Qwen3-MoE's
	// mlp.gate, GGUF ffn_gate_inp) and experts (moe.go); gate, up and down
	// are then nil.
	router  *tensor
	experts []expert
}

// weights is a loaded checkpoint, shared read-only by every Model instance
// cloned from the same Load; the last Close unmaps it.
type weights struct {
	cfg    Config
	embed  *tensor   // model.embed_tokens [vocab, hidden]
	lmHead *tensor   // lm_head [vocab, hidden], or embed when tied
	norm   []float32 // model.norm [hidden]
	// geluTab is ggml's float16 gelu table (geluTableGGML) for a GGUF file
	// whose MLP is GeGLU (gemma2), else nil.
	geluTab []uint16
	layers  []layer
	digest  string
	bytes   int64 // total tensor bytes in the checkpoint
	files   []*stFile
	// ggufRelease unmaps a GGUF file (nil for safetensors checkpoints).
	ggufRelease func() error
	refs        atomic.Int64
}

// release drops one reference and unmaps the files with the last one.
func (w *weights) release() error {
	if w.refs.Add(-1) != 0 {
		return nil
	}
	var errs []error
	for _, f := range w.files {
		errs = append(errs, f.close())
	}
	if w.ggufRelease != nil {
		errs = append(errs, w.ggufRelease())
	}
	return errors.Join(errs...)
}

// tensorRef locates a tensor in one of the checkpoint's files.
type tensorRef struct {
	file *stFile
	e    *stEntry
}

// openCheckpoint opens dir/model.safetensors, or every shard listed in
// dir/model.safetensors.index.json, and indexes their tensors by name.
func openCheckpoint(dir string) (files []*stFile, byName map[string]tensorRef, err error) {
	defer func() {
		if err != nil {
			for _, f := range files {
				_ = f.close()
			}
			files = nil
		}
	}()
	single := filepath.Join(dir, singleFile)
	var weightMap map[string]string
	var shards []string
	if _, serr := os.Stat(single); serr == nil {
		shards = []string{singleFile}
	} else {
		idxPath := filepath.Join(dir, indexFile)
		raw, ierr := os.ReadFile(idxPath)
		if errors.Is(ierr, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("llama: %s has neither %s nor %s", dir, singleFile, indexFile)
		}
		if ierr != nil {
			return nil, nil, fmt.Errorf("llama: %w", ierr)
		}
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &idx); err != nil {
			return nil, nil, fmt.Errorf("llama: %s: %w", idxPath, err)
		}
		if len(idx.WeightMap) == 0 {
			return nil, nil, fmt.Errorf("llama: %s: empty weight_map", idxPath)
		}
		weightMap = idx.WeightMap
		seen := map[string]bool{}
		for _, f := range weightMap {
			if f != filepath.Base(f) || f == "" {
				return nil, nil, fmt.Errorf("llama: %s: shard name %q is not a file name in the checkpoint directory", idxPath, f)
			}
			if !seen[f] {
				seen[f] = true
				shards = append(shards, f)
			}
		}
		sort.Strings(shards)
	}
	byName = make(map[string]tensorRef)
	for _, s := range shards {
		f, err := openSafetensors(filepath.Join(dir, s))
		if err != nil {
			return files, nil, fmt.Errorf("llama: %w", err)
		}
		files = append(files, f)
		for _, n := range f.names() {
			if prev, dup := byName[n]; dup {
				return files, nil, fmt.Errorf("llama: tensor %q is in both %s and %s", n, prev.file.path, f.path)
			}
			byName[n] = tensorRef{file: f, e: f.entries[n]}
		}
	}
	for name, shard := range weightMap {
		r, ok := byName[name]
		if !ok || filepath.Base(r.file.path) != shard {
			return files, nil, fmt.Errorf("llama: %s lists tensor %q in %s, but that file does not hold it", indexFile, name, shard)
		}
	}
	return files, byName, nil
}

// loader fetches tensors by name with their expected shapes and remembers
// which ones it used.
type loader struct {
	byName map[string]tensorRef
	used   map[string]bool
}

// tensor returns the named tensor, checking its dtype and shape. Errors name
// the tensor and, for a mismatch, both shapes.
func (l *loader) tensor(name string, shape ...int) (*tensor, error) {
	r, ok := l.byName[name]
	if !ok {
		return nil, fmt.Errorf("llama: tensor %q %w in the checkpoint", name, errNotFound)
	}
	l.used[name] = true
	dt, err := parseDType(r.e.dtype)
	if err != nil {
		return nil, fmt.Errorf("llama: %s: tensor %q: %w", r.file.path, name, err)
	}
	if !slices.Equal(r.e.shape, shape) {
		return nil, fmt.Errorf("llama: %s: tensor %q has shape %v, but config.json implies %v", r.file.path, name, r.e.shape, shape)
	}
	t, err := newTensor(name, dt, shape, r.file.data[r.e.begin:r.e.end])
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", r.file.path, err)
	}
	return t, nil
}

// vector returns a 1-D tensor widened to float32.
func (l *loader) vector(name string, n int) ([]float32, error) {
	t, err := l.tensor(name, n)
	if err != nil {
		return nil, err
	}
	return t.Float32(), nil
}

// loadWeights opens the checkpoint in dir and builds the weights of cfg
// (tensor names of transformers' LlamaForCausalLM, which Qwen2, Qwen3 and
// Mistral share; Qwen3 and Gemma3 add self_attn.q_norm and k_norm
// [head_dim]; Gemma2 and Gemma3 pre_feedforward_layernorm and
// post_feedforward_layernorm; Phi3 fuses q, k and v into
// self_attn.qkv_proj and gate and up into mlp.gate_up_proj, which are
// split into row views; Qwen3-MoE replaces the MLP by mlp.gate [experts,
// hidden] and mlp.experts.E.gate_proj, up_proj [moe_intermediate, hidden]
// and down_proj [hidden, moe_intermediate], or transformers' fused
// mlp.experts.gate_up_proj and down_proj (fusedExperts); Mixtral the same
// as block_sparse_moe.gate and
// block_sparse_moe.experts.E.w1, w3 and w2). It returns an error for a missing tensor, a tensor whose dtype is
// not F32, F16 or BF16 or whose shape disagrees with cfg, and a tensor the
// configuration has no use for (e.g. biases the configuration does not
// declare), other than an ignored lm_head.weight of a tied model and the
// rotary_emb.inv_freq buffers of older checkpoints.
func loadWeights(dir string, cfg Config, rawConfig []byte) (_ *weights, err error) {
	files, byName, err := openCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	w := &weights{cfg: cfg, files: files}
	w.refs.Store(1)
	defer func() {
		if err != nil {
			_ = w.release()
		}
	}()
	l := &loader{byName: byName, used: make(map[string]bool)}
	H, D := cfg.HiddenSize, cfg.HeadDim
	qDim, kvDim := cfg.Heads*D, cfg.KVHeads*D
	if w.embed, err = l.tensor("model.embed_tokens.weight", cfg.VocabSize, H); err != nil {
		return nil, err
	}
	if w.norm, err = l.vector("model.norm.weight", H); err != nil {
		return nil, err
	}
	gemma := cfg.Architecture == archGemma2 || cfg.Architecture == archGemma3
	phi3 := cfg.Architecture == archPhi3
	if gemma {
		addOne(w.norm)
	}
	if cfg.TieEmbeddings {
		w.lmHead = w.embed
	} else if w.lmHead, err = l.tensor("lm_head.weight", cfg.VocabSize, H); err != nil {
		if errors.Is(err, errNotFound) {
			return nil, fmt.Errorf("%w (tie_word_embeddings is false, so the checkpoint needs its own classifier)", err)
		}
		return nil, err
	}
	w.layers = make([]layer, cfg.Layers)
	for i := range w.layers {
		ly := &w.layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		mat := func(dst **tensor, name string, rows, cols int) {
			if err == nil {
				*dst, err = l.tensor(p+name+".weight", rows, cols)
			}
		}
		vec := func(dst *[]float32, name string, n int) {
			if err == nil {
				*dst, err = l.vector(p+name, n)
			}
		}
		vec(&ly.attnNorm, "input_layernorm.weight", H)
		if gemma {
			vec(&ly.attnPostNorm, "post_attention_layernorm.weight", H)
			vec(&ly.mlpNorm, "pre_feedforward_layernorm.weight", H)
			vec(&ly.mlpPostNorm, "post_feedforward_layernorm.weight", H)
		} else {
			vec(&ly.mlpNorm, "post_attention_layernorm.weight", H)
		}
		if phi3 {
			// Phi3's fused projections, split into views.
			var qkv, gateUp *tensor
			mat(&qkv, "self_attn.qkv_proj", qDim+2*kvDim, H)
			mat(&gateUp, "mlp.gate_up_proj", 2*cfg.IntermediateSize, H)
			if err == nil {
				p := splitRows(qkv, []int{qDim, kvDim, kvDim}, []string{"[q]", "[k]", "[v]"})
				ly.q, ly.k, ly.v = p[0], p[1], p[2]
				p = splitRows(gateUp, []int{cfg.IntermediateSize, cfg.IntermediateSize}, []string{"[gate]", "[up]"})
				ly.gate, ly.up = p[0], p[1]
			}
		} else {
			mat(&ly.q, "self_attn.q_proj", qDim, H)
			mat(&ly.k, "self_attn.k_proj", kvDim, H)
			mat(&ly.v, "self_attn.v_proj", kvDim, H)
		}
		mat(&ly.o, "self_attn.o_proj", H, qDim)
		if cfg.Experts > 0 {
			// Qwen3MoeSparseMoeBlock: mlp.gate [experts, hidden], and
			// mlp.experts.E.{gate,up,down}_proj; MixtralSparseMoeBlock:
			// block_sparse_moe.gate and block_sparse_moe.experts.E.w1
			// (gate), w3 (up) and w2 (down).
			block, gate, up, down := "mlp.", "gate_proj", "up_proj", "down_proj"
			if cfg.Architecture == archMixtral {
				block, gate, up, down = "block_sparse_moe.", "w1", "w3", "w2"
			}
			mat(&ly.router, block+"gate", cfg.Experts, H)
			if _, fused := l.byName[p+"mlp.experts.gate_up_proj"]; fused && cfg.Architecture == archQwen3MoE {
				if err == nil {
					ly.experts, err = l.fusedExperts(p+"mlp.experts.", cfg.Experts, cfg.ExpertIntermediate, H)
				}
			} else {
				ly.experts = make([]expert, cfg.Experts)
				for e := range ly.experts {
					ex := &ly.experts[e]
					ep := fmt.Sprintf("%sexperts.%d.", block, e)
					mat(&ex.gate, ep+gate, cfg.ExpertIntermediate, H)
					mat(&ex.up, ep+up, cfg.ExpertIntermediate, H)
					mat(&ex.down, ep+down, H, cfg.ExpertIntermediate)
				}
			}
		} else if phi3 {
			mat(&ly.down, "mlp.down_proj", H, cfg.IntermediateSize)
		} else {
			mat(&ly.gate, "mlp.gate_proj", cfg.IntermediateSize, H)
			mat(&ly.up, "mlp.up_proj", cfg.IntermediateSize, H)
			mat(&ly.down, "mlp.down_proj", H, cfg.IntermediateSize)
		}
		if cfg.QKVBias {
			vec(&ly.qb, "self_attn.q_proj.bias", qDim)
			vec(&ly.kb, "self_attn.k_proj.bias", kvDim)
			vec(&ly.vb, "self_attn.v_proj.bias", kvDim)
		}
		if cfg.OBias {
			vec(&ly.ob, "self_attn.o_proj.bias", H)
		}
		if cfg.QKNorm {
			vec(&ly.qNorm, "self_attn.q_norm.weight", D)
			vec(&ly.kNorm, "self_attn.k_norm.weight", D)
		}
		if cfg.MLPBias {
			vec(&ly.gateB, "mlp.gate_proj.bias", cfg.IntermediateSize)
			vec(&ly.upB, "mlp.up_proj.bias", cfg.IntermediateSize)
			vec(&ly.downB, "mlp.down_proj.bias", H)
		}
		if err != nil {
			return nil, err
		}
		if gemma {
			// Gemma3's q_norm and k_norm are Gemma3RMSNorm too (nil for
			// Gemma2).
			for _, g := range [][]float32{ly.attnNorm, ly.attnPostNorm, ly.mlpNorm, ly.mlpPostNorm, ly.qNorm, ly.kNorm} {
				addOne(g)
			}
		}
	}
	var extra []string
	for name := range byName {
		if l.used[name] || strings.HasSuffix(name, ".rotary_emb.inv_freq") || (cfg.TieEmbeddings && name == "lm_head.weight") {
			continue
		}
		extra = append(extra, name)
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		more := ""
		if len(extra) > 3 {
			more = fmt.Sprintf(" and %d more", len(extra)-3)
			extra = extra[:3]
		}
		return nil, fmt.Errorf("llama: the checkpoint has tensors config.json (%s) does not use: %q%s", cfg.Architecture, extra, more)
	}
	for _, r := range byName {
		w.bytes += r.e.end - r.e.begin
	}
	w.digest = digestOf(rawConfig, files)
	return w, nil
}

// fusedExperts reads the experts of a checkpoint saved with
// transformers' fused layout (Qwen3MoeExperts: prefix+"gate_up_proj"
// [experts, 2·F, hidden], gate the first F rows of each expert and up the
// last F, and prefix+"down_proj" [experts, hidden, F]) as views of those
// two tensors.
func (l *loader) fusedExperts(prefix string, E, F, H int) ([]expert, error) {
	gu, err := l.tensor(prefix+"gate_up_proj", E, 2*F, H)
	if err != nil {
		return nil, err
	}
	dn, err := l.tensor(prefix+"down_proj", E, H, F)
	if err != nil {
		return nil, err
	}
	guv, err := expertViews(gu)
	if err != nil {
		return nil, err
	}
	dnv, err := expertViews(dn)
	if err != nil {
		return nil, err
	}
	out := make([]expert, E)
	for e := range out {
		out[e] = expert{gate: rowsView(guv[e], 0, F), up: rowsView(guv[e], F, 2*F), down: dnv[e]}
	}
	return out, nil
}

// rowsView returns rows [r0, r1) of a float matrix (F32, F16 or BF16) as a
// matrix of its own, a view of the same data.
func rowsView(t *tensor, r0, r1 int) *tensor {
	c := t.Cols()
	v := &tensor{Name: fmt.Sprintf("%s[%d:%d]", t.Name, r0, r1), DType: t.DType, Shape: []int{r1 - r0, c}}
	if t.DType == F32 {
		v.f32 = t.f32[r0*c : r1*c]
	} else {
		v.u16 = t.u16[r0*c : r1*c]
	}
	return v
}

// addOne adds 1 to every gain of a Gemma RMSNorm, stored as w and applied
// as 1 + w (transformers' Gemma2RMSNorm: output·(1 + weight.float())), in
// float32. The slice is the loader's own copy (vector widens it).
func addOne(g []float32) {
	for i := range g {
		g[i]++
	}
}

// digestVersion changes whenever the KV a checkpoint produces would change
// for the same files (a different forward pass or KV layout).
const digestVersion = "llama-v1"

// fingerprintBytes is how much of the start and of the end of each file's
// data the digest reads.
const fingerprintBytes = 64 << 10

// digestOf hashes (SHA-256) the configuration, and for each checkpoint file
// its name, size, header (every tensor's name, dtype, shape and offsets) and
// the first and last 64 KiB of its data. It reads a few hundred KiB, not the
// weights, yet two checkpoints that differ in configuration, layout, or
// trained values near either end of a file (any fine-tune) get different
// digests. The directory path is not part of it.
func digestOf(rawConfig []byte, files []*stFile) string {
	h := sha256.New()
	put := func(b []byte) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte(digestVersion))
	put(rawConfig)
	for _, f := range files {
		put([]byte(filepath.Base(f.path)))
		put([]byte(fmt.Sprint(f.size)))
		put(f.header)
		head := f.data[:min(len(f.data), fingerprintBytes)]
		tail := f.data[max(0, len(f.data)-fingerprintBytes):]
		put(head)
		put(tail)
	}
	return digestVersion + "-" + hex.EncodeToString(h.Sum(nil)[:12])
}

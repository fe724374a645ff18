package llama

import "math"

// Rotary position embedding (RoPE: Su et al., "RoFormer: Enhanced
// Transformer with Rotary Position Embedding", 2021), in the Hugging Face
// "rotate half" layout of transformers' modeling_llama.py: within a head of
// dimension d, element i < d/2 is paired with element i + d/2 and the pair is
// rotated by the angle pos·invFreq[i]:
//
//	x'[i]       = x[i]·cos − x[i+d/2]·sin
//	x'[i+d/2]   = x[i+d/2]·cos + x[i]·sin
//
// Meta and llama2.c checkpoints rotate interleaved pairs (x[2i], x[2i+1])
// instead; converting them permutes the rows of wq and wk (see package
// llama2c), after which both give the same function.

// ropeDims returns the dimensions of each head that RoPE rotates: RopeDim,
// or all of HeadDim.
func (c *Config) ropeDims() int {
	if c.RopeDim > 0 {
		return c.RopeDim
	}
	return c.HeadDim
}

// ropeInvFreq returns the inverse frequencies invFreq[i], i < d/2, of cfg
// (d the rotated dimensions, cfg.ropeDims()): base^(−2i/d) (transformers'
// _compute_default_rope_parameters) adjusted by rope_scaling.
//
// "linear" divides every frequency by factor (the same as dividing the
// positions: Chen et al., "Extending Context Window of Large Language Models
// via Positional Interpolation", 2023). "llama3" is transformers'
// _compute_llama3_parameters (Meta's Llama 3.1 release): with wavelength
// λ = 2π/f, L = original_max_position_embeddings, frequencies with
// λ < L/high_freq_factor are kept, those with λ > L/low_freq_factor are
// divided by factor, and the ones between are interpolated with
// s = (L/λ − low_freq_factor)/(high_freq_factor − low_freq_factor):
// f' = (1−s)·f/factor + s·f. RopeFactors (a GGUF file's rope_freqs tensor,
// llama.cpp's form of the llama3 scaling) divide the frequencies.
func ropeInvFreq(cfg *Config) []float64 {
	rd := cfg.ropeDims()
	inv := make([]float64, rd/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(cfg.RopeTheta, float64(2*i)/float64(rd))
		if cfg.RopeFactors != nil {
			inv[i] /= cfg.RopeFactors[i]
		}
	}
	s := cfg.RopeScaling
	if s == nil {
		return inv
	}
	switch s.Type {
	case "linear":
		for i := range inv {
			inv[i] /= s.Factor
		}
	case "llama3":
		L := float64(s.OriginalMaxPositions)
		lowWave := L / s.LowFreqFactor   // longer wavelengths are scaled fully
		highWave := L / s.HighFreqFactor // shorter wavelengths are kept
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / s.Factor
			default:
				sm := (L/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				inv[i] = (1-sm)*f/s.Factor + sm*f
			}
		}
	}
	return inv
}

// ropeTable fills cos and sin ([len(pos), len(invFreq)]) with the rotation of
// each position: angle pos[t]·invFreq[i], computed in float64 and rounded.
func ropeTable(cos, sin []float32, pos []int32, invFreq []float64) {
	half := len(invFreq)
	for t, p := range pos {
		for i, f := range invFreq {
			s, c := math.Sincos(float64(p) * f)
			cos[t*half+i] = float32(c)
			sin[t*half+i] = float32(s)
		}
	}
}

// ropeTableGGML fills cos and sin ([len(pos), d/2], d = cfg.ropeDims()) as
// ggml's rope_cache_init does (ggml-cpu ops.cpp) for llama.cpp's models:
// with s = powf(base, −2/d) (d is ggml's n_dims), the angle of pair i at position p is
// θ_i / factor_i with θ_0 = p and θ_{i+1} = θ_i·s in float32 arithmetic,
// times 1/linear factor, and its cosine and sine computed in float64 and
// rounded to float32 (ggml calls glibc's cosf and sinf, which are not
// correctly rounded: about 1% of a table's values differ in the last bit).
func ropeTableGGML(cos, sin []float32, pos []int32, cfg *Config) {
	rd := cfg.ropeDims()
	half := rd / 2
	scale := float32(math.Pow(float64(float32(cfg.RopeTheta)), float64(float32(-2)/float32(rd))))
	freqScale := float32(1)
	if s := cfg.RopeScaling; s != nil && s.Type == "linear" {
		freqScale = float32(1 / s.Factor)
	}
	for t, p := range pos {
		theta := float32(p)
		for i := range half {
			a := theta
			if cfg.RopeFactors != nil {
				a = theta / float32(cfg.RopeFactors[i])
			}
			a *= freqScale
			cos[t*half+i] = float32(math.Cos(float64(a)))
			sin[t*half+i] = float32(math.Sin(float64(a)))
			theta *= scale
		}
	}
}

// applyRope rotates the first rotDim dimensions of every head of x ([T,
// heads, headDim], row-major) in place by the angles of its token: cos and
// sin are [T, rotDim/2] (see ropeTable). Pair i < rotDim/2 is (x[i],
// x[i+rotDim/2]), or with interleaved (x[2i], x[2i+1]) — Meta's layout,
// and llama.cpp's for its llama architecture (rope_norm in ggml-cpu's
// ops.cpp). Dimensions from rotDim on are left as they are (partial
// rotary embeddings; ggml's n_dims < ne0).
func applyRope(x []float32, T, heads, headDim, rotDim int, cos, sin []float32, interleaved bool) {
	half := rotDim / 2
	if interleaved {
		for t := range T {
			c := cos[t*half : (t+1)*half]
			s := sin[t*half : (t+1)*half]
			row := x[t*heads*headDim : (t+1)*heads*headDim]
			for h := range heads {
				v := row[h*headDim : (h+1)*headDim]
				for i := range half {
					a, b := v[2*i], v[2*i+1]
					v[2*i] = a*c[i] - b*s[i]
					v[2*i+1] = b*c[i] + a*s[i]
				}
			}
		}
		return
	}
	for t := range T {
		c := cos[t*half : (t+1)*half]
		s := sin[t*half : (t+1)*half]
		row := x[t*heads*headDim : (t+1)*heads*headDim]
		for h := range heads {
			lo := row[h*headDim : h*headDim+half]
			hi := row[h*headDim+half : h*headDim+rotDim]
			for i := range half {
				a, b := lo[i], hi[i]
				lo[i] = a*c[i] - b*s[i]
				hi[i] = b*c[i] + a*s[i]
			}
		}
	}
}

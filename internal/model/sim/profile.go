package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/model"
)

// Profile is a GPU-like latency model for the simulated model: the time of
// one forward step as a function of its batch, from a roofline estimate of
// a real GPU running a real model, so that PD versus colocated comparisons on
// a CPU-only machine show the same interference a GPU server sees (a long
// prefill in a step stalls every decode in it).
//
// One step over a batch with P prefill tokens and D decode sequences, whose
// sequences read C cached tokens in total, takes
//
//	flops   = 2·Params·(P+D) + 4·Layers·Heads·HeadDim·A
//	bytes   = WeightBytes + KVBytesPerToken·C
//	compute = flops / (PeakFLOPS·MFU)
//	memory  = bytes / (MemBandwidth·MemEfficiency)
//	step    = max(compute, memory) + Overhead
//
// where A is the number of (query token, key token) pairs the attention of
// the step computes (causal: a chunk of n tokens after p cached ones
// contributes n·p + n·(n+1)/2). 2·Params FLOPs per token is the usual dense
// transformer estimate (Kaplan et al., "Scaling Laws for Neural Language
// Models", 2020, §2.1); 4·layers·heads·head_dim per attention pair counts
// QKᵀ and AV. Step time = max(compute, memory) is the roofline model
// (Williams, Waterman and Patterson, CACM 2009).
type Profile struct {
	Name string
	// Description says which GPU and model, and where the numbers come from.
	Description string
	// PeakFLOPS is the GPU's dense BF16 tensor throughput, FLOP/s.
	PeakFLOPS float64
	// MFU is the fraction of PeakFLOPS a compute-bound step achieves.
	MFU float64
	// MemBandwidth is the GPU's memory bandwidth, bytes/s.
	MemBandwidth float64
	// MemEfficiency is the fraction of MemBandwidth a memory-bound step achieves.
	MemEfficiency float64
	// Overhead is added to every step (kernel launches, scheduling).
	Overhead time.Duration
	// Params is the model's parameter count; WeightBytes its weights' size.
	Params      float64
	WeightBytes float64
	// Layers, Heads and HeadDim size the attention FLOPs.
	Layers, Heads, HeadDim int
	// KVBytesPerToken is the KV cache read per cached token per step.
	KVBytesPerToken float64
}

// llama3_8B holds Meta-Llama-3-8B's shape (its config.json: 32 layers,
// 32 attention heads of dim 128, 8 KV heads, 8.03 B parameters, bf16).
func llama3_8B(p Profile) Profile {
	p.Params = 8.03e9
	p.WeightBytes = 2 * 8.03e9
	p.Layers, p.Heads, p.HeadDim = 32, 32, 128
	p.KVBytesPerToken = 32 * 2 * 8 * 128 * 2 // 128 KiB
	return p
}

// Profiles returns the built-in profiles by name. The GPU figures are
// NVIDIA's datasheet numbers (H100 SXM5: 989 TFLOP/s dense BF16, 3.35 TB/s
// HBM3; A100 SXM4 80 GB: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e). MFU 0.6
// and memory efficiency 0.85 are typical of well-tuned inference kernels;
// with them the H100 profile gives ~28 ms to prefill 1,000 tokens and ~6 ms
// per decode step at small batch, in line with published vLLM figures for
// Llama-3-8B on one H100.
func Profiles() map[string]Profile {
	return map[string]Profile{
		"h100-llama3-8b": llama3_8B(Profile{Name: "h100-llama3-8b",
			Description: "Llama-3-8B (bf16) on one NVIDIA H100 SXM5: 989 TFLOP/s, 3.35 TB/s",
			PeakFLOPS:   989e12, MFU: 0.6, MemBandwidth: 3.35e12, MemEfficiency: 0.85,
			Overhead: 500 * time.Microsecond}),
		"a100-llama3-8b": llama3_8B(Profile{Name: "a100-llama3-8b",
			Description: "Llama-3-8B (bf16) on one NVIDIA A100 SXM4 80GB: 312 TFLOP/s, 2.039 TB/s",
			PeakFLOPS:   312e12, MFU: 0.6, MemBandwidth: 2.039e12, MemEfficiency: 0.85,
			Overhead: 500 * time.Microsecond}),
	}
}

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	var names []string
	for n := range Profiles() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupProfile returns the built-in profile name, or an error listing the
// known ones.
func LookupProfile(name string) (Profile, error) {
	p, ok := Profiles()[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown sim profile %q (known: %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}

// StepTime is the profile's time for one forward over seqs (see Profile).
func (p Profile) StepTime(seqs []model.SeqInput) time.Duration {
	var tokens, cached, pairs float64
	for i := range seqs {
		n, pos := float64(len(seqs[i].Tokens)), float64(seqs[i].Pos)
		tokens += n
		cached += pos + n
		pairs += n*pos + n*(n+1)/2
	}
	if tokens == 0 {
		return 0
	}
	flops := 2*p.Params*tokens + 4*float64(p.Layers*p.Heads*p.HeadDim)*pairs
	bytes := p.WeightBytes + p.KVBytesPerToken*cached
	compute := flops / (p.PeakFLOPS * p.MFU)
	memory := bytes / (p.MemBandwidth * p.MemEfficiency)
	return time.Duration(max(compute, memory)*float64(time.Second)) + p.Overhead
}

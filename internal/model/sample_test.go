package model

import (
	"math"
	"testing"
)

func TestSampleGreedyAndLogprob(t *testing.T) {
	logits := []float32{1, 3, 3, -2}
	tok, lp := Sample(logits, SamplingParams{TopP: 1}, 0, nil)
	if tok != 1 {
		t.Fatalf("greedy picked %d, want the lowest id among the maxima (1)", tok)
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	if want := 3 - math.Log(z); math.Abs(float64(lp)-want) > 1e-6 {
		t.Fatalf("logprob %v, want %v", lp, want)
	}
}

func TestSampleDeterministicAndDistributed(t *testing.T) {
	logits := []float32{0, 1, 2, 0.5}
	p := SamplingParams{Temperature: 1, TopP: 1, Seed: 42}
	counts := make([]int, len(logits))
	for step := 0; step < 20000; step++ {
		a, _ := Sample(logits, p, step, nil)
		b, _ := Sample(logits, p, step, nil)
		if a != b {
			t.Fatalf("step %d: %d then %d for the same seed", step, a, b)
		}
		counts[a]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	for i, c := range counts {
		want := math.Exp(float64(logits[i])) / z
		if got := float64(c) / 20000; math.Abs(got-want) > 0.02 {
			t.Fatalf("token %d drawn %.3f of the time, want %.3f", i, got, want)
		}
	}
	// top_p keeps only the smallest set reaching p: here token 2 alone.
	for step := 0; step < 1000; step++ {
		if tok, _ := Sample(logits, SamplingParams{Temperature: 1, TopP: 0.5, Seed: 1}, step, nil); tok != 2 {
			t.Fatalf("top_p 0.5 drew %d", tok)
		}
	}
	// top_k 2 keeps tokens 2 and 1.
	for step := 0; step < 1000; step++ {
		if tok, _ := Sample(logits, SamplingParams{Temperature: 1, TopP: 1, TopK: 2, Seed: 1}, step, nil); tok != 2 && tok != 1 {
			t.Fatalf("top_k 2 drew %d", tok)
		}
	}
}

func TestFingerprintMismatch(t *testing.T) {
	a := Fingerprint{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16", PageSize: 16}
	if a.Mismatch(a) != "" {
		t.Fatal("equal fingerprints mismatch")
	}
	b := a
	b.PageSize, b.DType = 32, "f32"
	if got := a.Mismatch(b); got != "dtype bf16 vs f32, page_size 16 vs 32" {
		t.Fatalf("mismatch %q", got)
	}
}

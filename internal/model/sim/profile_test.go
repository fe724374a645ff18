package sim

import (
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/model"
)

func within(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %s, want in [%s, %s]", what, got, lo, hi)
	}
}

// TestH100Profile checks the profile against hand-computed roofline values
// (see Profile's formula) and the properties a PD comparison relies on.
func TestH100Profile(t *testing.T) {
	p, err := LookupProfile("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	// Prefill of 1,000 tokens is compute-bound: 2·8.03e9·1000 FLOPs plus
	// attention 4·32·32·128·500500 FLOPs, at 989e12·0.6 FLOP/s ≈ 27.1 ms + 0.5 ms.
	prefill := p.StepTime([]model.SeqInput{{Tokens: make([]int32, 1000)}})
	within(t, "prefill 1000", prefill, 27*time.Millisecond, 28500*time.Microsecond)
	// One decode step at batch 1, 1,000 cached tokens, is memory-bound:
	// (16.06e9 + 131072·1001) bytes at 3.35e12·0.85 B/s ≈ 5.69 ms + 0.5 ms.
	decode1 := p.StepTime([]model.SeqInput{{Pos: 1000, Tokens: []int32{1}}})
	within(t, "decode b=1", decode1, 6*time.Millisecond, 6400*time.Microsecond)
	// A batch of 32 decodes costs far less than 32 single steps...
	batch := make([]model.SeqInput, 32)
	for i := range batch {
		batch[i] = model.SeqInput{Pos: 1000, Tokens: []int32{1}}
	}
	decode32 := p.StepTime(batch)
	if decode32 > 3*decode1 {
		t.Errorf("decode b=32 %s vs b=1 %s: batching should be nearly free", decode32, decode1)
	}
	// ...but a prefill chunk mixed into a decode step stalls every decode in it.
	prefill2k := p.StepTime([]model.SeqInput{{Tokens: make([]int32, 2000)}})
	mixed := p.StepTime(append(batch, model.SeqInput{Tokens: make([]int32, 2000)}))
	if mixed < prefill2k || mixed < 5*decode32 {
		t.Errorf("mixed step %s vs decode-only %s and prefill alone %s: the prefill should stall the decodes",
			mixed, decode32, prefill2k)
	}
	if _, err := LookupProfile("tpu"); err == nil {
		t.Error("unknown profile accepted")
	}
}

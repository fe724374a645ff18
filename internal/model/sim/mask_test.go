package sim

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
)

// TestMaskedLogits: under a mask, every allowed printable byte is a live
// candidate (a structure byte like '"' is drawn where text competes with
// it), no token outside the mask is drawn, EOS is drawn where the mask
// allows only it even before MinOutput, and without a mask the same
// sequences draw as before (only text tokens and EOS).
func TestMaskedLogits(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	p := newPool(t, geoSmall, 4, 64)
	prompt := []int32{'h', 'i', ' ', 't', 'h', 'e', 'r', 'e'}
	pages := alloc(t, p, 3)
	prefill(t, m, p, pages, prompt, nil, model.SamplingParams{TopP: 1})
	maskOf := func(ids ...byte) []uint64 {
		mk := make([]uint64, (VocabSize+63)/64)
		for _, id := range ids {
			mk[id/64] |= 1 << (id % 64)
		}
		return mk
	}
	draw := func(mask []uint64, step int, seed uint64) int32 {
		t.Helper()
		var out [1]model.SeqOutput
		seq := model.SeqInput{Pages: pages, Pos: len(prompt) - 1, Tokens: prompt[len(prompt)-1:], Sample: true,
			Sampling: model.SamplingParams{Temperature: 1, TopP: 1, Seed: seed}, Step: step, Mask: mask}
		if err := m.Forward(context.Background(), p, []model.SeqInput{seq}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0].Token
	}
	// A string's choice: a letter or the closing quote, both live (without
	// the mask's logits the quote, at offLogit, would never be drawn).
	quotes := 0
	for seed := range uint64(400) {
		switch tok := draw(maskOf('a', '"'), 0, seed); tok {
		case '"':
			quotes++
		case 'a':
		default:
			t.Fatalf("seed %d drew %d, outside the mask", seed, tok)
		}
	}
	if quotes < 4 || quotes > 396 {
		t.Fatalf("'\"' drawn %d times in 400 against one letter: want both drawn", quotes)
	}
	// Only EOS allowed, at step 0 (< MinOutput, where EOS is banned).
	eosOnly := make([]uint64, (VocabSize+63)/64)
	eosOnly[EOS/64] |= 1 << (EOS % 64)
	for seed := range uint64(20) {
		if tok := draw(eosOnly, 0, seed); tok != EOS {
			t.Fatalf("seed %d drew %d where only EOS is allowed", seed, tok)
		}
	}
	// No mask: a structure byte keeps its off logit.
	for seed := range uint64(400) {
		if tok := draw(nil, 0, seed); tok == '"' || tok == EOS {
			t.Fatalf("seed %d drew %d without a mask", seed, tok)
		}
	}
}

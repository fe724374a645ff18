//go:build race

package llama_test

// raceEnabled: the race detector slows Go loops several times, so the heavy
// tests shrink (see TestSyntheticSmolLM2PD).
const raceEnabled = true

package llama_test

import "github.com/pdserve/pdserve/internal/testbin"

// raceEnabled: the race detector slows Go loops several times, so the heavy
// tests shrink (see TestSyntheticSmolLM2PD).
const raceEnabled = testbin.RaceEnabled

package lifecycle

import "github.com/pdserve/pdserve/internal/testbin"

// raceEnabled reports whether the tests run under the race detector, which
// slows the model checker's every step: TestModelCheck then explores
// smaller bounds (CI runs the standard ones without it).
const raceEnabled = testbin.RaceEnabled

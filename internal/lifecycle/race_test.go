//go:build race

package lifecycle

// raceEnabled reports whether the tests run under the race detector, which
// slows the model checker's every step: TestModelCheck then explores
// smaller bounds (CI runs the standard ones without it).
const raceEnabled = true

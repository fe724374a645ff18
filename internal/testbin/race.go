//go:build race

package testbin

// RaceEnabled reports whether the binary was built with the race detector.
// A test binary built with -race builds the commands it runs with -race
// too, so they reuse its race-instrumented packages from the build cache
// instead of compiling every package a second time, and the processes
// under test are checked for data races as well. Tests that shrink under
// the race detector read it too.
const RaceEnabled = true

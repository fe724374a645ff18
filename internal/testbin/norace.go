//go:build !race

package testbin

// RaceEnabled reports whether the binary was built with the race detector.
const RaceEnabled = false

//go:build race

package model

// raceEnabled reports whether the tests run under the race detector, which
// slows the randomized comparisons with the reference samplers several
// times over without finding more in their single goroutine.
const raceEnabled = true

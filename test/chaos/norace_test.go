//go:build !race

package chaos

// raceEnabled reports whether the tests run under the race detector, so
// that the reproduce command does too.
const raceEnabled = false

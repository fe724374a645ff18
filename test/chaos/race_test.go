package chaos

import "github.com/pdserve/pdserve/internal/testbin"

// raceEnabled reports whether the tests run under the race detector, so
// that the reproduce command does too.
const raceEnabled = testbin.RaceEnabled

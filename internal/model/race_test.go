package model

import "github.com/pdserve/pdserve/internal/testbin"

// raceEnabled reports whether the tests run under the race detector, which
// slows the randomized comparisons with the reference samplers several
// times over without finding more in their single goroutine.
const raceEnabled = testbin.RaceEnabled

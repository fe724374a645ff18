//go:build !unix

package llama_test

import "time"

// processCPU is unknown on this platform.
func processCPU() time.Duration { return 0 }

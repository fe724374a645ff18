//go:build !unix

package llama

import "time"

// processCPU is unknown on this platform.
func processCPU() time.Duration { return 0 }

// ProcessCPU is processCPU for the external test package.
var ProcessCPU = processCPU

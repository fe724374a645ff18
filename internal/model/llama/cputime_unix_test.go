//go:build unix

package llama

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the process has used so far:
// benchmarks report it per token because wall time on a shared machine
// depends on what else runs.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ProcessCPU is processCPU for the external test package.
var ProcessCPU = processCPU

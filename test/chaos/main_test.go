// Package chaos is pdserve's chaos suite: whole deployments (in-process and
// as OS processes) serve seeded random traffic while faults strike the KV
// channel, the network and the workers themselves, and the suite checks the
// invariants of the design (docs/architecture.md, "Invariants"):
//
//   - Liveness: every client request is answered within a bound derived
//     from the deadlines, and no request stays in a stage longer than that
//     stage's deadline allows.
//   - No leak: once the faults stop, every worker returns to zero pages,
//     zero live requests, zero pending opens and (after the tombstone TTL)
//     zero tombstones; goroutines return to baseline (goleak).
//   - Same answer: every token a client receives equals what a colocated
//     worker produces for the same request.
//   - Honest signals: at quiescence the stage gauges and the used-page gauge
//     scraped from every worker's /metrics read zero.
//
// # Running
//
//	go test -race ./test/chaos -v                       # CI size
//	go test ./test/chaos -run TestChaosInProcess -soak  # 10,000 requests
//	go test ./test/chaos -run TestChaosInProcess -seed 42 -requests 500 -clients 16
//
// Every random choice (requests, client behaviour, the chaos schedule, the
// fault streams) derives from -seed; each test prints its seed and the
// command that reproduces it. Replays use the same requests and the same
// schedule; the interleaving of goroutines still varies from run to run.
package chaos

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
	"go.uber.org/goleak"
)

var (
	flagSeed     = flag.Uint64("seed", 0, "chaos seed (0: derived from the time; printed by every test)")
	flagSoak     = flag.Bool("soak", false, "soak size: 10,000+ requests instead of the CI size")
	flagRequests = flag.Int("requests", 0, "requests per chaos test (0: the CI or -soak default)")
	flagClients  = flag.Int("clients", 0, "concurrent clients (0: the test's default)")
)

func TestMain(m *testing.M) {
	flag.Parse()
	// TestChaosInProcess runs alone first; the process tests after it
	// mostly wait on processes and timers, so four overlap instead of
	// GOMAXPROCS (unless -parallel says otherwise).
	if err := testbin.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(pdserve.RemovingAfter(m))
}

var (
	seedOnce sync.Once
	runSeed  uint64
)

// seedFor returns the run's seed and prints it with the command that
// reproduces test t. Without -v the seed is also printed on stderr, so that
// it shows even if the test binary is killed by -timeout.
func seedFor(t *testing.T) uint64 {
	t.Helper()
	seedOnce.Do(func() {
		runSeed = *flagSeed
		if runSeed == 0 {
			runSeed = uint64(time.Now().UnixNano())
		}
	})
	msg := fmt.Sprintf("chaos seed %d; reproduce with: %s", runSeed, reproduce(t, runSeed))
	if !testing.Verbose() {
		fmt.Fprintln(os.Stderr, t.Name()+": "+msg)
	}
	t.Log(msg)
	return runSeed
}

// reproduce is the command line that reruns test t with seed.
func reproduce(t *testing.T, seed uint64) string {
	race := ""
	if raceEnabled {
		race = "-race "
	}
	cmd := fmt.Sprintf("go test %s./test/chaos -run '^%s$' -seed %d -v", race, t.Name(), seed)
	if *flagSoak {
		cmd += " -soak"
	}
	if *flagRequests > 0 {
		cmd += fmt.Sprintf(" -requests %d", *flagRequests)
	}
	if *flagClients > 0 {
		cmd += fmt.Sprintf(" -clients %d", *flagClients)
	}
	return cmd
}

// sizes returns the number of requests and clients of a chaos test: the
// flags if set, else soak or CI defaults.
func sizes(ci, soak, clients int) (int, int) {
	n := ci
	if *flagSoak {
		n = soak
	}
	if *flagRequests > 0 {
		n = *flagRequests
	}
	if *flagClients > 0 {
		clients = *flagClients
	}
	return n, clients
}

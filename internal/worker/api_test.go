package worker

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model/sim"

	"github.com/pdserve/pdserve/internal/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startSim starts a colocated worker on a one-layer simulated model of
// contextLen tokens, shut down when the test ends.
func startSim(t *testing.T, contextLen int) *Worker {
	t.Helper()
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32}, ContextLen: contextLen})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Model: m, Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	t.Cleanup(func() { _ = w.Shutdown(context.Background()) })
	return w
}

// TestQueryTimeoutDoesNotRace: a query that times out while the loop is
// stuck returns false, and when the loop later runs it, its result goes
// nowhere the caller reads (run with -race).
func TestQueryTimeoutDoesNotRace(t *testing.T) {
	w := startSim(t, 64)
	release := make(chan struct{})
	w.mbox.post(item{fn: func() { <-release }}) // the loop is stuck in this
	if _, ok := w.Stats(10 * time.Millisecond); ok {
		t.Fatal("Stats answered while the loop was stuck")
	}
	if _, ok := w.Requests(10 * time.Millisecond); ok {
		t.Fatal("Requests answered while the loop was stuck")
	}
	close(release) // the queued queries now run; their results are dropped
	st, ok := w.Stats(5 * time.Second)
	if !ok || st.Live != 0 {
		t.Fatalf("after release: %+v %v", st, ok)
	}
}

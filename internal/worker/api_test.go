package worker

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/outcome"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOutcomeError maps every outcome to its HTTP status, carrying the
// outcome as the error code.
func TestOutcomeError(t *testing.T) {
	want := map[outcome.Outcome]int{
		outcome.OK:               http.StatusInternalServerError, // never an error; listed for completeness
		outcome.AbortedClient:    openai.StatusClientClosedRequest,
		outcome.AbortedPeer:      http.StatusBadGateway,
		outcome.TimeoutBootstrap: http.StatusGatewayTimeout,
		outcome.TimeoutQueue:     http.StatusServiceUnavailable,
		outcome.TimeoutKVHold:    http.StatusGatewayTimeout,
		outcome.TimeoutTransfer:  http.StatusGatewayTimeout,
		outcome.TimeoutRequest:   http.StatusGatewayTimeout,
		outcome.LeaseExpired:     http.StatusBadGateway,
		outcome.PeerLost:         http.StatusBadGateway,
		outcome.FailedTransfer:   http.StatusBadGateway,
		outcome.RejectedInvalid:  http.StatusBadRequest,
		outcome.RejectedCapacity: http.StatusBadRequest,
		outcome.FailedInternal:   http.StatusInternalServerError,
		outcome.Shutdown:         http.StatusServiceUnavailable,
	}
	if len(want) != len(outcome.Worker()) {
		t.Fatalf("table covers %d outcomes, there are %d", len(want), len(outcome.Worker()))
	}
	for _, o := range outcome.Worker() {
		e := OutcomeError(o, "why")
		if e.Status != want[o] || e.Code != o.String() || e.Message != "why" {
			t.Errorf("%s: got %d %q %q, want %d", o, e.Status, e.Code, e.Message, want[o])
		}
		if (e.Status < 500) != (e.Type == openai.TypeInvalidRequest) {
			t.Errorf("%s: type %s for status %d", o, e.Type, e.Status)
		}
	}
}

// TestQueryTimeoutDoesNotRace: a query that times out while the loop is
// stuck returns false, and when the loop later runs it, its result goes
// nowhere the caller reads (run with -race).
func TestQueryTimeoutDoesNotRace(t *testing.T) {
	m, err := sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32}, ContextLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Model: m, Machine: lifecycle.DefaultConfig(lifecycle.RoleColocated), KVCacheMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Shutdown(context.Background())
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

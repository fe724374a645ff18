package worker

import (
	"net/http"
	"testing"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/openai"
)

// TestOutcomeError maps every outcome to its HTTP status, carrying the
// outcome as the error code.
func TestOutcomeError(t *testing.T) {
	want := map[lifecycle.Outcome]int{
		lifecycle.OutcomeOK:               http.StatusInternalServerError, // never an error; listed for completeness
		lifecycle.OutcomeAbortedClient:    openai.StatusClientClosedRequest,
		lifecycle.OutcomeAbortedPeer:      http.StatusBadGateway,
		lifecycle.OutcomeTimeoutBootstrap: http.StatusGatewayTimeout,
		lifecycle.OutcomeTimeoutQueue:     http.StatusServiceUnavailable,
		lifecycle.OutcomeTimeoutKVHold:    http.StatusGatewayTimeout,
		lifecycle.OutcomeTimeoutTransfer:  http.StatusGatewayTimeout,
		lifecycle.OutcomeTimeoutRequest:   http.StatusGatewayTimeout,
		lifecycle.OutcomeLeaseExpired:     http.StatusBadGateway,
		lifecycle.OutcomePeerLost:         http.StatusBadGateway,
		lifecycle.OutcomeFailedTransfer:   http.StatusBadGateway,
		lifecycle.OutcomeRejectedInvalid:  http.StatusBadRequest,
		lifecycle.OutcomeRejectedCapacity: http.StatusBadRequest,
		lifecycle.OutcomeFailedInternal:   http.StatusInternalServerError,
		lifecycle.OutcomeShutdown:         http.StatusServiceUnavailable,
	}
	if len(want) != len(lifecycle.Outcomes()) {
		t.Fatalf("table covers %d outcomes, there are %d", len(want), len(lifecycle.Outcomes()))
	}
	for _, o := range lifecycle.Outcomes() {
		e := OutcomeError(o, "why")
		if e.Status != want[o] || e.Code != o.String() || e.Message != "why" {
			t.Errorf("%s: got %d %q %q, want %d", o, e.Status, e.Code, e.Message, want[o])
		}
		if (e.Status < 500) != (e.Type == openai.TypeInvalidRequest) {
			t.Errorf("%s: type %s for status %d", o, e.Type, e.Status)
		}
	}
}

package worker

import (
	"slices"
	"testing"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
)

// TestOptimisticOutcomeLabels: every optimistic prefill count the machine
// keeps is exposed under its own label, and only those.
func TestOptimisticOutcomeLabels(t *testing.T) {
	var names []string
	for _, o := range lifecycle.OptimisticOutcomes() {
		names = append(names, o.String())
	}
	if !slices.Equal(names, metrics.OptimisticOutcomes) {
		t.Fatalf("machine counts %v, metrics expose %v", names, metrics.OptimisticOutcomes)
	}
}

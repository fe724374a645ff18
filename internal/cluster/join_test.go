package cluster

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestJoinDistinct: the same error from several processes is said once;
// different ones all, in order; none is nil.
func TestJoinDistinct(t *testing.T) {
	other := errors.New("worker 2: listener closed")
	err := joinDistinct([]error{nil, context.Canceled, context.Canceled, other, context.Canceled})
	if err == nil || err.Error() != "context canceled\nworker 2: listener closed" || !errors.Is(err, context.Canceled) || !errors.Is(err, other) {
		t.Fatalf("joined %q", err)
	}
	if err := joinDistinct([]error{nil, nil}); err != nil {
		t.Fatalf("joined nils: %v", err)
	}
}

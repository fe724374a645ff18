package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/registry"
)

// healthRegistry is a registry that checks its source, whose health the
// test sets.
type healthRegistry struct {
	mu sync.Mutex
	h  registry.Health
}

func (*healthRegistry) Name() string { return "etcd" }
func (*healthRegistry) Run(ctx context.Context, _ func(registry.Snapshot)) error {
	<-ctx.Done()
	return ctx.Err()
}
func (r *healthRegistry) Health() registry.Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h
}
func (r *healthRegistry) set(h registry.Health) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h = h
}

// TestRegistryStatusFollowsHealth: for a registry that checks its source,
// GET /workers is synced only while the source answers, last_sync is the
// source's last answer (the fleet confirmed, not only changed), and its age
// is read on the set's clock.
func TestRegistryStatusFollowsHealth(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	reg := &healthRegistry{}
	s, err := New(Config{Registry: reg, Probe: newFakeWorkers().probe, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	reg.set(registry.Health{Up: true, LastOK: time.Unix(1000, 0)})
	if st := s.RegistryStatus(); st.Synced || st.LastSync != nil || st.LastSyncAge != nil {
		t.Fatalf("up, nothing listed yet: %+v", st)
	}
	s.Reconcile(registry.Snapshot{})
	clk.Step(3 * time.Second)
	reg.set(registry.Health{Up: true, LastOK: time.Unix(1002, 0)})
	st := s.RegistryStatus()
	if !st.Synced || st.LastSync == nil || !st.LastSync.Equal(time.Unix(1002, 0)) || st.LastSyncAge == nil || *st.LastSyncAge != 1 {
		t.Fatalf("up, listed at 1000, answered at 1002, now 1003: %+v", st)
	}
	reg.set(registry.Health{Up: false, LastOK: time.Unix(1002, 0)})
	clk.Step(20 * time.Second)
	st = s.RegistryStatus()
	if st.Synced || st.LastSync == nil || !st.LastSync.Equal(time.Unix(1002, 0)) || st.LastSyncAge == nil || *st.LastSyncAge != 21 {
		t.Fatalf("down since 1002, now 1023: %+v", st)
	}
	if !s.Synced() {
		t.Fatal("the set forgot its fleet while the registry is down")
	}
}

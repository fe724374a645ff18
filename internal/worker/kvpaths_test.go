package worker

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// TestKVPathRedialsALostConnectionAtOnce: a connection that was up and is
// lost is dialled again at the next ask, even within pathRedial of its own
// dial; a dial that failed is not repeated before pathRedial has passed.
func TestKVPathRedialsALostConnectionAtOnce(t *testing.T) {
	const addr = "127.0.0.1:7000"
	p := newKVPaths()
	var dialled []time.Time
	t0 := time.Unix(1000, 0)
	ensure := func(now time.Time) {
		p.ensure([]string{addr}, func(string) kvxfer.PeerID {
			dialled = append(dialled, now)
			return 0
		}, now)
	}
	state := func() string { return p.list([]string{addr})[0].State }

	ensure(t0)
	p.up(addr, t0.Add(10*time.Millisecond))
	p.lost(addr, errors.New("kv peer silent for 750ms"), t0.Add(300*time.Millisecond))
	if s := state(); s != workerapi.KVPathUnreachable {
		t.Fatalf("after the loss: %s", s)
	}
	ensure(t0.Add(400 * time.Millisecond))
	if want := []time.Time{t0, t0.Add(400 * time.Millisecond)}; !slices.Equal(dialled, want) {
		t.Fatalf("dials at %v, want %v: a lost connection waits for pathRedial", dialled, want)
	}
	if s := state(); s != workerapi.KVPathConnecting {
		t.Fatalf("redialling: %s", s)
	}

	// That dial fails: the next is pathRedial after it.
	p.lost(addr, errors.New("connection refused"), t0.Add(410*time.Millisecond))
	ensure(t0.Add(900 * time.Millisecond))
	if len(dialled) != 2 {
		t.Fatalf("a failed dial repeated after %s: %v", 500*time.Millisecond, dialled)
	}
	ensure(t0.Add(400*time.Millisecond + pathRedial))
	if len(dialled) != 3 {
		t.Fatalf("no dial pathRedial after the failed one: %v", dialled)
	}
}

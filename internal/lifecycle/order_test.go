package lifecycle

import (
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// pendingRooms fills a fresh prefill machine with n ROOM_OPENs whose
// requests have not arrived, in the order room(1) … room(n), and returns it
// with those rooms.
func pendingRooms(t *testing.T, n int) (*harness, []kvxfer.RoomGen) {
	t.Helper()
	h := newHarness(t, testConfig(RolePrefill), 16)
	var want []kvxfer.RoomGen
	for i := 1; i <= n; i++ {
		q := request(i, 8, 4)
		h.step(PeerMessage{Peer: 7, Msg: roomOpen(q)})
		want = append(want, kvxfer.RoomGen{Room: q.Room, Gen: q.Gen})
	}
	if got := h.m.Stats(h.now).PendingOpens; got != n {
		t.Fatalf("%d pending opens, want %d", got, n)
	}
	h.take()
	return h, want
}

func abortedRooms(effs []Effect) []kvxfer.RoomGen {
	var out []kvxfer.RoomGen
	for _, a := range sends[kvxfer.Abort](effs) {
		out = append(out, a.RoomGen)
	}
	return out
}

// TestPendingOpensEmitInArrivalOrder: what the machine sends about pending
// ROOM_OPENs (renewals, expiry, shutdown) follows the order the opens
// arrived in, never a map's, so a seeded run replays bit for bit. Each case
// runs on several fresh machines: map order differs between maps, so a
// machine that emitted in map order would be caught.
func TestPendingOpensEmitInArrivalOrder(t *testing.T) {
	const n, machines = 12, 8
	t.Run("renew", func(t *testing.T) {
		for range machines {
			h, want := pendingRooms(t, n)
			effs := h.advance(time.Second)
			renews := sends[kvxfer.RoomRenew](effs)
			if len(renews) != 1 || !slices.Equal(renews[0].Rooms, want) {
				t.Fatalf("ROOM_RENEW %v, want the pending rooms in arrival order %v", renews, want)
			}
		}
	})
	t.Run("expiry", func(t *testing.T) {
		for range machines {
			h, want := pendingRooms(t, n)
			h.now = h.now.Add(h.m.cfg.BootstrapTimeout)
			h.lastRenewalNow()
			if got := abortedRooms(h.step(Tick{})); !slices.Equal(got, want) {
				t.Fatalf("expiry ABORTs for %v, want arrival order %v", got, want)
			}
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		for range machines {
			h, want := pendingRooms(t, n)
			if got := abortedRooms(h.step(Shutdown{})); !slices.Equal(got, want) {
				t.Fatalf("shutdown ABORTs for %v, want arrival order %v", got, want)
			}
		}
	})
}

// lastRenewalNow marks the machine as having just renewed, so the next Tick
// sends no ROOM_RENEW (keeps the expiry case to its ABORTs).
func (h *harness) lastRenewalNow() { h.m.lastRenewal = h.now }

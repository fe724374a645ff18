package lifecycle

import (
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// TestTransferDeadlineMeasuresProgress: decode's transfer deadline runs
// from the last progress — a KV chunk for the room, or prefill renewing the
// room while it computes the next chunk — not from the first chunk, so
// prefill's compute of later chunks is not charged to the transfer. With
// neither for --transfer-timeout the request ends timeout_transfer (and
// prefill is told); renewed forever, it ends at its own deadline.
func TestTransferDeadlineMeasuresProgress(t *testing.T) {
	cfg := testConfig(RoleDecode)
	cfg.TransferTimeout = 2 * time.Second // under the 4 s lease, so the lease does not decide
	chunk := func(h *harness, q Request, page int) {
		h.step(PeerMessage{Peer: 7, Msg: kvxfer.KVChunk{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: 1}, Seq: uint32(page),
			FirstPage: uint32(page), NPages: 1, Data: make([]byte, testPageBytes)}})
	}
	renew := func(h *harness, q Request) {
		h.step(PeerMessage{Peer: 7, Msg: kvxfer.RoomRenew{Rooms: []kvxfer.RoomGen{{Room: q.Room, Gen: 1}}}})
	}
	alive := func(h *harness, q Request, when string) {
		h.t.Helper()
		if f, ok := h.finalOf(q.RID); ok {
			h.t.Fatalf("%s: ended %s: %s", when, f.Outcome, f.Err)
		}
	}
	start := func(t *testing.T, timeout time.Duration) (*harness, Request) {
		h := newHarness(t, cfg, 16)
		q := request(1, 12, 4) // 3 pages
		q.Timeout = timeout
		h.step(PeerUp{Peer: 7})
		h.step(Arrive{Req: q})
		chunk(h, q, 0)
		return h, q
	}

	t.Run("progress", func(t *testing.T) {
		h, q := start(t, 0)
		h.advance(1500 * time.Millisecond)
		chunk(h, q, 1) // 1.5 s: the next chunk
		h.advance(1500 * time.Millisecond)
		alive(h, q, "3 s after the first chunk, 1.5 s after the last")
		renew(h, q) // 3 s: prefill still holds the room, computing the last chunk
		h.advance(1900 * time.Millisecond)
		alive(h, q, "1.9 s after the last renewal")
		effs := h.advance(100 * time.Millisecond) // 5 s: nothing for 2 s
		f, ok := h.finalOf(q.RID)
		if !ok || f.Outcome != outcome.TimeoutTransfer {
			t.Fatalf("want timeout_transfer 2 s after the last progress, got %+v", f)
		}
		if a := sends[kvxfer.Abort](effs); len(a) != 1 || a[0].Cause.Outcome != outcome.TimeoutTransfer {
			t.Fatalf("prefill must be told: %s", describe(effs))
		}
		h.quiesce()
	})

	t.Run("request deadline bounds the total", func(t *testing.T) {
		h, q := start(t, 10*time.Second)
		for i := 1; i < 10; i++ {
			h.advance(time.Second)
			renew(h, q)
			alive(h, q, "renewed")
		}
		h.advance(time.Second)
		f, ok := h.finalOf(q.RID)
		if !ok || f.Outcome != outcome.TimeoutRequest {
			t.Fatalf("want timeout_request at the request's 10 s, got %+v", f)
		}
		h.quiesce()
	})
}

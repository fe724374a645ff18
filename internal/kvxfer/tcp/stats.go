package tcp

import (
	"sync/atomic"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// FrameCounts counts the frames of one type and their size in bytes (whole
// frames: length prefix, type byte and payload).
type FrameCounts struct {
	Frames uint64
	Bytes  uint64
}

// Stats is a snapshot of a Backend's counters, all monotonic since New.
// Counters are read one by one, so a snapshot taken while traffic flows
// need not be consistent across fields.
type Stats struct {
	// Sent and Received are indexed by kvxfer.Type (index 0 is unused).
	// Sent counts frames once written to the socket.
	Sent, Received [kvxfer.NumTypes]FrameCounts
	// Dials counts connections started by Connect (including ones that
	// failed at once because the Backend was closed).
	Dials uint64
	// Accepts counts connections accepted by Listen.
	Accepts uint64
	// Up counts handshakes that succeeded (PeerUp calls).
	Up uint64
	// Refused counts handshakes refused, by this side or the peer (by
	// reason: HandshakeFailures).
	Refused uint64
	// Reconnects counts the Dials to an address that had a connection
	// before.
	Reconnects uint64
	// Live is the number of connections whose handshake succeeded and that
	// are not lost yet.
	Live int
	// Lost counts connections closed for any reason (PeerLost calls).
	Lost uint64
	// Malformed counts bad frames received: malformed, unknown type,
	// oversized, or not allowed where they came (HELLO after the handshake).
	Malformed uint64
	// HandshakeFailures counts failed handshakes by reason (every reason of
	// HandshakeReasons, zeros included).
	HandshakeFailures map[string]uint64
}

// Reasons a handshake fails, as counted in Stats.HandshakeFailures.
const (
	// FailVersion: the peer speaks another protocol version.
	FailVersion = "version"
	// FailFingerprint: the peer's model fingerprint differs.
	FailFingerprint = "fingerprint"
	// FailAuthMode: one side has a shared secret and the other none.
	FailAuthMode = "auth_mode"
	// FailBadProof: the peer's proof of the shared secret is wrong.
	FailBadProof = "bad_proof"
	// FailTLS: the TLS handshake failed (no certificate, one of another
	// CA, a peer that does not speak TLS).
	FailTLS = "tls"
	// FailMalformed: a bad or unexpected frame during the handshake.
	FailMalformed = "malformed"
	// FailTimeout: the handshake did not finish within HandshakeTimeout.
	FailTimeout = "timeout"
	// FailPeerRefused: the peer refused this side (HELLO_ERR).
	FailPeerRefused = "peer_refused"
)

// HandshakeReasons lists every reason of Stats.HandshakeFailures.
var HandshakeReasons = []string{FailVersion, FailFingerprint, FailAuthMode, FailBadProof, FailTLS, FailMalformed,
	FailTimeout, FailPeerRefused}

// Stats returns a snapshot of the counters. It is safe to call from any
// goroutine at any time.
func (b *Backend) Stats() Stats {
	s := Stats{
		Dials:      b.stats.dials.Load(),
		Accepts:    b.stats.accepts.Load(),
		Up:         b.stats.up.Load(),
		Refused:    b.stats.refused.Load(),
		Lost:       b.stats.lost.Load(),
		Malformed:  b.stats.malformed.Load(),
		Reconnects: b.stats.reconnects.Load(),
		Live:       int(b.stats.live.Load()),

		HandshakeFailures: make(map[string]uint64, len(HandshakeReasons)),
	}
	for i, r := range HandshakeReasons {
		s.HandshakeFailures[r] = b.stats.handshakeFail[i].Load()
	}
	for i := range s.Sent {
		s.Sent[i] = FrameCounts{b.stats.sentFrames[i].Load(), b.stats.sentBytes[i].Load()}
		s.Received[i] = FrameCounts{b.stats.recvFrames[i].Load(), b.stats.recvBytes[i].Load()}
	}
	return s
}

type counters struct {
	sentFrames, sentBytes [kvxfer.NumTypes]atomic.Uint64
	recvFrames, recvBytes [kvxfer.NumTypes]atomic.Uint64
	dials, accepts, up    atomic.Uint64
	refused, lost         atomic.Uint64
	malformed             atomic.Uint64
	reconnects            atomic.Uint64
	live                  atomic.Int64
	handshakeFail         [8]atomic.Uint64 // by index in HandshakeReasons
}

// handshakeFailed counts a failed handshake with reason.
func (s *counters) handshakeFailed(reason string) {
	for i, r := range HandshakeReasons {
		if r == reason {
			s.handshakeFail[i].Add(1)
			return
		}
	}
}

func (s *counters) sent(t kvxfer.Type, n int) {
	if int(t) < kvxfer.NumTypes {
		s.sentFrames[t].Add(1)
		s.sentBytes[t].Add(uint64(n))
	}
}

func (s *counters) received(t kvxfer.Type, n int) {
	if int(t) < kvxfer.NumTypes {
		s.recvFrames[t].Add(1)
		s.recvBytes[t].Add(uint64(n))
	}
}

// DroppedFrames implements kvxfer.DropCounter: bad frames received, which
// closed their connection.
func (b *Backend) DroppedFrames() map[string]uint64 {
	return map[string]uint64{"malformed": b.stats.malformed.Load()}
}

var _ kvxfer.ConnCounter = (*Backend)(nil)

// ConnCounts implements kvxfer.ConnCounter.
func (b *Backend) ConnCounts() kvxfer.ConnCounts {
	s := b.Stats()
	return kvxfer.ConnCounts{Dials: s.Dials, Reconnects: s.Reconnects, Live: s.Live}
}

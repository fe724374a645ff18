package lifecycle

import (
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// AbortReason says who ended a request through the abort API.
type AbortReason uint8

// AbortRequest reasons.
const (
	// AbortClient: the client disconnected or asked to cancel.
	AbortClient AbortReason = iota + 1
	// AbortStop: the front end matched a stop string; a normal finish.
	AbortStop
	// AbortPeerLeg: the router saw the other leg fail.
	AbortPeerLeg
)

// Event is an input to Step.
type Event interface{ event() }

// Arrive admits a request.
type Arrive struct{ Req Request }

// AbortRequest ends a request by RID, or by Room (and Gen, 0 = any). An abort for a
// request the machine does not know leaves a tombstone.
type AbortRequest struct {
	RID    string
	Room   kvxfer.Room
	Gen    uint32
	Reason AbortReason
	Detail string
	// Cause (AbortPeerLeg) is the other leg's first failure as the router
	// saw it, if known: the request's end and the peer's ABORT carry it.
	Cause outcome.Cause
	// OneChoice (with AbortStop) ends only choice Choice of a request with
	// N > 1: the front end matched a stop string in it while the others
	// go on.
	OneChoice bool
	Choice    int
}

// Tick lets time pass: deadlines, leases, renewals and tombstones are checked.
type Tick struct{}

// Schedule says the shell delivered every pending event: start a batch if
// none is running and there is work.
type Schedule struct{}

// BatchDone reports the forward of the last RunBatch. Out[i] belongs to
// RunBatch.Seqs[i]. A non-nil Err fails every request in the batch.
type BatchDone struct {
	Out []model.SeqOutput
	Err error
}

// PeerMessage is a room message from a KV peer.
type PeerMessage struct {
	Peer kvxfer.PeerID
	Msg  kvxfer.Message
}

// PeerUp reports a KV connection's handshake succeeded.
type PeerUp struct{ Peer kvxfer.PeerID }

// PeerLost reports a KV connection is gone; every room on it fails, with
// outcome.PeerRefused if Err wraps kvxfer.ErrRefused (the connection's
// handshake was refused: the transport says so through the error, and the
// machine needs no transport to tell), otherwise with outcome.PeerLost.
type PeerLost struct {
	Peer kvxfer.PeerID
	Err  error
}

// KVVerified answers a VerifyKV effect with the checksum of the pages.
type KVVerified struct {
	RID      string
	Gen      uint32
	Checksum uint32
}

// Shutdown fails every live request and refuses new ones.
type Shutdown struct{}

// Drain refuses new requests (outcome draining) and lets the live ones
// finish: the worker is leaving without losing what it admitted. Pending
// ROOM_OPENs are refused (their requests would be refused too); a ROOM_OPEN
// for a room this worker does not hold is refused from then on. Drained
// reports when nothing is left. A Shutdown after a Drain fails the rest.
type Drain struct{}

// IODone reports that the page I/O effect with this Job id finished: the
// shell no longer touches its pages.
type IODone struct{ Job uint64 }

func (Arrive) event()       {}
func (AbortRequest) event() {}
func (Tick) event()         {}
func (Schedule) event()     {}
func (BatchDone) event()    {}
func (PeerMessage) event()  {}
func (PeerUp) event()       {}
func (PeerLost) event()     {}
func (KVVerified) event()   {}
func (Shutdown) event()     {}
func (Drain) event()        {}
func (IODone) event()       {}

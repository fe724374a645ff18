package lifecycle

import (
	"errors"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Role is what a worker does.
type Role uint8

// Worker roles.
const (
	RolePrefill Role = iota + 1
	RoleDecode
	RoleColocated
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleColocated:
		return "colocated"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Stage is where a request is in its lifecycle.
type Stage uint8

// Stages. Which ones a role uses is given by [Role.Stages].
const (
	StageNone Stage = iota
	// StageBootstrap (prefill): waiting for decode's ROOM_OPEN. Holds nothing.
	StageBootstrap
	// StageWaiting (prefill, colocated): waiting to be batched. Holds nothing.
	StageWaiting
	// StagePrefilling (prefill, colocated; decode after a preemption): KV
	// being computed in chunks. Holds pages.
	StagePrefilling
	// StageParked (prefill): KV computed, waiting for decode's ROOM_READY. Holds pages.
	StageParked
	// StageTransferring (prefill): KV sent, waiting for decode's KV_ACK. Holds pages.
	StageTransferring
	// StagePrealloc (decode): waiting for pages. Holds nothing.
	StagePrealloc
	// StageAwaitingKV (decode): pages allocated, receiving KV. Holds pages.
	StageAwaitingKV
	// StageQueued (decode): KV verified, waiting for a running-batch slot. Holds pages.
	StageQueued
	// StageDecoding (decode, colocated): generating tokens. Holds pages.
	StageDecoding
	// StagePreempted (decode, colocated): its pages were taken for older
	// requests; it waits for pages to recompute its KV locally (prompt and
	// output so far) and go on. Holds nothing.
	StagePreempted
	// StageDone: terminal. Holds nothing.
	StageDone
	numStages
)

var stageNames = [numStages]string{"none", "bootstrap", "waiting", "prefilling", "parked",
	"transferring", "prealloc", "awaiting_kv", "queued", "decoding", "preempted", "done"}

func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return fmt.Sprintf("stage(%d)", uint8(s))
}

// Stages lists the non-terminal stages of a role, in lifecycle order.
func (r Role) Stages() []Stage {
	switch r {
	case RolePrefill:
		return []Stage{StageBootstrap, StageWaiting, StagePrefilling, StageParked, StageTransferring}
	case RoleDecode:
		return []Stage{StagePrealloc, StageAwaitingKV, StageQueued, StageDecoding, StagePreempted, StagePrefilling}
	case RoleColocated:
		return []Stage{StageWaiting, StagePrefilling, StageDecoding, StagePreempted}
	}
	return nil
}

// Config is a machine's configuration. Durations are wall-clock spans
// compared against the times that arrive with events.
type Config struct {
	Role Role
	// PageSize is tokens per KV page; PageBytes the bytes of one page.
	PageSize  int
	PageBytes int
	// ContextLen bounds prompt + output tokens; VocabSize bounds token ids.
	ContextLen int
	VocabSize  int
	// EOS ends generation unless the request sets IgnoreEOS.
	EOS []int32
	// MaxPrefillTokens is the chunked-prefill budget: prompt tokens per forward.
	MaxPrefillTokens int
	// MaxRunning bounds the sequences decoded in one step.
	MaxRunning int
	// MaxChunkPages bounds the pages in one KV_CHUNK frame.
	MaxChunkPages int

	BootstrapTimeout time.Duration // prefill: Bootstrap, and pending ROOM_OPENs
	QueueTimeout     time.Duration // Waiting, Prealloc, Queued
	KVHoldTimeout    time.Duration // prefill: Parked, and a cap on holding KV for a decode
	TransferTimeout  time.Duration // prefill: Transferring; decode: from the first KV frame to KV_DONE
	MaxRequestTime   time.Duration // every stage: arrival + this is a hard cap

	// HeartbeatInterval is how often the machine renews rooms with its peers;
	// see Lease for how long a room outlives its last renewal.
	HeartbeatInterval time.Duration
	LeaseMisses       int
	// TombstoneTTL keeps aborted and failed rooms so late arrivals fail at once.
	TombstoneTTL    time.Duration
	MaxTombstones   int
	MaxPendingOpens int
	// History is how many lifecycle events each request keeps for debugging.
	History int
}

// DefaultConfig returns the defaults of the design (ARCHITECTURE.md): 16-token
// pages, 10 s bootstrap, 60 s queue, 30 s KV hold and transfer, 1 s
// heartbeats with a 3-heartbeat lease, 2 min tombstones.
func DefaultConfig(role Role) Config {
	return Config{
		Role:              role,
		PageSize:          16,
		ContextLen:        8192,
		MaxPrefillTokens:  8192,
		MaxRunning:        256,
		MaxChunkPages:     16,
		BootstrapTimeout:  10 * time.Second,
		QueueTimeout:      60 * time.Second,
		KVHoldTimeout:     30 * time.Second,
		TransferTimeout:   30 * time.Second,
		MaxRequestTime:    10 * time.Minute,
		HeartbeatInterval: time.Second,
		LeaseMisses:       3,
		TombstoneTTL:      2 * time.Minute,
		MaxTombstones:     1 << 16,
		MaxPendingOpens:   4096,
		History:           16,
	}
}

// Validate reports a config field out of range.
func (c Config) Validate() error {
	var errs []error
	pos := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	dur := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if c.Role < RolePrefill || c.Role > RoleColocated {
		errs = append(errs, fmt.Errorf("unknown role %d", c.Role))
	}
	pos("page size", c.PageSize)
	pos("page bytes", c.PageBytes)
	pos("context length", c.ContextLen)
	pos("vocab size", c.VocabSize)
	pos("max prefill tokens", c.MaxPrefillTokens)
	pos("max running requests", c.MaxRunning)
	pos("max chunk pages", c.MaxChunkPages)
	pos("lease misses", c.LeaseMisses)
	pos("max tombstones", c.MaxTombstones)
	pos("max pending opens", c.MaxPendingOpens)
	dur("bootstrap timeout", c.BootstrapTimeout)
	dur("queue timeout", c.QueueTimeout)
	dur("kv hold timeout", c.KVHoldTimeout)
	dur("transfer timeout", c.TransferTimeout)
	dur("max request time", c.MaxRequestTime)
	dur("heartbeat interval", c.HeartbeatInterval)
	dur("tombstone ttl", c.TombstoneTTL)
	return errors.Join(errs...)
}

// Lease is how long a room is held for a peer that stopped renewing it:
// HeartbeatInterval × (LeaseMisses + 1). It is one heartbeat longer than the
// transport's silence bound (interval × misses), so a connection that went
// silent is reported as peer_lost, and lease_expired means the connection
// is alive but the peer no longer holds the room.
func (c Config) Lease() time.Duration {
	return c.HeartbeatInterval * time.Duration(c.LeaseMisses+1)
}

// Request is what arrives on a worker's HTTP API, with token ids.
type Request struct {
	RID       string
	Room      kvxfer.Room // zero for colocated requests
	Gen       uint32
	InputIDs  []int32
	MaxTokens int
	Sampling  model.SamplingParams
	// StopTokenIDs end generation like EOS (but also with IgnoreEOS).
	StopTokenIDs []int32
	IgnoreEOS    bool
	// Peer is decode's KV connection to the prefill worker; PeerAddr is its
	// address, for display.
	Peer     kvxfer.PeerID
	PeerAddr string
	// Timeout, if positive and below Config.MaxRequestTime, caps the request.
	Timeout time.Duration
}

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

// PeerLost reports a KV connection is gone; every room on it fails.
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
func (IODone) event()       {}

// Effect is an output of Ready, to be executed by the shell in order.
type Effect interface{ effect() }

// BatchSeq is one sequence of a RunBatch.
type BatchSeq struct {
	RID   string
	Input model.SeqInput
}

// RunBatch asks the shell to run one forward over Seqs and to step
// BatchDone when it finishes. At most one batch runs at a time.
type RunBatch struct {
	Seqs []BatchSeq
	// PrefillTokens and DecodeSeqs describe the batch for logs.
	PrefillTokens int
	DecodeSeqs    int
	// Queues is the number of requests per stage when the batch started.
	Queues map[Stage]int
}

// CancelBatch tells the shell that every sequence of the running forward
// has ended (aborted, timed out, its peer lost), so the forward's result is
// not needed: the shell may cancel it. BatchDone still follows (with the
// forward's error, if cancelled), and only then are the batch's pages
// freed. Emitted at most once per batch.
type CancelBatch struct{}

// Send asks the shell to send a room message to a peer.
type Send struct {
	Peer kvxfer.PeerID
	Msg  kvxfer.Message
}

// Page I/O effects (SendKV, SendKVDone, WriteKV, VerifyKV) may run off the
// shell's loop, in order per peer; each carries a Job id the shell answers
// with IODone when it no longer touches the pages. Until then the pages
// stay allocated, even if the request ends.

// SendKV asks the shell to send the bytes of Pages as one KV_CHUNK: prompt
// pages FirstPage … FirstPage+len(Pages)-1 of the room.
type SendKV struct {
	Job       uint64
	Peer      kvxfer.PeerID
	RoomGen   kvxfer.RoomGen
	Seq       uint32
	FirstPage uint32
	Pages     []kvcache.PageID
}

// SendKVDone asks the shell to send KV_DONE with the CRC-32C of Pages.
type SendKVDone struct {
	Job   uint64
	Peer  kvxfer.PeerID
	Pages []kvcache.PageID
	Done  kvxfer.KVDone // every field but Checksum filled in
}

// WriteKV asks the shell to copy Data (len(Pages) × page bytes) into Pages.
type WriteKV struct {
	Job   uint64
	Peer  kvxfer.PeerID
	Pages []kvcache.PageID
	Data  []byte
}

// VerifyKV asks the shell to compute the CRC-32C of Pages and step KVVerified.
type VerifyKV struct {
	Job   uint64
	Peer  kvxfer.PeerID
	RID   string
	Gen   uint32
	Pages []kvcache.PageID
}

// Emit delivers output tokens to the request's waiter.
type Emit struct {
	RID    string
	Tokens []model.SeqOutput
}

// Finalize is emitted exactly once per admitted or rejected request: it ends
// the request's HTTP answer and is counted in metrics.
type Finalize struct {
	RID     string
	RoomGen kvxfer.RoomGen
	Outcome outcome.Outcome
	Err     string // empty when Outcome is OK
	// Cause is the request's first failure (zero when Outcome is OK): this
	// side's own, or, for AbortedPeer, the other side's when it named one.
	Cause        outcome.Cause
	FinishReason string // "stop" or "length" when Outcome is OK
	PromptTokens int
	OutputTokens int
	// FirstToken is prefill's sampled token (prefill role, Outcome OK).
	FirstToken model.SeqOutput
	// StageTime is how long the request spent in each stage.
	StageTime map[Stage]time.Duration
	// Age is the time from arrival to the end.
	Age time.Duration
}

func (RunBatch) effect()    {}
func (CancelBatch) effect() {}
func (Send) effect()        {}
func (SendKV) effect()      {}
func (SendKVDone) effect()  {}
func (WriteKV) effect()     {}
func (VerifyKV) effect()    {}
func (Emit) effect()        {}
func (Finalize) effect()    {}

// Counters are totals since the machine started.
type Counters struct {
	// FramesDropped counts room messages dropped, by reason: unknown_room,
	// stale_gen, wrong_peer, wrong_state, duplicate, malformed.
	FramesDropped map[string]uint64
	// TombstoneHits counts arrivals and messages that met a tombstone.
	TombstoneHits uint64
	// AbortsAcked counts ABORT_ACKs received.
	AbortsAcked uint64
	// PendingOpensExpired counts ROOM_OPENs for which no request arrived.
	PendingOpensExpired uint64
	// Preemptions counts requests that lost their pages to older ones and
	// recomputed their KV.
	Preemptions uint64
}

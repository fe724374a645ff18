package lifecycle

import (
	"hash/fnv"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

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

// req is one live request.
type req struct {
	Request
	stage      Stage
	arrived    time.Time
	stageSince time.Time
	// deadline is the current stage's deadline and cause the outcome when it
	// passes; hardDeadline caps the whole request.
	deadline     time.Time
	cause        outcome.Outcome
	hardDeadline time.Time
	pages        []kvcache.PageID
	// computed is the number of prompt tokens whose KV is in pages
	// (prefill, colocated).
	computed int
	// outputs are the tokens generated so far (decode, colocated; prefill
	// keeps its one sampled token in first).
	outputs []int32
	first   model.SeqOutput
	// inBatch is set while the running forward writes this request's pages;
	// pins counts page I/O effects (SendKV, SendKVDone, WriteKV, VerifyKV)
	// not yet answered by IODone. An ended request's pages are freed only
	// when both are clear.
	inBatch bool
	pins    int
	// admitted orders requests by when they last got pages (newest is
	// preempted first); preemptions counts how often it lost them.
	admitted    uint64
	preemptions int

	// KV channel state.
	opened    bool // prefill: ROOM_OPEN seen; decode: ROOM_OPEN sent
	ready     bool // prefill: ROOM_READY seen
	peerUp    bool // decode: the connection's handshake is done
	ackSent   bool // decode: KV_ACK sent, prefill has let go of the room
	peerEnded bool // the peer ended the room (its ABORT), so it is not told back
	// peerCause is the other side's first failure, when the peer's ABORT or
	// the router's abort named one: an AbortedPeer end carries it.
	peerCause outcome.Cause
	sentPages int // prefill: prompt pages sent
	chunks    uint32
	lastRenew time.Time
	// decode receive state
	recv        []bool
	recvCount   int
	xferStarted bool
	verifying   bool
	done        kvxfer.KVDone

	stageTime [numStages]time.Duration
	history   []HistoryEntry
	hpos      int
}

// PromptHash is the FNV-1a hash of a prompt's token ids (little-endian
// int32s), carried in ROOM_OPEN so prefill can check both legs carry the
// same prompt.
func PromptHash(ids []int32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range ids {
		b[0], b[1], b[2], b[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		h.Write(b[:])
	}
	return h.Sum64()
}

func (r *req) roomGen() kvxfer.RoomGen { return kvxfer.RoomGen{Room: r.Room, Gen: r.Gen} }

// prefillTokens is what a prefill forward computes the KV of: the prompt,
// and after a preemption also every output token but the last (which the
// next decode step writes).
func (r *req) prefillTokens() []int32 {
	if len(r.outputs) <= 1 {
		return r.InputIDs
	}
	out := make([]int32, 0, len(r.InputIDs)+len(r.outputs)-1)
	out = append(out, r.InputIDs...)
	return append(out, r.outputs[:len(r.outputs)-1]...)
}

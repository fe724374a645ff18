package lifecycle

import (
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Effect is an output of Ready, to be executed by the shell in order.
type Effect interface{ effect() }

// BatchSeq is one sequence of a RunBatch: request RID's choice Choice (0
// unless the request has N > 1 choices).
type BatchSeq struct {
	RID    string
	Choice int
	Input  model.SeqInput
}

// RunBatch asks the shell to run one forward over Seqs and to step
// BatchDone when it finishes. At most one batch runs at a time.
type RunBatch struct {
	Seqs []BatchSeq
	// PrefillTokens and DecodeSeqs describe the batch for logs.
	PrefillTokens int
	DecodeSeqs    int
	// CachedTokens is the tokens the prefix cache supplied to the
	// sequences this batch starts computing (not computed; for logs).
	CachedTokens int
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

// CopyKV asks the shell to copy the bytes of page Src into page Dst before
// it executes the next effect (on its loop: neither page is in the running
// forward or in page I/O), and to mark Dst written. It gives a fork of an
// n > 1 request its own copy of the prompt's last, partial page.
type CopyKV struct {
	Src, Dst kvcache.PageID
}

// Emit delivers output tokens of one choice to the request's waiter.
type Emit struct {
	RID string
	// Choice is the choice the tokens belong to (0 unless N > 1).
	Choice int
	Tokens []model.SeqOutput
	// Finish, for a request with N > 1, says choice Choice ended with this
	// finish reason ("stop" or "length") while others may still run; the
	// request's own end is its Finalize. Never set when N is 1.
	Finish string
	// Prompt (colocated, ScorePrompt) carries the prompt's logprobs, once,
	// before the first token (as Finalize.PromptLogprobs).
	Prompt []model.PositionLogprobs
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
	// CachedTokens is how many prompt tokens were not computed because the
	// prefix cache held their KV: on prefill and colocated workers its own
	// cache's, on decode the prefill worker's (KV_DONE); never tokens decode
	// merely did not need transferred. It is the API's
	// usage.prompt_tokens_details.cached_tokens.
	CachedTokens int
	// SentPages (prefill) is how many prompt pages went out in KV_CHUNKs:
	// the prompt's pages less those decode held from its prefix cache.
	SentPages int
	// FirstToken is prefill's sampled token (prefill role, Outcome OK),
	// with its top logprobs and the first tokens of choices 1…N−1 in
	// FirstToken.Forks.
	FirstToken model.SeqOutput
	// PromptLogprobs (ScorePrompt; prefill and colocated, Outcome OK) are
	// the prompt's logprobs: entry j for prompt token j, the first zero.
	PromptLogprobs []model.PositionLogprobs
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
func (CopyKV) effect()      {}
func (Emit) effect()        {}
func (Finalize) effect()    {}

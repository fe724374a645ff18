package lifecycle

import (
	"hash/fnv"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
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
	// MinTokens (vLLM's min_tokens, 0 ≤ MinTokens ≤ MaxTokens) keeps EOS
	// and StopTokenIDs from being drawn until that many tokens are out.
	MinTokens int
	// Peer is decode's KV connection to the prefill worker; PeerAddr is its
	// address, for display.
	Peer     kvxfer.PeerID
	PeerAddr string
	// Timeout, if positive and below Config.MaxRequestTime, caps the request.
	Timeout time.Duration
	// N is the number of choices (1…model.MaxForks; 0 means 1). Prefill
	// draws every choice's first token (fork i with model.ForkSeed(seed,
	// i)) and sends them in KV_DONE; decode and colocated workers fork N
	// sequences once the prompt's KV is complete: choice 0 is the request
	// itself, the others share its prompt's full pages (reference counted)
	// and each gets a private copy of the last, partial one (CopyKV).
	N int
	// ScorePrompt asks prefill and colocated workers for the prompt's
	// logprobs (PromptLogprobs on Finalize, and on a colocated Emit before
	// the first token), each with PromptTop alternatives. Such a request
	// takes nothing from the prefix cache: its cached positions were never
	// scored (vLLM skips the cache for prompt logprobs too).
	ScorePrompt bool
	PromptTop   int
	// Priority orders the requests waiting to start when
	// Config.PriorityScheduling is set: lower first, then by arrival; and
	// the highest value is preempted first.
	Priority int
	// Constraint, if not nil, is the request's grammar (structured
	// outputs), bound to this worker's vocabulary: every token drawn is one
	// it allows (model.SeqInput.Mask), prefill's first token too. The
	// request keeps a Matcher of it, advanced over every output token; a
	// token it refuses fails the request (FailedInternal: the sampler
	// never draws one). EOS, which the grammar allows only where its text
	// may end, ends the request even with IgnoreEOS. ConstraintDigest is
	// A constraint that outgrows the grammar engine's bounds
	// (grammar.Matcher.Err) ends the request as RejectedInvalid when the
	// next token is taken. ConstraintDigest is
	// its Spec's Digest: set exactly when Constraint is, and part of the KV
	// binding (kvxfer.BindKVConstrained), so decode never continues KV
	// whose first token was drawn under another grammar.
	Constraint       *grammar.Constraint
	ConstraintDigest string
	// Continued, if positive, makes the request a continuation of one an
	// earlier attempt began (workerapi.GenerateBody.ContinuedTokens): the
	// last Continued ids of InputIDs are output tokens that attempt
	// produced, and MaxTokens and MinTokens are what is left of the
	// request's. Its first sampled token is output step Continued (the
	// sampler's Step is Continued plus the outputs so far), the penalties
	// and bad words count the continued tokens as output, and Constraint's
	// matcher is advanced over them at arrival; everything else (KV, the
	// prefix cache, preemption) treats InputIDs as the prompt, and only
	// new tokens are emitted. 0 ≤ Continued < len(InputIDs), with N ≤ 1
	// and without ScorePrompt.
	Continued int
}

// choices is q's number of choices (N, at least 1).
func (q *Request) choices() int { return max(1, q.N) }

// promptOnly reports a request that generates nothing (MaxTokens 0): it
// computes its prompt (scoring it with ScorePrompt) and ends.
func (q *Request) promptOnly() bool { return q.MaxTokens == 0 }

// req is one request the machine admitted, from Arrive until finish.
//
// Its state is grouped by who uses it: the fields every role uses, then
// link (its room on the KV channel, both PD roles), prefillSide and
// decodeSide. The groups are embedded rather than held behind per-role
// pointers because the code that spans roles (finish, shared, leased,
// tick, peerLost) asks the same question of both PD roles (does the peer
// know this room? is it leased?) and would otherwise branch on the role
// only to reach the field; a group that does not belong to the machine's
// role stays zero, which the table below states and checkLegal (in
// invariants_test.go) verifies after every step of the stage, transcript
// and randomized tests.
//
// Legal combinations in each role and stage. "=" is an exact value, "✓"
// set, "–" clear, "*" either; T is the prompt's tokens and P its pages, K
// the tokens prefilling computes (len(prefillTokens()): T, and after a
// preemption T plus the output so far but its last token); outputs is 0
// unless a column says otherwise, and every group not named for a role is
// zero in it.
//
//	prefill        pages computed opened ready sentPages  inBatch pins  unbound pending
//	bootstrap      0     0        –      –     0          –       0     –       –
//	waiting        0     0        ✓      *     0          –       0     –       –
//	prefilling     P     <T       *⁶     *     ≤computed¹ *       *²    =!opened *
//	parked         P     =T       *⁶     –     0          –       0     =!opened *
//	transferring   P     =T       ✓      ✓     =P         –       *     –       –
//
//	decode         pages computed opened recv  xferStarted verifying ackSent outputs inBatch pins
//	prealloc       0     0        ✓      nil   –           –         –       0       –       0
//	awaiting_kv    ≥P    0        ✓      P     recvCount>0 *³        –       0       –       *
//	queued         ≥P    0        ✓      P     ✓           –         ✓       ≥1      –       *⁴
//	decoding       ≥P    *        ✓      P     ✓           –         ✓       ≥1      *       *⁴
//	preempted      0     0        ✓      P     ✓           –         ✓       ≥1      –       0
//	prefilling     >0    <K       ✓      P     ✓           –         ✓       ≥1      *       0
//
//	colocated      pages computed outputs inBatch pins
//	(and local: a decode request without a room)
//	waiting        0     0        0       –       0
//	prefilling     >0    <K       *⁵      *       0
//	decoding       >0    *        ≥1      *       0
//	preempted      0     0        *⁷      –       0
//
//	¹ counted in full pages, and 0 unless ready: KV goes out only once
//	  decode has pages for it.
//	² SendKV jobs, only once ready.
//	³ only once every prompt page arrived (recvCount = P); KV_DONE's
//	  checksum is being verified.
//	⁴ the WriteKV and VerifyKV jobs of the transfer may still be finishing.
//	⁵ ≥1 after a preemption: the KV of the output so far is recomputed.
//	⁷ 0 when it lost its pages while prefilling (outside the running
//	  forward, which the chunked-prefill budget had filled): it computes
//	  its prompt again.
//	⁶ – only for an optimistic request (unbound, pending, not ready,
//	  nothing sent, attempts ≤ OptimisticAttempts): computed before its
//	  ROOM_OPEN; once bound it is opened and, until its KV is sent,
//	  pending. Every prefill stage has attempts ≤ OptimisticAttempts,
//	  and unbound or pending only if not over.
//
// In every stage: deadline is set exactly when cause is; inBatch only
// while the running forward holds r; pins equals r's jobs in flight; peer
// knowledge of the end (peerEnded, peerCause) is set only on the way into
// finish, so a live request never carries it. An ended request (stage
// Done) has left reqs and rooms and keeps its pages only while inBatch or
// pins say the forward or page I/O still use them (Machine.draining).
type req struct {
	Request
	// ban is what min_tokens keeps from being drawn: EOS and StopTokenIDs
	// (nil without MinTokens).
	ban        []int32
	stage      Stage
	arrived    time.Time
	stageSince time.Time
	// deadline is the current stage's deadline and cause the outcome when it
	// passes; budget is the span it was last set to (the stage's deadline
	// flag, for display); hardDeadline caps the whole request.
	deadline     time.Time
	cause        outcome.Outcome
	budget       time.Duration
	hardDeadline time.Time
	// bootDeadline (prefill) is arrival + BootstrapTimeout: the bootstrap
	// deadline, which also caps every stage of an optimistic request until
	// its ROOM_OPEN binds the room.
	bootDeadline time.Time
	pages        []kvcache.PageID
	// computed is the number of tokens of prefillTokens() whose KV is in
	// pages, while prefilling (prefill, colocated; decode after a
	// preemption).
	computed int
	// outputs are the tokens generated so far (decode, colocated; prefill
	// keeps its one sampled token in prefillSide.first).
	outputs []int32
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
	// chain holds the page hashes of the request's full pages of tokens
	// (prompt, then output), as far as the prefix cache needed them
	// (prefix.go); cachedTokens (prefill, colocated) is how many prompt
	// tokens the last computation of the prompt took from the cache.
	chain        []kvxfer.PageHash
	cachedTokens int

	link
	prefillSide
	decodeSide

	// choice is the choice this sequence generates (0 for the request
	// itself); group, for a request with N > 1 on decode and colocated
	// workers, holds its choices once forked (and before: the request
	// alone). forkPages are the pages reserved at admission for choices
	// 1…N−1, handed out when they fork.
	choice    int
	group     *group
	forkPages []kvcache.PageID
	// scores (ScorePrompt, prefill and colocated) are the prompt's
	// logprobs as the forward computes them: scores[j] for prompt token j
	// (scores[0] stays zero: nothing precedes it).
	scores []model.PositionLogprobs

	// matcher follows the output through Request.Constraint (nil without
	// one); mask is the buffer its masks are written into (the forward
	// reads it while r is in the batch). Each choice of a group has its
	// own (cloned at the fork).
	matcher *grammar.Matcher
	mask    []uint64
	// contOut, for a continuation whose sampling reads the history
	// (penalties, bad words), is its output as the sampler sees it: the
	// continued tokens, then outputs (appended as they come, its capacity
	// allocated at arrival). nil otherwise.
	contOut []int32

	stageTime [numStages]time.Duration
	history   []HistoryEntry
	hpos      int
}

// group is the choices of one request with N > 1 (decode, colocated): the
// request itself (members[0], the one in Machine.reqs and rooms) and its
// forks. A choice ends alone when it finishes (stop, length, a stop string
// the front end matched); the request ends, with one Finalize, when the
// last one does, or at once, for all of them, on any failure or abort.
type group struct {
	members []*req
	// live counts the members not yet ended; outputs the output tokens of
	// those that ended.
	live    int
	outputs int
}

// link is a request's room on the KV channel: prefill and decode roles.
type link struct {
	opened bool // prefill: ROOM_OPEN seen; decode: ROOM_OPEN sent (at arrival)
	peerUp bool // decode: the connection's handshake is done (the lease runs)
	// lastRenew is when the peer last listed the room in ROOM_RENEW (or the
	// lease started); it matters while leased(r).
	lastRenew time.Time
	// peerEnded: the peer ended the room (its ABORT), so it is not told
	// back. peerCause is the other side's first failure, when the peer's
	// ABORT or the router's abort named one: an AbortedPeer end carries it.
	// Both are set only on the way into finish.
	peerEnded bool
	peerCause outcome.Cause
}

// prefillSide is what only a prefill request holds.
type prefillSide struct {
	ready     bool // ROOM_READY seen: decode has pages, KV may be sent
	sentPages int  // prompt pages sent in KV_CHUNKs, or held by decode from its cache
	// peerCached is how many of the prompt's first pages decode holds from
	// its prefix cache (ROOM_READY): they are not sent.
	peerCached int
	chunks     uint32 // KV_CHUNKs sent (the next one's Seq)
	// first is the token sampled after the prompt, sent in KV_DONE (set
	// when the prompt's KV is complete: parked, transferring), with the
	// first tokens of choices 1…N−1 in first.Forks.
	first model.SeqOutput
	// opt is the request's optimistic prefill, if it had one.
	opt optState
}

// optState is a prefill request's optimistic prefill (see optimistic.go).
type optState struct {
	// unbound: the request holds KV computed before decode's ROOM_OPEN
	// (prefilling or parked, not opened). The pages are the request's own:
	// nothing else may read, share or index them (a prefix cache must not
	// publish them) until ROOM_OPEN binds the room.
	unbound bool
	// attempts counts the optimistic forward passes the request was in.
	attempts int
	// over: the request fell back (its optimistic KV was dropped) and waits
	// for its ROOM_OPEN as without optimism; it is never optimistic again.
	over bool
	// pending: the optimistic KV is still kept (unbound, or bound and not
	// yet sent), so its outcome (sent, expired, aborted, fell back) is
	// still to be counted.
	pending bool
}

// decodeSide is what only a decode request holds: the receive state of its
// KV and the hand-over.
type decodeSide struct {
	recv      []bool // per prompt page: written by a KV_CHUNK
	recvCount int    // pages marked in recv
	// cachedPages are the prompt's first pages decode took from its prefix
	// cache at admission (announced in ROOM_READY): shared, never written;
	// the transfer is complete when recvCount + cachedPages = P.
	cachedPages int
	xferStarted bool // the first KV_CHUNK came: the transfer deadline runs from the last progress
	verifying   bool // KV_DONE came; VerifyKV is computing the checksum
	done        kvxfer.KVDone
	ackSent     bool // KV_ACK sent: prefill has let go of the room
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

// banAt is what may not be drawn at output step (the index of the token
// drawn among this leg's outputs): min_tokens bans EOS and the stop tokens
// while step < MinTokens. The same on every role, so PD samples as
// colocated does. A continuation counts from its own first token: its
// MinTokens is what is left of the request's.
func (r *req) banAt(step int) []int32 {
	if step < r.MinTokens {
		return r.ban
	}
	return nil
}

// sampleStep is the sampler's step (model.SeqInput.Step) of r's next
// token: its index among the request's outputs, the continued ones
// included.
func (r *req) sampleStep() int { return r.Continued + len(r.outputs) }

// samplerHistory is the prompt and output the sampler's penalties and bad words
// read for r: for a continuation, InputIDs without the continued tokens,
// and those tokens followed by outputs.
func (r *req) samplerHistory() (prompt, output []int32) {
	if r.Continued > 0 {
		return r.InputIDs[:len(r.InputIDs)-r.Continued], r.contOut
	}
	return r.InputIDs, r.outputs
}

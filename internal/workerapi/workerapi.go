package workerapi

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// Worker API paths.
const (
	PathPrefill  = "/internal/v1/prefill"
	PathDecode   = "/internal/v1/decode"
	PathGenerate = "/internal/v1/generate"
	PathAbort    = "/internal/v1/abort"
	PathInfo     = "/internal/v1/info"
	// PathLoad is the worker's load at this moment ([Health] without KV
	// paths, always 200): what a router polls between health checks to
	// pair by load.
	PathLoad = "/internal/v1/load"
	// PathHealth is readiness: 200 while the worker takes new requests,
	// 503 while it drains or its loop does not answer ([Health]).
	PathHealth = "/health"
	// PathLive is liveness: 200 while the loop answers, draining or not
	// (a drain is not a hung process).
	PathLive = "/livez"
	// PathRequests lists live requests ([RequestList]); PathRequests+"/{rid}"
	// describes one with its history ([RequestInfo]).
	PathRequests = "/debug/requests"
)

// Size limits of the contract, in bytes: what either side reads from the
// other is bounded by these.
const (
	// MaxLineBytes bounds one NDJSON line of a stream, a prefill answer and
	// an error answer.
	MaxLineBytes = 1 << 20
	// MaxAbortBytes bounds an abort request's body.
	MaxAbortBytes = 64 << 10
	// MaxRIDBytes bounds a request id.
	MaxRIDBytes = 256
	// MaxDetailBytes bounds an abort's Detail and each string of its Cause.
	MaxDetailBytes = 4096
	// MaxInfoBytes bounds an info or health answer.
	MaxInfoBytes = 1 << 20
)

// Role is a worker's role as the fleet sees it. It crosses the wire as its
// name ("prefill", "decode", "colocated").
type Role uint8

// Roles. The zero value is no role.
const (
	RoleNone Role = iota
	RolePrefill
	RoleDecode
	RoleColocated
)

var roleNames = [...]string{"none", "prefill", "decode", "colocated"}

// Roles lists every role, in order.
func Roles() []Role { return []Role{RolePrefill, RoleDecode, RoleColocated} }

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// ParseRole returns the role named s; false if s names none.
func ParseRole(s string) (Role, bool) {
	for _, r := range Roles() {
		if roleNames[r] == s {
			return r, true
		}
	}
	return RoleNone, false
}

// MarshalText implements encoding.TextMarshaler.
func (r Role) MarshalText() ([]byte, error) {
	if r == RoleNone || int(r) >= len(roleNames) {
		return nil, fmt.Errorf("workerapi: no role %d", uint8(r))
	}
	return []byte(roleNames[r]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is an
// error.
func (r *Role) UnmarshalText(b []byte) error {
	p, ok := ParseRole(string(b))
	if !ok {
		return fmt.Errorf("workerapi: unknown role %q", b)
	}
	*r = p
	return nil
}

// GenerateBody is the body of [PathPrefill], [PathDecode] and
// [PathGenerate]: one request leg, with token ids. The sampling parameters
// travel whole and flat ("temperature", "top_p", "top_k", "seed"); a top_p
// that is absent or 0 means 1, applied once, when the body is decoded.
type GenerateBody struct {
	RID string `json:"rid"`
	// Room (32 hex digits) and Gen identify the KV rendezvous (PD legs
	// only: a colocated leg and a decode worker's local leg, on
	// PathGenerate, have none).
	Room      string  `json:"room,omitempty"`
	Gen       uint32  `json:"gen,omitempty"`
	InputIDs  []int32 `json:"input_ids"`
	MaxTokens int     `json:"max_tokens"`
	model.SamplingParams
	StopTokenIDs []int32 `json:"stop_token_ids,omitempty"`
	IgnoreEOS    bool    `json:"ignore_eos,omitempty"`
	// MinTokens is vLLM's min_tokens: EOS and the stop tokens are not
	// drawn before that many output tokens (0 ≤ MinTokens ≤ MaxTokens).
	MinTokens int `json:"min_tokens,omitempty"`
	// PrefillKVAddr is the prefill worker's KV channel address (decode leg;
	// none on a local leg).
	PrefillKVAddr string `json:"prefill_kv_addr,omitempty"`
	// Buffered asks a decode or colocated leg to send its tokens in one line
	// at the end rather than as they come (the caller reads them only then).
	Buffered bool `json:"buffered,omitempty"`

	// The fields below (and SamplingParams' logit processors and logprob
	// settings) came after the first version of the leg body: a router sends
	// a request that uses one only to workers that list its feature
	// (Info.Features, FeaturesOf).

	// N is the number of choices (0 or 1: one).
	N int `json:"n,omitempty"`
	// PromptLogprobs, if set, asks for the prompt's logprobs with that many
	// alternatives per position (prefill and colocated legs). MaxTokens 0
	// with no room is a prompt-only request on a prefill or colocated leg.
	PromptLogprobs *int `json:"prompt_logprobs,omitempty"`
	// Priority orders waiting requests on workers started with
	// --scheduling-policy priority (lower first).
	Priority int `json:"priority,omitempty"`
	// TimeoutMS, if positive, is the request's own deadline in
	// milliseconds from the leg's arrival (capped by --max-request-time).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Constraint, if set, is the request's structured-output constraint
	// (openai.GenerateRequest.Constraint), the same on both PD legs: prefill
	// masks the first token with it, decode continues under it. Each worker
	// compiles it itself (grammar.Compile, cached by Spec.Digest).
	Constraint *grammar.Spec `json:"constraint,omitempty"`
	// ContinuedTokens, if positive, makes the leg a continuation of a
	// request that an earlier attempt began: the last ContinuedTokens ids
	// of InputIDs are output tokens that attempt already produced (0 ≤
	// ContinuedTokens < len(InputIDs)). MaxTokens and MinTokens are what is
	// left to generate; the leg's first sampled token is output step
	// ContinuedTokens (its seeded draw, model.Uniform), the logit
	// processors count the continued tokens as output, a constraint is
	// advanced over them, and only new tokens are sent. N must be at most 1
	// and PromptLogprobs unset. Both PD legs carry the same value.
	ContinuedTokens int `json:"continued_tokens,omitempty"`
}

// extended reports whether b uses a field that came after the first
// version of the leg body (which AppendJSON and the fast parser write and
// read, with MinTokens and ContinuedTokens; bodies that use more go
// through encoding/json).
func (b *GenerateBody) extended() bool {
	p := &b.SamplingParams
	return b.N != 0 || b.PromptLogprobs != nil || b.Priority != 0 || b.TimeoutMS != 0 || b.Constraint != nil ||
		p.MinP != 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || p.RepetitionPenalty != 0 ||
		p.LogitBias != nil || p.AllowedTokenIDs != nil || p.BadWords != nil || p.TopLogprobs != 0 || p.LogprobsMode != 0
}

// UnmarshalJSON decodes a leg body, giving an absent or zero top_p its
// meaning, 1 (every token kept).
// A body as AppendJSON writes it is decoded without reflection
// (parseGenerateBody); anything else by encoding/json, to the same result.
func (b *GenerateBody) UnmarshalJSON(data []byte) error {
	var p GenerateBody
	if !parseGenerateBody(data, &p) {
		type plain GenerateBody // without this method
		if err := json.Unmarshal(data, (*plain)(&p)); err != nil {
			return err
		}
	}
	if p.TopP == 0 {
		p.TopP = 1
	}
	*b = p
	return nil
}

// PrefillResult is the 200 answer of [PathPrefill], sent once the decode
// worker acknowledged the KV.
type PrefillResult struct {
	RID          string  `json:"rid"`
	PromptTokens int     `json:"prompt_tokens"`
	FirstToken   int32   `json:"first_token"`
	FirstLogprob float32 `json:"first_logprob"`
	// PromptLogprobs (the leg's prompt_logprobs) holds one entry per
	// prompt token, the first empty; logprobs below −9999 are −9999.
	PromptLogprobs []model.PositionLogprobs `json:"prompt_logprobs,omitempty"`
	// CachedTokens is how many prompt tokens prefill took from its prefix
	// cache (a prompt-only request's usage: it has no decode leg).
	CachedTokens int `json:"cached_tokens,omitempty"`
}

// MaxPrefillBytes bounds the prefill answer of a request with a prompt of
// promptTokens tokens asking top prompt logprobs per position: what a
// router reads of it.
func MaxPrefillBytes(promptTokens, top int) int64 {
	return MaxLineBytes + int64(promptTokens)*int64(1+top)*64
}

// AbortReason says why a leg is aborted through [PathAbort]. It crosses the
// wire as its name; an absent reason is AbortClient.
type AbortReason uint8

// Abort reasons.
const (
	// AbortClient: the client went away or cancelled (the default).
	AbortClient AbortReason = iota
	// AbortStop: the front end matched a stop string: a normal finish.
	AbortStop
	// AbortPeer: the router saw the other leg fail; AbortBody.Cause says how.
	AbortPeer
)

var abortNames = [...]string{"client", "stop", "peer"}

func (r AbortReason) String() string {
	if int(r) < len(abortNames) {
		return abortNames[r]
	}
	return fmt.Sprintf("abort_reason(%d)", uint8(r))
}

// MarshalText implements encoding.TextMarshaler.
func (r AbortReason) MarshalText() ([]byte, error) {
	if int(r) >= len(abortNames) {
		return nil, fmt.Errorf("workerapi: no abort reason %d", uint8(r))
	}
	return []byte(abortNames[r]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler: "" is AbortClient, a
// name that is no reason is an error.
func (r *AbortReason) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*r = AbortClient
		return nil
	}
	for i, n := range abortNames {
		if n == string(b) {
			*r = AbortReason(i)
			return nil
		}
	}
	return fmt.Errorf("reason must be client, stop or peer, got %q", b)
}

// AbortBody is the body of [PathAbort]: by RID, or by Room (and Gen, 0 =
// any). Detail says why, for people (at most MaxDetailBytes). Cause, for
// AbortPeer, is the failing leg's first failure as the router saw it: the
// aborted leg ends with aborted_peer carrying it, and tells its KV peer.
//
// Choice, with reason stop, ends only that choice of a request with n > 1
// (a stop string matched in it); the others go on.
type AbortBody struct {
	RID    string        `json:"rid,omitempty"`
	Room   string        `json:"room,omitempty"`
	Gen    uint32        `json:"gen,omitempty"`
	Reason AbortReason   `json:"reason"`
	Detail string        `json:"detail,omitempty"`
	Cause  outcome.Cause `json:"cause,omitzero"`
	Choice *int          `json:"choice,omitempty"`
}

// Check reports a field over its size limit.
func (b *AbortBody) Check() error {
	switch {
	case len(b.RID) > MaxRIDBytes:
		return fmt.Errorf("rid is limited to %d bytes", MaxRIDBytes)
	case len(b.Detail) > MaxDetailBytes || len(b.Cause.Detail) > MaxDetailBytes ||
		len(b.Cause.Role) > MaxDetailBytes || len(b.Cause.Stage) > MaxDetailBytes:
		return fmt.Errorf("detail and the cause's strings are limited to %d bytes", MaxDetailBytes)
	}
	return nil
}

// Info is the answer of [PathInfo]: what the router checks before it pairs
// a worker.
type Info struct {
	Role  Role   `json:"role"`
	Model string `json:"model"`
	// KVPort and KVAddr are a prefill worker's KV channel listener; the
	// router dials the port on the worker's own host.
	KVPort      int                `json:"kv_port,omitempty"`
	KVAddr      string             `json:"kv_addr,omitempty"`
	Fingerprint kvxfer.Fingerprint `json:"fingerprint"`
	// ContextLen is the context (prompt + output tokens) the worker serves,
	// which may be shorter than the model's when its KV pool is small.
	ContextLen int `json:"context_len"`
	VocabSize  int `json:"vocab_size"`
	// Instance identifies the worker process (random, minted at start): a
	// new value at the same address is a restarted worker.
	Instance string `json:"instance"`
	// Features lists the request fields this worker honours beyond the
	// first version of the leg body ([Features]); the router sends a
	// request that needs one only to workers that list it, so that during
	// a rolling upgrade an older worker, which would ignore the field,
	// never serves it.
	Features []string `json:"features,omitempty"`
}

// Features a worker lists in Info: the leg fields it honours beyond the
// first version of the leg body.
const (
	// FeatureMinTokens: GenerateBody.MinTokens.
	FeatureMinTokens = "min_tokens"
	// FeatureLogprobs: SamplingParams.TopLogprobs and LogprobsMode, top
	// logprobs in stream lines and in KV_DONE's tail.
	FeatureLogprobs = "logprobs"
	// FeatureChoices: N > 1 (forks on decode, first tokens in KV_DONE's
	// tail), stream lines with an index, and aborts of one choice.
	FeatureChoices = "n"
	// FeaturePromptLogprobs: PromptLogprobs, and prompt-only legs
	// (MaxTokens 0) on prefill and colocated workers.
	FeaturePromptLogprobs = "prompt_logprobs"
	// FeatureLogitProcessors: SamplingParams' penalties, logit bias, min_p,
	// allowed token ids and bad words.
	FeatureLogitProcessors = "logit_processors"
	// FeaturePriority: Priority (with --scheduling-policy priority).
	FeaturePriority = "priority"
	// FeatureTimeout: TimeoutMS.
	FeatureTimeout = "timeout"
	// FeatureConstraint: Constraint (structured outputs).
	FeatureConstraint = "constraint"
	// FeatureContinue: ContinuedTokens (a leg that continues a request
	// from output an earlier attempt produced).
	FeatureContinue = "continue"
	// FeatureLocal: a decode worker serves [PathGenerate], a whole request
	// without a room, computing its prompt itself as a colocated worker
	// does (the router's per-request disaggregation). Listed by decode
	// workers only.
	FeatureLocal = "local"
)

// Features returns the features this build's workers list in Info (a fresh
// slice).
func Features() []string {
	return []string{FeatureMinTokens, FeatureLogprobs, FeatureChoices, FeaturePromptLogprobs, FeatureLogitProcessors,
		FeaturePriority, FeatureTimeout, FeatureConstraint, FeatureContinue, FeatureLocal}
}

// FeaturesOf lists the features a worker must have to serve leg b (nil for
// a body of the first version).
func FeaturesOf(b *GenerateBody) []string {
	var out []string
	p := &b.SamplingParams
	if b.MinTokens != 0 {
		out = append(out, FeatureMinTokens)
	}
	if p.TopLogprobs != 0 || p.LogprobsMode != 0 {
		out = append(out, FeatureLogprobs)
	}
	if b.N > 1 {
		out = append(out, FeatureChoices)
	}
	if b.PromptLogprobs != nil || b.MaxTokens == 0 {
		out = append(out, FeaturePromptLogprobs)
	}
	if p.MinP != 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1) ||
		len(p.LogitBias) > 0 || len(p.AllowedTokenIDs) > 0 || len(p.BadWords) > 0 {
		out = append(out, FeatureLogitProcessors)
	}
	if b.Priority != 0 {
		out = append(out, FeaturePriority)
	}
	if b.TimeoutMS != 0 {
		out = append(out, FeatureTimeout)
	}
	if b.Constraint != nil && !b.Constraint.IsZero() {
		out = append(out, FeatureConstraint)
	}
	if b.ContinuedTokens > 0 {
		out = append(out, FeatureContinue)
	}
	return out
}

// Health statuses.
const (
	HealthOK       = "ok"
	HealthDraining = "draining"
	HealthStuck    = "loop not answering"
)

// Health is the answer of PathHealth (and of PathLoad): the worker's
// readiness and its load at this moment (read from its lifecycle machine),
// and on a decode worker the state of its KV paths.
type Health struct {
	// Status is HealthOK (200), HealthDraining or HealthStuck (503).
	Status   string `json:"status"`
	Role     Role   `json:"role,omitempty"`
	Instance string `json:"instance,omitempty"`
	Load
	// KVPaths is, on a decode worker, the state of its KV connection to
	// each prefill worker: those named by the request's kv_peers query
	// parameter ([HealthQueryKVPeers]), else every one it knows.
	KVPaths []KVPath `json:"kv_paths,omitempty"`
}

// Load is a worker's load at one moment.
type Load struct {
	// Live is the number of live requests; Stages counts them per stage
	// (e.g. "parked", "decoding").
	Live   int            `json:"live"`
	Stages map[string]int `json:"stages,omitempty"`
	// Queued is the number of requests that wait for the worker's
	// capacity: for KV pages (decode: prealloc, preempted; colocated:
	// preempted), or for a batch slot beyond those the next forward has
	// free (prefill: waiting; decode: queued; colocated: waiting, less
	// MaxRunning minus the sequences running): the queue a router sheds
	// load on, as vLLM's waiting queue. (MaxQueued bounds the raw stage
	// counts, and on prefill bootstrap too.)
	Queued int `json:"queued"`
	// PromptTokens is the sum of the prompt lengths of the live requests,
	// in tokens (prefill's outstanding work).
	PromptTokens int `json:"prompt_tokens"`
	// PagesUsed and PagesTotal are the KV pool's pages; PageSize its
	// tokens per page. PagesCached are the prefix cache's pages that no
	// request holds (evicted as allocations need them, so a router may
	// count them as free).
	PagesUsed   int `json:"pages_used"`
	PagesCached int `json:"pages_cached"`
	PagesTotal  int `json:"pages_total"`
	PageSize    int `json:"page_size,omitempty"`
	// MaxRunning is the most sequences in one forward
	// (--max-running-requests); MaxQueued the queue bound
	// (--max-queued-requests, 0: none).
	MaxRunning int `json:"max_running,omitempty"`
	MaxQueued  int `json:"max_queued,omitempty"`
	// ForwardSeconds is the time the worker spent in forward passes since
	// it started, and PromptTokensComputed the prompt tokens those
	// forwards computed; both only grow, so a reader takes differences:
	// tokens over seconds is the worker's prefill throughput while busy,
	// seconds over wall time its utilization (the planner's input).
	ForwardSeconds       float64 `json:"forward_seconds,omitempty"`
	PromptTokensComputed int64   `json:"prompt_tokens_computed,omitempty"`
}

// HealthQueryKVPeers is the query parameter of PathHealth by which a router
// names the prefill KV addresses (host:port, comma-separated, at most
// MaxKVPeers) a decode worker should hold connections to: it dials those
// it has none to (again, after a failure), waits up to KVPathWait for their
// handshakes, and reports every one in Health.KVPaths.
const HealthQueryKVPeers = "kv_peers"

// MaxKVPeers bounds the addresses of one kv_peers query.
const MaxKVPeers = 4096

// KV path states.
const (
	// KVPathUp: the connection is up (its handshake passed).
	KVPathUp = "up"
	// KVPathConnecting: a dial or handshake is under way.
	KVPathConnecting = "connecting"
	// KVPathRefused: the last handshake was refused (Reason says why:
	// auth, protocol version, KV fingerprint); the same pair would be
	// refused again until a worker changes.
	KVPathRefused = "refused"
	// KVPathUnreachable: the last connection could not be made or was
	// lost (Reason says how).
	KVPathUnreachable = "unreachable"
)

// KVPath is the state of a decode worker's KV connection to one prefill
// worker.
type KVPath struct {
	// Addr is the prefill worker's KV address.
	Addr  string `json:"addr"`
	State string `json:"state"`
	// Refusal classifies a refused handshake (kvxfer.RefusalReason's
	// name: auth, version, fingerprint, protocol).
	Refusal string `json:"refusal,omitempty"`
	// Reason says why the path is refused or unreachable.
	Reason string `json:"reason,omitempty"`
	// Since is when it entered State.
	Since time.Time `json:"since"`
}

// KVPathWait bounds how long a decode worker's health answer waits for the
// handshakes of the KV paths it was asked about and had to dial.
const KVPathWait = time.Second

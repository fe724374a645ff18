package lifecycle

import (
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

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
	// Fingerprint is the KV fingerprint of the worker's model (the one its
	// KV channel compares in HELLO). It roots the hashes that bind KV to a
	// request (kvxfer.ChainSeed), so prefill and decode must have equal
	// ones; any value is valid.
	Fingerprint kvxfer.Fingerprint
	// MaxPrefillTokens is the chunked-prefill budget: prompt tokens per forward.
	MaxPrefillTokens int
	// MaxRunning bounds the sequences of one forward: decoded in one step
	// (decode, colocated), or prompts computed in one batch (prefill).
	MaxRunning int
	// MaxChunkPages bounds the pages in one KV_CHUNK frame.
	MaxChunkPages int
	// MaxQueued bounds the requests waiting to start (Role.Queued stages);
	// an arrival beyond it is refused with outcome overloaded (429), so a
	// router places it elsewhere instead of letting it wait out
	// QueueTimeout (SGLang's --max-queued-requests). 0: no bound.
	MaxQueued int

	BootstrapTimeout time.Duration // prefill: Bootstrap, and pending ROOM_OPENs
	QueueTimeout     time.Duration // Waiting, Prealloc, Queued
	KVHoldTimeout    time.Duration // prefill: Parked, and a cap on holding KV for a decode
	TransferTimeout  time.Duration // prefill: Transferring; decode: once KV flows, the longest time without a KV chunk or a renewal of the room
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

	// OptimisticAttempts (prefill) is how many forward passes a request may
	// take before decode's ROOM_OPEN binds its room (SGLang's
	// --optimistic-prefill-attempts); 0 turns optimistic prefill off. Its
	// KV is the request's own until then and parks when complete; a prompt
	// not complete within the attempts drops its KV and waits for its
	// ROOM_OPEN as without optimism ("fell back"). See optimistic.go.
	OptimisticAttempts int
	// OptimisticMaxParked caps the pages that requests not yet bound hold
	// (computing or parked), as a fraction of the pool in (0, 1]; at the cap
	// new requests wait for their ROOM_OPEN.
	OptimisticMaxParked float64
	// PrefixCache turns on the prefix cache (prefix.go): full pages of
	// complete KV stay indexed by their chained hash after their request
	// ends, a request computes only from its first uncached token, and
	// decode receives only the prompt pages it does not hold
	// (--disable-prefix-cache turns it off; on in the worker by default, as
	// in SGLang and vLLM).
	PrefixCache bool
	// PriorityScheduling orders the requests that wait to start (waiting,
	// prealloc, queued, preempted) by Request.Priority, lower first, then
	// by arrival, and preempts the highest Priority value first (vLLM's
	// --scheduling-policy priority); off, they go in arrival order and
	// Priority is ignored (the front end refuses a non-zero one).
	PriorityScheduling bool
	// ForceOptimistic, if set, is the test hook of optimistic prefill (as
	// SGLang's should_force_retry): for a request it picks by id, the
	// machine holds the room's ROOM_OPEN back until the request's optimistic
	// prefill has ended (parked or fell back), as if decode had opened the
	// room late. It must be deterministic (see ForceFraction).
	ForceOptimistic func(rid string) bool
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

		OptimisticMaxParked: 0.25,
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
	if c.MaxQueued < 0 {
		errs = append(errs, fmt.Errorf("max queued requests must not be negative, got %d", c.MaxQueued))
	}
	pos("max tombstones", c.MaxTombstones)
	pos("max pending opens", c.MaxPendingOpens)
	dur("bootstrap timeout", c.BootstrapTimeout)
	dur("queue timeout", c.QueueTimeout)
	dur("kv hold timeout", c.KVHoldTimeout)
	dur("transfer timeout", c.TransferTimeout)
	dur("max request time", c.MaxRequestTime)
	dur("heartbeat interval", c.HeartbeatInterval)
	dur("tombstone ttl", c.TombstoneTTL)
	if c.OptimisticAttempts < 0 {
		errs = append(errs, fmt.Errorf("optimistic prefill attempts must not be negative (0 turns it off), got %d", c.OptimisticAttempts))
	}
	if c.OptimisticAttempts > 0 && !(c.OptimisticMaxParked > 0 && c.OptimisticMaxParked <= 1) {
		errs = append(errs, fmt.Errorf("optimistic prefill max parked must be a fraction of the pool in (0, 1], got %v", c.OptimisticMaxParked))
	}
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

// ForceFraction returns a ForceOptimistic hook that picks about fraction f
// of request ids, deterministically: the id's FNV-1a hash, mixed by
// SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014) so that ids differing in
// their last characters spread evenly, read as a number in [0, 1), is
// below f. 0 picks none and 1 every id.
func ForceFraction(f float64) func(rid string) bool {
	return func(rid string) bool {
		h := fnv.New64a()
		h.Write([]byte(rid))
		x := h.Sum64()
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		x ^= x >> 31
		return float64(x>>11)/(1<<53) < f
	}
}

package lifecycle

import (
	"errors"
	"fmt"
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

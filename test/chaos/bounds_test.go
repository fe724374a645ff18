package chaos

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/lifecycle"
)

// deadlines are the lifecycle deadlines every chaos worker runs with: short,
// so that every fault resolves within seconds.
type deadlines struct {
	Heartbeat    time.Duration // --heartbeat-interval
	Misses       int           // --heartbeat-misses
	Bootstrap    time.Duration // --bootstrap-timeout
	Queue        time.Duration // --queue-timeout
	KVHold       time.Duration // --kv-hold-timeout
	Transfer     time.Duration // --transfer-timeout
	MaxRequest   time.Duration // --max-request-time
	TombstoneTTL time.Duration // --tombstone-ttl
}

// chaosDeadlines is the deadline set of the chaos tests.
var chaosDeadlines = deadlines{
	Heartbeat: 100 * time.Millisecond, Misses: 3,
	Bootstrap: time.Second, Queue: 3 * time.Second, KVHold: 2 * time.Second, Transfer: 2 * time.Second,
	MaxRequest: 15 * time.Second, TombstoneTTL: 2 * time.Second,
}

// Constants of pdserve that the bounds depend on (their defaults; the chaos
// tests do not change them).
const (
	// workerTick is how often a worker checks deadlines and leases
	// (worker.Config.TickInterval's default).
	workerTick = 50 * time.Millisecond
	// routerAttempts is router.Config.MaxAttempts's default: one retry.
	routerAttempts = 2
	// peerFailureGrace is router.Config.PeerFailureGrace's default.
	peerFailureGrace = time.Second
	// stageSlack is added to every stage bound: a deadline is noticed at
	// the next tick, and the worker loop may run late on a loaded machine
	// under the race detector (10 ticks).
	stageSlack = 10 * workerTick
	// clientSlack is added to the client bound for HTTP hops and
	// scheduling.
	clientSlack = 2 * time.Second
	// prefillForwardAllowance bounds the time a prefill request spends in
	// forwards (stage prefilling), which has no deadline of its own: with
	// --chunked-prefill-size 512 and 0.02 ms per token a forward takes
	// about 10 ms; the allowance covers the race detector and batching.
	prefillForwardAllowance = time.Second
)

// lease is how long a room outlives its last renewal
// (lifecycle.Config.Lease: one heartbeat longer than the silence bound).
func (d deadlines) lease() time.Duration { return d.machine(lifecycle.RolePrefill).Lease() }

// machine returns the lifecycle config of a worker of role: with the
// prefix cache, as pdserve runs by default.
func (d deadlines) machine(role lifecycle.Role) lifecycle.Config {
	mc := lifecycle.DefaultConfig(role)
	mc.PrefixCache = true
	mc.HeartbeatInterval = d.Heartbeat
	mc.LeaseMisses = d.Misses
	mc.BootstrapTimeout = d.Bootstrap
	mc.QueueTimeout = d.Queue
	mc.KVHoldTimeout = d.KVHold
	mc.TransferTimeout = d.Transfer
	mc.MaxRequestTime = d.MaxRequest
	mc.TombstoneTTL = d.TombstoneTTL
	mc.MaxPrefillTokens = 512
	return mc
}

// flags returns the same deadlines as pdserve command-line flags.
func (d deadlines) flags() []string {
	return []string{
		"--heartbeat-interval", d.Heartbeat.String(), "--heartbeat-misses", fmt.Sprint(d.Misses),
		"--bootstrap-timeout", d.Bootstrap.String(), "--queue-timeout", d.Queue.String(),
		"--kv-hold-timeout", d.KVHold.String(), "--transfer-timeout", d.Transfer.String(),
		"--max-request-time", d.MaxRequest.String(), "--tombstone-ttl", d.TombstoneTTL.String(),
		"--chunked-prefill-size", "512",
	}
}

// stageBound is the longest a request may stay in one stage, and how the
// bound is derived.
type stageBound struct {
	Bound time.Duration
	// Own is true for a stage with a deadline of its own; the others are
	// bounded by a derivation (Why) or only by --max-request-time.
	Own bool
	Why string
}

// stageBound returns the bound of stage st of role:
//
//	prefill bootstrap     bootstrap-timeout + slack
//	prefill waiting       queue-timeout + slack
//	prefill parked        kv-hold-timeout + slack
//	prefill transferring  transfer-timeout + slack
//	decode prealloc       queue-timeout + slack
//	decode queued         queue-timeout + slack
//	decode preempted      queue-timeout + slack
//	decode awaiting_kv    bootstrap + queue + forward allowance + kv-hold + transfer + lease + slack
//	                      (derived: decode waits while prefill holds the room, which is
//	                      bounded by prefill's stages; then transfer-timeout from the first
//	                      chunk; a prefill that stops renewing loses the room within a lease)
//	other stages          max-request-time + slack (the hard cap from arrival)
//
// slack is stageSlack.
func (d deadlines) stageBound(role lifecycle.Role, st lifecycle.Stage) stageBound {
	own := func(dl time.Duration, name string) stageBound {
		return stageBound{Bound: dl + stageSlack, Own: true, Why: name + " + slack"}
	}
	switch {
	case role == lifecycle.RolePrefill && st == lifecycle.StageBootstrap:
		return own(d.Bootstrap, "bootstrap-timeout")
	case role == lifecycle.RolePrefill && st == lifecycle.StageWaiting:
		return own(d.Queue, "queue-timeout")
	case role == lifecycle.RolePrefill && st == lifecycle.StageParked:
		return own(d.KVHold, "kv-hold-timeout")
	case role == lifecycle.RolePrefill && st == lifecycle.StageTransferring:
		return own(d.Transfer, "transfer-timeout")
	case role == lifecycle.RoleDecode && st == lifecycle.StagePrealloc:
		return own(d.Queue, "queue-timeout")
	case role == lifecycle.RoleDecode && st == lifecycle.StageQueued:
		return own(d.Queue, "queue-timeout")
	case role == lifecycle.RoleDecode && st == lifecycle.StagePreempted:
		return own(d.Queue, "queue-timeout")
	case role == lifecycle.RoleDecode && st == lifecycle.StageAwaitingKV:
		return stageBound{Bound: d.Bootstrap + d.Queue + prefillForwardAllowance + d.KVHold + d.Transfer + d.lease() + stageSlack,
			Why: "derived: bootstrap+queue+forward+kv-hold+transfer+lease+slack"}
	}
	return stageBound{Bound: d.MaxRequest + stageSlack, Why: "max-request-time + slack"}
}

// clientBound is the longest a client may wait for its HTTP answer: each of
// the router's attempts ends within max-request-time on its workers, plus a
// lease for a lost peer to be noticed, the router's grace for the root
// cause, and a tick; then a slack for the HTTP hops:
//
//	attempts × (max-request-time + lease + peer-failure grace + 2 ticks) + slack
func (d deadlines) clientBound() time.Duration {
	return routerAttempts*(d.MaxRequest+d.lease()+peerFailureGrace+2*workerTick) + clientSlack
}

// stageKey names a stage of a role.
type stageKey struct {
	Role  lifecycle.Role
	Stage lifecycle.Stage
}

// String is "role stage", or "none" for the zero key.
func (k stageKey) String() string {
	if k.Stage == lifecycle.StageNone {
		return "none"
	}
	return k.Role.String() + " " + k.Stage.String()
}

// allStageKeys lists the stages of prefill and decode workers in lifecycle
// order.
func allStageKeys() []stageKey {
	var out []stageKey
	for _, r := range []lifecycle.Role{lifecycle.RolePrefill, lifecycle.RoleDecode} {
		for _, s := range r.Stages() {
			out = append(out, stageKey{r, s})
		}
	}
	return out
}

// requiredPhases are the stages every chaos run must strike at least once:
// before prefill admits a request (bootstrap, waiting), during prefill,
// parked, during the transfer (both sides), waiting for decode's pages or
// a running slot, and during decode. Other stages (e.g. preemption) are
// struck when they occur and reported, not required.
func requiredPhases() []stageKey {
	p, d := lifecycle.RolePrefill, lifecycle.RoleDecode
	return []stageKey{{p, lifecycle.StageBootstrap}, {p, lifecycle.StageWaiting}, {p, lifecycle.StagePrefilling},
		{p, lifecycle.StageParked}, {p, lifecycle.StageTransferring}, {d, lifecycle.StagePrealloc},
		{d, lifecycle.StageAwaitingKV}, {d, lifecycle.StageQueued}, {d, lifecycle.StageDecoding}}
}

// stageMax records the longest time seen in each stage, and where.
type stageMax struct {
	mu  sync.Mutex
	max map[stageKey]time.Duration
	at  map[stageKey]string
}

// newStageMax returns an empty record.
func newStageMax() *stageMax {
	return &stageMax{max: make(map[stageKey]time.Duration), at: make(map[stageKey]string)}
}

// observe records d in stage k of worker name if it is the longest so far.
func (m *stageMax) observe(k stageKey, d time.Duration, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d > m.max[k] {
		m.max[k], m.at[k] = d, name
	}
}

// observeStats records a worker's MaxInStage and OldestInStage.
func (m *stageMax) observeStats(st lifecycle.Stats, name string) {
	for s, d := range st.MaxInStage {
		m.observe(stageKey{st.Role, s}, d, name)
	}
	for s, d := range st.OldestInStage {
		m.observe(stageKey{st.Role, s}, d, name)
	}
}

// report checks every stage against its bound plus lag, the test
// process's longest scheduling lag. It returns one line per stage for the
// summary and the violations.
func (m *stageMax) report(d deadlines, lag time.Duration) (table string, violations []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "  (each bound also allows the measured scheduling lag of the test process: %s)\n", lag.Round(time.Millisecond))
	fmt.Fprintf(&b, "  %-24s %10s %10s  %s\n", "stage", "max", "bound", "bound is")
	for _, k := range allStageKeys() {
		sb := d.stageBound(k.Role, k.Stage)
		got := m.max[k]
		verdict := "ok"
		if got > sb.Bound {
			verdict = "ok only with the scheduling lag"
		}
		if got > sb.Bound+lag {
			verdict = "EXCEEDED"
			violations = append(violations, fmt.Sprintf("%s: a request stayed %s (on %s), bound %s (%s) + scheduling lag %s",
				k, got.Round(time.Millisecond), m.at[k], sb.Bound, sb.Why, lag.Round(time.Millisecond)))
		}
		fmt.Fprintf(&b, "  %-24s %10s %10s  %s [%s]\n", k, got.Round(time.Millisecond), sb.Bound, sb.Why, verdict)
	}
	return b.String(), violations
}

// counts is a concurrent multiset of labels, for the summary.
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

// newCounts returns an empty multiset.
func newCounts() *counts { return &counts{m: make(map[string]int)} }

// add counts label n more times.
func (c *counts) add(label string, n int) {
	c.mu.Lock()
	c.m[label] += n
	c.mu.Unlock()
}

// get returns how many times label was counted.
func (c *counts) get(label string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[label]
}

// String lists the labels, most frequent first.
func (c *counts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.m))
	for k := range c.m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c.m[a] != c.m[b] {
			return c.m[b] - c.m[a]
		}
		return strings.Compare(a, b)
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-58s %6d\n", k, c.m[k])
	}
	return b.String()
}

package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/fault"
)

// derive mixes parts into seed (splitmix64 steps), so that every random
// stream of a run has its own seed derived from the run's.
func derive(seed uint64, parts ...uint64) uint64 {
	x := seed
	for _, p := range append(parts, 0) {
		x += p + 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		x = z ^ (z >> 31)
	}
	return x
}

// newRand returns a random stream of the run, for purpose tag.
func newRand(seed, tag uint64) *rand.Rand {
	return rand.New(rand.NewPCG(derive(seed, tag), derive(seed, tag, 1)))
}

// actionKind is a kind of chaos action.
type actionKind int

const (
	// actBurst sets fault configs on some KV backends for a while.
	actBurst actionKind = iota
	// actNetFreeze freezes every open KV connection (fault.Net.FreezeAll).
	actNetFreeze
	// actNetReset resets every open KV connection (fault.Net.ResetAll).
	actNetReset
	// actNetRandom makes new KV connections freeze or reset at random
	// for a while (fault.Net.SetConfig).
	actNetRandom
	// actKill stops a worker and restarts it on the same addresses.
	actKill
)

// String names the kind.
func (k actionKind) String() string {
	return [...]string{"burst", "net freeze", "net reset", "net random", "kill"}[k]
}

// Burst scopes: which KV backends a burst applies to. Scopes 0…3 are
// single workers (slot indices).
const (
	scopeAll     = -1
	scopePrefill = -2
	scopeDecode  = -3
)

// action is one step of the chaos schedule.
type action struct {
	// Gap is the pause before the action.
	Gap  time.Duration
	Kind actionKind
	// Target is the stage the action waits for (on any worker of its
	// role) before it strikes, so that every phase gets hit; the zero
	// stageKey strikes at once.
	Target stageKey
	// Scope is a burst's backends (scopeAll, scopePrefill, scopeDecode or
	// a slot index).
	Scope int
	// Label names a burst's faults, e.g. "drop[ROOM_RENEW]".
	Label string
	Fault fault.Config
	Net   fault.NetConfig
	// Dur is a burst's or a random-network window's length, a freeze's
	// length, or a killed worker's downtime.
	Dur time.Duration
	// Pick chooses among candidate workers (e.g. those with a request in
	// the target stage).
	Pick uint64
	// Crash makes a kill look like a crash to the peers: every KV
	// connection freezes for Freeze first, so the killed worker's aborts
	// and FIN reach nobody and the peers must notice the silence.
	Crash  bool
	Freeze time.Duration
}

// scheduleGen draws chaos actions from a seeded stream, one at a time.
type scheduleGen struct {
	rng *rand.Rand
	// killWeight is the share of kills among actions.
	killWeight float64
	slots      int
}

// between draws a duration uniformly from [lo, hi].
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// faultTypes are the frame types a burst may single out.
var faultTypes = []kvxfer.Type{kvxfer.TypeRoomOpen, kvxfer.TypeRoomReady, kvxfer.TypeRoomRenew, kvxfer.TypeKVChunk,
	kvxfer.TypeKVDone, kvxfer.TypeKVAck, kvxfer.TypeAbort, kvxfer.TypeAbortAck}

// next draws the next action.
func (g *scheduleGen) next() action {
	r := g.rng
	a := action{Gap: between(r, 100*time.Millisecond, 700*time.Millisecond), Pick: r.Uint64()}
	if r.Float64() < 0.7 {
		keys := allStageKeys()
		a.Target = keys[r.IntN(len(keys))]
	}
	x := r.Float64()
	switch {
	case x < g.killWeight:
		a.Kind = actKill
		a.Dur = between(r, 0, 500*time.Millisecond)
		a.Crash = r.IntN(2) == 0
		a.Freeze = between(r, 500*time.Millisecond, 1500*time.Millisecond)
	case x < g.killWeight+0.10:
		a.Kind = actNetFreeze
		// Some freezes are shorter than the heartbeat silence bound
		// (connections survive), some longer (peers lost).
		a.Dur = between(r, 50*time.Millisecond, 800*time.Millisecond)
	case x < g.killWeight+0.16:
		a.Kind = actNetReset
	case x < g.killWeight+0.24:
		a.Kind = actNetRandom
		a.Dur = between(r, 500*time.Millisecond, 2*time.Second)
		a.Net = fault.NetConfig{Freeze: 0.1 + 0.4*r.Float64(), FreezeFor: between(r, 100*time.Millisecond, 800*time.Millisecond),
			Reset: 0.05 + 0.25*r.Float64(), Within: time.Second}
	default:
		a.Kind = actBurst
		a.Dur = between(r, 100*time.Millisecond, 1500*time.Millisecond)
		switch y := r.IntN(4); y {
		case 0:
			a.Scope = scopeAll
		case 1:
			a.Scope = scopePrefill
		case 2:
			a.Scope = scopeDecode
		default:
			a.Scope = r.IntN(g.slots)
		}
		a.Fault, a.Label = randomFaults(r)
	}
	return a
}

// randomFaults draws one burst's faults and names them.
func randomFaults(r *rand.Rand) (fault.Config, string) {
	var c fault.Config
	kinds := []string{"drop", "duplicate", "reorder", "corrupt", "delay", "reset", "stall", "mixed"}
	k := kinds[r.IntN(len(kinds))]
	switch k {
	case "drop":
		c.Drop = 0.05 + 0.25*r.Float64()
	case "duplicate":
		c.Duplicate = 0.1 + 0.4*r.Float64()
	case "reorder":
		c.Reorder = 0.1 + 0.4*r.Float64()
		c.MaxDelay = between(r, 5*time.Millisecond, 30*time.Millisecond)
	case "corrupt":
		c.Corrupt = 0.02 + 0.18*r.Float64()
	case "delay":
		c.Delay = 0.2 + 0.6*r.Float64()
		c.MaxDelay = between(r, 10*time.Millisecond, 400*time.Millisecond)
	case "reset":
		c.Reset = 0.005 + 0.045*r.Float64()
	case "stall":
		c.Stall = 0.01 + 0.09*r.Float64()
		c.StallFor = between(r, 100*time.Millisecond, 600*time.Millisecond)
	case "mixed":
		c.Drop = 0.05 * r.Float64()
		c.Duplicate = 0.1 * r.Float64()
		c.Reorder = 0.1 * r.Float64()
		c.Corrupt = 0.03 * r.Float64()
		c.Delay = 0.2 * r.Float64()
		c.MaxDelay = between(r, 10*time.Millisecond, 200*time.Millisecond)
		c.Reset = 0.01 * r.Float64()
		c.Stall = 0.02 * r.Float64()
		c.StallFor = between(r, 100*time.Millisecond, 400*time.Millisecond)
	}
	label := k
	// Sometimes single out one frame type: lost renewals, lost aborts,
	// lost acks each exercise their own deadline.
	if r.IntN(10) < 3 {
		t := faultTypes[r.IntN(len(faultTypes))]
		c.Types = []kvxfer.Type{t}
		label += "[" + t.String() + "]"
	}
	return c, label
}

// mergeFaults combines the faults of overlapping bursts: the highest
// probability and the longest durations of each kind, and the union of
// the frame types.
func mergeFaults(seed uint64, cs []fault.Config) fault.Config {
	out := fault.Config{Seed: seed}
	if len(cs) == 0 {
		return out
	}
	allTypes := false
	var types []kvxfer.Type
	for _, c := range cs {
		out.Delay = max(out.Delay, c.Delay)
		out.MaxDelay = max(out.MaxDelay, c.MaxDelay)
		out.Drop = max(out.Drop, c.Drop)
		out.Duplicate = max(out.Duplicate, c.Duplicate)
		out.Reorder = max(out.Reorder, c.Reorder)
		out.Corrupt = max(out.Corrupt, c.Corrupt)
		out.Reset = max(out.Reset, c.Reset)
		out.Stall = max(out.Stall, c.Stall)
		out.StallFor = max(out.StallFor, c.StallFor)
		if c.Types == nil {
			allTypes = true
		}
		for _, t := range c.Types {
			if !slices.Contains(types, t) {
				types = append(types, t)
			}
		}
	}
	if !allTypes {
		out.Types = types
	}
	return out
}

// describe is the action's row in the chaos log.
func (a action) describe() string {
	switch a.Kind {
	case actBurst:
		scope := map[int]string{scopeAll: "every worker", scopePrefill: "prefill workers", scopeDecode: "decode workers"}[a.Scope]
		if scope == "" {
			scope = fmt.Sprintf("worker slot %d", a.Scope)
		}
		return fmt.Sprintf("burst %s %+v on %s for %s", a.Label, a.Fault, scope, a.Dur)
	case actNetFreeze:
		return fmt.Sprintf("net freeze %s", a.Dur)
	case actNetRandom:
		return fmt.Sprintf("net random %+v for %s", a.Net, a.Dur)
	case actKill:
		if a.Crash {
			return fmt.Sprintf("crash (connections frozen %s), down %s", a.Freeze, a.Dur)
		}
		return fmt.Sprintf("kill, down %s", a.Dur)
	}
	return a.Kind.String()
}

package router

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Pair health. Every (prefill, decode) pair is a KV path of its own: two
// healthy workers may still fail every transfer between them (another
// --kv-auth, a route that is down). Each path has a circuit breaker:
//
//	closed --Failures consecutive path failures--> open --Cooldown--> half_open
//	half_open --its one probe request's KV arrives--> closed
//	half_open --the probe fails on the path--> open
//
// A path failure is an attempt that failed with peer_refused, peer_lost or
// failed_transfer on either leg; an attempt whose first token reached the
// router is a success. An open path is never paired; a half-open one takes
// one request (the probe) and no other until the probe ends. A decode
// worker's health answer reports each of its paths (kv_peers): one
// reported refused or unreachable opens at once (no request needs to fail
// first), one reported up again closes if that report was all that opened
// it. A worker whose every path to the other role's ready workers is open
// is held out of pairing (fleet.Set.Hold: not_ready, with the reason).
// SGLang's router keeps a circuit breaker per worker; a path breaker sees
// what a per-worker one cannot: both workers are fine, their pair is not.

// Breaker defaults.
const (
	DefaultBreakerFailures = 3
	DefaultBreakerCooldown = 10 * time.Second
)

// BreakerState is a pair breaker's state.
type BreakerState uint8

// Breaker states; the value is the pdserve_router_pair_breaker_state gauge.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

var breakerNames = [...]string{"closed", "half_open", "open"}

func (s BreakerState) String() string {
	if int(s) < len(breakerNames) {
		return breakerNames[s]
	}
	return fmt.Sprintf("breaker(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s BreakerState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// pathFailure reports an outcome that is the KV path's failure.
func pathFailure(o outcome.Outcome) bool {
	switch o {
	case outcome.PeerRefused, outcome.PeerLost, outcome.FailedTransfer:
		return true
	}
	return false
}

type pairKey struct{ p, d *fleet.Worker }

// breaker is one pair's state (under breakers.mu).
type breaker struct {
	open     bool      // open or half-open
	openedAt time.Time // the cool-down runs from here
	failures int       // consecutive path failures while closed
	reason   string    // why it opened
	byReport bool      // opened by decode's report, not by failures
	probing  bool      // half-open: the probe is in flight
}

// breakers are the router's pair breakers; a pair without an entry is
// closed.
type breakers struct {
	failures int
	cooldown time.Duration

	mu    sync.Mutex
	pairs map[pairKey]*breaker
}

func newBreakers(failures int, cooldown time.Duration) *breakers {
	return &breakers{failures: failures, cooldown: cooldown, pairs: make(map[pairKey]*breaker)}
}

// stateLocked is b's state at now (bs.mu held).
func (bs *breakers) stateLocked(b *breaker, now time.Time) BreakerState {
	switch {
	case b == nil || !b.open:
		return BreakerClosed
	case now.Sub(b.openedAt) >= bs.cooldown:
		return BreakerHalfOpen
	}
	return BreakerOpen
}

// state returns the pair's state and, open or half-open, why it opened.
func (bs *breakers) state(p, d *fleet.Worker, now time.Time) (BreakerState, string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.pairs[pairKey{p, d}]
	st := bs.stateLocked(b, now)
	if st == BreakerClosed {
		return st, ""
	}
	return st, b.reason
}

// allows reports whether a new request may use the pair now: it is closed,
// or half-open with no probe in flight.
func (bs *breakers) allows(p, d *fleet.Worker, now time.Time) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.pairs[pairKey{p, d}]
	switch bs.stateLocked(b, now) {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		return !b.probing
	}
	return false
}

// panicAllows reports whether a pair is open by its own failures only (not
// by decode's report that the path is refused or unreachable): when every
// pair is open, the router tries those anyway (Envoy's panic mode) rather
// than fail every request.
func (bs *breakers) panicAllows(p, d *fleet.Worker) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.pairs[pairKey{p, d}]
	return b == nil || !b.byReport
}

// acquire claims the pair for a request chosen on it: always for a closed
// pair; for a half-open one only if no probe is in flight, and the request
// is then the probe (probe true). ok false: another request took the probe.
func (bs *breakers) acquire(p, d *fleet.Worker, now time.Time) (probe, ok bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.pairs[pairKey{p, d}]
	switch bs.stateLocked(b, now) {
	case BreakerClosed:
		return false, true
	case BreakerHalfOpen:
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
	return false, false
}

// success records an attempt on the pair whose KV arrived: the pair closes.
func (bs *breakers) success(p, d *fleet.Worker) (changed bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	k := pairKey{p, d}
	b := bs.pairs[k]
	if b == nil {
		return false
	}
	delete(bs.pairs, k)
	return b.open
}

// failure records a path failure on the pair (why: the error): the pair
// opens after Failures in a row, or at once when it was half-open.
func (bs *breakers) failure(p, d *fleet.Worker, why string, now time.Time) (opened bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	k := pairKey{p, d}
	b := bs.pairs[k]
	if b == nil {
		b = &breaker{}
		bs.pairs[k] = b
	}
	if b.open {
		// A failure while open is a late attempt; while half-open, the
		// probe (or one that raced it): open again for a cool-down.
		b.openedAt, b.probing, b.reason, b.byReport = now, false, why, false
		return false
	}
	b.failures++
	if b.failures >= bs.failures {
		b.open, b.openedAt, b.reason = true, now, why
		return true
	}
	return false
}

// released ends a probe that neither succeeded nor failed on the path (the
// client left, another failure): the pair stays half-open for the next.
func (bs *breakers) released(p, d *fleet.Worker) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.pairs[pairKey{p, d}]; b != nil {
		b.probing = false
	}
}

// reported applies decode's report of the path to p: refused or
// unreachable opens it (again: the cool-down restarts with each report),
// up closes it if a report opened it.
func (bs *breakers) reported(p, d *fleet.Worker, path workerapi.KVPath, now time.Time) (changed bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	k := pairKey{p, d}
	b := bs.pairs[k]
	switch path.State {
	case workerapi.KVPathRefused, workerapi.KVPathUnreachable:
		if b == nil {
			b = &breaker{}
			bs.pairs[k] = b
		}
		if b.open && !b.byReport {
			b.openedAt = now // already open by its failures: keep it so
			return false
		}
		changed = !b.open
		why := "KV handshake refused: " + path.Reason
		if path.State == workerapi.KVPathUnreachable {
			why = "KV connection failed: " + path.Reason
		}
		b.open, b.openedAt, b.reason, b.byReport, b.probing = true, now, why, true, false
		return changed
	case workerapi.KVPathUp:
		if b != nil && b.open && b.byReport {
			delete(bs.pairs, k)
			return true
		}
	}
	return false
}

// forget drops every pair of w (it left the fleet).
func (bs *breakers) forget(w *fleet.Worker) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for k := range bs.pairs {
		if k.p == w || k.d == w {
			delete(bs.pairs, k)
		}
	}
}

// pathOpen reports whether the pair is open (not half-open) now, and why.
func (bs *breakers) pathOpen(p, d *fleet.Worker, now time.Time) (bool, string) {
	st, why := bs.state(p, d, now)
	return st == BreakerOpen, why
}

// pairable reports whether w could take requests but for its KV paths:
// ready, or held.
func pairable(w *fleet.Worker) bool {
	st := w.State()
	return st == fleet.StateReady || (st == fleet.StateNotReady && w.Held() != "")
}

// compatible reports whether a prefill and a decode worker can pair: the
// prefill's KV address is known and their KV fingerprints match (as far as
// they are known: a worker that never passed a check has none yet).
func compatible(p, d *fleet.Worker) bool {
	if p.KVAddr() == "" {
		return false
	}
	pf, df := p.Info().Fingerprint, d.Info().Fingerprint
	return pf == (kvxfer.Fingerprint{}) || df == (kvxfer.Fingerprint{}) || pf.Mismatch(df) == ""
}

// heldPrefix starts the reason of a hold for broken KV paths, so that a
// hold for another reason is never released here.
const heldPrefix = "every KV path is open: "

// updateHolds holds the workers whose every path to a pairable worker of
// the other role is open, and releases those that have a path again.
func (r *Router) updateHolds() {
	now := r.clock.Now()
	pairables := func(role workerapi.Role) []*fleet.Worker {
		var out []*fleet.Worker
		for _, w := range r.set.Workers(role.String()) {
			if pairable(w) {
				out = append(out, w)
			}
		}
		return out
	}
	ps, ds := pairables(workerapi.RolePrefill), pairables(workerapi.RoleDecode)
	for _, side := range []struct {
		ws, others []*fleet.Worker
		prefill    bool
	}{{ps, ds, true}, {ds, ps, false}} {
		ready := 0
		for _, w := range side.ws {
			if w.Usable() {
				ready++
			}
		}
		for _, w := range side.ws {
			held := w.Held()
			if held != "" && !strings.HasPrefix(held, heldPrefix) {
				continue // held for another reason
			}
			open, why := r.everyPathOpen(w, side.others, side.prefill, now)
			switch {
			case open && held == "" && ready <= 1:
				// The last worker of its role that takes requests: keep
				// it (its paths' breakers still skip what they can).
			case open:
				if held != heldPrefix+why {
					r.set.Hold(w, heldPrefix+why)
					if held == "" {
						ready--
					}
				}
			case held != "":
				if r.set.Release(w) {
					ready++
				}
			}
		}
	}
}

// everyPathOpen reports whether w has paths to others (compatible workers
// of the other role) and every one is open, and why each is.
func (r *Router) everyPathOpen(w *fleet.Worker, others []*fleet.Worker, isPrefill bool, now time.Time) (bool, string) {
	var whys []string
	for _, o := range others {
		p, d := w, o
		if !isPrefill {
			p, d = o, w
		}
		if !compatible(p, d) {
			continue
		}
		open, why := r.breakers.pathOpen(p, d, now)
		if !open {
			return false, ""
		}
		whys = append(whys, o.URL()+": "+why)
	}
	slices.Sort(whys)
	return len(whys) > 0, strings.Join(whys, "; ")
}

// PairStatus is one (prefill, decode) pair in /debug/pairs.
type PairStatus struct {
	Prefill string       `json:"prefill"`
	Decode  string       `json:"decode"`
	State   BreakerState `json:"state"`
	Reason  string       `json:"reason,omitempty"`
}

// Pairs lists every compatible (prefill, decode) pair of the fleet with
// its breaker's state.
func (r *Router) Pairs() []PairStatus {
	now := r.clock.Now()
	var out []PairStatus
	for _, p := range r.set.Workers(workerapi.RolePrefill.String()) {
		for _, d := range r.set.Workers(workerapi.RoleDecode.String()) {
			if !compatible(p, d) {
				continue
			}
			st, why := r.breakers.state(p, d, now)
			out = append(out, PairStatus{Prefill: p.URL(), Decode: d.URL(), State: st, Reason: why})
		}
	}
	return out
}

// Package fleet is the router's worker set: it reconciles what the registry
// lists with the workers the router knows, health-checks them, and gives
// each a state that says whether new requests may go to it.
//
// # States
//
//	pending → ready ↔ not_ready → removed
//	             ↘ draining ↗
//
// A worker the registry lists for the first time is pending: it gets no
// request until SuccessThreshold health checks in a row pass (2, as
// SGLang's router). A ready worker becomes not_ready after FailureThreshold
// failed checks in a row (3), at once if the failure is definitive (the
// connection is refused: the process is gone; the worker answers as another
// process than before: it restarted), and ready again after
// SuccessThreshold passes. A worker that says it is draining (its own
// SIGTERM), that an operator drains through the admin API, or that the
// registry stopped listing while it still serves legs is draining: no new
// request goes to it, and the legs it serves finish. A worker leaves the set
// (removed) once the registry no longer lists it and it serves nothing, or
// fails its checks.
//
// # Unlisted grace
//
// A registry can lose its records without the workers going anywhere: an
// etcd restarted on an empty data directory lists nothing until every
// worker has registered again (about a second). With UnlistedGrace set, a
// usable worker that the registry stops listing stays usable for that long
// while its health checks pass: it is removed (or drained, if it serves
// legs) once the grace ends, at its first failed check, as soon as it
// answers that it is draining, or once another listed, usable entry serves
// the same worker process. Listed again within the grace, it goes on as if
// nothing happened.
//
// # Duplicates
//
// Two registry entries whose workers answer with one instance id are one
// process listed twice (a copied etcd record, two keys for one worker). The
// later entry is not_ready with the reason "duplicate of <id>", so the
// worker is paired, counted and load-balanced once; it takes over if the
// first entry goes away.
//
// Every worker has a Down channel, closed when it becomes not_ready or
// removed: legs in flight on it watch the channel and fail at once instead
// of waiting for a worker that no longer answers.
//
// A newly ready worker's share of new requests ramps up linearly over
// SlowStart (Weight), so a fresh instance is not flattened by the whole
// burst.
//
// # Concurrency
//
// A Set is safe for concurrent use. Run owns the registry and the health
// loop; everything else reads a snapshot under the set's lock or the
// worker's.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/registry"
)

// State is where a worker is in the router's view.
type State uint8

// Worker states.
const (
	StatePending State = iota + 1
	StateReady
	StateNotReady
	StateDraining
	StateRemoved
)

var stateNames = [...]string{"", "pending", "ready", "not_ready", "draining", "removed"}

func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// States lists every state, for metrics labels present from the start.
func States() []State {
	return []State{StatePending, StateReady, StateNotReady, StateDraining, StateRemoved}
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if s == 0 {
		return nil, nil
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is an
// error.
func (s *State) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*s = 0
		return nil
	}
	for i, n := range stateNames {
		if i > 0 && n == string(b) {
			*s = State(i)
			return nil
		}
	}
	return fmt.Errorf("fleet: unknown worker state %q", b)
}

// Info is what a health check learns about a worker.
type Info struct {
	Role        string
	Model       string
	Fingerprint kvxfer.Fingerprint
	// KVAddr is a prefill worker's KV channel address (host:port).
	KVAddr string
	// ContextLen is the context (prompt + output tokens) the worker
	// serves; KVCapacity its KV pool's size in tokens (pages × page size;
	// 0 when not known).
	ContextLen, KVCapacity int
	// Instance identifies the worker process: a new value is a restart.
	Instance string
	// Features are the request features the worker honours
	// (workerapi.Info.Features).
	Features []string
	// Draining is set when the worker refuses new legs (its SIGTERM).
	Draining bool
	// Live is the number of requests the worker holds; Parked the prefill
	// requests whose KV waits for decode.
	Live, Parked int
}

// Probe checks one worker, bounded by ctx. A nil error with Info is a pass;
// an error is a failure, and IsDefinitive tells a definitive one.
type Probe func(ctx context.Context, e registry.Entry) (Info, error)

// IsDefinitive reports a failure that needs no confirmation: nothing
// listens at the worker's address any more, or the caller has corroborated
// it (Definitive).
func IsDefinitive(err error) bool {
	var d definitive
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &d)
}

type definitive struct{ error }

func (d definitive) Unwrap() error { return d.error }

// Definitive marks err as needing no confirmation: Observe makes the worker
// not_ready at once (the router's probe of a pair whose KV connection was
// lost: the worker did not answer either).
func Definitive(err error) error { return definitive{err} }

// Config configures a Set.
type Config struct {
	Registry registry.Registry
	Probe    Probe
	// ModelName is the served model; a worker that serves another is not
	// used (its reason is shown).
	ModelName string
	// HealthInterval is the time between health checks of a worker (2 s);
	// CheckTimeout bounds one check (3 s).
	HealthInterval time.Duration
	CheckTimeout   time.Duration
	// SuccessThreshold passes make a worker ready (2); FailureThreshold
	// failures not_ready (3).
	SuccessThreshold int
	FailureThreshold int
	// SlowStart is how long a newly ready worker's weight ramps (0: 10 s;
	// negative: no ramp).
	SlowStart time.Duration
	// UnlistedGrace is how long a usable worker the registry stops listing
	// stays in the set while its checks pass (0: not at all; see the
	// package doc). A registry that loses its records for a moment (etcd
	// restarted empty) then does not empty the fleet.
	UnlistedGrace time.Duration
	// Clock is the clock (default: the real one).
	Clock  clock.WithTicker
	Logger *slog.Logger
	// OnChange, if set, is called (without locks held) after a worker
	// changed state.
	OnChange func(w *Worker, from, to State)
	// Describe, if set, adds what the set's user knows about a worker to
	// its Status (the router: its load estimate and its KV paths), as
	// Status.Pairing.
	Describe func(w *Worker) any
}

// Defaults of Config, after SGLang's router (success 2, failure 3).
const (
	DefaultHealthInterval   = 2 * time.Second
	DefaultCheckTimeout     = 3 * time.Second
	DefaultSuccessThreshold = 2
	DefaultFailureThreshold = 3
	DefaultSlowStart        = 10 * time.Second
	// DefaultUnlistedGrace is the router's --unlisted-grace with etcd or
	// Kubernetes membership: longer than a restarted etcd takes to hear
	// every worker register again (about a second) and than a re-list of
	// the API server, short enough that an entry deleted on purpose leaves
	// within a minute even if its process lingers.
	DefaultUnlistedGrace = 30 * time.Second
)

func (c *Config) defaults() error {
	if c.Registry == nil || c.Probe == nil {
		return errors.New("fleet: needs a registry and a probe")
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.SuccessThreshold <= 0 {
		c.SuccessThreshold = DefaultSuccessThreshold
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.SlowStart == 0 {
		c.SlowStart = DefaultSlowStart
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Worker is one member of the set.
type Worker struct {
	entry registry.Entry
	set   *Set
	legs  atomic.Int64

	mu        sync.Mutex
	state     State
	since     time.Time
	passes    int
	failures  int
	lastErr   string
	info      Info
	checked   bool
	readyAt   time.Time // zero: no slow start
	initial   bool      // listed in the set's first snapshot: its first ready has no slow start
	drainedBy string    // "", "worker", "admin", "registry"
	listed    bool      // the registry lists it
	// unlistedAt is when the registry stopped listing the worker while
	// it was usable: it is kept, usable, until UnlistedGrace after (zero:
	// listed, or not in its grace).
	unlistedAt time.Time
	seq        uint64 // order of joining the set (the earlier of two duplicates wins)
	// dup, when set, keeps a worker that passes its checks not_ready: its
	// process is listed under another entry too (says which).
	dup string
	// down ends when the worker becomes not_ready or is removed (a new
	// one is made when it is ready again).
	down       context.Context
	downCancel context.CancelFunc
	checking   bool
	// held, when set, keeps a worker that passes its checks not_ready, for
	// that reason, without failing its legs in flight (Hold).
	held string
}

// ID is the worker's registry identity.
func (w *Worker) ID() string { return w.entry.ID }

// URL is the worker API's base URL.
func (w *Worker) URL() string { return w.entry.URL }

// Role is "prefill", "decode" or "colocated".
func (w *Worker) Role() string { return w.entry.Role }

// Entry is the registry's entry for the worker.
func (w *Worker) Entry() registry.Entry { return w.entry }

// State returns the worker's state.
func (w *Worker) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// Info returns what the last passing health check learnt.
func (w *Worker) Info() Info {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.info
}

// KVAddr is a prefill worker's KV address: the registry's, else what the
// worker reported.
func (w *Worker) KVAddr() string {
	if w.entry.KVAddr != "" {
		return w.entry.KVAddr
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.info.KVAddr
}

// Down returns a channel closed when the worker becomes not_ready or is
// removed; legs in flight on it fail then.
func (w *Worker) Down() <-chan struct{} { return w.DownContext().Done() }

// DownContext returns a context that ends when the worker becomes
// not_ready or is removed (Down is its Done channel): a leg registers its
// cancellation on it with context.AfterFunc, without a goroutine.
func (w *Worker) DownContext() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.down
}

// Usable reports whether new requests may go to the worker: it is ready
// and its last health check passed. One failed check takes a ready worker
// out of new pairs at once (a frozen worker gets no new request while the
// failures that make it not_ready add up); its legs in flight go on, and
// its state stays ready until FailureThreshold failures.
func (w *Worker) Usable() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.usableLocked()
}

// usableLocked is Usable with w.mu held.
func (w *Worker) usableLocked() bool { return w.state == StateReady && w.failures == 0 }

// Failing reports whether the worker is ready but its last health check
// failed (fewer than FailureThreshold in a row): out of new pairs while a
// usable worker of its role is left, the router's last resort when none is
// (a missed check on a loaded host is not yet a lost worker).
func (w *Worker) Failing() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state == StateReady && w.failures > 0
}

// Weight is the worker's share of new requests in [0, 1]: 0 unless usable,
// ramping linearly from 0.1 to 1 over SlowStart after it became ready.
func (w *Worker) Weight() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.usableLocked() {
		return 0
	}
	ss := w.set.cfg.SlowStart
	if ss <= 0 || w.readyAt.IsZero() {
		return 1
	}
	f := float64(w.set.cfg.Clock.Since(w.readyAt)) / float64(ss)
	return min(1, max(0.1, f))
}

// Legs is the number of legs the router has in flight on the worker.
func (w *Worker) Legs() int { return int(w.legs.Load()) }

// AddLeg counts a leg sent to the worker; the returned function, called
// once when the leg ends, uncounts it.
func (w *Worker) AddLeg() (done func()) {
	w.legs.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			if w.legs.Add(-1) == 0 {
				w.set.legsDone(w)
			}
		})
	}
}

// setState moves w to s (w.mu held) and reports the change for OnChange.
func (w *Worker) setState(s State, now time.Time) (from State, changed bool) {
	if w.state == s {
		return s, false
	}
	from = w.state
	w.state, w.since = s, now
	switch s {
	case StateReady:
		w.readyAt = now
		if w.initial {
			// The fleet the router starts with takes requests at once:
			// ramping every worker together would only slow the start.
			w.initial, w.readyAt = false, time.Time{}
		}
		if w.down.Err() != nil {
			w.down, w.downCancel = context.WithCancel(context.Background())
		}
	case StateNotReady, StateRemoved:
		w.closeDown()
	}
	return from, true
}

// closeDown ends w's down context (w.mu held).
func (w *Worker) closeDown() { w.downCancel() }

// Status is one worker as GET /workers lists it.
type Status struct {
	ID     string `json:"id"`
	URL    string `json:"url"`
	Role   string `json:"role"`
	State  State  `json:"state"`
	Source string `json:"source"`
	// Legs is the router's legs in flight on the worker; Live and Parked
	// what the worker last reported.
	Legs      int       `json:"inflight_legs"`
	Live      int       `json:"live_requests"`
	ParkedKV  int       `json:"parked_kv"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last_error,omitempty"`
	// DrainedBy says who drains it: "worker" (its SIGTERM), "admin" or
	// "registry" (no longer listed).
	DrainedBy string  `json:"drained_by,omitempty"`
	Weight    float64 `json:"weight"`
	// Healthy is Usable: the worker is ready and its last check passed, so
	// new requests may go to it.
	Healthy bool `json:"healthy"`
	// SafeToDelete: the worker gets no new request and serves nothing, so
	// stopping it loses no work.
	SafeToDelete bool   `json:"safe_to_delete"`
	KVAddr       string `json:"kv_addr,omitempty"`
	Instance     string `json:"instance,omitempty"`
	// ContextLen is the context (prompt + output tokens) the worker
	// serves, KVCapacity its KV pool in tokens, as its last check passed
	// said (absent before).
	ContextLen int `json:"context_len,omitempty"`
	KVCapacity int `json:"kv_capacity_tokens,omitempty"`
	// Invalid is set for registry entries that cannot be used, with why.
	Invalid string `json:"invalid,omitempty"`
	// Held says why a worker that passes its health checks is not_ready
	// (Hold: e.g. every KV path it has is broken); its legs in flight go on.
	Held string `json:"held,omitempty"`
	// Unlisted, when set, says that the registry no longer lists the
	// worker and how long it is kept while its checks pass (UnlistedGrace).
	Unlisted string `json:"unlisted,omitempty"`
	// Duplicate is the id of the entry the worker's process is listed under
	// first: this one is not_ready while that one is in the set.
	Duplicate string `json:"duplicate_of,omitempty"`
	// Pairing is what the router adds (Config.Describe).
	Pairing any `json:"pairing,omitempty"`
}

// Set is the router's workers. See the package doc.
type Set struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	workers map[string]*Worker // by ID
	invalid []registry.Entry
	synced  bool
	// lastSync is when the registry's last snapshot came.
	lastSync time.Time
	kick     chan struct{}
	seq      uint64 // the last Worker.seq given
}

// New returns a set; it contacts nothing until Run.
func New(cfg Config) (*Set, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Set{cfg: cfg, log: cfg.Logger.With("component", "fleet"), workers: make(map[string]*Worker),
		kick: make(chan struct{}, 1)}, nil
}

// Config returns the set's configuration, with defaults applied.
func (s *Set) Config() Config { return s.cfg }

// Registry is the set's registry.
func (s *Set) Registry() registry.Registry { return s.cfg.Registry }

// Run follows the registry and health-checks the workers until ctx ends.
func (s *Set) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.cfg.Registry.Run(ctx, s.Reconcile); err != nil && ctx.Err() == nil {
			s.log.Error("registry stopped", "registry", s.cfg.Registry.Name(), "err", err)
		}
	}()
	t := s.cfg.Clock.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-s.kick: // a worker joined: check it now
		}
		s.expireUnlisted()
		// Each worker is checked on its own goroutine: a worker that does
		// not answer delays nobody else's check (a check still running is
		// not started again).
		for _, w := range s.Workers("") {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.check(ctx, w)
			}()
		}
	}
}

// RegistryStatus is the registry's part of GET /workers.
type RegistryStatus struct {
	// Backend is "static", "etcd" or "kubernetes".
	Backend string `json:"backend"`
	// Synced: the router follows the registry: it has given a first
	// snapshot (until then the router has no worker and answers 503) and,
	// for a backend that checks its source (etcd, registry.HealthReporter),
	// the source answered its last check. While etcd is unreachable or
	// frozen it is false and the router serves the fleet it last saw.
	Synced bool `json:"synced"`
	// LastSync is when the registry last confirmed the fleet: the source's
	// last answer for a backend that checks it (etcd: every
	// --etcd-verify-interval), else its last snapshot. Absent before the
	// first snapshot.
	LastSync *time.Time `json:"last_sync,omitempty"`
	// LastSyncAge is LastSync's age in seconds, on the set's clock.
	LastSyncAge *float64 `json:"last_sync_age_seconds,omitempty"`
	// LastError is the backend's last failure to reach its source (etcd
	// unreachable), and LastErrorAt when; absent if none.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// RegistryStatus reports the registry's state: synced, when it last
// confirmed the fleet, its last error.
func (s *Set) RegistryStatus() RegistryStatus {
	st := RegistryStatus{Backend: s.cfg.Registry.Name()}
	s.mu.Lock()
	listed, last := s.synced, s.lastSync
	s.mu.Unlock()
	st.Synced = listed
	if hr, ok := s.cfg.Registry.(registry.HealthReporter); ok {
		h := hr.Health()
		st.Synced = listed && h.Up
		if h.LastOK.After(last) {
			last = h.LastOK
		}
	}
	if listed {
		age := max(s.cfg.Clock.Since(last).Seconds(), 0)
		st.LastSync, st.LastSyncAge = &last, &age
	}
	if er, ok := s.cfg.Registry.(registry.ErrorReporter); ok {
		if msg, at := er.LastError(); msg != "" {
			st.LastError = msg
			st.LastErrorAt = &at
		}
	}
	return st
}

// Synced reports whether the registry has given a first snapshot.
func (s *Set) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Reconcile makes the set follow a registry snapshot: new entries are added
// (pending, checked at once), changed ones replaced, and those no longer
// listed drained (if they serve legs) or removed.
func (s *Set) Reconcile(snap registry.Snapshot) {
	now := s.cfg.Clock.Now()
	var changes []change
	s.mu.Lock()
	first := !s.synced
	s.synced, s.lastSync = true, now
	s.invalid = s.invalid[:0]
	listed := make(map[string]bool, len(snap.Entries))
	added := false
	for _, e := range snap.Entries {
		if e.Invalid != "" {
			s.invalid = append(s.invalid, e)
			continue
		}
		listed[e.ID] = true
		if w, ok := s.workers[e.ID]; ok {
			if sameWorker(w.entry, e) {
				w.mu.Lock()
				w.listed = true
				if !w.unlistedAt.IsZero() {
					w.unlistedAt = time.Time{}
					s.log.Info("worker listed again within its unlisted grace", "worker", e.URL, "id", e.ID)
				}
				if w.drainedBy == "registry" {
					w.drainedBy = ""
					if from, ok := w.setState(StatePending, now); ok {
						changes = append(changes, change{w, from, StatePending})
					}
					w.passes = 0
				}
				w.mu.Unlock()
				continue
			}
			// Same identity, another address or role: a removal and an
			// addition.
			changes = append(changes, s.removeLocked(w, now, "its registry entry changed")...)
		}
		s.seq++
		w := &Worker{entry: e, set: s, state: StatePending, since: now, listed: true, initial: first,
			seq: s.seq}
		w.down, w.downCancel = context.WithCancel(context.Background())
		s.workers[e.ID] = w
		changes = append(changes, change{w, 0, StatePending})
		added = true
		s.log.Info("worker joined", "worker", e.URL, "worker_role", e.Role, "id", e.ID, "source", e.Source)
	}
	for id, w := range s.workers {
		if listed[id] {
			continue
		}
		changes = append(changes, s.unlistLocked(w, now, true, "no longer listed by the registry")...)
	}
	s.mu.Unlock()
	s.notify(changes)
	if added {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// unlistLocked applies the registry's not listing w (s.mu held): a usable
// worker is kept for UnlistedGrace (if grace and the grace has not ended);
// else one that serves legs drains them and leaves once they end, and the
// others leave the set now.
func (s *Set) unlistLocked(w *Worker, now time.Time, grace bool, why string) []change {
	w.mu.Lock()
	w.listed = false
	if grace && s.cfg.UnlistedGrace > 0 && w.usableLocked() && (w.unlistedAt.IsZero() || now.Sub(w.unlistedAt) < s.cfg.UnlistedGrace) {
		if w.unlistedAt.IsZero() {
			w.unlistedAt = now
			s.log.Info("worker no longer listed by the registry; kept while its health checks pass",
				"worker", w.entry.URL, "id", w.entry.ID, "grace", s.cfg.UnlistedGrace)
		}
		w.mu.Unlock()
		return nil
	}
	w.unlistedAt = time.Time{}
	legs := w.Legs()
	st := w.state
	if legs > 0 && (st == StateReady || st == StateDraining) {
		var changes []change
		if w.drainedBy == "" {
			w.drainedBy = "registry"
		}
		if from, ok := w.setState(StateDraining, now); ok {
			changes = append(changes, change{w, from, StateDraining})
		}
		w.mu.Unlock()
		s.log.Info("worker left the registry; draining its legs", "worker", w.entry.URL, "legs", legs, "reason", why)
		return changes
	}
	w.mu.Unlock()
	return s.removeLocked(w, now, why)
}

// expireUnlisted ends the grace of unlisted workers whose grace is over, or
// whose process another listed, usable entry serves.
func (s *Set) expireUnlisted() {
	if s.cfg.UnlistedGrace <= 0 {
		return
	}
	now := s.cfg.Clock.Now()
	var changes []change
	s.mu.Lock()
	served := map[string]string{} // instance → id of a listed, usable entry
	for _, w := range s.workers {
		w.mu.Lock()
		if w.listed && w.usableLocked() && w.info.Instance != "" {
			served[w.info.Instance] = w.entry.ID
		}
		w.mu.Unlock()
	}
	for _, w := range s.workers {
		w.mu.Lock()
		in := !w.listed && !w.unlistedAt.IsZero()
		over := in && now.Sub(w.unlistedAt) >= s.cfg.UnlistedGrace
		by := ""
		if in && w.info.Instance != "" {
			by = served[w.info.Instance]
		}
		w.mu.Unlock()
		switch {
		case over:
			changes = append(changes, s.unlistLocked(w, now, false, "no longer listed by the registry, unlisted grace over")...)
		case by != "":
			changes = append(changes, s.unlistLocked(w, now, false, "no longer listed; the registry lists its process as "+by)...)
		}
	}
	s.mu.Unlock()
	s.notify(changes)
}

type change struct {
	w        *Worker
	from, to State
}

func (s *Set) notify(changes []change) {
	if s.cfg.OnChange == nil {
		return
	}
	for _, c := range changes {
		s.cfg.OnChange(c.w, c.from, c.to)
	}
}

// sameWorker reports whether two entries of one ID describe the same
// worker (an address or role change is a new worker).
func sameWorker(a, b registry.Entry) bool {
	return a.URL == b.URL && a.Role == b.Role && a.KVAddr == b.KVAddr
}

// removeLocked drops w from the set (s.mu held).
func (s *Set) removeLocked(w *Worker, now time.Time, why string) []change {
	delete(s.workers, w.entry.ID)
	w.mu.Lock()
	from, ok := w.setState(StateRemoved, now)
	w.mu.Unlock()
	s.log.Info("worker removed", "worker", w.entry.URL, "id", w.entry.ID, "reason", why)
	if !ok {
		return nil
	}
	return []change{{w, from, StateRemoved}}
}

// legsDone is called when a worker's last leg ended: a worker the registry
// no longer lists leaves the set then.
func (s *Set) legsDone(w *Worker) {
	s.mu.Lock()
	var changes []change
	w.mu.Lock()
	gone := !w.listed && w.state == StateDraining && w.legs.Load() == 0
	w.mu.Unlock()
	if gone && s.workers[w.entry.ID] == w {
		changes = s.removeLocked(w, s.cfg.Clock.Now(), "drained: no longer listed and no leg left")
	}
	s.mu.Unlock()
	s.notify(changes)
}

// Workers returns the workers of a role ("" = every role), sorted by URL.
func (s *Set) Workers(role string) []*Worker {
	s.mu.Lock()
	out := make([]*Worker, 0, len(s.workers))
	for _, w := range s.workers {
		if role == "" || w.entry.Role == role {
			out = append(out, w)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Worker) int {
		if c := strings.Compare(a.entry.URL, b.entry.URL); c != 0 {
			return c
		}
		return strings.Compare(a.entry.ID, b.entry.ID)
	})
	return out
}

// Get returns the worker with the given ID.
func (s *Set) Get(id string) (*Worker, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[id]
	return w, ok
}

// CheckAll health-checks every worker at once, each within CheckTimeout,
// and waits for the answers; given roles, it checks the workers of each
// role in turn (all of one role at once), and only those. It answers a
// pending request to check every worker (a worker joined) too, and first
// ends the unlisted grace of workers whose grace is over.
func (s *Set) CheckAll(ctx context.Context, roles ...string) {
	select {
	case <-s.kick:
	default:
	}
	s.expireUnlisted()
	if len(roles) == 0 {
		s.Check(ctx, s.Workers("")...)
		return
	}
	for _, role := range roles {
		s.Check(ctx, s.Workers(role)...)
	}
}

// Check health-checks the given workers at once and waits for the answers
// (the router probes a failed pair before retrying).
func (s *Set) Check(ctx context.Context, ws ...*Worker) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.check(ctx, w)
		}()
	}
	wg.Wait()
}

func (s *Set) check(ctx context.Context, w *Worker) {
	w.mu.Lock()
	if w.checking || w.state == StateRemoved {
		w.mu.Unlock()
		return
	}
	w.checking = true
	w.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
	info, err := s.cfg.Probe(cctx, w.entry)
	cancel()
	w.mu.Lock()
	w.checking = false
	w.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		err = s.validate(w, info)
	}
	s.Observe(w, info, err)
}

// ErrMisconfigured marks a worker that answers but is not what the router
// expects (another role or model, a fingerprint its registry entry
// contradicts): it is not_ready at once, with the reason.
var ErrMisconfigured = errors.New("misconfigured worker")

// validate checks what a worker says it is against what the router expects.
func (s *Set) validate(w *Worker, info Info) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMisconfigured, fmt.Sprintf(format, args...))
	}
	switch {
	case info.Role != w.entry.Role:
		return bad("worker is a %s worker, listed as %s", info.Role, w.entry.Role)
	case s.cfg.ModelName != "" && info.Model != s.cfg.ModelName:
		return bad("worker serves model %q, router serves %q", info.Model, s.cfg.ModelName)
	case w.entry.Model != "" && info.Model != w.entry.Model:
		return bad("worker serves model %q, its registry entry says %q", info.Model, w.entry.Model)
	case w.entry.Fingerprint != nil && info.Fingerprint.Mismatch(*w.entry.Fingerprint) != "":
		return bad("worker's KV fingerprint differs from its registry entry: %s", info.Fingerprint.Mismatch(*w.entry.Fingerprint))
	case w.entry.Role == registry.RolePrefill && w.entry.KVAddr == "" && info.KVAddr == "":
		return bad("prefill worker reports no KV address")
	}
	return nil
}

// Observe applies one health check's (or probe's, or failed call's) result
// to w: err nil is a pass with info.
func (s *Set) Observe(w *Worker, info Info, err error) {
	now := s.cfg.Clock.Now()
	var changes []change
	dup := ""
	if err == nil {
		dup = s.duplicateOf(w, info.Instance)
	}
	w.mu.Lock()
	if w.state == StateRemoved {
		w.mu.Unlock()
		return
	}
	move := func(to State) {
		if from, ok := w.setState(to, now); ok {
			changes = append(changes, change{w, from, to})
		}
	}
	if err != nil {
		w.passes = 0
		w.failures++
		if w.lastErr != err.Error() || w.failures == 1 {
			s.log.Warn("worker failed a health check", "worker", w.entry.URL, "worker_role", w.entry.Role,
				"failures", w.failures, "err", err)
		}
		w.lastErr = err.Error()
		switch {
		case IsDefinitive(err) || errors.Is(err, ErrMisconfigured) || w.failures >= s.cfg.FailureThreshold:
			move(StateNotReady)
			// A held worker is not_ready already, with its Down open:
			// now that it fails on its own, its legs fail too.
			w.closeDown()
		}
		w.mu.Unlock()
		s.notify(changes)
		s.maybeForget(w)
		return
	}
	if dup != w.dup {
		if dup != "" {
			s.log.Warn("worker listed twice: this entry is not used", "worker", w.entry.URL, "id", w.entry.ID,
				"duplicate_of", dup, "instance", info.Instance)
		}
		w.dup = dup
	}
	restarted := w.checked && info.Instance != "" && w.info.Instance != "" && info.Instance != w.info.Instance
	w.checked = true
	if restarted {
		// Another process answers at this address: whatever was in flight
		// on the old one is gone, and the new one starts over.
		s.log.Warn("worker restarted (new instance)", "worker", w.entry.URL, "old", w.info.Instance, "new", info.Instance)
		move(StateNotReady)
		w.passes = 0
		if w.drainedBy == "worker" {
			w.drainedBy = "" // the old process drained; the new one is not draining yet
		}
	}
	w.info = info
	w.failures = 0
	w.lastErr = w.held
	if w.dup != "" {
		w.lastErr = "duplicate of " + w.dup + ": its process (instance " + info.Instance + ") is listed under that entry too"
	}
	w.passes++
	switch {
	case info.Draining:
		if w.drainedBy == "" {
			w.drainedBy = "worker"
		}
		move(StateDraining)
	case w.drainedBy == "worker":
		// The worker took new legs again (its drain was cancelled).
		w.drainedBy = ""
		move(StateReady)
	case w.drainedBy != "":
		move(StateDraining)
	case w.held != "":
		// Passing, but held out of pairing (Hold); Release brings it back.
	case w.dup != "":
		// Passing, but its process is paired under its other entry. Not
		// setState: legs in flight on it run on that same process.
		if w.state == StateReady || w.state == StatePending {
			changes = append(changes, change{w, w.state, StateNotReady})
			w.state, w.since = StateNotReady, now
		}
	case w.state == StateReady:
	case w.passes >= s.cfg.SuccessThreshold:
		move(StateReady)
	}
	takeover := w.listed && w.state == StateReady && len(changes) > 0
	w.mu.Unlock()
	s.notify(changes)
	s.maybeForget(w)
	if takeover {
		// An unlisted entry of the same process leaves now, not at the
		// next health tick: the process is not paired twice.
		s.expireUnlisted()
	}
}

// duplicateOf returns the id of another entry in the set whose worker
// answered with instance, if that entry comes first: both listed (or both
// not), the one that joined earlier. An unlisted entry in its grace and a
// listed one of the same process are not duplicates: the unlisted one
// leaves once the listed one is usable (expireUnlisted).
func (s *Set) duplicateOf(w *Worker, instance string) string {
	if instance == "" {
		return ""
	}
	w.mu.Lock()
	listed, seq := w.listed, w.seq
	w.mu.Unlock()
	first, firstSeq := "", seq
	for _, o := range s.Workers("") {
		if o == w {
			continue
		}
		o.mu.Lock()
		same := o.state != StateRemoved && o.checked && o.info.Instance == instance && o.listed == listed && o.seq < firstSeq
		if same {
			first, firstSeq = o.entry.ID, o.seq
		}
		o.mu.Unlock()
	}
	return first
}

// Hold makes a ready worker not_ready for why, without failing its legs in
// flight (its Down channel stays open), until Release: the router holds a
// worker whose every KV path is broken, which no health check of the worker
// alone can see. Health checks go on; a worker held while pending becomes
// ready only once released. Hold of a held worker updates the reason.
func (s *Set) Hold(w *Worker, why string) {
	now := s.cfg.Clock.Now()
	var changes []change
	w.mu.Lock()
	first := w.held == ""
	w.held = why
	if w.state == StateReady {
		// Not setState: that would close Down and fail the legs in flight.
		changes = append(changes, change{w, w.state, StateNotReady})
		w.state, w.since = StateNotReady, now
	}
	w.lastErr = why
	w.mu.Unlock()
	if first {
		s.log.Warn("worker held out of pairing", "worker", w.entry.URL, "worker_role", w.entry.Role, "reason", why)
	}
	s.notify(changes)
}

// Release ends a Hold: a held worker whose last health check passed (and
// enough of them) is ready again at once. It reports whether w was held.
func (s *Set) Release(w *Worker) bool {
	now := s.cfg.Clock.Now()
	var changes []change
	w.mu.Lock()
	if w.held == "" {
		w.mu.Unlock()
		return false
	}
	w.held = ""
	if w.lastErr != "" && w.failures == 0 {
		w.lastErr = ""
	}
	if w.state == StateNotReady && w.failures == 0 && w.passes >= s.cfg.SuccessThreshold {
		// Down was never closed by the hold (unless a failure closed it
		// since, which the failure count rules out).
		changes = append(changes, change{w, w.state, StateReady})
		w.state, w.since = StateReady, now
	}
	w.mu.Unlock()
	s.log.Info("worker released", "worker", w.entry.URL, "worker_role", w.entry.Role)
	s.notify(changes)
	return true
}

// Held returns why w is held ("" if it is not).
func (w *Worker) Held() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held
}

// maybeForget removes an unlisted worker that failed its checks or drains
// with no leg left, and ends the unlisted grace of one that failed a check
// or answered that it is draining.
func (s *Set) maybeForget(w *Worker) {
	w.mu.Lock()
	failing := !w.listed && w.state == StateNotReady && w.failures > 0
	drained := !w.listed && w.state == StateDraining && w.legs.Load() == 0
	graceOver := !w.listed && !w.unlistedAt.IsZero() && !w.usableLocked()
	w.mu.Unlock()
	if !failing && !drained && !graceOver {
		return
	}
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	var changes []change
	if s.workers[w.entry.ID] == w {
		switch {
		case failing:
			changes = s.removeLocked(w, now, "no longer listed and not answering")
		case drained:
			changes = s.removeLocked(w, now, "no longer listed and draining with no leg left")
		default:
			changes = s.unlistLocked(w, now, false, "no longer listed, and it failed a check in its unlisted grace")
		}
	}
	s.mu.Unlock()
	s.notify(changes)
}

// MarkDraining takes w out of new pairs at once: it answered that it is
// draining or shutting down, before its next health check says so.
func (s *Set) MarkDraining(w *Worker, why string) {
	now := s.cfg.Clock.Now()
	w.mu.Lock()
	var changes []change
	if w.state == StateReady || w.state == StatePending {
		if w.drainedBy == "" {
			w.drainedBy = "worker"
		}
		if from, ok := w.setState(StateDraining, now); ok {
			changes = append(changes, change{w, from, StateDraining})
			s.log.Info("worker draining", "worker", w.entry.URL, "reason", why)
		}
	}
	w.mu.Unlock()
	s.notify(changes)
}

// Errors of Drain and Resume.
var (
	// ErrUnknownWorker: no worker has the id.
	ErrUnknownWorker = errors.New("no such worker")
	// ErrConflict: the worker's state does not allow the change (the
	// admin API's 409).
	ErrConflict = errors.New("conflict")
)

// adminError is an error of kind (ErrUnknownWorker, ErrConflict) that
// reads as msg alone.
type adminError struct {
	kind error
	msg  string
}

func (e adminError) Error() string { return e.msg }
func (e adminError) Unwrap() error { return e.kind }

func adminErrorf(kind error, format string, args ...any) error {
	return adminError{kind, fmt.Sprintf(format, args...)}
}

// Drain (admin API) stops sending new requests to a worker; its legs in
// flight finish. Unless force, it refuses (ErrConflict) to drain the last
// usable worker of its role, which would leave the router unable to serve;
// draining a draining worker is a no-op. It returns ErrUnknownWorker for an
// unknown id.
func (s *Set) Drain(id string, force bool) error {
	w, ok := s.Get(id)
	if !ok {
		return adminErrorf(ErrUnknownWorker, "no worker %q", id)
	}
	if !force && w.Usable() {
		others := 0
		for _, o := range s.Workers(w.Role()) {
			if o != w && o.Usable() {
				others++
			}
		}
		if others == 0 {
			return adminErrorf(ErrConflict, "%s is the last ready %s worker: draining it leaves the router no %s worker to serve with (add ?force=true to drain it anyway)",
				id, w.Role(), w.Role())
		}
	}
	now := s.cfg.Clock.Now()
	w.mu.Lock()
	w.drainedBy = "admin"
	from, changed := w.setState(StateDraining, now)
	w.mu.Unlock()
	if changed {
		s.log.Info("worker drained by the admin API", "worker", w.entry.URL, "id", id, "forced", force)
		s.notify([]change{{w, from, StateDraining}})
	}
	return nil
}

// Resume (admin API) ends an operator's drain: the worker is checked again
// and takes requests once it passes. It returns ErrUnknownWorker for an
// unknown id and ErrConflict for a worker no operator drained (a worker
// draining on its own SIGTERM resumes only by itself).
func (s *Set) Resume(id string) error {
	w, ok := s.Get(id)
	if !ok {
		return adminErrorf(ErrUnknownWorker, "no worker %q", id)
	}
	now := s.cfg.Clock.Now()
	w.mu.Lock()
	if w.drainedBy != "admin" {
		st, by := w.state, w.drainedBy
		w.mu.Unlock()
		why := "it is " + st.String()
		if by != "" {
			why += " (drained by " + by + ", not the admin API)"
		}
		return adminErrorf(ErrConflict, "%s is not drained by the admin API, so there is nothing to resume: %s", id, why)
	}
	w.drainedBy = ""
	w.passes = 0
	var changes []change
	if from, ok := w.setState(StatePending, now); ok {
		changes = append(changes, change{w, from, StatePending})
	}
	w.mu.Unlock()
	s.notify(changes)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return nil
}

// Statuses lists every worker, then the registry's invalid entries, for
// GET /workers.
func (s *Set) Statuses() []Status {
	var out []Status
	for _, w := range s.Workers("") {
		st := w.Status()
		if s.cfg.Describe != nil {
			st.Pairing = s.cfg.Describe(w)
		}
		out = append(out, st)
	}
	s.mu.Lock()
	for _, e := range s.invalid {
		out = append(out, Status{ID: e.ID, URL: e.URL, Role: e.Role, State: StateRemoved, Source: e.Source,
			Invalid: e.Invalid, LastError: "invalid registry entry: " + e.Invalid})
	}
	s.mu.Unlock()
	return out
}

// Status describes w.
func (w *Worker) Status() Status {
	weight := w.Weight()
	w.mu.Lock()
	defer w.mu.Unlock()
	st := Status{ID: w.entry.ID, URL: w.entry.URL, Role: w.entry.Role, State: w.state, Source: w.entry.Source,
		Legs: w.Legs(), Live: w.info.Live, ParkedKV: w.info.Parked, Since: w.since, LastError: w.lastErr,
		DrainedBy: w.drainedBy, Weight: weight, KVAddr: w.entry.KVAddr, Instance: w.info.Instance,
		Healthy: w.usableLocked(), Held: w.held, Duplicate: w.dup, ContextLen: w.info.ContextLen, KVCapacity: w.info.KVCapacity}
	if !w.unlistedAt.IsZero() {
		st.Unlisted = fmt.Sprintf("not listed by the registry since %s; kept until %s while its checks pass",
			w.unlistedAt.UTC().Format(time.RFC3339), w.unlistedAt.Add(w.set.cfg.UnlistedGrace).UTC().Format(time.RFC3339))
	}
	if st.KVAddr == "" {
		st.KVAddr = w.info.KVAddr
	}
	quiet := st.Legs == 0 && (st.Live == 0 || !w.checked)
	st.SafeToDelete = quiet && (w.state == StateDraining || w.state == StateNotReady || w.state == StateRemoved)
	return st
}

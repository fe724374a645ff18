// Package etcd is the etcd backend of the fleet registry: workers register
// themselves under a lease that they keep alive, and routers list then watch
// the prefix.
//
// # Layout
//
// One key per worker process, <prefix>workers/<id>, whose value is the JSON
// of a [Record]. The id is minted once per process (role and random bits),
// so a restarted worker is a new key: the router sees a new identity, never
// a stale one under an old name. The key is attached to a lease of
// --registry-ttl; the worker keeps the lease alive, deletes the key when it
// drains, and registers again (a new lease) if the lease was lost, for
// instance while etcd was unreachable for longer than the TTL.
//
// # Router side
//
// [Registry.Run] lists the prefix, hands the router the snapshot, then
// watches from the listed revision. A compaction, a watch error, a lost
// leader or a reconnect ends the watch; it lists again (with backoff while
// etcd cannot be reached). While etcd is unreachable the router hears
// nothing and keeps its last snapshot: an outage of the registry does not
// empty the fleet. A value that is not a valid record is listed with the
// reason (Entry.Invalid) and never used.
//
// A watch does not fail on an etcd that stops answering without closing its
// connections (a frozen process, a stuck host), and opening one waits for
// it, so beside the list and the watch Run probes etcd: a count-only read
// of the prefix every VerifyInterval, bounded by it. [Registry.Health] says
// whether etcd answered the last list or probe, and when it last did; the
// first failure after an answer logs a warning, the first answer after a
// failure an info line.
//
// etcd's client resumes a broken watch from the last revision it saw. An
// etcd that comes back without its data (a new data directory, a restore)
// starts its revisions over, so that watch would wait, silent, for a
// revision the new history reaches only much later. Every VerifyInterval
// the router reads the prefix's key count and etcd's revision (a count-only
// read): a revision lower than one the watch has seen, or a count that
// differs from the router's entries at a revision the watch has reached,
// ends the watch and lists again.
//
// # Concurrency
//
// A Registry's Run runs on the caller's goroutine, with its probe on one
// goroutine of its own that ends before Run returns; LastError and Health
// are safe to call from any goroutine. A Registration keeps its lease on
// one goroutine of its own, stopped by Deregister or Close.
package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/registry"
)

// DefaultPrefix is the key prefix of --etcd-prefix.
const DefaultPrefix = "/pdserve/"

// DefaultVerifyInterval is Config.VerifyInterval's default: an etcd that
// lost its data is noticed within it (after it answers again).
const DefaultVerifyInterval = 2 * time.Second

// MaxValueBytes bounds a registry value read from etcd; a larger one is
// listed as invalid.
const MaxValueBytes = 64 << 10

// Record is what a worker writes under its key.
type Record struct {
	// ID is the worker process's registry identity (the key's last part).
	ID string `json:"id"`
	// Role is "prefill", "decode" or "colocated".
	Role string `json:"role"`
	// URL is the worker API's base URL (--advertise-url).
	URL string `json:"url"`
	// KVAddr is a prefill worker's KV channel address as peers reach it.
	KVAddr string `json:"kv_addr,omitempty"`
	// Model is the served model's name.
	Model string `json:"model"`
	// Fingerprint is the worker's KV fingerprint.
	Fingerprint *kvxfer.Fingerprint `json:"fingerprint,omitempty"`
	// Started is when the worker process registered first.
	Started time.Time `json:"started"`
}

// NewID mints a worker's registry id: its role and 64 random bits.
func NewID(role string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return role + "-" + hex.EncodeToString(b[:])
}

// Config configures a client of the registry.
type Config struct {
	// Endpoints are etcd client URLs, e.g. http://127.0.0.1:2379.
	Endpoints []string
	// Prefix is the key prefix (default DefaultPrefix); it must end in "/".
	Prefix string
	// DialTimeout bounds connecting to etcd (default 5 s).
	DialTimeout time.Duration
	// Logger receives connection trouble, once per outage (default: none).
	Logger *slog.Logger
	// VerifyInterval is how often the router side checks its watch against
	// etcd's revision and key count (default 2 s; see the package doc).
	VerifyInterval time.Duration
}

func (c *Config) defaults() error {
	if len(c.Endpoints) == 0 {
		return errors.New("etcd: no endpoints (--etcd-endpoints)")
	}
	for _, e := range c.Endpoints {
		if _, err := registry.ParseURL(e); err != nil {
			return fmt.Errorf("etcd endpoint %q: want http://host:port", e)
		}
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		return fmt.Errorf("etcd prefix %q must start and end with /", c.Prefix)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.VerifyInterval <= 0 {
		c.VerifyInterval = DefaultVerifyInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Validate reports a configuration that cannot work (no endpoints, a bad
// endpoint URL or prefix).
func (c Config) Validate() error { return c.defaults() }

// Client opens an etcd client from the config. It does not wait for etcd:
// calls fail (and are retried by the callers here) while it is unreachable.
func Client(cfg Config) (*clientv3.Client, Config, error) {
	if err := cfg.defaults(); err != nil {
		return nil, cfg, err
	}
	// gRPC's default reconnect backoff grows to 2 minutes: after a long
	// outage the router would re-list, and workers register again, that
	// late — after the leases etcd restores on restart have expired and
	// taken the workers' records with them. Reconnect within a second.
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout,
		Logger: zap.NewNop(), DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 2 * time.Second,
			Backoff: grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})}})
	if err != nil {
		return nil, cfg, fmt.Errorf("etcd client: %w", err)
	}
	return cli, cfg, nil
}

func workersPrefix(prefix string) string { return prefix + "workers/" }

// Registry is the router side: a registry.Registry reading etcd.
type Registry struct {
	cli    *clientv3.Client
	cfg    Config
	log    *slog.Logger
	owned  bool
	relist time.Duration

	mu        sync.Mutex
	lastErr   string
	lastErrAt time.Time
	up        bool      // etcd answered the last call
	lastOK    time.Time // when etcd last answered
	listed    bool      // a snapshot was given
	warned    bool      // the outage under way was logged
}

// LastError implements registry.ErrorReporter: the last failure to reach
// etcd (a list or a probe), and when.
func (r *Registry) LastError() (string, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr, r.lastErrAt
}

// Health implements registry.HealthReporter: whether etcd answered the
// last list or probe (a count-only read every VerifyInterval, bounded by
// it, so an etcd stopped or frozen is down within twice VerifyInterval),
// and when it last did.
func (r *Registry) Health() registry.Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return registry.Health{Up: r.up, LastOK: r.lastOK}
}

// failed records a call to etcd that failed, and logs a warning once per
// outage.
func (r *Registry) failed(err error) {
	r.mu.Lock()
	r.lastErr, r.lastErrAt = err.Error(), time.Now()
	warn, listed := !r.warned, r.listed
	r.up, r.warned = false, true
	r.mu.Unlock()
	switch {
	case warn && !listed:
		r.log.Warn("etcd unreachable: no fleet listed yet, so requests are answered 503 no_worker until it answers; retrying",
			"endpoints", r.cfg.Endpoints, "err", err)
	case warn:
		r.log.Warn("etcd unreachable; serving the last snapshot of the fleet", "endpoints", r.cfg.Endpoints, "err", err)
	}
}

// answered records a call etcd answered; after an outage it logs msg at
// info with args (msg "": that etcd answers again).
func (r *Registry) answered(msg string, args ...any) {
	r.mu.Lock()
	back, listed := r.warned, r.listed
	r.up, r.warned, r.lastOK = true, false, time.Now()
	r.mu.Unlock()
	switch {
	case !back:
	case msg != "":
		r.log.Info(msg, args...)
	case listed:
		r.log.Info("etcd reachable again; following the fleet")
	default:
		r.log.Info("etcd reachable; listing the fleet")
	}
}

// New returns the router side of the etcd registry. Close closes its client.
func New(cfg Config) (*Registry, error) {
	cli, cfg, err := Client(cfg)
	if err != nil {
		return nil, err
	}
	r := NewWithClient(cli, cfg)
	r.owned = true
	return r, nil
}

// NewWithClient returns the router side on an existing client (not closed by
// Close).
func NewWithClient(cli *clientv3.Client, cfg Config) *Registry {
	_ = cfg.defaults()
	return &Registry{cli: cli, cfg: cfg, log: cfg.Logger.With("component", "registry", "registry", "etcd"),
		relist: 5 * time.Minute}
}

// Name implements registry.Registry.
func (r *Registry) Name() string { return "etcd" }

// Client returns the registry's etcd client, for others of the router that
// write to the same etcd (the planner's etcd actuator). It is closed with
// the Registry if New opened it.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// Prefix returns the registry's key prefix (it ends in "/").
func (r *Registry) Prefix() string { return r.cfg.Prefix }

// Close closes the client if New opened it.
func (r *Registry) Close() error {
	if r.owned {
		return r.cli.Close()
	}
	return nil
}

// backoff is the retry delay after n consecutive failures: 100 ms doubling
// to 5 s.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 6)
	return min(d, 5*time.Second)
}

// Run implements registry.Registry.
func (r *Registry) Run(ctx context.Context, update func(registry.Snapshot)) error {
	prefix := workersPrefix(r.cfg.Prefix)
	pctx, pcancel := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		r.probe(pctx, prefix)
	}()
	defer func() {
		pcancel()
		<-probed
	}()
	failures := 0
	// seen is the revision the last watch reached, until a list shows
	// whether etcd still has it (0: nothing to compare).
	var seen int64
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := r.cli.Get(lctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.failed(err)
			failures++
			if !sleep(ctx, backoff(failures)) {
				return ctx.Err()
			}
			continue
		}
		r.mu.Lock()
		listed := r.listed
		r.listed = true
		r.mu.Unlock()
		if listed {
			r.answered("etcd reachable again; fleet re-listed", "workers", len(resp.Kvs))
		} else {
			r.answered("etcd reachable; fleet listed", "workers", len(resp.Kvs))
		}
		failures = 0
		if seen > resp.Header.Revision {
			// The watch ended (its stream broke on the restart) before a
			// verify saw the revision go back: the list tells it.
			r.warnLostData(fmt.Sprintf("%s: its revision went back from %d to %d", lostData, seen, resp.Header.Revision))
		}
		seen = 0
		entries := make(map[string]registry.Entry, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			e := decode(string(kv.Key), kv.Value, prefix)
			entries[e.ID] = e
		}
		update(snapshot(entries))
		// Watch from just after the listed revision, so no change between
		// the list and the watch is missed. WithRequireLeader ends the
		// watch when the member loses its leader, so a partitioned member
		// cannot feed a stale view for long.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := r.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		timer := time.NewTimer(r.relist)
		reason, rev := r.watch(ctx, wch, timer.C, resp.Header.Revision, entries, prefix, update)
		timer.Stop()
		wcancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if strings.HasPrefix(reason, lostData) {
			r.warnLostData(reason)
		} else {
			seen = rev
			r.log.Debug("etcd watch ended; listing again", "reason", reason)
		}
		failures++
		if !sleep(ctx, backoff(min(failures, 1))) {
			return ctx.Err()
		}
	}
}

// probe reads the prefix's key count every VerifyInterval, bounded by it,
// for Health, until ctx ends. It runs beside the list and the watch: a
// watch does not fail on a frozen etcd, and opening one waits, with no
// bound, for an etcd that does not answer.
func (r *Registry) probe(ctx context.Context, prefix string) {
	t := time.NewTicker(r.cfg.VerifyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.VerifyInterval)
		_, err := r.cli.Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.failed(err)
		default:
			r.answered("")
		}
	}
}

// warnLostData logs that etcd lost its data, and why.
func (r *Registry) warnLostData(reason string) {
	r.log.Warn("etcd lost its data; listing the fleet again (workers register again on their own)", "reason", reason)
}

// lostData starts the reason of a watch ended because etcd lost its data.
const lostData = "etcd lost its data"

// watch applies watch events to entries until the watch ends (an error, a
// compaction, the channel closing), relist fires, or verify finds the
// watch behind etcd (see the package doc), and says why, with the highest
// revision etcd showed meanwhile. rev is the revision entries reflect at
// the start.
//
// etcd's revision never goes back (reads are linearizable), so a verify
// that reads a revision below one etcd showed before — to the list, the
// watch or an earlier verify — means etcd lost its data. Events of other
// prefixes move the revision without reaching the watch, so verifies
// remember what they read.
func (r *Registry) watch(ctx context.Context, wch clientv3.WatchChan, relist <-chan time.Time, rev int64,
	entries map[string]registry.Entry, prefix string, update func(registry.Snapshot)) (string, int64) {
	verify := time.NewTicker(r.cfg.VerifyInterval)
	defer verify.Stop()
	high := rev
	for {
		select {
		case <-ctx.Done():
			return "stopped", high
		case <-relist:
			return "periodic re-list", high
		case <-verify.C:
			vctx, cancel := context.WithTimeout(ctx, r.cfg.VerifyInterval)
			resp, err := r.cli.Get(vctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			cancel()
			switch {
			case err != nil:
				// Unreachable: the watch's own reconnect handles it (and
				// probe reports it).
			case resp.Header.Revision < high:
				return fmt.Sprintf("%s: its revision went back from %d to %d", lostData, high, resp.Header.Revision), high
			case resp.Header.Revision == rev && resp.Count != int64(len(entries)):
				return fmt.Sprintf("%s: %d keys at revision %d, the watch has %d", lostData, resp.Count, rev, len(entries)), high
			default:
				high = resp.Header.Revision
			}
		case wr, ok := <-wch:
			if !ok {
				return "watch channel closed", high
			}
			if err := wr.Err(); err != nil {
				return err.Error(), high
			}
			rev = max(rev, wr.Header.Revision)
			high = max(high, rev)
			if wr.IsProgressNotify() || len(wr.Events) == 0 {
				continue
			}
			for _, ev := range wr.Events {
				id := strings.TrimPrefix(string(ev.Kv.Key), prefix)
				switch ev.Type {
				case clientv3.EventTypeDelete:
					delete(entries, id)
				case clientv3.EventTypePut:
					e := decode(string(ev.Kv.Key), ev.Kv.Value, prefix)
					entries[e.ID] = e
				}
			}
			update(snapshot(entries))
		}
	}
}

func snapshot(entries map[string]registry.Entry) registry.Snapshot {
	s := registry.Snapshot{Entries: make([]registry.Entry, 0, len(entries))}
	for _, e := range entries {
		s.Entries = append(s.Entries, e)
	}
	return s.Sorted()
}

// decode turns one key and value into an entry; a value that is not a
// valid record gives an entry whose Invalid says why.
func decode(key string, value []byte, prefix string) registry.Entry {
	id := strings.TrimPrefix(key, prefix)
	e := registry.Entry{ID: id, Source: "etcd"}
	if len(value) > MaxValueBytes {
		e.Invalid = fmt.Sprintf("value of %d bytes exceeds %d", len(value), MaxValueBytes)
		return e
	}
	var rec Record
	if err := json.Unmarshal(value, &rec); err != nil {
		e.Invalid = fmt.Sprintf("value is not a worker record: %v", err)
		return e
	}
	e.Role, e.URL, e.KVAddr, e.Model, e.Fingerprint = rec.Role, rec.URL, rec.KVAddr, rec.Model, rec.Fingerprint
	if rec.ID != id {
		e.Invalid = fmt.Sprintf("record id %q does not match its key %q", rec.ID, id)
		return e
	}
	if err := e.Validate(); err != nil {
		e.Invalid = err.Error()
		return e
	}
	if u, err := registry.ParseURL(e.URL); err == nil {
		e.URL = u
	}
	return e
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Registration keeps one worker's record in etcd under a lease.
type Registration struct {
	cli    *clientv3.Client
	key    string
	value  string
	ttl    time.Duration
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	lease   clientv3.LeaseID
	rev     int64  // etcd revision of the record's last write
	state   string // "registering", "registered", "deregistered"
	lastErr string
	renewed int // registrations made (1 + re-registrations after a lost lease)
}

// Register starts keeping rec under <prefix>workers/<rec.ID> with a lease of
// ttl (at least 2 s), on a goroutine of its own: it registers as soon as
// etcd answers, keeps the lease alive, and registers again with a new lease
// if the lease is lost. It returns at once; Registered reports progress.
// It returns an error only for a record that is not valid.
func Register(cli *clientv3.Client, cfg Config, rec Record, ttl time.Duration) (*Registration, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := registry.Entry{ID: rec.ID, Role: rec.Role, URL: rec.URL, KVAddr: rec.KVAddr}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("etcd registration: %w", err)
	}
	if ttl < 2*time.Second {
		return nil, fmt.Errorf("--registry-ttl must be at least 2s, got %s", ttl)
	}
	if rec.Started.IsZero() {
		rec.Started = time.Now().UTC()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Registration{cli: cli, key: workersPrefix(cfg.Prefix) + rec.ID, value: string(b), ttl: ttl,
		log:    cfg.Logger.With("component", "registry", "registry", "etcd", "key", workersPrefix(cfg.Prefix)+rec.ID),
		cancel: cancel, done: make(chan struct{}), state: "registering"}
	go g.run(ctx)
	return g, nil
}

// Key is the registration's etcd key.
func (g *Registration) Key() string { return g.key }

// Status says whether the record is in etcd now ("registered"), being
// (re-)registered, or deregistered; how many times it was registered; and
// the last error.
func (g *Registration) Status() (state string, registrations int, lastErr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state, g.renewed, g.lastErr
}

func (g *Registration) set(state, errMsg string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state, g.lastErr = state, errMsg
}

func (g *Registration) run(ctx context.Context) {
	defer close(g.done)
	failures := 0
	for ctx.Err() == nil {
		ka, err := g.register(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if failures == 0 {
				g.log.Warn("cannot register in etcd; retrying", "err", err)
			}
			g.set("registering", err.Error())
			failures++
			// Retry within a second: a restarted etcd restores old leases
			// with a fresh TTL, and the record must be back before they
			// expire.
			if !sleep(ctx, min(backoff(failures), time.Second)) {
				return
			}
			continue
		}
		if failures > 0 {
			g.log.Info("registered in etcd again")
		}
		failures = 0
		why := g.hold(ctx, ka)
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("etcd registration lost; registering again", "reason", why)
		g.set("registering", why)
	}
}

// hold keeps the record in place while the lease lives: it drains the
// keep-alive answers, and writes the record again if someone deletes or
// overwrites it (an operator's etcdctl del, a stray write). It returns why
// the registration must be made again.
func (g *Registration) hold(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) string {
	g.mu.Lock()
	lease, rev := g.lease, g.rev
	g.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := g.cli.Watch(wctx, g.key, clientv3.WithRev(rev+1))
	for {
		select {
		case _, ok := <-ka:
			if !ok {
				return "lease lost"
			}
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				// The watch ended (etcd unreachable, compaction): keep the
				// lease alive and watch again from now.
				if ctx.Err() != nil {
					return "stopped"
				}
				wch = g.cli.Watch(wctx, g.key)
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut && string(ev.Kv.Value) == g.value && clientv3.LeaseID(ev.Kv.Lease) == lease {
					continue
				}
				g.log.Warn("etcd record deleted or overwritten; writing it again")
				rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := g.cli.Put(rctx, g.key, g.value, clientv3.WithLease(lease))
				rcancel()
				if err != nil {
					return "record lost and not written again: " + err.Error()
				}
			}
		}
	}
}

// register grants a lease, writes the record under it and starts keeping it
// alive.
func (g *Registration) register(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	lease, err := g.cli.Grant(rctx, int64(g.ttl/time.Second))
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	put, err := g.cli.Put(rctx, g.key, g.value, clientv3.WithLease(lease.ID))
	if err != nil {
		return nil, fmt.Errorf("put %s: %w", g.key, err)
	}
	ka, err := g.cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return nil, fmt.Errorf("keep lease alive: %w", err)
	}
	g.mu.Lock()
	g.lease, g.rev, g.state, g.lastErr = lease.ID, put.Header.Revision, "registered", ""
	g.renewed++
	g.mu.Unlock()
	return ka, nil
}

// Deregister stops keeping the record and deletes it (revoking its lease),
// bounded by ctx; the router sees the worker leave at once instead of after
// the TTL. It is idempotent.
func (g *Registration) Deregister(ctx context.Context) error {
	g.cancel()
	<-g.done
	g.mu.Lock()
	lease, state := g.lease, g.state
	g.state = "deregistered"
	g.mu.Unlock()
	if state == "deregistered" {
		return nil
	}
	_, err := g.cli.Delete(ctx, g.key)
	if lease != 0 {
		_, rerr := g.cli.Revoke(ctx, lease)
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("etcd deregister %s: %w", g.key, err)
	}
	return nil
}

package main

import (
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/registry"
	etcdreg "github.com/pdserve/pdserve/internal/registry/etcd"
	"github.com/pdserve/pdserve/internal/registry/kube"
	"github.com/pdserve/pdserve/internal/router"
)

// etcdFlags name an etcd cluster and the registry's key prefix.
type etcdFlags struct {
	endpoints []string
	prefix    string
}

func (f *etcdFlags) add(fs *pflag.FlagSet, what string) {
	fs.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, "etcd client URLs, e.g. http://127.0.0.1:2379 (comma-separated): "+what)
	fs.StringVar(&f.prefix, "etcd-prefix", etcdreg.DefaultPrefix, "etcd key prefix of the fleet registry")
}

func (f *etcdFlags) config(log *slog.Logger) etcdreg.Config {
	return etcdreg.Config{Endpoints: splitURLs(f.endpoints), Prefix: f.prefix, Logger: log}
}

// registrationFlags make a worker register itself in etcd.
type registrationFlags struct {
	etcd        etcdFlags
	ttl         time.Duration
	advertise   string
	advertiseKV string
}

// addKV adds --advertise-kv-addr (prefill workers).
func (f *registrationFlags) addKV(fs *pflag.FlagSet) {
	fs.StringVar(&f.advertiseKV, "advertise-kv-addr", "", "KV channel address (host:port) decode workers should dial, registered in etcd (default: --advertise-url's host with --kv-port), for NAT, containers or a separate KV network")
}

func (f *registrationFlags) add(fs *pflag.FlagSet) {
	f.etcd.add(fs, "register this worker there under a lease")
	fs.DurationVar(&f.ttl, "registry-ttl", 10*time.Second, "lease of the etcd registration: a worker that dies leaves the fleet this long after (it is kept alive while the worker runs)")
	fs.StringVar(&f.advertise, "advertise-url", "", "worker API URL routers should use (default: from --host and --port); a prefill worker's KV port is advertised on the same host")
}

// options returns the worker's registration, nil without --etcd-endpoints.
func (f *registrationFlags) options() (*cluster.EtcdRegistration, error) {
	if len(splitURLs(f.etcd.endpoints)) == 0 {
		if f.advertise != "" || f.advertiseKV != "" {
			return nil, usagef("--advertise-url and --advertise-kv-addr need --etcd-endpoints (they are what the worker registers)")
		}
		return nil, nil
	}
	if f.ttl < 2*time.Second {
		return nil, usagef("--registry-ttl must be at least 2s, got %s", f.ttl)
	}
	if f.advertise != "" {
		if _, err := registry.ParseURL(f.advertise); err != nil {
			return nil, usagef("--advertise-url: %v", err)
		}
	}
	if f.advertiseKV != "" {
		if err := (registry.Entry{ID: "x", Role: registry.RolePrefill, URL: "http://x", KVAddr: f.advertiseKV}).Validate(); err != nil {
			return nil, usagef("--advertise-kv-addr %q: want host:port with a port from 1 to 65535", f.advertiseKV)
		}
	}
	cfg := f.etcd.config(nil)
	if err := cfg.Validate(); err != nil {
		return nil, usageError{err}
	}
	return &cluster.EtcdRegistration{Config: cfg, TTL: f.ttl, AdvertiseURL: f.advertise, AdvertiseKVAddr: f.advertiseKV}, nil
}

// discoveryFlags choose where the router finds its workers.
type discoveryFlags struct {
	discovery  string
	etcd       etcdFlags
	verify     time.Duration
	namespace  string
	selector   string
	kubeconfig string
}

func (f *discoveryFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.discovery, "discovery", "static", "where workers come from: static (--prefill/--decode/--colocated and POST /workers), etcd or kubernetes")
	f.etcd.add(fs, "--discovery etcd watches the workers registered there")
	fs.DurationVar(&f.verify, "etcd-verify-interval", etcdreg.DefaultVerifyInterval, "--discovery etcd: how often the router reads etcd, bounded by it, so an etcd stopped or frozen is reported (registry_status, pdserve_router_registry_up) within about twice it, and one that came back without its data is listed again")
	fs.StringVar(&f.namespace, "k8s-namespace", "", "--discovery kubernetes: namespace of the worker pods (default: every namespace the router may list); --planner-scaler kubernetes: namespace of the Deployments it scales (default: the kubeconfig context's, or the router pod's own)")
	fs.StringVar(&f.selector, "k8s-selector", kube.LabelRole, "--discovery kubernetes: label selector of worker pods (role from the pdserve.io/role label, ports from the pdserve.io/port and pdserve.io/kv-port annotations)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "--discovery kubernetes and --planner-scaler kubernetes: kubeconfig file (default: the in-cluster configuration)")
}

// registry builds the router's registry: nil for static (the router builds
// it from the worker lists).
func (f *discoveryFlags) registry(log *slog.Logger) (registry.Registry, error) {
	switch f.discovery {
	case "static":
		if len(splitURLs(f.etcd.endpoints)) > 0 {
			return nil, usagef("--etcd-endpoints is read with --discovery etcd only (the router's --discovery is static): add --discovery etcd, or drop --etcd-endpoints")
		}
		return nil, nil
	case "etcd":
		if len(splitURLs(f.etcd.endpoints)) == 0 {
			return nil, usagef("--discovery etcd needs --etcd-endpoints")
		}
		if f.verify < 10*time.Millisecond {
			return nil, usagef("--etcd-verify-interval must be at least 10ms, got %s", f.verify)
		}
		cfg := f.etcd.config(log)
		cfg.VerifyInterval = f.verify
		r, err := etcdreg.New(cfg)
		if err != nil {
			return nil, usageError{err}
		}
		return r, nil
	case "kubernetes":
		r, err := kube.New(kube.Config{Kubeconfig: f.kubeconfig, Namespace: f.namespace, Selector: f.selector, Logger: log})
		if err != nil {
			return nil, usageError{err}
		}
		return r, nil
	}
	return nil, usagef("--discovery %q: want static, etcd or kubernetes", f.discovery)
}

// minHealthInterval is --health-interval's floor: checks more often than
// this would load the workers more than they tell.
const minHealthInterval = 10 * time.Millisecond

// healthFlags tune the router's health checks of its workers.
type healthFlags struct {
	interval, timeout time.Duration
	success, failure  int
	slowStart         time.Duration
	unlistedGrace     time.Duration
	fs                *pflag.FlagSet
}

func (f *healthFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&f.interval, "health-interval", fleet.DefaultHealthInterval, "how often every worker is health-checked")
	fs.DurationVar(&f.timeout, "health-check-timeout", fleet.DefaultCheckTimeout, "bound on one health check")
	fs.IntVar(&f.success, "health-success-threshold", fleet.DefaultSuccessThreshold, "passing checks in a row before a worker takes requests")
	fs.IntVar(&f.failure, "health-failure-threshold", fleet.DefaultFailureThreshold, "failed checks in a row before a worker is not ready (its legs in flight fail); a refused connection counts at once")
	fs.DurationVar(&f.slowStart, "slow-start", fleet.DefaultSlowStart, "a worker that joins a serving fleet ramps its share of new requests up over this long (0: at once)")
	fs.DurationVar(&f.unlistedGrace, "unlisted-grace", fleet.DefaultUnlistedGrace, "--discovery etcd|kubernetes: a ready worker the registry stops listing keeps serving this long while its health checks pass (an etcd restarted empty does not empty the fleet); it leaves at once if a check fails or it drains (0: at once; static: always 0)")
	f.fs = fs
}

func (f *healthFlags) apply(o *cluster.RouterOptions, static bool) error {
	switch {
	case f.interval < minHealthInterval:
		return usagef("--health-interval must be at least %s, got %s", minHealthInterval, f.interval)
	case f.timeout <= 0:
		return usagef("--health-check-timeout must be positive, got %s", f.timeout)
	case f.unlistedGrace < 0:
		return usagef("--unlisted-grace must not be negative, got %s", f.unlistedGrace)
	case static && f.fs != nil && f.fs.Changed("unlisted-grace") && f.unlistedGrace > 0:
		return usagef("--unlisted-grace applies to --discovery etcd or kubernetes (static workers leave only through DELETE /workers)")
	case f.success < 1 || f.failure < 1:
		return usagef("--health-success-threshold and --health-failure-threshold must be at least 1")
	case f.slowStart < 0:
		return usagef("--slow-start must not be negative")
	}
	o.HealthInterval, o.CheckTimeout, o.SuccessThreshold, o.FailureThreshold = f.interval, f.timeout, f.success, f.failure
	o.SlowStart = f.slowStart
	if f.slowStart == 0 {
		o.SlowStart = -1 // fleet: no ramp
	}
	o.UnlistedGrace = f.unlistedGrace
	if f.unlistedGrace == 0 || static {
		o.UnlistedGrace = -1 // router: none
	}
	return nil
}

// pairingFlags choose how the router pairs workers and sheds load; the
// router command and up take them.
type pairingFlags struct {
	prefillPolicy, decodePolicy string
	cacheAware                  router.CacheAwareConfig
	loadInterval, loadStaleness time.Duration
	adm                         router.Admission
	breakerFailures             int
	breakerCooldown             time.Duration
	legTimeout                  time.Duration
	maxMigrations               int
	migrationWait               time.Duration
	disaggMinPromptTokens       int
}

func (f *pairingFlags) add(fs *pflag.FlagSet) {
	d := router.DefaultAdmission()
	policies := strings.Join(router.PolicyNames(), ", ")
	fs.StringVar(&f.prefillPolicy, "prefill-policy", router.PolicyLeastLoad, "how a prefill worker is chosen: "+policies+" (least_load: fewest outstanding prompt tokens; cache_aware: also the prompt's prefix the router sent there, see --cache-aware-weight)")
	fs.StringVar(&f.decodePolicy, "decode-policy", router.PolicyLeastLoad, "how a decode (or colocated) worker is chosen: "+policies+" (least_load: most KV headroom, then shortest queue; cache_aware: the prompt's prefix the router sent there against the tokens held)")
	fs.Float64Var(&f.cacheAware.Weight, "cache-aware-weight", router.DefaultCacheAwareWeight, "cache_aware: cost = w x uncached prompt tokens + the worker's load in tokens (prompt tokens queued on prefill, tokens held on decode); w > 0, higher favours the prefix's worker over balance")
	fs.IntVar(&f.cacheAware.MaxPages, "cache-aware-max-pages", router.DefaultCacheAwareMaxPages, "cache_aware: most KV pages the router records per worker (about 50 bytes each; the worker's KV pool size bounds it too)")
	fs.DurationVar(&f.cacheAware.TTL, "cache-aware-ttl", router.DefaultCacheAwareTTL, "cache_aware: a prefix not sent to a worker again within this long no longer counts as cached there")
	fs.DurationVar(&f.loadInterval, "load-interval", router.DefaultLoadInterval, "how often each worker's load (queue, KV pages, prompt tokens) is polled")
	fs.DurationVar(&f.loadStaleness, "load-staleness", router.DefaultLoadStaleness, "a worker's load report older than this is ignored: only the router's own count of its legs is used")
	fs.IntVar(&f.adm.DecodeQueue, "decode-queue-threshold", d.DecodeQueue, "a decode worker with this many requests waiting takes no new one (0: off)")
	fs.IntVar(&f.adm.DecodeQueueRecover, "decode-queue-recover", d.DecodeQueueRecover, "... until fewer than this many wait")
	fs.Float64Var(&f.adm.DecodeKV, "decode-kv-threshold", d.DecodeKV, "a decode worker whose KV pool use (0-1) reaches this takes no new request (0: off)")
	fs.Float64Var(&f.adm.DecodeKVRecover, "decode-kv-recover", d.DecodeKVRecover, "... until its KV pool use is below this")
	fs.IntVar(&f.adm.PrefillQueue, "prefill-queue-threshold", d.PrefillQueue, "a prefill worker with this many requests waiting takes no new one (0: off)")
	fs.IntVar(&f.adm.PrefillQueueRecover, "prefill-queue-recover", d.PrefillQueueRecover, "... until fewer than this many wait")
	fs.IntVar(&f.adm.MaxInflight, "max-inflight-requests", 0, "requests the router serves at once; more are answered 429 with Retry-After (0: no bound)")
	fs.DurationVar(&f.adm.RetryAfter, "overload-retry-after", d.RetryAfter, "Retry-After of the router's 429 answers")
	fs.IntVar(&f.breakerFailures, "pair-breaker-failures", router.DefaultBreakerFailures, "consecutive KV handshake or transfer failures of a (prefill, decode) pair that open its breaker")
	fs.DurationVar(&f.legTimeout, "leg-timeout", router.DefaultLegTimeout, "the router's cap on each exchange with a worker; must exceed the workers' --max-request-time (up raises it to that plus a minute)")
	fs.DurationVar(&f.breakerCooldown, "pair-breaker-cooldown", router.DefaultBreakerCooldown, "how long an open pair is skipped before one request probes it")
	fs.IntVar(&f.maxMigrations, "max-migrations", router.DefaultMaxMigrations, "how often one request whose output began reaching the client is continued on another pair (or colocated worker) when its worker fails under it — killed, unreachable, shut down, or its drain timed out; the continuation gives exactly the tokens an uninterrupted run would (0: never; the request then fails)")
	fs.IntVar(&f.disaggMinPromptTokens, "disagg-min-prompt-tokens", 0, "per-request disaggregation: a request whose prompt, less what its decode worker already caches (known with --decode-policy cache_aware), is shorter than this many tokens is served by the decode worker alone, which prefills it itself; the threshold rises by the prompt tokens the least loaded prefill worker has queued, up to "+strconv.Itoa(router.LocalBoostCap)+"x (Dynamo's max_local_prefill_length; 0: always disaggregate)")
	fs.DurationVar(&f.migrationWait, "migration-wait", router.DefaultMigrationWait, "how long a request being continued waits for a ready worker of a role when none is (the others may be restarting) before it fails (0: no wait)")
}

func (f *pairingFlags) apply(t *cluster.RouterTuning) error {
	for _, p := range []struct{ flag, v string }{{"prefill-policy", f.prefillPolicy}, {"decode-policy", f.decodePolicy}} {
		if !slices.Contains(router.PolicyNames(), p.v) {
			return usagef("--%s %q: want %s", p.flag, p.v, strings.Join(router.PolicyNames(), ", "))
		}
	}
	switch {
	case f.loadInterval <= 0 || f.loadStaleness <= 0:
		return usagef("--load-interval and --load-staleness must be positive")
	case f.loadStaleness < f.loadInterval:
		return usagef("--load-staleness (%s) must not be shorter than --load-interval (%s)", f.loadStaleness, f.loadInterval)
	case f.breakerFailures < 1 || f.breakerCooldown <= 0:
		return usagef("--pair-breaker-failures must be at least 1 and --pair-breaker-cooldown positive")
	case f.legTimeout <= 0:
		return usagef("--leg-timeout must be positive")
	case f.adm.RetryAfter <= 0:
		return usagef("--overload-retry-after must be positive")
	case f.maxMigrations < 0:
		return usagef("--max-migrations must not be negative, got %d (0: never)", f.maxMigrations)
	case f.disaggMinPromptTokens < 0:
		return usagef("--disagg-min-prompt-tokens must not be negative, got %d (0: always disaggregate)", f.disaggMinPromptTokens)
	case f.migrationWait < 0:
		return usagef("--migration-wait must not be negative, got %s (0: no wait)", f.migrationWait)
	case !(f.cacheAware.Weight > 0) || math.IsInf(f.cacheAware.Weight, 0):
		return usagef("--cache-aware-weight %v: want a positive number", f.cacheAware.Weight)
	case f.cacheAware.MaxPages < 1 || f.cacheAware.TTL <= 0:
		return usagef("--cache-aware-max-pages must be at least 1 and --cache-aware-ttl positive")
	}
	if err := f.adm.Validate(); err != nil {
		return usageError{err}
	}
	adm := f.adm
	*t = cluster.RouterTuning{PrefillPolicy: f.prefillPolicy, DecodePolicy: f.decodePolicy, CacheAware: f.cacheAware, LoadInterval: f.loadInterval,
		LoadStaleness: f.loadStaleness, Admission: &adm, BreakerFailures: f.breakerFailures, BreakerCooldown: f.breakerCooldown, LegTimeout: f.legTimeout,
		MaxMigrations: f.maxMigrations, MigrationWait: f.migrationWait, DisaggMinPromptTokens: f.disaggMinPromptTokens}
	if f.maxMigrations == 0 {
		t.MaxMigrations = -1 // router: never
	}
	if f.migrationWait == 0 {
		t.MigrationWait = -1 // router: no wait
	}
	return nil
}

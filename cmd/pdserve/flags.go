package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/tracing"
	"github.com/pdserve/pdserve/internal/worker"
)

// logFlags configure the slog logger.
type logFlags struct {
	level  string
	format string
}

func (f *logFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.format, "log-format", "text", "log format: text or json")
}

func (f *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch f.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", f.format)
}

// pprofFlags serve Go's profiles on a private address.
type pprofFlags struct{ addr string }

func (f *pprofFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.addr, "pprof-addr", "", "serve Go's profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060 (keep it private; empty: off)")
}

// start serves the profiles if asked; the returned function stops them.
func (f *pprofFlags) start(log *slog.Logger) (func(), error) {
	if f.addr == "" {
		return func() {}, nil
	}
	stop, err := cluster.StartPprof(f.addr, log)
	if err != nil {
		return nil, usagef("--pprof-addr %s: %v", f.addr, err)
	}
	return stop, nil
}

// modelFlags choose the model: the simulated one and its parameters.
type modelFlags struct {
	model        string
	servedName   string
	simLayers    int
	simKVHeads   int
	simHeadDim   int
	simDType     string
	simContext   int
	simPrefillMS float64
	simDecodeMS  float64
	simProfile   string
	kvDType      string
	// router says the flags are the router's, which has no KV cache: no
	// --kv-cache-dtype (nor its environment variable) to set.
	router  bool
	threads int
	kernels string
	fs      *pflag.FlagSet // to tell the flags given from the defaults
}

// The simulated model's defaults on the command line: what a GPU serving
// Llama-3-8B does, at a cost this machine can carry. Step times come from
// the H100 profile of Llama-3-8B (~28 ms to prefill 1,000 tokens, ~6 ms a
// decode step); the KV is one of its 32 layers (8 KV heads × 128 × bf16 ×
// K and V: 4 KiB per token), so moving a prompt's KV over loopback on a CPU
// (~1.5 GB/s end to end, docs/performance.md) takes about as long as moving
// all 32 layers (128 KiB per token) over a 400 Gb/s RDMA link. The sim
// package's own default stays the whole Llama-3-8B shape: --sim-layers 32
// gives it.
const (
	defaultSimProfile = "h100-llama3-8b"
	defaultSimLayers  = 1
	// noSimProfile turns the profile off (--sim-profile none).
	noSimProfile = "none"
)

// kvDTypeAuto is --kv-cache-dtype's default: the model's own choice
// (llama.DefaultKVDType for a checkpoint, --sim-dtype for the simulated
// model).
const kvDTypeAuto = "auto"

// SimModel is the --model value that selects the simulated model.
const SimModel = "sim"

func (f *modelFlags) add(fs *pflag.FlagSet) {
	g := sim.DefaultGeometry()
	g.Layers = defaultSimLayers
	f.fs = fs
	fs.StringVar(&f.model, "model", SimModel, `model to serve: "sim" (the simulated model, no weights), a Hugging Face checkpoint directory (config.json + safetensors; Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral, Mistral, Gemma 2 and 3, Phi-3) or a GGUF file (llama, qwen2, qwen3, qwen3moe, mistral, gemma2, gemma3, phi3; F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)`)
	f.kvDType = kvDTypeAuto
	if !f.router {
		fs.StringVar(&f.kvDType, "kv-cache-dtype", kvDTypeAuto, `KV cache element type: f32, bf16, f16, or "auto" (a checkpoint model: `+
			llama.DefaultKVDType.String()+`; the simulated model: --sim-dtype). Prefill and decode workers pair only if they agree`)
	}
	fs.IntVar(&f.threads, "threads", 0, "checkpoint model: goroutines per forward step (0: GOMAXPROCS)")
	fs.StringVar(&f.kernels, "llama-kernels", llama.KernelsAuto, "checkpoint model: matrix kernels ("+strings.Join(llama.KernelChoices, ", ")+"; every choice computes the same bits)")
	fs.StringVar(&f.servedName, "served-model-name", "", "model name in the API (default: the model's own)")
	fs.IntVar(&f.simLayers, "sim-layers", g.Layers, "simulated model: layers of KV (1 of Llama-3-8B's 32: 4 KiB per token; 32 for all of it)")
	fs.IntVar(&f.simKVHeads, "sim-kv-heads", g.KVHeads, "simulated model: KV heads")
	fs.IntVar(&f.simHeadDim, "sim-head-dim", g.HeadDim, "simulated model: head dimension")
	fs.StringVar(&f.simDType, "sim-dtype", g.DType.String(), "simulated model: KV dtype (f32, f16, bf16)")
	fs.IntVar(&f.simContext, "sim-context-len", sim.DefaultContextLen, "simulated model: context length in tokens")
	fs.Float64Var(&f.simPrefillMS, "sim-prefill-ms-per-token", 0, "simulated model: prefill time per prompt token, ms (instead of --sim-profile)")
	fs.Float64Var(&f.simDecodeMS, "sim-decode-ms-per-step", 0, "simulated model: time per batched decode step, ms (instead of --sim-profile)")
	fs.StringVar(&f.simProfile, "sim-profile", defaultSimProfile, "simulated model: GPU-like step times ("+strings.Join(sim.ProfileNames(), ", ")+
		`; "`+noSimProfile+`": no step time, or the two flags above; see docs/performance.md)`)
}

func msDuration(name string, ms float64) (time.Duration, error) {
	if ms < 0 || math.IsNaN(ms) || ms > 1e7 {
		return 0, usagef("--%s must be between 0 and 1e7 ms, got %v", name, ms)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// factory validates the flags and returns a constructor of model instances.
func (f *modelFlags) factory() (cluster.ModelFactory, error) {
	if f.model != SimModel {
		return f.llamaFactory()
	}
	dt, err := kvcache.ParseDType(f.simDType)
	if err != nil {
		return nil, usagef("--sim-dtype: %v", err)
	}
	if f.kvDType != kvDTypeAuto {
		kv, err := kvcache.ParseDType(f.kvDType)
		if err != nil {
			return nil, usagef("--kv-cache-dtype %q: want auto, f32, bf16 or f16", f.kvDType)
		}
		if f.fs != nil && f.fs.Changed("sim-dtype") && kv != dt {
			return nil, usagef("--kv-cache-dtype %s and --sim-dtype %s disagree; give one of them", kv, dt)
		}
		dt = kv
	}
	pre, err := msDuration("sim-prefill-ms-per-token", f.simPrefillMS)
	if err != nil {
		return nil, err
	}
	dec, err := msDuration("sim-decode-ms-per-step", f.simDecodeMS)
	if err != nil {
		return nil, err
	}
	cfg := sim.Config{Name: f.servedName,
		Geometry:   kvcache.Geometry{Layers: f.simLayers, KVHeads: f.simKVHeads, HeadDim: f.simHeadDim, DType: dt},
		ContextLen: f.simContext, PrefillPerToken: pre, DecodePerStep: dec}
	profile := f.simProfile
	msGiven := f.fs != nil && (f.fs.Changed("sim-prefill-ms-per-token") || f.fs.Changed("sim-decode-ms-per-step"))
	if msGiven && (f.fs == nil || !f.fs.Changed("sim-profile")) {
		profile = noSimProfile // step times given as flags replace the default profile
	}
	if profile != noSimProfile && profile != "" {
		if pre != 0 || dec != 0 {
			return nil, usagef("--sim-profile replaces --sim-prefill-ms-per-token and --sim-decode-ms-per-step; give one or the other")
		}
		p, err := sim.LookupProfile(profile)
		if err != nil {
			return nil, usagef("--sim-profile: %v", err)
		}
		cfg.Profile = &p
	}
	if f.simContext < 2 {
		return nil, usagef("--sim-context-len must be at least 2, got %d", f.simContext)
	}
	// Build one now so a bad configuration is a usage error, not a failure later.
	if _, err := sim.New(cfg); err != nil {
		return nil, usageError{err}
	}
	return func() (model.Model, error) { return sim.New(cfg) }, nil
}

// totalRAM is the machine's physical memory in bytes (0 if unknown).
func totalRAM() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// workerFlags configure a worker's pool, scheduler and deadlines.
type workerFlags struct {
	pageSize          int
	kvCacheMemory     string
	chunkedPrefill    int
	maxRunning        int
	maxQueued         int
	bootstrapTimeout  time.Duration
	queueTimeout      time.Duration
	kvHoldTimeout     time.Duration
	transferTimeout   time.Duration
	maxRequestTime    time.Duration
	heartbeatInterval time.Duration
	heartbeatMisses   int
	tombstoneTTL      time.Duration
	kvAuth            string
	metricsCompat     string
	optAttempts       int
	optMaxParked      float64
	optForce          float64
	admissionDelay    time.Duration
	noPrefixCache     bool
	schedulingPolicy  string
}

// Scheduling policies (--scheduling-policy, vLLM's names).
const (
	policyFCFS     = "fcfs"
	policyPriority = "priority"
)

// checkSchedulingPolicy refuses a --scheduling-policy that is not one, and
// reports whether it is priority.
func checkSchedulingPolicy(p string) (bool, error) {
	switch p {
	case policyFCFS:
		return false, nil
	case policyPriority:
		return true, nil
	}
	return false, usagef("--scheduling-policy %q: want %s or %s", p, policyFCFS, policyPriority)
}

// optimisticAlias is SGLang's older name of --optimistic-prefill-attempts,
// accepted on the command line.
const optimisticAlias = "optimistic-prefill-retries"

func (f *workerFlags) add(fs *pflag.FlagSet) {
	d := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	fs.IntVar(&f.pageSize, "page-size", d.PageSize, "tokens per KV cache page")
	fs.StringVar(&f.kvCacheMemory, "kv-cache-memory", "2GiB", "KV cache pool size in bytes (e.g. 2GiB, 512MiB): with a 2-byte --kv-cache-dtype (bf16, f16) it holds twice the tokens it holds in f32")
	fs.IntVar(&f.chunkedPrefill, "chunked-prefill-size", d.MaxPrefillTokens, "prompt tokens per prefill forward")
	fs.IntVar(&f.maxRunning, "max-running-requests", d.MaxRunning, "sequences in one forward: decoded per step (decode, serve), prompts computed together (prefill)")
	fs.IntVar(&f.maxQueued, "max-queued-requests", 0, "requests that may wait to start (not yet computing, or waiting for KV pages); one more is refused with 429 overloaded and Retry-After, and the router places it on another worker (0: no bound)")
	fs.DurationVar(&f.bootstrapTimeout, "bootstrap-timeout", d.BootstrapTimeout, "prefill: how long to wait for decode to open the room")
	fs.DurationVar(&f.queueTimeout, "queue-timeout", d.QueueTimeout, "how long a request may wait for a batch or for KV pages")
	fs.DurationVar(&f.kvHoldTimeout, "kv-hold-timeout", d.KVHoldTimeout, "prefill: how long to hold computed KV for a decode that has no pages yet")
	fs.DurationVar(&f.transferTimeout, "transfer-timeout", d.TransferTimeout, "how long a KV transfer may go without progress (decode: no KV chunk and no renewal of the room from prefill; prefill: KV_DONE to KV_ACK)")
	fs.DurationVar(&f.maxRequestTime, "max-request-time", d.MaxRequestTime, "hard cap on a request's time on a worker")
	fs.DurationVar(&f.heartbeatInterval, "heartbeat-interval", d.HeartbeatInterval, "KV channel heartbeat and room renewal interval")
	fs.IntVar(&f.heartbeatMisses, "heartbeat-misses", d.LeaseMisses, "missed heartbeats before a KV peer is dead; a room outlives its last renewal by one more")
	fs.DurationVar(&f.tombstoneTTL, "tombstone-ttl", d.TombstoneTTL, "how long aborted rooms are remembered")
	fs.StringVar(&f.kvAuth, "kv-auth", "", "shared secret for the KV channel only (deprecated: --internal-secret covers the KV channel and the worker API)")
	_ = fs.MarkDeprecated("kv-auth", "use --internal-secret (it also signs the worker API)")
	fs.StringVar(&f.metricsCompat, "metrics-compat", "", `also export another server's metric names on /metrics: "sglang" (SGLang's sglang:* series; see docs/coming-from-sglang.md)`)
	fs.StringVar(&f.schedulingPolicy, "scheduling-policy", policyFCFS, "the order of requests waiting to start: fcfs (arrival) or priority (the request's priority field, lower first, then arrival; the highest value is preempted first), as vLLM's --scheduling-policy")
	fs.BoolVar(&f.noPrefixCache, "disable-prefix-cache", false, "turn the prefix cache off: every prompt is computed in full and decode receives every page (on by default, as in SGLang and vLLM)")
	fs.IntVar(&f.optAttempts, "optimistic-prefill-attempts", d.OptimisticAttempts, "prefill: forward passes a request may take before decode opens its room (0: off; alias --"+optimisticAlias+")")
	fs.Float64Var(&f.optMaxParked, "optimistic-prefill-max-parked", d.OptimisticMaxParked, "prefill: fraction of the KV pool that optimistic KV not yet bound to its room may hold; at the cap new requests wait for their room")
	fs.Float64Var(&f.optForce, "test-force-optimistic-prefill", 0, "testing: fraction of requests, picked by a hash of the request id, whose room opening prefill holds back until their optimistic prefill ends")
	_ = fs.MarkHidden("test-force-optimistic-prefill")
	fs.DurationVar(&f.admissionDelay, "test-decode-admission-delay", 0, "testing and benchmarks: decode workers hold every arriving leg this long before admitting it, so rooms open late (a busy decode)")
	_ = fs.MarkHidden("test-decode-admission-delay")
	prev := fs.GetNormalizeFunc()
	fs.SetNormalizeFunc(func(fs *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == optimisticAlias {
			name = "optimistic-prefill-attempts"
		}
		return prev(fs, name)
	})
}

// options validates the flags into a worker template (Role, Model, Addr,
// KVListen and Logger are set by the caller).
func (f *workerFlags) options() (cluster.WorkerOptions, error) {
	mem, err := humanize.ParseBytes(f.kvCacheMemory)
	if err != nil || mem == 0 || mem > math.MaxInt64 {
		return cluster.WorkerOptions{}, usagef("--kv-cache-memory %q: want a size like 2GiB or 512MiB", f.kvCacheMemory)
	}
	if total := totalRAM(); total > 0 && mem > total {
		return cluster.WorkerOptions{}, usagef("--kv-cache-memory %s exceeds this machine's memory (%s)",
			f.kvCacheMemory, humanize.IBytes(total))
	}
	switch f.metricsCompat {
	case "", "none", worker.MetricsCompatSGLang:
	default:
		return cluster.WorkerOptions{}, usagef("--metrics-compat %q: want %q or none", f.metricsCompat, worker.MetricsCompatSGLang)
	}
	if f.pageSize < 1 || f.pageSize > kvcache.MaxPageSize {
		return cluster.WorkerOptions{}, usagef("--page-size must be between 1 and %d tokens, got %d", kvcache.MaxPageSize, f.pageSize)
	}
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	mc.PageSize = f.pageSize
	mc.MaxPrefillTokens = f.chunkedPrefill
	mc.MaxRunning = f.maxRunning
	mc.MaxQueued = f.maxQueued
	mc.BootstrapTimeout = f.bootstrapTimeout
	mc.QueueTimeout = f.queueTimeout
	mc.KVHoldTimeout = f.kvHoldTimeout
	mc.TransferTimeout = f.transferTimeout
	mc.MaxRequestTime = f.maxRequestTime
	mc.HeartbeatInterval = f.heartbeatInterval
	mc.LeaseMisses = f.heartbeatMisses
	mc.TombstoneTTL = f.tombstoneTTL
	mc.OptimisticAttempts = f.optAttempts
	mc.OptimisticMaxParked = f.optMaxParked
	mc.PrefixCache = !f.noPrefixCache
	prio, err := checkSchedulingPolicy(f.schedulingPolicy)
	if err != nil {
		return cluster.WorkerOptions{}, err
	}
	mc.PriorityScheduling = prio
	if !(f.optForce >= 0 && f.optForce <= 1) {
		return cluster.WorkerOptions{}, usagef("--test-force-optimistic-prefill must be a fraction in [0, 1], got %v", f.optForce)
	}
	if f.optForce > 0 {
		mc.ForceOptimistic = lifecycle.ForceFraction(f.optForce)
	}
	// Validate what the flags control; the worker fills in the model's part.
	check := mc
	check.PageBytes, check.ContextLen, check.VocabSize = 1, 1, 1
	if err := check.Validate(); err != nil {
		return cluster.WorkerOptions{}, usageError{fmt.Errorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))}
	}
	compat := f.metricsCompat
	if compat == "none" {
		compat = ""
	}
	if f.admissionDelay < 0 || f.admissionDelay > time.Minute {
		return cluster.WorkerOptions{}, usagef("--test-decode-admission-delay must be between 0 and 1m, got %s", f.admissionDelay)
	}
	return cluster.WorkerOptions{Machine: mc, KVCacheMemory: int64(mem), KVAuth: f.kvAuth, MetricsCompat: compat,
		AdmissionDelay: f.admissionDelay}, nil
}

// traceFlags turn on OpenTelemetry tracing (package tracing).
type traceFlags struct {
	endpoint string
	slow     time.Duration
}

func (f *traceFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&f.slow, "trace-slow-threshold", 0, "with a sampling ratio below 1 (OTEL_TRACES_SAMPLER_ARG), also export every request that takes this long (0: only the sampled ones and those that failed, were retried or were continued)")
	fs.StringVar(&f.endpoint, "otlp-traces-endpoint", "", "export a trace of every request over OTLP to this endpoint: grpc://host:4317, http://host:4318 or host:port (OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf); empty: the OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT variable, else off. Sampling: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG")
}

// providers makes the tracer providers of one process's components and
// flushes them all at the end.
type providers struct {
	ctx context.Context
	f   *traceFlags
	log *slog.Logger
	all []tracing.Provider
	err error
}

// newProviders returns the providers of a process with flags f.
func (f *traceFlags) newProviders(ctx context.Context, log *slog.Logger) *providers {
	return &providers{ctx: ctx, f: f, log: log}
}

// check returns the usage error forService would record, without making a
// provider: `up` checks before it starts its first component.
func (p *providers) check() error {
	if p.f.slow < 0 {
		return usagef("--trace-slow-threshold must not be negative, got %s", p.f.slow)
	}
	if err := tracing.Check(tracing.Config{Endpoint: p.f.endpoint, Service: "pdserve", SlowThreshold: p.f.slow}); err != nil {
		return usageError{err}
	}
	return nil
}

// forService returns service's tracer provider, or nil when tracing is off
// (an endpoint that cannot be used is remembered as err and is off too).
func (p *providers) forService(service string) trace.TracerProvider {
	if err := p.check(); err != nil {
		p.err = err
		return nil
	}
	tp, err := tracing.New(p.ctx, tracing.Config{Endpoint: p.f.endpoint, Service: service, SlowThreshold: p.f.slow,
		Logger: p.log.With("service", service)})
	if err != nil {
		p.err = usageError{err}
		return nil
	}
	if !tp.On {
		return nil
	}
	p.all = append(p.all, tp)
	return tp
}

// shutdown flushes the spans not yet exported, for up to 5 s.
func (p *providers) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tp := range p.all {
		if err := tp.Shutdown(ctx); err != nil {
			p.log.Warn("traces not flushed", "err", err)
		}
	}
}

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/router"
)

// TestMetricsCompatFlag: --metrics-compat takes "sglang" or none, from the
// command line or PDSERVE_METRICS_COMPAT, and refuses anything else with a
// usage error naming the flag.
func TestMetricsCompatFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		compat  string // the workers' MetricsCompat when accepted
		errWant string // in the error when refused
	}{
		{args: nil, compat: ""},
		{args: []string{"--metrics-compat", "sglang"}, compat: "sglang"},
		{args: []string{"--metrics-compat", "none"}, compat: ""},
		{env: map[string]string{"PDSERVE_METRICS_COMPAT": "sglang"}, compat: "sglang"},
		{args: []string{"--metrics-compat", "vllm"}, errWant: `--metrics-compat "vllm"`},
		{env: map[string]string{"PDSERVE_METRICS_COMPAT": "SGLang"}, errWant: `--metrics-compat "SGLang"`},
	} {
		var wf workerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		wf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, env(tc.env)); err != nil {
			t.Fatal(err)
		}
		wo, err := wf.options()
		if tc.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("%v %v: error %v, want %s", tc.args, tc.env, err, tc.errWant)
			}
			continue
		}
		if err != nil || wo.MetricsCompat != tc.compat {
			t.Errorf("%v %v: MetricsCompat %q, %v; want %q", tc.args, tc.env, wo.MetricsCompat, err, tc.compat)
		}
	}
	// `pdserve up` takes it too, for its workers.
	code, _, errOut := runArgs(t, nil, "up", "--metrics-compat", "bogus")
	if code != 2 || !strings.Contains(errOut, "--metrics-compat") {
		t.Fatalf("up --metrics-compat bogus: exit %d, %s", code, errOut)
	}
}

// TestPairingFlags: the router's pairing and load-shedding flags parse into
// its tuning (the defaults when absent, from the environment too), refuse
// bad values with a usage error naming the flag, and `pdserve up` has every
// one of them, as the router has.
func TestPairingFlags(t *testing.T) {
	parse := func(args []string, e map[string]string) (cluster.RouterTuning, error) {
		var pf pairingFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		pf.add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, env(e)); err != nil {
			t.Fatal(err)
		}
		var rt cluster.RouterTuning
		err := pf.apply(&rt)
		return rt, err
	}
	rt, err := parse(nil, nil)
	if err != nil || rt.PrefillPolicy != "least_load" || rt.DecodePolicy != "least_load" || *rt.Admission != router.DefaultAdmission() ||
		rt.LoadInterval != router.DefaultLoadInterval || rt.BreakerFailures != router.DefaultBreakerFailures {
		t.Fatalf("defaults: %+v %v", rt, err)
	}
	rt, err = parse([]string{"--prefill-policy", "power_of_two", "--decode-policy", "round_robin", "--decode-queue-threshold", "8",
		"--decode-queue-recover", "3", "--decode-kv-threshold", "0.95", "--decode-kv-recover", "0.9", "--prefill-queue-threshold", "6",
		"--prefill-queue-recover", "1", "--max-inflight-requests", "500", "--overload-retry-after", "2s", "--load-interval", "50ms",
		"--load-staleness", "300ms", "--pair-breaker-failures", "5", "--pair-breaker-cooldown", "30s"},
		map[string]string{"PDSERVE_MAX_INFLIGHT_REQUESTS": "7"})
	want := router.Admission{DecodeQueue: 8, DecodeQueueRecover: 3, DecodeKV: 0.95, DecodeKVRecover: 0.9, PrefillQueue: 6,
		PrefillQueueRecover: 1, MaxInflight: 500, RetryAfter: 2 * time.Second}
	if err != nil || rt.PrefillPolicy != "power_of_two" || rt.DecodePolicy != "round_robin" || *rt.Admission != want ||
		rt.LoadInterval != 50*time.Millisecond || rt.LoadStaleness != 300*time.Millisecond || rt.BreakerFailures != 5 ||
		rt.BreakerCooldown != 30*time.Second {
		t.Fatalf("set: %+v %+v %v", rt, rt.Admission, err)
	}
	if rt.CacheAware != (router.CacheAwareConfig{Weight: router.DefaultCacheAwareWeight, MaxPages: router.DefaultCacheAwareMaxPages,
		TTL: router.DefaultCacheAwareTTL}) {
		t.Fatalf("cache_aware defaults: %+v", rt.CacheAware)
	}
	rt, err = parse([]string{"--prefill-policy", "cache_aware", "--decode-policy", "cache_aware", "--cache-aware-weight", "2.5",
		"--cache-aware-max-pages", "4096", "--cache-aware-ttl", "90s"}, nil)
	if err != nil || rt.PrefillPolicy != router.PolicyCacheAware || rt.DecodePolicy != router.PolicyCacheAware ||
		rt.CacheAware != (router.CacheAwareConfig{Weight: 2.5, MaxPages: 4096, TTL: 90 * time.Second}) {
		t.Fatalf("cache_aware: %+v %v", rt, err)
	}
	if rt.LegTimeout != router.DefaultLegTimeout {
		t.Fatalf("leg timeout default: %v", rt.LegTimeout)
	}
	if rt, err = parse([]string{"--leg-timeout", "45m"}, nil); err != nil || rt.LegTimeout != 45*time.Minute {
		t.Fatalf("--leg-timeout 45m: %v %v", rt.LegTimeout, err)
	}
	if rt.MaxMigrations != router.DefaultMaxMigrations {
		t.Fatalf("--max-migrations default: %d", rt.MaxMigrations)
	}
	if rt, err = parse([]string{"--max-migrations", "5"}, nil); err != nil || rt.MaxMigrations != 5 {
		t.Fatalf("--max-migrations 5: %d %v", rt.MaxMigrations, err)
	}
	if rt, err = parse([]string{"--max-migrations", "0"}, nil); err != nil || rt.MaxMigrations >= 0 {
		t.Fatalf("--max-migrations 0 must turn continuations off: %d %v", rt.MaxMigrations, err)
	}
	if rt.MigrationWait != router.DefaultMigrationWait {
		t.Fatalf("--migration-wait default: %v", rt.MigrationWait)
	}
	if rt, err = parse([]string{"--migration-wait", "0s"}, nil); err != nil || rt.MigrationWait >= 0 {
		t.Fatalf("--migration-wait 0 must turn the wait off: %v %v", rt.MigrationWait, err)
	}
	if rt.DisaggMinPromptTokens != 0 {
		t.Fatalf("--disagg-min-prompt-tokens default: %d (want 0: always disaggregate)", rt.DisaggMinPromptTokens)
	}
	if rt, err = parse(nil, map[string]string{"PDSERVE_DISAGG_MIN_PROMPT_TOKENS": "256"}); err != nil || rt.DisaggMinPromptTokens != 256 {
		t.Fatalf("PDSERVE_DISAGG_MIN_PROMPT_TOKENS=256: %d %v", rt.DisaggMinPromptTokens, err)
	}
	for _, bad := range [][]string{
		{"--disagg-min-prompt-tokens", "-1"},
		{"--max-migrations", "-1"},
		{"--migration-wait", "-1s"},
		{"--prefill-policy", "random"},
		{"--decode-policy", "prefix"},
		{"--cache-aware-weight", "0"},
		{"--cache-aware-weight", "-1"},
		{"--cache-aware-max-pages", "0"},
		{"--cache-aware-ttl", "0s"},
		{"--decode-kv-threshold", "1.5"},
		{"--decode-queue-threshold", "2", "--decode-queue-recover", "3"},
		{"--load-staleness", "10ms"},
		{"--pair-breaker-failures", "0"},
		{"--max-inflight-requests", "-1"},
		{"--leg-timeout", "0s"},
	} {
		if _, err := parse(bad, nil); err == nil {
			t.Errorf("%v accepted", bad)
		} else if !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v is not a usage error", bad, err)
		}
	}
	var pf pairingFlags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	pf.add(fs)
	for _, cmd := range []string{"router", "up"} {
		c := newRoot(context.Background(), env(nil), io.Discard, io.Discard)
		sub, _, err := c.Find([]string{cmd})
		if err != nil {
			t.Fatal(err)
		}
		fs.VisitAll(func(f *pflag.Flag) {
			if sub.Flags().Lookup(f.Name) == nil {
				t.Errorf("pdserve %s has no --%s", cmd, f.Name)
			}
		})
	}
	if code, _, errOut := runArgs(t, nil, "up", "--decode-policy", "random"); code != 2 || !strings.Contains(errOut, "--decode-policy") {
		t.Fatalf("up --decode-policy random: exit %d, %s", code, errOut)
	}
}

// TestOptimisticPrefillFlags: --optimistic-prefill-attempts (or SGLang's
// older --optimistic-prefill-retries, or PDSERVE_OPTIMISTIC_PREFILL_ATTEMPTS)
// and --optimistic-prefill-max-parked reach the machine; out-of-range values
// and the flag on a worker that is not a prefill worker are usage errors.
func TestOptimisticPrefillFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		env       map[string]string
		attempts  int
		maxParked float64
		errWant   string
	}{
		{attempts: 0, maxParked: 0.25},
		{args: []string{"--optimistic-prefill-attempts", "3"}, attempts: 3, maxParked: 0.25},
		{args: []string{"--optimistic-prefill-retries", "2", "--optimistic-prefill-max-parked", "0.5"}, attempts: 2, maxParked: 0.5},
		{env: map[string]string{"PDSERVE_OPTIMISTIC_PREFILL_ATTEMPTS": "4"}, attempts: 4, maxParked: 0.25},
		{args: []string{"--optimistic-prefill-attempts", "1"}, env: map[string]string{"PDSERVE_OPTIMISTIC_PREFILL_ATTEMPTS": "4"}, attempts: 1, maxParked: 0.25},
		{args: []string{"--optimistic-prefill-attempts", "-1"}, errWant: "optimistic prefill attempts"},
		{args: []string{"--optimistic-prefill-attempts", "1", "--optimistic-prefill-max-parked", "1.5"}, errWant: "max parked"},
		{args: []string{"--test-force-optimistic-prefill", "2"}, errWant: "--test-force-optimistic-prefill"},
	} {
		var wf workerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		wf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, env(tc.env)); err != nil {
			t.Fatal(err)
		}
		wo, err := wf.options()
		if tc.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("%v %v: error %v, want %s", tc.args, tc.env, err, tc.errWant)
			}
			continue
		}
		if err != nil || wo.Machine.OptimisticAttempts != tc.attempts || wo.Machine.OptimisticMaxParked != tc.maxParked {
			t.Errorf("%v %v: attempts %d, max parked %v, %v; want %d, %v", tc.args, tc.env,
				wo.Machine.OptimisticAttempts, wo.Machine.OptimisticMaxParked, err, tc.attempts, tc.maxParked)
		}
	}
	for _, role := range []string{"decode", "serve"} {
		code, _, errOut := runArgs(t, nil, role, "--optimistic-prefill-attempts", "1")
		if code != 2 || !strings.Contains(errOut, "prefill workers only") {
			t.Fatalf("%s --optimistic-prefill-attempts 1: exit %d, %s", role, code, errOut)
		}
	}
}

// TestPrefixCacheFlag: the prefix cache is on by default, and
// --disable-prefix-cache (or PDSERVE_DISABLE_PREFIX_CACHE) turns it off,
// for every worker role and up (they share the worker flags).
func TestPrefixCacheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		on   bool
	}{
		{on: true},
		{args: []string{"--disable-prefix-cache"}, on: false},
		{args: []string{"--disable-prefix-cache=false"}, on: true},
		{env: map[string]string{"PDSERVE_DISABLE_PREFIX_CACHE": "true"}, on: false},
	} {
		var wf workerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		wf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, env(tc.env)); err != nil {
			t.Fatal(err)
		}
		wo, err := wf.options()
		if err != nil || wo.Machine.PrefixCache != tc.on {
			t.Errorf("%v %v: prefix cache %v, %v; want %v", tc.args, tc.env, wo.Machine.PrefixCache, err, tc.on)
		}
	}
	for _, cmd := range []string{"prefill", "decode", "serve", "up"} {
		code, _, errOut := runArgs(t, nil, cmd, "--disable-prefix-cache", "--help")
		if code != 0 || strings.Contains(errOut, "unknown flag") {
			t.Errorf("%s --disable-prefix-cache: exit %d, %s", cmd, code, errOut)
		}
	}
}

// TestSimDefaults: by default the simulated model takes the H100 profile's
// step times and one layer of Llama-3-8B's KV (4 KiB per token); step times
// given as flags replace the default profile, --sim-profile none has none,
// and a profile given with them is a usage error.
func TestSimDefaults(t *testing.T) {
	prefill1k := []model.SeqInput{{Pos: 0, Tokens: make([]int32, 1000)}}
	for _, tc := range []struct {
		args    []string
		layers  int
		min     time.Duration // StepLatency of a 1,000-token prefill
		max     time.Duration
		errWant string
	}{
		{args: nil, layers: 1, min: 20 * time.Millisecond, max: 40 * time.Millisecond},
		{args: []string{"--sim-layers", "32"}, layers: 32, min: 20 * time.Millisecond, max: 40 * time.Millisecond},
		{args: []string{"--sim-profile", "none"}, layers: 1, min: 0, max: 0},
		{args: []string{"--sim-prefill-ms-per-token", "0.5"}, layers: 1, min: 500 * time.Millisecond, max: 500 * time.Millisecond},
		{args: []string{"--sim-profile", "h100-llama3-8b", "--sim-decode-ms-per-step", "5"}, errWant: "one or the other"},
	} {
		var mf modelFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		mf.add(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		newModel, err := mf.factory()
		if tc.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("%v: error %v, want %s", tc.args, err, tc.errWant)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		m, err := newModel()
		if err != nil {
			t.Fatal(err)
		}
		s := m.(*sim.Model)
		if g := s.Info().Geometry; g.Layers != tc.layers || g.KVHeads != 8 || g.HeadDim != 128 || g.DType != kvcache.BF16 {
			t.Errorf("%v: geometry %+v, want %d layers of 8 KV heads × 128, bf16", tc.args, g, tc.layers)
		}
		if d := s.StepLatency(prefill1k); d < tc.min || d > tc.max {
			t.Errorf("%v: a 1,000-token prefill takes %s, want [%s, %s]", tc.args, d, tc.min, tc.max)
		}
	}
}

// TestPlannerFlags: --planner gives the planner its SLOs and timing; off,
// there is none; bad values and combinations are usage errors naming the
// flag.
func TestPlannerFlags(t *testing.T) {
	parse := func(args []string, flips bool) (*plannerFlags, error) {
		var f plannerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f.add(fs, flips)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &f, nil
	}
	f, err := parse(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := f.config(); c != nil || err != nil {
		t.Fatalf("without --planner: %+v %v", c, err)
	}
	f, _ = parse([]string{"--planner", "--ttft-slo", "500ms", "--itl-slo", "30ms", "--planner-dwell", "1m", "--planner-max-decode", "8"}, false)
	c, err := f.config()
	if err != nil || c.SLOs.TTFT != 500*time.Millisecond || c.SLOs.ITL != 30*time.Millisecond || c.Dwell != time.Minute || c.MaxDecode != 8 {
		t.Fatalf("planner config %+v %v", c, err)
	}
	for _, bad := range [][]string{
		{"--planner", "--ttft-slo", "0s"},
		{"--planner", "--itl-slo", "-1ms"},
		{"--planner", "--planner-window", "1s", "--planner-interval", "5s"},
		{"--planner", "--planner-min-prefill", "3", "--planner-max-prefill", "2"},
		{"flips", "--planner", "--planner-max-step", "-1"},
		{"flips", "--planner", "--planner-flip-drain-timeout", "0s"},
		{"--planner", "--planner-max-prefill", "0"},
		{"--planner", "--planner-max-decode", "-3"},
		{"--planner", "--planner-min-decode", "0"},
		{"--ttft-slo", "500ms"},
		{"flips", "--planner-flip-drain-timeout", "5s"},
		{"--planner-max-decode", "8"},
	} {
		flips := bad[0] == "flips"
		if flips {
			bad = bad[1:]
		}
		f, err := parse(bad, flips)
		if err == nil {
			_, err = f.config()
		}
		if err == nil || !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
	for _, args := range [][]string{
		{"up", "--planner", "--colocated-workers", "2"},
		{"up", "--planner", "--worker-port-base", "9000"},
		{"router", "--planner", "--colocated", "http://127.0.0.1:1"},
	} {
		if code, _, errOut := runArgs(t, nil, args...); code != 2 || !strings.Contains(errOut, "planner") {
			t.Errorf("%v: exit %d, %s", args, code, errOut)
		}
	}
}

// TestPlannerScalerFlags: --planner-scaler picks the router's actuator
// (kubernetes with its two Deployments in --k8s-namespace, etcd on the
// registry's client and prefix); a scaler without --planner, an unknown
// one, Deployments without the kubernetes scaler and etcd without
// --discovery etcd are usage errors that say what to add.
func TestPlannerScalerFlags(t *testing.T) {
	workers := []string{"router", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--planner-scaler", "kubernetes"}, "add --planner"},
		{[]string{"--planner", "--planner-scaler", "hpa"}, "want none, kubernetes or etcd"},
		{[]string{"--planner", "--planner-prefill-deployment", "p"}, "name what --planner-scaler kubernetes scales"},
		{[]string{"--planner", "--planner-scaler", "etcd"}, "add --discovery etcd"},
		{[]string{"--planner", "--planner-scaler", "kubernetes", "--planner-prefill-deployment", "p"}, "--planner-decode-deployment"},
	} {
		args := append(append([]string{}, workers...), c.args...)
		if code, _, errOut := runArgs(t, nil, args...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %s; want 2 and %q", c.args, code, errOut, c.want)
		}
	}

	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: inference}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--planner"}, ""},
		{[]string{"--planner", "--planner-scaler", "kubernetes", "--kubeconfig", kc, "--k8s-namespace", "llm",
			"--planner-prefill-deployment", "pd-prefill", "--planner-decode-deployment", "pd-decode"}, "kubernetes"},
		{[]string{"--planner", "--planner-scaler", "etcd", "--discovery", "etcd", "--etcd-endpoints", "http://127.0.0.1:1"}, "etcd"},
	} {
		var pf plannerFlags
		var df discoveryFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		pf.add(fs, false)
		df.add(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		reg, err := df.registry(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		a, err := pf.actuator(&df, reg, "r:8000", slog.New(slog.DiscardHandler))
		if closer, ok := reg.(interface{ Close() error }); ok {
			_ = closer.Close()
		}
		switch {
		case err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want == "" && a != nil:
			t.Errorf("%v: actuator %s, want none", c.args, a.Name())
		case c.want != "" && (a == nil || a.Name() != c.want || a.Flips()):
			t.Errorf("%v: actuator %v, want %s scaling each role", c.args, a, c.want)
		}
	}
}

// TestRouterHasNoKVCacheDType: the router, which has no KV cache, has no
// --kv-cache-dtype (an unknown flag, not one it would ignore), and
// PDSERVE_KV_CACHE_DTYPE exported for the workers of one shell does not
// stop it.
func TestRouterHasNoKVCacheDType(t *testing.T) {
	code, _, errOut := runArgs(t, nil, "router", "--kv-cache-dtype", "f16", "--colocated", "http://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut, "unknown flag: --kv-cache-dtype") {
		t.Errorf("exit %d, %s", code, errOut)
	}
	env := func(k string) (string, bool) {
		if k == "PDSERVE_KV_CACHE_DTYPE" {
			return "f16", true
		}
		return "", false
	}
	var f modelFlags
	f.router = true
	fs := pflag.NewFlagSet("router", pflag.ContinueOnError)
	f.add(fs)
	if err := applyEnv(fs, env); err != nil || fs.Lookup("kv-cache-dtype") != nil || f.kvDType != kvDTypeAuto {
		t.Errorf("router flags with PDSERVE_KV_CACHE_DTYPE set: %v, kv dtype %q", err, f.kvDType)
	}
}

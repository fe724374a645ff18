package main

import (
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/planner/etcdscale"
	"github.com/pdserve/pdserve/internal/planner/kubescale"
	"github.com/pdserve/pdserve/internal/registry"
	etcdreg "github.com/pdserve/pdserve/internal/registry/etcd"
)

// plannerFlags turn on the router's planner (package planner).
type plannerFlags struct {
	on                     bool
	ttft, itl              time.Duration
	interval, window       time.Duration
	dwell                  time.Duration
	minP, maxP, minD, maxD int
	maxStep                int
	flipDrain              time.Duration
	flips                  bool // `pdserve up`: the flip flags are registered
	// scaler names the router's actuator (--planner-scaler); prefillDep
	// and decodeDep the Deployments it scales on Kubernetes.
	scaler                string
	prefillDep, decodeDep string
	fs                    *pflag.FlagSet // to tell a tuning flag given without --planner
}

// add registers the flags; flips says whether the command flips roles
// (`pdserve up`) rather than publishing desired replicas (`pdserve router`).
func (f *plannerFlags) add(fs *pflag.FlagSet, flips bool) {
	what := "decide how many prefill and decode workers the load needs against --ttft-slo and --itl-slo, publish it (pdserve_planner_desired_replicas, GET /planner) for an HPA or an operator to follow"
	if flips {
		what = "flip workers between prefill and decode as the load calls for it, against --ttft-slo and --itl-slo (drain, restart in the other role, rejoin; GET /planner explains every decision)"
	}
	f.fs = fs
	fs.BoolVar(&f.on, "planner", false, what)
	fs.DurationVar(&f.ttft, "ttft-slo", planner.DefaultTTFTSLO, "planner: time-to-first-token target, met by 90 % of requests")
	fs.DurationVar(&f.itl, "itl-slo", planner.DefaultITLSLO, "planner: mean inter-token latency target of a request (its TPOT), met by 90 % of requests")
	fs.DurationVar(&f.interval, "planner-interval", planner.DefaultInterval, "planner: time between decisions")
	fs.DurationVar(&f.window, "planner-window", planner.DefaultWindow, "planner: the span arrival rates, lengths and throughputs are measured over")
	fs.DurationVar(&f.dwell, "planner-dwell", planner.DefaultDwell, "planner: how long a change must be called for before it is made, and the least time between two changes")
	f.flips = flips
	// `up` flips a fixed fleet: the bounds are the router's, for a scaler.
	f.minP, f.maxP, f.minD, f.maxD = 1, 64, 1, 64
	if flips {
		fs.IntVar(&f.maxStep, "planner-max-step", 0, "planner: the most workers one change flips (0: as many as the best split takes, together)")
		fs.DurationVar(&f.flipDrain, "planner-flip-drain-timeout", time.Minute, "planner: how long a flipped worker may take to finish its requests (what is left is continued on other workers)")
		return
	}
	fs.IntVar(&f.minP, "planner-min-prefill", 1, "planner: fewest prefill workers to ask for")
	fs.IntVar(&f.maxP, "planner-max-prefill", 64, "planner: most prefill workers to ask for")
	fs.IntVar(&f.minD, "planner-min-decode", 1, "planner: fewest decode workers to ask for")
	fs.IntVar(&f.maxD, "planner-max-decode", 64, "planner: most decode workers to ask for")
	fs.StringVar(&f.scaler, "planner-scaler", "none", "planner: what makes its counts real: none (publish pdserve_planner_desired_replicas for an HPA), kubernetes (scale --planner-prefill-deployment and --planner-decode-deployment through their scale subresource, in --k8s-namespace or the router pod's own), etcd (write them as JSON at <--etcd-prefix>planner/desired of --discovery etcd for an operator's tooling)")
	fs.StringVar(&f.prefillDep, "planner-prefill-deployment", "", "planner: --planner-scaler kubernetes: the prefill workers' Deployment")
	fs.StringVar(&f.decodeDep, "planner-decode-deployment", "", "planner: --planner-scaler kubernetes: the decode workers' Deployment")
}

// actuator returns the router's actuator (--planner-scaler): nil for
// none. reg is the router's registry (nil: static), routerID this
// router's identity as the etcd actuator writes it.
func (f *plannerFlags) actuator(df *discoveryFlags, reg registry.Registry, routerID string, log *slog.Logger) (planner.Actuator, error) {
	if f.scaler != "none" && f.scaler != "kubernetes" && f.scaler != "etcd" {
		return nil, usagef("--planner-scaler %q: want none, kubernetes or etcd", f.scaler)
	}
	if f.scaler != "none" && !f.on {
		return nil, usagef("--planner-scaler %s acts on the planner's decisions: add --planner", f.scaler)
	}
	if f.scaler != "kubernetes" && (f.prefillDep != "" || f.decodeDep != "") {
		return nil, usagef("--planner-prefill-deployment and --planner-decode-deployment name what --planner-scaler kubernetes scales (--planner-scaler is %s)", f.scaler)
	}
	switch f.scaler {
	case "kubernetes":
		s, err := kubescale.New(kubescale.Config{Kubeconfig: df.kubeconfig, Namespace: df.namespace,
			PrefillDeployment: f.prefillDep, DecodeDeployment: f.decodeDep, Logger: log})
		if err != nil {
			return nil, usageError{err}
		}
		return s, nil
	case "etcd":
		er, ok := reg.(*etcdreg.Registry)
		if !ok {
			return nil, usagef("--planner-scaler etcd writes to the etcd the router reads its workers from: add --discovery etcd")
		}
		s, err := etcdscale.New(etcdscale.Config{Client: er.Client(), Prefix: er.Prefix(), Router: routerID})
		if err != nil {
			return nil, usageError{err}
		}
		return s, nil
	}
	return nil, nil
}

// config returns the planner's configuration, nil without --planner.
func (f *plannerFlags) config() (*planner.Config, error) {
	if !f.on {
		// A planner flag without the planner would be silently ignored.
		for _, name := range []string{"ttft-slo", "itl-slo", "planner-interval", "planner-window", "planner-dwell",
			"planner-max-step", "planner-flip-drain-timeout", "planner-min-prefill", "planner-max-prefill",
			"planner-min-decode", "planner-max-decode"} {
			if f.fs != nil && f.fs.Changed(name) {
				return nil, usagef("--%s tunes the planner, which is off: add --planner", name)
			}
		}
		return nil, nil
	}
	for name, d := range map[string]time.Duration{"ttft-slo": f.ttft, "itl-slo": f.itl, "planner-interval": f.interval,
		"planner-window": f.window, "planner-dwell": f.dwell} {
		if d <= 0 {
			return nil, usagef("--%s must be positive, got %s", name, d)
		}
	}
	if f.window < f.interval {
		return nil, usagef("--planner-window (%s) must be at least --planner-interval (%s)", f.window, f.interval)
	}
	if f.maxStep < 0 {
		return nil, usagef("--planner-max-step must not be negative, got %d", f.maxStep)
	}
	if f.minP < 1 || f.minD < 1 || f.maxP < f.minP || f.maxD < f.minD {
		return nil, usagef("planner bounds: need 1 ≤ --planner-min-X ≤ --planner-max-X, got prefill %d..%d, decode %d..%d", f.minP, f.maxP, f.minD, f.maxD)
	}
	if f.flipDrain < 0 || (f.flips && f.flipDrain == 0) {
		return nil, usagef("--planner-flip-drain-timeout must be positive, got %s", f.flipDrain)
	}
	return &planner.Config{SLOs: planner.SLOs{TTFT: f.ttft, ITL: f.itl}, Interval: f.interval, Window: f.window, Dwell: f.dwell,
		MinPrefill: f.minP, MaxPrefill: f.maxP, MinDecode: f.minD, MaxDecode: f.maxD, MaxStep: f.maxStep}, nil
}

// routerID is the router's identity in what its planner writes: the host's
// name (on Kubernetes the pod's) and the router's port.
func routerID(port int) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

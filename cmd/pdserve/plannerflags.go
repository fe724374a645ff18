package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/planner"
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
}

// add registers the flags; flips says whether the command flips roles
// (`pdserve up`) rather than publishing desired replicas (`pdserve router`).
func (f *plannerFlags) add(fs *pflag.FlagSet, flips bool) {
	what := "decide how many prefill and decode workers the load needs against --ttft-slo and --itl-slo, publish it (pdserve_planner_desired_replicas, GET /planner) for an HPA or an operator to follow"
	if flips {
		what = "flip workers between prefill and decode as the load calls for it, against --ttft-slo and --itl-slo (drain, restart in the other role, rejoin; GET /planner explains every decision)"
	}
	fs.BoolVar(&f.on, "planner", false, what)
	fs.DurationVar(&f.ttft, "ttft-slo", planner.DefaultTTFTSLO, "planner: time-to-first-token target, met by 90 % of requests")
	fs.DurationVar(&f.itl, "itl-slo", planner.DefaultITLSLO, "planner: mean inter-token latency target of a request (its TPOT), met by 90 % of requests")
	fs.DurationVar(&f.interval, "planner-interval", planner.DefaultInterval, "planner: time between decisions")
	fs.DurationVar(&f.window, "planner-window", planner.DefaultWindow, "planner: the span arrival rates, lengths and throughputs are measured over")
	fs.DurationVar(&f.dwell, "planner-dwell", planner.DefaultDwell, "planner: how long a change must be called for before it is made, and the least time between two changes")
	if flips {
		fs.IntVar(&f.maxStep, "planner-max-step", 0, "planner: the most workers one change flips (0: as many as the best split takes, together)")
		fs.DurationVar(&f.flipDrain, "planner-flip-drain-timeout", time.Minute, "planner: how long a flipped worker may take to finish its requests (what is left is continued on other workers)")
		return
	}
	fs.IntVar(&f.minP, "planner-min-prefill", 1, "planner: fewest prefill workers to ask for")
	fs.IntVar(&f.maxP, "planner-max-prefill", 64, "planner: most prefill workers to ask for")
	fs.IntVar(&f.minD, "planner-min-decode", 1, "planner: fewest decode workers to ask for")
	fs.IntVar(&f.maxD, "planner-max-decode", 64, "planner: most decode workers to ask for")
}

// config returns the planner's configuration, nil without --planner.
func (f *plannerFlags) config() (*planner.Config, error) {
	if !f.on {
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
	if f.minP < 0 || f.minD < 0 || (f.maxP > 0 && f.maxP < f.minP) || (f.maxD > 0 && f.maxD < f.minD) {
		return nil, usagef("planner bounds: need 0 ≤ --planner-min-X ≤ --planner-max-X, got prefill %d..%d, decode %d..%d", f.minP, f.maxP, f.minD, f.maxD)
	}
	return &planner.Config{SLOs: planner.SLOs{TTFT: f.ttft, ITL: f.itl}, Interval: f.interval, Window: f.window, Dwell: f.dwell,
		MinPrefill: f.minP, MaxPrefill: f.maxP, MinDecode: f.minD, MaxDecode: f.maxD, MaxStep: f.maxStep}, nil
}

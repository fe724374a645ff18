package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/router"
)

// shutdownTimeout bounds the shutdown after a drain (answering what is left
// with an error and closing everything).
const shutdownTimeout = 30 * time.Second

// defaultDrainTimeout is --drain-timeout's default.
const defaultDrainTimeout = 60 * time.Second

// runUntilSignal waits until ctx ends (the first SIGINT/SIGTERM), calls
// announce (if set), drains (drain may be nil) for at most drainTimeout —
// a second signal ends the drain at once —, then shuts down, bounded by
// shutdownTimeout. A drain cut short by its timeout is logged, not an
// error: shutdown answers what is left. A drain cut short by a second
// signal is an error (exit status 1): the operator forced requests to fail.
func runUntilSignal(ctx context.Context, announce func(), log *slog.Logger, drainTimeout time.Duration,
	drain, shutdown func(context.Context) error) error {
	<-ctx.Done()
	if announce != nil {
		announce()
	}
	if drain != nil && drainTimeout > 0 {
		start := time.Now()
		dctx, cancel := context.WithTimeout(forced(ctx), drainTimeout)
		err := drain(dctx)
		cancel()
		if err != nil {
			log.Warn("drain ended before everything finished; shutting down (what is left gets an error answer)",
				"after", time.Since(start).Round(time.Millisecond), "err", err)
		} else {
			log.Info("drained", "after", time.Since(start).Round(time.Millisecond))
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := shutdown(sctx)
	if forced(ctx).Err() != nil {
		return errors.Join(errForced, err)
	}
	return err
}

// errForced is runUntilSignal's error after a second signal.
var errForced = errors.New("stopped at once by a second signal: requests still in flight got an error answer")

// checkKVAuth refuses a deprecated --kv-auth that contradicts
// --internal-secret.
func checkKVAuth(kvAuth, secret string) error {
	if kvAuth != "" && secret != "" && kvAuth != secret {
		return usagef("--kv-auth (deprecated) and --internal-secret differ: give --internal-secret alone")
	}
	return nil
}

// checkDrainTimeout refuses a negative --drain-timeout (0 shuts down at
// once).
func checkDrainTimeout(d time.Duration) error {
	if d < 0 {
		return usagef("--drain-timeout must not be negative, got %s (0: shut down at once)", d)
	}
	return nil
}

func checkPort(name string, p int) error {
	if p < 0 || p > 65535 {
		return usagef("--%s must be between 0 and 65535, got %d", name, p)
	}
	return nil
}

func newUpCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		lf       logFlags
		tf       traceFlags
		pp       pprofFlags
		mf       modelFlags
		wf       workerFlags
		host     string
		port     int
		nPrefill int
		nDecode  int
		nServe   int
		drainT   time.Duration
		portBase int
		pf       pairingFlags
		fdf      frontDoorFlags
		af       apiFlags
		inf      internalFlags
		plf      plannerFlags
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a router with prefill and decode workers in one process (try it in one command)",
		Long: `Runs a router and N prefill + M decode workers in one process on loopback.
Every request goes router -> prefill -> KV cache over TCP -> decode -> client.
The router listens on --port; workers take free ports. Stop with Ctrl-C:
the router and the workers drain (requests in flight finish, new ones get
503 + Retry-After) for up to --drain-timeout, then exit 0; a second Ctrl-C
stops at once, answering what is left with an error (exit status 1).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger(stderr)
			if err != nil {
				return err
			}
			stopPprof, err := pp.start(log)
			if err != nil {
				return err
			}
			defer stopPprof()
			if err := checkPort("port", port); err != nil {
				return err
			}
			if err := checkDrainTimeout(drainT); err != nil {
				return err
			}
			if nServe < 0 || nServe > 64 {
				return usagef("--colocated-workers must be between 0 and 64")
			}
			if nServe == 0 && (nPrefill < 1 || nDecode < 1 || nPrefill > 64 || nDecode > 64) {
				return usagef("--prefill-workers and --decode-workers must be between 1 and 64")
			}
			newModel, err := mf.factory()
			if err != nil {
				return err
			}
			wo, err := wf.options()
			if err != nil {
				return err
			}
			wo.Logger = log
			if portBase < 0 || (portBase > 0 && portBase+64+nPrefill > 65535) {
				return usagef("--worker-port-base must be 0 (free ports) or leave room for %d ports below 65536", 64+nPrefill)
			}
			var rt cluster.RouterTuning
			if err := pf.apply(&rt); err != nil {
				return err
			}
			// The router's legs outlast the workers' own cap on a request.
			rt.LegTimeout = max(rt.LegTimeout, wo.Machine.MaxRequestTime+time.Minute)
			frontTLS, fd, err := fdf.options(log)
			if err != nil {
				return err
			}
			api, err := af.options()
			if err != nil {
				return err
			}
			if wo.Secret, _, err = inf.options(log); err != nil {
				return err
			}
			if err := checkKVAuth(wf.kvAuth, wo.Secret); err != nil {
				return err
			}
			plan, err := plf.config()
			if err != nil {
				return err
			}
			if plan != nil && (nServe > 0 || portBase > 0) {
				return usagef("--planner flips prefill and decode workers on fresh ports: not with --colocated-workers or --worker-port-base")
			}
			if err := checkPortsFree(host, upPorts(port, portBase, nPrefill, nDecode, nServe)); err != nil {
				return err
			}
			watchTLS(cmd.Context(), log, frontTLS)
			tps := tf.newProviders(cmd.Context(), log)
			if err := tps.check(); err != nil {
				return err // before any worker starts
			}
			defer tps.shutdown()
			c, err := cluster.Up(cmd.Context(), cluster.Options{Host: host, RouterPort: port, WorkerPortBase: portBase,
				PrefillWorkers: nPrefill, DecodeWorkers: nDecode, ColocatedWorkers: nServe,
				NewModel: newModel, Worker: wo, Router: cluster.RouterOptions{FrontDoor: fd, FrontTLS: frontTLS, RouterTuning: rt, API: api}, Logger: log,
				TracerFor: tps.forService, Planner: plan, FlipDrainTimeout: plf.flipDrain})
			if err == nil && tps.err != nil {
				_ = c.Shutdown(context.Background())
				err = tps.err
			}
			if err != nil {
				return err
			}
			if nServe > 0 {
				fmt.Fprintf(stdout, "pdserve up: router %s (%d colocated workers, no disaggregation)\n", c.URL(), nServe)
			} else {
				fmt.Fprintf(stdout, "pdserve up: router %s (%d prefill, %d decode workers)\n", c.URL(), nPrefill, nDecode)
			}
			for _, w := range c.Colocated {
				fmt.Fprintf(stdout, "  colocated worker %s\n", w.URL)
			}
			for _, w := range c.Prefill {
				fmt.Fprintf(stdout, "  prefill worker %s (KV %s)\n", w.URL, w.Worker.KVAddr())
			}
			for _, w := range c.Decode {
				fmt.Fprintf(stdout, "  decode worker  %s\n", w.URL)
			}
			fmt.Fprintf(stdout, "ready: accepting requests at %s/v1\n", c.URL())
			return runUntilSignal(cmd.Context(), func() { fmt.Fprintln(stdout, "pdserve up: draining, then shutting down (Ctrl-C again: at once)") },
				log, drainT, c.Drain, c.Shutdown)
		},
	}
	fs := cmd.Flags()
	lf.add(fs)
	tf.add(fs)
	pp.add(fs)
	mf.add(fs)
	wf.add(fs)
	fs.StringVar(&host, "host", "127.0.0.1", "address every server binds")
	fs.IntVar(&port, "port", 8000, "router port")
	fs.IntVar(&nPrefill, "prefill-workers", 1, "number of prefill workers")
	fs.IntVar(&nDecode, "decode-workers", 1, "number of decode workers")
	fs.IntVar(&nServe, "colocated-workers", 0, "run this many colocated workers behind the router instead of prefill/decode (plain mode, for comparison)")
	fs.DurationVar(&drainT, "drain-timeout", defaultDrainTimeout, "on SIGINT/SIGTERM, how long to let requests in flight finish before shutting down (0: shut down at once)")
	fdf.add(fs)
	af.add(fs)
	inf.add(fs, false, "the shared secret of the workers' and the router's channels (default: a fresh random one, so the loopback worker API and KV channel are authenticated too)")
	plf.add(fs, true)
	fs.IntVar(&portBase, "worker-port-base", 0, "fixed worker ports: worker k (prefill, then decode) on base+k, prefill i's KV channel on base+64+i (0: free ports; the router's GET /discovery/prometheus lists them either way)")
	pf.add(fs)
	return cmd
}

func newWorkerCmd(role string, stdout, stderr io.Writer) *cobra.Command {
	var (
		lf     logFlags
		tf     traceFlags
		pp     pprofFlags
		mf     modelFlags
		wf     workerFlags
		host   string
		port   int
		kvPort int
		rf     registrationFlags
		drainT time.Duration
		fdf    frontDoorFlags
		af     apiFlags
		inf    internalFlags
	)
	short := map[string]string{
		"prefill": "Run one prefill worker (computes prompt KV and streams it to decode workers)",
		"decode":  "Run one decode worker (receives KV from prefill workers and generates tokens)",
		"serve":   "Run one colocated worker with the OpenAI API (prefill and decode in one engine)",
	}[role]
	defPort := map[string]int{"prefill": 30000, "decode": 30001, "serve": 8000}[role]
	cmd := &cobra.Command{
		Use:   role,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger(stderr)
			if err != nil {
				return err
			}
			stopPprof, err := pp.start(log)
			if err != nil {
				return err
			}
			defer stopPprof()
			if err := checkPort("port", port); err != nil {
				return err
			}
			if err := checkDrainTimeout(drainT); err != nil {
				return err
			}
			newModel, err := mf.factory()
			if err != nil {
				return err
			}
			wo, err := wf.options()
			if err != nil {
				return err
			}
			m, err := newModel()
			if err != nil {
				return err
			}
			wo.Model, wo.Logger = m, log
			wo.Addr = net.JoinHostPort(host, strconv.Itoa(port))
			if wo.Secret, wo.InternalTLS, err = inf.options(log); err != nil {
				return err
			}
			if err := checkKVAuth(wf.kvAuth, wo.Secret); err != nil {
				return err
			}
			if role == "serve" {
				if wo.FrontTLS, wo.FrontDoor, err = fdf.options(log); err != nil {
					return err
				}
				if wo.API, err = af.options(); err != nil {
					return err
				}
				if wo.FrontTLS != nil && wo.InternalTLS != nil {
					return usagef("serve has one port: give --ssl-* (the OpenAI API's TLS) or --internal-tls-* (a router's), not both")
				}
			}
			watchTLS(cmd.Context(), log, wo.FrontTLS, wo.InternalTLS)
			switch role {
			case "prefill":
				if err := checkPort("kv-port", kvPort); err != nil {
					return err
				}
				wo.Machine.Role = lifecycle.RolePrefill
				wo.KVListen = net.JoinHostPort(host, strconv.Itoa(kvPort))
			case "decode":
				wo.Machine.Role = lifecycle.RoleDecode
			default:
				wo.Machine.Role = lifecycle.RoleColocated
			}
			if role != "prefill" && (wo.Machine.OptimisticAttempts > 0 || wo.Machine.ForceOptimistic != nil) {
				return usagef("--optimistic-prefill-attempts applies to prefill workers only, not to %s", role)
			}
			if role != "decode" && wo.AdmissionDelay > 0 {
				return usagef("--test-decode-admission-delay applies to decode workers only, not to %s", role)
			}
			if wo.Etcd, err = rf.options(); err != nil {
				return err
			}
			if wo.Etcd != nil {
				wo.Etcd.Config.Logger = log
			}
			tps := tf.newProviders(cmd.Context(), log)
			defer tps.shutdown()
			if wo.Tracer = tps.forService("pdserve-" + role); tps.err != nil {
				return tps.err
			}
			s, err := cluster.StartWorker(wo)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "pdserve %s: worker API %s", role, s.URL)
			if kv := s.Worker.KVAddr(); kv != "" {
				fmt.Fprintf(stdout, ", KV channel %s", kv)
			}
			if role == "serve" {
				fmt.Fprintf(stdout, ", OpenAI API %s/v1", s.URL)
			}
			fmt.Fprintln(stdout)
			if s.Registration != nil {
				fmt.Fprintf(stdout, "registering in etcd as %s\n", s.Registration.Key())
			}
			fmt.Fprintln(stdout, "ready")
			return runUntilSignal(cmd.Context(), func() { fmt.Fprintf(stdout, "pdserve %s: draining\n", role) },
				log, drainT, s.Drain, s.Shutdown)
		},
	}
	fs := cmd.Flags()
	lf.add(fs)
	tf.add(fs)
	pp.add(fs)
	mf.add(fs)
	wf.add(fs)
	fs.StringVar(&host, "host", "127.0.0.1", "address to bind")
	fs.IntVar(&port, "port", defPort, "HTTP port")
	if role == "prefill" {
		fs.IntVar(&kvPort, "kv-port", 8998, "KV channel port (decode workers connect here)")
	}
	rf.add(fs)
	if role == "prefill" {
		rf.addKV(fs)
	}
	inf.add(fs, true, secretUsage)
	if role == "serve" {
		fdf.add(fs)
		af.add(fs)
	}
	fs.DurationVar(&drainT, "drain-timeout", defaultDrainTimeout, "on SIGTERM, how long to finish the requests already admitted (new ones get 503 + Retry-After) before shutting down; a second signal stops at once")
	return cmd
}

// waitServing prints why the router cannot serve yet (when it changes) and
// "ready" once it can, checking the workers every 200 ms until ctx ends.
func waitServing(ctx context.Context, r *router.Router, out io.Writer) {
	if untilServing(ctx, r, out) {
		fmt.Fprintln(out, "ready")
	}
}

// untilServing waits until r can serve (true) or ctx ends (false), printing
// why it cannot yet whenever that changes.
func untilServing(ctx context.Context, r *router.Router, out io.Writer) bool {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	last := ""
	for {
		ok, why := r.Serving()
		if ok {
			return true
		}
		if why != last {
			fmt.Fprintf(out, "waiting for workers: %s\n", why)
			last = why
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			r.CheckNow()
		}
	}
}

// portServed reports whether a process accepts connections on addr (a
// router's host:port) now: a router started there replaces it.
func portServed(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func splitURLs(s []string) []string {
	var out []string
	for _, v := range s {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func newRouterCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		lf        logFlags
		tf        traceFlags
		pp        pprofFlags
		mf        modelFlags
		host      string
		port      int
		prefill   []string
		decode    []string
		colocated []string
		hf        healthFlags
		pf        pairingFlags
		df        discoveryFlags
		drainT    time.Duration
		fdf       frontDoorFlags
		af        apiFlags
		inf       internalFlags
		plf       plannerFlags
	)
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Run the OpenAI-compatible router in front of prefill and decode workers",
		Long: `Runs the router: it tokenizes each request, picks a prefill and a decode
worker (by --prefill-policy and --decode-policy, on each worker's load) and
sends both legs at once; when every worker of a role is saturated it answers
429 with Retry-After. It learns each prefill worker's KV address from the
worker itself, and keeps a breaker per (prefill, decode) KV path.

Restart it without refusing a request: start a new router on the same
--port (it waits until it can serve, then takes every new connection),
then SIGTERM the old one (it stops listening, and finishes its streams).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger(stderr)
			if err != nil {
				return err
			}
			stopPprof, err := pp.start(log)
			if err != nil {
				return err
			}
			defer stopPprof()
			if err := checkPort("port", port); err != nil {
				return err
			}
			if err := checkDrainTimeout(drainT); err != nil {
				return err
			}
			p, d, co := splitURLs(prefill), splitURLs(decode), splitURLs(colocated)
			reg, err := df.registry(log)
			if err != nil {
				return err
			}
			switch {
			case reg != nil && len(p)+len(d)+len(co) > 0:
				return usagef("--discovery %s finds the workers: drop --prefill, --decode and --colocated", df.discovery)
			case reg != nil:
			case len(co) == 0 && (len(p) == 0 || len(d) == 0):
				return usagef("need --prefill and --decode worker URLs (comma-separated lists), --colocated, or --discovery etcd|kubernetes")
			case len(co) > 0 && (len(p) > 0 || len(d) > 0):
				return usagef("--colocated cannot be combined with --prefill/--decode")
			}
			ro := cluster.RouterOptions{Addr: net.JoinHostPort(host, strconv.Itoa(port)), Prefill: p, Decode: d, Colocated: co,
				Registry: reg, Logger: log}
			if err := hf.apply(&ro, reg == nil); err != nil {
				return err
			}
			if err := pf.apply(&ro.RouterTuning); err != nil {
				return err
			}
			if ro.FrontTLS, ro.FrontDoor, err = fdf.options(log); err != nil {
				return err
			}
			if ro.API, err = af.options(); err != nil {
				return err
			}
			if ro.Planner, err = plf.config(); err != nil {
				return err
			}
			if ro.Planner != nil && len(co) > 0 {
				return usagef("--planner splits prefill and decode workers; colocated workers have no split")
			}
			act, err := plf.actuator(&df, reg, routerID(port), log)
			if err != nil {
				return err
			}
			if act != nil {
				ro.Planner.Actuator = act
			}
			if ro.Secret, ro.InternalTLS, err = inf.options(log); err != nil {
				return err
			}
			watchTLS(cmd.Context(), log, ro.FrontTLS, ro.InternalTLS)
			newModel, err := mf.factory()
			if err != nil {
				return err
			}
			m, err := newModel()
			if err != nil {
				return err
			}
			ro.Info, ro.Tokenizer = m.Info(), m.Tokenizer()
			// The port is shared (SO_REUSEPORT) so that a replacement can
			// listen on it while this router hands it over on SIGTERM. A
			// replacement listens only once it can serve, and takes every
			// new connection from then on.
			ro.ReusePort = true
			if ro.TakeOver = portServed(ro.Addr); ro.TakeOver {
				ro.BeforeListen = func(r *router.Router) error {
					fmt.Fprintf(stdout, "pdserve router: another process serves %s: listening once a pair of workers is ready\n", ro.Addr)
					untilServing(cmd.Context(), r, stdout)
					return cmd.Context().Err()
				}
			}
			tps := tf.newProviders(cmd.Context(), log)
			defer tps.shutdown()
			if ro.Tracer = tps.forService("pdserve-router"); tps.err != nil {
				return tps.err
			}
			s, err := cluster.StartRouter(ro)
			if err != nil {
				if ctxErr := cmd.Context().Err(); ro.TakeOver && ctxErr != nil && errors.Is(err, ctxErr) {
					return nil // stopped while waiting to replace
				}
				return usageError{err}
			}
			if reg != nil {
				fmt.Fprintf(stdout, "pdserve router: %s/v1 (workers from %s)\n", s.URL, reg.Name())
			} else if len(co) > 0 {
				fmt.Fprintf(stdout, "pdserve router: %s/v1 (%d colocated workers)\n", s.URL, len(co))
			} else {
				fmt.Fprintf(stdout, "pdserve router: %s/v1 (%d prefill, %d decode workers)\n", s.URL, len(p), len(d))
			}
			// "ready" is printed once a compatible pair is healthy; until
			// then requests get a 503 naming what is missing.
			waitServing(cmd.Context(), s.Router, stdout)
			return runUntilSignal(cmd.Context(), func() {
				fmt.Fprintln(stdout, "pdserve router: draining (not listening: a router started on the port takes new connections)")
			}, log, drainT, s.Handoff, s.Shutdown)
		},
	}
	fs := cmd.Flags()
	lf.add(fs)
	tf.add(fs)
	pp.add(fs)
	mf.router = true // no KV cache: --kv-cache-dtype is the workers'
	mf.add(fs)
	// The router only needs the model's identity, tokenizer and context;
	// latencies are the workers' business.
	_ = fs.MarkHidden("sim-prefill-ms-per-token")
	_ = fs.MarkHidden("sim-decode-ms-per-step")
	fs.StringVar(&host, "host", "127.0.0.1", "address to bind")
	fs.IntVar(&port, "port", 8000, "router port (shared with SO_REUSEPORT on Linux: a router started on the port of a running one listens once it can serve, and takes the port over when the old one gets SIGTERM)")
	fs.StringSliceVar(&prefill, "prefill", nil, "prefill worker URLs, e.g. http://127.0.0.1:30000 (comma-separated)")
	fs.StringSliceVar(&decode, "decode", nil, "decode worker URLs, e.g. http://127.0.0.1:30001 (comma-separated)")
	fs.StringSliceVar(&colocated, "colocated", nil, "colocated (serve) worker URLs instead of prefill/decode: plain mode, whole requests round robin")
	hf.add(fs)
	pf.add(fs)
	plf.add(fs, false)
	df.add(fs)
	fdf.add(fs)
	af.add(fs)
	inf.add(fs, true, secretUsage)
	fs.DurationVar(&drainT, "drain-timeout", defaultDrainTimeout, "on SIGTERM, how long to let requests in flight finish before shutting down (the router stops listening at once and /health answers 503; requests on connections already open are served, each answered with Connection: close)")
	return cmd
}

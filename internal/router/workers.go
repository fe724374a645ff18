package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// WorkerStatus is one entry of /debug/workers and GET /workers.
type WorkerStatus = fleet.Status

// Start follows the registry and health-checks the workers until Close. A
// static registry's workers are checked at once, until they are ready or
// one check failed, so a router started on a running fleet serves as soon
// as Start returns.
func (r *Router) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	if st, ok := r.set.Registry().(*registry.Static); ok {
		r.set.Reconcile(st.Snapshot())
		for range r.set.Config().SuccessThreshold {
			r.set.CheckAll(ctx)
			if ok, _ := r.AllHealthy(); ok {
				break
			}
		}
	}
	r.bg.Add(2)
	go func() {
		defer r.bg.Done()
		r.set.Run(ctx)
	}()
	go func() {
		defer r.bg.Done()
		<-r.stop
		cancel()
	}()
}

// Fleet is the router's worker set.
func (r *Router) Fleet() *fleet.Set { return r.set }

// AllHealthy reports whether the registry listed at least one worker and
// every worker is ready, and if not, why.
func (r *Router) AllHealthy() (bool, string) {
	if !r.set.Synced() {
		return false, "the registry has not listed the fleet yet"
	}
	ws := r.set.Workers("")
	if len(ws) == 0 {
		return false, "the registry lists no worker"
	}
	for _, w := range ws {
		if st := w.Status(); st.State != fleet.StateReady {
			why := st.LastError
			if why == "" {
				why = "not checked enough yet"
			}
			return false, fmt.Sprintf("%s is %s: %s", w.URL(), st.State, why)
		}
	}
	return true, ""
}

// Serving reports whether the router can serve a request now: a ready
// decode worker with a ready, compatible prefill worker, or a ready
// colocated worker. If not, it says why.
func (r *Router) Serving() (bool, string) {
	select {
	case <-r.draining:
		return false, "the router is draining"
	default:
	}
	if r.pick(workerapi.RoleColocated, nil, false) != nil {
		return true, ""
	}
	if _, _, _, e := r.pickPair(nil, nil, false); e != nil {
		return false, e.Message
	}
	return true, ""
}

// CheckNow runs one health check of every worker.
func (r *Router) CheckNow() { r.set.CheckAll(context.Background()) }

// BeginShutdown makes the router refuse new requests (503) and end every
// request in flight with a 503 answer, aborting its legs on the workers.
// It is idempotent.
func (r *Router) BeginShutdown() {
	r.BeginDrain()
	r.stoppingOnce.Do(func() { close(r.stopping) })
}

// BeginDrain makes the router refuse new requests (503 with Retry-After)
// and /health answer 503 "draining"; requests in flight go on. It is
// idempotent.
func (r *Router) BeginDrain() { r.drainingOnce.Do(func() { close(r.draining) }) }

// drainPoll is how often Drain looks at the requests in flight.
const drainPoll = 20 * time.Millisecond

// Drain begins a drain and waits until every request in flight has been
// answered, or ctx ends (it returns ctx.Err(); the caller then shuts the
// router down, answering what is left with an error).
func (r *Router) Drain(ctx context.Context) error {
	r.BeginDrain()
	t := r.clock.NewTicker(drainPoll)
	defer t.Stop()
	for {
		r.liveMu.Lock()
		n := len(r.live)
		r.liveMu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
	}
}

// Close begins shutdown, stops health checks and waits for every leg and
// abort goroutine.
func (r *Router) Close() {
	r.BeginShutdown()
	r.closed.Do(func() { close(r.stop) })
	r.bg.Wait()
	// Connections the pool dialed but never used are "new" to the workers'
	// servers, which wait up to 5 s for them in Shutdown; close them now.
	r.client.CloseIdleConnections()
}

// ProbeTimeout bounds the health probe of a worker whose pair just failed
// with a lost peer, before a retry picks a pair (on the router's clock).
const ProbeTimeout = time.Second

// probeWorker is the fleet's health check: the worker's info (identity,
// role, model, KV fingerprint and port) and its /health (readiness and
// load). A draining worker passes, with Info.Draining set.
func (r *Router) probeWorker(ctx context.Context, e registry.Entry) (fleet.Info, error) {
	var info workerapi.Info
	if err := r.getJSON(ctx, e.URL+workerapi.PathInfo, &info); err != nil {
		return fleet.Info{}, err
	}
	h, err := r.health(ctx, e.URL)
	if err != nil {
		return fleet.Info{}, err
	}
	fi := fleet.Info{Role: info.Role.String(), Model: info.Model, Fingerprint: info.Fingerprint, ContextLen: info.ContextLen,
		Instance: info.Instance, Draining: h.Status == workerapi.HealthDraining, Live: h.Live, Parked: h.Stages["parked"]}
	if info.KVPort != 0 {
		// The KV address is the worker's own host (as the registry gives
		// it) and the port it reports: never an address a peer supplies.
		if u, err := url.Parse(e.URL); err == nil {
			fi.KVAddr = net.JoinHostPort(u.Hostname(), strconv.Itoa(info.KVPort))
		}
	}
	return fi, nil
}

// health GETs a worker's /health: 200, or 503 "draining", is an answer;
// anything else an error.
func (r *Router) health(ctx context.Context, base string) (workerapi.Health, error) {
	var h workerapi.Health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+workerapi.PathHealth, nil)
	if err != nil {
		return h, err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		if c := context.Cause(ctx); c != nil {
			return h, fmt.Errorf("GET %s: %w", req.URL, c)
		}
		return h, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, workerapi.MaxInfoBytes))
	if err != nil {
		return h, err
	}
	_ = json.Unmarshal(body, &h) // an older or foreign worker may send {}
	switch {
	case resp.StatusCode == http.StatusOK:
		if h.Status == "" {
			h.Status = workerapi.HealthOK
		}
		return h, nil
	case resp.StatusCode == http.StatusServiceUnavailable && h.Status == workerapi.HealthDraining:
		return h, nil
	}
	return h, fmt.Errorf("GET %s: %s", req.URL, openai.DecodeError(resp.StatusCode, body).Message)
}

// probe checks /health of each worker at once, each within ProbeTimeout,
// and returns the ones that did not answer: those are not_ready at once
// (their legs in flight fail, they are out of pairing until checks pass),
// so a retry after a lost peer does not pick a frozen worker again.
func (r *Router) probe(ws ...*fleet.Worker) map[*fleet.Worker]bool {
	var mu sync.Mutex
	failed := map[*fleet.Worker]bool{}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			ctx, cancel := r.withTimeout(context.Background(), ProbeTimeout)
			defer cancel()
			if _, err := r.health(ctx, w.URL()); err != nil {
				r.log.Warn("worker failed a probe", "worker", w.URL(), "err", err)
				r.set.Observe(w, fleet.Info{}, fleet.Definitive(fmt.Errorf("probe: %w", err)))
				r.metrics.WorkerFailed(w.URL())
				mu.Lock()
				failed[w] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// roleOf is a worker's role as the contract spells it.
func roleOf(w *fleet.Worker) workerapi.Role {
	role, _ := workerapi.ParseRole(w.Role())
	return role
}

func roleIndex(role workerapi.Role) int {
	switch role {
	case workerapi.RolePrefill:
		return 0
	case workerapi.RoleDecode:
		return 1
	}
	return 2
}

// draw returns a uniform number in [0, 1) for slow-start weighting.
func (r *Router) draw() float64 {
	r.rndMu.Lock()
	defer r.rndMu.Unlock()
	return r.rnd.Float64()
}

// pick chooses the next ready worker of role round-robin, ok filtering the
// candidates; a worker in slow start is skipped with probability 1−weight
// (unless every candidate is ramping). advance moves the round-robin
// position.
func (r *Router) pick(role workerapi.Role, ok func(*fleet.Worker) bool, advance bool) *fleet.Worker {
	var cands []*fleet.Worker
	ramping := 0
	for _, w := range r.set.Workers(role.String()) {
		if w.Usable() && (ok == nil || ok(w)) {
			cands = append(cands, w)
			if w.Weight() < 1 {
				ramping++
			}
		}
	}
	if len(cands) == 0 {
		return nil
	}
	rr := &r.rr[roleIndex(role)]
	start := rr.Load() + 1
	if advance {
		start = rr.Add(1)
	}
	n := uint64(len(cands))
	if ramping > 0 && ramping < len(cands) {
		for i := range n {
			w := cands[(start+i)%n]
			if wt := w.Weight(); wt >= 1 || r.draw() < wt {
				return w
			}
		}
	}
	return cands[start%n]
}

// pickAvoiding is pick that prefers workers not in avoid, and takes one of
// them only if no other candidate is left.
func (r *Router) pickAvoiding(role workerapi.Role, ok func(*fleet.Worker) bool, avoid map[*fleet.Worker]bool, advance bool) *fleet.Worker {
	if len(avoid) > 0 {
		if w := r.pick(role, func(w *fleet.Worker) bool { return !avoid[w] && ok(w) }, advance); w != nil {
			return w
		}
	}
	return r.pick(role, ok, advance)
}

// pickPair chooses a decode worker, then a prefill worker whose KV
// fingerprint (model, geometry, dtype, page size) matches it, so an
// incompatible pair is never used. Workers in exclude are never chosen;
// those in avoid (the workers of a failed pair) only if their role has no
// other candidate. It returns the prefill's KV address.
func (r *Router) pickPair(exclude, avoid map[*fleet.Worker]bool, advance bool) (pw, dw *fleet.Worker, kv string, err *openai.Error) {
	allowed := func(w *fleet.Worker) bool { return !exclude[w] }
	dw = r.pickAvoiding(workerapi.RoleDecode, allowed, avoid, advance)
	if dw == nil {
		return nil, nil, "", openai.Unavailable("no ready decode worker (see /workers)")
	}
	fp := dw.Info().Fingerprint
	var mismatch string
	pw = r.pickAvoiding(workerapi.RolePrefill, func(p *fleet.Worker) bool {
		if !allowed(p) || p.KVAddr() == "" {
			return false
		}
		if m := p.Info().Fingerprint.Mismatch(fp); m != "" {
			mismatch = fmt.Sprintf("%s vs %s: %s", p.URL(), dw.URL(), m)
			return false
		}
		return true
	}, avoid, advance)
	if pw == nil {
		if mismatch != "" {
			return nil, nil, "", openai.Unavailable("no ready prefill worker compatible with decode worker %s (%s)", dw.URL(), mismatch)
		}
		return nil, nil, "", openai.Unavailable("no ready prefill worker (see /workers)")
	}
	return pw, dw, pw.KVAddr(), nil
}

// contextLen is the smallest context length among ready workers (a worker
// serves a shorter context than the model's when its KV pool is smaller),
// or 0 if none is known.
func (r *Router) contextLen() int {
	c := 0
	for _, w := range r.set.Workers("") {
		if !w.Usable() {
			continue
		}
		if n := w.Info().ContextLen; n > 0 && (c == 0 || n < c) {
			c = n
		}
	}
	return c
}

// Workers lists the router's workers and their states.
func (r *Router) Workers() []WorkerStatus { return r.set.Statuses() }

func (r *Router) handleWorkers(w http.ResponseWriter, _ *http.Request) {
	list := r.Workers()
	if list == nil {
		list = []WorkerStatus{}
	}
	b, _ := json.Marshal(map[string]any{"registry": r.set.Registry().Name(), "workers": list})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// workerChanged follows a worker's state changes, for the logs and the
// per-worker series.
func (r *Router) workerChanged(w *fleet.Worker, from, to fleet.State) {
	switch to {
	case fleet.StatePending:
		if from == 0 {
			r.metrics.WorkerSeen(w.URL())
		}
	case fleet.StateReady:
		r.log.Info("worker ready", "worker", w.URL(), "worker_role", w.Role())
	case fleet.StateRemoved:
		r.metrics.WorkerGone(w.URL())
	}
}

// workerCounts counts workers by role and state, for
// pdserve_router_workers.
func (r *Router) workerCounts() map[[2]string]int {
	out := map[[2]string]int{}
	for _, role := range r.roles {
		for _, st := range fleet.States() {
			out[[2]string{role.String(), st.String()}] = 0
		}
	}
	for _, w := range r.set.Workers("") {
		out[[2]string{w.Role(), w.State().String()}]++
	}
	return out
}

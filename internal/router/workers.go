package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
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
			// Prefill workers first: a decode worker's check names their KV
			// addresses, so that its KV paths are known before it is ready.
			r.set.CheckAll(ctx, workerapi.RolePrefill.String(), workerapi.RoleDecode.String(), workerapi.RoleColocated.String())
			if ok, _ := r.AllHealthy(); ok {
				break
			}
		}
		r.updateHolds()
	}
	r.bg.Add(3)
	go func() {
		defer r.bg.Done()
		r.set.Run(ctx)
	}()
	go func() {
		defer r.bg.Done()
		r.runLoads(ctx)
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
	if !r.set.Synced() {
		why := "the " + r.set.Registry().Name() + " registry has not listed the fleet yet"
		if st := r.set.RegistryStatus(); st.LastError != "" {
			why += " (last error: " + st.LastError + ")"
		}
		return false, why
	}
	if w, _ := r.pickPlain(nil); w != nil {
		return true, ""
	}
	if _, _, _, _, e := r.pickPair(pickOpts{}); e != nil {
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
	r.stopCancel()
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
// load; a decode worker's also the state of its KV paths to every prefill
// worker the router knows). A draining worker passes, with Info.Draining
// set. A decode worker whose every path to a ready prefill worker is
// refused (another --kv-auth, protocol version or KV layout) is
// misconfigured: not ready at once, with the refusals as the reason.
func (r *Router) probeWorker(ctx context.Context, e registry.Entry) (fleet.Info, error) {
	var info workerapi.Info
	if err := r.getJSON(ctx, e.URL+workerapi.PathInfo, &info); err != nil {
		return fleet.Info{}, err
	}
	w, _ := r.set.Get(e.ID)
	var peers map[string]*fleet.Worker // KV address → prefill worker
	if info.Role == workerapi.RoleDecode && w != nil {
		peers = r.kvPeers(info.Fingerprint)
	}
	own := report{}
	if w != nil {
		own = r.state(w).ownNow()
	}
	h, err := r.health(ctx, e.URL, peers)
	if err != nil {
		return fleet.Info{}, err
	}
	fi := fleet.Info{Role: info.Role.String(), Model: info.Model, Fingerprint: info.Fingerprint, ContextLen: info.ContextLen,
		Instance: info.Instance, Features: info.Features, Draining: h.Status == workerapi.HealthDraining, Live: h.Live, Parked: h.Stages["parked"]}
	if info.KVPort != 0 {
		// The KV address is the worker's own host (as the registry gives
		// it) and the port it reports: never an address a peer supplies.
		if u, err := url.Parse(e.URL); err == nil {
			fi.KVAddr = net.JoinHostPort(u.Hostname(), strconv.Itoa(info.KVPort))
		}
	}
	fi.KVCapacity = h.Load.PagesTotal * h.Load.PageSize
	if w == nil {
		return fi, nil
	}
	if h.Status == workerapi.HealthOK {
		r.state(w).observeLoad(h.Load, own, r.clock.Now())
	}
	if fi.KVCapacity == 0 {
		fi.KVCapacity = r.kvCapacity(w) // a draining worker's /health may carry no load
	}
	if peers != nil {
		if err := r.kvPathsReported(w, peers, h.KVPaths); err != nil {
			return fleet.Info{}, err
		}
	}
	return fi, nil
}

// kvPeers returns the prefill workers a decode worker of fingerprint fp
// could pair with (ready or about to be, KV address known), by KV address.
func (r *Router) kvPeers(fp kvxfer.Fingerprint) map[string]*fleet.Worker {
	peers := map[string]*fleet.Worker{}
	for _, p := range r.set.Workers(workerapi.RolePrefill.String()) {
		switch p.State() {
		case fleet.StateReady, fleet.StatePending, fleet.StateNotReady:
		default:
			continue
		}
		if a := p.KVAddr(); a != "" && p.Info().Fingerprint.Mismatch(fp) == "" {
			peers[a] = p
		}
	}
	return peers
}

// kvPathsReported applies a decode worker's report of its KV paths to the
// pair breakers, and returns a misconfiguration error if every path to a
// ready prefill worker was refused.
func (r *Router) kvPathsReported(d *fleet.Worker, peers map[string]*fleet.Worker, paths []workerapi.KVPath) error {
	now := r.clock.Now()
	readyPaths, refused := 0, []string{}
	for _, path := range paths {
		p := peers[path.Addr]
		if p == nil {
			continue
		}
		if r.breakers.reported(p, d, path, now) {
			r.log.Info("KV path reported", "prefill", p.URL(), "decode", d.URL(), "state", path.State, "reason", path.Reason)
		}
		if !pairable(p) {
			continue
		}
		readyPaths++
		if path.State == workerapi.KVPathRefused {
			refused = append(refused, fmt.Sprintf("%s (%s): %s", p.URL(), path.Addr, path.Reason))
		}
	}
	if readyPaths > 0 && len(refused) == readyPaths {
		slices.Sort(refused)
		return fmt.Errorf("%w: every prefill worker refuses its KV handshake: %s", fleet.ErrMisconfigured, strings.Join(refused, "; "))
	}
	return nil
}

// health GETs a worker's /health (naming peers' KV addresses to a decode
// worker): 200, or 503 "draining", is an answer; anything else an error.
func (r *Router) health(ctx context.Context, base string, peers map[string]*fleet.Worker) (workerapi.Health, error) {
	var h workerapi.Health
	u := base + workerapi.PathHealth
	if len(peers) > 0 {
		addrs := make([]string, 0, len(peers))
		for a := range peers {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
		if len(addrs) > workerapi.MaxKVPeers {
			addrs = addrs[:workerapi.MaxKVPeers]
		}
		u += "?" + workerapi.HealthQueryKVPeers + "=" + url.QueryEscape(strings.Join(addrs, ","))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
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
			if _, err := r.health(ctx, w.URL(), nil); err != nil {
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

// intn returns a uniform number in [0, n), for slow-start draws and the
// power-of-two policy.
func (r *Router) intn(n int) int {
	r.rndMu.Lock()
	defer r.rndMu.Unlock()
	return r.rnd.IntN(n)
}

// draw returns a uniform number in [0, 1) for slow-start weighting.
func (r *Router) draw() float64 {
	r.rndMu.Lock()
	defer r.rndMu.Unlock()
	return r.rnd.Float64()
}

// policyFor is the policy that chooses workers of role.
func (r *Router) policyFor(role workerapi.Role) Policy {
	switch role {
	case workerapi.RolePrefill:
		return r.policies[0]
	case workerapi.RoleDecode:
		return r.policies[1]
	}
	return r.policies[2]
}

// choose picks one of cands (non-empty) for req with role's policy: the
// workers in avoid only if every candidate is in it, and a worker in slow
// start only with the probability of its weight (unless every candidate
// is ramping or none was drawn).
func (r *Router) choose(role workerapi.Role, req *PickRequest, cands []Candidate, avoid map[*fleet.Worker]bool) *fleet.Worker {
	if len(avoid) > 0 {
		kept := cands[:0:0]
		for _, c := range cands {
			if !avoid[c.Worker] {
				kept = append(kept, c)
			}
		}
		if len(kept) > 0 {
			cands = kept
		}
	}
	ramping := 0
	for _, c := range cands {
		if c.Worker.Weight() < 1 {
			ramping++
		}
	}
	if ramping > 0 && ramping < len(cands) {
		kept := make([]Candidate, 0, len(cands))
		for _, c := range cands {
			if wt := c.Worker.Weight(); wt >= 1 || r.draw() < wt {
				kept = append(kept, c)
			}
		}
		cands = kept
	}
	pol := r.policyFor(role)
	w := cands[pol.Pick(req, cands)].Worker
	r.metrics.Selected(role, pol.Name(), w.URL())
	if req != nil {
		req.cached = 0
		if ca, ok := pol.(*cacheAware); ok {
			req.cached = ca.matched(req, w, ca.now().UnixNano(), int64(ca.cfg.TTL))
		}
	}
	if o, ok := pol.(PolicyObserver); ok {
		o.Chosen(req, w)
	}
	return w
}

// shedError is the router's 429: no worker of a role may take another
// request now (why), or the router holds --max-inflight-requests.
func (r *Router) shedError(why ShedReason, format string, args ...any) *openai.Error {
	return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeServer, Code: outcome.Overloaded.String(),
		Message:    fmt.Sprintf(format, args...) + " (shed: " + why.String() + "); retry after the Retry-After header's seconds",
		RetryAfter: r.cfg.Admission.RetryAfter}
}

// shedReasonOf returns the reason of a shedError's message.
func shedReasonOf(e *openai.Error) ShedReason {
	for s := ShedMaxInflight; s < numShedReasons; s++ {
		if strings.HasSuffix(e.Message, "(shed: "+s.String()+"); retry after the Retry-After header's seconds") {
			return s
		}
	}
	return ShedNone
}

// pickPlain chooses a colocated worker for req (nil: only whether one is
// ready). A colocated worker is chosen by the decode policy and admitted by
// the decode thresholds.
func (r *Router) pickPlain(req *PickRequest) (*fleet.Worker, *openai.Error) {
	cands, ready, why := r.candidates(workerapi.RoleColocated, r.clock.Now(), req != nil, func(w *fleet.Worker) bool {
		return req.unfit(w)
	})
	switch {
	case ready > 0 && req == nil:
		return cands[0].Worker, nil
	case ready == 0:
		e := openai.Unavailable("no healthy colocated worker%s (see /workers)", r.whyNone(workerapi.RoleColocated, nil, req))
		e.Code = outcome.NoWorker.String()
		return nil, e
	case len(cands) == 0:
		return nil, r.shedError(why, "every colocated worker is saturated")
	}
	return r.choose(workerapi.RoleColocated, req, cands, nil), nil
}

// pickPlainExcept chooses a colocated worker for a continuation of req (a
// request whose output began reaching the client): any usable worker not
// in exclude that fits req, with no admission (the request is already
// being served: shedding it now would lose its output).
func (r *Router) pickPlainExcept(req *PickRequest, exclude exclusions) (*fleet.Worker, *openai.Error) {
	cands, _, _ := r.candidates(workerapi.RoleColocated, r.clock.Now(), false, func(w *fleet.Worker) bool {
		return exclude.has(w) || req.unfit(w)
	})
	if len(cands) == 0 {
		e := openai.Unavailable("no other healthy colocated worker%s (see /workers)", r.whyNone(workerapi.RoleColocated, exclude, req))
		e.Code = outcome.NoWorker.String()
		return nil, e
	}
	return r.choose(workerapi.RoleColocated, req, cands, nil), nil
}

// candidates returns the usable workers of role that skip (if set) does
// not rule out, as candidates with their load: ready counts them, cands
// holds those admission lets through (all of them unless admit), and why
// is the reason the last one refused was refused (ShedNone if none was).
// When no usable worker is left, the ready workers whose last health check
// failed (fleet.Worker.Failing) stand in: one missed check, which a loaded
// host gives every worker of a role at once, must not refuse every request
// while each of them is still ready; a worker that is really gone leaves at
// the health check's failure threshold, and its legs fail over then.
func (r *Router) candidates(role workerapi.Role, now time.Time, admit bool, skip func(*fleet.Worker) bool) (cands []Candidate, ready int, why ShedReason) {
	ws := r.set.Workers(role.String())
	usable := (*fleet.Worker).Usable
	if !slices.ContainsFunc(ws, func(w *fleet.Worker) bool { return w.Usable() && (skip == nil || !skip(w)) }) {
		usable = (*fleet.Worker).Failing
	}
	for _, w := range ws {
		if !usable(w) || (skip != nil && skip(w)) {
			continue
		}
		ready++
		c, ok, sw := r.candidate(w, now, admit)
		if !ok {
			why = sw
			continue
		}
		cands = append(cands, c)
	}
	return cands, ready, why
}

// pickOpts are the constraints of one pair pick.
type pickOpts struct {
	// exclude: never these workers; avoid: these only if their role has no
	// other candidate.
	exclude exclusions
	avoid   map[*fleet.Worker]bool
	// req is the request placed; nil only checks that a pair could form
	// (no policy, no admission, no breaker claimed).
	req *PickRequest
	// check only checks that a pair could form for req, as for a nil req.
	check bool
	// continuing places a continuation (output already reached the
	// client): no admission, since shedding it now would lose its output.
	continuing bool
	// retry places a retry of an admitted request whose attempt failed
	// with the fleet's fault (a worker lost, draining, shut down): no
	// admission either — shedding it would turn the fleet's failure into
	// the client's 429 — but the policy and the breakers as for any pick.
	retry bool
	// local, if set, is asked once the decode worker is chosen, with the
	// prefill workers it may pair with: true serves the request on that
	// decode worker alone (local.go), and pickPair returns no prefill
	// worker.
	local func(dw *fleet.Worker, prefills []Candidate) bool
}

// pickPair chooses a decode worker, then a prefill worker whose KV
// fingerprint (model, geometry, dtype, page size) matches it and whose KV
// path to it is not open, each by its role's policy among the workers
// admission lets through: so an incompatible or broken pair is never used.
// probe says the pair's breaker is half-open and this request is its probe.
// It returns the prefill's KV address. The error is a 503 (no_worker) when
// no pair can form, a 429 (overloaded) when the workers that could are all
// saturated.
func (r *Router) pickPair(o pickOpts) (pw, dw *fleet.Worker, kv string, probe bool, err *openai.Error) {
	admit := o.req != nil && !o.check && !o.continuing
	shed := admit && !o.retry
	if !r.set.Synced() {
		return nil, nil, "", false, noWorker("the %s registry has not listed the fleet yet (see /workers: registry_status)", r.set.Registry().Name())
	}
	for range 3 { // again if another request took the probe of a half-open pair
		now := r.clock.Now()
		prefills, readyP, prefillWhy := r.candidates(workerapi.RolePrefill, now, shed, func(p *fleet.Worker) bool {
			return o.exclude.has(p) || p.KVAddr() == "" || o.req.unfit(p)
		})
		decodes, readyD, decodeWhy := r.candidates(workerapi.RoleDecode, now, shed, func(d *fleet.Worker) bool {
			return o.exclude.has(d) || o.req.unfit(d)
		})
		switch {
		case readyD == 0:
			return nil, nil, "", false, noWorker("no ready decode worker%s (see /workers)", r.whyNone(workerapi.RoleDecode, o.exclude, o.req))
		case readyP == 0:
			return nil, nil, "", false, noWorker("no ready prefill worker%s (see /workers)", r.whyNone(workerapi.RolePrefill, o.exclude, o.req))
		case len(decodes) == 0:
			return nil, nil, "", false, r.shedError(decodeWhy, "every decode worker is saturated")
		case len(prefills) == 0:
			if dw := r.pickLocalWhenPrefillSaturated(o, decodes, now); dw != nil {
				return nil, dw, "", false, nil
			}
			return nil, nil, "", false, r.shedError(prefillWhy, "every prefill worker is saturated")
		}
		// The prefill workers each decode worker may pair with: in panic
		// mode (every pair is open), also those open by their failures.
		var mismatch, broken string
		panicking := false
		paired := func(d *fleet.Worker, all bool) []Candidate {
			var out []Candidate
			fp := d.Info().Fingerprint
			for _, c := range prefills {
				if m := c.Worker.Info().Fingerprint.Mismatch(fp); m != "" {
					mismatch = fmt.Sprintf("%s vs %s: %s", c.Worker.URL(), d.URL(), m)
					continue
				}
				if !r.breakers.allows(c.Worker, d, now) && !(panicking && r.breakers.panicAllows(c.Worker, d)) {
					_, why := r.breakers.state(c.Worker, d, now)
					broken = fmt.Sprintf("%s → %s: %s", c.Worker.URL(), d.URL(), why)
					continue
				}
				out = append(out, c)
				if !all {
					break
				}
			}
			return out
		}
		// Each decode worker's prefill partners are listed once: breakers
		// and fingerprints change under other requests, so the list a decode
		// worker was found usable with is the one its prefill is chosen
		// from (never an empty one).
		partners := make(map[*fleet.Worker][]Candidate, len(decodes))
		usable := decodes[:0:0]
		list := func() {
			for _, c := range decodes {
				if ps := paired(c.Worker, admit); len(ps) > 0 {
					partners[c.Worker] = ps
					usable = append(usable, c)
				}
			}
		}
		list()
		if len(usable) == 0 && broken != "" {
			panicking = true
			list()
		}
		if len(usable) == 0 {
			if broken != "" {
				return nil, nil, "", false, noWorker("every KV path between ready workers is open (%s; see /debug/pairs)", broken)
			}
			return nil, nil, "", false, noWorker("no ready prefill worker compatible with a ready decode worker (%s)", mismatch)
		}
		if !admit {
			d := usable[0].Worker
			p := partners[d][0].Worker
			return p, d, p.KVAddr(), false, nil
		}
		dw = r.choose(workerapi.RoleDecode, o.req, usable, o.avoid)
		if o.local != nil && o.local(dw, partners[dw]) {
			return nil, dw, "", false, nil
		}
		pw = r.choose(workerapi.RolePrefill, o.req, partners[dw], o.avoid)
		if panicking {
			return pw, dw, pw.KVAddr(), false, nil
		}
		probe, ok := r.breakers.acquire(pw, dw, now)
		if ok {
			return pw, dw, pw.KVAddr(), probe, nil
		}
	}
	return nil, nil, "", false, noWorker("every KV path between ready workers is being probed (see /debug/pairs)")
}

// pickLocalWhenPrefillSaturated is pickPair's way out when admission
// refuses every prefill worker: with per-request disaggregation (o.local),
// a decode worker that takes local requests is chosen among decodes and
// asked whether it serves the request alone, the backlog measured over the
// ready prefill workers (a saturated prefill's backlog is what raises the
// threshold most). It returns that worker, or nil: the request is shed. (A
// decode worker chosen and then not used stays in the cache_aware record:
// an estimate off by one request's prompt.)
func (r *Router) pickLocalWhenPrefillSaturated(o pickOpts, decodes []Candidate, now time.Time) *fleet.Worker {
	if o.local == nil || o.req == nil || o.check || o.continuing {
		return nil
	}
	var locals []Candidate
	for _, c := range decodes {
		if hasFeature(c.Worker, workerapi.FeatureLocal) {
			locals = append(locals, c)
		}
	}
	if len(locals) == 0 {
		return nil
	}
	prefills, _, _ := r.candidates(workerapi.RolePrefill, now, false, func(p *fleet.Worker) bool {
		return o.exclude.has(p) || p.KVAddr() == "" || o.req.unfit(p)
	})
	dw := r.choose(workerapi.RoleDecode, o.req, locals, o.avoid)
	if !o.local(dw, prefills) {
		return nil
	}
	return dw
}

// whyNone says why the workers of role do not take requests, for the
// client's 503: how many there are and how many are in each state or
// were passed over for each reason, as ": 3 workers: 2 not_ready, 1
// without min_tokens (an older pdserve)" or "1 serving a context of 1024
// tokens (this request needs 2008)". It names no worker and quotes no
// error (those carry internal addresses); the operator's detail, each
// worker's URL, state and last error, is in /debug/workers and in the
// debug log line it writes.
func (r *Router) whyNone(role workerapi.Role, exclude exclusions, req *PickRequest) string {
	ws := r.set.Workers(role.String())
	if len(ws) == 0 {
		return ""
	}
	var (
		order  []string
		counts = map[string]int{}
		detail []string
	)
	for _, w := range ws {
		st := w.Status()
		why := st.State.String()
		switch {
		case exclude.has(w):
			why = "failed this request already"
		case req.missing(w) == workerapi.FeaturePriority:
			why = "scheduling first come, first served (a request's priority needs --scheduling-policy priority)"
		case req.missing(w) != "":
			why = "without " + req.missing(w) + " (an older pdserve)"
		case req.short(w) != 0:
			why = fmt.Sprintf("serving a context of %d tokens (this request needs %d)", req.short(w), req.need())
		case req.computesOtherwise(w) != "":
			why = "computing otherwise than the workers of this request's output so far (" + req.computesOtherwise(w) + ")"
		case st.State == fleet.StateReady && !st.Healthy:
			why = "ready but failing health checks"
		}
		if counts[why] == 0 {
			order = append(order, why)
		}
		counts[why]++
		detail = append(detail, st.URL+" "+st.State.String()+": "+why+" "+st.LastError)
	}
	r.log.Debug("no worker to take a request", "worker_role", role.String(), "workers", strings.Join(detail, "; "))
	parts := make([]string, len(order))
	for i, why := range order {
		parts[i] = strconv.Itoa(counts[why]) + " " + why
	}
	noun := "workers"
	if len(ws) == 1 {
		noun = "worker"
	}
	return ": " + strconv.Itoa(len(ws)) + " " + noun + ": " + strings.Join(parts, ", ")
}

// noWorker is a 503 no_worker.
func noWorker(format string, args ...any) *openai.Error {
	e := openai.Unavailable(format, args...)
	e.Code = outcome.NoWorker.String()
	return e
}

// contextLen is the largest context a request may have: the largest that
// a pair of compatible prefill and decode workers (the smaller of their two)
// or a colocated worker offers, or 0 if none is known. Every worker the
// router has checked counts until it leaves the fleet, ready or not: a
// request that only workers not ready now could hold is a 503 no_worker
// (they may be ready at the next check), not a 400. Each request then goes
// only to workers that hold it (PickRequest.need).
func (r *Router) contextLen() int {
	c := 0
	// The largest context by KV fingerprint of each role (a fleet has one
	// fingerprint, two during a model change: no allocation then).
	var pbuf, dbuf [2]fpContext
	prefill, decode := pbuf[:0], dbuf[:0]
	for _, w := range r.set.Workers("") {
		info := w.Info()
		if info.ContextLen <= 0 || w.State() == fleet.StateRemoved {
			continue
		}
		switch roleOf(w) {
		case workerapi.RoleColocated:
			c = max(c, info.ContextLen)
		case workerapi.RolePrefill:
			if w.KVAddr() != "" {
				prefill = largestBy(prefill, info.Fingerprint, info.ContextLen)
			}
		case workerapi.RoleDecode:
			decode = largestBy(decode, info.Fingerprint, info.ContextLen)
		}
	}
	// A pair exchanges KV only with an equal fingerprint (Mismatch).
	for _, p := range prefill {
		for _, d := range decode {
			if p.fp == d.fp {
				c = max(c, min(p.ctx, d.ctx))
			}
		}
	}
	return c
}

// fpContext is the largest context of the workers of one KV fingerprint.
type fpContext struct {
	fp  kvxfer.Fingerprint
	ctx int
}

// largestBy records context n for fingerprint fp in l.
func largestBy(l []fpContext, fp kvxfer.Fingerprint, n int) []fpContext {
	for i := range l {
		if l[i].fp == fp {
			l[i].ctx = max(l[i].ctx, n)
			return l
		}
	}
	return append(l, fpContext{fp, n})
}

// Workers lists the router's workers and their states.
func (r *Router) Workers() []WorkerStatus { return r.set.Statuses() }

func (r *Router) handlePairs(w http.ResponseWriter, _ *http.Request) {
	list := r.Pairs()
	if list == nil {
		list = []PairStatus{}
	}
	b, _ := json.Marshal(map[string]any{"pairs": list})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func (r *Router) handleWorkers(w http.ResponseWriter, _ *http.Request) {
	list := r.Workers()
	if list == nil {
		list = []WorkerStatus{}
	}
	b, _ := json.Marshal(map[string]any{"registry": r.set.Registry().Name(), "registry_status": r.set.RegistryStatus(), "workers": list})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// workerChanged follows a worker's state changes, for the logs and the
// per-worker series.
func (r *Router) workerChanged(w *fleet.Worker, from, to fleet.State) {
	switch to {
	case fleet.StatePending:
		if from == 0 {
			r.metrics.WorkerSeen(w.URL(), roleOf(w))
		}
	case fleet.StateReady:
		r.log.Info("worker ready", "worker", w.URL(), "worker_role", w.Role())
	case fleet.StateRemoved:
		r.metrics.WorkerGone(w.URL())
		if r.cfg.Recorder != nil {
			r.cfg.Recorder.Forget(w.ID())
		}
		closeIdleTo(r.client.Transport, w.URL())
		r.wstates.Delete(w)
		r.breakers.forget(w)
		for _, p := range r.policies {
			if o, ok := p.(PolicyObserver); ok {
				o.Forget(w)
			}
		}
	}
}

// closeIdleTo closes the idle connections rt (or the transport it wraps)
// keeps to the worker at url, so a departed worker's do not wait for the
// idle timeout.
func closeIdleTo(rt http.RoundTripper, url string) {
	for rt != nil {
		if c, ok := rt.(interface{ CloseIdleConnectionsTo(string) }); ok {
			c.CloseIdleConnectionsTo(url)
			return
		}
		b, ok := rt.(interface{ Base() http.RoundTripper })
		if !ok {
			return
		}
		rt = b.Base()
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

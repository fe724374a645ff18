package router

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// The router's load signal for each worker has two parts.
//
//   - Its own, immediate: the legs it has in flight on the worker and their
//     tokens (a prefill leg counts its prompt, a decode leg its prompt plus
//     max_tokens: the KV it may come to hold).
//   - The worker's report (/internal/v1/load every --load-interval, and
//     every health check): its queue, its running requests, the prompt
//     tokens it holds, its KV pages used and total, its limits. A report
//     older than --load-staleness is ignored (only its static part, the
//     pool size and the limits, is kept).
//
// They combine so that how the router's own legs changed since the report
// counts at once, and what other routers sent counts through the report
// (Δ is own now − own at the report: legs sent less legs ended):
//
//	prompt tokens = max(own now, reported + Δ tokens)
//	queue         = reported queue + max(0, Δ legs − free slots at the report)
//	KV pages      = max(0, reported used + Δ tokens / page size + Δ legs)
//
// where free slots = max_running − (live − queued) at the report: new legs
// fill the worker's free batch slots before they queue. Without a fresh report:
// prompt tokens = own; queue = max(0, own legs − max_running); KV pages =
// pages of the own tokens in flight. (After the saturation detector of the
// Gateway API inference extension, which llm-d builds on: metrics scraped
// every 50 ms, ignored after 200 ms.)

// Defaults of the load signal.
const (
	DefaultLoadInterval  = 100 * time.Millisecond
	DefaultLoadStaleness = time.Second
	// defaultMaxRunning is assumed for a worker that has not reported its
	// --max-running-requests yet (the worker's default).
	defaultMaxRunning = 256
)

// wstate is the router's own view of one worker: the legs and tokens it
// sent, the worker's last report, and the admission state.
type wstate struct {
	w    *fleet.Worker
	role workerapi.Role

	tokens  atomic.Int64 // tokens of the legs in flight
	polling atomic.Bool  // a load poll is under way

	mu  sync.Mutex
	rep report
	// saturated is the admission state (with hysteresis), why says which
	// threshold put it there (a shed reason).
	saturated bool
	why       ShedReason
	// overloaded is set when the worker answered 429 overloaded: it is
	// saturated until a report newer than that says otherwise.
	overloaded time.Time
}

// report is a worker's last load report and the router's own counters when
// it was asked for.
type report struct {
	at               time.Time // zero: none yet
	load             workerapi.Load
	tokens           int64
	legs             int
	pageSize, maxRun int
	pagesTotal       int
	haveStatic       bool
}

// legTokens is what a leg of role counts in its worker's Tokens: the
// prompt on prefill, prompt + max_tokens on decode and colocated.
func legTokens(role workerapi.Role, req *PickRequest) int {
	if role == workerapi.RolePrefill {
		return len(req.InputIDs)
	}
	return len(req.InputIDs) + req.MaxTokens
}

// state returns w's wstate, created on first use.
func (r *Router) state(w *fleet.Worker) *wstate {
	if v, ok := r.wstates.Load(w); ok {
		return v.(*wstate)
	}
	v, _ := r.wstates.LoadOrStore(w, &wstate{w: w, role: roleOf(w)})
	return v.(*wstate)
}

// legStarted counts a leg of tokens sent to w; done uncounts it.
func (r *Router) legStarted(w *fleet.Worker, tokens int) (done func()) {
	ws := r.state(w)
	ws.tokens.Add(int64(tokens))
	legDone := w.AddLeg()
	var recorded func(time.Time, int)
	if r.cfg.Recorder != nil {
		recorded = r.cfg.Recorder.LegStarted(w.ID(), w.Role(), r.clock.Now())
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			ws.tokens.Add(-int64(tokens))
			legDone()
			if recorded != nil {
				recorded(r.clock.Now(), tokens)
			}
		})
	}
}

// observeLoad records a worker's report, asked for when the router's own
// counters were as in at.
func (ws *wstate) observeLoad(l workerapi.Load, own report, now time.Time) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	own.at, own.load = now, l
	own.pageSize, own.maxRun, own.pagesTotal, own.haveStatic = l.PageSize, l.MaxRunning, l.PagesTotal, true
	ws.rep = own
}

// kvCapacity is w's KV pool in tokens (pages × page size) as its last
// load report said, or 0.
func (r *Router) kvCapacity(w *fleet.Worker) int {
	ws := r.state(w)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.rep.pagesTotal * ws.rep.pageSize
}

// ownNow returns the router's counters for w now, as a report to fill in.
func (ws *wstate) ownNow() report {
	return report{tokens: ws.tokens.Load(), legs: ws.w.Legs()}
}

// estimate computes w's load now (ws.mu held); staleness is the cutoff.
func (ws *wstate) estimate(now time.Time, staleness time.Duration, legs int, adm *Admission) Load {
	rep := ws.rep
	own := ws.ownNow()
	l := Load{Legs: legs, Tokens: int(max(own.tokens, 0))}
	maxRun := defaultMaxRunning
	if rep.haveStatic && rep.maxRun > 0 {
		maxRun = rep.maxRun
	}
	pageSize := 16
	if rep.haveStatic && rep.pageSize > 0 {
		pageSize = rep.pageSize
	}
	fresh := !rep.at.IsZero() && now.Sub(rep.at) <= staleness
	var pagesUsed float64
	if fresh {
		l.Fresh = true
		dLegs, dTokens := legs-rep.legs, own.tokens-rep.tokens
		if ws.role == workerapi.RolePrefill {
			l.Tokens = max(l.Tokens, rep.load.PromptTokens+int(dTokens))
		}
		// Slots free at the report: what it did not count as running or
		// queued may still take one (awaiting its KV, say).
		free := max(0, maxRun-(rep.load.Live-rep.load.Queued))
		l.Queue = float64(rep.load.Queued + max(0, dLegs-free))
		pagesUsed = max(0, float64(rep.load.PagesUsed)+float64(dTokens)/float64(pageSize)+float64(dLegs))
	} else {
		l.Queue = float64(max(0, legs-maxRun))
		pagesUsed = float64(l.Tokens)/float64(pageSize) + float64(legs)
	}
	if rep.haveStatic && rep.pagesTotal > 0 {
		l.KVUse = min(1, pagesUsed/float64(rep.pagesTotal))
	}
	if ws.role == workerapi.RolePrefill {
		l.Score = float64(l.Tokens)
	} else {
		q := float64(adm.DecodeQueue)
		if q <= 0 {
			q = 4
		}
		l.Score = l.KVUse + l.Queue/q + float64(legs)/float64(maxRun)
	}
	return l
}

// pollLoads asks every worker that takes or may take requests for its load,
// each at most once at a time, each bounded by --load-staleness.
func (r *Router) pollLoads(ctx context.Context) {
	for _, w := range r.set.Workers("") {
		switch w.State() {
		case fleet.StateReady, fleet.StateNotReady, fleet.StateDraining:
		default:
			continue
		}
		if w.State() == fleet.StateNotReady && w.Held() == "" {
			continue
		}
		ws := r.state(w)
		if !ws.polling.CompareAndSwap(false, true) {
			continue
		}
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			defer ws.polling.Store(false)
			own := ws.ownNow()
			pctx, cancel := r.withTimeout(ctx, r.cfg.LoadStaleness)
			defer cancel()
			var h workerapi.Health
			if err := r.getJSON(pctx, w.URL()+workerapi.PathLoad, &h); err != nil {
				r.log.Debug("load poll failed", "worker", w.URL(), "err", err)
				return
			}
			if h.Status == workerapi.HealthOK {
				ws.observeLoad(h.Load, own, r.clock.Now())
			}
		}()
	}
}

// runLoads polls loads every LoadInterval and, after each round, checks
// which workers' KV paths are all broken (holds), until ctx ends.
func (r *Router) runLoads(ctx context.Context) {
	t := r.clock.NewTicker(r.cfg.LoadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		r.pollLoads(ctx)
		r.updateHolds()
	}
}

// ShedReason says why the router answered 429: the pdserve_router_shed_total
// label.
type ShedReason uint8

// Shed reasons.
const (
	ShedNone ShedReason = iota
	// ShedMaxInflight: the router holds --max-inflight-requests requests.
	ShedMaxInflight
	// ShedDecodeQueue: every decode worker's queue is at its threshold.
	ShedDecodeQueue
	// ShedDecodeKV: every decode worker's KV pool is at its threshold.
	ShedDecodeKV
	// ShedPrefillQueue: every prefill worker's queue is at its threshold.
	ShedPrefillQueue
	// ShedWorkerOverloaded: the workers tried answered 429 themselves
	// (their --max-queued-requests).
	ShedWorkerOverloaded
	numShedReasons
)

var shedNames = [numShedReasons]string{"none", "max_inflight", "decode_queue", "decode_kv", "prefill_queue", "worker_overloaded"}

func (s ShedReason) String() string {
	if s < numShedReasons {
		return shedNames[s]
	}
	return fmt.Sprintf("shed(%d)", uint8(s))
}

// Admission are the router's thresholds of load shedding, after llm-d's
// PD admitter: a decode worker is saturated once its queue reaches
// DecodeQueue or its KV use DecodeKV, and takes requests again once its
// queue is below DecodeQueueRecover and its KV use below DecodeKVRecover;
// a prefill worker likewise with PrefillQueue and PrefillQueueRecover (a
// colocated worker by the decode thresholds). The gap between a threshold
// and its recovery is the hysteresis that keeps a worker at the edge from
// flapping. When no worker of a role is left, the request is answered 429
// with Retry-After (RetryAfter). A threshold of 0 is off.
type Admission struct {
	DecodeQueue, DecodeQueueRecover   int
	DecodeKV, DecodeKVRecover         float64
	PrefillQueue, PrefillQueueRecover int
	// MaxInflight bounds the requests the router serves at once (0: no
	// bound).
	MaxInflight int
	// RetryAfter is the Retry-After of the router's 429s.
	RetryAfter time.Duration
}

// DefaultAdmission returns the defaults: decode queue 4 / recover below
// 2, decode KV use 0.92 / recover below 0.85, prefill queue 4 / recover
// below 2, no in-flight bound, Retry-After 1 s.
func DefaultAdmission() Admission {
	return Admission{DecodeQueue: 4, DecodeQueueRecover: 2, DecodeKV: 0.92, DecodeKVRecover: 0.85,
		PrefillQueue: 4, PrefillQueueRecover: 2, RetryAfter: workerapi.OverloadRetryAfter}
}

// Validate reports thresholds out of range.
func (a Admission) Validate() error {
	switch {
	case a.DecodeQueue < 0 || a.DecodeQueueRecover < 0 || a.PrefillQueue < 0 || a.PrefillQueueRecover < 0 || a.MaxInflight < 0:
		return fmt.Errorf("admission thresholds must not be negative")
	case a.DecodeKV < 0 || a.DecodeKV > 1 || a.DecodeKVRecover < 0 || a.DecodeKVRecover > 1:
		return fmt.Errorf("decode KV thresholds must be in [0, 1], got %v and %v", a.DecodeKV, a.DecodeKVRecover)
	case a.DecodeQueue > 0 && a.DecodeQueueRecover > a.DecodeQueue:
		return fmt.Errorf("decode queue recovery %d is above its threshold %d", a.DecodeQueueRecover, a.DecodeQueue)
	case a.PrefillQueue > 0 && a.PrefillQueueRecover > a.PrefillQueue:
		return fmt.Errorf("prefill queue recovery %d is above its threshold %d", a.PrefillQueueRecover, a.PrefillQueue)
	case a.DecodeKV > 0 && a.DecodeKVRecover > a.DecodeKV:
		return fmt.Errorf("decode KV recovery %v is above its threshold %v", a.DecodeKVRecover, a.DecodeKV)
	}
	return nil
}

// admit updates ws's admission state from its load l (ws.mu held) and
// reports whether new requests may go to it, and if not why.
func (ws *wstate) admit(l Load, a *Admission, now time.Time, staleness time.Duration) (bool, ShedReason) {
	if !ws.overloaded.IsZero() {
		if ws.rep.at.After(ws.overloaded) || now.Sub(ws.overloaded) > staleness {
			ws.overloaded = time.Time{}
		} else {
			return false, ShedWorkerOverloaded
		}
	}
	queueHigh, queueLow := a.DecodeQueue, a.DecodeQueueRecover
	kvHigh, kvLow := a.DecodeKV, a.DecodeKVRecover
	queueWhy := ShedDecodeQueue
	if ws.role == workerapi.RolePrefill {
		queueHigh, queueLow, kvHigh, kvLow = a.PrefillQueue, a.PrefillQueueRecover, 0, 0
		queueWhy = ShedPrefillQueue
	}
	if ws.saturated {
		stillQueue := queueHigh > 0 && l.Queue >= float64(queueLow)
		stillKV := kvHigh > 0 && l.KVUse >= kvLow
		if !stillQueue && !stillKV {
			ws.saturated = false
		}
	} else {
		switch {
		case kvHigh > 0 && l.KVUse >= kvHigh:
			ws.saturated, ws.why = true, ShedDecodeKV
		case queueHigh > 0 && l.Queue >= float64(queueHigh):
			ws.saturated, ws.why = true, queueWhy
		}
	}
	if ws.saturated {
		return false, ws.why
	}
	return true, ShedNone
}

// markOverloaded records that w answered 429 overloaded at now.
func (r *Router) markOverloaded(w *fleet.Worker) {
	ws := r.state(w)
	ws.mu.Lock()
	ws.overloaded = r.clock.Now()
	ws.mu.Unlock()
}

// candidate evaluates w for a pick: its load and whether admission lets a
// new request go to it (always, when admit is false).
func (r *Router) candidate(w *fleet.Worker, now time.Time, admit bool) (Candidate, bool, ShedReason) {
	ws := r.state(w)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	l := ws.estimate(now, r.cfg.LoadStaleness, w.Legs(), r.cfg.Admission)
	c := Candidate{Worker: w, Load: l}
	if !admit {
		return c, true, ShedNone
	}
	ok, why := ws.admit(l, r.cfg.Admission, now, r.cfg.LoadStaleness)
	return c, ok, why
}

// LoadStatus is the router's view of a worker's load in GET /workers.
type LoadStatus struct {
	Legs      int     `json:"inflight_legs"`
	Tokens    int     `json:"tokens"`
	Queue     float64 `json:"queue"`
	KVUse     float64 `json:"kv_use"`
	Fresh     bool    `json:"fresh_report"`
	Score     float64 `json:"score"`
	Saturated string  `json:"saturated,omitempty"`
}

func (r *Router) loadStatus(w *fleet.Worker) LoadStatus {
	ws := r.state(w)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	l := ws.estimate(r.clock.Now(), r.cfg.LoadStaleness, w.Legs(), r.cfg.Admission)
	st := LoadStatus{Legs: l.Legs, Tokens: l.Tokens, Queue: l.Queue, KVUse: l.KVUse, Fresh: l.Fresh, Score: l.Score}
	if ws.saturated {
		st.Saturated = ws.why.String()
	}
	if !ws.overloaded.IsZero() {
		st.Saturated = ShedWorkerOverloaded.String()
	}
	return st
}

// PlannerFleet returns the prefill and decode workers as the planner
// sees them: whether each takes requests (ready), and the KV tokens it
// holds, its pool and batch limit from its last load report.
func (r *Router) PlannerFleet() []planner.WorkerLoad {
	var out []planner.WorkerLoad
	for _, w := range r.set.Workers("") {
		role := w.Role()
		if role != workerapi.RolePrefill.String() && role != workerapi.RoleDecode.String() {
			continue
		}
		ws := r.state(w)
		ws.mu.Lock()
		rep := ws.rep
		ws.mu.Unlock()
		out = append(out, planner.WorkerLoad{ID: w.ID(), Role: role, Taking: w.State() == fleet.StateReady,
			KVTokens: rep.load.PagesUsed * rep.pageSize, KVCapacity: rep.pagesTotal * rep.pageSize, MaxRunning: rep.maxRun,
			ForwardSeconds: rep.load.ForwardSeconds, PromptTokensComputed: rep.load.PromptTokensComputed})
	}
	return out
}

// Package planner decides how many prefill and decode workers a PD fleet
// needs for the load it sees, and has an Actuator make it so.
//
// Every Interval it reads what the router measured (Recorder: arrivals,
// each worker's busy time and tokens, the decode workers' inter-token
// gaps, each request's TTFT and TPOT) and the workers' load reports (the
// KV tokens each decode worker holds), estimates each role's need against
// the SLOs (Estimate: an M/M/1 queue for prefill, Little's law over a
// fitted step-time line for decode), and decides:
//
//   - with a fleet of fixed size (an Actuator that flips roles: `pdserve
//     up --planner`), the split P:D that minimizes the larger of the two
//     roles' load ratios (need / workers), the workers it takes flipped
//     together (at most MaxStep);
//   - with an elastic fleet (Kubernetes Deployments, counts in etcd, or no
//     actuator: an HPA on pdserve_planner_desired_replicas), each role's
//     ⌈need⌉ within its bounds.
//
// It never flaps: a change must be called for over Dwell in a row, at
// least Dwell after the last one (unless a role is overloaded, its load
// ratio over 1: then a flip relieves it as soon as two ticks in a row call
// for it), the KV the decode workers hold counts as its median over the
// window's ticks, a flip must cut the
// worse load ratio by MinGain, scaling down waits Dwell (scaling up does
// not), nothing is decided while a change is under way or a worker is
// leaving, and an elastic actuator is asked for the counts it was last
// given again only two dwell times later (the fleet follows in its own
// time) or after it failed. Every
// decision is logged with its inputs and arithmetic, and GET /planner
// shows the last ones.
package planner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/metrics"
)

// Role names as the fleet reports them.
const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	DefaultWindow   = time.Minute
	DefaultDwell    = 30 * time.Second
	DefaultMinGain  = 0.15
	DefaultMargin   = 0.8
	DefaultTTFTSLO  = 2 * time.Second
	DefaultITLSLO   = 50 * time.Millisecond
)

// Actions a decision takes.
const (
	ActionHold  = "hold"
	ActionFlip  = "flip"
	ActionScale = "scale"
)

// WorkerLoad is one worker as the router sees it at a tick.
type WorkerLoad struct {
	ID   string
	Role string // "prefill" or "decode"
	// Taking: ready and not draining (it gets new requests).
	Taking bool
	// KVTokens is the KV tokens it holds (pages used × page size), KVCapacity
	// its pool in tokens, MaxRunning its batch limit (0: unknown), from its
	// last load report.
	KVTokens, KVCapacity, MaxRunning int
	// ForwardSeconds and PromptTokensComputed are the worker's own
	// cumulative counters (workerapi.Load): its time in forwards and the
	// prompt tokens they computed (0: not reported).
	ForwardSeconds       float64
	PromptTokensComputed int64
}

// Actuator makes a decision real.
type Actuator interface {
	// Name names it in logs and GET /planner.
	Name() string
	// Flips reports whether it moves workers between roles in a fleet of
	// fixed size (else it scales each role).
	Flips() bool
	// Apply moves the fleet to the decision's DesiredPrefill and
	// DesiredDecode; it returns when that is done (a flipped worker
	// drained, restarted and ready) or failed.
	Apply(ctx context.Context, d Decision) error
}

// Config configures a Planner.
type Config struct {
	SLOs SLOs
	// Interval is the time between decisions; Window the span the rates
	// are measured over; Dwell how long a change must be called for before
	// it is made, and the least time between two changes.
	Interval, Window, Dwell time.Duration
	// MinGain is the least fraction by which a flip must cut the worse of
	// the two roles' load ratios.
	MinGain float64
	// MaxStep is the most workers one flip moves between roles (0: as
	// many as the best split takes, flipped together).
	MaxStep int
	// MinPrefill, MaxPrefill, MinDecode and MaxDecode bound an elastic
	// fleet's counts (0: 1 and 64).
	MinPrefill, MaxPrefill, MinDecode, MaxDecode int
	// Recorder holds the router's measurements (nil: New makes one with
	// the SLOs; Planner.Recorder returns it).
	Recorder *Recorder
	// Fleet returns the workers as the router sees them now.
	Fleet func() []WorkerLoad
	// Actuator makes the changes (nil: decide and report only).
	Actuator Actuator
	Clock    clock.WithTicker
	Logger   *slog.Logger
	// Registerer takes the planner's metrics (nil: none).
	Registerer prometheus.Registerer
}

// Decision is one tick's outcome.
type Decision struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	// Prefill and Decode are the workers taking requests; DesiredPrefill and
	// DesiredDecode what the decision wants.
	Prefill        int    `json:"prefill"`
	Decode         int    `json:"decode"`
	DesiredPrefill int    `json:"desired_prefill"`
	DesiredDecode  int    `json:"desired_decode"`
	Reason         string `json:"reason"`
	Need           Need   `json:"need"`
	Inputs         Inputs `json:"inputs"`
	// Error is the actuator's, for a change that failed.
	Error string `json:"error,omitempty"`
}

// Planner runs the decisions. Create it with New; Run it.
type Planner struct {
	cfg Config
	m   *metrics.Planner

	mu      sync.Mutex
	snaps   []snapshot     // one per tick, oldest first, covering Window
	samples []decodeSample // the last maxSamples decode samples
	pending pendingChange
	lastAct time.Time
	// lastPrefillRate is the last prefill throughput measured (tokens
	// per busy second), for a window with no prefill work.
	lastPrefillRate float64
	// target is the counts last decided (published as desired replicas).
	target [2]int
	// askedAt is when the change an elastic actuator last made without
	// error was decided (zero after a failure).
	askedAt  time.Time
	applying bool
	last     Decision
	acted    []Decision // the last maxActed decisions that changed something
	wg       sync.WaitGroup
}

// pendingChange is the change called for since when.
type pendingChange struct {
	p, d  int
	since time.Time
}

const (
	// lightLoad is the load ratio below which a fixed fleet is not
	// re-split: every role has room, and a flip drains a worker.
	lightLoad  = 0.5
	maxSamples = 240
	maxActed   = 20
	// minGaps is the fewest inter-token gaps a decode sample averages.
	minGaps = 10
)

// New returns a Planner; it errors on a Config it cannot use.
func New(cfg Config) (*Planner, error) {
	if cfg.Fleet == nil {
		return nil, fmt.Errorf("planner: a Fleet is required")
	}
	if cfg.SLOs.TTFT < 0 || cfg.SLOs.ITL < 0 {
		return nil, fmt.Errorf("planner: SLOs must not be negative")
	}
	if cfg.SLOs.TTFT == 0 {
		cfg.SLOs.TTFT = DefaultTTFTSLO
	}
	if cfg.SLOs.ITL == 0 {
		cfg.SLOs.ITL = DefaultITLSLO
	}
	if cfg.SLOs.Margin <= 0 || cfg.SLOs.Margin > 1 {
		cfg.SLOs.Margin = DefaultMargin
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window < cfg.Interval {
		return nil, fmt.Errorf("planner: the window (%s) must be at least the interval (%s)", cfg.Window, cfg.Interval)
	}
	if cfg.Dwell < 0 {
		return nil, fmt.Errorf("planner: the dwell time must not be negative")
	}
	if cfg.Dwell == 0 {
		cfg.Dwell = DefaultDwell
	}
	if cfg.MinGain <= 0 || cfg.MinGain >= 1 {
		cfg.MinGain = DefaultMinGain
	}
	if cfg.MaxStep < 0 {
		return nil, fmt.Errorf("planner: MaxStep must not be negative")
	}
	for _, b := range []*int{&cfg.MinPrefill, &cfg.MinDecode} {
		*b = max(*b, 1)
	}
	for _, b := range []*int{&cfg.MaxPrefill, &cfg.MaxDecode} {
		if *b <= 0 {
			*b = 64
		}
	}
	if cfg.MaxPrefill < cfg.MinPrefill || cfg.MaxDecode < cfg.MinDecode {
		return nil, fmt.Errorf("planner: a role's maximum is below its minimum")
	}
	if cfg.Recorder == nil {
		cfg.Recorder = NewRecorder(cfg.SLOs.TTFT, cfg.SLOs.ITL)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Planner{cfg: cfg}
	if cfg.Registerer != nil {
		var err error
		if p.m, err = metrics.NewPlanner(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Recorder returns the Recorder the planner reads.
func (p *Planner) Recorder() *Recorder { return p.cfg.Recorder }

// Run decides every Interval until ctx ends, then waits for a change under
// way to return.
func (p *Planner) Run(ctx context.Context) {
	t := p.cfg.Clock.NewTicker(p.cfg.Interval)
	defer t.Stop()
	p.Tick(ctx, p.cfg.Clock.Now()) // the first snapshot
	for {
		select {
		case <-ctx.Done():
			p.wg.Wait()
			return
		case now := <-t.C():
			p.Tick(ctx, now)
		}
	}
}

// Tick makes one decision at now and, if it changes the fleet, starts the
// actuator on it (in its own goroutine: ctx bounds it). It returns the
// decision.
func (p *Planner) Tick(ctx context.Context, now time.Time) Decision {
	snap := p.cfg.Recorder.snapshot(now)
	fleet := p.cfg.Fleet()
	p.mu.Lock()
	defer p.mu.Unlock()
	in := p.inputsLocked(snap, fleet)
	need, ok := Estimate(in, p.cfg.SLOs)
	d := Decision{At: now, Action: ActionHold, Prefill: in.Prefill, Decode: in.Decode,
		DesiredPrefill: in.Prefill, DesiredDecode: in.Decode, Need: need, Inputs: in}
	switch {
	case p.applying:
		d.Reason = "a change is under way"
	case in.Leaving > 0 && now.Sub(p.lastAct) < 2*p.cfg.Dwell:
		// Workers come and go after a change: judge the fleet once they
		// have (a worker that never becomes ready stops counting after two
		// dwell times).
		d.Reason = fmt.Sprintf("%d worker(s) draining or not ready yet since the last change", in.Leaving)
	case in.Prefill == 0 || in.Decode == 0:
		d.Reason = "a role has no worker taking requests"
	case !ok:
		d.Reason = "not enough to go on: " + need.PrefillWhy + "; " + need.DecodeWhy
	case p.flips():
		p.decideSplitLocked(&d)
	default:
		p.decideScaleLocked(&d)
	}
	if d.Action != ActionHold && p.cfg.Actuator == nil && p.target == [2]int{d.DesiredPrefill, d.DesiredDecode} {
		d.Action = ActionHold
		d.Reason += " — published already (pdserve_planner_desired_replicas); no actuator here"
	}
	if d.Action != ActionHold && !p.flips() && p.cfg.Actuator != nil && p.target == [2]int{d.DesiredPrefill, d.DesiredDecode} &&
		!p.askedAt.IsZero() && now.Sub(p.askedAt) < 2*p.cfg.Dwell {
		// An elastic fleet follows the counts asked for in its own time
		// (pods start, an operator's tooling acts): ask again only if it
		// has not after two dwell times.
		d.Action = ActionHold
		d.Reason += fmt.Sprintf(" — asked of %s %s ago; waiting for the fleet to follow (asked again after %s)",
			p.cfg.Actuator.Name(), now.Sub(p.askedAt).Round(time.Second), 2*p.cfg.Dwell)
	}
	if d.Action != ActionHold {
		p.lastAct, p.pending = now, pendingChange{}
		p.target = [2]int{d.DesiredPrefill, d.DesiredDecode}
		if p.cfg.Actuator == nil {
			d.Reason += " — published as pdserve_planner_desired_replicas (no actuator here)"
		} else {
			p.applying = true
			p.wg.Add(1)
			go p.apply(ctx, d)
		}
	}
	if p.target == [2]int{} {
		p.target = [2]int{d.Prefill, d.Decode}
	}
	p.report(d)
	p.last = d
	return d
}

// flips reports whether the planner splits a fleet of fixed size (an
// actuator that flips roles) rather than scaling each role (an actuator
// that scales, or none: the desired counts are published for an HPA).
func (p *Planner) flips() bool { return p.cfg.Actuator != nil && p.cfg.Actuator.Flips() }

// apply runs the actuator on d and records how it went.
func (p *Planner) apply(ctx context.Context, d Decision) {
	defer p.wg.Done()
	err := p.cfg.Actuator.Apply(ctx, d)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applying = false
	result := "ok"
	p.askedAt = d.At
	if err != nil {
		p.askedAt = time.Time{}
		d.Error, result = err.Error(), "failed"
		p.cfg.Logger.Warn("planner: the change failed", "action", d.Action, "actuator", p.cfg.Actuator.Name(), "err", err)
	} else {
		p.cfg.Logger.Info("planner: change made", "action", d.Action, "prefill", d.DesiredPrefill, "decode", d.DesiredDecode)
	}
	if p.m != nil {
		p.m.Acted(d.Action, result)
	}
	p.acted = append(p.acted, d)
	if len(p.acted) > maxActed {
		p.acted = p.acted[1:]
	}
}

// inputsLocked measures Inputs over the window ending at snap, and takes
// the decode samples of the interval since the previous tick.
func (p *Planner) inputsLocked(snap snapshot, fleet []WorkerLoad) Inputs {
	var in Inputs
	kv := map[string]WorkerLoad{}
	for _, w := range fleet {
		kv[w.ID] = w
		switch {
		case !w.Taking:
			in.Leaving++
		case w.Role == rolePrefill:
			in.Prefill++
		case w.Role == roleDecode:
			in.Decode++
			in.DecodeKVHeld += w.KVTokens
			if w.KVCapacity > 0 && (in.DecodeKVTokens == 0 || w.KVCapacity < in.DecodeKVTokens) {
				in.DecodeKVTokens = w.KVCapacity
			}
			if w.MaxRunning > 0 && (in.DecodeMaxRunning == 0 || w.MaxRunning < in.DecodeMaxRunning) {
				in.DecodeMaxRunning = w.MaxRunning
			}
		}
	}
	if n := len(p.snaps); n > 0 {
		prev := p.snaps[n-1]
		for id, w := range snap.workers {
			old, seen := prev.workers[id]
			l, listed := kv[id]
			if w.role != roleDecode || !seen || old.role != w.role || !listed || !l.Taking {
				continue
			}
			if dn := w.gapsN - old.gapsN; dn >= minGaps {
				p.samples = append(p.samples, decodeSample{kv: float64(l.KVTokens),
					itl: (w.gaps - old.gaps).Seconds() / float64(dn), n: dn})
			}
		}
		if len(p.samples) > maxSamples {
			p.samples = append(p.samples[:0], p.samples[len(p.samples)-maxSamples:]...)
		}
	}
	snap.fleet = kv
	p.snaps = append(p.snaps, snap)
	for len(p.snaps) > 1 && snap.at.Sub(p.snaps[1].at) >= p.cfg.Window {
		p.snaps = p.snaps[1:]
	}
	// The KV held is the median of the window's ticks, not this tick's
	// alone: one tick's reports swing with the load (a long prompt's KV
	// lands on decode for the few tokens of its answer), and the planner
	// must not flip on a swing; KV held through most of the window (long
	// answers still running) counts.
	in.DecodeKVHeldNow = in.DecodeKVHeld
	in.DecodeKVHeld = p.medianHeldLocked()
	old := p.snaps[0]
	span := snap.at.Sub(old.at)
	in.Window = Duration(span)
	if span <= 0 {
		return in
	}
	c, o := snap.c, old.c
	if n := c.arrivals - o.arrivals; n > 0 {
		in.ArrivalRate = float64(n) / span.Seconds()
		in.MeanPromptTokens = float64(c.promptTokens-o.promptTokens) / float64(n)
		in.MeanOutputTokens = float64(c.outputTokens-o.outputTokens) / float64(n)
	}
	if n := c.local - o.local; n > 0 {
		in.LocalRate = float64(n) / span.Seconds()
		in.MeanLocalPromptTokens = float64(c.localPrompt-o.localPrompt) / float64(n)
	}
	in.Finished = c.finished - o.finished
	in.WithinSLOs = 1
	if in.Finished > 0 {
		in.WithinSLOs = float64(c.withinSLOs-o.withinSLOs) / float64(in.Finished)
	}
	in.TTFTp90 = Duration(c.ttft.since(o.ttft).quantile(0.9))
	in.ITLp90 = Duration(c.tpot.since(o.tpot).quantile(0.9))
	// Prefill throughput: from the workers' own forward time and prompt
	// tokens computed where they report them (the time a forward took,
	// whatever waited around it); else from the router's view, the time a
	// worker had a prefill leg in flight (which also counts a leg waiting
	// for its decode worker, so it underrates the worker).
	var fwd float64
	var computed int64
	nFwd := 0
	for id, w := range kv {
		o, ok := old.fleet[id]
		if w.Role != rolePrefill || !ok || o.Role != rolePrefill || w.ForwardSeconds <= o.ForwardSeconds {
			continue
		}
		fwd += w.ForwardSeconds - o.ForwardSeconds
		computed += w.PromptTokensComputed - o.PromptTokensComputed
		nFwd++
	}
	var busy time.Duration
	var tokens int64
	nPrefill := 0
	for id, w := range snap.workers {
		if w.role != rolePrefill {
			continue
		}
		ow := old.workers[id] // zero if it joined within the window
		if ow.role != w.role {
			ow = workerRec{} // it flipped within the window: its record is new
		}
		busy += w.busy - ow.busy
		tokens += w.tokens - ow.tokens
		nPrefill++
	}
	switch {
	case fwd > 0 && computed > 0:
		in.PrefillTokensPerBusySecond = float64(computed) / fwd
		in.PrefillBusy = fwd / (span.Seconds() * float64(nFwd))
		in.PrefillMeasuredBy = "forward time"
	case busy > 0 && tokens > 0:
		in.PrefillTokensPerBusySecond = float64(tokens) / busy.Seconds()
		in.PrefillBusy = busy.Seconds() / (span.Seconds() * float64(nPrefill))
		in.PrefillMeasuredBy = "legs in flight"
	case p.lastPrefillRate > 0:
		// Nothing prefilled in the window: the throughput measured last.
		in.PrefillTokensPerBusySecond, in.PrefillMeasuredBy = p.lastPrefillRate, "an earlier window"
	}
	if in.PrefillMeasuredBy != "an earlier window" {
		if in.PrefillTokensPerBusySecond > 0 {
			p.lastPrefillRate = in.PrefillTokensPerBusySecond
		}
	}
	in.DecodeFit, _ = fitDecode(p.samples)
	return in
}

// medianHeldLocked is the median over the window's ticks of the KV tokens
// the decode workers taking requests reported holding.
func (p *Planner) medianHeldLocked() int {
	held := make([]int, 0, len(p.snaps))
	for _, s := range p.snaps {
		k := 0
		for _, w := range s.fleet {
			if w.Taking && w.Role == roleDecode {
				k += w.KVTokens
			}
		}
		held = append(held, k)
	}
	slices.Sort(held)
	n := len(held)
	if n%2 == 1 {
		return held[n/2]
	}
	return (held[n/2-1] + held[n/2]) / 2
}

// ratio is the worse of the two roles' load ratios with p and d workers.
func ratio(nd Need, p, d int) float64 {
	return math.Max(nd.Prefill/float64(p), nd.Decode/float64(d))
}

// decideSplitLocked decides a flip in a fleet of fixed size.
func (p *Planner) decideSplitLocked(d *Decision) {
	total := d.Prefill + d.Decode
	if total < 2 {
		d.Reason = "a fixed fleet needs two workers to split"
		return
	}
	best := d.Prefill
	for n := 1; n < total; n++ {
		if ratio(d.Need, n, total-n) < ratio(d.Need, best, total-best) {
			best = n
		}
	}
	now := ratio(d.Need, d.Prefill, d.Decode)
	if now < lightLoad {
		p.pending = pendingChange{}
		d.Reason = fmt.Sprintf("the split %dP:%dD is lightly loaded (load ratio %.2f < %.1f): a flip would cost more than it gains",
			d.Prefill, d.Decode, now, lightLoad)
		return
	}
	if best == d.Prefill {
		p.pending = pendingChange{}
		d.Reason = fmt.Sprintf("the split %dP:%dD fits best (load ratio %.2f)", d.Prefill, d.Decode, now)
		return
	}
	np := best
	if m := p.cfg.MaxStep; m > 0 {
		np = min(d.Prefill+m, max(d.Prefill-m, best))
	}
	next := ratio(d.Need, np, total-np)
	if next > now*(1-p.cfg.MinGain) {
		p.pending = pendingChange{}
		d.Reason = fmt.Sprintf("%dP:%dD would cut the load ratio %.2f only to %.2f (less than %.0f %%)",
			np, total-np, now, next, p.cfg.MinGain*100)
		return
	}
	d.DesiredPrefill, d.DesiredDecode = np, total-np
	n := np - d.Prefill
	why := fmt.Sprintf("flip %d %s worker(s) to %s: load ratio %.2f → %.2f (%dP:%dD fits best)",
		max(n, -n), roleName(n < 0), roleName(n > 0), now, next, best, total-best)
	if now > 1 {
		// A role is over its capacity: its requests miss the SLO from now
		// on, so it is relieved without the dwell (the gain rule still
		// applies) — once a second tick in a row calls for the same split,
		// so that one tick's swing of the inputs flips nothing.
		if p.pending.p == d.DesiredPrefill && p.pending.d == d.DesiredDecode && !p.pending.since.IsZero() &&
			d.At.After(p.pending.since) {
			p.pending = pendingChange{}
			d.Action, d.Reason = ActionFlip, why+"; a role is overloaded: at once"
			return
		}
		p.pending = pendingChange{p: d.DesiredPrefill, d: d.DesiredDecode, since: d.At}
		d.Reason = why + "; a role is overloaded: at the next tick if it still calls for this split"
		return
	}
	p.callFor(d, why, ActionFlip)
}

func roleName(prefill bool) string {
	if prefill {
		return rolePrefill
	}
	return roleDecode
}

// decideScaleLocked decides each role's count in an elastic fleet.
func (p *Planner) decideScaleLocked(d *Decision) {
	want := func(need float64, lo, hi int) int {
		return min(hi, max(lo, int(math.Ceil(need-1e-9))))
	}
	d.DesiredPrefill = want(d.Need.Prefill, p.cfg.MinPrefill, p.cfg.MaxPrefill)
	d.DesiredDecode = want(d.Need.Decode, p.cfg.MinDecode, p.cfg.MaxDecode)
	if d.DesiredPrefill == d.Prefill && d.DesiredDecode == d.Decode {
		p.pending = pendingChange{}
		d.Reason = fmt.Sprintf("%dP:%dD meets the need (%.2f, %.2f)", d.Prefill, d.Decode, d.Need.Prefill, d.Need.Decode)
		return
	}
	why := fmt.Sprintf("scale %dP:%dD → %dP:%dD for a need of %.2f prefill and %.2f decode workers",
		d.Prefill, d.Decode, d.DesiredPrefill, d.DesiredDecode, d.Need.Prefill, d.Need.Decode)
	if d.DesiredPrefill >= d.Prefill && d.DesiredDecode >= d.Decode {
		// Scaling up waits for nothing (but a change under way).
		d.Action, d.Reason = ActionScale, why
		return
	}
	p.callFor(d, why, ActionScale)
}

// callFor makes d the change why if it has been called for over Dwell and
// the last change was Dwell ago; else d holds and says how long remains.
func (p *Planner) callFor(d *Decision, why, action string) {
	if p.pending.p != d.DesiredPrefill || p.pending.d != d.DesiredDecode || p.pending.since.IsZero() {
		p.pending = pendingChange{p: d.DesiredPrefill, d: d.DesiredDecode, since: d.At}
	}
	wait := max(p.cfg.Dwell-d.At.Sub(p.pending.since), p.cfg.Dwell-d.At.Sub(p.lastAct))
	if wait > 0 {
		d.Reason = fmt.Sprintf("%s — waits %s more (dwell %s)", why, wait.Round(time.Millisecond), p.cfg.Dwell)
		return
	}
	d.Action, d.Reason = action, why
}

// report logs and counts d.
func (p *Planner) report(d Decision) {
	if p.m != nil {
		p.m.Decided(d.Action, p.target, [2]int{d.Prefill, d.Decode}, [2]float64{d.Need.Prefill, d.Need.Decode},
			d.Inputs.ArrivalRate, d.Inputs.WithinSLOs)
	}
	lvl := slog.LevelDebug
	if d.Action != ActionHold || d.Reason != p.last.Reason {
		lvl = slog.LevelInfo
	}
	p.cfg.Logger.Log(context.Background(), lvl, "planner decision", "action", d.Action, "reason", d.Reason,
		"prefill", d.Prefill, "decode", d.Decode, "desired_prefill", d.DesiredPrefill, "desired_decode", d.DesiredDecode,
		"need_prefill", round2(d.Need.Prefill), "need_decode", round2(d.Need.Decode),
		"prefill_why", d.Need.PrefillWhy, "decode_why", d.Need.DecodeWhy,
		"arrival_rate", round2(d.Inputs.ArrivalRate), "within_slos", round2(d.Inputs.WithinSLOs))
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

// Status is GET /planner's answer.
type Status struct {
	Actuator string   `json:"actuator"`
	Mode     string   `json:"mode"` // "flip" or "scale"
	TTFTSLO  Duration `json:"ttft_slo"`
	ITLSLO   Duration `json:"itl_slo"`
	Interval Duration `json:"interval"`
	Window   Duration `json:"window"`
	Dwell    Duration `json:"dwell"`
	Applying bool     `json:"applying"`
	// Last is the latest decision, Changes the last ones that changed the
	// fleet (oldest first).
	Last    Decision   `json:"last"`
	Changes []Decision `json:"changes"`
}

// Status returns the planner's state.
func (p *Planner) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Status{Actuator: "none", Mode: "scale", TTFTSLO: Duration(p.cfg.SLOs.TTFT), ITLSLO: Duration(p.cfg.SLOs.ITL),
		Interval: Duration(p.cfg.Interval), Window: Duration(p.cfg.Window), Dwell: Duration(p.cfg.Dwell),
		Applying: p.applying, Last: p.last, Changes: append([]Decision{}, p.acted...)}
	if a := p.cfg.Actuator; a != nil {
		s.Actuator = a.Name()
	}
	if p.flips() {
		s.Mode = "flip"
	}
	return s
}

// ServeHTTP answers GET /planner with the Status as JSON.
func (p *Planner) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b, err := json.MarshalIndent(p.Status(), "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

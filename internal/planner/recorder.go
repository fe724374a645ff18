package planner

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Recorder collects what the router sees as it happens, the planner's
// measured inputs: every arrival (refused and shed ones too: demand is
// measured where it arrives, not where it completes, or a saturated fleet
// would look idle), each request's time to first token and time per output
// token, each worker's busy time and the prompt tokens its prefill legs
// carried, and the gaps between the tokens each decode worker produced.
//
// Its counters only grow; the planner reads a snapshot every interval and
// works on differences. It is safe for concurrent use; every method is a
// few additions under one mutex.
type Recorder struct {
	mu  sync.Mutex
	cum counters
	// workers by id: role, legs in flight and since when it has been busy.
	workers map[string]*workerRec
}

// counters are the Recorder's cumulative totals.
type counters struct {
	arrivals     int64
	promptTokens int64
	// local and localPrompt count the arrivals a decode worker served
	// alone (per-request disaggregation) and their prompt tokens.
	local, localPrompt int64
	outputTokens       int64 // max_tokens asked for
	finished           int64 // requests that got a first token and ended
	withinSLOs         int64 // of those, TTFT and TPOT within both SLOs
	ttft, tpot         histogram
	ttftSLO, tpotSLO   time.Duration
}

// workerRec is one worker's cumulative counters.
type workerRec struct {
	role      string
	inFlight  int
	busySince time.Time
	busy      time.Duration // time with at least one leg in flight
	tokens    int64         // prompt tokens of the prefill legs that ended
	gaps      time.Duration // sum of the gaps between its decode tokens
	gapsN     int64
}

// NewRecorder returns a Recorder judging requests against the SLOs (0: that
// SLO is not judged).
func NewRecorder(ttftSLO, tpotSLO time.Duration) *Recorder {
	return &Recorder{workers: make(map[string]*workerRec), cum: counters{ttftSLO: ttftSLO, tpotSLO: tpotSLO}}
}

// Arrived records a request as it reaches the router: its prompt and the
// output tokens it asks for (max_tokens; 0 when it did not say, then it
// counts nothing toward the mean output length).
func (r *Recorder) Arrived(promptTokens, maxTokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cum.arrivals++
	r.cum.promptTokens += int64(promptTokens)
	r.cum.outputTokens += int64(maxTokens)
}

// ServedLocally records that an arrival's prompt is computed by its decode
// worker (per-request disaggregation): no prefill worker serves it.
func (r *Recorder) ServedLocally(promptTokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cum.local++
	r.cum.localPrompt += int64(promptTokens)
}

// Finished records a request that got its first token and ended: its time
// to first token and its time per output token after the first (tpot 0:
// one token only, judged on TTFT alone).
func (r *Recorder) Finished(ttft, tpot time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &r.cum
	c.finished++
	c.ttft.add(ttft)
	okT := c.ttftSLO == 0 || ttft <= c.ttftSLO
	okP := true
	if tpot > 0 {
		c.tpot.add(tpot)
		okP = c.tpotSLO == 0 || tpot <= c.tpotSLO
	}
	if okT && okP {
		c.withinSLOs++
	}
}

// LegStarted records a leg sent to worker id (role "prefill" or "decode")
// at now; the function it returns records its end, with the prompt tokens
// it carried (counted for a prefill leg only).
func (r *Recorder) LegStarted(id, role string, now time.Time) (ended func(now time.Time, promptTokens int)) {
	r.mu.Lock()
	w := r.workerLocked(id, role)
	if w.inFlight == 0 {
		w.busySince = now
	}
	w.inFlight++
	r.mu.Unlock()
	var once sync.Once
	return func(now time.Time, promptTokens int) {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			w.inFlight--
			if w.inFlight == 0 && now.After(w.busySince) {
				w.busy += now.Sub(w.busySince)
			}
			if w.role == rolePrefill {
				w.tokens += int64(promptTokens)
			}
		})
	}
}

// Gap records the time between two consecutive output tokens of one
// request on decode worker id.
func (r *Recorder) Gap(id string, gap time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workerLocked(id, roleDecode)
	w.gaps += gap
	w.gapsN++
}

// Forget drops worker id's counters (it left the fleet).
func (r *Recorder) Forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.workers, id)
}

// workerLocked returns worker id's record; a worker seen in another role
// than before (its role flipped, same id) starts a new one.
func (r *Recorder) workerLocked(id, role string) *workerRec {
	w := r.workers[id]
	if w == nil || w.role != role {
		w = &workerRec{role: role}
		r.workers[id] = w
	}
	return w
}

// snapshot is the Recorder's counters at one time; a busy worker's busy
// time counts up to at.
type snapshot struct {
	at      time.Time
	c       counters
	workers map[string]workerRec
	// fleet is the workers' own view at the same tick, by id.
	fleet map[string]WorkerLoad
}

func (r *Recorder) snapshot(at time.Time) snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := snapshot{at: at, c: r.cum, workers: make(map[string]workerRec, len(r.workers))}
	for id, w := range r.workers {
		ws := *w
		if ws.inFlight > 0 && at.After(ws.busySince) {
			ws.busy += at.Sub(ws.busySince)
		}
		s.workers[id] = ws
	}
	return s
}

// histogram counts durations in buckets 10 % apart from 100 µs up (the
// last bucket takes everything longer than ~40 minutes): a quantile comes
// out within 10 % of the true one.
type histogram struct {
	n [histBuckets]int64
}

const (
	histBuckets = 160
	histMin     = 100 * time.Microsecond
	histGrowth  = 1.1
)

func histBucket(d time.Duration) int {
	if d <= histMin {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(histMin)) / math.Log(histGrowth)))
	return min(i, histBuckets-1)
}

// histUpper is bucket i's upper bound.
func histUpper(i int) time.Duration {
	return time.Duration(float64(histMin) * math.Pow(histGrowth, float64(i)))
}

func (h *histogram) add(d time.Duration) { h.n[histBucket(d)]++ }

// since returns h's counts less old's.
func (h histogram) since(old histogram) histogram {
	for i := range h.n {
		h.n[i] -= old.n[i]
	}
	return h
}

// quantile returns the q-quantile (the upper bound of its bucket), or 0
// with no samples.
func (h histogram) quantile(q float64) time.Duration {
	var total int64
	for _, n := range h.n {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(total)))
	i := sort.Search(len(h.n), func(i int) bool {
		var c int64
		for _, n := range h.n[:i+1] {
			c += n
		}
		return c >= rank
	})
	return histUpper(min(i, histBuckets-1))
}

package llama

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// team is a fixed set of goroutines that run parallel loops: the caller plus
// n−1 helpers. A team lives for one Forward call (startTeam … stop), so a
// model holds no goroutines between calls and there is nothing to leak.
//
// A decode step runs a few hundred parallel loops of tens of microseconds
// each, so handing a loop to a parked goroutine (a futex wake-up, often
// 10–50 µs on a virtual machine) would cost as much as the loop. Between
// loops the helpers therefore spin on the current-loop pointer for up to
// spinFor, yielding the processor now and then, and only then park; the
// caller wakes a parked helper through its channel. Spinning happens only
// inside a Forward, whose team occupies its threads anyway.
//
// Each worker starts on its own contiguous share of a loop's indices, so
// that in decode each streams one run of weight rows, which the hardware
// prefetchers follow, rather than rows interleaved with the other
// workers'. It takes its share a chunk of grain indices at a time, and when
// it runs out it steals the back half of the largest share left. A loop is
// done when all its indices are done, whoever ran them: a helper that the
// OS has not scheduled yet (another process holds its CPU) does not hold the
// loop up unless it has claimed a chunk, since the others steal its share.

// A team is used by one goroutine (the one that started it) at a time.
type team struct {
	n       int
	helpers []*helper
	exited  sync.WaitGroup
	cur     atomic.Pointer[job] // the latest loop; nil before the first
}

// helper is one helper goroutine's parking state.
type helper struct {
	sleeping atomic.Bool
	wake     chan struct{} // capacity 1
	_        [64]byte      // keep helpers' flags on separate cache lines
}

// runner is a parallel loop body: run(w, lo, hi) handles indices [lo, hi)
// on worker w (for per-worker scratch).
type runner interface{ run(w, lo, hi int) }

// loopFunc adapts a function to runner.
type loopFunc func(w, lo, hi int)

func (f loopFunc) run(w, lo, hi int) { f(w, lo, hi) }

// job is one parallel loop: body over [0, n), in chunks of at most grain
// indices taken from the workers' shares. Its fields are not written after
// it is published, except the shares and the count of indices done.
type job struct {
	body  runner
	n     int
	grain int
	quit  bool
	share []share      // worker w's indices left; len = team size
	done  atomic.Int64 // indices finished
}

// share is a worker's range of a loop's indices not yet handed out, [lo,
// hi) packed as lo | hi<<32, on its own cache line. Its owner takes chunks
// from the front, thieves the back half; both by compare-and-swap. A range
// never takes a value it had before (ranges only shrink, and a refilled
// share gets indices from another's), so a swap cannot succeed on a stale
// value.
type share struct {
	r atomic.Uint64
	_ [56]byte
}

func packRange(lo, hi int) uint64       { return uint64(lo) | uint64(hi)<<32 }
func unpackRange(v uint64) (lo, hi int) { return int(uint32(v)), int(v >> 32) }

// newJob returns the loop of body over [0, n) for a team of size workers,
// each given a contiguous n/size of the indices.
func newJob(body runner, n, grain, size int) *job {
	j := &job{body: body, n: n, grain: grain, share: make([]share, size)}
	for w := range j.share {
		j.share[w].r.Store(packRange(w*n/size, (w+1)*n/size))
	}
	return j
}

// run runs chunks on worker w until no indices are left to hand out.
func (j *job) run(w int) {
	own := &j.share[w].r
	for {
		v := own.Load()
		lo, hi := unpackRange(v)
		if lo >= hi {
			if !j.steal(own) {
				return
			}
			continue
		}
		end := min(lo+j.grain, hi)
		if !own.CompareAndSwap(v, packRange(end, hi)) {
			continue // a thief took the back half
		}
		j.body.run(w, lo, end)
		j.done.Add(int64(end - lo))
	}
}

// steal moves the back half (all of it, if no more than a chunk) of the
// largest share left into own, which is empty, and reports whether there
// was any.
func (j *job) steal(own *atomic.Uint64) bool {
	for {
		var victim *atomic.Uint64
		var v uint64
		most := 0
		for i := range j.share {
			r := &j.share[i].r
			x := r.Load()
			if lo, hi := unpackRange(x); hi-lo > most {
				victim, v, most = r, x, hi-lo
			}
		}
		if victim == nil {
			return false
		}
		lo, hi := unpackRange(v)
		mid := lo
		if hi-lo > j.grain {
			mid = lo + (hi-lo)/2
		}
		if victim.CompareAndSwap(v, packRange(lo, mid)) {
			own.Store(packRange(mid, hi))
			return true
		}
	}
}

// spinFor is how long an idle helper (or the caller waiting for helpers)
// spins before parking.
const spinFor = 200 * time.Microsecond

// startTeam starts n−1 helper goroutines (n ≥ 1).
func startTeam(n int) *team {
	t := &team{n: max(n, 1)}
	t.helpers = make([]*helper, t.n-1)
	for i := range t.helpers {
		h := &helper{wake: make(chan struct{}, 1)}
		t.helpers[i] = h
		t.exited.Add(1)
		go t.helperLoop(h, i+1)
	}
	return t
}

func (t *team) helperLoop(h *helper, w int) {
	defer t.exited.Done()
	var seen *job
	for {
		j := t.await(h, seen)
		if j.quit {
			return
		}
		j.run(w)
		seen = j
	}
}

// await returns the loop published after seen, spinning and then parking.
func (t *team) await(h *helper, seen *job) *job {
	var start time.Time
	for spins := 0; ; spins++ {
		if j := t.cur.Load(); j != seen && j != nil {
			return j
		}
		if spins%128 != 127 {
			continue
		}
		runtime.Gosched()
		if start.IsZero() {
			start = time.Now()
			continue
		}
		if time.Since(start) < spinFor {
			continue
		}
		// Park. The caller publishes, then takes the flag and sends; we set
		// the flag, then look again: one of us sees the other (sequentially
		// consistent atomics), and exactly one takes the flag back.
		h.sleeping.Store(true)
		if j := t.cur.Load(); j != seen && j != nil {
			if h.sleeping.CompareAndSwap(true, false) {
				return j
			}
		}
		<-h.wake
		start = time.Time{}
	}
}

// publish makes j the current loop and wakes parked helpers.
func (t *team) publish(j *job) {
	t.cur.Store(j)
	for _, h := range t.helpers {
		if h.sleeping.CompareAndSwap(true, false) {
			h.wake <- struct{}{}
		}
	}
}

// stop ends the helpers and waits for them to exit.
func (t *team) stop() {
	t.publish(&job{quit: true})
	t.exited.Wait()
}

// size is the number of workers, caller included; worker indices passed to
// loop bodies are in [0, size).
func (t *team) size() int { return t.n }

// parallelFor calls body.run(w, lo, hi) over disjoint ranges covering
// [0, n), each of at most grain indices, on the team's workers, and returns
// when all are done. Small loops (n ≤ grain) run inline on the caller.
func (t *team) parallelFor(n, grain int, body runner) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	if t.n == 1 || n <= grain {
		body.run(0, 0, n)
		return
	}
	j := newJob(body, n, grain, t.n)
	t.publish(j)
	j.run(0)
	var start time.Time
	for spins := 0; j.done.Load() != int64(n); spins++ {
		if spins%128 == 127 {
			// A helper running a chunk may have been descheduled; let others
			// run, and stop burning the CPU if it takes long.
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				time.Sleep(20 * time.Microsecond)
				continue
			}
			runtime.Gosched()
		}
	}
}

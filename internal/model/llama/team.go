package llama

import (
	"sync"
	"sync/atomic"
)

// team is a fixed set of goroutines that run parallel loops: the caller plus
// n−1 helpers. A team lives for one Forward call (startTeam … stop), so a
// model holds no goroutines between calls and there is nothing to leak.
// Starting one costs n−1 goroutine spawns (microseconds), negligible next to
// a forward step.
//
// A team is used by one goroutine (the one that started it) at a time.
type team struct {
	n      int
	jobs   []chan *job // one per helper
	exited sync.WaitGroup
}

// job is one parallel loop: fn over [0, n) in chunks of grain indices,
// handed out in order through next.
type job struct {
	fn    func(w, lo, hi int)
	n     int
	grain int
	next  atomic.Int64
	done  sync.WaitGroup
}

func (j *job) run(w int) {
	for {
		lo := int(j.next.Add(int64(j.grain))) - j.grain
		if lo >= j.n {
			return
		}
		j.fn(w, lo, min(lo+j.grain, j.n))
	}
}

// startTeam starts n−1 helper goroutines (n ≥ 1).
func startTeam(n int) *team {
	t := &team{n: max(n, 1)}
	t.jobs = make([]chan *job, t.n-1)
	for i := range t.jobs {
		ch := make(chan *job, 1)
		t.jobs[i] = ch
		t.exited.Add(1)
		go func(w int) {
			defer t.exited.Done()
			for j := range ch {
				j.run(w)
				j.done.Done()
			}
		}(i + 1)
	}
	return t
}

// stop ends the helpers and waits for them to exit.
func (t *team) stop() {
	for _, ch := range t.jobs {
		close(ch)
	}
	t.exited.Wait()
}

// size is the number of workers, caller included; worker indices passed to
// loop bodies are in [0, size).
func (t *team) size() int { return t.n }

// parallelFor calls fn(w, lo, hi) over disjoint ranges covering [0, n), each
// of at most grain indices, on the team's workers (w is the worker index, for
// per-worker scratch), and returns when all are done. Small loops (n ≤ grain)
// run inline on the caller.
func (t *team) parallelFor(n, grain int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	if t.n == 1 || n <= grain {
		fn(0, 0, n)
		return
	}
	j := &job{fn: fn, n: n, grain: grain}
	helpers := min(len(t.jobs), (n+grain-1)/grain-1)
	j.done.Add(helpers)
	for i := range helpers {
		t.jobs[i] <- j
	}
	j.run(0)
	j.done.Wait()
}

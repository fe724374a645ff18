package router

import (
	"context"
	"sync/atomic"
)

// legWatch cancels a leg read on the client's goroutine when its client's
// context ends, its worker is found down or the router shuts down, until
// stop. It runs no goroutine of its own: each cause registers the
// cancellation with context.AfterFunc, which starts one only if the cause
// happens. A request costs three registrations instead of a goroutine
// parked in a select and its wake-ups.
type legWatch struct {
	stopped atomic.Bool
	stops   [3]func() bool
}

// watchLeg starts watching for a leg whose cancellation is cancel.
func (r *Router) watchLeg(client, workerDown context.Context, cancel context.CancelFunc) *legWatch {
	w := &legWatch{}
	f := func() {
		if !w.stopped.Load() { // stopped first: a Stop's answer also ends the client's context
			cancel() // the blocked read ends; Recv answers for the cause
		}
	}
	w.stops[0] = context.AfterFunc(client, f)
	w.stops[1] = context.AfterFunc(workerDown, f)
	w.stops[2] = context.AfterFunc(r.stopCtx, f)
	return w
}

// stop ends the watch; a cause that happens afterwards no longer cancels
// the leg. It is idempotent.
func (w *legWatch) stop() {
	if w.stopped.Swap(true) {
		return
	}
	for _, s := range w.stops {
		s()
	}
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/registry"
)

// FlipRoles is the planner's actuator of `pdserve up --planner`: it moves
// one worker of the cluster from one role to the other, losing no request:
//
//  1. the router stops sending the worker new legs (the admin API's drain);
//  2. the worker drains: the requests it holds finish, for up to
//     DrainTimeout (what is left then is continued on other pairs by the
//     router, as for any worker that stops);
//  3. it is unlisted and shut down;
//  4. a new worker of the other role starts on fresh ports, is listed, and
//     Apply returns once the router sees it ready (within ReadyTimeout).
//
// A worker is the same binary in either role, so a flip is a worker
// restart; a GPU deployment keeps its weights loaded across it, here the
// model is built again (NewModel).
type FlipRoles struct {
	C *Cluster
	// DrainTimeout bounds step 2 (0: one minute); ReadyTimeout step 4 (0: 30 s).
	DrainTimeout, ReadyTimeout time.Duration
}

// Name implements planner.Actuator.
func (f *FlipRoles) Name() string { return "pdserve-up-role-flip" }

// Flips implements planner.Actuator.
func (f *FlipRoles) Flips() bool { return true }

// Apply implements planner.Actuator: the flips to d's split, together
// (each drains while the others do).
func (f *FlipRoles) Apply(ctx context.Context, d planner.Decision) error {
	from, to := lifecycle.RoleDecode, lifecycle.RolePrefill
	n := d.DesiredPrefill - d.Prefill
	if n < 0 {
		from, to, n = lifecycle.RolePrefill, lifecycle.RoleDecode, -n
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = f.C.Flip(ctx, from, to, cmpDur(f.DrainTimeout, time.Minute), cmpDur(f.ReadyTimeout, 30*time.Second))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Flip moves the least busy worker of role from to role to (FlipRoles
// says how). It errors when the cluster cannot flip (fixed worker ports,
// a role with one worker taking requests) or a step fails; the router
// then goes on with the workers it has.
func (c *Cluster) Flip(ctx context.Context, from, to lifecycle.Role, drainTimeout, readyTimeout time.Duration) error {
	if c.start == nil || c.Router == nil {
		return errors.New("flip: not a running cluster")
	}
	if c.fixedPorts {
		return errors.New("flip: the workers have fixed ports (--worker-port-base); a flipped worker needs fresh ones")
	}
	r := c.Router.Router
	static, ok := r.Fleet().Registry().(*registry.Static)
	if !ok {
		return fmt.Errorf("flip: the router's workers come from %s, not from this cluster", r.Fleet().Registry().Name())
	}
	c.mu.Lock()
	src := &c.Prefill
	if from == lifecycle.RoleDecode {
		src = &c.Decode
	}
	var victim *WorkerServer
	var victimID string
	least := -1
	for _, w := range *src {
		id, err := workerID(w.URL)
		if err != nil || c.flipping[w] {
			continue
		}
		fw, ok := r.Fleet().Get(id)
		if !ok || fw.State() != fleet.StateReady {
			continue
		}
		if least < 0 || fw.Legs() < least {
			victim, victimID, least = w, id, fw.Legs()
		}
	}
	if victim != nil {
		if c.flipping == nil {
			c.flipping = map[*WorkerServer]bool{}
		}
		c.flipping[victim] = true // no other flip picks it
	}
	c.mu.Unlock()
	if victim == nil {
		return fmt.Errorf("flip: no ready %s worker", from)
	}
	defer func() {
		c.mu.Lock()
		delete(c.flipping, victim)
		c.mu.Unlock()
	}()
	// 1. No new legs (refused if it is the role's last ready worker).
	if err := r.Fleet().Drain(victimID, false); err != nil {
		return fmt.Errorf("flip: %w", err)
	}
	log := c.log
	log.Info("planner: flipping a worker", "worker", victim.URL, "from", from.String(), "to", to.String())
	// 2. Its requests finish.
	dctx, cancel := context.WithTimeout(ctx, drainTimeout)
	derr := victim.Drain(dctx)
	cancel()
	if ctx.Err() != nil {
		// The fleet is stopping (its planner was cancelled): the victim
		// stays drained, and nothing new starts.
		return fmt.Errorf("flip: %w", ctx.Err())
	}
	if derr != nil {
		log.Warn("planner: the flipped worker did not drain in time; the router continues what it held", "worker", victim.URL, "err", derr)
	}
	// 3. Gone.
	static.Remove(victimID)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	serr := victim.Shutdown(sctx)
	cancel()
	c.mu.Lock()
	*src = slices.DeleteFunc(*src, func(w *WorkerServer) bool { return w == victim })
	i := c.next[to]
	c.next[to]++
	c.mu.Unlock()
	if serr != nil {
		log.Warn("planner: the flipped worker's shutdown", "worker", victim.URL, "err", serr)
	}
	// 4. Back in the other role (one start at a time: the start function
	// numbers the workers it starts).
	if ctx.Err() != nil {
		return fmt.Errorf("flip: %w", ctx.Err())
	}
	c.startMu.Lock()
	nw, err := c.start(to, i)
	c.startMu.Unlock()
	if err != nil {
		return fmt.Errorf("flip: start a %s worker: %w", to, err)
	}
	c.mu.Lock()
	dst := &c.Prefill
	if to == lifecycle.RoleDecode {
		dst = &c.Decode
	}
	*dst = append(*dst, nw)
	c.mu.Unlock()
	e, err := static.Add(to.String(), nw.URL)
	if err != nil {
		return fmt.Errorf("flip: list the new %s worker: %w", to, err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		if fw, ok := r.Fleet().Get(e.ID); ok && fw.State() == fleet.StateReady {
			log.Info("planner: worker flipped", "from_worker", victim.URL, "to_worker", nw.URL, "role", to.String())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flip: the new %s worker %s not ready after %s", to, nw.URL, readyTimeout)
		}
		r.CheckNow()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// workerID is a worker URL's registry id (its host:port), as the static
// registry gives it.
func workerID(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

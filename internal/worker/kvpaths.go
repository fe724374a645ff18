package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// kvPaths is a decode worker's view of its KV connections, one per prefill
// KV address: up, connecting, refused (with the refusal's reason) or
// unreachable, as the transport reported them (PeerUp, PeerLost). The
// router learns it from /health, so a path that cannot work (another
// --kv-auth, a route that is down) is known before a request uses it.
//
// It is safe for concurrent use: the transport's goroutines report into it,
// health handlers read it.
type kvPaths struct {
	mu     sync.Mutex
	byAddr map[string]*kvPath
	// changed is closed (and replaced) at every change of a path's state.
	changed chan struct{}
}

type kvPath struct {
	state, refusal, reason string
	since                  time.Time
	lastDial               time.Time
	// listed is the last time a router asked about the path; a path no
	// router asked about for pathForget is forgotten unless it is up.
	listed time.Time
}

const (
	// pathRedial is the least time between two dials of a path that failed,
	// when routers ask about it.
	pathRedial = time.Second
	// pathForget is how long a path nobody asks about and that is not up
	// is remembered.
	pathForget = time.Minute
)

func newKVPaths() *kvPaths {
	return &kvPaths{byAddr: make(map[string]*kvPath), changed: make(chan struct{})}
}

// setLocked moves addr's path to state (p.mu held).
func (p *kvPaths) setLocked(addr, state, refusal, reason string, now time.Time) {
	kp := p.byAddr[addr]
	if kp == nil {
		kp = &kvPath{listed: now}
		p.byAddr[addr] = kp
	}
	if kp.state == state && kp.reason == reason {
		return
	}
	kp.state, kp.refusal, kp.reason, kp.since = state, refusal, reason, now
	close(p.changed)
	p.changed = make(chan struct{})
}

// up records a connection to addr whose handshake passed.
func (p *kvPaths) up(addr string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked(addr, workerapi.KVPathUp, "", "", now)
}

// lost records the end of a connection to addr: refused, or unreachable
// (a failed dial, a lost connection).
func (p *kvPaths) lost(addr string, err error, now time.Time) {
	if addr == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if kp := p.byAddr[addr]; kp != nil && kp.state == workerapi.KVPathUp {
		// A connection that was up and is lost is dialled again at the
		// next ask, however recent its own dial: pathRedial spaces the
		// dials of a path that keeps failing, not the first one after a
		// loss. Until then the path reads unreachable, and a router
		// would hold the pair for a second while the peer is fine.
		kp.lastDial = time.Time{}
	}
	if why, detail, ok := kvxfer.RefusalOf(err); ok {
		p.setLocked(addr, workerapi.KVPathRefused, why.String(), detail, now)
		return
	}
	reason := "connection lost"
	if err != nil {
		reason = err.Error()
	}
	p.setLocked(addr, workerapi.KVPathUnreachable, "", reason, now)
}

// ensure makes sure every address in addrs has a connection or one under
// way: it dials those it has none to, and those whose last connection
// failed at least pathRedial ago.
func (p *kvPaths) ensure(addrs []string, connect func(string) kvxfer.PeerID, now time.Time) {
	var dial []string
	p.mu.Lock()
	for _, a := range addrs {
		kp := p.byAddr[a]
		switch {
		case kp == nil:
			p.setLocked(a, workerapi.KVPathConnecting, "", "", now)
			kp = p.byAddr[a]
		case kp.state == workerapi.KVPathUp || kp.state == workerapi.KVPathConnecting:
			kp.listed = now
			continue
		case now.Sub(kp.lastDial) < pathRedial:
			kp.listed = now
			continue
		default:
			// Keep the failure's reason until the new attempt resolves.
			kp.state = workerapi.KVPathConnecting
		}
		kp.listed, kp.lastDial = now, now
		dial = append(dial, a)
	}
	for a, kp := range p.byAddr {
		if kp.state != workerapi.KVPathUp && now.Sub(kp.listed) > pathForget {
			delete(p.byAddr, a)
		}
	}
	p.mu.Unlock()
	for _, a := range dial {
		connect(a)
	}
}

// wait waits until none of addrs is connecting, ctx ends, or after fires.
func (p *kvPaths) wait(ctx context.Context, addrs []string, after <-chan time.Time) {
	for {
		p.mu.Lock()
		busy := false
		for _, a := range addrs {
			if kp := p.byAddr[a]; kp != nil && kp.state == workerapi.KVPathConnecting {
				busy = true
				break
			}
		}
		ch := p.changed
		p.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-ch:
		case <-after:
			return
		case <-ctx.Done():
			return
		}
	}
}

// list returns the paths of addrs (every known path if addrs is nil), by
// address.
func (p *kvPaths) list(addrs []string) []workerapi.KVPath {
	p.mu.Lock()
	defer p.mu.Unlock()
	if addrs == nil {
		for a := range p.byAddr {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
	}
	out := make([]workerapi.KVPath, 0, len(addrs))
	for _, a := range addrs {
		if kp := p.byAddr[a]; kp != nil {
			out = append(out, workerapi.KVPath{Addr: a, State: kp.state, Refusal: kp.refusal, Reason: kp.reason, Since: kp.since})
		}
	}
	return out
}

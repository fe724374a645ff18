package fault

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"
)

// DefaultWithin is NetConfig.Within when zero.
const DefaultWithin = time.Second

// writeChunkBytes bounds one write to the inner connection, so a freeze
// that starts during a large write stops it at the next chunk.
const writeChunkBytes = 64 << 10

// DialFunc opens a connection, like net.Dialer.DialContext; it is the type
// of tcp.Config.DialContext.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// NetConfig sets the random faults of a Net. Probabilities are per dialed
// connection, in [0, 1] (clamped); the zero NetConfig injects nothing.
type NetConfig struct {
	// Seed seeds the random stream that decides each connection's faults.
	Seed uint64
	// Freeze is the probability that a connection freezes once, at a
	// uniform random time in [0, Within) after it was dialed, for
	// FreezeFor: no byte is read from or written to it meanwhile (reads and
	// writes block, honouring deadlines), so heartbeats stop both ways and
	// each side's silence detection fires if FreezeFor exceeds it. A
	// connection closed while frozen closes its socket only when the
	// freeze ends, so the peer sees no FIN or RST meanwhile.
	Freeze float64
	// FreezeFor is the length of a random freeze; zero disables them.
	FreezeFor time.Duration
	// Reset is the probability that a connection is reset once, at a
	// uniform random time in [0, Within) after it was dialed: it is closed
	// at once (with an RST where the platform allows) and its reads and
	// writes fail with an error wrapping ErrReset.
	Reset float64
	// Within bounds when a random fault strikes (default DefaultWithin).
	Within time.Duration
}

// Net dials connections that freeze or reset at random (NetConfig) or on
// demand (FreezeAll, ResetAll). Its Dial method plugs into
// tcp.Config.DialContext. A Net needs no Close: a connection's pending
// faults are cancelled when it is closed; but a connection closed while
// frozen keeps its socket until the freeze ends (ThawAll ends it at once).
type Net struct {
	inner DialFunc

	mu      sync.Mutex
	cfg     NetConfig
	rng     *rand.Rand
	conns   map[*conn]struct{} // connections whose socket is open
	freezes uint64
	resets  uint64
}

// netPlan is what the random stream decided for one dialed connection.
type netPlan struct {
	freeze, reset     bool
	freezeAt, resetAt time.Duration // after the dial
	freezeFor         time.Duration
}

// NewNet returns a Net dialing through inner (nil: a net.Dialer).
func NewNet(cfg NetConfig, inner DialFunc) *Net {
	if inner == nil {
		var d net.Dialer
		inner = d.DialContext
	}
	n := &Net{inner: inner, conns: make(map[*conn]struct{})}
	n.setConfigLocked(cfg, true)
	return n
}

// Dialer returns a DialFunc whose connections freeze or reset at random as
// cfg says; it is NewNet(cfg, inner).Dial. Use NewNet to also freeze or
// reset connections on demand.
func Dialer(cfg NetConfig, inner func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return NewNet(cfg, inner).Dial
}

// SetConfig replaces the random faults of connections dialed from now on,
// cancels the faults scheduled on open connections that have not struck
// yet, and ends every freeze; so SetConfig(NetConfig{}) quiets the network
// at once. The random stream continues unless cfg.Seed differs from the
// seed in effect, which restarts it from cfg.Seed.
func (n *Net) SetConfig(cfg NetConfig) {
	n.mu.Lock()
	n.setConfigLocked(cfg, false)
	conns := n.connsLocked()
	n.mu.Unlock()
	for _, c := range conns {
		c.calm(true)
	}
}

func (n *Net) setConfigLocked(cfg NetConfig, first bool) {
	for _, p := range []*float64{&cfg.Freeze, &cfg.Reset} {
		switch {
		case math.IsNaN(*p) || *p < 0:
			*p = 0
		case *p > 1:
			*p = 1
		}
	}
	if cfg.Within <= 0 {
		cfg.Within = DefaultWithin
	}
	if first || cfg.Seed != n.cfg.Seed {
		n.rng = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x6a09e667f3bcc909))
	}
	n.cfg = cfg
}

// planLocked draws four values per dial whatever the outcome.
func (n *Net) planLocked() netPlan {
	r, c := n.rng, &n.cfg
	var p netPlan
	p.freeze = r.Float64() < c.Freeze && c.FreezeFor > 0
	p.freezeAt = time.Duration(r.Float64() * float64(c.Within))
	p.reset = r.Float64() < c.Reset
	p.resetAt = time.Duration(r.Float64() * float64(c.Within))
	p.freezeFor = c.FreezeFor
	return p
}

// Dial dials through the inner DialFunc and wraps the connection with the
// faults the random stream decides for it (drawn even if the dial fails,
// so decisions depend only on the sequence of calls).
func (n *Net) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	plan := n.planLocked()
	n.mu.Unlock()
	nc, err := n.inner(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, n: n, done: make(chan struct{})}
	n.mu.Lock()
	n.conns[c] = struct{}{}
	n.mu.Unlock()
	c.mu.Lock()
	if plan.freeze {
		c.scheduled = append(c.scheduled, time.AfterFunc(plan.freezeAt, func() { c.freeze(plan.freezeFor) }))
	}
	if plan.reset {
		c.scheduled = append(c.scheduled, time.AfterFunc(plan.resetAt, func() { c.reset() }))
	}
	c.mu.Unlock()
	return c, nil
}

// FreezeAll freezes every open connection for d (extending a freeze under
// way if it would end sooner) and returns how many it froze.
func (n *Net) FreezeAll(d time.Duration) int {
	count := 0
	for _, c := range n.snapshot() {
		if c.freeze(d) {
			count++
		}
	}
	return count
}

// ThawAll ends every freeze at once (closing the sockets of connections
// closed while frozen).
func (n *Net) ThawAll() {
	for _, c := range n.snapshot() {
		c.calm(false)
	}
}

// ResetAll resets every open connection and returns how many it reset.
func (n *Net) ResetAll() int {
	count := 0
	for _, c := range n.snapshot() {
		if c.reset() {
			count++
		}
	}
	return count
}

// Open returns how many sockets dialed by n are open: connections neither
// closed nor reset, and those closed during a freeze that has not ended.
func (n *Net) Open() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.conns)
}

// Injected returns the faults that struck so far, random or on demand:
// "freeze" (freezes started) and "reset".
func (n *Net) Injected() map[string]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return map[string]uint64{"freeze": n.freezes, "reset": n.resets}
}

// snapshot lists the open connections.
func (n *Net) snapshot() []*conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.connsLocked()
}

func (n *Net) connsLocked() []*conn {
	out := make([]*conn, 0, len(n.conns))
	for c := range n.conns {
		out = append(out, c)
	}
	return out
}

func (n *Net) forget(c *conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

func (n *Net) count(freeze bool) {
	n.mu.Lock()
	if freeze {
		n.freezes++
	} else {
		n.resets++
	}
	n.mu.Unlock()
}

// conn is a dialed connection with faults.
type conn struct {
	net.Conn
	n    *Net
	done chan struct{} // closed when closed or reset

	mu        sync.Mutex
	closed    bool // by Close
	broken    bool // by reset
	frozen    bool
	freezeEnd time.Time
	thaw      chan struct{} // closed when the current freeze ends
	thawTimer *time.Timer
	scheduled []*time.Timer // random faults not yet struck
	// closeAtThaw: closed during a freeze; the socket closes when it ends.
	closeAtThaw bool
	readDL      time.Time
	writeDL     time.Time
	dlChanged   chan struct{} // made by a waiter, closed when a deadline changes
	pending     []byte        // read during a freeze, not yet delivered
}

// Read reads from the connection; while frozen it delivers nothing (bytes
// that arrive are kept for after the freeze) until the freeze ends, the
// read deadline passes or the connection closes.
func (c *conn) Read(p []byte) (int, error) {
	for {
		if err := c.waitThawed("read"); err != nil {
			return 0, err
		}
		c.mu.Lock()
		if len(c.pending) > 0 {
			n := copy(p, c.pending)
			c.pending = c.pending[n:]
			if len(c.pending) == 0 {
				c.pending = nil
			}
			c.mu.Unlock()
			return n, nil
		}
		c.mu.Unlock()
		n, err := c.Conn.Read(p)
		c.mu.Lock()
		if c.broken {
			c.mu.Unlock()
			return 0, c.opError("read", ErrReset)
		}
		if n > 0 && c.frozen {
			c.pending = append(c.pending, p[:n]...)
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		return n, err
	}
}

// Write writes to the connection in chunks, each waiting while frozen
// until the freeze ends, the write deadline passes or the connection
// closes.
func (c *conn) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if err := c.waitThawed("write"); err != nil {
			return written, err
		}
		chunk := p[:min(len(p), writeChunkBytes)]
		n, err := c.Conn.Write(chunk)
		written += n
		p = p[n:]
		if err != nil {
			if c.isBroken() {
				err = c.opError("write", ErrReset)
			}
			return written, err
		}
	}
	return written, nil
}

// SetDeadline sets both deadlines, on the inner connection and for waits
// in a freeze. After a reset it fails with ErrReset.
func (c *conn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.readDL, t)
	c.setDeadline(&c.writeDL, t)
	return c.deadlineError(c.Conn.SetDeadline(t))
}

// SetReadDeadline sets the read deadline (see SetDeadline).
func (c *conn) SetReadDeadline(t time.Time) error {
	c.setDeadline(&c.readDL, t)
	return c.deadlineError(c.Conn.SetReadDeadline(t))
}

// SetWriteDeadline sets the write deadline (see SetDeadline).
func (c *conn) SetWriteDeadline(t time.Time) error {
	c.setDeadline(&c.writeDL, t)
	return c.deadlineError(c.Conn.SetWriteDeadline(t))
}

func (c *conn) setDeadline(dl *time.Time, t time.Time) {
	c.mu.Lock()
	*dl = t
	if c.dlChanged != nil {
		close(c.dlChanged)
		c.dlChanged = nil
	}
	c.mu.Unlock()
}

// deadlineError reports a failure to set a deadline on a reset
// connection as the reset.
func (c *conn) deadlineError(err error) error {
	if err != nil && c.isBroken() {
		return c.opError("set", ErrReset)
	}
	return err
}

// Close closes the connection, cancels its scheduled faults and wakes
// reads and writes waiting in a freeze. Closing a frozen connection keeps
// the freeze's promise that nothing reaches the peer: the socket is closed
// (and the peer sees the FIN or RST) only when the freeze ends, so the
// peer notices the loss by its own heartbeats.
func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed || c.broken {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.closed = true
	c.stopTimersLocked()
	close(c.done)
	deferred := c.frozen
	c.closeAtThaw = deferred
	c.mu.Unlock()
	if deferred {
		return nil
	}
	return c.closeInner()
}

// closeInner closes the socket and forgets the connection.
func (c *conn) closeInner() error {
	err := c.Conn.Close()
	c.n.forget(c)
	return err
}

func (c *conn) isBroken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

func (c *conn) stopTimersLocked() {
	for _, t := range c.scheduled {
		t.Stop()
	}
	c.scheduled = nil
}

// freeze starts (or extends) a freeze of d; it reports false if the
// connection is closed.
func (c *conn) freeze(d time.Duration) bool {
	c.mu.Lock()
	if c.closed || c.broken {
		c.mu.Unlock()
		return false
	}
	end := time.Now().Add(d)
	switch {
	case !c.frozen:
		c.frozen = true
		c.thaw = make(chan struct{})
		c.freezeEnd = end
		c.thawTimer = time.AfterFunc(d, c.thawIfDue)
	case end.After(c.freezeEnd):
		c.freezeEnd = end
		c.thawTimer.Stop()
		c.thawTimer = time.AfterFunc(d, c.thawIfDue)
	}
	c.n.count(true) // before anyone can see the effect (c.mu → n.mu)
	c.mu.Unlock()
	return true
}

// thawIfDue ends the freeze if its end has come (a timer stopped too late
// to be cancelled finds it has not).
func (c *conn) thawIfDue() {
	c.mu.Lock()
	closeNow := false
	if c.frozen && !time.Now().Before(c.freezeEnd) {
		closeNow = c.unfreezeLocked()
	}
	c.mu.Unlock()
	if closeNow {
		_ = c.closeInner()
	}
}

// calm cancels scheduled faults (if cancel) and ends a freeze now.
func (c *conn) calm(cancel bool) {
	c.mu.Lock()
	if cancel {
		c.stopTimersLocked()
	}
	closeNow := c.unfreezeLocked()
	c.mu.Unlock()
	if closeNow {
		_ = c.closeInner()
	}
}

// unfreezeLocked ends a freeze and wakes its waiters. It reports whether
// the connection was closed during the freeze, so the caller must now
// close the socket (after unlocking c.mu).
func (c *conn) unfreezeLocked() (closeNow bool) {
	if !c.frozen {
		return false
	}
	c.frozen = false
	close(c.thaw)
	c.thaw = nil
	c.thawTimer.Stop()
	c.thawTimer = nil
	closeNow, c.closeAtThaw = c.closeAtThaw, false
	return closeNow
}

// reset closes the socket abruptly (RST where possible), frozen or not;
// reads and writes then fail with ErrReset. It reports false if the
// connection was already closed or reset.
func (c *conn) reset() bool {
	c.mu.Lock()
	if c.closed || c.broken {
		c.mu.Unlock()
		return false
	}
	c.broken = true
	c.stopTimersLocked()
	c.unfreezeLocked()
	close(c.done)
	// All before anyone can see the effect (c.mu → n.mu; closing a socket
	// does not block).
	c.n.count(false)
	if l, ok := c.Conn.(interface{ SetLinger(sec int) error }); ok {
		_ = l.SetLinger(0)
	}
	_ = c.closeInner()
	c.mu.Unlock()
	return true
}

// waitThawed waits until the connection is not frozen, or returns the
// error of a passed deadline (op: "read" or "write") or a closed
// connection.
func (c *conn) waitThawed(op string) error {
	for {
		c.mu.Lock()
		switch {
		case c.broken:
			c.mu.Unlock()
			return c.opError(op, ErrReset)
		case c.closed:
			c.mu.Unlock()
			return c.opError(op, net.ErrClosed)
		case !c.frozen:
			c.mu.Unlock()
			return nil
		}
		dl := c.readDL
		if op == "write" {
			dl = c.writeDL
		}
		if c.dlChanged == nil {
			c.dlChanged = make(chan struct{})
		}
		thaw, changed := c.thaw, c.dlChanged
		c.mu.Unlock()
		var expired <-chan time.Time
		var timer *time.Timer
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				return c.opError(op, os.ErrDeadlineExceeded)
			}
			timer = time.NewTimer(d)
			expired = timer.C
		}
		select {
		case <-thaw:
		case <-changed:
		case <-c.done:
		case <-expired:
			return c.opError(op, os.ErrDeadlineExceeded)
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

func (c *conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: err}
}

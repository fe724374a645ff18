package fault

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// DefaultReorderHold is how long a frame picked for reordering waits for a
// next frame to swap with when Config.MaxDelay is zero; with MaxDelay set it
// waits up to MaxDelay. If no frame follows in that time it goes alone.
const DefaultReorderHold = 20 * time.Millisecond

// ErrReset is wrapped by the error an injected reset passes to the inner
// Backend's ClosePeer (and so by that connection's PeerLost error), and by
// the read and write errors of a connection reset by a Net.
var ErrReset = errors.New("injected connection reset")

// Config sets the faults of a Backend. Probabilities are per sent frame of
// a faulted type, in [0, 1] (values outside are clamped, NaN is 0); the
// zero Config injects nothing.
type Config struct {
	// Seed seeds the random stream that makes every decision.
	Seed uint64
	// Delay is the probability that a frame is held for a uniform random
	// time in [0, MaxDelay). Later frames to that peer queue behind it, as
	// on a slow link, so order is kept.
	Delay float64
	// MaxDelay bounds a delay; zero disables delays. It also bounds how
	// long a frame picked by Reorder waits for a next frame (default
	// DefaultReorderHold).
	MaxDelay time.Duration
	// Drop is the probability that a frame is discarded (counted as
	// "injected_drop" by DroppedFrames).
	Drop float64
	// Duplicate is the probability that a frame is sent twice in a row.
	Duplicate float64
	// Reorder is the probability that a frame is held until the next frame
	// to that peer and sent right after it (the two swap places).
	Reorder float64
	// Corrupt is the probability that a frame is altered in a field the
	// receiver checks: one bit of one byte of KVChunk.Data (of NPages if
	// Data is empty), of KVDone.Checksum, RoomOpen.PromptHash,
	// RoomReady.NTokens, the Gen of one room of a RoomRenew (an empty
	// RoomRenew is left alone), or the Gen of KVAck, Abort and AbortAck.
	// Data and Rooms are copied before the change.
	Corrupt float64
	// Reset is the probability that a frame closes its connection instead
	// of being sent, through the inner Backend's kvxfer.PeerCloser with an
	// error wrapping ErrReset (frames held for that peer are discarded).
	// Ignored if the inner Backend is not a PeerCloser.
	Reset float64
	// Stall is the probability that a frame starts a stall of StallFor:
	// that frame and every later frame to that peer are held until the
	// stall ends, then sent in order. Transport heartbeats continue, so the
	// peer sees its room leases lapse, not a lost peer. A frame sent during
	// a stall does not start another.
	Stall float64
	// StallFor is the length of a stall; zero disables stalls.
	StallFor time.Duration
	// Replay is the probability that a room's KV stream is replaced by the
	// last complete stream sent to the same peer for another room (or
	// gen), relabelled with this room's (room, gen): what a relay that
	// rewrites frame headers, or a prefill that sends another request's
	// KV, delivers. It is decided at the room's first KV_CHUNK (Seq 0), if
	// such a stream is recorded and its first chunk covers the same pages;
	// each of the room's KV_CHUNKs then goes as the recorded chunk of the
	// same Seq (unless that one covers other pages), and its KV_DONE as the
	// recorded KV_DONE, so byte counts and checksum match the bytes sent.
	// While Replay is set, the KV streams sent are recorded (their own
	// copies of Data; bounded per peer, see maxStreamBytes), and recorded
	// streams are the genuine ones, never a replacement. Both KV_CHUNK and
	// KV_DONE must be among Types.
	Replay float64
	// Types lists the frame types faults apply to; nil means every room
	// message type (ROOM_OPEN … ABORT_ACK), an empty non-nil slice none. Other types are never faulted,
	// but still queue behind held frames so order is kept. Types that are
	// not room messages are ignored.
	Types []kvxfer.Type
}

func (c Config) normalized() Config {
	clamp := func(p *float64) {
		switch {
		case math.IsNaN(*p) || *p < 0:
			*p = 0
		case *p > 1:
			*p = 1
		}
	}
	for _, p := range []*float64{&c.Delay, &c.Drop, &c.Duplicate, &c.Reorder, &c.Corrupt, &c.Reset, &c.Stall, &c.Replay} {
		clamp(p)
	}
	c.Types = slices.Clone(c.Types) // keeps nil (every type) apart from empty (none)
	return c
}

// kind is a kind of injected fault.
type kind int

const (
	kindDelay kind = iota
	kindDrop
	kindDuplicate
	kindReorder
	kindCorrupt
	kindReset
	kindStall
	kindReplay
	numKinds
)

func (k kind) String() string {
	switch k {
	case kindDelay:
		return "delay"
	case kindDrop:
		return "drop"
	case kindDuplicate:
		return "duplicate"
	case kindReorder:
		return "reorder"
	case kindCorrupt:
		return "corrupt"
	case kindReset:
		return "reset"
	case kindStall:
		return "stall"
	case kindReplay:
		return "replay"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Backend is a kvxfer.Backend that injects faults into the room messages it
// sends through an inner Backend. Listen, Connect and Remote pass through.
type Backend struct {
	inner  kvxfer.Backend
	closer kvxfer.PeerCloser // the inner Backend's, or nil

	kick chan struct{} // capacity 1: the held frames changed
	stop chan struct{} // closed by Close
	wg   sync.WaitGroup

	mu       sync.Mutex
	cfg      Config
	faulted  [kvxfer.NumTypes]bool // types faults apply to
	rng      *rand.Rand
	injected [numKinds]uint64
	links    map[kvxfer.PeerID]*link // peers with held frames or a stall
	running  bool                    // the release goroutine was started
	closed   bool
	// replays holds the KV streams recorded for Config.Replay, by peer
	// (at most maxReplayPeers, in replayOrder).
	replays     map[kvxfer.PeerID]*replayPeer
	replayOrder []kvxfer.PeerID
}

var (
	_ kvxfer.Backend     = (*Backend)(nil)
	_ kvxfer.DropCounter = (*Backend)(nil)
	_ kvxfer.PeerCloser  = (*Backend)(nil)
)

// link is the state of the frames to one peer.
type link struct {
	held       []heldFrame // in sending order
	stallUntil time.Time   // nothing is sent before
}

// heldFrame is a frame waiting in a link.
type heldFrame struct {
	m      kvxfer.Message
	copies int       // 2 if duplicated
	due    time.Time // not sent before (delay)
	// waiting: picked for reordering and waiting for a next frame to go
	// before it, until holdUntil. Only the last frame of a link waits.
	waiting   bool
	holdUntil time.Time
}

// Wrap returns a Backend injecting cfg's faults into what b sends. The
// returned Backend owns b: its Close closes b.
func Wrap(b kvxfer.Backend, cfg Config) *Backend {
	f := &Backend{
		inner: b,
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		links: make(map[kvxfer.PeerID]*link),

		replays: make(map[kvxfer.PeerID]*replayPeer),
	}
	f.closer, _ = b.(kvxfer.PeerCloser)
	f.setConfigLocked(cfg, true)
	return f
}

// Unwrap returns the inner Backend (e.g. for a transport's own stats).
func (b *Backend) Unwrap() kvxfer.Backend { return b.inner }

// SetConfig replaces the faults applied to frames sent from now on. Every
// frame held under the old Config (delayed, stalled or waiting to be
// reordered) is handed to the inner Backend before SetConfig returns, in
// order per peer, and stalls end; so SetConfig(Config{}) reaches a state
// with nothing held at once. The random stream continues unless cfg.Seed
// differs from the seed in effect, which restarts it from cfg.Seed.
func (b *Backend) SetConfig(cfg Config) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setConfigLocked(cfg, false)
	if b.closed {
		return
	}
	for peer, l := range b.links {
		for _, h := range l.held {
			_ = b.deliverLocked(peer, h) // a failed connection reports PeerLost
		}
		delete(b.links, peer)
	}
	b.kickLocked()
}

func (b *Backend) setConfigLocked(cfg Config, first bool) {
	cfg = cfg.normalized()
	if first || cfg.Seed != b.cfg.Seed {
		b.rng = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	}
	b.cfg = cfg
	if cfg.Replay == 0 {
		clear(b.replays)
		b.replayOrder = nil
	}
	clear(b.faulted[:])
	if cfg.Types == nil {
		for t := kvxfer.TypeRoomOpen; t <= kvxfer.TypeAbortAck; t++ {
			b.faulted[t] = true
		}
	}
	for _, t := range cfg.Types {
		if t >= kvxfer.TypeRoomOpen && t <= kvxfer.TypeAbortAck {
			b.faulted[t] = true
		}
	}
}

// Injected returns how many faults of each kind were injected so far, by
// kind: "delay", "drop", "duplicate", "reorder" (frames swapped with the
// next one), "corrupt", "reset", "stall" (stalls started) and "replay"
// (rooms whose KV stream was replaced). Every key is present.
func (b *Backend) Injected() map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]uint64, numKinds)
	for k := range numKinds {
		out[k.String()] = b.injected[k]
	}
	return out
}

// DroppedFrames implements kvxfer.DropCounter: the inner Backend's counts
// (if it is a DropCounter) plus "injected_drop", the frames discarded by
// Config.Drop.
func (b *Backend) DroppedFrames() map[string]uint64 {
	out := make(map[string]uint64)
	if dc, ok := b.inner.(kvxfer.DropCounter); ok {
		for k, v := range dc.DroppedFrames() {
			out[k] += v
		}
	}
	b.mu.Lock()
	out["injected_drop"] += b.injected[kindDrop]
	b.mu.Unlock()
	return out
}

// Listen passes through to the inner Backend.
func (b *Backend) Listen(addr string) (string, error) { return b.inner.Listen(addr) }

// Connect passes through to the inner Backend.
func (b *Backend) Connect(addr string) kvxfer.PeerID { return b.inner.Connect(addr) }

// Remote passes through to the inner Backend.
func (b *Backend) Remote(peer kvxfer.PeerID) string { return b.inner.Remote(peer) }

// ClosePeer implements kvxfer.PeerCloser: it discards the frames held for
// peer and passes the call to the inner Backend (a no-op if that is not a
// PeerCloser).
func (b *Backend) ClosePeer(peer kvxfer.PeerID, err error) {
	b.mu.Lock()
	delete(b.links, peer)
	b.forgetReplayLocked(peer)
	b.mu.Unlock()
	if b.closer != nil {
		b.closer.ClosePeer(peer, err)
	}
}

// Send applies the configured faults to m and hands it to the inner Backend
// now or, if held, later from the release goroutine; it never blocks. It
// returns the inner Backend's error for a frame sent at once (the first
// copy's, if duplicated), and nil for a frame held, dropped or turned into
// a reset; a held frame that the inner Backend refuses when released is
// discarded (its connection is gone, and PeerLost says so). Messages that
// are not room messages passed by value, and everything after Close, pass
// straight through.
func (b *Backend) Send(peer kvxfer.PeerID, m kvxfer.Message) error {
	if !isRoomMessage(m) {
		return b.inner.Send(peer, m)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.inner.Send(peer, m)
	}
	now := time.Now()
	l := b.links[peer]
	if l != nil && len(l.held) == 0 && !now.Before(l.stallUntil) {
		delete(b.links, peer)
		l = nil
	}
	var d decision
	if b.faulted[m.Type()] {
		d = b.decideLocked()
	}
	if b.cfg.Replay > 0 {
		m = b.replayLocked(peer, m, d.replay)
	}

	if d.reset && b.closer != nil {
		b.injected[kindReset]++
		delete(b.links, peer) // held frames die with the connection
		b.forgetReplayLocked(peer)
		b.mu.Unlock()
		b.closer.ClosePeer(peer, fmt.Errorf("kv peer %d: %w", peer, ErrReset))
		return nil
	}
	if d.drop {
		b.injected[kindDrop]++
		b.mu.Unlock()
		return nil
	}
	if d.corrupt {
		if c, ok := corrupt(m, d.pos); ok {
			m = c
			b.injected[kindCorrupt]++
		}
	}
	h := heldFrame{m: m, copies: 1, due: now}
	if d.duplicate {
		h.copies = 2
		b.injected[kindDuplicate]++
	}
	if d.stall && b.cfg.StallFor > 0 && (l == nil || !now.Before(l.stallUntil)) {
		l = b.linkLocked(peer, l)
		l.stallUntil = now.Add(b.cfg.StallFor)
		b.injected[kindStall]++
	}
	if d.delay && b.cfg.MaxDelay > 0 {
		h.due = now.Add(time.Duration(d.delayFrac * float64(b.cfg.MaxDelay)))
		b.injected[kindDelay]++
	}

	switch {
	case l != nil && len(l.held) > 0 && l.held[len(l.held)-1].waiting:
		// Swap with the frame waiting for a next one: this one goes first.
		last := len(l.held) - 1
		w := l.held[last]
		w.waiting = false
		l.held[last] = h
		l.held = append(l.held, w)
		b.injected[kindReorder]++
	case d.reorder:
		h.waiting = true
		hold := b.cfg.MaxDelay
		if hold <= 0 {
			hold = DefaultReorderHold
		}
		h.holdUntil = now.Add(hold)
		l = b.linkLocked(peer, l)
		l.held = append(l.held, h)
	case l != nil || h.due.After(now):
		// Behind held frames, in a stall, or delayed.
		l = b.linkLocked(peer, l)
		l.held = append(l.held, h)
	default:
		err := b.deliverLocked(peer, h)
		b.mu.Unlock()
		return err
	}
	// What may go now (a swapped pair) goes now, not when the release
	// goroutine gets to it; the goroutine handles what waits for a time.
	if b.releaseLinkLocked(peer, l, now).IsZero() {
		delete(b.links, peer)
	} else {
		b.startLocked()
		b.kickLocked()
	}
	b.mu.Unlock()
	return nil
}

// Close discards every held frame, stops the release goroutine and waits
// for it, then closes the inner Backend and returns its error. Like the
// inner Close it must not be called from a Handler method.
func (b *Backend) Close() error {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		clear(b.links)
		clear(b.replays)
		b.replayOrder = nil
		close(b.stop)
	}
	b.mu.Unlock()
	b.wg.Wait()
	return b.inner.Close()
}

// decision is what the random stream decided for one frame.
type decision struct {
	reset, drop, corrupt, duplicate, stall, delay, reorder, replay bool
	pos                                                            uint64  // what to corrupt
	delayFrac                                                      float64 // of MaxDelay
}

// decideLocked draws the same number of values for every frame of one
// Config, so the decisions for a frame do not depend on those for earlier
// ones: nine, and a tenth while Replay is set (so a Config without Replay
// makes the same decisions for a seed as before Replay existed).
func (b *Backend) decideLocked() decision {
	r, c := b.rng, &b.cfg
	var d decision
	d.reset = r.Float64() < c.Reset
	d.drop = r.Float64() < c.Drop
	d.corrupt = r.Float64() < c.Corrupt
	d.pos = r.Uint64()
	d.duplicate = r.Float64() < c.Duplicate
	d.stall = r.Float64() < c.Stall
	d.delay = r.Float64() < c.Delay
	d.delayFrac = r.Float64()
	d.reorder = r.Float64() < c.Reorder
	if c.Replay > 0 {
		d.replay = r.Float64() < c.Replay
	}
	return d
}

// linkLocked returns l, or a new link registered for peer if l is nil.
func (b *Backend) linkLocked(peer kvxfer.PeerID, l *link) *link {
	if l == nil {
		l = &link{}
		b.links[peer] = l
	}
	return l
}

// deliverLocked hands a frame (each copy) to the inner Backend and returns
// the first copy's error. Called under b.mu, so frames reach the inner
// Backend in the order decided here; inner Sends do not block.
func (b *Backend) deliverLocked(peer kvxfer.PeerID, h heldFrame) error {
	err := b.inner.Send(peer, h.m)
	for range h.copies - 1 {
		m := h.m
		if c, ok := m.(kvxfer.KVChunk); ok && len(c.Data) > 0 {
			// Each frame handed on owns its Data: the inner Backend may
			// give a written frame's buffer back to its sender for reuse.
			c.Data = append([]byte(nil), c.Data...)
			m = c
		}
		_ = b.inner.Send(peer, m) // a failure is the first copy's
	}
	return err
}

func (b *Backend) kickLocked() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// startLocked starts the release goroutine unless it runs.
func (b *Backend) startLocked() {
	if b.running {
		return
	}
	b.running = true
	b.wg.Add(1)
	go b.releaseLoop()
}

// releaseLoop sends held frames when they are due, until Close.
func (b *Backend) releaseLoop() {
	defer b.wg.Done()
	timer := time.NewTimer(0)
	timer.Stop()
	defer timer.Stop()
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		next := b.releaseLocked(time.Now())
		b.mu.Unlock()
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-b.stop:
			return
		case <-b.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// releaseLocked sends every frame that may go at now, in order per peer,
// forgets links with nothing left to do, and returns when it must run
// next (zero: when kicked).
func (b *Backend) releaseLocked(now time.Time) time.Time {
	var next time.Time
	for peer, l := range b.links {
		wake := b.releaseLinkLocked(peer, l, now)
		switch {
		case wake.IsZero():
			delete(b.links, peer)
		case next.IsZero() || wake.Before(next):
			next = wake
		}
	}
	return next
}

// releaseLinkLocked sends the frames of one link that may go at now, in
// order, and returns when something of the link is due next: a held
// frame, or the end of its stall; zero if nothing is left.
func (b *Backend) releaseLinkLocked(peer kvxfer.PeerID, l *link, now time.Time) time.Time {
	for len(l.held) > 0 {
		if now.Before(l.stallUntil) {
			return l.stallUntil
		}
		h := l.held[0]
		at := h.due
		if h.waiting && h.holdUntil.After(at) {
			at = h.holdUntil
		}
		if now.Before(at) {
			return at
		}
		_ = b.deliverLocked(peer, h) // a failed connection reports PeerLost
		l.held[0] = heldFrame{}
		l.held = l.held[1:]
	}
	if now.Before(l.stallUntil) {
		return l.stallUntil // to forget the link when the stall ends
	}
	return time.Time{}
}

// isRoomMessage reports whether m is a room message passed by value (what
// a transport accepts from Send).
func isRoomMessage(m kvxfer.Message) bool {
	switch m.(type) {
	case kvxfer.RoomOpen, kvxfer.RoomReady, kvxfer.RoomRenew, kvxfer.KVChunk, kvxfer.KVDone,
		kvxfer.KVAck, kvxfer.Abort, kvxfer.AbortAck:
		return true
	}
	return false
}

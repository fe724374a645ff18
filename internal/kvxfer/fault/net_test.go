package fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/tcp"
)

// handler is a kvxfer.Handler that records what it hears and lets tests
// wait for it.
type handler struct {
	mu      sync.Mutex
	up      []kvxfer.PeerID
	msgs    map[kvxfer.PeerID][]kvxfer.Message
	lost    map[kvxfer.PeerID]lostEvent
	changed chan struct{}
}

type lostEvent struct {
	err   error
	at    time.Time
	calls int
}

func newHandler() *handler {
	return &handler{msgs: map[kvxfer.PeerID][]kvxfer.Message{}, lost: map[kvxfer.PeerID]lostEvent{},
		changed: make(chan struct{})}
}

func (h *handler) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *handler) PeerUp(p kvxfer.PeerID, _ string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.up = append(h.up, p)
	h.notifyLocked()
}

func (h *handler) HandleMessage(p kvxfer.PeerID, m kvxfer.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs[p] = append(h.msgs[p], m)
	h.notifyLocked()
}

func (h *handler) PeerLost(p kvxfer.PeerID, err error) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.lost[p]
	if e.calls == 0 {
		e.err, e.at = err, now
	}
	e.calls++
	h.lost[p] = e
	h.notifyLocked()
}

// wait waits up to waitTimeout until cond, called under h.mu, is true.
func (h *handler) wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		ok, ch := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
	}
}

func (h *handler) waitUp(t testing.TB) kvxfer.PeerID {
	t.Helper()
	h.wait(t, "PeerUp", func() bool { return len(h.up) > 0 })
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up[0]
}

func (h *handler) waitMsgs(t testing.TB, p kvxfer.PeerID, n int) []kvxfer.Message {
	t.Helper()
	h.wait(t, fmt.Sprintf("%d messages from peer %d", n, p), func() bool { return len(h.msgs[p]) >= n })
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]kvxfer.Message(nil), h.msgs[p]...)
}

func (h *handler) waitLost(t testing.TB, p kvxfer.PeerID) lostEvent {
	t.Helper()
	h.wait(t, fmt.Sprintf("PeerLost of peer %d", p), func() bool { return h.lost[p].calls > 0 })
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost[p]
}

// waitAnyLost returns the first PeerLost of any peer.
func (h *handler) waitAnyLost(t testing.TB) lostEvent {
	t.Helper()
	h.wait(t, "any PeerLost", func() bool { return len(h.lost) > 0 })
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.lost {
		return e
	}
	panic("unreachable")
}

func (h *handler) lostCalls(p kvxfer.PeerID) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost[p].calls
}

var testFP = kvxfer.Fingerprint{Model: "sim-tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "f32", PageSize: 16}

// kvPair is a prefill (listening) and a decode (dialing through a Net) tcp
// Backend, each wrapped in a fault Backend with no faults, connected.
type kvPair struct {
	net                   *Net
	prefill, decode       *Backend
	prefillH, decodeH     *handler
	prefillPeer           kvxfer.PeerID // decode, as prefill sees it
	decodePeer            kvxfer.PeerID // prefill, as decode sees it
	interval              time.Duration
	misses                int
	prefillTCP, decodeTCP *tcp.Backend
}

// startKVPair starts the pair and the decode side's Connect, and returns
// without waiting for the handshake.
func startKVPair(t *testing.T, interval time.Duration, misses int, ncfg NetConfig) *kvPair {
	t.Helper()
	p := &kvPair{net: NewNet(ncfg, nil), prefillH: newHandler(), decodeH: newHandler(), interval: interval, misses: misses}
	silence := interval * time.Duration(misses)
	p.prefillTCP = tcp.New(tcp.Config{Fingerprint: testFP, Handler: p.prefillH,
		HeartbeatInterval: interval, HeartbeatMisses: misses, HandshakeTimeout: silence})
	p.decodeTCP = tcp.New(tcp.Config{Fingerprint: testFP, Handler: p.decodeH,
		HeartbeatInterval: interval, HeartbeatMisses: misses, HandshakeTimeout: silence, DialContext: p.net.Dial})
	p.prefill, p.decode = Wrap(p.prefillTCP, Config{Seed: 1}), Wrap(p.decodeTCP, Config{Seed: 2})
	t.Cleanup(func() {
		p.decode.Close()
		p.prefill.Close()
		p.net.ThawAll() // closes the sockets of connections closed while frozen
		if n := p.net.Open(); n != 0 {
			t.Errorf("%d dialed connections still open after Close", n)
		}
	})
	addr, err := p.prefill.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.decodePeer = p.decode.Connect(addr)
	return p
}

// newKVPair starts a pair and waits until a room message went each way.
func newKVPair(t *testing.T, interval time.Duration, misses int, ncfg NetConfig) *kvPair {
	t.Helper()
	p := startKVPair(t, interval, misses, ncfg)
	if got := p.decodeH.waitUp(t); got != p.decodePeer {
		t.Fatalf("decode PeerUp for peer %d, want %d", got, p.decodePeer)
	}
	p.prefillPeer = p.prefillH.waitUp(t)
	// A room message each way proves the link.
	if err := p.decode.Send(p.decodePeer, ack(1)); err != nil {
		t.Fatal(err)
	}
	if err := p.prefill.Send(p.prefillPeer, ack(2)); err != nil {
		t.Fatal(err)
	}
	p.prefillH.waitMsgs(t, p.prefillPeer, 1)
	p.decodeH.waitMsgs(t, p.decodePeer, 1)
	return p
}

// checkSilentLoss checks that both sides lost the connection for silence
// soon after from.
func (p *kvPair) checkSilentLoss(t *testing.T, from time.Time) {
	t.Helper()
	silence := p.interval * time.Duration(p.misses)
	// Scheduling slack on a loaded machine (-race); the bound itself is
	// interval × misses.
	const slack = 500 * time.Millisecond
	for _, side := range []struct {
		name string
		h    *handler
		peer kvxfer.PeerID
	}{{"decode", p.decodeH, p.decodePeer}, {"prefill", p.prefillH, p.prefillPeer}} {
		lost := side.h.waitLost(t, side.peer)
		if !errors.Is(lost.err, tcp.ErrSilent) {
			t.Errorf("%s PeerLost err = %v, want tcp.ErrSilent", side.name, lost.err)
		}
		if d := lost.at.Sub(from); d > silence+slack {
			t.Errorf("%s lost the peer %v after the freeze, want within %v (+ slack)", side.name, d, silence)
		}
	}
}

// TestNetFreezeLosesPeer: a connection frozen on the decode side is
// declared dead by both sides within interval × misses.
func TestNetFreezeLosesPeer(t *testing.T) {
	p := newKVPair(t, 20*time.Millisecond, 5, NetConfig{Seed: 1})
	frozeAt := time.Now()
	if n := p.net.FreezeAll(time.Hour); n != 1 {
		t.Fatalf("FreezeAll froze %d connections, want 1 (lost before: decode %d, prefill %d calls)",
			n, p.decodeH.lostCalls(p.decodePeer), p.prefillH.lostCalls(p.prefillPeer))
	}
	p.checkSilentLoss(t, frozeAt)
	// Decode closed the connection, but its socket waits for the thaw.
	if n := p.net.Open(); n != 1 {
		t.Errorf("%d sockets open after PeerLost, want the frozen one", n)
	}
	p.net.ThawAll()
	if n := p.net.Open(); n != 0 {
		t.Errorf("%d sockets open after the thaw, want 0", n)
	}
	if got := p.net.Injected(); got["freeze"] != 1 || got["reset"] != 0 {
		t.Errorf("Injected %v, want one freeze", got)
	}
}

// TestNetRandomFreeze: a seeded freeze strikes within Within of the dial
// (perhaps during the handshake); both sides fail for silence.
func TestNetRandomFreeze(t *testing.T) {
	const within = 30 * time.Millisecond
	dialed := time.Now()
	p := startKVPair(t, 20*time.Millisecond, 5, NetConfig{Seed: 4, Freeze: 1, FreezeFor: time.Hour, Within: within})
	// Frozen during the handshake, decode's HELLO write times out
	// (os.ErrDeadlineExceeded); after it, decode hears nothing (ErrSilent).
	p.checkRandomLoss(t, dialed.Add(within), tcp.ErrSilent, os.ErrDeadlineExceeded)
	if got := p.net.Injected()["freeze"]; got != 1 {
		t.Errorf("Injected freeze = %d, want 1", got)
	}
}

// checkRandomLoss checks that both sides lost the connection soon after
// by, decode with an error wrapping want.
func (p *kvPair) checkRandomLoss(t *testing.T, by time.Time, want ...error) {
	t.Helper()
	const slack = 500 * time.Millisecond
	silence := p.interval * time.Duration(p.misses)
	lost := p.decodeH.waitLost(t, p.decodePeer)
	if !slices.ContainsFunc(want, func(w error) bool { return errors.Is(lost.err, w) }) {
		t.Errorf("decode PeerLost err = %v, want one of %v", lost.err, want)
	}
	if d := lost.at.Sub(by); d > silence+slack {
		t.Errorf("decode lost the peer %v after the fault's latest time, want within %v (+ slack)", d, silence)
	}
	lost = p.prefillH.waitAnyLost(t)
	if d := lost.at.Sub(by); d > silence+slack {
		t.Errorf("prefill lost the peer %v after the fault's latest time, want within %v (+ slack)", d, silence)
	}
}

// TestNetThaw: a freeze shorter than the silence bound delays frames but
// loses no peer.
func TestNetThaw(t *testing.T) {
	p := newKVPair(t, 20*time.Millisecond, 100, NetConfig{Seed: 1}) // silence 2s
	p.net.FreezeAll(time.Hour)
	if err := p.decode.Send(p.decodePeer, ack(3)); err != nil {
		t.Fatal(err)
	}
	if err := p.prefill.Send(p.prefillPeer, ack(4)); err != nil {
		t.Fatal(err)
	}
	p.net.ThawAll()
	if got := p.prefillH.waitMsgs(t, p.prefillPeer, 2)[1]; got != kvxfer.Message(ack(3)) {
		t.Errorf("prefill got %v after the thaw, want ack 3", got)
	}
	if got := p.decodeH.waitMsgs(t, p.decodePeer, 2)[1]; got != kvxfer.Message(ack(4)) {
		t.Errorf("decode got %v after the thaw, want ack 4", got)
	}
	if p.decodeH.lostCalls(p.decodePeer)+p.prefillH.lostCalls(p.prefillPeer) != 0 {
		t.Error("a peer was lost during a freeze shorter than the silence bound")
	}
}

// TestNetResetAll: a reset connection fails at once on both sides, long
// before heartbeats would notice.
func TestNetResetAll(t *testing.T) {
	p := newKVPair(t, time.Second, 60, NetConfig{Seed: 1}) // silence 1 min > waitTimeout
	if n := p.net.ResetAll(); n != 1 {
		t.Fatalf("ResetAll reset %d connections, want 1", n)
	}
	if err := p.decodeH.waitLost(t, p.decodePeer).err; !errors.Is(err, ErrReset) {
		t.Errorf("decode PeerLost err = %v, want ErrReset", err)
	}
	if err := p.prefillH.waitLost(t, p.prefillPeer).err; errors.Is(err, tcp.ErrSilent) {
		t.Errorf("prefill PeerLost err = %v, want the connection closed, not silence", err)
	}
	if got := p.net.Injected(); got["reset"] != 1 {
		t.Errorf("Injected %v, want one reset", got)
	}
	if n := p.net.ResetAll(); n != 0 {
		t.Errorf("second ResetAll reset %d connections, want 0", n)
	}
}

// TestNetRandomReset: a seeded reset strikes within Within of the dial
// (perhaps during the handshake).
func TestNetRandomReset(t *testing.T) {
	const within = 50 * time.Millisecond
	dialed := time.Now()
	p := startKVPair(t, time.Second, 60, NetConfig{Seed: 5, Reset: 1, Within: within})
	p.checkRandomLoss(t, dialed.Add(within), ErrReset)
	if got := p.net.Injected()["reset"]; got != 1 {
		t.Errorf("Injected reset = %d, want 1", got)
	}
}

// TestBackendResetOverTCP: an injected reset of the fault Backend closes
// the real connection; both sides lose the peer once.
func TestBackendResetOverTCP(t *testing.T) {
	p := newKVPair(t, time.Second, 60, NetConfig{})
	p.decode.SetConfig(Config{Seed: 2, Reset: 1})
	if err := p.decode.Send(p.decodePeer, ack(5)); err != nil {
		t.Fatal(err)
	}
	if err := p.decodeH.waitLost(t, p.decodePeer).err; !errors.Is(err, ErrReset) {
		t.Errorf("decode PeerLost err = %v, want ErrReset", err)
	}
	p.prefillH.waitLost(t, p.prefillPeer)
	p.decode.Close()
	p.prefill.Close()
	if a, b := p.decodeH.lostCalls(p.decodePeer), p.prefillH.lostCalls(p.prefillPeer); a != 1 || b != 1 {
		t.Errorf("PeerLost calls: decode %d, prefill %d; want 1 each", a, b)
	}
}

// dialLoopback returns a connection dialed through n and the accepted end.
func dialLoopback(t *testing.T, dial DialFunc) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	srv, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { srv.Close() })
	if err := srv.SetDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func TestNetConnFreeze(t *testing.T) {
	n := NewNet(NetConfig{}, nil)
	c, srv := dialLoopback(t, n.Dial)
	n.FreezeAll(time.Hour)
	if _, err := srv.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)

	// Frozen: reads and writes wait until their deadline.
	start := time.Now()
	if err := c.SetReadDeadline(start.Add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("frozen Read: %v, want a timeout", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("frozen Read returned after %v, before its deadline", d)
	}
	if err := c.SetWriteDeadline(time.Now().Add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Write([]byte("x")); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("frozen Write = %d, %v; want 0 and a timeout", n, err)
	}

	// Thawed: what arrived meanwhile is delivered.
	if err := c.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		n, err := c.Read(buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	n.ThawAll()
	if s := <-got; s != "hello" {
		t.Errorf("Read after the thaw = %q, want hello", s)
	}
	if _, err := c.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, buf[:2]); err != nil || string(buf[:2]) != "ok" {
		t.Errorf("peer read %q, %v; want ok", buf[:2], err)
	}

	// Close wakes a read waiting in a freeze.
	n.FreezeAll(time.Hour)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		errc <- err
	}()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read on a closed frozen connection: %v, want net.ErrClosed", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v, want net.ErrClosed", err)
	}
	// The peer hears nothing of the close until the freeze ends.
	if err := srv.SetReadDeadline(time.Now().Add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("peer Read during the freeze: %v, want a timeout", err)
	}
	if n.Open() != 1 {
		t.Errorf("Open = %d after Close during a freeze, want 1", n.Open())
	}
	n.ThawAll()
	if err := srv.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Read(buf); err != io.EOF {
		t.Errorf("peer Read after the thaw: %v, want io.EOF", err)
	}
	if n.Open() != 0 {
		t.Errorf("Open = %d after the thaw, want 0", n.Open())
	}
}

// TestNetFreezeEnds: a freeze ends by itself after its duration.
func TestNetFreezeEnds(t *testing.T) {
	n := NewNet(NetConfig{}, nil)
	c, srv := dialLoopback(t, n.Dial)
	start := time.Now()
	n.FreezeAll(20 * time.Millisecond)
	if _, err := c.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("Write returned %v into a 20ms freeze", d)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "late" {
		t.Errorf("peer read %q, %v", buf, err)
	}
}

func TestNetConnReset(t *testing.T) {
	n := NewNet(NetConfig{}, nil)
	c, srv := dialLoopback(t, n.Dial)
	if got := n.ResetAll(); got != 1 {
		t.Fatalf("ResetAll = %d, want 1", got)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Errorf("Read after a reset: %v, want ErrReset", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrReset) {
		t.Errorf("Write after a reset: %v, want ErrReset", err)
	}
	if _, err := srv.Read(make([]byte, 1)); err == nil {
		t.Error("the peer of a reset connection read without error")
	}
	if n.Open() != 0 {
		t.Errorf("Open = %d after a reset, want 0", n.Open())
	}
}

// TestDialer: the plain DialFunc form wraps its connections.
func TestDialer(t *testing.T) {
	c, srv := dialLoopback(t, Dialer(NetConfig{Seed: 1}, nil))
	if _, ok := c.(*conn); !ok {
		t.Fatalf("Dialer returned a %T, want a fault connection", c)
	}
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "hi" {
		t.Errorf("peer read %q, %v", buf, err)
	}
}

func TestNetDialError(t *testing.T) {
	refused := errors.New("refused")
	n := NewNet(NetConfig{Seed: 3, Freeze: 0.5, FreezeFor: time.Second, Reset: 0.5},
		func(context.Context, string, string) (net.Conn, error) { return nil, refused })
	if _, err := n.Dial(context.Background(), "tcp", "x:1"); err != refused {
		t.Errorf("Dial err = %v, want the inner error", err)
	}
	// The failed dial drew its plan like any other.
	ref := NewNet(NetConfig{Seed: 3, Freeze: 0.5, FreezeFor: time.Second, Reset: 0.5}, nil)
	ref.mu.Lock()
	ref.planLocked()
	want := ref.planLocked()
	ref.mu.Unlock()
	n.mu.Lock()
	got := n.planLocked()
	n.mu.Unlock()
	if got != want {
		t.Errorf("plan after a failed dial %+v, want the second plan of the seed %+v", got, want)
	}
}

func TestNetPlanDeterministic(t *testing.T) {
	cfg := NetConfig{Seed: 11, Freeze: 0.3, FreezeFor: time.Second, Reset: 0.2, Within: time.Second}
	plans := func(cfg NetConfig) []netPlan {
		n := NewNet(cfg, nil)
		n.mu.Lock()
		defer n.mu.Unlock()
		out := make([]netPlan, 4000)
		for i := range out {
			out[i] = n.planLocked()
		}
		return out
	}
	a, b := plans(cfg), plans(cfg)
	freezes, resets := 0, 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("plan %d differs for the same seed: %+v vs %+v", i, a[i], b[i])
		}
		if a[i].freeze {
			freezes++
		}
		if a[i].reset {
			resets++
		}
		if a[i].freezeAt < 0 || a[i].freezeAt >= time.Second || a[i].resetAt < 0 || a[i].resetAt >= time.Second {
			t.Fatalf("plan %d strikes outside [0, Within): %+v", i, a[i])
		}
	}
	if r := float64(freezes) / 4000; math.Abs(r-0.3) > 0.03 {
		t.Errorf("freeze rate %.3f, want about 0.3", r)
	}
	if r := float64(resets) / 4000; math.Abs(r-0.2) > 0.03 {
		t.Errorf("reset rate %.3f, want about 0.2", r)
	}
	cfg.Seed = 12
	c := plans(cfg)
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Error("seeds 11 and 12 planned the same faults")
	}
}

// TestNetSetConfigCalms: SetConfig cancels faults not yet struck and ends
// freezes.
func TestNetSetConfigCalms(t *testing.T) {
	n := NewNet(NetConfig{Seed: 1, Reset: 1, Within: time.Hour}, nil)
	c, _ := dialLoopback(t, n.Dial)
	n.FreezeAll(time.Hour)
	n.SetConfig(NetConfig{})
	if _, err := c.Write([]byte("x")); err != nil {
		t.Errorf("Write after SetConfig(NetConfig{}): %v", err)
	}
	nc := c.(*conn)
	nc.mu.Lock()
	scheduled := len(nc.scheduled)
	nc.mu.Unlock()
	if scheduled != 0 {
		t.Errorf("%d faults still scheduled after SetConfig(NetConfig{})", scheduled)
	}
}

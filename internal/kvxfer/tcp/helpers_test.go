package tcp

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// waitTimeout bounds every wait in these tests; they normally finish in
// milliseconds, so it only matters when something is broken.
const waitTimeout = 10 * time.Second

var testFP = kvxfer.Fingerprint{Model: "sim-tiny", Digest: "sim:1", Layers: 2, KVHeads: 2, HeadDim: 8,
	DType: "f32", PageSize: 16}

type eventKind int

const (
	evUp eventKind = iota
	evMsg
	evLost
)

func (k eventKind) String() string { return [...]string{"up", "msg", "lost"}[k] }

type event struct {
	kind   eventKind
	peer   kvxfer.PeerID
	remote string
	msg    kvxfer.Message
	err    error
	at     time.Time
}

// recorder is a Handler that records every call and lets tests wait for one.
type recorder struct {
	mu      sync.Mutex
	events  []event
	changed chan struct{} // closed and replaced on every event
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) add(e event) {
	e.at = time.Now()
	r.mu.Lock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) PeerUp(p kvxfer.PeerID, remote string) {
	r.add(event{kind: evUp, peer: p, remote: remote})
}
func (r *recorder) HandleMessage(p kvxfer.PeerID, m kvxfer.Message) {
	r.add(event{kind: evMsg, peer: p, msg: m})
}
func (r *recorder) PeerLost(p kvxfer.PeerID, err error) {
	r.add(event{kind: evLost, peer: p, err: err})
}

// waitUntil waits up to waitTimeout until done, called with every event
// recorded so far, returns true.
func (r *recorder) waitUntil(t testing.TB, what string, done func([]event) bool) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok := done(r.events)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %s; events: %v", waitTimeout, what, r.snapshot())
		}
	}
}

// waitFor returns the first recorded event satisfying match, waiting up to
// waitTimeout for it.
func (r *recorder) waitFor(t testing.TB, what string, match func(event) bool) event {
	t.Helper()
	var found event
	r.waitUntil(t, what, func(evs []event) bool {
		for _, e := range evs {
			if match(e) {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

func (r *recorder) waitKind(t testing.TB, k eventKind, p kvxfer.PeerID) event {
	t.Helper()
	return r.waitFor(t, fmt.Sprintf("%s of peer %d", k, p), func(e event) bool { return e.kind == k && e.peer == p })
}

// waitAny returns the first event of kind k for any peer.
func (r *recorder) waitAny(t testing.TB, k eventKind) event {
	t.Helper()
	return r.waitFor(t, "any "+k.String(), func(e event) bool { return e.kind == k })
}

// waitMessages waits until peer p delivered n messages and returns them.
func (r *recorder) waitMessages(t testing.TB, p kvxfer.PeerID, n int) []kvxfer.Message {
	t.Helper()
	r.waitUntil(t, fmt.Sprintf("%d messages of peer %d", n, p), func(evs []event) bool {
		count := 0
		for _, e := range evs {
			if e.kind == evMsg && e.peer == p {
				count++
			}
		}
		return count >= n
	})
	return r.messages(p)
}

func (r *recorder) messages(p kvxfer.PeerID) []kvxfer.Message {
	var out []kvxfer.Message
	for _, e := range r.snapshot() {
		if e.kind == evMsg && e.peer == p {
			out = append(out, e.msg)
		}
	}
	return out
}

func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

// checkContract checks the Handler contract over everything recorded: per
// peer at most one PeerUp, first; exactly one PeerLost, last.
func (r *recorder) checkContract(t testing.TB) {
	t.Helper()
	byPeer := map[kvxfer.PeerID][]event{}
	for _, e := range r.snapshot() {
		byPeer[e.peer] = append(byPeer[e.peer], e)
	}
	for p, evs := range byPeer {
		ups, losts := 0, 0
		for i, e := range evs {
			switch e.kind {
			case evUp:
				ups++
				if i != 0 {
					t.Errorf("peer %d: PeerUp is event %d, want the first", p, i)
				}
			case evLost:
				losts++
				if i != len(evs)-1 {
					t.Errorf("peer %d: PeerLost is event %d of %d, want the last", p, i, len(evs))
				}
			case evMsg:
				if ups == 0 {
					t.Errorf("peer %d: message before PeerUp", p)
				}
			}
		}
		if ups > 1 || losts != 1 {
			t.Errorf("peer %d: %d PeerUp and %d PeerLost calls, want ≤ 1 and exactly 1", p, ups, losts)
		}
	}
}

// newBackend returns a Backend with the test fingerprint and a recorder. At
// cleanup it closes the Backend and checks the Handler contract.
func newBackend(t testing.TB, tweak func(*Config)) (*Backend, *recorder) {
	t.Helper()
	r := newRecorder()
	cfg := Config{Fingerprint: testFP, Handler: r}
	if tweak != nil {
		tweak(&cfg)
	}
	b := New(cfg)
	t.Cleanup(func() {
		b.Close()
		r.checkContract(t)
	})
	return b, r
}

// listen starts b listening on a loopback port.
func listen(t testing.TB, b *Backend) string {
	t.Helper()
	addr, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// pair returns a connected prefill (listening) and decode (connecting)
// Backend with the PeerID of the connection on each side.
type pairT struct {
	prefill, decode       *Backend
	prefillRec, decodeRec *recorder
	prefillPeer           kvxfer.PeerID // the decode worker, as prefill sees it
	decodePeer            kvxfer.PeerID // the prefill worker, as decode sees it
	addr                  string
}

func newPair(t testing.TB, tweak func(*Config)) *pairT {
	t.Helper()
	p := &pairT{}
	p.prefill, p.prefillRec = newBackend(t, tweak)
	p.decode, p.decodeRec = newBackend(t, tweak)
	p.addr = listen(t, p.prefill)
	p.decodePeer = p.decode.Connect(p.addr)
	p.decodeRec.waitKind(t, evUp, p.decodePeer)
	p.prefillPeer = p.prefillRec.waitAny(t, evUp).peer
	return p
}

// rawPeer is a TCP connection the test drives frame by frame.
type rawPeer struct {
	t  testing.TB
	nc net.Conn
	fr *kvxfer.FrameReader
}

func newRawPeer(t testing.TB, nc net.Conn) *rawPeer {
	t.Helper()
	if err := nc.SetDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawPeer{t: t, nc: nc, fr: kvxfer.NewFrameReader(nc)}
}

func (p *rawPeer) write(m kvxfer.Message) {
	p.t.Helper()
	if err := kvxfer.WriteFrame(p.nc, m); err != nil {
		p.t.Fatalf("raw peer writing %s: %v", m.Type(), err)
	}
}

func (p *rawPeer) writeRaw(b []byte) {
	p.t.Helper()
	if _, err := p.nc.Write(b); err != nil {
		p.t.Fatalf("raw peer writing: %v", err)
	}
}

func (p *rawPeer) read() kvxfer.Message {
	p.t.Helper()
	m, _, err := p.fr.ReadFrame(DefaultMaxFrameBytes)
	if err != nil {
		p.t.Fatalf("raw peer reading: %v", err)
	}
	return m
}

// readRoom reads frames, skipping PINGs, and returns the next other one.
func (p *rawPeer) readRoom() kvxfer.Message {
	p.t.Helper()
	for {
		if m := p.read(); m.Type() != kvxfer.TypePing {
			return m
		}
	}
}

// rawListener accepts connections the test drives itself.
func rawListener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func accept(t testing.TB, ln net.Listener) *rawPeer {
	t.Helper()
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	nc, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return newRawPeer(t, nc)
}

func dialRaw(t testing.TB, addr string) *rawPeer {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return newRawPeer(t, nc)
}

// acceptHandshake accepts a connection from a Backend and completes its
// handshake.
func acceptHandshake(t testing.TB, ln net.Listener) *rawPeer {
	t.Helper()
	p := accept(t, ln)
	if m := p.read(); m.Type() != kvxfer.TypeHello {
		t.Fatalf("first frame %s, want HELLO", m.Type())
	}
	p.write(kvxfer.HelloOK{})
	return p
}

// dialHandshake connects to a listening Backend and completes a handshake.
func dialHandshake(t testing.TB, addr string) *rawPeer {
	t.Helper()
	p := dialRaw(t, addr)
	p.write(kvxfer.Hello{Version: kvxfer.ProtocolVersion, Fingerprint: testFP})
	if m := p.read(); m.Type() != kvxfer.TypeHelloOK {
		t.Fatalf("handshake answer %#v, want HELLO_OK", m)
	}
	return p
}

func roomGen(i int) kvxfer.RoomGen {
	var r kvxfer.Room
	r[0], r[1], r[15] = byte(i), byte(i>>8), 0xee
	return kvxfer.RoomGen{Room: r, Gen: uint32(i % 3)}
}

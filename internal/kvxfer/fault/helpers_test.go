package fault

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// waitTimeout bounds every wait in these tests; they normally finish in
// milliseconds (or at once, in a synctest bubble), so it only matters when
// something is broken.
const waitTimeout = 10 * time.Second

// sent is one call of fakeInner.Send.
type sent struct {
	peer kvxfer.PeerID
	m    kvxfer.Message
	at   time.Time
}

type closeCall struct {
	peer kvxfer.PeerID
	err  error
}

// fakeInner is an inner Backend that records what it is asked to do.
type fakeInner struct {
	mu      sync.Mutex
	sends   []sent
	closes  []closeCall
	closed  int
	changed chan struct{} // closed and replaced on every recorded call
	sendErr error         // returned by Send
}

var (
	_ kvxfer.Backend     = (*fakeInner)(nil)
	_ kvxfer.PeerCloser  = (*fakeInner)(nil)
	_ kvxfer.DropCounter = (*fakeInner)(nil)
)

func newFakeInner() *fakeInner { return &fakeInner{changed: make(chan struct{})} }

func (f *fakeInner) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeInner) Listen(addr string) (string, error) { return "bound:" + addr, nil }
func (f *fakeInner) Connect(addr string) kvxfer.PeerID  { return kvxfer.PeerID(len(addr)) }
func (f *fakeInner) Remote(peer kvxfer.PeerID) string   { return fmt.Sprintf("remote-%d", peer) }

func (f *fakeInner) Send(peer kvxfer.PeerID, m kvxfer.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends = append(f.sends, sent{peer: peer, m: m, at: time.Now()})
	f.notifyLocked()
	return f.sendErr
}

func (f *fakeInner) ClosePeer(peer kvxfer.PeerID, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes = append(f.closes, closeCall{peer, err})
	f.notifyLocked()
}

func (f *fakeInner) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

func (f *fakeInner) DroppedFrames() map[string]uint64 {
	return map[string]uint64{"malformed": 3, "injected_drop": 1}
}

func (f *fakeInner) snapshot() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sent(nil), f.sends...)
}

func (f *fakeInner) closeCalls() []closeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]closeCall(nil), f.closes...)
}

// waitSends waits until at least n sends were recorded and returns them.
func (f *fakeInner) waitSends(t testing.TB, n int) []sent {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		f.mu.Lock()
		got, ch := len(f.sends), f.changed
		f.mu.Unlock()
		if got >= n {
			return f.snapshot()
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %d sends; have %d", n, got)
		}
	}
}

// ack returns a KVAck whose Gen numbers it, to follow frames through.
func ack(i int) kvxfer.KVAck { return kvxfer.KVAck{RoomGen: kvxfer.RoomGen{Gen: uint32(i)}} }

// acks returns the Gen of each recorded KVAck, in order.
func acks(t testing.TB, ss []sent) []int {
	t.Helper()
	out := make([]int, 0, len(ss))
	for _, s := range ss {
		a, ok := s.m.(kvxfer.KVAck)
		if !ok {
			t.Fatalf("recorded %T, want KVAck", s.m)
		}
		out = append(out, int(a.Gen))
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

var errInner = errors.New("inner refused")

package cluster

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// accepted accepts what ln has queued now and closes it: the number of
// connections.
func accepted(t *testing.T, ln net.Listener) int {
	t.Helper()
	tl := ln.(*net.TCPListener)
	n := 0
	for {
		// Connections dialed before are queued already: the handshake is
		// the kernel's.
		if err := tl.SetDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		c, err := tl.Accept()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		n++
	}
}

func dialN(t *testing.T, addr string, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		defer c.Close()
	}
}

// TestTakeOverPort: a listener that takes over a port shared with
// SO_REUSEPORT gets every new connection at once while the first still
// listens (so the first closes with nothing queued), and keeps the port
// alone once the first has closed; a listener without SO_REUSEPORT cannot
// bind it.
func TestTakeOverPort(t *testing.T) {
	old, err := listenReusePort("127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	addr := old.Addr().String()
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatal("a listener without SO_REUSEPORT bound the router's port")
	}
	dialN(t, addr, 4)
	if n := accepted(t, old); n != 4 {
		t.Fatalf("the only listener accepted %d of 4 connections", n)
	}
	repl, err := listenReusePort(addr, true)
	if err != nil {
		t.Fatalf("replacement on %s: %v", addr, err)
	}
	defer repl.Close()
	dialN(t, addr, 32)
	if o, r := accepted(t, old), accepted(t, repl); o != 0 || r != 32 {
		t.Fatalf("of 32 connections, the old listener got %d, the replacement %d; want 0 and 32", o, r)
	}
	old.Close()
	dialN(t, addr, 8)
	if n := accepted(t, repl); n != 8 {
		t.Fatalf("alone on the port, the replacement accepted %d of 8 connections", n)
	}
	// Its own replacement takes the port over from it the same way.
	next, err := listenReusePort(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	dialN(t, addr, 16)
	if o, r := accepted(t, repl), accepted(t, next); o != 0 || r != 16 {
		t.Fatalf("of 16 connections, the old listener got %d, the next replacement %d; want 0 and 16", o, r)
	}
}

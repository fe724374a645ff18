package cluster

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenReusePort listens on addr with SO_REUSEPORT: another process of
// the same user may listen on the same port (a router's replacement).
//
// With takeOver, the listener is another's replacement: it attaches to the
// port's group a classic BPF program that gives every new connection to
// the group's second socket — this one, beside the router it replaces —
// so that the old router's accept queue empties and its listener closes
// with nothing queued (a connection still queued on a closing listener is
// reset). Once the old router has left, this listener is the group's only
// socket and the program's choice falls back to the kernel's hash, so it
// takes everything, and its own replacement's program will do the same.
// A failed attach returns the listener with the error: the port is then
// shared by hash until the old router closes its listener.
func listenReusePort(addr string, takeOver bool) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	// A multipath TCP socket (Go's default for listeners where the kernel
	// has it) takes no BPF program; the router's clients speak plain TCP.
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil || !takeOver {
		return ln, err
	}
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return ln, fmt.Errorf("taking the port over: %w", err)
	}
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 1}}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
	}); err != nil {
		serr = err
	}
	if serr != nil {
		return ln, fmt.Errorf("taking the port over (SO_ATTACH_REUSEPORT_CBPF): %w", serr)
	}
	return ln, nil
}

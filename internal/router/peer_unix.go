//go:build unix

package router

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// closedByPeer reports, without reading or blocking, whether the idle
// connection c was closed (or reset) by its peer or was sent a byte: a
// worker sends nothing on a connection with no request, so either way the
// connection is done. It peeks at the socket (MSG_PEEK), so a connection
// that is not done loses nothing.
func closedByPeer(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // a close_notify alert or a FIN: bytes or EOF either way
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	done := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// No error: a byte, or 0 bytes at the peer's FIN.
		done = err == nil || !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR)
		return true // never wait for the socket to become readable
	})
	return done || err != nil
}

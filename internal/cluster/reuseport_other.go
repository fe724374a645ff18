//go:build !linux

package cluster

import "net"

// listenReusePort listens on addr: sharing a port with SO_REUSEPORT is
// Linux's, so elsewhere a replacement waits for the port.
func listenReusePort(addr string, _ bool) (net.Listener, error) { return net.Listen("tcp", addr) }

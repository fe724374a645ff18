//go:build !unix

package router

import "net"

// closedByPeer: without a way to peek at a socket, an idle connection
// closed by its peer is found when it is next used, or closed by the idle
// timeout.
func closedByPeer(net.Conn) bool { return false }

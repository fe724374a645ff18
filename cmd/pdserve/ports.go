package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// fixedPort is a port a command binds, and what binds it (for messages).
type fixedPort struct {
	port int
	what string
}

// upPorts lists the fixed ports of `pdserve up`: the router's --port and,
// with --worker-port-base, worker k's port base+k (prefill, then decode, or
// colocated) and prefill worker i's KV channel on base+64+i. Port 0 (a free
// one) is left out.
func upPorts(routerPort, base, nPrefill, nDecode, nServe int) []fixedPort {
	var ps []fixedPort
	if routerPort != 0 {
		ps = append(ps, fixedPort{routerPort, "the router's --port"})
	}
	if base == 0 {
		return ps
	}
	k := 0
	worker := func(role string, n int) {
		for i := range n {
			ps = append(ps, fixedPort{base + k, fmt.Sprintf("%s worker %d, --worker-port-base + %d", role, i, k)})
			k++
		}
	}
	if nServe > 0 {
		worker("colocated", nServe)
		return ps
	}
	worker("prefill", nPrefill)
	worker("decode", nDecode)
	for i := range nPrefill {
		ps = append(ps, fixedPort{base + 64 + i, fmt.Sprintf("prefill worker %d's KV channel, --worker-port-base + %d", i, 64+i)})
	}
	return ps
}

// checkPortsFree refuses ports given twice (a usage error) and then tries
// each port on host: a port already taken fails the command before anything
// starts, with an error naming every such port and what needs it. (Another
// process may still take a port between the check and the start; the start
// then fails as before.)
func checkPortsFree(host string, ports []fixedPort) error {
	seen := map[int]string{}
	for _, p := range ports {
		if what, ok := seen[p.port]; ok {
			return usagef("port %d is both %s and %s: choose another --port or --worker-port-base", p.port, what, p.what)
		}
		seen[p.port] = p.what
	}
	var errs []error
	for _, p := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p.port)))
		if err == nil {
			_ = ln.Close()
			continue
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			err = fmt.Errorf("port %d (%s) is already in use: stop the server listening there or choose another port (%w)", p.port, p.what, err)
		} else {
			err = fmt.Errorf("port %d (%s): %w", p.port, p.what, err)
		}
		errs = append(errs, err)
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w; nothing was started", errs[0])
	}
	return fmt.Errorf("%w\nnothing was started", errors.Join(errs...))
}

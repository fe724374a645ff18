package fleet_test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// sockets lists the TCP sockets process pid holds to remote port port, by
// state ("01" ESTABLISHED, "08" CLOSE_WAIT, ...), from /proc.
func sockets(t *testing.T, pid, port int) map[string]int {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	out := map[string]int{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			i := strings.LastIndexByte(fs[2], ':')
			if p, err := strconv.ParseInt(fs[2][i+1:], 16, 32); err == nil && int(p) == port {
				out[fs[3]]++
			}
		}
		f.Close()
	}
	return out
}

// TestDepartedWorkerConnectionsClosed: a decode worker of an etcd fleet
// that served a load stops (SIGTERM: it leaves the registry, drains and
// exits, closing its side of the router's pooled connections); the router
// closes its side within seconds, instead of holding each in CLOSE-WAIT
// until its 90 s idle timeout.
func TestDepartedWorkerConnectionsClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("needs Linux's /proc/net/tcp")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint(), "--registry-ttl", "3s"}
	p1 := ps.worker("p1", "prefill", reg...)
	d1, d2 := ps.worker("d1", "decode", reg...), ps.worker("d2", "decode", reg...)
	for _, n := range []*node{p1, d1, d2} {
		ps.start(n)
	}
	r := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint())
	ps.start(r)
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	waitWorkers(t, hc, r.url(), 30*time.Second, readyNames(p1, d1, d2)...)
	l := startLoad(r.url(), 8)
	waitResults(t, l, time.Time{}, 16)
	if fails := failures(l.end()); len(fails) > 0 {
		t.Fatalf("the load failed: %v", fails)
	}
	if s := sockets(t, r.p.Pid(), d2.port); s["01"] == 0 {
		t.Fatalf("the router holds no connection to d2: %v", s)
	}
	ps.stop(d2)
	waitWorkers(t, hc, r.url(), 30*time.Second, readyNames(p1, d1)...)
	if state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		s := sockets(t, r.p.Pid(), d2.port)
		return len(s) == 0, fmt.Sprint(s)
	}); !ok {
		t.Fatalf("10 s after d2 exited the router still holds connections to it, by state (08: CLOSE-WAIT): %s", state)
	}
}

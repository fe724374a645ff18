package etcd

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/pdserve/pdserve/internal/kvxfer/fault"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// logRecords keeps the level and message of every record logged through it.
type logRecords struct {
	mu   sync.Mutex
	recs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Level.String()+" "+r.Message)
	return nil
}

// count returns how many records at level start with msg.
func (l *logRecords) count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if strings.HasPrefix(r, level.String()+" "+msg) {
			n++
		}
	}
	return n
}

func (l *logRecords) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.recs...)
}

// healthVerify is the VerifyInterval of the health tests; healthBound is
// how soon they want the registry's health to follow etcd (the check's
// period plus its timeout is 2 × healthVerify; the rest is slack for a
// loaded machine).
const (
	healthVerify = 200 * time.Millisecond
	healthBound  = 3 * time.Second
)

// waitHealth waits up to healthBound for r's health to be up (or down),
// and returns it.
func waitHealth(t *testing.T, r *Registry, up bool, what string) registry.Health {
	t.Helper()
	var h registry.Health
	if state, ok := testbin.WaitUntil(healthBound, func() (bool, string) {
		h = r.Health()
		msg, _ := r.LastError()
		return h.Up == up, "up=" + map[bool]string{true: "true", false: "false"}[h.Up] + " last error: " + msg
	}); !ok {
		t.Fatalf("%s: not up=%v within %s: %s", what, up, healthBound, state)
	}
	return h
}

// TestHealthFollowsEtcdStopAndRestart: a router's etcd registry says etcd
// is gone within two verify intervals of it stopping (with the error, a
// warning logged once however long the outage, its last answer's time
// kept), keeps the snapshot it has, and says etcd is back (an info line)
// once a new etcd answers on the same endpoint.
func TestHealthFollowsEtcdStopAndRestart(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	logs := &logRecords{}
	cfg.Logger, cfg.VerifyInterval = slog.New(logs), healthVerify
	r := NewWithClient(cli, cfg)
	if h := r.Health(); h.Up || !h.LastOK.IsZero() {
		t.Fatalf("health before Run: %+v", h)
	}
	w := startWatcher(t, r)
	register(t, cli, cfg, record("decode-1", "decode", 30010), 10*time.Second)
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	// A quiet, healthy etcd is checked every verify interval: its last
	// answer stays recent though the fleet does not change.
	first := waitHealth(t, r, true, "etcd running")
	if state, ok := testbin.WaitUntil(healthBound, func() (bool, string) {
		h := r.Health()
		return h.Up && h.LastOK.After(first.LastOK), h.LastOK.String()
	}); !ok {
		t.Fatalf("a running etcd's last answer did not advance past %s: %s", first.LastOK, state)
	}
	_, before := w.snapshot()

	stopped := time.Now() // Stop closes the connections first, then waits
	srv.Stop()
	down := waitHealth(t, r, false, "etcd stopped")
	msg, at := r.LastError()
	if msg == "" || at.Before(stopped) {
		t.Fatalf("etcd stopped: last error %q at %s (stopped at %s)", msg, at, stopped)
	}
	if down.LastOK.After(stopped) || down.LastOK.IsZero() {
		t.Fatalf("etcd stopped at %s: last answer %s", stopped, down.LastOK)
	}
	// Let the check fail a few more times: still one warning, and the last
	// answer's time does not move.
	if state, ok := testbin.WaitUntil(healthBound, func() (bool, string) {
		_, at := r.LastError()
		return at.After(stopped.Add(4 * healthVerify)), at.String()
	}); !ok {
		t.Fatalf("the check did not keep failing: %s", state)
	}
	if n := logs.count(slog.LevelWarn, "etcd unreachable; serving the last snapshot"); n != 1 {
		t.Fatalf("%d warnings that etcd is unreachable, want 1: %v", n, logs.all())
	}
	if h := r.Health(); h.Up || !h.LastOK.Equal(down.LastOK) {
		t.Fatalf("during the outage: %+v, want down since %s", h, down.LastOK)
	}
	if s, n := w.snapshot(); n != before || ids(s) != "decode-1 decode http://127.0.0.1:30010" {
		t.Fatalf("during the outage the router got %d more snapshots: %q", n-before, ids(s))
	}

	restarted := time.Now()
	srv.Restart()
	up := waitHealth(t, r, true, "etcd restarted")
	if up.LastOK.Before(restarted) {
		t.Fatalf("etcd restarted at %s: last answer %s", restarted, up.LastOK)
	}
	if n := logs.count(slog.LevelInfo, "etcd reachable again"); n != 1 {
		t.Fatalf("%d info lines that etcd is back, want 1: %v", n, logs.all())
	}
	if n := logs.count(slog.LevelWarn, "etcd unreachable"); n != 1 {
		t.Fatalf("%d warnings that etcd is unreachable, want 1: %v", n, logs.all())
	}
}

// TestHealthNoticesFrozenEtcd: an etcd that stops answering without closing
// its connections (a frozen process, a stuck host) does not end the
// router's watch, so only the active check can notice: the registry says
// etcd is down within two verify intervals, and up once it answers again.
func TestHealthNoticesFrozenEtcd(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	var d net.Dialer
	fnet := fault.NewNet(fault.NetConfig{}, d.DialContext)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second,
		Logger: zap.NewNop(), DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return fnet.Dial(ctx, "tcp", addr)
		})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fnet.ThawAll()
		cli.Close()
	})
	logs := &logRecords{}
	r := NewWithClient(cli, Config{Endpoints: []string{srv.Endpoint()}, Logger: slog.New(logs), VerifyInterval: healthVerify})
	w := startWatcher(t, r)
	if _, err := cli.Put(context.Background(), workersPrefix(DefaultPrefix)+"decode-1",
		`{"id":"decode-1","role":"decode","url":"http://127.0.0.1:30010","model":"m"}`); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	waitHealth(t, r, true, "etcd answering")
	_, before := w.snapshot()

	// Frozen: the connections open say nothing, and so do those dialed
	// from now on (a stopped process's kernel still accepts them).
	fnet.SetConfig(fault.NetConfig{Freeze: 1, FreezeFor: time.Hour, Within: time.Millisecond})
	if n := fnet.FreezeAll(time.Hour); n == 0 {
		t.Fatal("no connection to freeze")
	}
	frozen := time.Now()
	h := waitHealth(t, r, false, "etcd frozen")
	if msg, at := r.LastError(); msg == "" || at.Before(frozen) || h.LastOK.After(frozen) {
		t.Fatalf("etcd frozen at %s: last error %q at %s, last answer %s", frozen, msg, at, h.LastOK)
	}
	if n := logs.count(slog.LevelWarn, "etcd unreachable; serving the last snapshot"); n != 1 {
		t.Fatalf("%d warnings that etcd is unreachable, want 1: %v", n, logs.all())
	}
	if s, n := w.snapshot(); n != before || ids(s) != "decode-1 decode http://127.0.0.1:30010" {
		t.Fatalf("while etcd is frozen the router got %d more snapshots: %q", n-before, ids(s))
	}

	fnet.SetConfig(fault.NetConfig{})
	fnet.ThawAll()
	waitHealth(t, r, true, "etcd thawed")
	if n := logs.count(slog.LevelInfo, "etcd reachable again"); n != 1 {
		t.Fatalf("%d info lines that etcd is back, want 1: %v", n, logs.all())
	}
}

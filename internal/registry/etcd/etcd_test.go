package etcd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// watcher runs a Registry and keeps its last snapshot.
type watcher struct {
	mu    sync.Mutex
	last  registry.Snapshot
	count int
	stop  context.CancelFunc
	done  chan error
}

func startWatcher(t *testing.T, r *Registry) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{stop: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- r.Run(ctx, func(s registry.Snapshot) {
			w.mu.Lock()
			w.last, w.count = s, w.count+1
			w.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != context.Canceled {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	return w
}

func (w *watcher) snapshot() (registry.Snapshot, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.count
}

// ids lists the snapshot's usable entries as "id role url".
func ids(s registry.Snapshot) string {
	var out []string
	for _, e := range s.Entries {
		if e.Invalid != "" {
			out = append(out, e.ID+" invalid")
			continue
		}
		out = append(out, e.ID+" "+e.Role+" "+e.URL)
	}
	return strings.Join(out, ", ")
}

func (w *watcher) waitFor(t *testing.T, want string) {
	t.Helper()
	state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		s, _ := w.snapshot()
		got := ids(s)
		return got == want, got
	})
	if !ok {
		t.Fatalf("snapshot %q, want %q", state, want)
	}
}

func newClient(t *testing.T, srv *etcdtest.Server) (*clientv3.Client, Config) {
	t.Helper()
	cli, cfg, err := Client(Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, cfg
}

func record(id, role string, port int) Record {
	r := Record{ID: id, Role: role, URL: fmt.Sprintf("http://127.0.0.1:%d", port), Model: "m",
		Fingerprint: &kvxfer.Fingerprint{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "f32", PageSize: 16}}
	if role == registry.RolePrefill {
		r.KVAddr = fmt.Sprintf("127.0.0.1:%d", port+1)
	}
	return r
}

func register(t *testing.T, cli *clientv3.Client, cfg Config, rec Record, ttl time.Duration) *Registration {
	t.Helper()
	g, err := Register(cli, cfg, rec, ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Deregister(ctx)
	})
	return g
}

// TestRegisterWatchDeregister: workers appear when they register, carry
// their record, and leave at once when they deregister.
func TestRegisterWatchDeregister(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	w := startWatcher(t, NewWithClient(cli, cfg))
	w.waitFor(t, "")
	p := register(t, cli, cfg, record("prefill-1", "prefill", 30000), 10*time.Second)
	d := register(t, cli, cfg, record("decode-1", "decode", 30010), 10*time.Second)
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010, prefill-1 prefill http://127.0.0.1:30000")
	s, _ := w.snapshot()
	if e := s.Entries[1]; e.KVAddr != "127.0.0.1:30001" || e.Model != "m" || e.Fingerprint == nil ||
		e.Fingerprint.PageSize != 16 || e.Source != "etcd" {
		t.Fatalf("prefill entry %+v", e)
	}
	// The watcher can see the record before Register's goroutine, whose
	// put wrote it, records the status.
	if state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, n, _ := p.Status()
		return st == "registered" && n == 1, fmt.Sprintf("status %s after %d registrations", st, n)
	}); !ok {
		t.Fatal(state)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "prefill-1 prefill http://127.0.0.1:30000")
	if err := d.Deregister(ctx); err != nil {
		t.Fatalf("second Deregister: %v", err)
	}
}

// TestGarbageIsListedInvalid: a value that is not a valid record is listed
// with the reason and is never a usable worker.
func TestGarbageIsListedInvalid(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	ctx := context.Background()
	for key, val := range map[string]string{
		"junk":     "not json",
		"badrole":  `{"id":"badrole","role":"router","url":"http://127.0.0.1:1"}`,
		"badurl":   `{"id":"badurl","role":"decode","url":"ftp://x"}`,
		"wrongid":  `{"id":"other","role":"decode","url":"http://127.0.0.1:1"}`,
		"toolarge": `{"id":"toolarge","role":"decode","url":"http://127.0.0.1:1","model":"` + strings.Repeat("x", MaxValueBytes) + `"}`,
	} {
		if _, err := cli.Put(ctx, workersPrefix(cfg.Prefix)+key, val); err != nil {
			t.Fatal(err)
		}
	}
	w := startWatcher(t, NewWithClient(cli, cfg))
	w.waitFor(t, "badrole invalid, badurl invalid, junk invalid, toolarge invalid, wrongid invalid")
	s, _ := w.snapshot()
	for _, e := range s.Entries {
		if e.Invalid == "" {
			t.Errorf("%s: no reason", e.ID)
		}
		t.Logf("%s: %s", e.ID, e.Invalid)
	}
}

// TestOutageKeepsSnapshotAndReregisters: while etcd is down the router hears
// nothing (it keeps its last snapshot); when etcd is back every worker is
// registered and the router has re-listed.
func TestOutageKeepsSnapshotAndReregisters(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	w := startWatcher(t, NewWithClient(cli, cfg))
	p := register(t, cli, cfg, record("prefill-1", "prefill", 30000), 2*time.Second)
	w.waitFor(t, "prefill-1 prefill http://127.0.0.1:30000")
	_, before := w.snapshot()
	held, err := cli.Get(context.Background(), p.Key())
	if err != nil || len(held.Kvs) != 1 {
		t.Fatalf("record before the outage: %v %v", held, err)
	}
	lease := clientv3.LeaseID(held.Kvs[0].Lease)
	srv.Stop()
	// Longer than the lease: the worker notices it lost it and must
	// register again after.
	if why, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, _, err := p.Status()
		return st == "registering", st + " " + err
	}); !ok {
		t.Fatalf("the worker did not notice the outage: %s", why)
	}
	if s, n := w.snapshot(); n != before || ids(s) != "prefill-1 prefill http://127.0.0.1:30000" {
		t.Fatalf("during the outage the router got %d more snapshots: %q", n-before, ids(s))
	}
	srv.Restart()
	d := register(t, cli, cfg, record("decode-1", "decode", 30010), 2*time.Second)
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010, prefill-1 prefill http://127.0.0.1:30000")
	state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, _, err := p.Status()
		st2, _, _ := d.Status()
		return st == "registered" && st2 == "registered", st + " " + err
	})
	if !ok {
		t.Fatalf("prefill not registered again: %s", state)
	}
	// etcd restored the old lease with a fresh TTL; once that has run out
	// the record must still be there (registered again under a live lease).
	if why, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		ttl, err := cli.TimeToLive(context.Background(), lease)
		if err != nil {
			return false, err.Error()
		}
		return ttl.TTL == -1, fmt.Sprintf("old lease %x: %d s left", lease, ttl.TTL)
	}); !ok {
		t.Fatalf("the lease restored by etcd never ran out: %s", why)
	}
	if why, ok := testbin.WaitUntil(2*time.Second, func() (bool, string) {
		resp, err := cli.Get(context.Background(), p.Key())
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != lease, fmt.Sprint(resp.Kvs)
	}); !ok {
		t.Fatalf("record not under a live lease once the restored one ran out: %s", why)
	}
}

// TestLostLeaseRegistersAgain: a worker whose lease is revoked behind its
// back (expired during a partition) writes its record again.
func TestLostLeaseRegistersAgain(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	w := startWatcher(t, NewWithClient(cli, cfg))
	g := register(t, cli, cfg, record("decode-1", "decode", 30010), 5*time.Second)
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	// The record can be watched before Register has noted its lease.
	if state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, _, _ := g.Status()
		return st == "registered", st
	}); !ok {
		t.Fatalf("not registered: %s", state)
	}
	g.mu.Lock()
	lease := g.lease
	g.mu.Unlock()
	if _, err := cli.Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, n, _ := g.Status()
		return st == "registered" && n == 2, fmt.Sprintf("%s after %d", st, n)
	})
	if !ok {
		t.Fatalf("not registered again: %s", state)
	}
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
}

// TestWatchEndsOnCompaction: a compacted watch ends so that Run lists
// again.
func TestWatchEndsOnCompaction(t *testing.T) {
	t.Parallel()
	r := NewWithClient(nil, Config{Endpoints: []string{"http://127.0.0.1:1"}})
	wch := make(chan clientv3.WatchResponse, 1)
	wch <- clientv3.WatchResponse{CompactRevision: 7}
	got, _ := r.watch(context.Background(), wch, nil, 0, map[string]registry.Entry{}, "/pdserve/workers/", func(registry.Snapshot) {
		t.Fatal("no snapshot for a compacted watch")
	})
	if !strings.Contains(got, "compacted") {
		t.Fatalf("watch ended with %q", got)
	}
}

func TestRegisterRefusesBadRecords(t *testing.T) {
	t.Parallel()
	cfg := Config{Endpoints: []string{"http://127.0.0.1:1"}}
	for _, rec := range []Record{{ID: "", Role: "decode", URL: "http://a:1"}, {ID: "x", Role: "router", URL: "http://a:1"},
		{ID: "x", Role: "decode", URL: "a:1"}} {
		if _, err := Register(nil, cfg, rec, 10*time.Second); err == nil {
			t.Errorf("registered %+v", rec)
		}
	}
	if _, err := Register(nil, cfg, record("d", "decode", 1), time.Second); err == nil {
		t.Error("a 1s TTL was accepted")
	}
	for _, c := range []Config{{}, {Endpoints: []string{"127.0.0.1:2379"}}, {Endpoints: []string{"http://a:1"}, Prefix: "pdserve"}} {
		if _, err := New(c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests mostly wait on leases, watches and a stopped etcd: four run
	// at a time instead of GOMAXPROCS (unless -parallel says otherwise).
	if err := testbin.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(m)
}

// TestDeletedRecordWrittenAgain: a worker's record deleted or overwritten
// behind its back (etcdctl del, a stray write) is written again under the
// same lease, and the router sees the worker again.
func TestDeletedRecordWrittenAgain(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	w := startWatcher(t, NewWithClient(cli, cfg))
	g := register(t, cli, cfg, record("decode-1", "decode", 30010), 10*time.Second)
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	if _, err := cli.Delete(context.Background(), g.Key()); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	if _, err := cli.Put(context.Background(), g.Key(), "garbage"); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	if st, n, _ := g.Status(); st != "registered" || n != 1 {
		t.Fatalf("status %s after %d registrations, want the first one kept", st, n)
	}
}

// TestWatchFollowsEtcdRestartedEmpty: an etcd that comes back on an empty
// data directory starts its revisions over; the router's watch, resumed
// from the old revision, would hear nothing for a long time. The registry
// notices the revision going back — by a verify, or by the list after the
// watch broke on the restart — and says so, lists the empty etcd, and sees
// the records written after.
func TestWatchFollowsEtcdRestartedEmpty(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, cfg := newClient(t, srv)
	cfg.VerifyInterval = 100 * time.Millisecond
	var logs testbin.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w := startWatcher(t, NewWithClient(cli, cfg))
	put := func(rec Record) {
		t.Helper()
		b, _ := json.Marshal(rec)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, workersPrefix(cfg.Prefix)+rec.ID, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 { // a history longer than the new etcd's will be soon
		if _, err := cli.Put(context.Background(), "/elsewhere", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	put(record("decode-1", "decode", 30010))
	w.waitFor(t, "decode-1 decode http://127.0.0.1:30010")
	srv.Stop()
	srv.RestartEmpty()
	w.waitFor(t, "")
	put(record("decode-2", "decode", 30020))
	w.waitFor(t, "decode-2 decode http://127.0.0.1:30020")
	if got := logs.String(); !strings.Contains(got, "etcd lost its data") {
		t.Errorf("the registry did not say that etcd lost its data; it logged:\n%s", got)
	}
}

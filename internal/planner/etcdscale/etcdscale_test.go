package etcdscale

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/planner"
	etcdreg "github.com/pdserve/pdserve/internal/registry/etcd"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, _, err := etcdreg.Client(etcdreg.Config{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// TestWritesDesired: each decision is one JSON value at
// <prefix>planner/desired, seen by a watch on <prefix>planner/ as an
// operator's `etcdctl watch --prefix` sees it, and read back by Read.
func TestWritesDesired(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	s, err := New(Config{Client: cli, Prefix: "/fleet-a/", Router: "router-1:8000"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Flips() || s.Name() != "etcd" || s.Key() != "/fleet-a/planner/desired" {
		t.Fatalf("Flips %v, Name %q, Key %q", s.Flips(), s.Name(), s.Key())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, ok, err := Read(ctx, cli, "/fleet-a/"); ok || err != nil {
		t.Fatalf("Read before any write: ok %v, err %v", ok, err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := cli.Watch(wctx, "/fleet-a/planner/", clientv3.WithPrefix())

	at := time.Date(2026, 12, 7, 4, 30, 0, 123, time.FixedZone("x", 3600))
	for _, d := range []planner.Decision{
		{At: at, Action: planner.ActionScale, Prefill: 1, Decode: 3, DesiredPrefill: 2, DesiredDecode: 3, Reason: "scale 1P:3D → 2P:3D"},
		{At: at.Add(time.Minute), Action: planner.ActionScale, Prefill: 2, Decode: 3, DesiredPrefill: 0, DesiredDecode: 2, Reason: "scale down"},
	} {
		if err := s.Apply(ctx, d); err != nil {
			t.Fatal(err)
		}
		var ev *clientv3.Event
		select {
		case resp := <-wch:
			if len(resp.Events) != 1 {
				t.Fatalf("watch: %d events", len(resp.Events))
			}
			ev = resp.Events[0]
		case <-ctx.Done():
			t.Fatal("the watch saw no write")
		}
		// The at field is the decision's time in UTC, to the second.
		if string(ev.Kv.Key) != "/fleet-a/planner/desired" || ev.Kv.Lease != 0 {
			t.Fatalf("written %q with lease %d", ev.Kv.Key, ev.Kv.Lease)
		}
		var raw map[string]any
		if err := json.Unmarshal(ev.Kv.Value, &raw); err != nil {
			t.Fatalf("value %s: %v", ev.Kv.Value, err)
		}
		want := map[string]any{"prefill": float64(max(1, d.DesiredPrefill)), "decode": float64(d.DesiredDecode),
			"at": d.At.UTC().Format(time.RFC3339), "reason": d.Reason, "router": "router-1:8000"}
		if len(raw) != len(want) {
			t.Errorf("value %s: fields %v, want %v", ev.Kv.Value, raw, want)
		}
		for k, v := range want {
			if raw[k] != v {
				t.Errorf("value %s: %s = %v, want %v", ev.Kv.Value, k, raw[k], v)
			}
		}
		got, ok, err := Read(ctx, cli, "/fleet-a/")
		if err != nil || !ok || got.Prefill != max(1, d.DesiredPrefill) || got.Decode != d.DesiredDecode || got.Reason != d.Reason {
			t.Fatalf("Read: %+v, %v, %v", got, ok, err)
		}
	}
}

// TestReadRejects: garbage at the key is an error naming it, never a count.
func TestReadRejects(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct{ value, want string }{
		{"not json", "/p/planner/desired: invalid character"},
		{`{"prefill": 0, "decode": 2}`, "want at least 1 each"},
		{strings.Repeat(" ", MaxValueBytes+1), "more than"},
	} {
		if _, err := cli.Put(ctx, "/p/planner/desired", c.value); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := Read(ctx, cli, "/p/"); ok || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Read of %.20q: ok %v, err %v, want %q", c.value, ok, err, c.want)
		}
	}
}

// TestEtcdDown: a write to an etcd that is gone fails within Timeout,
// naming the key.
func TestEtcdDown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	s, err := New(Config{Client: cli, Prefix: "/p/", Router: "r", Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	err = s.Apply(context.Background(), planner.Decision{DesiredPrefill: 1, DesiredDecode: 1})
	if err == nil || !strings.Contains(err.Error(), "put /p/planner/desired") {
		t.Fatalf("err %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the write took %s with a timeout of 200ms", took)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(Config{Prefix: "/p/"}); err == nil || !strings.Contains(err.Error(), "--discovery etcd") {
		t.Errorf("no client: %v", err)
	}
	cli := client(t, "http://127.0.0.1:1") // never dialled
	if _, err := New(Config{Client: cli, Prefix: "/p"}); err == nil || !strings.Contains(err.Error(), "must end in /") {
		t.Errorf("prefix without /: %v", err)
	}
}

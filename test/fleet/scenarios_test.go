package fleet_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// routerNode declares the router position with flags after the common
// ones.
func (ps *procs) router(extra ...string) *node {
	n := &node{name: "router", role: "router", port: testbin.FreePort(ps.t)}
	n.args = append([]string{"router", "--host", "127.0.0.1", "--port", strconv.Itoa(n.port),
		"--health-interval", "250ms", "--drain-timeout", "30s"}, simFlags()...)
	n.args = append(n.args, extra...)
	return n
}

func urls(ns ...*node) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.url())
	}
	return strings.Join(s, ",")
}

func readyNames(ns ...*node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.role+" "+n.url())
	}
	return out
}

// waitResults waits until the load has at least n answers since t.
func waitResults(t *testing.T, l *load, since time.Time, n int) {
	t.Helper()
	if state, ok := testbin.WaitUntil(60*time.Second, func() (bool, string) {
		k := len(l.since(since))
		return k >= n, fmt.Sprintf("%d answers", k)
	}); !ok {
		t.Fatalf("load made no progress: %s", state)
	}
}

// TestRollingRestartFailsNothing: 2 prefill + 2 decode workers behind a
// router (static membership), under a steady load of streaming requests of
// about 1.5 s; every worker is restarted once, one at a time (SIGTERM, wait
// for it to exit, start it again on the same ports). No request fails.
func TestRollingRestartFailsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes")
	}
	t.Parallel()
	ps := newProcs(t)
	p0, p1 := ps.worker("prefill-0", "prefill"), ps.worker("prefill-1", "prefill")
	d0, d1 := ps.worker("decode-0", "decode"), ps.worker("decode-1", "decode")
	all := []*node{p0, p1, d0, d1}
	for _, n := range all {
		ps.start(n)
	}
	rt := ps.router("--prefill", urls(p0, p1), "--decode", urls(d0, d1))
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(all...)...)

	l := startLoad(rt.url(), 6)
	begin := time.Now()
	waitResults(t, l, begin, 12)
	restartAt := time.Now()
	before := l.since(begin)
	type step struct {
		name  string
		drain time.Duration
	}
	var steps []step
	for _, n := range []*node{p0, d0, p1, d1} {
		d := ps.stop(n)
		steps = append(steps, step{n.name, d})
		n.restarts++
		ps.start(n)
		waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(all...)...)
	}
	doneAt := time.Now()
	waitResults(t, l, doneAt, 12)
	rs := l.end()
	var during []result
	for _, r := range rs {
		if !r.start.Before(restartAt) && r.start.Before(doneAt) {
			during = append(during, r)
		}
	}
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed during a rolling restart; first: %s", len(f), len(rs), f[0])
	}
	t.Logf("requests served: %d (%d started during the restart, which took %s)", len(rs), len(during),
		doneAt.Sub(restartAt).Round(time.Millisecond))
	t.Logf("p99 TTFT: before %s, during %s", p99TTFT(before).Round(time.Millisecond), p99TTFT(during).Round(time.Millisecond))
	for _, s := range steps {
		t.Logf("  %s: SIGTERM to exit %s", s.name, s.drain.Round(time.Millisecond))
	}
	quiescent(t, hc, rt.url(), all...)
}

var finishedOK = regexp.MustCompile(`(?m)^pdserve_requests_finished_total\{[^}]*outcome="ok"[^}]*\} (\d+)`)

// servedOK reads a worker's count of requests finished ok.
func servedOK(hc *http.Client, n *node) int {
	resp, err := hc.Get(n.url() + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	total := 0
	for _, m := range finishedOK.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.Atoi(m[1])
		total += v
	}
	return total
}

// etcdOutage is how long TestEtcdFleet keeps etcd stopped: 30 s, ten of
// the workers' 3 s leases; under the race detector 10 s (still three
// leases), for the suite's time goal (.ci/run also runs the test whole
// without it).
func etcdOutage() time.Duration {
	if testbin.RaceEnabled {
		return 10 * time.Second
	}
	return 30 * time.Second
}

// TestEtcdFleet: workers register in a real etcd and the router follows
// it. A worker added under load takes requests within 2 s of being ready;
// a SIGKILLed worker leaves the fleet within its lease and a health
// interval, failing only requests it held; etcd stopped for 30 s under load
// (etcdOutage) fails no request (the router serves its last snapshot); once
// etcd is back every worker is registered again.
func TestEtcdFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint(), "--registry-ttl", "3s"}
	p0, p1 := ps.worker("prefill-0", "prefill", reg...), ps.worker("prefill-1", "prefill", reg...)
	d0, d1 := ps.worker("decode-0", "decode", reg...), ps.worker("decode-1", "decode", reg...)
	for _, n := range []*node{p0, p1, d0, d1} {
		ps.start(n)
	}
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint(), "--slow-start", "1s")
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, p1, d0, d1)...)
	l := startLoad(rt.url(), 6)
	waitResults(t, l, time.Time{}, 6)

	// A worker joins under load.
	p2 := ps.worker("prefill-2", "prefill", reg...)
	ps.start(p2)
	waitWorkers(t, hc, rt.url(), 10*time.Second, readyNames(p0, p1, p2, d0, d1)...)
	readyAt := time.Now()
	if state, ok := testbin.WaitUntil(2*time.Second, func() (bool, string) {
		n := servedOK(hc, p2)
		return n > 0, fmt.Sprintf("%d served", n)
	}); !ok {
		t.Errorf("the new prefill worker took no request within 2 s of ready: %s", state)
	} else {
		t.Logf("new prefill worker served its first request %s after it was ready", time.Since(readyAt).Round(time.Millisecond))
	}

	// A decode worker is killed: it leaves within the lease (3 s) and a
	// health interval; only requests it held may fail, once each.
	killAt, killMark := time.Now(), l.mark()
	d1.p.Kill()
	if state, ok := testbin.WaitUntil(3*time.Second+250*time.Millisecond+2*time.Second, func() (bool, string) {
		ws, err := workers(hc, rt.url())
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if w.URL == d1.url() {
				return false, fmt.Sprintf("still listed, %s", w.State)
			}
		}
		return true, ""
	}); !ok {
		t.Errorf("killed worker still in the fleet %s later: %s", time.Since(killAt).Round(time.Millisecond), state)
	} else {
		t.Logf("killed decode worker left the fleet after %s", time.Since(killAt).Round(time.Millisecond))
	}
	waitResults(t, l, time.Now(), 6)
	if f := failures(l.answeredAfter(killMark)); len(f) > 6 {
		t.Errorf("%d requests failed after one decode worker was killed; at most the 6 in flight may: %v", len(f), f)
	} else {
		t.Logf("requests failed by the kill: %d (the killed worker's streams in flight)", len(f))
	}

	// etcd goes away: nothing fails, the fleet stays.
	stopMark := l.mark()
	srv.Stop()
	time.Sleep(etcdOutage()) // the outage itself
	outage := l.answeredAfter(stopMark)
	srv.Restart()
	if f := failures(outage); len(f) > 0 {
		t.Errorf("%d of %d requests failed while etcd was down; first: %s", len(f), len(outage), f[0])
	}
	if len(outage) < 20 {
		t.Errorf("only %d requests answered during the outage", len(outage))
	}
	t.Logf("etcd down %s: %d requests served, %d failed", etcdOutage(), len(outage), len(failures(outage)))
	waitWorkers(t, hc, rt.url(), 10*time.Second, readyNames(p0, p1, p2, d0)...)

	// Every live worker is registered again.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if state, ok := testbin.WaitUntil(15*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "/pdserve/workers/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		return resp.Count == 4, fmt.Sprintf("%d registrations", resp.Count)
	}); !ok {
		t.Errorf("after etcd came back: %s, want the 4 live workers", state)
	}
	l.end()
	quiescent(t, hc, rt.url(), p0, p1, p2, d0)
}

// TestScaleUpAndDown: under load, 1 prefill + 1 decode grows to 2 + 2
// (new workers register in etcd) and shrinks back (SIGTERM: they drain,
// deregister and exit). No request fails; every worker and the router
// hold nothing at the end.
func TestScaleUpAndDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint()}
	p0, d0 := ps.worker("prefill-0", "prefill", reg...), ps.worker("decode-0", "decode", reg...)
	ps.start(p0)
	ps.start(d0)
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint())
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)
	l := startLoad(rt.url(), 4)
	waitResults(t, l, time.Time{}, 4)

	p1, d1 := ps.worker("prefill-1", "prefill", reg...), ps.worker("decode-1", "decode", reg...)
	ps.start(p1)
	ps.start(d1)
	waitWorkers(t, hc, rt.url(), 15*time.Second, readyNames(p0, p1, d0, d1)...)
	waitResults(t, l, time.Now(), 8)
	for _, n := range []*node{p1, d1} {
		ps.stop(n)
	}
	waitWorkers(t, hc, rt.url(), 15*time.Second, readyNames(p0, d0)...)
	waitResults(t, l, time.Now(), 4)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed while scaling; first: %s", len(f), len(rs), f[0])
	}
	ws, err := workers(hc, rt.url())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.State != fleet.StateReady {
			t.Errorf("worker %s left as %s", w.URL, w.State)
		}
	}
	quiescent(t, hc, rt.url(), p0, d0)
}

// TestBadRegistryEntries: garbage in the registry, an unreachable worker
// and a worker of another model are listed with their reason in GET
// /workers and never paired; the good pair serves.
func TestBadRegistryEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint()}
	p0, d0 := ps.worker("prefill-0", "prefill", reg...), ps.worker("decode-0", "decode", reg...)
	other := ps.worker("decode-other-model", "decode", append([]string{"--served-model-name", "another-model"}, reg...)...)
	for _, n := range []*node{p0, d0, other} {
		ps.start(n)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for k, v := range map[string]string{
		"garbage":     "{not json",
		"unreachable": fmt.Sprintf(`{"id":"unreachable","role":"decode","url":"http://127.0.0.1:%d","model":"pdserve-sim"}`, testbin.FreePort(t)),
	} {
		if _, err := cli.Put(ctx, "/pdserve/workers/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint())
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)
	ws, err := workers(hc, rt.url())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, w := range ws {
		seen[w.ID] = fmt.Sprintf("%s %s", w.State, w.LastError)
		if w.URL == other.url() {
			seen["other"] = seen[w.ID]
		}
	}
	for id, want := range map[string]string{"garbage": "invalid registry entry", "unreachable": "not_ready",
		"other": `serves model "another-model"`} {
		if !strings.Contains(seen[id], want) {
			t.Errorf("%s listed as %q, want %q", id, seen[id], want)
		}
	}
	l := startLoad(rt.url(), 2)
	waitResults(t, l, time.Time{}, 10)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed with bad entries in the registry; first: %s", len(f), len(rs), f[0])
	}
}

// registrations counts the worker records in etcd.
func registrations(t *testing.T, endpoint string) func() (bool, string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "/pdserve/workers/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		return resp.Count == 4, fmt.Sprintf("%d registrations", resp.Count)
	}
}

// TestEtcdRestartedEmpty: etcd is stopped and comes back with an empty
// data directory (every record and lease gone) under load. The router
// lists an empty fleet until the workers have registered again; it keeps
// its healthy workers through that (--unlisted-grace) and no request
// fails. Run with --unlisted-grace 0, the same restart fails requests.
func TestEtcdRestartedEmpty(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	// A lease of 30 s is kept alive every 10 s: a worker notices that etcd
	// lost its lease up to 10 s after etcd is back, long after the router
	// listed the empty etcd.
	reg := []string{"--etcd-endpoints", srv.Endpoint(), "--registry-ttl", "30s"}
	p0, p1 := ps.worker("prefill-0", "prefill", reg...), ps.worker("prefill-1", "prefill", reg...)
	d0, d1 := ps.worker("decode-0", "decode", reg...), ps.worker("decode-1", "decode", reg...)
	all := []*node{p0, p1, d0, d1}
	for _, n := range all {
		ps.start(n)
	}
	// The router checks its watch every 100 ms: it lists the empty etcd
	// before the workers have registered again (about a second).
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint(), "--etcd-verify-interval", "100ms")
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(all...)...)
	l := startLoad(rt.url(), 4)
	waitResults(t, l, time.Time{}, 4)

	// A long-lived etcd has a long history: the new one's revisions start
	// over far below it.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := cli.Put(context.Background(), "/elsewhere", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	mark := l.mark()
	srv.Stop()
	time.Sleep(2 * time.Second) // the outage itself
	srv.RestartEmpty()
	back := time.Now()
	// The router lists the empty etcd; its workers stay, shown unlisted,
	// until they have registered again.
	sawUnlisted := false
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		if ok, state := registrations(t, srv.Endpoint())(); !ok {
			return false, state
		}
		ws, err := workers(hc, rt.url())
		if err != nil {
			return false, err.Error()
		}
		var listed []string
		for _, w := range ws {
			if w.Unlisted != "" {
				sawUnlisted = true
			} else if w.State == fleet.StateReady {
				listed = append(listed, w.URL)
			}
		}
		return len(listed) == 4, fmt.Sprintf("ready and listed: %v", listed)
	}); !ok {
		t.Fatalf("the fleet did not come back after etcd restarted empty: %s", state)
	}
	t.Logf("every worker registered and listed again %s after etcd came back (router showed unlisted workers: %v)",
		time.Since(back).Round(time.Millisecond), sawUnlisted)
	// The workers registered again under the same records, so the router
	// lists them before it need have noticed anything; it notices at its
	// next successful verify (every 100 ms, each bounded by 100 ms: a
	// loaded machine may time a few out).
	if _, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		return strings.Contains(rt.p.Stderr(), "etcd lost its data"), ""
	}); !ok {
		t.Errorf("the router did not notice within 10 s that etcd lost its data; stderr:\n%s", rt.p.Stderr())
	}
	waitResults(t, l, time.Now(), 8)
	rs := l.answeredAfter(mark)
	// The router follows the new etcd: a worker that registers now joins.
	d2 := ps.worker("decode-2", "decode", reg...)
	ps.start(d2)
	waitWorkers(t, hc, rt.url(), 15*time.Second, readyNames(append(all, d2)...)...)
	l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed while etcd restarted empty; first: %s", len(f), len(rs), f[0])
	}
	t.Logf("etcd restarted empty: %d requests answered since it stopped, %d failed", len(rs), len(failures(rs)))
	quiescent(t, hc, rt.url(), append(all, d2)...)
}

// TestAdvertisedKVAddr: a prefill worker whose KV channel decode workers
// reach only through another address (NAT, a container's published port:
// here a TCP forwarder) registers that address with --advertise-kv-addr;
// the router pairs it with it and requests succeed through the forwarder.
func TestAdvertisedKVAddr(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint()}
	p0 := ps.worker("prefill-0", "prefill", reg...)
	fwd := startBreakingProxy(t, fmt.Sprintf("127.0.0.1:%d", p0.kvPort))
	fwd.broken.Store(false)
	p0.args = append(p0.args, "--advertise-kv-addr", fwd.addr())
	d0 := ps.worker("decode-0", "decode", reg...)
	ps.start(p0)
	ps.start(d0)
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint())
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)
	if st, ok := workerState(hc, rt.url(), p0.url()); !ok || st.KVAddr != fwd.addr() {
		t.Fatalf("prefill worker's KV address at the router %q, want the advertised %s", st.KVAddr, fwd.addr())
	}
	l := startLoad(rt.url(), 2)
	waitResults(t, l, time.Time{}, 6)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed through the advertised KV address; first: %s", len(f), len(rs), f[0])
	}
}

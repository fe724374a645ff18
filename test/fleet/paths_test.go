package fleet_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// getJSON GETs url into v.
func getJSON(hc *http.Client, url string, v any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// pairStates returns the router's /debug/pairs as "prefill → decode" → state.
func pairStates(hc *http.Client, router string) (map[string]string, error) {
	var v struct {
		Pairs []struct {
			Prefill, Decode, State, Reason string
		} `json:"pairs"`
	}
	if err := getJSON(hc, router+"/debug/pairs", &v); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range v.Pairs {
		out[p.Prefill+" → "+p.Decode] = p.State + " " + p.Reason
	}
	return out, nil
}

// metricSum sums the samples of a metric on a server's /metrics whose
// lines contain every one of match (label pairs as they print, e.g.
// `reason="auth"`).
func metricSum(t *testing.T, hc *http.Client, url, metric string, match ...string) float64 {
	t.Helper()
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue next
			}
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// workerState returns the router's view of the worker at url.
func workerState(hc *http.Client, router, url string) (fleet.Status, bool) {
	ws, err := workers(hc, router)
	if err != nil {
		return fleet.Status{}, false
	}
	for _, w := range ws {
		if w.URL == url {
			return w, true
		}
	}
	return fleet.Status{}, false
}

// TestWrongKVAuthNeverPaired: a decode worker started with another
// --kv-auth than the prefill workers joins a serving fleet: the router's
// first check of it (at once, as it joins) asks it to reach the prefill
// worker, it reports the handshake refused for auth, and the router lists
// it not_ready with that reason within one health interval, never sends it
// a leg, and keeps serving every request on the right pair. The decode
// worker counts the refusal by reason and shows the path in its /health.
func TestWrongKVAuthNeverPaired(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	t.Parallel()
	const interval = 2 * time.Second
	ps := newProcs(t)
	p0 := ps.worker("prefill-0", "prefill", "--kv-auth", "secret")
	d0 := ps.worker("decode-0", "decode", "--kv-auth", "secret")
	bad := ps.worker("decode-wrong-auth", "decode", "--kv-auth", "not-the-secret")
	for _, n := range []*node{p0, d0, bad} {
		ps.start(n)
	}
	rt := ps.router("--prefill", p0.url(), "--decode", d0.url(), "--health-interval", interval.String())
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)
	joined := time.Now()
	resp, err := hc.Post(rt.url()+"/workers", "application/json", strings.NewReader(fmt.Sprintf(`{"url":%q,"role":"decode"}`, bad.url())))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var st fleet.Status
	why, ok := testbin.WaitUntil(interval, func() (bool, string) {
		s, ok := workerState(hc, rt.url(), bad.url())
		st = s
		return ok && s.State == fleet.StateNotReady && strings.Contains(s.LastError, "failed to prove the internal secret"), fmt.Sprintf("%+v", s)
	})
	if !ok {
		t.Fatalf("decode with the wrong --kv-auth, %s after it joined: %s", interval, why)
	}
	t.Logf("reported not_ready %s after joining: %s", time.Since(joined).Round(time.Millisecond), st.LastError)
	var h workerapi.Health
	if err := getJSON(hc, bad.url()+"/health", &h); err != nil {
		t.Fatal(err)
	}
	if len(h.KVPaths) != 1 || h.KVPaths[0].State != workerapi.KVPathRefused || h.KVPaths[0].Refusal != "auth" {
		t.Errorf("the decode worker's own /health: %+v", h.KVPaths)
	}
	if n := metricSum(t, hc, bad.url(), "pdserve_peer_auth_failures_total", `channel="kv"`, `reason="peer_refused"`); n < 1 {
		t.Errorf("the decode worker counted %v KV handshakes its peer refused", n)
	}
	var rh map[string]any
	if err := getJSON(hc, rt.url()+"/health", &rh); err != nil || !strings.Contains(fmt.Sprint(rh["not_ready"]), "failed to prove the internal secret") {
		t.Errorf("router /health %v (%v): want the refused decode worker and why", rh, err)
	}
	l := startLoad(rt.url(), 4)
	waitResults(t, l, time.Time{}, 8)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed; first: %s", len(f), len(rs), f[0])
	}
	if n := metricSum(t, hc, rt.url(), "pdserve_router_selections_total", `worker="`+bad.url()+`"`); n != 0 {
		t.Errorf("the refused decode worker was chosen %v times", n)
	}
	if n := metricSum(t, hc, rt.url(), "pdserve_router_retries_total"); n != 0 {
		t.Errorf("%v retries: the refused path was known before any request", n)
	}
}

// TestSplitKVAuthPairsMatchingPaths: two prefill and two decode workers in
// two --kv-auth groups: every worker has one working KV path and one
// refused. The router learns which from the decode workers' reports, opens
// the refused pairs' breakers, keeps every worker ready, and serves every
// request on a working pair: no failure, no retry.
func TestSplitKVAuthPairsMatchingPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	t.Parallel()
	ps := newProcs(t)
	p0, d0 := ps.worker("prefill-a", "prefill", "--kv-auth", "a"), ps.worker("decode-a", "decode", "--kv-auth", "a")
	p1, d1 := ps.worker("prefill-b", "prefill", "--kv-auth", "b"), ps.worker("decode-b", "decode", "--kv-auth", "b")
	for _, n := range []*node{p0, d0, p1, d1} {
		ps.start(n)
	}
	rt := ps.router("--prefill", urls(p0, p1), "--decode", urls(d0, d1))
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, p1, d0, d1)...)
	if why, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		st, err := pairStates(hc, rt.url())
		if err != nil {
			return false, err.Error()
		}
		good := strings.HasPrefix(st[p0.url()+" → "+d0.url()], "closed") && strings.HasPrefix(st[p1.url()+" → "+d1.url()], "closed")
		bad := strings.Contains(st[p0.url()+" → "+d1.url()], "failed to prove the internal secret") &&
			strings.Contains(st[p1.url()+" → "+d0.url()], "failed to prove the internal secret")
		return good && bad, fmt.Sprint(st)
	}); !ok {
		t.Fatalf("pairs: %s", why)
	}
	l := startLoad(rt.url(), 6)
	waitResults(t, l, time.Time{}, 12)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed; first: %s", len(f), len(rs), f[0])
	}
	if n := metricSum(t, hc, rt.url(), "pdserve_router_retries_total"); n != 0 {
		t.Errorf("%v retries", n)
	}
	waitWorkers(t, hc, rt.url(), time.Second, readyNames(p0, p1, d0, d1)...)
}

// breakingProxy forwards TCP connections to a prefill worker's KV port. It
// passes the handshake and the heartbeats; while broken, it cuts a
// connection at the first room message (a KV transfer starting): a route
// that looks up but breaks when KV flows.
type breakingProxy struct {
	ln     net.Listener
	target string
	broken atomic.Bool
	cuts   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func startBreakingProxy(t *testing.T, target string) *breakingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &breakingProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.broken.Store(true)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *breakingProxy) addr() string { return p.ln.Addr().String() }

func (p *breakingProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, up)
		p.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	// decode → prefill, frame by frame: [uint32 length][type][payload].
	var hdr [kvxfer.LengthBytes + 1]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			break
		}
		n := binary.BigEndian.Uint32(hdr[:kvxfer.LengthBytes])
		typ := kvxfer.Type(hdr[kvxfer.LengthBytes])
		if p.broken.Load() && typ >= kvxfer.TypeRoomOpen {
			p.cuts.Add(1)
			break
		}
		if _, err := up.Write(hdr[:]); err != nil {
			break
		}
		if n > 0 {
			if _, err := io.CopyN(up, c, int64(n-1)); err != nil {
				break
			}
		}
	}
	up.Close()
	<-done
}

// TestBrokenKVRouteOpensBreaker: a prefill worker whose KV route (its
// registry entry's KV address, through a proxy here) passes the handshake
// and heartbeats but breaks as soon as KV flows: its requests fail on the
// path (peer_lost) and are retried on the other prefill worker, so no
// client sees a failure; its pairs' breakers open and it is held
// not_ready with the reason. Once the route is repaired, the breaker's
// cool-down ends, one request probes the path, and the worker serves again.
func TestBrokenKVRouteOpensBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint(), "--registry-ttl", "3s"}
	p0 := ps.worker("prefill-broken-route", "prefill") // registered by the test, through the proxy
	p1, d0 := ps.worker("prefill-1", "prefill", reg...), ps.worker("decode-0", "decode", reg...)
	for _, n := range []*node{p0, p1, d0} {
		ps.start(n)
	}
	proxy := startBreakingProxy(t, fmt.Sprintf("127.0.0.1:%d", p0.kvPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rec := fmt.Sprintf(`{"id":"prefill-broken-route","role":"prefill","url":%q,"kv_addr":%q,"model":"pdserve-sim"}`, p0.url(), proxy.addr())
	if _, err := cli.Put(context.Background(), "/pdserve/workers/prefill-broken-route", rec); err != nil {
		t.Fatal(err)
	}
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint(), "--pair-breaker-cooldown", "3s",
		"--prefill-policy", "round_robin")
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, p1, d0)...)
	l := startLoad(rt.url(), 3)
	if why, ok := testbin.WaitUntil(20*time.Second, func() (bool, string) {
		s, _ := workerState(hc, rt.url(), p0.url())
		return s.State == fleet.StateNotReady && strings.HasPrefix(s.Held, "every KV path is open"), fmt.Sprintf("%+v", s)
	}); !ok {
		t.Fatalf("the prefill with the broken route is not held: %s", why)
	}
	st, _ := workerState(hc, rt.url(), p0.url())
	t.Logf("held after %d cut transfers: %s", proxy.cuts.Load(), st.Held)
	if n := metricSum(t, hc, rt.url(), "pdserve_router_retries_total", `cause="peer_lost"`); n < 1 {
		t.Errorf("retries for peer_lost: %v", n)
	}
	if n := metricSum(t, hc, rt.url(), "pdserve_router_pair_breaker_state", `prefill="`+p0.url()+`"`); n != 2 {
		t.Errorf("breaker gauge of the broken pair %v, want 2 (open)", n)
	}
	// Repaired: after the cool-down a probe closes the path.
	proxy.broken.Store(false)
	chosen := metricSum(t, hc, rt.url(), "pdserve_router_selections_total", `worker="`+p0.url()+`"`)
	if why, ok := testbin.WaitUntil(20*time.Second, func() (bool, string) {
		pst, _ := pairStates(hc, rt.url())
		now := metricSum(t, hc, rt.url(), "pdserve_router_selections_total", `worker="`+p0.url()+`"`)
		return strings.HasPrefix(pst[p0.url()+" → "+d0.url()], "closed") && now > chosen, fmt.Sprint(pst)
	}); !ok {
		t.Fatalf("the repaired path did not close: %s", why)
	}
	waitResults(t, l, time.Now(), 6)
	rs := l.end()
	if f := failures(rs); len(f) > 0 {
		t.Errorf("%d of %d requests failed; first: %s", len(f), len(rs), f[0])
	}
}

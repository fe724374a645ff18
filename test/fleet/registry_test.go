package fleet_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// registryStatus GETs the router's registry_status.
func registryStatus(hc *http.Client, router string) (fleet.RegistryStatus, error) {
	var v struct {
		Status fleet.RegistryStatus `json:"registry_status"`
	}
	resp, err := hc.Get(router + "/workers")
	if err != nil {
		return v.Status, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v.Status, fmt.Errorf("GET /workers: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Status, err
}

// countLines counts the lines of s that contain every one of parts.
func countLines(s string, parts ...string) int {
	n := 0
next:
	for line := range strings.Lines(s) {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// TestRouterSaysEtcdIsGone: etcd stopped, the router says so within two
// etcd verify intervals (and some slack): registry_status is not synced,
// with the error and the last sync's age, pdserve_router_registry_up is 0,
// one warning is logged however long the outage; meanwhile it serves the
// fleet it knows. A new etcd on the same endpoint: synced, up 1 and one
// info line, within the same bound.
func TestRouterSaysEtcdIsGone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	t.Parallel()
	const verify = 500 * time.Millisecond
	bound := 4*verify + 2*time.Second
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint()}
	p0, d0 := ps.worker("prefill-0", "prefill", reg...), ps.worker("decode-0", "decode", reg...)
	ps.start(p0)
	ps.start(d0)
	rt := ps.router("--discovery", "etcd", "--etcd-endpoints", srv.Endpoint(), "--etcd-verify-interval", verify.String(),
		"--log-level", "info")
	ps.start(rt)
	hc := &http.Client{Timeout: 10 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)
	waitRegistry := func(what string, synced bool) fleet.RegistryStatus {
		t.Helper()
		var st fleet.RegistryStatus
		if state, ok := testbin.WaitUntil(bound, func() (bool, string) {
			var err error
			if st, err = registryStatus(hc, rt.url()); err != nil {
				return false, err.Error()
			}
			up := metricSum(t, hc, rt.url(), "pdserve_router_registry_up", `backend="etcd"`)
			b, _ := json.Marshal(st)
			return st.Synced == synced && up == map[bool]float64{true: 1, false: 0}[synced], fmt.Sprintf("%s, up %v", b, up)
		}); !ok {
			t.Fatalf("%s: registry not synced=%v within %s: %s", what, synced, bound, state)
		}
		return st
	}
	st := waitRegistry("etcd running", true)
	if st.LastSyncAge == nil || *st.LastSyncAge > 2*verify.Seconds()+1 {
		t.Fatalf("etcd running: last sync age %v, want within a verify interval or two", st.LastSyncAge)
	}
	if ts := metricSum(t, hc, rt.url(), "pdserve_router_registry_last_sync_timestamp_seconds", `backend="etcd"`); time.Since(time.Unix(int64(ts), 0)) > 5*time.Second {
		t.Fatalf("etcd running: last sync timestamp %v", ts)
	}

	stopped := time.Now()
	srv.Stop()
	t.Logf("etcd took %s to stop", time.Since(stopped).Round(time.Millisecond))
	st = waitRegistry("etcd stopped", false)
	t.Logf("the router said etcd was gone %s after it began to stop", time.Since(stopped).Round(time.Millisecond))
	if st.LastError == "" || st.LastErrorAt == nil || st.LastErrorAt.Before(stopped) || st.LastSync == nil || st.LastSync.After(stopped) {
		t.Fatalf("etcd stopped at %s: %+v", stopped, st)
	}
	// Still serving the fleet it knows, and the outage's age grows.
	if r := newLoadOnce(rt.url()); r.err != "" {
		t.Fatalf("a request while etcd is down: %s", r.err)
	}
	if state, ok := testbin.WaitUntil(bound, func() (bool, string) {
		st, err := registryStatus(hc, rt.url())
		if err != nil || st.LastSyncAge == nil {
			return false, fmt.Sprint(err)
		}
		return *st.LastSyncAge > time.Since(stopped).Seconds()-1 && time.Since(stopped) > 3*verify, fmt.Sprint(*st.LastSyncAge)
	}); !ok {
		t.Fatalf("last sync age does not grow during the outage: %s", state)
	}
	waitLogged(t, rt, 1, "level=WARN", "etcd unreachable")

	restarted := time.Now()
	srv.Restart()
	st = waitRegistry("etcd restarted", true)
	if st.LastSync == nil || st.LastSync.Before(restarted) {
		t.Fatalf("etcd restarted at %s: %+v", restarted, st)
	}
	waitLogged(t, rt, 1, "level=INFO", "etcd reachable again")
	waitLogged(t, rt, 1, "level=WARN", "etcd unreachable")
	waitWorkers(t, hc, rt.url(), 10*time.Second, readyNames(p0, d0)...)
}

// waitLogged waits up to 5 s for n's stderr to hold want lines with every
// one of parts (the log reaches the test through a pipe, after the answers
// that follow it), and fails if it holds another number.
func waitLogged(t *testing.T, n *node, want int, parts ...string) {
	t.Helper()
	if _, ok := testbin.WaitUntil(5*time.Second, func() (bool, string) {
		return countLines(n.p.Stderr(), parts...) >= want, ""
	}); !ok || countLines(n.p.Stderr(), parts...) != want {
		t.Fatalf("%d lines with %q in the %s's log, want %d:\n%s", countLines(n.p.Stderr(), parts...), parts, n.name, want, n.p.Stderr())
	}
}

// newLoadOnce sends one streaming request to router and reads its answer.
func newLoadOnce(router string) result {
	return (&load{url: router, hc: &http.Client{Timeout: 30 * time.Second}}).one("the registry is gone")
}

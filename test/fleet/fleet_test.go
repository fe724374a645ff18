// Package fleet_test runs pdserve as a fleet of processes: workers that
// join and leave through a real etcd (embedded in the test), drain on
// SIGTERM, and a router that follows them, under a steady load of
// streaming requests. It checks invariant 7 of the design: a planned change
// (adding, draining, restarting a worker; an outage of the registry) fails
// no request.
package fleet_test

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/testbin"
)

var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests wait on processes and timers far more than they compute
	// (the package keeps about a third of a core busy): unless -parallel
	// says otherwise, four run at a time instead of GOMAXPROCS.
	if err := testbin.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	pdserve.Remove()
	os.Exit(code)
}

// Timing of the simulated model: a request streams for
// maxTokens × decodeMS ≈ 1.5 s.
const (
	decodeMS  = 30
	maxTokens = 50
)

func simFlags() []string {
	return []string{"--sim-layers", "2", "--sim-kv-heads", "2", "--sim-head-dim", "16", "--sim-context-len", "2048",
		"--sim-prefill-ms-per-token", "0.05", "--sim-decode-ms-per-step", strconv.Itoa(decodeMS)}
}

// node is one pdserve process position: a role, fixed ports, its flags; a
// new process on every (re)start.
type node struct {
	name     string
	role     string
	port     int
	kvPort   int
	args     []string
	p        *testbin.Proc
	restarts int
}

func (n *node) url() string { return fmt.Sprintf("http://127.0.0.1:%d", n.port) }

type procs struct {
	t   *testing.T
	bin string
	mu  sync.Mutex
	all []*testbin.Proc
}

func newProcs(t *testing.T) *procs {
	ps := &procs{t: t, bin: pdserve.Path(t)}
	t.Cleanup(func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, p := range ps.all {
			p.Kill()
		}
	})
	return ps
}

// worker declares a worker position; extra flags are added to every start.
func (ps *procs) worker(name, role string, extra ...string) *node {
	n := &node{name: name, role: role, port: testbin.FreePort(ps.t)}
	n.args = []string{role, "--host", "127.0.0.1", "--port", strconv.Itoa(n.port), "--kv-cache-memory", "64MiB",
		"--drain-timeout", "30s"}
	if role == "prefill" {
		n.kvPort = testbin.FreePort(ps.t)
		n.args = append(n.args, "--kv-port", strconv.Itoa(n.kvPort))
	}
	n.args = append(append(n.args, simFlags()...), extra...)
	return n
}

var readyLine = regexp.MustCompile(`^ready$`)

// start starts n and waits for its "ready" line.
func (ps *procs) start(n *node) {
	ps.t.Helper()
	p, err := testbin.Start(nil, ps.bin, fmt.Sprintf("%s#%d", n.name, n.restarts), nil, n.args...)
	if err != nil {
		ps.t.Fatal(err)
	}
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	n.p = p
	if _, err := p.WaitLine(readyLine, 60*time.Second); err != nil {
		ps.t.Fatal(err)
	}
}

// stop sends SIGTERM and waits for n to exit (0) after its drain; it
// returns how long that took.
func (ps *procs) stop(n *node) time.Duration {
	ps.t.Helper()
	start := time.Now()
	if err := n.p.Stop(syscall.SIGTERM, 45*time.Second); err != nil {
		ps.t.Fatal(err)
	}
	return time.Since(start)
}

// workers GETs the router's admin list.
func workers(hc *http.Client, router string) ([]fleet.Status, error) {
	resp, err := hc.Get(router + "/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Workers []fleet.Status `json:"workers"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return nil, err
	}
	return v.Workers, nil
}

// waitWorkers waits until the router's ready workers, as "role url" sorted,
// are want.
func waitWorkers(t *testing.T, hc *http.Client, router string, timeout time.Duration, want ...string) {
	t.Helper()
	sort.Strings(want)
	state, ok := testbin.WaitUntil(timeout, func() (bool, string) {
		ws, err := workers(hc, router)
		if err != nil {
			return false, err.Error()
		}
		var ready, all []string
		for _, w := range ws {
			all = append(all, fmt.Sprintf("%s %s %s", w.Role, w.URL, w.State))
			if w.State == fleet.StateReady {
				ready = append(ready, w.Role+" "+w.URL)
			}
		}
		sort.Strings(ready)
		return slices.Equal(ready, want), strings.Join(all, "; ")
	})
	if !ok {
		t.Fatalf("router's workers: %s\nwant ready: %s", state, strings.Join(want, "; "))
	}
}

// result is one client request as the client saw it.
type result struct {
	start  time.Time
	ttft   time.Duration
	tokens int
	err    string // "" = success
}

// load keeps n clients sending streaming completions to the router until
// stopped, and records every answer.
type load struct {
	url  string
	hc   *http.Client
	mu   sync.Mutex
	res  []result
	stop chan struct{}
	wg   sync.WaitGroup
}

func startLoad(router string, clients int) *load {
	l := &load{url: router, hc: &http.Client{Timeout: 60 * time.Second}, stop: make(chan struct{})}
	for i := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for j := 0; ; j++ {
				select {
				case <-l.stop:
					return
				default:
				}
				r := l.one(fmt.Sprintf("client %d request %d: tell me a story", i, j))
				l.mu.Lock()
				l.res = append(l.res, r)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// one sends one streaming completion and reads it to its end.
func (l *load) one(prompt string) result {
	r := result{start: time.Now()}
	body := fmt.Sprintf(`{"model":"pdserve-sim","prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":true}`, prompt, maxTokens)
	resp, err := l.hc.Post(l.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		r.err = err.Error()
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.err = fmt.Sprintf("%d %s", resp.StatusCode, b)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: {\"error\""):
			r.err = line
			return r
		case strings.HasPrefix(line, "data: "):
			if r.tokens == 0 {
				r.ttft = time.Since(r.start)
			}
			r.tokens++
		}
	}
	if !done {
		r.err = fmt.Sprintf("stream ended without [DONE] after %d events: %v", r.tokens, sc.Err())
	}
	return r
}

// since returns the results of requests started at or after t (all if t
// is zero) and ended before the call.
func (l *load) since(t time.Time) []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []result
	for _, r := range l.res {
		if !r.start.Before(t) {
			out = append(out, r)
		}
	}
	return out
}

// mark is the number of answers so far; answeredAfter returns the answers
// that came after a mark.
func (l *load) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.res)
}

func (l *load) answeredAfter(mark int) []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]result(nil), l.res[mark:]...)
}

func (l *load) end() []result {
	close(l.stop)
	l.wg.Wait()
	return l.since(time.Time{})
}

// failures lists the failed results' errors.
func failures(rs []result) []string {
	var out []string
	for _, r := range rs {
		if r.err != "" {
			out = append(out, r.err)
		}
	}
	return out
}

// p99TTFT is the 99th percentile TTFT of the successful results.
func p99TTFT(rs []result) time.Duration {
	var d []time.Duration
	for _, r := range rs {
		if r.err == "" {
			d = append(d, r.ttft)
		}
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*99/100)]
}

// quiescent waits until every worker holds nothing: no live request, no
// pages in use (its /health), and no leg in flight at the router.
func quiescent(t *testing.T, hc *http.Client, router string, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		state, ok := testbin.WaitUntil(15*time.Second, func() (bool, string) {
			resp, err := hc.Get(n.url() + "/health")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			var h struct {
				Live      int `json:"live"`
				PagesUsed int `json:"pages_used"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
				return false, err.Error()
			}
			return h.Live == 0 && h.PagesUsed == 0, fmt.Sprintf("live %d, pages used %d", h.Live, h.PagesUsed)
		})
		if !ok {
			t.Errorf("%s not back to baseline: %s", n.name, state)
		}
	}
	state, ok := testbin.WaitUntil(15*time.Second, func() (bool, string) {
		ws, err := workers(hc, router)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if w.Legs != 0 {
				return false, fmt.Sprintf("%s has %d legs", w.URL, w.Legs)
			}
		}
		resp, err := hc.Get(router + "/debug/requests")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var v struct {
			Requests []json.RawMessage `json:"requests"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return len(v.Requests) == 0, fmt.Sprintf("%d requests at the router", len(v.Requests))
	})
	if !ok {
		t.Errorf("router not back to baseline: %s", state)
	}
}

package fleet_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Requests of the two-router test: seeded sampling over a few distinct
// (prompt, seed) pairs, so that every answer has a reference answer.
const (
	// lbKinds is the number of distinct requests of the load.
	lbKinds = 6
	// lbLongTokens makes the long stream last lbLongTokens × decodeMS =
	// 4.5 s: it is still streaming on the router killed under it, seconds
	// after the bound on its legs' abort.
	lbLongTokens = 150
	// legsGoneBound bounds the time from the SIGKILL of a router to the
	// workers holding none of its legs: the kernel closes the dead
	// process's connections at once, and a worker aborts a leg whose
	// connection closed.
	legsGoneBound = 2 * time.Second
)

// lbBody is the streamed request of kind k with n tokens.
func lbBody(k, n int) string {
	return fmt.Sprintf(`{"model":"pdserve-sim","prompt":"story %d: once upon a time","max_tokens":%d,"ignore_eos":true,`+
		`"temperature":1,"seed":%d,"stream":true,"stream_options":{"include_usage":true}}`, k, n, 1000+k)
}

// attempt is one try of a request on one router, as the client saw it.
type attempt struct {
	router     int
	start, end time.Time
	rid        string // from the first event's id
	text       string // the choices' texts, in order
	tokens     int    // the usage's completion tokens
	// refused is a failure before any byte of an answer: a connection
	// error or a 5xx status. A load balancer retries it on another
	// backend.
	refused bool
	// rejected is a 4xx answer: the request's fault, no retry changes it.
	rejected bool
	err      string // "" = complete answer
}

// streamAttempt sends body to router (index i) and reads the stream to its
// end. first, if not nil, is called once with the rid when the first event
// arrives.
func streamAttempt(hc *http.Client, routers []string, i int, body string, first func(rid string)) attempt {
	a := attempt{router: i, start: time.Now()}
	defer func() { a.end = time.Now() }()
	resp, err := hc.Post(routers[i]+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		a.err, a.refused = err.Error(), true
		return a
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		a.err, a.refused, a.rejected = resp.Status, resp.StatusCode >= 500, resp.StatusCode < 500
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var text strings.Builder
	done := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, `data: {"error"`):
			a.err = line
			return a
		case strings.HasPrefix(line, "data: "):
			var ev struct {
				ID      string `json:"id"`
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(line[len("data: "):]), &ev); err != nil {
				a.err = fmt.Sprintf("event %q: %v", line, err)
				return a
			}
			if a.rid == "" {
				a.rid = strings.TrimPrefix(ev.ID, "cmpl-")
				if first != nil {
					first(a.rid)
				}
			}
			for _, c := range ev.Choices {
				text.WriteString(c.Text)
			}
			if ev.Usage != nil {
				a.tokens = ev.Usage.CompletionTokens
			}
		}
	}
	a.text = text.String()
	if !done {
		a.err = fmt.Sprintf("stream ended without [DONE] after %d bytes of text: %v", text.Len(), sc.Err())
	}
	return a
}

// balancer spreads requests over routers round robin, as a plain load
// balancer in front of them would, and sets a router aside after a request
// on it failed (a passive health check).
type balancer struct {
	routers []string
	next    atomic.Uint64
	down    []atomic.Bool
}

func newBalancer(routers ...string) *balancer {
	return &balancer{routers: routers, down: make([]atomic.Bool, len(routers))}
}

// pick is the next router in turn that is not set aside.
func (b *balancer) pick() int {
	for range b.routers {
		i := int(b.next.Add(1) % uint64(len(b.routers)))
		if !b.down[i].Load() {
			return i
		}
	}
	return int(b.next.Add(1) % uint64(len(b.routers)))
}

// lbRequest is one client request: its kind and its attempts (two when it
// was retried).
type lbRequest struct {
	kind     int
	attempts []attempt
}

func (r lbRequest) last() attempt { return r.attempts[len(r.attempts)-1] }

// do sends the request of kind k with n tokens through b; a failed first
// attempt (refused, or a stream that broke) sets its router aside and is
// retried once, from scratch, on the other router.
func (b *balancer) do(hc *http.Client, k, n int, first func(router int, rid string)) lbRequest {
	r := lbRequest{kind: k}
	i := b.pick()
	for try := 0; try < 2; try++ {
		a := streamAttempt(hc, b.routers, i, lbBody(k, n), func(rid string) {
			if first != nil {
				first(i, rid)
			}
		})
		r.attempts = append(r.attempts, a)
		if a.err == "" || a.rejected {
			break
		}
		b.down[i].Store(true)
		i = (i + 1) % len(b.routers)
	}
	return r
}

// lbLoad keeps clients sending requests through a balancer until stopped.
type lbLoad struct {
	b    *balancer
	hc   *http.Client
	mu   sync.Mutex
	res  []lbRequest
	live map[string]int // rid → router, of attempts streaming now
	stop chan struct{}
	wg   sync.WaitGroup
}

func startLBLoad(b *balancer, clients int) *lbLoad {
	l := &lbLoad{b: b, hc: &http.Client{Timeout: 60 * time.Second}, live: map[string]int{}, stop: make(chan struct{})}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for j := 0; ; j++ {
				select {
				case <-l.stop:
					return
				default:
				}
				var rids []string
				r := b.do(l.hc, (c+j)%lbKinds, maxTokens, func(router int, rid string) {
					l.mu.Lock()
					l.live[rid] = router
					l.mu.Unlock()
					rids = append(rids, rid)
				})
				l.mu.Lock()
				for _, rid := range rids {
					delete(l.live, rid)
				}
				l.res = append(l.res, r)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// count is the number of requests answered so far.
func (l *lbLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.res)
}

// liveOn lists the rids of the attempts streaming on router i.
func (l *lbLoad) liveOn(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for rid, r := range l.live {
		if r == i {
			out = append(out, rid)
		}
	}
	return out
}

func (l *lbLoad) end() []lbRequest {
	close(l.stop)
	l.wg.Wait()
	return l.res
}

// waitCount waits until the load has answered n requests.
func (l *lbLoad) waitCount(t *testing.T, n int) {
	t.Helper()
	if state, ok := testbin.WaitUntil(60*time.Second, func() (bool, string) {
		k := l.count()
		return k >= n, fmt.Sprintf("%d answers", k)
	}); !ok {
		t.Fatalf("load made no progress: %s", state)
	}
}

// liveRIDs lists the rids live at a router or on a worker (its legs' rids,
// "<rid>" or "<rid>-g<n>").
func liveRIDs(hc *http.Client, url string) ([]string, error) {
	var v workerapi.RequestList
	if err := getJSON(hc, url+"/debug/requests", &v); err != nil {
		return nil, err
	}
	out := make([]string, len(v.Requests))
	for i, r := range v.Requests {
		out[i] = r.RID
	}
	return out, nil
}

// legOf says whether the worker's rid w is a leg of the router's rid r.
func legOf(w, r string) bool { return w == r || strings.HasPrefix(w, r+"-") }

// foreignLegs lists the legs on workers that belong to none of the
// router's requests. The router's list is read before and after the
// workers' (a request that starts or ends in between is in one of them).
func foreignLegs(hc *http.Client, router string, ws ...*node) ([]string, error) {
	before, err := liveRIDs(hc, router)
	if err != nil {
		return nil, err
	}
	var legs []string
	for _, w := range ws {
		rids, err := liveRIDs(hc, w.url())
		if err != nil {
			return nil, err
		}
		for _, rid := range rids {
			legs = append(legs, w.name+" "+rid)
		}
	}
	after, err := liveRIDs(hc, router)
	if err != nil {
		return nil, err
	}
	known := append(before, after...)
	var out []string
next:
	for _, l := range legs {
		for _, r := range known {
			if legOf(l[strings.IndexByte(l, ' ')+1:], r) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// TestTwoRoutersOneKilled: two routers follow the same etcd fleet (one
// prefill and one decode worker) and share nothing else; clients spread
// seeded streamed requests over both, as a load balancer would (round
// robin; a request that fails sets its router aside and is retried once on
// the other, from scratch). One router is SIGKILLed under load, with a
// long stream in flight on it. Every request completes; the only requests
// retried are those in flight on the dead router (or refused by it at
// connect, never reaching it); the workers abort the dead router's legs
// within legsGoneBound of the kill, and hold nothing once the load ends;
// every answer, from either router, first attempt or retry, equals the one
// a single router gives.
func TestTwoRoutersOneKilled(t *testing.T) {
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
	disc := []string{"--discovery", "etcd", "--etcd-endpoints", srv.Endpoint()}
	r0 := ps.router(disc...)
	r0.name = "router-0"
	ps.start(r0)
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	waitWorkers(t, hc, r0.url(), 30*time.Second, readyNames(p0, d0)...)

	// The reference answers, from router-0 alone, while router-1 starts.
	type ref struct {
		kind, n int
		a       attempt
	}
	refs := make(chan ref, lbKinds+1)
	streams := &http.Client{Timeout: 60 * time.Second}
	defer streams.CloseIdleConnections()
	for k := range lbKinds + 1 {
		go func() {
			n := maxTokens
			if k == lbKinds {
				n = lbLongTokens
			}
			refs <- ref{k, n, streamAttempt(streams, []string{r0.url()}, 0, lbBody(k, n), nil)}
		}()
	}
	r1 := ps.router(disc...)
	r1.name = "router-1"
	ps.start(r1)
	waitWorkers(t, hc, r1.url(), 30*time.Second, readyNames(p0, d0)...)
	want := map[[2]int]string{}
	for range lbKinds + 1 {
		r := <-refs
		if r.a.err != "" || r.a.tokens != r.n {
			t.Fatalf("reference answer of kind %d: %d of %d tokens, error %q", r.kind, r.a.tokens, r.n, r.a.err)
		}
		want[[2]int{r.kind, r.n}] = r.a.text
	}
	// Distinct answers, or comparing to them would prove little.
	seen := map[string]bool{}
	for _, text := range want {
		if seen[text] {
			t.Fatalf("two kinds of request have the same reference answer %q", text)
		}
		seen[text] = true
	}

	routers := []*node{r0, r1}
	b := newBalancer(r0.url(), r1.url())
	const dead = 1
	l := startLBLoad(b, 8)
	l.waitCount(t, 16)
	// A long stream on the router to be killed: it is in flight at the
	// kill whatever the load's timing.
	long := make(chan lbRequest, 1)
	longRID := make(chan string, 1)
	longStart := time.Now()
	go func() {
		lb := newBalancer(r0.url(), r1.url())
		lb.next.Store(uint64(dead - 1)) // its first pick is router-1
		long <- lb.do(streams, lbKinds, lbLongTokens, func(router int, rid string) {
			if router == dead {
				longRID <- rid
			}
		})
	}()
	select {
	case <-longRID:
	case <-time.After(30 * time.Second):
		t.Fatal("the long stream sent no token within 30 s")
	}
	// The kill lands mid-stream for some of the load too.
	var liveAtKill []string
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		liveAtKill = l.liveOn(dead)
		return len(liveAtKill) >= 2, fmt.Sprintf("%d streaming on %s", len(liveAtKill), r1.name)
	}); !ok {
		t.Fatalf("the load does not stream on %s: %s", r1.name, state)
	}
	// The probe sees the legs of router-1's requests on the workers.
	if foreign, err := foreignLegs(hc, r0.url(), p0, d0); err != nil || len(foreign) == 0 {
		t.Fatalf("before the kill, the workers hold no leg of %s's requests (%v)", r1.name, err)
	}
	killAt := time.Now()
	r1.p.Kill()
	// The workers drop the dead router's legs by themselves.
	var foreign []string
	state, ok := testbin.WaitUntil(legsGoneBound, func() (bool, string) {
		var err error
		if foreign, err = foreignLegs(hc, r0.url(), p0, d0); err != nil {
			return false, err.Error()
		}
		return len(foreign) == 0, fmt.Sprintf("legs of no live request at %s: %v", r0.name, foreign)
	})
	legsGone := time.Since(killAt)
	if end := longStart.Add(lbLongTokens * decodeMS * time.Millisecond); !killAt.Add(legsGoneBound).Before(end) {
		t.Fatalf("the long stream would have ended by %s, before the bound on its legs' abort (%s after the kill)",
			end.Sub(killAt).Round(time.Millisecond), legsGoneBound)
	}
	if !ok {
		t.Errorf("the workers still hold the killed router's legs %s after the kill: %s", legsGone.Round(time.Millisecond), state)
	} else {
		t.Logf("the workers held no leg of the killed router %s after the kill", legsGone.Round(time.Millisecond))
	}
	after := l.count()
	l.waitCount(t, after+16)
	rs := l.end()
	var longReq lbRequest
	select {
	case longReq = <-long:
	case <-time.After(30 * time.Second):
		t.Fatal("the long stream's retry did not end within 30 s")
	}
	rs = append(rs, longReq)

	// Every request completes, and its answer is the reference.
	retried, inFlight, refused := 0, 0, 0
	served := make([]int, len(routers))
	for _, r := range rs {
		a := r.last()
		n := maxTokens
		if r.kind == lbKinds {
			n = lbLongTokens
		}
		if a.err != "" {
			t.Errorf("request of kind %d failed on %s after %d attempts: %s", r.kind, routers[a.router].name, len(r.attempts), a.err)
			continue
		}
		served[a.router]++
		if a.tokens != n || a.text != want[[2]int{r.kind, n}] {
			t.Errorf("request of kind %d on %s (attempt %d): %d tokens, text %q, want %d tokens, %q",
				r.kind, routers[a.router].name, len(r.attempts), a.tokens, a.text, n, want[[2]int{r.kind, n}])
		}
		if len(r.attempts) == 1 {
			continue
		}
		retried++
		first := r.attempts[0]
		switch {
		case first.router != dead:
			t.Errorf("a request was retried after failing on %s, which was not killed: %s", routers[first.router].name, first.err)
		case first.refused && !first.start.Before(killAt):
			refused++ // never reached a router
		case first.refused:
			inFlight++ // reached the router, which died before its first byte
		case !first.start.Before(killAt):
			t.Errorf("a request sent to %s after its kill got an answer that broke: %s", routers[first.router].name, first.err)
		default:
			inFlight++
			if !strings.HasPrefix(want[[2]int{r.kind, n}], first.text) {
				t.Errorf("the part answered by the killed router, %q, does not begin the reference %q", first.text, want[[2]int{r.kind, n}])
			}
		}
	}
	if len(longReq.attempts) != 2 || longReq.attempts[0].router != dead {
		t.Errorf("the long stream had %d attempts, the first on %s; want it cut by the kill and retried", len(longReq.attempts),
			routers[longReq.attempts[0].router].name)
	}
	t.Logf("%d requests: %d served by %s, %d by %s; %d retried: %d in flight on the killed router (%d of the load streaming at the kill, and the long one), %d refused at connect after the kill",
		len(rs), served[0], r0.name, served[1], r1.name, retried, inFlight, len(liveAtKill), refused)
	// The survivor saw no worker fail: the dead router's aborted legs
	// cost its own requests nothing.
	if m := metricSum(t, hc, r0.url(), "pdserve_router_migrations_total"); m != 0 {
		t.Errorf("%s migrated %v requests; no worker failed", r0.name, m)
	}
	quiescent(t, hc, r0.url(), p0, d0)
}

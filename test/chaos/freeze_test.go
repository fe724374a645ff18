package chaos

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/router"
)

// routerHealthInterval, routerCheckTimeout and routerFailureThreshold are
// the router's --health-interval, --health-check-timeout and
// --health-failure-threshold (its default) in
// TestFrozenWorkerFailsItsRequests.
const (
	routerHealthInterval   = 250 * time.Millisecond
	routerCheckTimeout     = time.Second
	routerFailureThreshold = 3
	// routerMigrationWait is the router's --migration-wait.
	routerMigrationWait = 2 * time.Second
)

// TestFrozenWorkerFailsItsRequests: a worker that stops without closing
// its connections (SIGSTOP, like a hung host or a partition) fails the
// requests that depend on it within a health check or a KV lease and a
// probe, instead of pinning them until it comes back; once it is resumed
// nothing stays live or allocated on any worker, and requests succeed.
func TestFrozenWorkerFailsItsRequests(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		freeze string // role of the frozen worker
		// phase is when to freeze: "decoding" once the client has read
		// a token, "prefilling" once prefill computes the prompt.
		phase string
		// bound is how soon the client must get its error.
		bound time.Duration
	}{
		// Only the router can notice: prefill's part is over, and the
		// stream just stops. The worker is not ready after
		// routerFailureThreshold checks in a row time out (a check does
		// not overlap the one before), which ends the leg; the request,
		// whose output had begun, would be continued on another decode
		// worker, and waits --migration-wait for one before it fails.
		{"decode frozen while decoding", "decode", "decoding", routerFailureThreshold*(routerHealthInterval+routerCheckTimeout) + routerMigrationWait},
		// Prefill loses the KV connection within a lease and fails its
		// leg; the router probes the pair before retrying, finds decode
		// down, and has no other pair.
		{"decode frozen while prefill computes", "decode", "prefilling", chaosDeadlines.lease() + router.ProbeTimeout},
		{"prefill frozen while it computes", "prefill", "prefilling", chaosDeadlines.lease() + router.ProbeTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := newProcSet(t)
			common := slices.Concat(simFlags(20), chaosDeadlines.flags())
			// 2 ms per prompt token: a 1500-token prompt computes for ~3 s.
			slow := []string{"--sim-prefill-ms-per-token", "2"}
			pw := ps.worker("prefill", "prefill", slices.Concat(common, slow)...)
			dw := ps.worker("decode", "decode", common...)
			rw := ps.worker("router", "router", slices.Concat(simFlags(20), []string{"--prefill", pw.url(), "--decode", dw.url(),
				"--health-interval", routerHealthInterval.String(), "--health-check-timeout", routerCheckTimeout.String(),
				"--migration-wait", routerMigrationWait.String()})...)
			for _, w := range []*procWorker{pw, dw, rw} {
				ps.mustStart(w)
			}
			cl := newClient()
			defer cl.close()
			if err := routerReady(cl.hc, rw.url(), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			target := map[string]*procWorker{"prefill": pw, "decode": dw}[tc.freeze]

			type outcome struct {
				status int
				err    string // the stream's error event, or a transport error
				done   bool   // the stream ended with [DONE] and no error
				at     time.Time
			}
			firstToken := make(chan struct{})
			ended := make(chan outcome, 1)
			go func() {
				body := fmt.Sprintf(`{"prompt":%s,"max_tokens":500,"ignore_eos":true,"stream":true}`,
					strconv.Quote(strings.Repeat("frozen ", 214)))
				resp, err := cl.hc.Post(rw.url()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					ended <- outcome{err: err.Error(), at: time.Now()}
					return
				}
				defer resp.Body.Close()
				o := outcome{status: resp.StatusCode}
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
				first := true
				for sc.Scan() {
					line := sc.Text()
					switch {
					case resp.StatusCode != http.StatusOK:
						o.err += line
					case strings.Contains(line, `"error"`):
						o.err = line
					case line == "data: [DONE]":
						o.done = o.err == ""
					case strings.HasPrefix(line, "data: ") && first:
						first = false
						close(firstToken)
					}
				}
				if err := sc.Err(); err != nil && o.err == "" {
					o.err = err.Error()
				}
				o.at = time.Now()
				ended <- o
			}()

			switch tc.phase {
			case "decoding":
				select {
				case <-firstToken:
				case o := <-ended:
					t.Fatalf("request ended before its first token: %+v", o)
				case <-time.After(30 * time.Second):
					t.Fatal("no first token within 30 s")
				}
			case "prefilling":
				if state, ok := waitUntil(10*time.Second, func() (bool, string) {
					live, err := liveRequests(cl.hc, pw.url())
					if err != nil {
						return false, err.Error()
					}
					for _, r := range live.Requests {
						if r.Stage == "prefilling" {
							return true, ""
						}
					}
					return false, describeRequests(live.Requests)
				}); !ok {
					t.Fatalf("prefill never computed the prompt: %s", state)
				}
			}
			frozenAt := time.Now()
			if err := target.p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = target.p.Signal(syscall.SIGCONT)
				}
			}
			defer resume()

			limit := tc.bound + clientSlack
			select {
			case o := <-ended:
				took := o.at.Sub(frozenAt)
				t.Logf("client answer %s after the freeze: status %d, error %s", took.Round(time.Millisecond), o.status, o.err)
				if o.done || o.err == "" {
					t.Fatalf("the request succeeded although its %s worker was frozen: %+v", tc.freeze, o)
				}
				if took > limit {
					t.Errorf("the client waited %s for its error, want ≤ %s", took, limit)
				}
			case <-time.After(limit + 10*time.Second):
				t.Fatalf("no answer %s after freezing the %s worker (bound %s): the request is pinned", limit+10*time.Second, tc.freeze, limit)
			}

			resume()
			d := &procDeployment{ps: ps, workers: []*procWorker{pw, dw}, router: rw}
			if bad := d.quiet(cl.hc, 10*time.Second); len(bad) > 0 {
				t.Fatalf("after the worker resumed:\n%s", strings.Join(bad, "\n"))
			}
			if err := routerReady(cl.hc, rw.url(), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			resp, err := cl.hc.Post(rw.url()+"/v1/completions", "application/json",
				strings.NewReader(`{"prompt":"after the freeze","max_tokens":4}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("a request after the worker resumed: status %d", resp.StatusCode)
			}
		})
	}
}

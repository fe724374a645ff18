package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/planner/etcdscale"
	etcdreg "github.com/pdserve/pdserve/internal/registry/etcd"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// TestPlannerWritesDesiredToEtcd: `pdserve router --discovery etcd
// --planner --planner-scaler etcd` over 1P1D under a prefill-bound load
// (long prompts, short answers) writes more prefill workers to
// <prefix>planner/desired; a second prefill worker started as an operator's
// tooling would (registered in the same etcd) joins, the planner holds, and
// no request fails.
func TestPlannerWritesDesiredToEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes and an etcd")
	}
	t.Parallel()
	srv := etcdtest.Start(t)
	ps := newProcs(t)
	reg := []string{"--etcd-endpoints", srv.Endpoint(), "--etcd-prefix", "/fleet-p/"}
	slow := append([]string{"--sim-prefill-ms-per-token", "0.1"}, reg...)
	p0, d0 := ps.worker("prefill-0", "prefill", slow...), ps.worker("decode-0", "decode", reg...)
	ps.start(p0)
	ps.start(d0)
	rt := ps.router(append([]string{"--discovery", "etcd", "--planner", "--planner-scaler", "etcd",
		"--ttft-slo", "300ms", "--planner-interval", "250ms", "--planner-window", "2s", "--planner-dwell", "1s",
		"--planner-max-prefill", "2", "--log-level", "info"}, reg...)...)
	ps.start(rt)
	hc := &http.Client{Timeout: 30 * time.Second}
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, d0)...)

	// Six clients, ~1,000-token prompts at 0.1 ms a token: one prefill
	// worker is busy all the time.
	var (
		mu   sync.Mutex
		sent int
		bad  []string
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	prompt := strings.Repeat("word ", 150)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":16,"ignore_eos":true,"stream":%v}`, fmt.Sprint(i, k, " ", prompt), (i+k)%2 == 0)
				resp, err := hc.Post(rt.url()+"/v1/completions", "application/json", strings.NewReader(body))
				var out []byte
				if err == nil {
					out, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<16))
					resp.Body.Close()
				}
				mu.Lock()
				sent++
				if err != nil || resp.StatusCode != http.StatusOK {
					bad = append(bad, fmt.Sprintf("%v %.300s", err, out))
				}
				mu.Unlock()
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
		if len(bad) > 0 {
			t.Errorf("%d of %d requests failed; first: %s", len(bad), sent, bad[0])
		}
	}()

	cli, _, err := etcdreg.Client(etcdreg.Config{Endpoints: []string{srv.Endpoint()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var want etcdscale.Desired
	if state, ok := testbin.WaitUntil(60*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, ok, err := etcdscale.Read(ctx, cli, "/fleet-p/")
		if err != nil || !ok {
			var st struct {
				Last struct {
					Reason string          `json:"reason"`
					Inputs json.RawMessage `json:"inputs"`
				} `json:"last"`
			}
			_ = getJSON(hc, rt.url()+"/planner", &st)
			st.Last.Reason += " " + string(st.Last.Inputs)
			mu.Lock()
			defer mu.Unlock()
			return false, fmt.Sprintf("nothing written yet (%v); the planner: %s; %d requests sent, %d failed", err, st.Last.Reason, sent, len(bad))
		}
		want = d
		return d.Prefill >= 2, fmt.Sprintf("%+v", d)
	}); !ok {
		t.Fatalf("no second prefill worker asked for within 60 s: %s", state)
	}
	host, _ := os.Hostname()
	if want.Router != net.JoinHostPort(host, strconv.Itoa(rt.port)) || want.Decode < 1 || !strings.Contains(want.Reason, "scale 1P:1D → 2P:") {
		t.Errorf("written: %+v", want)
	}
	if at, err := time.Parse(time.RFC3339, want.At); err != nil || time.Since(at) > time.Minute || at.Location() != time.UTC {
		t.Errorf("at %q: %v", want.At, err)
	}

	// The operator's tooling starts the worker asked for; the planner then
	// sees 2P and holds, with no error recorded.
	p1 := ps.worker("prefill-1", "prefill", slow...)
	ps.start(p1)
	waitWorkers(t, hc, rt.url(), 30*time.Second, readyNames(p0, p1, d0)...)
	var st struct {
		Actuator string `json:"actuator"`
		Mode     string `json:"mode"`
		Last     struct {
			Prefill int    `json:"prefill"`
			Action  string `json:"action"`
			Reason  string `json:"reason"`
		} `json:"last"`
		Changes []struct {
			Action string `json:"action"`
			Error  string `json:"error"`
		} `json:"changes"`
	}
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		if err := getJSON(hc, rt.url()+"/planner", &st); err != nil {
			return false, err.Error()
		}
		b, _ := json.Marshal(st.Last)
		return st.Last.Prefill == 2, string(b)
	}); !ok {
		t.Fatalf("the planner does not see the second prefill worker: %s", state)
	}
	if st.Actuator != "etcd" || st.Mode != "scale" || len(st.Changes) == 0 {
		t.Fatalf("GET /planner: %+v", st)
	}
	for _, ch := range st.Changes {
		if ch.Error != "" {
			t.Errorf("a change failed: %s", ch.Error)
		}
	}
	if n := metricSum(t, hc, rt.url(), "pdserve_planner_actions_total", `result="ok"`); n < 1 {
		t.Errorf("pdserve_planner_actions_total{result=ok} = %v", n)
	}
}

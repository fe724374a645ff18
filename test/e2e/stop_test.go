package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/outcome"
)

// TestStopStringEndsOK: a completion that a stop string ends is a normal
// finish on the worker that generated it, in PD mode (the decode worker)
// and in plain mode (the colocated worker): outcome ok, no aborted_client
// and no tombstone. The router aborts the leg with reason stop before it
// hangs up on it, so the worker never reads the hang-up as a client that
// went away.
func TestStopStringEndsOK(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"pd", "plain"} {
		t.Run(mode, func(t *testing.T) {
			o := cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1}
			if mode == "plain" {
				o = cluster.Options{ColocatedWorkers: 1}
			}
			o.NewModel = simFactory(sim.Config{})
			o.Worker = cluster.WorkerOptions{Machine: testMachine(), KVCacheMemory: 64 << 20}
			o.HealthInterval = 100 * time.Millisecond
			c, err := cluster.Up(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				assertQuiescent(t, c.Workers()...)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := c.Shutdown(ctx); err != nil {
					t.Errorf("shutdown: %v", err)
				}
			})
			gen := c.Colocated
			if mode == "pd" {
				gen = c.Decode
			}
			w := workerGatherer{gen[0]}
			const n = 5
			for i := range n {
				for _, stream := range []bool{false, true} {
					// Greedy, so the text is fixed; the simulated model's text
					// has a space every few characters, well before 200 tokens.
					body := map[string]any{"prompt": fmt.Sprintf("stop string %d", i), "max_tokens": 200,
						"ignore_eos": true, "temperature": 0, "stop": []string{" "}, "stream": stream}
					status, out := postJSON(t, c.URL()+"/v1/completions", body)
					if status != http.StatusOK {
						t.Fatalf("%d %s", status, out)
					}
					if stream {
						if !strings.Contains(string(out), `"finish_reason":"stop"`) {
							t.Fatalf("streamed answer has no finish_reason stop: %s", out)
						}
						continue
					}
					comp := decodeCompletion(t, out)
					if comp.Choices[0].FinishReason != "stop" || strings.Contains(comp.Choices[0].Text, " ") {
						t.Fatalf("want text cut at the stop string with finish_reason stop, got %+v", comp.Choices[0])
					}
				}
			}
			finished := func(o outcome.Outcome) float64 {
				return counterValue(t, w, "pdserve_requests_finished_total", "outcome", o.String())
			}
			waitFor(t, 5*time.Second, "the worker finished every request", func() (bool, string) {
				total := 0.0
				for _, o := range outcome.Worker() {
					total += finished(o)
				}
				return total >= 2*n, debugCounters(t, c)
			})
			if ok, ac := finished(outcome.OK), finished(outcome.AbortedClient); ok != 2*n || ac != 0 {
				t.Fatalf("worker outcomes: ok %v, aborted_client %v; want %d and 0 (%s)", ok, ac, 2*n, debugCounters(t, c))
			}
			if tombs := counterValue(t, w, "pdserve_rooms", "kind", "tombstone"); tombs != 0 {
				t.Fatalf("the worker left %v tombstones for requests that ended normally", tombs)
			}
		})
	}
}

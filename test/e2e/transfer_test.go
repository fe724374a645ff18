package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// TestTransferDeadlineMeasuresProgress: a busy prefill worker on a slow
// model batches two prompts with chunked prefill (256 tokens per forward,
// ~1 s each), and decode has a short --transfer-timeout (600 ms). r1's
// first 256 tokens are one forward; its last 4 share the next forward with
// r2's first 252, and r2's rest is a third: each request's KV reaches
// decode in chunks a forward apart. A transfer deadline from the first
// chunk failed them with 504 timeout_transfer while prefill was alive and
// computing them. Decode's deadline now runs from the last progress (a
// chunk, or prefill renewing the room every 250 ms heartbeat), so both
// succeed.
func TestTransferDeadlineMeasuresProgress(t *testing.T) {
	t.Parallel()
	slow, err := sim.New(sim.Config{Geometry: testGeometry, ContextLen: testContext, PrefillPerToken: 4 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := startPair(t, func(o *cluster.WorkerOptions) {
		o.Model = slow
		o.Machine.MaxPrefillTokens = 256 // a forward of 256 tokens takes ~1 s
	}, func(o *cluster.WorkerOptions) {
		o.Machine.TransferTimeout = 600 * time.Millisecond
	})
	type answer struct {
		status int
		body   []byte
	}
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	send := func(i, n int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{
				"prompt": strings.Repeat("k", n), "max_tokens": 2, "ignore_eos": true})
			answers[i] = answer{status, body}
		}()
	}
	// r1 (260 tokens) is computing before r2 (600 tokens) arrives.
	send(0, 260)
	waitFor(t, 5*time.Second, "r1 prefilling", func() (bool, string) {
		live, _ := c.Prefill[0].Worker.Requests(time.Second)
		return len(live) == 1 && live[0].Stage == lifecycle.StagePrefilling.String(), fmt.Sprintf("%+v", live)
	})
	send(1, 600)
	wg.Wait()
	for i, a := range answers {
		if a.status != http.StatusOK {
			t.Fatalf("r%d: %d %s", i+1, a.status, a.body)
		}
	}
}

package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// TestOptimisticPrefill runs optimistic prefill end to end (TCP KV channel,
// HTTP legs) and checks that what decode generates from optimistically
// computed KV is what it generates without optimism, request for request,
// and that prefill's metrics count it:
//
//   - forced: the test hook holds every ROOM_OPEN back until the
//     optimistic prefill has ended, so each request parks before its room
//     opens and is sent on the held ROOM_OPEN, whatever the legs' timing;
//   - slow decode: decode admits every leg 500 ms late (a busy decode),
//     so prefill computes the 200-token prompts (100 ms) before the rooms
//     open, with room to spare on a loaded CI machine (at 200 ms against
//     300 one prompt in eight once finished late there).
func TestOptimisticPrefill(t *testing.T) {
	t.Parallel()
	prompts := make([]string, 8)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("%03d optimistic prefill computes the KV before decode opens the room ", i)
		for len(prompts[i]) < 200 {
			prompts[i] += "and parks it "
		}
		prompts[i] = prompts[i][:200]
	}
	complete := func(c *cluster.Cluster) []string {
		var out []string
		for _, p := range prompts {
			status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 8,
				"temperature": 0.7, "seed": 3, "ignore_eos": true})
			if status != http.StatusOK {
				t.Fatalf("%d %s", status, body)
			}
			out = append(out, decodeCompletion(t, body).Choices[0].Text)
		}
		return out
	}
	want := complete(startPair(t, nil, nil))
	slowPrefill := func(o *cluster.WorkerOptions) {
		m, err := sim.New(sim.Config{Geometry: testGeometry, ContextLen: testContext, PrefillPerToken: 500 * time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		o.Model = m
	}
	for _, tc := range []struct {
		name       string
		modP, modD func(*cluster.WorkerOptions)
	}{
		{"forced", func(o *cluster.WorkerOptions) {
			o.Machine.OptimisticAttempts = 1
			o.Machine.ForceOptimistic = lifecycle.ForceFraction(1)
		}, nil},
		{"slow decode", func(o *cluster.WorkerOptions) {
			slowPrefill(o)
			o.Machine.OptimisticAttempts = 1
		}, func(o *cluster.WorkerOptions) { o.AdmissionDelay = 500 * time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startPair(t, tc.modP, tc.modD)
			got := complete(c)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("prompt %d: %q with optimistic prefill, %q without", i, got[i], want[i])
				}
			}
			p := workerGatherer{c.Prefill[0]}
			opt := func(o string) float64 { return counterValue(t, p, "pdserve_optimistic_prefill_total", "outcome", o) }
			n := float64(len(prompts))
			waitFor(t, 5*time.Second, "every optimistic prefill ended", func() (bool, string) {
				return opt("started") == n && opt("sent")+opt("fell_back") == n,
					fmt.Sprintf("started %v parked %v sent %v fell_back %v", opt("started"), opt("parked"), opt("sent"), opt("fell_back"))
			})
			if opt("parked") != n || opt("sent") != n {
				t.Fatalf("want every request parked and sent: parked %v, sent %v", opt("parked"), opt("sent"))
			}
			for _, s := range []string{"computing", "parked"} {
				if b := counterValue(t, p, "pdserve_optimistic_prefill_kv_bytes", "state", s); b != 0 {
					t.Fatalf("%v bytes of optimistic KV %s after every request ended", b, s)
				}
			}
		})
	}
}

package router

import (
	"testing"
)

// TestLocalDecision: the table of the per-request disaggregation rule —
// prompt length, what decode caches and prefill's backlog decide the path.
func TestLocalDecision(t *testing.T) {
	prefill := func(tokens ...int) []Candidate {
		var out []Candidate
		for _, n := range tokens {
			out = append(out, Candidate{Load: Load{Tokens: n}})
		}
		return out
	}
	cases := []struct {
		name      string
		min       int
		prompt    int
		cached    int
		prefills  []Candidate
		local     bool
		threshold int
	}{
		{name: "off", min: 0, prompt: 1, prefills: prefill(0), threshold: 0},
		{name: "short, prefill idle", min: 128, prompt: 100, prefills: prefill(0), local: true, threshold: 128},
		{name: "one below", min: 128, prompt: 127, prefills: prefill(0), local: true, threshold: 128},
		{name: "at the threshold", min: 128, prompt: 128, prefills: prefill(0), threshold: 128},
		{name: "long, prefill idle", min: 128, prompt: 1000, prefills: prefill(0), threshold: 128},
		{name: "long, mostly cached on decode", min: 128, prompt: 1000, cached: 900, prefills: prefill(0), local: true, threshold: 128},
		{name: "long, half cached", min: 128, prompt: 1000, cached: 500, prefills: prefill(0), threshold: 128},
		{name: "medium, prefill busy", min: 128, prompt: 300, prefills: prefill(250), local: true, threshold: 378},
		{name: "medium, prefill barely busy", min: 128, prompt: 300, prefills: prefill(100), threshold: 228},
		{name: "least loaded prefill counts", min: 128, prompt: 300, prefills: prefill(5000, 250, 9000), local: true, threshold: 378},
		{name: "one idle prefill: no boost", min: 128, prompt: 300, prefills: prefill(5000, 0), threshold: 128},
		{name: "boost capped", min: 128, prompt: 600, prefills: prefill(100_000), threshold: 512},
		{name: "under the cap", min: 128, prompt: 511, prefills: prefill(100_000), local: true, threshold: 512},
		{name: "no prefill listed", min: 128, prompt: 100, local: true, threshold: 128},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ids := make([]int32, c.prompt)
			req := &PickRequest{InputIDs: ids, cached: c.cached}
			d := decideLocal(c.min, req, c.prefills)
			if d.local != c.local || d.threshold != c.threshold || d.uncached != c.prompt-c.cached {
				t.Fatalf("got %+v (%s); want local %v, threshold %d", d, d, c.local, c.threshold)
			}
		})
	}
}

func TestLocalThreshold(t *testing.T) {
	for _, c := range []struct{ min, backlog, want int }{
		{0, 1000, 0}, {-5, 0, 0}, {64, 0, 64}, {64, -10, 64}, {64, 100, 164}, {64, 192, 256}, {64, 10_000, LocalBoostCap * 64},
	} {
		if got := LocalThreshold(c.min, c.backlog); got != c.want {
			t.Errorf("LocalThreshold(%d, %d) = %d, want %d", c.min, c.backlog, got, c.want)
		}
	}
}

package router

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/workerapi"
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
		// Huge thresholds saturate (always local), never wrap around.
		{math.MaxInt / LocalBoostCap, math.MaxInt, LocalBoostCap * (math.MaxInt / LocalBoostCap)},
		{math.MaxInt/LocalBoostCap + 1, 0, math.MaxInt}, {1 << 62, 0, math.MaxInt}, {math.MaxInt, math.MaxInt, math.MaxInt},
	} {
		if got := LocalThreshold(c.min, c.backlog); got != c.want {
			t.Errorf("LocalThreshold(%d, %d) = %d, want %d", c.min, c.backlog, got, c.want)
		}
	}
}

// TestLocalPath: the router with --disagg-min-prompt-tokens 64 in front of
// fake workers, the prefill worker's load report setting the backlog: each
// request takes the path the rule gives (a local leg reaches one decode
// worker, without a room or a prefill address; nothing reaches prefill),
// counted under its path. While admission refuses every prefill worker, a
// request short enough still goes local instead of being shed; a decode
// worker of an older pdserve (no "local" feature) is never sent one.
func TestLocalPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 1, 0, func(c *Config) { c.DisaggMinPromptTokens = 64 })
		defer tr.r.Close()
		p, d := tr.prefill[0], tr.decode[0]
		send := func(n int) answer {
			t.Helper()
			return generateN(t.Context(), tr.r, fmt.Sprintf("r%d", len(legsOf(d))), n)
		}
		steps := []struct {
			name   string
			load   workerapi.Load // the prefill worker's report
			prompt int
			path   string // "" : shed (429)
		}{
			{"short, prefill idle", workerapi.Load{}, 40, metrics.PathLocal},
			{"medium, prefill idle", workerapi.Load{}, 100, metrics.PathPD},
			{"medium, prefill backlog 500", workerapi.Load{PromptTokens: 500}, 100, metrics.PathLocal},
			{"long, prefill backlog 500 (cap 256)", workerapi.Load{PromptTokens: 500}, 300, metrics.PathPD},
			{"medium, prefill saturated", workerapi.Load{PromptTokens: 5000, Queued: 8}, 100, metrics.PathLocal},
			{"long, prefill saturated", workerapi.Load{PromptTokens: 5000, Queued: 8}, 300, ""},
		}
		for _, s := range steps {
			p.reportLoad(s.load)
			advance(150 * time.Millisecond) // one load poll
			pBefore, dBefore := len(legsOf(p)), len(legsOf(d))
			if err := tr.r.Admit(); err != nil {
				// The front end's early admission, before the prompt is
				// read, leaves the decision to Generate while a decode
				// worker may serve a prompt alone.
				t.Fatalf("%s: Admit: %v", s.name, err)
			}
			a := send(s.prompt)
			synctest.Wait() // a PD request's prefill leg may reach its worker after decode's answer
			if s.path == "" {
				isShed(t, a, "prefill_queue")
				continue
			}
			if a.err != nil {
				t.Fatalf("%s: %+v", s.name, a.err)
			}
			dLegs := legsOf(d)
			if len(dLegs) != dBefore+1 {
				t.Fatalf("%s: decode received %d legs, want 1", s.name, len(dLegs)-dBefore)
			}
			leg := dLegs[len(dLegs)-1]
			local := len(legsOf(p)) == pBefore
			if local != (s.path == metrics.PathLocal) || local != (leg.Room == "" && leg.PrefillKVAddr == "") {
				t.Errorf("%s: prefill got %d legs, decode's leg room %q kv %q; want path %s",
					s.name, len(legsOf(p))-pBefore, leg.Room, leg.PrefillKVAddr, s.path)
			}
		}
		if l, pd := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok", "path", "local"),
			counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok", "path", "pd"); l != 3 || pd != 2 {
			t.Errorf("requests ok: local %v, pd %v; want 3 and 2", l, pd)
		}
		// A decode worker without the feature takes PD legs only.
		d.setOld()
		p.reportLoad(workerapi.Load{})
		dw := tr.r.set.Workers(workerapi.RoleDecode.String())[0]
		for i := 0; hasFeature(dw, workerapi.FeatureLocal); i++ {
			if i == 10 {
				t.Fatal("the decode worker's info still lists the local feature after 10 s of health checks")
			}
			advance(time.Second) // a health check reads its info
		}
		pBefore := len(legsOf(p))
		a := send(40)
		synctest.Wait()
		if a.err != nil || len(legsOf(p)) != pBefore+1 {
			t.Fatalf("short prompt, decode without the local feature: %+v, prefill legs %d", a.err, len(legsOf(p))-pBefore)
		}
	})
}

// legsOf is the legs w received.
func legsOf(w *fakeWorker) []workerapi.GenerateBody {
	legs, _, _ := w.received()
	return legs
}

// TestLocalContinuedOnAnotherDecode: a local request whose decode worker
// breaks off its stream after 2 tokens reached the client is continued,
// locally again, on the other decode worker (the prompt and those tokens
// as input, continued_tokens 2, no room); the client gets the
// uninterrupted output and the prefill worker sees nothing.
func TestLocalContinuedOnAnotherDecode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(t, 1, 2, 0, func(c *Config) { c.DisaggMinPromptTokens = 64 })
		defer tr.r.Close()
		for _, d := range tr.decode {
			// A local leg carries no gen: the continuation is told by its
			// continued tokens.
			d.setLeg(func(ctx context.Context, b workerapi.GenerateBody, ab <-chan workerapi.AbortBody, w *legWriter) {
				if b.ContinuedTokens == 0 {
					scripted(2)(ctx, b, ab, w)
					return
				}
				scripted(-1)(ctx, b, ab, w)
			})
		}
		a := generateReq(t.Context(), tr.r, migrationRequest("rid"))
		if a.err != nil || a.finish != "length" || !slices.Equal(a.tokens, uninterrupted(6)) {
			t.Fatalf("got %+v, want the uninterrupted %v", a, uninterrupted(6))
		}
		if legs := legsOf(tr.prefill[0]); len(legs) != 0 {
			t.Fatalf("prefill received %d legs", len(legs))
		}
		var cont []workerapi.GenerateBody
		for _, d := range tr.decode {
			if n := len(legsOf(d)); n != 1 {
				t.Errorf("%s got %d legs, want 1: the continuation goes to the other decode worker", d.host, n)
			}
			for _, l := range legsOf(d) {
				if l.Room != "" || l.PrefillKVAddr != "" {
					t.Errorf("%s: leg %s with room %q, kv %q: not local", d.host, l.RID, l.Room, l.PrefillKVAddr)
				}
				if l.ContinuedTokens > 0 {
					cont = append(cont, l)
				}
			}
		}
		if len(cont) != 1 || cont[0].ContinuedTokens != 2 || !slices.Equal(cont[0].InputIDs, []int32{1, 2, 3, 100, 101}) || cont[0].RID != "rid-g2" {
			t.Fatalf("continuations %+v", cont)
		}
		if n := counter(t, tr.reg, "pdserve_router_requests_total", "outcome", "ok", "path", "local"); n != 1 {
			t.Errorf("requests ok on the local path: %v, want 1", n)
		}
		if n := counter(t, tr.reg, "pdserve_router_migrations_total", "cause", "worker_stream_broken"); n != 1 {
			t.Errorf("migrations %v, want 1", n)
		}
	})
}

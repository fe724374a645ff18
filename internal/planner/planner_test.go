package planner

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gauge returns the value of family's series with role (0 if absent).
func gauge(t *testing.T, g prometheus.Gatherer, family, role string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "role" && l.GetValue() == role {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// TestEstimate checks the arithmetic of both roles' need against values
// worked by hand (see Estimate's formulas).
func TestEstimate(t *testing.T) {
	slo := SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond, Margin: 0.8}
	in := Inputs{ArrivalRate: 2, MeanPromptTokens: 1000, MeanOutputTokens: 100,
		PrefillTokensPerBusySecond: 10000,
		DecodeFit:                  Fit{Intercept: 0.005, Slope: 1e-7, Samples: 10}}
	nd, ok := Estimate(in, slo)
	if !ok {
		t.Fatalf("not ok: %+v", nd)
	}
	// Prefill: S = 1000/10000 = 0.1 s; target 0.8 s; ρmax = 1 − 0.1/0.8 =
	// 0.875; need = 2·1000/(10000·0.875) = 0.22857.
	if !near(nd.Prefill, 0.22857, 1e-4) {
		t.Errorf("prefill need %v (%s)", nd.Prefill, nd.PrefillWhy)
	}
	// Decode: ITL target 40 ms; Kmax = (0.040−0.005)/1e-7 = 350,000 tokens;
	// held = 2·(1000+50)·100·0.040 = 8,400 tokens; need 0.024.
	if !near(nd.Decode, 0.024, 1e-4) {
		t.Errorf("decode need %v (%s)", nd.Decode, nd.DecodeWhy)
	}
	// The KV pool caps a worker: 0.9·100,000 = 90,000 tokens, where a step
	// takes 5 + 9 = 14 ms: held = 2·1050·100·0.014 = 2,940; need 0.032667.
	in.DecodeKVTokens = 100000
	if nd, _ = Estimate(in, slo); !near(nd.Decode, 0.032667, 1e-4) || !strings.Contains(nd.DecodeWhy, "KV pool") {
		t.Errorf("KV-capped decode need %v (%s)", nd.Decode, nd.DecodeWhy)
	}
	// So does the batch limit: 64·1050 = 67,200 tokens, a step of 11.72 ms:
	// held = 2·1050·100·0.01172 = 2,461.2; need 0.036625.
	in.DecodeMaxRunning = 64
	if nd, _ = Estimate(in, slo); !near(nd.Decode, 0.036625, 1e-4) || !strings.Contains(nd.DecodeWhy, "batch limit") {
		t.Errorf("batch-capped decode need %v (%s)", nd.Decode, nd.DecodeWhy)
	}
	// A prompt longer than the TTFT target allows: utilization floor, said.
	in.MeanPromptTokens = 9000
	if nd, _ = Estimate(in, slo); !strings.Contains(nd.PrefillWhy, "no split meets it") || !near(nd.Prefill, 2*9000/(10000*0.05), 1e-9) {
		t.Errorf("unreachable TTFT: %v (%s)", nd.Prefill, nd.PrefillWhy)
	}
	// Nothing arriving or held: no worker needed, measured or not.
	if nd, ok := Estimate(Inputs{}, slo); !ok || nd.Prefill != 0 || nd.Decode != 0 {
		t.Errorf("no arrivals: %+v ok %v, want a need of 0", nd, ok)
	}
	// Every arrival served by decode alone: prefill needs nothing though
	// its throughput was never measured.
	if nd, ok := Estimate(Inputs{ArrivalRate: 3, MeanPromptTokens: 64, MeanOutputTokens: 500, LocalRate: 3, MeanLocalPromptTokens: 64,
		DecodeFit: Fit{Intercept: 0.005, Slope: 1e-7}}, slo); !ok || nd.Prefill != 0 || nd.Decode <= 0 {
		t.Errorf("all local: %+v ok %v", nd, ok)
	}
	// Long requests from before the window hold more KV than its arrivals
	// account for: the reports are the floor (175,000 / 350,000 = 0.5).
	held := in
	held.DecodeKVTokens, held.DecodeMaxRunning, held.DecodeKVHeld = 0, 0, 175000
	if nd, _ := Estimate(held, slo); !near(nd.Decode, 0.5, 1e-6) || !strings.Contains(nd.DecodeWhy, "tokens held (the decode workers' reports, median over the window") {
		t.Errorf("decode need with 175,000 tokens held: %v (%s)", nd.Decode, nd.DecodeWhy)
	}
	// Half the arrivals served by decode alone, with 200-token prompts:
	// prefill sees 1 req/s of (2·1000 − 1·200)/1 = 1,800 tokens; S = 0.18 s,
	// ρmax = 1 − 0.18/0.8 = 0.775; need = 1800/(10000·0.775) = 0.23226.
	local := Inputs{ArrivalRate: 2, MeanPromptTokens: 1000, MeanOutputTokens: 100, LocalRate: 1, MeanLocalPromptTokens: 200,
		PrefillTokensPerBusySecond: 10000, DecodeFit: Fit{Intercept: 0.005, Slope: 1e-7, Samples: 10}}
	if nd, _ := Estimate(local, slo); !near(nd.Prefill, 0.23226, 1e-4) || !strings.Contains(nd.PrefillWhy, "decode alone") {
		t.Errorf("prefill need with local requests %v (%s)", nd.Prefill, nd.PrefillWhy)
	}
	for _, c := range []struct {
		name string
		in   Inputs
	}{
		{"no prefill measure", Inputs{ArrivalRate: 1, MeanPromptTokens: 100, DecodeFit: Fit{Slope: 1e-7}}},
		{"no decode measure", Inputs{ArrivalRate: 1, MeanPromptTokens: 100, PrefillTokensPerBusySecond: 1}},
		{"fixed cost over the SLO", Inputs{ArrivalRate: 1, MeanPromptTokens: 100, PrefillTokensPerBusySecond: 1, DecodeFit: Fit{Intercept: 0.05, Slope: 1e-7}}},
	} {
		if nd, ok := Estimate(c.in, slo); ok {
			t.Errorf("%s: ok with %+v", c.name, nd)
		}
	}
}

// TestFitDecode recovers a line from samples on it, weights by gap count,
// and falls back to ITL ∝ K when the samples do not spread.
func TestFitDecode(t *testing.T) {
	line := func(k float64) float64 { return 0.006 + 2e-8*k }
	var s []decodeSample
	for _, k := range []float64{10000, 50000, 120000, 300000} {
		s = append(s, decodeSample{kv: k, itl: line(k), n: 50})
	}
	f, ok := fitDecode(s)
	if !ok || f.Proportional || !near(f.Intercept, 0.006, 1e-6) || !near(f.Slope, 2e-8, 1e-6) {
		t.Fatalf("fit %+v ok %v", f, ok)
	}
	// One outlier with few gaps moves the line little.
	s = append(s, decodeSample{kv: 200000, itl: 0.1, n: 1})
	if f, _ = fitDecode(s); !near(f.Slope, 2e-8, 0.2) {
		t.Errorf("a one-gap outlier moved the slope to %v", f.Slope)
	}
	same := []decodeSample{{kv: 100000, itl: 0.008, n: 20}, {kv: 101000, itl: 0.0081, n: 20}}
	if f, ok = fitDecode(same); !ok || !f.Proportional || !near(f.Slope, 0.00805/100500, 1e-3) {
		t.Errorf("unspread samples: %+v", f)
	}
	if _, ok = fitDecode(nil); ok {
		t.Error("no samples fitted")
	}
}

func TestHistogramQuantile(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		want := time.Duration(q*1000) * time.Millisecond
		if got := h.quantile(q); got < want || float64(got) > 1.1*float64(want) {
			t.Errorf("q%.2f = %v, want within 10 %% above %v", q, got, want)
		}
	}
	var old histogram
	old.add(time.Hour)
	h.add(time.Hour)
	if got := h.since(old).quantile(1); got > 1100*time.Millisecond {
		t.Errorf("since did not drop the old sample: max %v", got)
	}
	if (histogram{}).quantile(0.9) != 0 {
		t.Error("empty histogram has a quantile")
	}
}

// world is a fleet whose workers behave by known laws: a prefill worker
// prefills mu tokens per second of busy time, a decode worker's ITL is
// a + b·K. Each second it feeds the Recorder what a router would see.
type world struct {
	rec     *Recorder
	clk     *clocktesting.FakeClock
	mu      sync.Mutex
	workers []WorkerLoad
	mu0, a  float64
	b       float64
	// the load: arrivals per second, prompt and output lengths.
	rate           int
	prompt, output int
	// legWait stretches each prefill leg beyond its forward time by this
	// factor (the leg also waits for its decode worker); forward makes the
	// prefill workers report their forward time and prompt tokens.
	legWait float64
	forward bool
}

func (w *world) fleet() []WorkerLoad {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]WorkerLoad{}, w.workers...)
}

// second feeds one second of traffic and advances the clock by it.
func (w *world) second() {
	now := w.clk.Now()
	ws := w.fleet()
	var pre, dec []WorkerLoad
	for _, x := range ws {
		if !x.Taking {
			continue
		}
		if x.Role == rolePrefill {
			pre = append(pre, x)
		} else {
			dec = append(dec, x)
		}
	}
	for i := range w.rate {
		w.rec.Arrived(w.prompt, w.output)
		p := pre[i%len(pre)]
		busy := time.Duration(float64(w.prompt) / w.mu0 * float64(time.Second))
		leg := busy
		if w.legWait > 0 {
			leg = time.Duration(float64(busy) * w.legWait)
		}
		end := w.rec.LegStarted(p.ID, rolePrefill, now.Add(time.Duration(i)*time.Second/time.Duration(w.rate+1)))
		end(now.Add(time.Duration(i)*time.Second/time.Duration(w.rate+1)+leg), w.prompt)
		if w.forward {
			w.mu.Lock()
			for k := range w.workers {
				if w.workers[k].ID == p.ID {
					w.workers[k].ForwardSeconds += busy.Seconds()
					w.workers[k].PromptTokensComputed += int64(w.prompt)
				}
			}
			w.mu.Unlock()
		}
	}
	// Decode: each worker holds its share of λ·(P+O/2)·O·ITL tokens.
	for j := range dec {
		itl0 := w.a + w.b*1e5
		k := float64(w.rate) * float64(w.prompt+w.output/2) * float64(w.output) * itl0 / float64(len(dec))
		itl := w.a + w.b*(k*(1+0.5*float64(j))) // workers hold a little different K
		w.mu.Lock()
		for i := range w.workers {
			if w.workers[i].ID == dec[j].ID {
				w.workers[i].KVTokens = int(k * (1 + 0.5*float64(j)))
			}
		}
		w.mu.Unlock()
		for range 50 {
			w.rec.Gap(dec[j].ID, time.Duration(itl*float64(time.Second)))
		}
	}
	for range w.rate {
		w.rec.Finished(200*time.Millisecond, 10*time.Millisecond)
	}
	w.clk.Step(time.Second)
}

// flipper is an Actuator that flips one worker's role when asked, and
// can be held mid-change.
type flipper struct {
	w       *world
	release chan struct{}
	// entered gets a value as each Apply starts (if set).
	entered chan struct{}
	mu      sync.Mutex
	calls   []Decision
}

func (f *flipper) Name() string { return "test" }
func (f *flipper) Flips() bool  { return true }
func (f *flipper) Apply(ctx context.Context, d Decision) error {
	f.mu.Lock()
	f.calls = append(f.calls, d)
	f.mu.Unlock()
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	from, to, n := roleDecode, rolePrefill, d.DesiredPrefill-d.Prefill
	if n < 0 {
		from, to, n = rolePrefill, roleDecode, -n
	}
	for i := range f.w.workers {
		if n > 0 && f.w.workers[i].Role == from {
			f.w.workers[i].Role = to
			f.w.workers[i].KVTokens = 0
			n--
		}
	}
	return nil
}

func (f *flipper) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func newWorld(t *testing.T, nP, nD int) *world {
	w := &world{rec: NewRecorder(time.Second, 50*time.Millisecond), clk: clocktesting.NewFakeClock(time.Unix(1e6, 0)),
		mu0: 20000, a: 0.006, b: 2e-8}
	for i := range nP + nD {
		role := rolePrefill
		if i >= nP {
			role = roleDecode
		}
		w.workers = append(w.workers, WorkerLoad{ID: string(rune('a' + i)), Role: role, Taking: true, KVCapacity: 500000})
	}
	return w
}

// planner is a Planner over w (its Recorder, fleet and clock) with cfg's
// SLOs, timing and bounds, and act as its Actuator (nil: none).
func (w *world) planner(t *testing.T, cfg Config, act Actuator) *Planner {
	t.Helper()
	cfg.Recorder, cfg.Fleet, cfg.Clock = w.rec, w.fleet, w.clk
	if act != nil {
		cfg.Actuator = act
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func roles(ws []WorkerLoad) (p, d int) {
	for _, w := range ws {
		if w.Role == rolePrefill {
			p++
		} else {
			d++
		}
	}
	return p, d
}

// TestSplitFollowsTheLoad: on a fixed fleet of four, a prefill-bound load
// (long prompts, short answers) flips decode workers to prefill, together;
// a decode-bound one flips them back; a change under way holds every
// decision; and the split never moves while the load stays (no flapping).
func TestSplitFollowsTheLoad(t *testing.T) {
	w := newWorld(t, 1, 3)
	f := &flipper{w: w}
	reg := prometheus.NewRegistry()
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 5 * time.Second,
		Window: 30 * time.Second, Dwell: 20 * time.Second, Registerer: reg}, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Prefill-bound: 12 req/s of 4,000-token prompts is 48,000 tokens/s for
	// workers that do 20,000: about 3 prefill workers needed.
	w.rate, w.prompt, w.output = 12, 4000, 32
	var firstFlip time.Time
	for s := range 120 {
		w.second()
		if s%5 == 4 {
			d := p.Tick(ctx, w.clk.Now())
			if d.Action == ActionFlip && firstFlip.IsZero() {
				firstFlip = d.At
			}
			p.wg.Wait() // the flip is made before the next second
		}
	}
	if firstFlip.IsZero() {
		t.Fatal("no flip")
	}
	if gp, gd := roles(w.fleet()); gp != 3 || gd != 1 {
		t.Fatalf("prefill-bound split %dP:%dD, want 3P:1D; last: %+v", gp, gd, p.Status().Last)
	}
	if flips := f.n(); flips != 1 || f.calls[0].DesiredPrefill != 3 {
		t.Fatalf("%d changes to go from 1P:3D to 3P:1D (want one, both workers together)", flips)
	}
	// Decode-bound: short prompts, long answers, many of them.
	w.rate, w.prompt, w.output = 100, 128, 1024
	for s := range 180 {
		w.second()
		if s%5 == 4 {
			p.Tick(ctx, w.clk.Now())
			p.wg.Wait()
		}
	}
	gp, gd := roles(w.fleet())
	if gd <= gp {
		t.Fatalf("decode-bound split %dP:%dD; last: %+v", gp, gd, p.Status().Last)
	}
	settled := f.n()
	for s := range 120 {
		w.second()
		if s%5 == 4 {
			p.Tick(ctx, w.clk.Now())
			p.wg.Wait()
		}
	}
	if f.n() != settled {
		t.Fatalf("the split moved under a steady load: %d flips, then %d", settled, f.n())
	}
	if v := gauge(t, reg, "pdserve_planner_desired_replicas", roleDecode); int(v) != gd {
		t.Errorf("desired decode replicas %v, want %d", v, gd)
	}

	// A change under way holds every decision.
	f.release, f.entered = make(chan struct{}), make(chan struct{}, 1)
	w.rate, w.prompt, w.output = 12, 4000, 32
	flipping := false
	for s := 0; s < 200; s++ {
		w.second()
		if s%5 != 4 {
			continue
		}
		d := p.Tick(ctx, w.clk.Now())
		if flipping {
			if d.Action != ActionHold || d.Reason != "a change is under way" {
				t.Fatalf("decided %s (%s) while a change was under way", d.Action, d.Reason)
			}
			if s > 100 {
				break
			}
		} else if d.Action == ActionFlip {
			<-f.entered // the flip is under way until released
			flipping = true
			s = 50
		}
	}
	if !flipping {
		t.Fatalf("no flip back to prefill (%d flips)", f.n())
	}
	close(f.release)
	p.wg.Wait()
	if st := p.Status(); len(st.Changes) != f.n() || st.Mode != "flip" || st.Actuator != "test" {
		t.Errorf("status: %d changes for %d flips, mode %s", len(st.Changes), f.n(), st.Mode)
	}
}

// scaler is an Actuator that sets each role's count.
type scaler struct {
	w     *world
	mu    sync.Mutex
	calls []Decision
}

func (s *scaler) Name() string { return "scale-test" }
func (s *scaler) Flips() bool  { return false }
func (s *scaler) Apply(_ context.Context, d Decision) error {
	s.mu.Lock()
	s.calls = append(s.calls, d)
	s.mu.Unlock()
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	var ws []WorkerLoad
	for i := range d.DesiredPrefill + d.DesiredDecode {
		role := rolePrefill
		if i >= d.DesiredPrefill {
			role = roleDecode
		}
		ws = append(ws, WorkerLoad{ID: role + string(rune('a'+i)), Role: role, Taking: true, KVCapacity: 500000})
	}
	s.w.workers = ws
	return nil
}

// TestScaleUpAtOnceDownAfterDwell: an elastic fleet scales up at the first
// decision that calls for it and down only after the dwell, within bounds.
func TestScaleUpAtOnceDownAfterDwell(t *testing.T) {
	w := newWorld(t, 1, 1)
	s := &scaler{w: w}
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 5 * time.Second,
		Window: 10 * time.Second, Dwell: 30 * time.Second, MaxPrefill: 4}, s)
	ctx := context.Background()
	w.rate, w.prompt, w.output = 30, 4000, 32 // 120,000 tokens/s: over 4 prefill workers' worth
	var up time.Duration
	start := w.clk.Now()
	for i := range 60 {
		w.second()
		if i%5 == 4 {
			if d := p.Tick(ctx, w.clk.Now()); d.Action == ActionScale && up == 0 {
				up = w.clk.Now().Sub(start)
			}
			p.wg.Wait()
		}
	}
	if gp, _ := roles(w.fleet()); gp != 4 {
		t.Fatalf("scaled to %d prefill workers, want the maximum 4", gp)
	}
	if up > 15*time.Second {
		t.Errorf("scaled up %v after the load came (needs two snapshots: 10 s)", up)
	}
	w.rate = 3
	var down time.Duration
	start = w.clk.Now()
	for i := range 120 {
		w.second()
		if i%5 == 4 {
			d := p.Tick(ctx, w.clk.Now())
			if d.Action == ActionScale && down == 0 {
				down = w.clk.Now().Sub(start)
			}
			p.wg.Wait()
		}
	}
	if gp, _ := roles(w.fleet()); gp != 1 {
		t.Fatalf("%d prefill workers after the load fell", gp)
	}
	if down < 30*time.Second {
		t.Errorf("scaled down %v after the load fell, before the 30 s dwell", down)
	}
}

// stuckScaler is an elastic Actuator whose fleet does not follow (pods
// that cannot be scheduled, an operator's tooling that is not running).
type stuckScaler struct {
	mu    sync.Mutex
	calls []Decision
	err   error
}

func (s *stuckScaler) Name() string { return "stuck" }
func (s *stuckScaler) Flips() bool  { return false }
func (s *stuckScaler) Apply(_ context.Context, d Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, d)
	return s.err
}

// TestElasticAsksAgainAfterTwoDwells: counts an elastic actuator was
// given are not asked for again at every tick while the fleet catches up,
// but again after two dwell times if it has not, and at the next tick
// after the actuator failed.
func TestElasticAsksAgainAfterTwoDwells(t *testing.T) {
	w := newWorld(t, 1, 1)
	s := &stuckScaler{}
	p := w.planner(t, Config{Interval: 5 * time.Second, Window: 10 * time.Second, Dwell: 20 * time.Second}, s)
	w.rate, w.prompt, w.output = 30, 4000, 32
	var at []time.Duration
	start := w.clk.Now()
	run := func(seconds int) {
		for i := range seconds {
			w.second()
			if i%5 == 4 {
				if d := p.Tick(context.Background(), w.clk.Now()); d.Action == ActionScale {
					at = append(at, w.clk.Now().Sub(start))
				} else if len(at) > 0 && !strings.Contains(d.Reason, "asked of stuck") {
					t.Errorf("hold at %s: %q", w.clk.Now().Sub(start), d.Reason)
				}
				p.wg.Wait()
			}
		}
	}
	run(60)
	// First asked at 10 s (two snapshots), again 40 s later (two dwells).
	if len(at) != 2 || at[0] != 10*time.Second || at[1] != 50*time.Second {
		t.Fatalf("asked at %v, want [10s 50s]", at)
	}
	s.mu.Lock()
	s.err = errors.New("refused")
	s.mu.Unlock()
	at = nil
	run(35) // from 60 s: asked again at 90 s (fails), then at once at 95 s
	if len(at) != 2 || at[0] != 90*time.Second || at[1] != 95*time.Second {
		t.Fatalf("after a failure asked at %v, want [1m30s 1m35s]", at)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) != 4 || s.calls[3].DesiredPrefill != s.calls[0].DesiredPrefill {
		t.Fatalf("%d calls: %+v", len(s.calls), s.calls)
	}
}

// TestNoActuatorPublishes: without an actuator the planner scales on
// paper: pdserve_planner_desired_replicas and GET /planner say what it
// would want, once.
func TestNoActuatorPublishes(t *testing.T) {
	w := newWorld(t, 1, 1)
	reg := prometheus.NewRegistry()
	p := w.planner(t, Config{Interval: 5 * time.Second, Window: 10 * time.Second, Registerer: reg}, nil)
	w.rate, w.prompt, w.output = 30, 4000, 32
	scales := 0
	for i := range 30 {
		w.second()
		if i%5 == 4 {
			if d := p.Tick(context.Background(), w.clk.Now()); d.Action == ActionScale {
				scales++
			}
		}
	}
	if scales != 1 {
		t.Errorf("%d scale decisions published, want 1", scales)
	}
	if v := gauge(t, reg, "pdserve_planner_desired_replicas", rolePrefill); v < 5 {
		t.Errorf("desired prefill replicas %v for 120,000 prompt tokens/s at 20,000 per worker", v)
	}
	rr := httptest.NewRecorder()
	p.ServeHTTP(rr, httptest.NewRequest("GET", "/planner", nil))
	var st struct {
		Mode string `json:"mode"`
		Last struct {
			Inputs struct {
				ArrivalRate float64 `json:"arrival_rate"`
			} `json:"inputs"`
			Need struct {
				PrefillWhy string `json:"prefill_why"`
			} `json:"need"`
		} `json:"last"`
	}
	if err := json.Unmarshal(rr.Body.Bytes(), &st); err != nil {
		t.Fatalf("%v: %s", err, rr.Body.String())
	}
	if st.Mode != "scale" || !near(st.Last.Inputs.ArrivalRate, 30, 0.05) || !strings.Contains(st.Last.Need.PrefillWhy, "tokens/s per worker") {
		t.Errorf("GET /planner: %s", rr.Body.String())
	}
}

// TestRunStopsWithItsContext runs the loop on a fake clock: it decides at
// each interval and returns when its context ends.
func TestRunStopsWithItsContext(t *testing.T) {
	w := newWorld(t, 1, 1)
	p := w.planner(t, Config{Interval: time.Second, Window: 5 * time.Second}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !p.Status().Last.At.After(time.Unix(1e6, 0)) {
		if time.Now().After(deadline) {
			t.Fatal("no decision at the first tick")
		}
		if w.clk.HasWaiters() {
			w.clk.Step(time.Second)
		}
		runtime.Gosched()
	}
	cancel()
	<-done
}

func TestNewRejects(t *testing.T) {
	fleet := func() []WorkerLoad { return nil }
	for _, c := range []Config{
		{},
		{Fleet: fleet, SLOs: SLOs{TTFT: -1}},
		{Fleet: fleet, Interval: time.Minute, Window: time.Second},
		{Fleet: fleet, Dwell: -time.Second},
		{Fleet: fleet, MinPrefill: 3, MaxPrefill: 2},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
}

// TestPrefillThroughputFromForwardTime: the workers' own forward time
// measures prefill throughput even when legs wait on decode as long again
// as they compute; without it the router's view of the legs underrates it.
func TestPrefillThroughputFromForwardTime(t *testing.T) {
	for _, forward := range []bool{true, false} {
		w := newWorld(t, 2, 2)
		w.rate, w.prompt, w.output, w.legWait, w.forward = 4, 2000, 64, 3, forward
		p := w.planner(t, Config{Interval: 5 * time.Second, Window: 20 * time.Second}, nil)
		var d Decision
		for i := range 30 {
			w.second()
			if i%5 == 4 {
				d = p.Tick(context.Background(), w.clk.Now())
			}
		}
		in := d.Inputs
		want, by := w.mu0, "forward time"
		if !forward {
			want, by = w.mu0/3, "legs in flight"
		}
		if !near(in.PrefillTokensPerBusySecond, want, 0.02) || in.PrefillMeasuredBy != by {
			t.Errorf("forward reported %v: %.0f tokens/s by %q, want %.0f by %q", forward, in.PrefillTokensPerBusySecond, in.PrefillMeasuredBy, want, by)
		}
		// 4 req/s × 2,000 tokens at 20,000 tokens/s over 2 workers: 20 % busy.
		if forward && !near(in.PrefillBusy, 0.2, 0.05) {
			t.Errorf("prefill busy %.3f, want 0.2", in.PrefillBusy)
		}
	}
}

// TestMaxStepFlipsOneAtATime: with MaxStep 1 an overloaded prefill role
// (12 req/s of 4,000-token prompts: 2.4 workers' worth on one) takes two
// changes of one worker, each as soon as the last one is made.
func TestMaxStepFlipsOneAtATime(t *testing.T) {
	w := newWorld(t, 1, 3)
	f := &flipper{w: w}
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 5 * time.Second,
		Window: 30 * time.Second, Dwell: 20 * time.Second, MaxStep: 1}, f)
	w.rate, w.prompt, w.output = 12, 4000, 32
	var at []time.Time
	for s := range 120 {
		w.second()
		if s%5 == 4 {
			if d := p.Tick(context.Background(), w.clk.Now()); d.Action == ActionFlip {
				at = append(at, d.At)
				if d.DesiredPrefill-d.Prefill != 1 || !strings.Contains(d.Reason, "overloaded") {
					t.Fatalf("a change of %d workers with MaxStep 1: %s", d.DesiredPrefill-d.Prefill, d.Reason)
				}
			}
			p.wg.Wait()
		}
	}
	if gp, _ := roles(w.fleet()); gp != 3 || len(at) != 2 || at[1].Sub(at[0]) >= 20*time.Second {
		t.Fatalf("%d prefill workers after changes at %v (want two, less than the dwell apart)", gp, at)
	}
}

// TestDwellWithoutOverload: a better split that no overload calls for
// waits the dwell: 2P:2D at 14 req/s of 2,000-token prompts is 1.6
// prefill workers' worth (load ratio 0.8), 3P:1D would be 0.53.
func TestDwellWithoutOverload(t *testing.T) {
	w := newWorld(t, 2, 2)
	f := &flipper{w: w}
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 5 * time.Second,
		Window: 10 * time.Second, Dwell: 20 * time.Second}, f)
	w.rate, w.prompt, w.output = 14, 2000, 32
	var first, flip time.Time
	for s := range 90 {
		w.second()
		if s%5 != 4 {
			continue
		}
		d := p.Tick(context.Background(), w.clk.Now())
		if d.DesiredPrefill == 3 && first.IsZero() {
			first = d.At
		}
		if d.Action == ActionFlip && flip.IsZero() {
			flip = d.At
			if strings.Contains(d.Reason, "overloaded") {
				t.Fatalf("flipped for an overload: %s (need %+v)", d.Reason, d.Need)
			}
		}
		p.wg.Wait()
	}
	if first.IsZero() || flip.Sub(first) < 20*time.Second {
		t.Fatalf("3P:1D first called for at %v, made at %v: want the 20 s dwell between; last: %s %+v", first, flip, p.Status().Last.Reason, p.Status().Last.Need)
	}
}

// TestIdleFleetScalesDown: once traffic stops, an elastic fleet's counts
// fall to the minimums after the dwell, and the published desired
// replicas with them.
func TestIdleFleetScalesDown(t *testing.T) {
	w := newWorld(t, 1, 1)
	s := &scaler{w: w}
	reg := prometheus.NewRegistry()
	p := w.planner(t, Config{Interval: 5 * time.Second,
		Window: 10 * time.Second, Dwell: 20 * time.Second, MaxPrefill: 4, Registerer: reg}, s)
	w.rate, w.prompt, w.output = 30, 4000, 32
	tick := func(seconds int) {
		for i := range seconds {
			w.second()
			if i%5 == 4 {
				p.Tick(context.Background(), w.clk.Now())
				p.wg.Wait()
			}
		}
	}
	tick(30)
	if gp, _ := roles(w.fleet()); gp != 4 {
		t.Fatalf("%d prefill workers under load", gp)
	}
	w.rate = 0
	for i := range w.workers {
		w.workers[i].KVTokens = 0
	}
	tick(60)
	if gp, gd := roles(w.fleet()); gp != 1 || gd != 1 {
		t.Fatalf("%dP:%dD a minute after traffic stopped, want the minimums 1P:1D; last: %s", gp, gd, p.Status().Last.Reason)
	}
	if v := gauge(t, reg, "pdserve_planner_desired_replicas", rolePrefill); v != 1 {
		t.Errorf("desired prefill replicas %v after traffic stopped", v)
	}
}

// TestLightLoadNoFlip: a fixed fleet well within its capacity is not
// re-split, though another split would balance it better.
func TestLightLoadNoFlip(t *testing.T) {
	w := newWorld(t, 2, 2)
	f := &flipper{w: w}
	p := w.planner(t, Config{Interval: 5 * time.Second, Window: 10 * time.Second, Dwell: 10 * time.Second}, f)
	w.rate, w.prompt, w.output = 3, 2000, 32 // 0.34 prefill workers' worth, decode idle
	var d Decision
	for i := range 60 {
		w.second()
		if i%5 == 4 {
			d = p.Tick(context.Background(), w.clk.Now())
		}
	}
	if f.n() != 0 || !strings.Contains(d.Reason, "lightly loaded") {
		t.Fatalf("%d flips at light load; last: %s", f.n(), d.Reason)
	}
}

// TestOneTickSwingFlipsNothing: on a steady load that fits 2P:2D, one tick
// at which the decode workers report holding twenty times their pool (long
// prompts' KV landing for a few tokens of answer) flips nothing: the KV
// held counts as its median over the window, and an overload must be
// called for on two ticks in a row.
func TestOneTickSwingFlipsNothing(t *testing.T) {
	w := newWorld(t, 2, 2)
	f := &flipper{w: w}
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 2 * time.Second,
		Window: 10 * time.Second, Dwell: 6 * time.Second}, f)
	w.rate, w.prompt, w.output = 14, 2000, 32 // prefill load ratio ~0.8 on two workers
	for s := range 60 {
		w.second()
		if s%2 != 1 {
			continue
		}
		if s == 31 {
			w.mu.Lock()
			for i := range w.workers {
				if w.workers[i].Role == roleDecode {
					w.workers[i].KVTokens = 20 * w.workers[i].KVCapacity
				}
			}
			w.mu.Unlock()
		}
		d := p.Tick(context.Background(), w.clk.Now())
		if s == 31 && (d.Inputs.DecodeKVHeldNow < 20*500000 || d.Inputs.DecodeKVHeld >= 500000) {
			t.Fatalf("the swing: %d tokens held now, %d counted; want it seen now and the window's median far below",
				d.Inputs.DecodeKVHeldNow, d.Inputs.DecodeKVHeld)
		}
		if d.Action != ActionHold && d.DesiredDecode > d.Decode {
			t.Fatalf("flipped toward decode at %ds: %s (need %+v)", s+1, d.Reason, d.Need)
		}
		p.wg.Wait()
	}
}

// TestOverloadFlipsOnTheSecondTick: an overloaded role (1P:3D under 12 req/s
// of 4,000-token prompts) is relieved without the dwell, but only once two
// ticks in a row call for the same split.
func TestOverloadFlipsOnTheSecondTick(t *testing.T) {
	w := newWorld(t, 1, 3)
	f := &flipper{w: w}
	p := w.planner(t, Config{SLOs: SLOs{TTFT: time.Second, ITL: 50 * time.Millisecond}, Interval: 5 * time.Second,
		Window: 30 * time.Second, Dwell: time.Minute}, f)
	w.rate, w.prompt, w.output = 12, 4000, 32
	var ds []Decision
	for s := range 30 {
		w.second()
		if s%5 == 4 {
			ds = append(ds, p.Tick(context.Background(), w.clk.Now()))
			p.wg.Wait()
		}
	}
	first := slices.IndexFunc(ds, func(d Decision) bool { return d.DesiredPrefill > d.Prefill })
	if first < 0 || first+1 >= len(ds) {
		t.Fatalf("no overload called for: %+v", ds)
	}
	if d := ds[first]; d.Action != ActionHold || !strings.Contains(d.Reason, "at the next tick") {
		t.Fatalf("first tick calling for %dP: %s %q, want a hold until the next tick", d.DesiredPrefill, d.Action, d.Reason)
	}
	if d := ds[first+1]; d.Action != ActionFlip || !strings.Contains(d.Reason, "overloaded: at once") {
		t.Fatalf("second tick: %s %q, want the flip (well within the minute's dwell)", d.Action, d.Reason)
	}
}

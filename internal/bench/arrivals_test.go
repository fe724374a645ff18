package bench

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestArrivalsArePoisson(t *testing.T) {
	const n, rate = 20001, 8.0
	a := Arrivals(Rate(rate), n, 42)
	if a[0] != 0 {
		t.Fatalf("the first request arrives at %v, want 0", a[0])
	}
	var sum, sumSq float64
	for i := 1; i < n; i++ {
		gap := (a[i] - a[i-1]).Seconds()
		if gap < 0 {
			t.Fatalf("arrival %d before arrival %d", i, i-1)
		}
		sum += gap
		sumSq += gap * gap
	}
	mean := sum / (n - 1)
	sd := math.Sqrt(sumSq/(n-1) - mean*mean)
	// The mean of 20000 exponential gaps has a standard error of 0.7%.
	if math.Abs(mean-1/rate) > 0.03/rate {
		t.Errorf("mean inter-arrival %.5f s, want %.5f ± 3%%", mean, 1/rate)
	}
	// Exponential: the standard deviation equals the mean (fixed gaps
	// would give 0).
	if math.Abs(sd/mean-1) > 0.05 {
		t.Errorf("coefficient of variation %.3f, want 1 ± 0.05", sd/mean)
	}

	if !slices.Equal(a, Arrivals(Rate(rate), n, 42)) {
		t.Error("the same seed gave different arrivals")
	}
	if slices.Equal(a, Arrivals(Rate(rate), n, 43)) {
		t.Error("another seed gave the same arrivals")
	}
	// The same seed at twice the rate is the same pattern at half the
	// times.
	b := Arrivals(Rate(2*rate), n, 42)
	for i := range a {
		if d := a[i] - 2*b[i]; d < -2 || d > 2 {
			t.Fatalf("arrival %d: %v at rate %v but %v at twice the rate", i, a[i], rate, b[i])
		}
	}
	for _, x := range Arrivals(InfRate(), 100, 42) {
		if x != 0 {
			t.Fatal("rate inf must send every request at 0")
		}
	}
}

// TestDispatchSleepsUntilEachArrival runs a benchmark on a fake clock: each
// request is sent exactly at its arrival time, reached by sleeping.
func TestDispatchSleepsUntilEachArrival(t *testing.T) {
	srv := fakeServer(t)
	clock := newFakeClock()
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.Rates, cfg.Seed = "m", 150, []Rate{50}, 7
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	want := Arrivals(50, 150, 7)
	recs := rep.Runs[0].Records
	var slept time.Duration
	for _, d := range clock.slept() {
		slept += d
	}
	if slept != want[len(want)-1] {
		t.Errorf("slept %v in all, want the last arrival %v", slept, want[len(want)-1])
	}
	var gaps time.Duration
	for i, r := range recs {
		if !r.Success || r.Index != i || r.Arrival != want[i] || r.Sent != want[i] {
			t.Fatalf("request %d: %+v, want sent at its arrival %v", i, r, want[i])
		}
		if i > 0 {
			gaps += r.Sent - recs[i-1].Sent
		}
	}
	mean := gaps.Seconds() / float64(len(recs)-1)
	if math.Abs(mean-1.0/50) > 0.2/50 {
		t.Errorf("mean inter-arrival %.4f s, want 0.02 s ± 20%%", mean)
	}
	// Another run with the same seed is the same schedule.
	clock2 := newFakeClock()
	rep2, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: clock2})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rep2.Runs[0].Records {
		if r.Sent != recs[i].Sent {
			t.Fatalf("request %d sent at %v, then at %v with the same seed", i, recs[i].Sent, r.Sent)
		}
	}
}

// TestInfRespectsMaxConcurrency sends 40 requests at rate inf with at most 4
// in flight to a server that holds every request until the test releases
// it. The test releases one only when 4 are held (or all that remain), so
// the cap is reached; more than 4 must never be seen.
func TestInfRespectsMaxConcurrency(t *testing.T) {
	const n, limit = 40, 4
	var inflight, maxSeen atomic.Int64
	arrived := make(chan struct{}, n)
	release := make(chan struct{})
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fr, ok := parseFake(w, r)
		if !ok {
			return
		}
		cur := inflight.Add(1)
		for {
			m := maxSeen.Load()
			if cur <= m || maxSeen.CompareAndSwap(m, cur) {
				break
			}
		}
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		inflight.Add(-1)
		s := startSSE(w, fr)
		s.tokens(1)
		s.usage(len(fr.prompt), 1)
		s.done()
	}))
	t.Cleanup(srv.Close)

	driverDone := make(chan struct{})
	go func() {
		defer close(driverDone)
		held := 0
		for released := 0; released < n; released++ {
			for held < min(limit, n-released) {
				select {
				case <-arrived:
					held++
				case <-stop:
					return
				}
			}
			select {
			case release <- struct{}{}:
				held--
			case <-stop:
				return
			}
		}
	}()

	clock := newFakeClock()
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.MaxConcurrency, cfg.RandomOutputLen = "m", n, limit, 1
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t), Clock: clock})
	close(stop)
	<-driverDone
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Runs[0].Summary; s.Succeeded != n {
		t.Fatalf("%d of %d succeeded: %v", s.Succeeded, n, s.Errors)
	}
	if got := maxSeen.Load(); got != limit {
		t.Fatalf("at most %d requests were in flight at once, want exactly the cap %d", got, limit)
	}
	if s := clock.slept(); len(s) != 0 {
		t.Fatalf("rate inf slept %v", s)
	}
}

package bench

import (
	"context"
	"time"
)

// Clock is the time source of a benchmark: request timings are read from
// Now, and arrivals are scheduled with Sleep. Implementations must be safe
// for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d or until ctx is done, whichever comes first, and
	// returns ctx.Err() in the second case. d <= 0 returns at once.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Sleep waits on a timer for d, or until ctx is done.
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Arrivals returns the arrival offsets from the start of a run of n
// requests at rate requests per second: a Poisson process, i.e. independent
// exponential inter-arrival times of mean 1/rate drawn from RNG stream
// streamArrivals of seed. The first request arrives at 0, as in vLLM. The unit draws do not depend on the rate, so runs of a
// sweep see the same arrival pattern, scaled. Rate inf gives all zeros.
func Arrivals(rate Rate, n int, seed uint64) []time.Duration {
	out := make([]time.Duration, n)
	if rate.IsInf() || n == 0 {
		return out
	}
	rng := newRNG(seed, streamArrivals)
	var t float64 // seconds
	for i := 1; i < n; i++ {
		t += rng.ExpFloat64() / float64(rate)
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

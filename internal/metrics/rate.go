package metrics

import "time"

// Rate is a sliding-window rate: the units (tokens) added in the last
// Window, per second. It backs sglang:gen_throughput and the throughput of
// the per-batch log line, which SGLang computes over its last log interval;
// a window read at scrape time falls to zero when the worker goes idle
// instead of keeping the last busy interval's value.
//
// It keeps RateSlots counts of Window/RateSlots each. A Rate is not safe for
// concurrent use (the worker's loop owns it); times come from the caller's
// clock, and a time earlier than one already seen counts as that time, so
// the rate is never negative.
type Rate struct {
	slots     [RateSlots]float64
	cur       int       // index of the slot that slotStart begins
	slotStart time.Time // start of the current slot
	start     time.Time // first time seen: the window is shorter before start+Window
}

// RateWindow is the span a Rate averages over; RateSlots its resolution.
const (
	RateWindow = 10 * time.Second
	RateSlots  = 10
	rateSlot   = RateWindow / RateSlots
)

// advance moves the window to now, emptying the slots it leaves behind.
func (r *Rate) advance(now time.Time) time.Time {
	if r.start.IsZero() {
		r.start, r.slotStart = now, now
	}
	if now.Before(r.slotStart) {
		return r.slotStart
	}
	steps := int(now.Sub(r.slotStart) / rateSlot)
	if steps >= RateSlots {
		r.slots = [RateSlots]float64{}
		r.slotStart = r.slotStart.Add(time.Duration(steps) * rateSlot)
		return now
	}
	for range steps {
		r.cur = (r.cur + 1) % RateSlots
		r.slots[r.cur] = 0
		r.slotStart = r.slotStart.Add(rateSlot)
	}
	return now
}

// Add counts n units (n ≤ 0 adds nothing) at time now.
func (r *Rate) Add(now time.Time, n int) {
	r.advance(now)
	if n > 0 {
		r.slots[r.cur] += float64(n)
	}
}

// PerSecond is the units added in the window ending at now, divided by the
// window's span in seconds: RateWindow once the Rate has seen that much
// time, the time since its first Add or PerSecond before, but never less
// than one slot (RateWindow/RateSlots), so a burst in a worker's first
// moments is not read as a huge rate.
func (r *Rate) PerSecond(now time.Time) float64 {
	now = r.advance(now)
	span := time.Duration(RateSlots-1)*rateSlot + now.Sub(r.slotStart)
	span = min(span, now.Sub(r.start))
	span = max(span, rateSlot)
	var sum float64
	for _, v := range r.slots {
		sum += v
	}
	return sum / span.Seconds()
}

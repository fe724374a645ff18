package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (p in [0, 100]) of sorted values,
// interpolating linearly between the closest ranks (numpy's default): the
// value at rank p/100·(n−1). It returns 0 for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	lo = min(max(lo, 0), n-1)
	hi = min(max(hi, 0), n-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(rank-float64(lo))
}

// Dist summarizes a latency distribution, in milliseconds.
type Dist struct {
	// Count is the number of values.
	Count  int     `json:"count"`
	Mean   float64 `json:"mean_ms"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

// NewDist summarizes ds (their order does not matter; ds is not modified).
func NewDist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	v := make([]float64, len(ds))
	var sum float64
	for i, d := range ds {
		v[i] = ms(d)
		sum += v[i]
	}
	slices.Sort(v)
	return Dist{Count: len(v), Mean: sum / float64(len(v)), Median: Percentile(v, 50),
		P90: Percentile(v, 90), P99: Percentile(v, 99), Min: v[0], Max: v[len(v)-1]}
}

// SLO are the latency objectives of goodput; a zero field is no objective.
type SLO struct {
	// TTFT bounds the time to first token.
	TTFT time.Duration
	// TPOT bounds the time per output token after the first.
	TPOT time.Duration
}

// Set reports whether any objective is given.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 }

// Meets reports whether r succeeded within the objectives: TTFT ≤ s.TTFT and
// TPOT ≤ s.TPOT (a request with fewer than 2 output tokens has no TPOT and
// meets any TPOT objective).
func (s SLO) Meets(r *Record) bool {
	if !r.Success {
		return false
	}
	if s.TTFT > 0 && r.TTFT > s.TTFT {
		return false
	}
	if s.TPOT > 0 && r.HasTPOT && r.TPOT > s.TPOT {
		return false
	}
	return true
}

// Goodput counts the requests that met the SLOs.
type Goodput struct {
	// SLOTTFT and SLOTPOT are the objectives in milliseconds (0: none).
	SLOTTFT float64 `json:"slo_ttft_ms,omitempty"`
	SLOTPOT float64 `json:"slo_tpot_ms,omitempty"`
	// Requests is the number of requests that met them.
	Requests int `json:"requests"`
	// Rate is Requests per second of the run's duration.
	Rate float64 `json:"requests_per_s"`
	// Fraction is Requests over all requests of the run (failures and
	// shed requests count as not meeting the SLOs).
	Fraction float64 `json:"fraction"`
}

// CacheStats are the prefix-cache hits of a run's successful requests, as
// the server reported them in usage.prompt_tokens_details.cached_tokens.
type CacheStats struct {
	// Reported counts the requests whose usage had the field.
	Reported int `json:"reported"`
	// PromptTokens and CachedTokens sum those requests' prompt tokens and
	// cached tokens.
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	// HitRate is CachedTokens / PromptTokens.
	HitRate float64 `json:"hit_rate"`
	// OracleHitRate is the hit rate a perfect placement would get (see
	// OracleHitRate; shared-prefix dataset; with Config.ReusePrompts the
	// first rate only, the later ones resending its prompts to warm
	// caches; for a trace replay, TraceStats.RepeatedTokenFraction),
	// OfOracle HitRate over it.
	OracleHitRate *float64 `json:"oracle_hit_rate,omitempty"`
	OfOracle      *float64 `json:"hit_rate_of_oracle,omitempty"`
}

// TurnSummary is one turn of a multi-turn run: its successful requests'
// TTFT, prompt and cached tokens.
type TurnSummary struct {
	Turn         int     `json:"turn"`
	Succeeded    int     `json:"succeeded"`
	Failed       int     `json:"failed"`
	InputTokens  int     `json:"input_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// CacheReported counts the requests whose usage had cached_tokens.
	CacheReported int  `json:"cache_reported"`
	TTFT          Dist `json:"ttft"`
}

// setOracle records the oracle hit rate of the run's prompts.
func (s *Summary) setOracle(oracle float64) {
	if s.Cache == nil {
		return
	}
	o := oracle
	s.Cache.OracleHitRate = &o
	if oracle > 0 {
		f := s.Cache.HitRate / oracle
		s.Cache.OfOracle = &f
	}
}

// hitRate is cached/prompt, 0 without prompt tokens.
func hitRate(cached, prompt int) float64 {
	if prompt <= 0 {
		return 0
	}
	return float64(cached) / float64(prompt)
}

// summarizeTurns summarizes recs by Turn (nil when none has a turn).
func summarizeTurns(recs []Record) []TurnSummary {
	var out []TurnSummary
	var ttft [][]time.Duration
	for i := range recs {
		r := &recs[i]
		if r.Turn < 1 {
			continue
		}
		for len(out) < r.Turn {
			out = append(out, TurnSummary{Turn: len(out) + 1})
			ttft = append(ttft, nil)
		}
		t := &out[r.Turn-1]
		if !r.Success {
			t.Failed++
			continue
		}
		t.Succeeded++
		t.InputTokens += r.InputTokens
		t.CachedTokens += r.CachedTokens
		if r.CachedReported {
			t.CacheReported++
		}
		ttft[r.Turn-1] = append(ttft[r.Turn-1], r.TTFT)
	}
	for i := range out {
		out[i].HitRate = hitRate(out[i].CachedTokens, out[i].InputTokens)
		out[i].TTFT = NewDist(ttft[i])
	}
	return out
}

// Summary is the result of one run (one request rate).
type Summary struct {
	// Rate is the request rate, in requests/s; for a trace replay, the
	// replay's mean arrival rate (TraceStats.OfferedRate).
	Rate Rate `json:"request_rate"`
	// MaxConcurrency is the cap on requests in flight (0: none).
	MaxConcurrency int `json:"max_concurrency"`
	// Requests, Succeeded and Failed count the measured requests; Shed
	// those the server answered 429 (load shedding: neither served nor a
	// failure; not in Failed), ShedFraction their share of Requests.
	Requests     int     `json:"requests"`
	Succeeded    int     `json:"succeeded"`
	Failed       int     `json:"failed"`
	Shed         int     `json:"shed"`
	ShedFraction float64 `json:"shed_fraction"`
	// Resent counts the resends after a 429 (Config.HonorRetryAfter).
	Resent int `json:"resent"`
	// Duration is from the start of the run to the end of its last
	// request, in seconds.
	Duration float64 `json:"duration_s"`
	// InputTokens and OutputTokens sum the successful requests' tokens.
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	// Cache is the successful requests' prefix-cache hits, nil when no
	// answer reported usage.prompt_tokens_details.cached_tokens.
	Cache *CacheStats `json:"prefix_cache,omitempty"`
	// CacheWarning, when not empty, says the server reported a prefix-cache
	// hit rate above UnexpectedHitRate on prompts that should have found
	// nothing cached (set by Run).
	CacheWarning string `json:"cache_warning,omitempty"`
	// Turns summarizes a multi-turn run by turn (nil otherwise).
	Turns []TurnSummary `json:"turns,omitempty"`
	// Trace is the replayed trace's own figures (trace replays only; set
	// by Run).
	Trace *TraceStats `json:"trace,omitempty"`
	// RequestThroughput is successful requests per second.
	RequestThroughput float64 `json:"request_throughput"`
	// InputThroughput, OutputThroughput and TotalThroughput are tokens of
	// successful requests per second.
	InputThroughput  float64 `json:"input_token_throughput"`
	OutputThroughput float64 `json:"output_token_throughput"`
	TotalThroughput  float64 `json:"total_token_throughput"`
	// Concurrency is the mean number of successful requests in flight:
	// the sum of their E2E latencies over Duration.
	Concurrency float64 `json:"concurrency"`
	// TTFT, TPOT, ITL and E2E summarize the successful requests (TPOT over
	// those with at least 2 output tokens; ITL pools every gap).
	TTFT Dist `json:"ttft"`
	TPOT Dist `json:"tpot"`
	ITL  Dist `json:"itl"`
	E2E  Dist `json:"e2e"`
	// TokensPerEvent is the successful requests' output tokens per
	// streamed event that carried output (0 without output). ITL is
	// measured per event and TPOT per token, so when a server coalesces
	// tokens into events (a slow client, a batch of tokens at once) ITL is
	// about TokensPerEvent × TPOT.
	TokensPerEvent float64 `json:"output_tokens_per_event"`
	// Goodput is set when an SLO is given.
	Goodput *Goodput `json:"goodput,omitempty"`
	// Errors counts the failed requests by ErrorType.
	Errors map[string]int `json:"errors,omitempty"`
}

// Summarize computes the summary of one run's records; duration is the
// run's wall time.
func Summarize(recs []Record, duration time.Duration, slo SLO) Summary {
	s := Summary{Requests: len(recs), Duration: duration.Seconds()}
	var ttft, tpot, itl, e2e []time.Duration
	var sumE2E time.Duration
	good, events, evTokens := 0, 0, 0
	for i := range recs {
		r := &recs[i]
		s.Resent += r.Resent
		if r.Shed {
			s.Shed++
			continue
		}
		if !r.Success {
			s.Failed++
			if s.Errors == nil {
				s.Errors = map[string]int{}
			}
			s.Errors[r.ErrorType]++
			continue
		}
		s.Succeeded++
		s.InputTokens += r.InputTokens
		s.OutputTokens += r.OutputTokens
		if r.CachedReported {
			if s.Cache == nil {
				s.Cache = &CacheStats{}
			}
			s.Cache.Reported++
			s.Cache.PromptTokens += r.InputTokens
			s.Cache.CachedTokens += r.CachedTokens
		}
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		sumE2E += r.E2E
		if r.HasTPOT {
			tpot = append(tpot, r.TPOT)
		}
		itl = append(itl, r.ITL...)
		if r.OutputTokens > 0 {
			events += len(r.ITL) + 1
			evTokens += r.OutputTokens
		}
		if slo.Meets(r) {
			good++
		}
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = NewDist(ttft), NewDist(tpot), NewDist(itl), NewDist(e2e)
	if s.Cache != nil {
		s.Cache.HitRate = hitRate(s.Cache.CachedTokens, s.Cache.PromptTokens)
	}
	s.Turns = summarizeTurns(recs)
	if events > 0 {
		s.TokensPerEvent = float64(evTokens) / float64(events)
	}
	if d := duration.Seconds(); d > 0 {
		s.RequestThroughput = float64(s.Succeeded) / d
		s.InputThroughput = float64(s.InputTokens) / d
		s.OutputThroughput = float64(s.OutputTokens) / d
		s.TotalThroughput = float64(s.InputTokens+s.OutputTokens) / d
		s.Concurrency = sumE2E.Seconds() / d
	}
	if len(recs) > 0 {
		s.ShedFraction = float64(s.Shed) / float64(len(recs))
	}
	if slo.Set() {
		g := &Goodput{SLOTTFT: ms(slo.TTFT), SLOTPOT: ms(slo.TPOT), Requests: good}
		if d := duration.Seconds(); d > 0 {
			g.Rate = float64(good) / d
		}
		if len(recs) > 0 {
			g.Fraction = float64(good) / float64(len(recs))
		}
		s.Goodput = g
	}
	return s
}

package planner

import (
	"fmt"
	"math"
	"time"
)

// Inputs are what one decision is made on: the traffic arriving, what the
// workers were measured to do, and how the requests fared. Rates and means
// are over the planner's window.
type Inputs struct {
	// Window is the span the rates and means cover.
	Window Duration `json:"window"`
	// ArrivalRate is the requests reaching the router per second (shed and
	// refused ones included).
	ArrivalRate float64 `json:"arrival_rate"`
	// MeanPromptTokens and MeanOutputTokens are the arrivals' mean prompt
	// length and max_tokens.
	MeanPromptTokens float64 `json:"mean_prompt_tokens"`
	MeanOutputTokens float64 `json:"mean_output_tokens"`
	// LocalRate is the arrivals per second a decode worker served alone
	// (per-request disaggregation), MeanLocalPromptTokens their mean
	// prompt: no prefill worker computes those.
	LocalRate             float64 `json:"local_rate,omitempty"`
	MeanLocalPromptTokens float64 `json:"mean_local_prompt_tokens,omitempty"`
	// PrefillTokensPerBusySecond is one prefill worker's measured prompt
	// throughput while it computes: the prompt tokens its forwards computed
	// over their time (or, for workers that do not report them, the prompt
	// tokens of its legs over the time it had at least one); 0: not
	// measured yet.
	PrefillTokensPerBusySecond float64 `json:"prefill_tokens_per_busy_second"`
	// PrefillBusy is the prefill workers' mean busy fraction of the window.
	PrefillBusy float64 `json:"prefill_busy"`
	// PrefillMeasuredBy says where both came from: "forward time" (the
	// workers' own counters) or "legs in flight" (the router's view).
	PrefillMeasuredBy string `json:"prefill_measured_by,omitempty"`
	// DecodeFit is the step time model fitted to the decode workers'
	// measured inter-token latency against the KV tokens they held.
	DecodeFit Fit `json:"decode_fit"`
	// DecodeKVTokens is a decode worker's KV capacity in tokens (the
	// smallest reported), DecodeMaxRunning its batch limit (0: unknown).
	DecodeKVTokens   int `json:"decode_kv_tokens"`
	DecodeMaxRunning int `json:"decode_max_running"`
	// DecodeKVHeld is the KV tokens the decode workers taking requests
	// hold by their load reports, the median of the window's ticks;
	// DecodeKVHeldNow is this tick's.
	DecodeKVHeld    int `json:"decode_kv_held"`
	DecodeKVHeldNow int `json:"decode_kv_held_now"`
	// TTFTp90 and ITLp90 are the 90th percentiles of the time to first
	// token and of the mean inter-token latency (TPOT) of the requests that
	// ended in the window; Finished counts them, WithinSLOs is the fraction
	// within both SLOs (1 with none finished).
	TTFTp90    Duration `json:"ttft_p90"`
	ITLp90     Duration `json:"itl_p90"`
	Finished   int64    `json:"finished"`
	WithinSLOs float64  `json:"within_slos"`
	// Prefill and Decode count the workers of each role taking requests;
	// Leaving those draining or not yet ready.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	Leaving int `json:"leaving"`
}

// Fit is ITL ≈ Intercept + Slope·K, K the KV tokens a decode worker holds:
// a memory-bound decode step reads the weights (the fixed part) and every
// cached token once (the part that grows with K) — the roofline model
// (Williams, Waterman and Patterson, CACM 2009) that the simulated model's
// profiles follow too.
type Fit struct {
	// Intercept in seconds; Slope in seconds per KV token.
	Intercept float64 `json:"intercept_s"`
	Slope     float64 `json:"slope_s_per_token"`
	// Samples is the number of (K, ITL) samples fitted; Proportional says
	// they did not spread enough in K for a line, so ITL ∝ K was assumed
	// through their mean.
	Samples      int  `json:"samples"`
	Proportional bool `json:"proportional,omitempty"`
}

// Need is how many workers of each role the inputs call for, fractional,
// with the reasoning.
type Need struct {
	Prefill    float64 `json:"prefill"`
	Decode     float64 `json:"decode"`
	PrefillWhy string  `json:"prefill_why"`
	DecodeWhy  string  `json:"decode_why"`
}

// Duration is a time.Duration that marshals as a string ("1.5s").
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// decodeSample is one decode worker's mean ITL over one interval, with
// the KV tokens it held.
type decodeSample struct {
	kv  float64 // tokens
	itl float64 // seconds
	n   int64   // gaps averaged
}

// fitDecode fits ITL = a + b·K to samples by least squares, each weighted
// by its gap count. With fewer than two samples or K spread below 10 % of
// its mean, it returns the line through the origin and the mean.
func fitDecode(samples []decodeSample) (Fit, bool) {
	var w, sk, si, skk, ski float64
	for _, s := range samples {
		n := float64(s.n)
		w += n
		sk += n * s.kv
		si += n * s.itl
		skk += n * s.kv * s.kv
		ski += n * s.kv * s.itl
	}
	if w == 0 {
		return Fit{}, false
	}
	mk, mi := sk/w, si/w
	vk := skk/w - mk*mk
	f := Fit{Samples: len(samples)}
	if len(samples) >= 2 && vk > 0 && math.Sqrt(vk) >= 0.1*mk {
		f.Slope = (ski/w - mk*mi) / vk
		f.Intercept = mi - f.Slope*mk
		if f.Slope > 0 && f.Intercept >= 0 {
			return f, true
		}
	}
	// Not enough spread (or a line that makes no physical sense): ITL ∝ K
	// through the mean. Where the fixed cost is large this overrates the
	// capacity below the SLO; the decision says it was assumed.
	f.Proportional, f.Intercept = true, 0
	if mk > 0 {
		f.Slope = mi / mk
	}
	return f, mi > 0
}

// Estimate returns the workers each role needs for the inputs to meet the
// SLOs, each with the arithmetic that gave it.
//
// Prefill: a worker serves λ·P̄ prompt tokens per second at rate μ (its
// throughput while busy), so it is busy a fraction ρ = λ·P̄/(N·μ). Its
// requests see the M/M/1 response time S/(1−ρ), S = P̄/μ the service time
// (Kleinrock, Queueing Systems vol. 1, 1975, §3.2), so TTFT ≤ SLO·margin
// holds for ρ ≤ 1 − S/(SLO·margin): N = λ·P̄/(μ·ρmax).
//
// Decode: a request holds about P̄ + Ō/2 KV tokens for Ō·ITL seconds, so
// the fleet holds K = λ·(P̄+Ō/2)·Ō·ITL tokens (Little's law) and each worker
// may hold as many as keep its ITL at the SLO·margin by the fitted line,
// capped by its KV pool (90 %) and its batch limit (then ITL is the line's
// at the cap): N = K / Kmax, K at least what the decode workers report
// holding now (requests that arrived before the window). A role with
// nothing to do (no prompt tokens for prefill; nothing arriving or held
// for decode) needs 0 workers.
func Estimate(in Inputs, slo SLOs) (Need, bool) {
	var nd Need
	ok := true
	λ := max(in.ArrivalRate, 0)
	// The requests prefill serves: the arrivals less those a decode worker
	// served alone.
	λp, p := λ, in.MeanPromptTokens
	if in.LocalRate > 0 && in.LocalRate < λ {
		λp = λ - in.LocalRate
		p = (λ*in.MeanPromptTokens - in.LocalRate*in.MeanLocalPromptTokens) / λp
	} else if in.LocalRate >= λ {
		λp, p = 0, 0
	}
	switch {
	case λp*p <= 0:
		// Nothing for prefill to compute: no worker needed, whatever its
		// throughput (it may never have been measured).
		nd.PrefillWhy = "no prompt tokens for prefill in the window"
		if in.LocalRate > 0 {
			nd.PrefillWhy += fmt.Sprintf(" (%.2f req/s served by decode alone)", in.LocalRate)
		}
	case in.PrefillTokensPerBusySecond <= 0:
		nd.PrefillWhy, ok = "prefill throughput not measured yet", false
	default:
		μ := in.PrefillTokensPerBusySecond
		s := p / μ
		target := slo.TTFT.Seconds() * slo.Margin
		ρ := 0.95
		if target > 0 {
			ρ = math.Max(0.05, math.Min(0.95, 1-s/target))
		}
		nd.Prefill = λp * p / (μ * ρ)
		nd.PrefillWhy = fmt.Sprintf("%.2f req/s × %.0f prompt tokens / (%.0f tokens/s per worker × utilization %.2f) = %.2f",
			λp, p, μ, ρ, nd.Prefill)
		if in.LocalRate > 0 {
			nd.PrefillWhy += fmt.Sprintf(" (%.2f req/s served by decode alone left out)", in.LocalRate)
		}
		if target > 0 && s >= target {
			nd.PrefillWhy += fmt.Sprintf(" (one mean prompt alone takes %.0f ms, over the TTFT target %.0f ms: no split meets it)",
				s*1000, target*1000)
		}
	}
	f := in.DecodeFit
	itl := slo.ITL.Seconds() * slo.Margin
	switch {
	case λ == 0 && in.DecodeKVHeld == 0:
		nd.DecodeWhy = "nothing arriving or held"
	case f.Slope <= 0:
		nd.DecodeWhy, ok = "decode step time not measured yet", false
	case itl <= 0:
		nd.DecodeWhy, ok = "no ITL SLO", false
	default:
		perReq := in.MeanPromptTokens + in.MeanOutputTokens/2
		kmax := (itl - f.Intercept) / f.Slope
		capped := ""
		if c := 0.9 * float64(in.DecodeKVTokens); c > 0 && c < kmax {
			kmax, capped = c, " (its KV pool)"
		}
		if in.DecodeMaxRunning > 0 && perReq > 0 {
			if c := float64(in.DecodeMaxRunning) * perReq; c < kmax {
				kmax, capped = c, " (its batch limit)"
			}
		}
		if kmax <= 0 {
			nd.DecodeWhy, ok = fmt.Sprintf("the fitted fixed step time %.1f ms is over the ITL target %.1f ms: no split meets it",
				f.Intercept*1000, itl*1000), false
			break
		}
		// A worker held to kmax by its pool or batch limit steps faster
		// than the target: a request then stays Ō steps of that time.
		step := min(itl, f.Intercept+f.Slope*kmax)
		held := λ * perReq * in.MeanOutputTokens * step
		nd.DecodeWhy = fmt.Sprintf("%.2f req/s × %.0f KV tokens × %.0f output tokens × %.1f ms = %.0f tokens held",
			λ, perReq, in.MeanOutputTokens, step*1000, held)
		if k := float64(in.DecodeKVHeld); k > held {
			// Requests that arrived before the window still hold their KV:
			// the workers' reports are a floor.
			held = k
			nd.DecodeWhy = fmt.Sprintf("%.0f tokens held (the decode workers' reports, median over the window; the window's arrivals alone: less)", k)
		}
		nd.Decode = held / kmax
		nd.DecodeWhy += fmt.Sprintf(" / %.0f per worker%s = %.2f", kmax, capped, nd.Decode)
	}
	return nd, ok
}

// SLOs are the targets the planner plans for.
type SLOs struct {
	// TTFT is the target time to first token, ITL the target mean time
	// between output tokens of a request (its TPOT), both met by 90 % of
	// requests (0: none).
	TTFT, ITL time.Duration
	// Margin scales both for planning (default 0.8): plan for 80 % of the
	// SLO so that noise does not cross it.
	Margin float64
}

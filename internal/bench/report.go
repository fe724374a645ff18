package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// tableWidth is the width of the summary table's rules.
const tableWidth = 50

// coalescedNote is the tokens per streamed event from which the summary
// explains why ITL and TPOT differ.
const coalescedNote = 1.05

func rule(title string, fill byte) string {
	if title == "" {
		return strings.Repeat(string(fill), tableWidth)
	}
	title = " " + title + " "
	left := max((tableWidth-len(title))/2, 1)
	right := max(tableWidth-len(title)-left, 1)
	return strings.Repeat(string(fill), left) + title + strings.Repeat(string(fill), right)
}

// PrintSummary writes the summary table of one run to w, in the shape of
// SGLang's bench_serving.
func PrintSummary(w io.Writer, cfg *Config, s *Summary) error {
	bw := bufio.NewWriter(w)
	row := func(label string, v any) {
		var val string
		switch x := v.(type) {
		case float64:
			val = strconv.FormatFloat(x, 'f', 2, 64)
		default:
			val = fmt.Sprint(x)
		}
		fmt.Fprintf(bw, "%-40s %s\n", label+":", val)
	}
	fmt.Fprintln(bw, rule("Serving Benchmark Result", '='))
	row("Endpoint", cfg.Endpoint.Path())
	row("Model", cfg.Model)
	row("Dataset", cfg.Dataset)
	if cfg.ReusePrompts {
		row("Seed", fmt.Sprintf("%d (prompts reused across rates)", cfg.Seed))
	} else {
		row("Seed", cfg.Seed)
	}
	if t := s.Trace; t != nil {
		row("Request rate (req/s)", fmt.Sprintf("trace, mean %.2f (time scale %g)", t.OfferedRate, t.TimeScale))
	} else {
		row("Request rate (req/s)", s.Rate.String())
	}
	if s.MaxConcurrency > 0 {
		row("Max request concurrency", s.MaxConcurrency)
	} else {
		row("Max request concurrency", "not set")
	}
	if t := s.Trace; t != nil {
		fmt.Fprintln(bw, rule("Trace", '-'))
		row("Trace file", t.File)
		row("Trace requests", t.Requests)
		row("Trace span (s)", t.Span)
		row("Replay span (s)", t.ReplaySpan)
		row("Mean input length (tokens)", t.MeanInput)
		row("Mean output length (tokens)", t.MeanOutput)
		row(fmt.Sprintf("Prompt blocks of %d tokens", t.BlockSize), t.Blocks)
		row("Repeated blocks (%)", 100*t.RepeatedBlockFraction)
		row("Tokens in repeated blocks (%)", 100*t.RepeatedTokenFraction)
		fmt.Fprintln(bw, rule("Result", '-'))
	}
	row("Successful requests", s.Succeeded)
	row("Failed requests", s.Failed)
	row("Shed requests (429)", s.Shed)
	if s.Resent > 0 {
		row("Resent after Retry-After", s.Resent)
	}
	row("Benchmark duration (s)", s.Duration)
	row("Total input tokens", s.InputTokens)
	row("Total generated tokens", s.OutputTokens)
	if c := s.Cache; c != nil {
		row("Prompt tokens (cache reported)", c.PromptTokens)
		row("Cached prompt tokens", c.CachedTokens)
		row("Prefix cache hit rate (%)", 100*c.HitRate)
		if c.OracleHitRate != nil {
			row("Oracle hit rate (%)", 100**c.OracleHitRate)
		}
		if c.OfOracle != nil {
			row("Hit rate of oracle (%)", 100**c.OfOracle)
		}
	} else {
		row("Prefix cache hit rate (%)", "not reported")
	}
	if s.CacheWarning != "" {
		fmt.Fprintf(bw, "Warning: %s\n", s.CacheWarning)
	}
	row("Request throughput (req/s)", s.RequestThroughput)
	row("Input token throughput (tok/s)", s.InputThroughput)
	row("Output token throughput (tok/s)", s.OutputThroughput)
	row("Total token throughput (tok/s)", s.TotalThroughput)
	row("Concurrency", s.Concurrency)
	if g := s.Goodput; g != nil {
		var slo []string
		if g.SLOTTFT > 0 {
			slo = append(slo, "TTFT <= "+strconv.FormatFloat(g.SLOTTFT, 'f', -1, 64)+" ms")
		}
		if g.SLOTPOT > 0 {
			slo = append(slo, "TPOT <= "+strconv.FormatFloat(g.SLOTPOT, 'f', -1, 64)+" ms")
		}
		row("SLO", strings.Join(slo, ", "))
		row("Requests meeting the SLO", g.Requests)
		row("Goodput (req/s)", g.Rate)
		row("Goodput fraction (%)", 100*g.Fraction)
		row("Shed fraction (%)", 100*s.ShedFraction)
	}
	dist := func(title, name string, d Dist) {
		fmt.Fprintln(bw, rule(title, '-'))
		row("Mean "+name+" (ms)", d.Mean)
		row("Median "+name+" (ms)", d.Median)
		row("P90 "+name+" (ms)", d.P90)
		row("P99 "+name+" (ms)", d.P99)
	}
	dist("Time to First Token", "TTFT", s.TTFT)
	dist("Time per Output Token (excl. 1st token)", "TPOT", s.TPOT)
	dist("Inter-token Latency", "ITL", s.ITL)
	if s.TokensPerEvent > 0 {
		row("Output tokens per stream event", s.TokensPerEvent)
	}
	if s.TokensPerEvent >= coalescedNote {
		// ITL is one gap per streamed event, TPOT one per token.
		fmt.Fprintf(bw, "Note: ITL is measured between streamed events and TPOT per token; the server sent\n"+
			"%.2f tokens per event on average (tokens coalesced into one event), so ITL is about\n"+
			"%.2f x TPOT when events come at an even pace. Compare TPOT across servers.\n", s.TokensPerEvent, s.TokensPerEvent)
	}
	dist("End-to-End Latency", "E2E", s.E2E)
	if len(s.Turns) > 0 {
		fmt.Fprintln(bw, rule("Multi-turn", '-'))
		tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "turn\tok\tfailed\tprompt tok\tcached tok\thit (%)\tmedian TTFT (ms)\tp90 TTFT (ms)\t")
		for _, t := range s.Turns {
			cached, hit := "-", "-"
			if t.CacheReported > 0 {
				cached, hit = strconv.Itoa(t.CachedTokens), strconv.FormatFloat(100*t.HitRate, 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%.2f\t%.2f\t\n", t.Turn, t.Succeeded, t.Failed, t.InputTokens,
				cached, hit, t.TTFT.Median, t.TTFT.P90)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(s.Errors) > 0 {
		fmt.Fprintln(bw, rule("Failures by type", '-'))
		types := make([]string, 0, len(s.Errors))
		for t := range s.Errors {
			types = append(types, t)
		}
		slices.Sort(types)
		for _, t := range types {
			row(t, s.Errors[t])
		}
	}
	fmt.Fprintln(bw, rule("", '='))
	return bw.Flush()
}

// PrintSweep writes one line per run of rep: the figures that change with
// the request rate.
func PrintSweep(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, rule("Request rate sweep", '='))
	warned := false
	fmt.Fprintln(tw, "rate (req/s)\tok\tfailed\tshed\treq/s\tout tok/s\tp90 TTFT (ms)\tp90 TPOT (ms)\tp90 E2E (ms)\tgoodput (req/s)\tgoodput (%)\tcache hit (%)\t")
	for i := range rep.Runs {
		s := &rep.Runs[i].Summary
		good, frac := "-", "-"
		if s.Goodput != nil {
			good = fmt.Sprintf("%.2f", s.Goodput.Rate)
			frac = fmt.Sprintf("%.1f", 100*s.Goodput.Fraction)
		}
		hit := "-"
		if s.Cache != nil {
			hit = fmt.Sprintf("%.1f", 100*s.Cache.HitRate)
		}
		if s.CacheWarning != "" {
			hit += " (!)"
			warned = true
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.1f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n", s.Rate, s.Succeeded, s.Failed, s.Shed,
			s.RequestThroughput, s.OutputThroughput, s.TTFT.P90, s.TPOT.P90, s.E2E.P90, good, frac, hit)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if warned {
		fmt.Fprintf(w, "(!) a prefix-cache hit rate above %.0f%% on prompts that share no prefix: see the warning in that rate's summary\n",
			100*UnexpectedHitRate)
	}
	_, err := fmt.Fprintln(w, rule("", '='))
	return err
}

// recordJSON is a Record in the JSON report, durations in milliseconds.
type recordJSON struct {
	Index               int       `json:"index"`
	Arrival             float64   `json:"arrival_s"`
	Sent                float64   `json:"sent_s"`
	Success             bool      `json:"success"`
	ErrorType           string    `json:"error_type,omitempty"`
	Error               string    `json:"error,omitempty"`
	InputTokens         int       `json:"input_tokens"`
	OutputTokens        int       `json:"output_tokens"`
	PlannedOutputTokens int       `json:"planned_output_tokens"`
	UsageReported       bool      `json:"usage_reported"`
	CachedTokens        *int      `json:"cached_tokens,omitempty"`
	Conversation        *int      `json:"conversation,omitempty"`
	Turn                int       `json:"turn,omitempty"`
	TTFT                float64   `json:"ttft_ms"`
	TPOT                *float64  `json:"tpot_ms,omitempty"`
	E2E                 float64   `json:"e2e_ms"`
	ITL                 []float64 `json:"itl_ms"`
	MeetsSLO            *bool     `json:"meets_slo,omitempty"`
}

type runJSON struct {
	Summary  *Summary     `json:"summary"`
	Requests []recordJSON `json:"requests"`
}

type reportJSON struct {
	Config configJSON `json:"config"`
	Runs   []runJSON  `json:"runs"`
}

// MarshalJSON writes the report as {"config": ..., "runs": [{"summary":
// ..., "requests": [...]}]}: latencies in milliseconds (fields ending in
// _ms), times from the start of the run in seconds (_s), rates "inf" or a
// number; each request says whether it met the SLO when one is given.
func (r *Report) MarshalJSON() ([]byte, error) {
	slo := r.Config.SLO()
	out := reportJSON{Config: r.Config.toJSON(), Runs: make([]runJSON, len(r.Runs))}
	for i := range r.Runs {
		run := &r.Runs[i]
		rj := runJSON{Summary: &run.Summary, Requests: make([]recordJSON, len(run.Records))}
		for j := range run.Records {
			rec := &run.Records[j]
			itl := make([]float64, len(rec.ITL))
			for k, d := range rec.ITL {
				itl[k] = ms(d)
			}
			x := recordJSON{Index: rec.Index, Arrival: rec.Arrival.Seconds(), Sent: rec.Sent.Seconds(),
				Success: rec.Success, ErrorType: rec.ErrorType, Error: rec.Error,
				InputTokens: rec.InputTokens, OutputTokens: rec.OutputTokens,
				PlannedOutputTokens: rec.PlannedOutputTokens, UsageReported: rec.UsageReported,
				TTFT: ms(rec.TTFT), E2E: ms(rec.E2E), ITL: itl}
			if rec.HasTPOT {
				t := ms(rec.TPOT)
				x.TPOT = &t
			}
			if rec.CachedReported {
				x.CachedTokens = &rec.CachedTokens
			}
			if rec.Turn > 0 {
				x.Conversation, x.Turn = &rec.Conversation, rec.Turn
			}
			if slo.Set() {
				m := slo.Meets(rec)
				x.MeetsSLO = &m
			}
			rj.Requests[j] = x
		}
		out.Runs[i] = rj
	}
	return json.Marshal(out)
}

// WriteJSON writes rep as indented JSON (see Report.MarshalJSON).
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

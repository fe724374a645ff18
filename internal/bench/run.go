package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/pdserve/pdserve/internal/openai"
)

// Options are a benchmark's config and the dependencies Run does not
// create itself.
type Options struct {
	// Config is the benchmark.
	Config Config
	// Client sends every request; Run does not close its connections.
	Client *http.Client
	// Clock times requests and schedules arrivals; nil means SystemClock.
	Clock Clock
	// Out receives the summary table of each run (and the sweep table);
	// nil discards them.
	Out io.Writer
	// Progress receives a progress bar per run and status lines; nil shows
	// neither.
	Progress io.Writer
}

// RunResult is the outcome of one request rate.
type RunResult struct {
	// Summary summarizes Records.
	Summary Summary
	// Records has one record per measured request, in arrival order.
	Records []Record
}

// Report is the outcome of a benchmark: its config (with the model name
// filled in) and one result per request rate, in the order run.
type Report struct {
	Config Config
	Runs   []RunResult
}

// SLO returns the objectives of c.
func (c *Config) SLO() SLO { return SLO{TTFT: c.SLOTTFT, TPOT: c.SLOTPOT} }

// maxModelListBytes bounds the body of GET /v1/models, in bytes.
const maxModelListBytes = 1 << 20

// modelTimeout bounds GET /v1/models.
const modelTimeout = 30 * time.Second

// DiscoverModel returns the first model that GET {baseURL}/v1/models lists.
func DiscoverModel(ctx context.Context, client *http.Client, baseURL string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, modelTimeout)
	defer cancel()
	url := (&Config{BaseURL: baseURL}).baseURL() + "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("listing models: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxModelListBytes))
	if err != nil {
		return "", fmt.Errorf("listing models: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("listing models: GET %s: %w", url, openai.DecodeError(resp.StatusCode, b))
	}
	var list openai.ModelList
	if err := json.Unmarshal(b, &list); err != nil {
		return "", fmt.Errorf("listing models: GET %s: %w", url, err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("listing models: GET %s lists no model", url)
	}
	return list.Data[0].ID, nil
}

// Run runs the benchmark: warmup, then one run per request rate. It prints
// each run's summary to o.Out as it finishes and, for several rates, a
// sweep table at the end. On cancellation it returns the runs completed so
// far with ctx's error.
func Run(ctx context.Context, o Options) (*Report, error) {
	cfg := o.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Client == nil {
		return nil, errors.New("bench: no http.Client")
	}
	clock := o.Clock
	if clock == nil {
		clock = SystemClock{}
	}
	out, status := o.Out, o.Progress
	if out == nil {
		out = io.Discard
	}
	if status == nil {
		status = io.Discard
	}
	if cfg.Model == "" {
		m, err := DiscoverModel(ctx, o.Client, cfg.BaseURL)
		if err != nil {
			return nil, err
		}
		cfg.Model = m
	}
	turns := max(cfg.MultiTurn, 1)
	var (
		prompts []Prompt
		trace   *Trace
		rates   = cfg.Rates
		err     error
	)
	if cfg.Dataset == DatasetTrace {
		if trace, err = LoadTrace(&cfg); err != nil {
			return nil, err
		}
		prompts = trace.Prompts(0, cfg.Seed, RateStream(0))
	} else if prompts, err = BuildDataset(&cfg, cfg.NumPrompts*turns, RateStream(0)); err != nil {
		return nil, err
	}
	var traceStats TraceStats
	if trace != nil {
		// One run, at the trace's own schedule; its mean arrival rate
		// stands for the request rate in the summary.
		traceStats = trace.Stats()
		rates = []Rate{Rate(traceStats.OfferedRate)}
	}
	q := &requester{client: o.Client, clock: clock, cfg: &cfg, url: cfg.baseURL() + cfg.Endpoint.Path(), keepAnswer: turns > 1}
	switch {
	case trace != nil:
		fmt.Fprintf(status, "bench: %s %s, model %q, trace %s: %d requests over %.1f s of the trace, replayed in %.1f s (time scale %g)\n",
			http.MethodPost, q.url, cfg.Model, trace.Path, len(prompts), traceStats.Span, traceStats.ReplaySpan, trace.TimeScale)
	case turns > 1:
		fmt.Fprintf(status, "bench: %s %s, model %q, %d conversations of %d turns (%s dataset), rates %v\n",
			http.MethodPost, q.url, cfg.Model, cfg.NumPrompts, turns, cfg.Dataset, cfg.Rates)
	default:
		fmt.Fprintf(status, "bench: %s %s, model %q, %d prompts (%s dataset), rates %v\n",
			http.MethodPost, q.url, cfg.Model, cfg.NumPrompts, cfg.Dataset, cfg.Rates)
	}
	if cfg.ReusePrompts {
		fmt.Fprintf(status, "bench: seed %d, every rate resends the first rate's prompts (--reuse-prompts)\n", cfg.Seed)
	} else {
		fmt.Fprintf(status, "bench: seed %d, fresh prompts for each rate\n", cfg.Seed)
	}

	if cfg.Warmup > 0 {
		wp, err := BuildDataset(&cfg, cfg.Warmup, streamWarmup)
		if err != nil {
			return nil, err
		}
		recs, _, err := dispatch(ctx, q, clock, wp, make([]time.Duration, len(wp)), cfg.MaxConcurrency, nil)
		if err != nil {
			return nil, err
		}
		failed := 0
		var first *Record
		for i := range recs {
			if !recs[i].Success {
				failed++
				if first == nil {
					first = &recs[i]
				}
			}
		}
		if failed == len(recs) {
			return nil, fmt.Errorf("warmup: all %d requests failed; the first with %s: %s", failed, first.ErrorType, first.Error)
		}
		fmt.Fprintf(status, "bench: warmup done (%d requests, %d failed)\n", len(recs), failed)
	}

	rep := &Report{Config: cfg}
	for i, rate := range rates {
		if i > 0 && !cfg.ReusePrompts {
			if prompts, err = BuildDataset(&cfg, cfg.NumPrompts*turns, RateStream(i)); err != nil {
				return rep, err
			}
		}
		bar := newBar(o.Progress, len(prompts), rate)
		var (
			recs []Record
			dur  time.Duration
		)
		switch {
		case trace != nil:
			recs, dur, err = dispatch(ctx, q, clock, prompts, trace.Offsets(), cfg.MaxConcurrency, bar)
		case turns > 1:
			recs, dur, err = dispatchConversations(ctx, q, clock, prompts, turns, Arrivals(rate, cfg.NumPrompts, cfg.Seed), cfg.MaxConcurrency, bar)
		default:
			recs, dur, err = dispatch(ctx, q, clock, prompts, Arrivals(rate, len(prompts), cfg.Seed), cfg.MaxConcurrency, bar)
		}
		if bar != nil {
			_ = bar.Finish()
		}
		if err != nil {
			return rep, err
		}
		s := Summarize(recs, dur, cfg.SLO())
		s.Rate, s.MaxConcurrency = rate, cfg.MaxConcurrency
		// Resent prompts start warm: the oracle (from cold caches) is the
		// first rate's only.
		if oracle, ok := OracleHitRate(prompts, cfg.SharedPrefixLen); ok && (i == 0 || !cfg.ReusePrompts) {
			s.setOracle(oracle)
		}
		if trace != nil {
			ts := traceStats
			s.Trace = &ts
			s.setOracle(ts.RepeatedTokenFraction)
		}
		s.CacheWarning = cacheWarning(&cfg, &s, i)
		rep.Runs = append(rep.Runs, RunResult{Summary: s, Records: recs})
		if err := PrintSummary(out, &cfg, &s); err != nil {
			return rep, err
		}
	}
	if len(rep.Runs) > 1 {
		if err := PrintSweep(out, rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// UnexpectedHitRate is the prefix-cache hit rate above which the summary
// of a dataset whose prompts share no prefix warns that the cache was warm.
const UnexpectedHitRate = 0.5

// cacheWarning returns the warning for run i of cfg when the server
// reported a prefix-cache hit rate above UnexpectedHitRate on prompts that
// should find nothing cached: single requests of the random or
// conversation dataset (the shared-prefix and multi-turn workloads share
// prefixes by design; a JSONL file's prompts may), not resent on purpose
// by ReusePrompts. It returns "" otherwise.
func cacheWarning(cfg *Config, s *Summary, i int) string {
	if s.Cache == nil || s.Cache.HitRate <= UnexpectedHitRate || cfg.MultiTurn > 1 ||
		(cfg.Dataset != DatasetRandom && cfg.Dataset != DatasetConversation) || (cfg.ReusePrompts && i > 0) {
		return ""
	}
	return fmt.Sprintf("the server reports %.1f%% of the prompt tokens cached, on %s prompts that share no prefix: "+
		"the latencies measure a warm prefix cache, not prefill. The prompts were sent before (an earlier run "+
		"with seed %d?), or the server counts cached tokens differently.", 100*s.Cache.HitRate, cfg.Dataset, cfg.Seed)
}

// newBar returns a progress bar of n requests on w, or nil if w is nil.
func newBar(w io.Writer, n int, rate Rate) *progressbar.ProgressBar {
	if w == nil {
		return nil
	}
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(fmt.Sprintf("rate %s req/s", rate)),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionShowIts(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
}

// dispatch sends prompts[i] at offsets[i] from now (sleeping on clock), with
// at most maxConc in flight (0: no cap), and waits for all of them. It
// returns the records in prompt order and the time from the start to the end
// of the last request. When ctx is done it stops sending, waits for the
// requests in flight (which end at once) and returns ctx.Err().
func dispatch(ctx context.Context, q *requester, clock Clock, prompts []Prompt, offsets []time.Duration,
	maxConc int, bar *progressbar.ProgressBar) ([]Record, time.Duration, error) {
	recs := make([]Record, len(prompts))
	var slots chan struct{}
	if maxConc > 0 {
		slots = make(chan struct{}, maxConc)
	}
	var wg sync.WaitGroup
	start := clock.Now()
	var err error
	// A request is sent when it is dispatched, or when it gets a slot.
	for i := range prompts {
		if d := offsets[i] - clock.Now().Sub(start); d > 0 {
			if err = clock.Sleep(ctx, d); err != nil {
				break
			}
		}
		if err = ctx.Err(); err != nil {
			break
		}
		due := clock.Now().Sub(start)
		wg.Go(func() {
			sent := due
			if slots != nil {
				select {
				case slots <- struct{}{}:
					defer func() { <-slots }()
					sent = max(due, clock.Now().Sub(start))
				case <-ctx.Done():
					recs[i] = Record{Index: i, Arrival: offsets[i], Sent: due, ErrorType: ErrCanceled,
						Error: "cancelled before sending", PlannedOutputTokens: prompts[i].OutputLen}
					return
				}
			}
			r := q.do(ctx, prompts[i])
			r.Index, r.Arrival, r.Sent = i, offsets[i], sent
			recs[i] = r
			if bar != nil {
				_ = bar.Add(1)
			}
		})
	}
	wg.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return recs, clock.Now().Sub(start), err
}

// ErrPreviousTurn is the ErrorType of a conversation's turns after one
// that failed: they are not sent.
const ErrPreviousTurn = "previous_turn_failed"

// dispatchConversations runs len(prompts)/turns conversations of turns
// turns: conversation c starts at starts[c] from now, its turn k (1-based)
// is prompts[c·turns+k−1] sent with the conversation's history (every
// earlier user message and the answer streamed for it) once turn k−1's
// answer ended, each turn waiting for one of maxConc slots (0: no cap).
// After a failed turn the conversation's later turns are recorded as
// ErrPreviousTurn, not sent. Records are in prompt order (conversation,
// then turn), each turn's Arrival the time it became ready to send. It
// returns as dispatch does.
func dispatchConversations(ctx context.Context, q *requester, clock Clock, prompts []Prompt, turns int, starts []time.Duration,
	maxConc int, bar *progressbar.ProgressBar) ([]Record, time.Duration, error) {
	recs := make([]Record, len(prompts))
	var slots chan struct{}
	if maxConc > 0 {
		slots = make(chan struct{}, maxConc)
	}
	var wg sync.WaitGroup
	start := clock.Now()
	var err error
	conv := func(c int) {
		var history []Turn
		failed := false
		for k := range turns {
			i := c*turns + k
			p := prompts[i]
			p.History = history
			p.InputLen += historyBytes(history)
			ready := clock.Now().Sub(start)
			rec := Record{Arrival: ready, Sent: ready, PlannedOutputTokens: p.OutputLen, InputTokens: p.InputLen}
			switch {
			case failed:
				rec.ErrorType, rec.Error = ErrPreviousTurn, fmt.Sprintf("turn %d of the conversation failed", k)
			case ctx.Err() != nil:
				rec.ErrorType, rec.Error = ErrCanceled, "cancelled before sending"
			default:
				acquired := slots == nil
				if !acquired {
					select {
					case slots <- struct{}{}:
						acquired = true
						rec.Sent = max(ready, clock.Now().Sub(start))
					case <-ctx.Done():
						rec.ErrorType, rec.Error = ErrCanceled, "cancelled before sending"
					}
				}
				if acquired {
					sent := rec.Sent
					rec = q.do(ctx, p)
					rec.Arrival, rec.Sent = ready, sent
					if slots != nil {
						<-slots
					}
				}
			}
			rec.Index, rec.Conversation, rec.Turn = i, c, k+1
			failed = failed || !rec.Success
			if rec.Success {
				history = append(slices.Clip(history), Turn{User: p.Text, Assistant: rec.answer})
			}
			rec.answer = ""
			recs[i] = rec
			if bar != nil {
				_ = bar.Add(1)
			}
		}
	}
	for c := range starts {
		if d := starts[c] - clock.Now().Sub(start); d > 0 {
			if err = clock.Sleep(ctx, d); err != nil {
				break
			}
		}
		if err = ctx.Err(); err != nil {
			break
		}
		wg.Go(func() { conv(c) })
	}
	wg.Wait()
	if err != nil {
		// Conversations never started: every turn cancelled.
		for i := range recs {
			if recs[i].Turn == 0 {
				recs[i] = Record{Index: i, Conversation: i / turns, Turn: i%turns + 1, ErrorType: ErrCanceled,
					Error: "cancelled before sending", PlannedOutputTokens: prompts[i].OutputLen}
			}
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	return recs, clock.Now().Sub(start), err
}

// historyBytes is the length of a conversation's history as the
// completions endpoint sends it, in bytes (planned tokens).
func historyBytes(h []Turn) int {
	n := 0
	for _, t := range h {
		n += len(t.User) + len(t.Assistant)
	}
	return n
}

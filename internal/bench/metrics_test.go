package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const msD = time.Millisecond

func TestPercentile(t *testing.T) {
	v := []float64{10, 20, 30, 40}
	cases := []struct {
		p, want float64
	}{
		{0, 10},
		{50, 25},      // rank 1.5: 20 + 0.5·10
		{90, 37},      // rank 2.7: 30 + 0.7·10
		{99, 39.7},    // rank 2.97
		{100, 40},     // rank 3
		{25, 17.5},    // rank 0.75
		{33.3, 19.99}, // rank 0.999
	}
	for _, c := range cases {
		if got := Percentile(v, c.p); !approx(got, c.want) {
			t.Errorf("Percentile(%v, %v) = %v, want %v", v, c.p, got, c.want)
		}
	}
	if got := Percentile([]float64{5}, 99); got != 5 {
		t.Errorf("one value: %v", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("no value: %v", got)
	}
}

func approx(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}

func TestTPOT(t *testing.T) {
	if got, ok := TPOT(500*msD, 100*msD, 5); !ok || got != 100*msD {
		t.Errorf("TPOT(500ms, 100ms, 5) = %v %v, want 100ms", got, ok)
	}
	if got, ok := TPOT(1300*msD, 300*msD, 11); !ok || got != 100*msD {
		t.Errorf("TPOT(1300ms, 300ms, 11) = %v %v, want 100ms", got, ok)
	}
	if _, ok := TPOT(50*msD, 50*msD, 1); ok {
		t.Error("one output token has no TPOT")
	}
	if _, ok := TPOT(50*msD, 50*msD, 0); ok {
		t.Error("no output token has no TPOT")
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// synthetic are five requests of a 2 s run: three successes and two
// failures.
func synthetic() []Record {
	return []Record{
		{Success: true, TTFT: 100 * msD, E2E: 500 * msD, TPOT: 100 * msD, HasTPOT: true,
			InputTokens: 10, OutputTokens: 5, ITL: repeat(100*msD, 4)},
		{Success: true, TTFT: 300 * msD, E2E: 800 * msD, TPOT: 50 * msD, HasTPOT: true,
			InputTokens: 20, OutputTokens: 11, ITL: repeat(50*msD, 10)},
		{Success: true, TTFT: 50 * msD, E2E: 50 * msD, InputTokens: 30, OutputTokens: 1},
		{ErrorType: "http_500:server_error", Error: "boom", E2E: 5 * msD},
		{ErrorType: ErrStreamClosed, Error: "eof", TTFT: 10 * msD, E2E: 90 * msD},
	}
}

func TestSummarize(t *testing.T) {
	got := Summarize(synthetic(), 2*time.Second, SLO{TTFT: 200 * msD, TPOT: 80 * msD})
	want := Summary{
		Requests: 5, Succeeded: 3, Failed: 2, Duration: 2,
		InputTokens: 60, OutputTokens: 17,
		RequestThroughput: 1.5, InputThroughput: 30, OutputThroughput: 8.5, TotalThroughput: 38.5,
		Concurrency: (0.5 + 0.8 + 0.05) / 2,
		// TTFT 50, 100, 300: p90 at rank 1.8 = 100 + 0.8·200; p99 at 1.98.
		TTFT: Dist{Count: 3, Mean: 150, Median: 100, P90: 260, P99: 296, Min: 50, Max: 300},
		// TPOT 50, 100 (the one-token request has none).
		TPOT: Dist{Count: 2, Mean: 75, Median: 75, P90: 95, P99: 99.5, Min: 50, Max: 100},
		// ITL: ten 50 ms gaps and four 100 ms gaps; median at rank 6.5,
		// p90 at rank 11.7 (indices 10…13 hold 100).
		ITL: Dist{Count: 14, Mean: 900.0 / 14, Median: 50, P90: 100, P99: 100, Min: 50, Max: 100},
		// E2E 50, 500, 800.
		E2E: Dist{Count: 3, Mean: 450, Median: 500, P90: 740, P99: 794, Min: 50, Max: 800},
		// One token per event: 5 + 11 + 1 tokens in 5 + 11 + 1 events.
		TokensPerEvent: 1,
		// Only the third meets both: the first has TPOT 100 > 80, the
		// second TTFT 300 > 200; the third has no TPOT.
		Goodput: &Goodput{SLOTTFT: 200, SLOTPOT: 80, Requests: 1, Rate: 0.5, Fraction: 0.2},
		Errors:  map[string]int{"http_500:server_error": 1, ErrStreamClosed: 1},
	}
	if d := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); d != "" {
		t.Fatalf("summary (-want +got):\n%s", d)
	}
}

func TestGoodputSLOs(t *testing.T) {
	cases := []struct {
		name string
		slo  SLO
		want *Goodput
	}{
		{"none", SLO{}, nil},
		{"ttft only", SLO{TTFT: 200 * msD}, &Goodput{SLOTTFT: 200, Requests: 2, Rate: 1, Fraction: 0.4}},
		{"tpot only", SLO{TPOT: 120 * msD}, &Goodput{SLOTPOT: 120, Requests: 3, Rate: 1.5, Fraction: 0.6}},
		{"ttft bound is inclusive", SLO{TTFT: 300 * msD, TPOT: 100 * msD}, &Goodput{SLOTTFT: 300, SLOTPOT: 100, Requests: 3, Rate: 1.5, Fraction: 0.6}},
		{"nothing meets", SLO{TTFT: 10 * msD}, &Goodput{SLOTTFT: 10, Requests: 0, Rate: 0, Fraction: 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Summarize(synthetic(), 2*time.Second, c.slo).Goodput
			if d := cmp.Diff(c.want, got, cmpopts.EquateApprox(0, 1e-9)); d != "" {
				t.Fatalf("goodput (-want +got):\n%s", d)
			}
		})
	}
}

func TestSummarizeEmpty(t *testing.T) {
	got := Summarize(nil, 0, SLO{TTFT: msD})
	want := Summary{Goodput: &Goodput{SLOTTFT: 1}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

// TestCoalescedTokens: when the server sends several tokens per streamed
// event, ITL (per event) is that many times TPOT (per token); the summary
// counts tokens per event and its table says why the two differ.
func TestCoalescedTokens(t *testing.T) {
	// 13 tokens in 5 events (the first carries 1, then 3 each) 120 ms
	// apart: TPOT = 480 ms / 12 = 40 ms, ITL 120 ms.
	recs := []Record{{Success: true, TTFT: 20 * msD, E2E: 500 * msD, TPOT: 40 * msD, HasTPOT: true,
		InputTokens: 4, OutputTokens: 13, ITL: repeat(120*msD, 4)}}
	s := Summarize(recs, time.Second, SLO{})
	if !approx(s.TokensPerEvent, 13.0/5) || s.ITL.Mean != 120 || s.TPOT.Mean != 40 {
		t.Fatalf("tokens per event %v, ITL %v, TPOT %v", s.TokensPerEvent, s.ITL.Mean, s.TPOT.Mean)
	}
	var b strings.Builder
	cfg := &Config{Endpoint: EndpointCompletions, Dataset: DatasetRandom}
	if err := PrintSummary(&b, cfg, &s); err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(b.String()), " ")
	for _, want := range []string{"Output tokens per stream event: 2.60", "2.60 tokens per event", "ITL is about 2.60 x TPOT"} {
		if !strings.Contains(flat, want) {
			t.Fatalf("summary lacks %q:\n%s", want, b.String())
		}
	}
	// One token per event: the row, and no note.
	s = Summarize(synthetic(), 2*time.Second, SLO{})
	b.Reset()
	if err := PrintSummary(&b, cfg, &s); err != nil {
		t.Fatal(err)
	}
	flat = strings.Join(strings.Fields(b.String()), " ")
	if strings.Contains(flat, "Note:") || !strings.Contains(flat, "Output tokens per stream event: 1.00") {
		t.Fatalf("one token per event:\n%s", b.String())
	}
}

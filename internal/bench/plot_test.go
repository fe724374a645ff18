package bench

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotutil"
)

// TestPlotContents: each CDF marks p50, p90 and p99 of every rate at the
// summary's percentiles; throughput and goodput, equal here, are both
// drawn with their own dashes and glyphs; rate inf is drawn at the right
// edge of the vs-rate plots with an "inf" tick and a note in the title;
// TTFT vs rate shows p50, p90 and p99.
func TestPlotContents(t *testing.T) {
	srv := fakeServer(t)
	cfg := testConfig(srv.URL)
	cfg.Model, cfg.NumPrompts, cfg.Rates = "m", 20, []Rate{1000, 2000, InfRate()}
	cfg.SLOTTFT, cfg.SLOTPOT = time.Minute, time.Minute // every request meets it: goodput = throughput
	rep, err := Run(context.Background(), Options{Config: cfg, Client: testClient(t)})
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	charts := map[string]*chart{}
	for _, c := range buildPlots(rep, &errs) {
		charts[c.file] = c.chart
	}
	if len(errs) > 0 || len(charts) != 6 {
		t.Fatalf("%d plots, errors %v", len(charts), errs)
	}

	ttft := charts["ttft_cdf.png"]
	for _, m := range []string{"p50", "p90", "p99"} {
		if !slices.Contains(ttft.legend, m) || len(ttft.series[m]) != len(rep.Runs) {
			t.Errorf("TTFT CDF: marker %s: legend %v, %d marks, want one per rate", m, ttft.legend, len(ttft.series[m]))
		}
	}
	for i, run := range rep.Runs {
		d := run.Summary.TTFT
		want := []float64{d.Median, d.P90, d.P99}
		for k, m := range []string{"p50", "p90", "p99"} {
			pt := ttft.series[m][i]
			if !approx(pt.X, want[k]) || pt.Y != []float64{0.5, 0.9, 0.99}[k] {
				t.Errorf("rate %s: %s marked at %+v, want x = %.3f ms (the summary's)", run.Summary.Rate, m, pt, want[k])
			}
		}
	}

	g := charts["goodput_vs_rate.png"]
	thr, good := g.series["request throughput"], g.series["goodput (within the SLO)"]
	if len(thr) != 3 || !slices.Equal(thr, good) || !slices.Equal(g.legend, []string{"request throughput", "goodput (within the SLO)"}) {
		t.Fatalf("goodput plot: legend %v, throughput %v, goodput %v; want both, equal, 3 points", g.legend, thr, good)
	}
	if slices.Equal(plotutil.Dashes(0), plotutil.Dashes(1)) || seriesGlyphs[0] == seriesGlyphs[1] {
		t.Error("the two series are drawn alike")
	}
	x, ok := rateAxis(rep)
	if !ok || !x.hasInf || !(x.infX > 2000) || math.IsInf(x.infX, 0) {
		t.Fatalf("rate axis %+v", x)
	}
	if last := thr[2]; last.X != x.infX || !approx(last.Y, rep.Runs[2].Summary.RequestThroughput) {
		t.Errorf("the inf run is drawn at %+v, want x = %v", last, x.infX)
	}
	ticks := g.p.X.Tick.Marker.Ticks(g.p.X.Min, g.p.X.Max)
	if n := len(ticks); n == 0 || ticks[n-1].Label != "inf" || ticks[n-1].Value != x.infX || g.p.X.Max <= x.infX {
		t.Errorf("ticks %+v, x max %v: want the last labelled inf at %v, inside the axis", ticks, g.p.X.Max, x.infX)
	}
	for _, tk := range ticks[:len(ticks)-1] {
		if tk.Value > 2000 {
			t.Errorf("a tick %+v between the largest finite rate and inf", tk)
		}
	}
	for _, name := range []string{"goodput_vs_rate.png", "ttft_p90_vs_rate.png"} {
		if c := charts[name]; !strings.Contains(c.p.Title.Text, "rate inf") {
			t.Errorf("%s: title %q does not say where inf is", name, c.p.Title.Text)
		}
	}
	tv := charts["ttft_p90_vs_rate.png"]
	if !slices.Equal(tv.legend, []string{"p50 TTFT", "p90 TTFT", "p99 TTFT"}) || len(tv.series["p90 TTFT"]) != 3 {
		t.Errorf("TTFT vs rate: legend %v, p90 %v", tv.legend, tv.series["p90 TTFT"])
	}

	// Finite rates only: no inf tick, no note.
	rep.Runs = rep.Runs[:2]
	x, _ = rateAxis(rep)
	for _, tk := range x.Ticks(1000, 2000) {
		if tk.Label == "inf" {
			t.Errorf("an inf tick without an inf rate: %+v", tk)
		}
	}
	if x.titleNote() != "" {
		t.Errorf("a note on inf without an inf rate: %q", x.titleNote())
	}
}

package bench

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Plot sizes.
const (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.5 * vg.Inch
	// maxCDFPoints bounds the points of one CDF line (the quantiles are
	// sampled evenly beyond that).
	maxCDFPoints = 2000
)

// Font sizes of the plots, in points.
const (
	titleFontSize  = 14
	labelFontSize  = 12
	tickFontSize   = 11
	legendFontSize = 11
)

// cdfMarks are the percentiles marked on each CDF line, with their glyphs.
var cdfMarks = []struct {
	name  string
	p     float64
	glyph draw.GlyphDrawer
}{
	{"p50", 50, draw.CircleGlyph{}},
	{"p90", 90, draw.PyramidGlyph{}},
	{"p99", 99, draw.BoxGlyph{}},
}

// WritePlots writes PNG plots of rep into dir (created if missing) and
// returns their paths:
//
//   - ttft_cdf.png, tpot_cdf.png, itl_cdf.png, e2e_cdf.png: the CDF of
//     each latency of the successful requests, one line per request rate,
//     its p50, p90 and p99 marked (a circle, a triangle, a square);
//   - with several rates (at least one finite), goodput_vs_rate.png
//     (request throughput, and goodput when an SLO is given, against the
//     offered rate: solid line and circles, dashed line and triangles) and
//     ttft_p90_vs_rate.png (TTFT p50, p90 and p99 against the offered
//     rate). Rate inf has no place on that axis: it is drawn at the right
//     edge, past the largest finite rate, its tick labelled "inf", and not
//     joined to the lines;
//   - for a trace replay, ttft_over_time.png (each successful request's
//     TTFT at its arrival time, the TTFT objective as a dashed line when
//     given) and, with an SLO, slo_over_time.png (the fraction of the
//     requests arriving in each of overTimeWindows equal windows of the
//     replay that met the SLO, failed and shed requests counting as not).
func WritePlots(dir string, rep *Report) ([]string, error) {
	return writePlots(dir, rep, plotWidth, plotHeight)
}

// chart is a plot and what was drawn on it, by legend name (for tests).
type chart struct {
	p *plot.Plot
	// series maps each legend name to its points (nil for a legend entry
	// that names a marker, not data).
	series map[string]plotter.XYs
	// legend lists the legend names in order.
	legend []string
}

// newChart returns a chart with the given title and axis labels, its text
// sized for reading and a grid.
func newChart(title, xlabel, ylabel string) *chart {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(titleFontSize)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text, p.Y.Label.Text = xlabel, ylabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(labelFontSize)
		a.Tick.Label.Font.Size = vg.Points(tickFontSize)
	}
	p.Legend.TextStyle.Font.Size = vg.Points(legendFontSize)
	p.Legend.ThumbnailWidth = vg.Points(28)
	p.Add(plotter.NewGrid())
	return &chart{p: p, series: map[string]plotter.XYs{}}
}

// addLegend adds a legend entry.
func (c *chart) addLegend(name string, xys plotter.XYs, thumbs ...plot.Thumbnailer) {
	c.p.Legend.Add(name, thumbs...)
	c.legend = append(c.legend, name)
	c.series[name] = append(c.series[name], xys...)
}

// writePlots is WritePlots with the size of each plot.
func writePlots(dir string, rep *Report, width, height vg.Length) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	var errs []error
	for _, c := range buildPlots(rep, &errs) {
		path := filepath.Join(dir, c.file)
		if err := c.p.Save(width, height, path); err != nil {
			errs = append(errs, fmt.Errorf("plot %s: %w", c.file, err))
			continue
		}
		paths = append(paths, path)
	}
	return paths, errors.Join(errs...)
}

// namedChart is a chart and its file name.
type namedChart struct {
	*chart
	file string
}

// cdfSpecs are the CDF plots: file, title, y label and the latencies of a
// successful record.
var cdfSpecs = []struct {
	file, title, ylabel string
	get                 func(r *Record) []time.Duration
}{
	{"ttft_cdf.png", "Time to first token", "fraction of requests", func(r *Record) []time.Duration { return []time.Duration{r.TTFT} }},
	{"tpot_cdf.png", "Time per output token (after the first)", "fraction of requests", func(r *Record) []time.Duration {
		if !r.HasTPOT {
			return nil
		}
		return []time.Duration{r.TPOT}
	}},
	{"itl_cdf.png", "Inter-token latency", "fraction of gaps", func(r *Record) []time.Duration { return r.ITL }},
	{"e2e_cdf.png", "End-to-end latency", "fraction of requests", func(r *Record) []time.Duration { return []time.Duration{r.E2E} }},
}

// buildPlots returns the plots of rep (see WritePlots), appending drawing
// errors to errs.
func buildPlots(rep *Report, errs *[]error) []namedChart {
	var out []namedChart
	for _, spec := range cdfSpecs {
		c := newChart(spec.title+" (CDF)", "ms", spec.ylabel)
		c.p.Y.Min, c.p.Y.Max = 0, 1
		c.p.Legend.Top, c.p.Legend.Left = false, false
		drawn := false
		for i := range rep.Runs {
			var ds []time.Duration
			for j := range rep.Runs[i].Records {
				if r := &rep.Runs[i].Records[j]; r.Success {
					ds = append(ds, spec.get(r)...)
				}
			}
			if len(ds) == 0 {
				continue
			}
			xys, marks := cdfPoints(ds)
			l, err := plotter.NewLine(xys)
			if err != nil {
				*errs = append(*errs, err)
				continue
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			c.p.Add(l)
			for k, m := range cdfMarks {
				s, err := plotter.NewScatter(marks[k : k+1])
				if err != nil {
					*errs = append(*errs, err)
					continue
				}
				s.Color, s.Shape, s.Radius = plotutil.Color(i), m.glyph, vg.Points(4)
				c.p.Add(s)
				c.series[m.name] = append(c.series[m.name], marks[k])
			}
			c.addLegend(fmt.Sprintf("rate %s req/s", rep.Runs[i].Summary.Rate), xys, l)
			drawn = true
		}
		if drawn {
			// One legend entry per percentile marker, in black.
			for _, m := range cdfMarks {
				c.p.Legend.Add(m.name, &plotter.Scatter{GlyphStyle: draw.GlyphStyle{Color: color.Black, Shape: m.glyph, Radius: vg.Points(4)}})
				c.legend = append(c.legend, m.name)
			}
		}
		out = append(out, namedChart{c, spec.file})
	}

	for i := range rep.Runs {
		if rep.Runs[i].Summary.Trace != nil {
			out = append(out, overTimeCharts(&rep.Runs[i], rep.Config.SLO(), errs)...)
		}
	}

	x, ok := rateAxis(rep)
	if !ok {
		return out
	}
	c := newChart("Throughput and goodput vs request rate"+x.titleNote(), "offered request rate (req/s)", "req/s")
	c.p.Y.Min = 0
	c.p.Legend.Top, c.p.Legend.Left = true, true
	c.p.X.Tick.Marker = x
	series := []struct {
		name string
		get  func(s *Summary) (float64, bool)
	}{
		{"request throughput", func(s *Summary) (float64, bool) { return s.RequestThroughput, true }},
		{"goodput (within the SLO)", func(s *Summary) (float64, bool) {
			if s.Goodput == nil {
				return 0, false
			}
			return s.Goodput.Rate, true
		}},
	}
	for i, se := range series {
		if err := x.addSeries(c, rep, i, se.name, se.get); err != nil {
			*errs = append(*errs, err)
		}
	}
	out = append(out, namedChart{c, "goodput_vs_rate.png"})

	c = newChart("Time to first token vs request rate"+x.titleNote(), "offered request rate (req/s)", "TTFT (ms)")
	c.p.Y.Min = 0
	c.p.Legend.Top, c.p.Legend.Left = true, true
	c.p.X.Tick.Marker = x
	pcts := []struct {
		name string
		get  func(d *Dist) float64
	}{
		{"p50 TTFT", func(d *Dist) float64 { return d.Median }},
		{"p90 TTFT", func(d *Dist) float64 { return d.P90 }},
		{"p99 TTFT", func(d *Dist) float64 { return d.P99 }},
	}
	for i, pc := range pcts {
		get := func(s *Summary) (float64, bool) { return pc.get(&s.TTFT), s.TTFT.Count > 0 }
		if err := x.addSeries(c, rep, i, pc.name, get); err != nil {
			*errs = append(*errs, err)
		}
	}
	out = append(out, namedChart{c, "ttft_p90_vs_rate.png"})
	return out
}

// rateX places the rates of a sweep on the x axis: a finite rate at its
// value, inf at infX, past the largest finite rate. It is the axis's
// ticker: the default ticks of the finite range and "inf" at infX.
type rateX struct {
	maxFinite float64
	hasInf    bool
	infX      float64
}

// rateAxis returns the x axis of the vs-rate plots of rep, false when rep
// has fewer than two runs or no finite rate.
func rateAxis(rep *Report) (rateX, bool) {
	x := rateX{}
	finite := 0
	for i := range rep.Runs {
		r := rep.Runs[i].Summary.Rate
		if r.IsInf() {
			x.hasInf = true
			continue
		}
		finite++
		x.maxFinite = max(x.maxFinite, float64(r))
	}
	if finite == 0 || len(rep.Runs) < 2 {
		return x, false
	}
	x.infX = x.maxFinite * 1.25
	return x, true
}

// pos is the x of rate r.
func (x rateX) pos(r Rate) float64 {
	if r.IsInf() {
		return x.infX
	}
	return float64(r)
}

// titleNote says where inf is drawn, if it is.
func (x rateX) titleNote() string {
	if !x.hasInf {
		return ""
	}
	return "\n(rate inf: every request at once, drawn at the right edge)"
}

// Ticks implements plot.Ticker.
func (x rateX) Ticks(lo, hi float64) []plot.Tick {
	if !x.hasInf {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	var ticks []plot.Tick
	for _, t := range (plot.DefaultTicks{}).Ticks(lo, x.maxFinite) {
		// No tick between the largest finite rate and inf.
		if t.Value <= x.maxFinite+1e-9*math.Abs(x.maxFinite) {
			ticks = append(ticks, t)
		}
	}
	return append(ticks, plot.Tick{Value: x.infX, Label: "inf"})
}

// addSeries draws get over the runs of rep against their rates: the finite
// rates joined by a line (series i's color, dashes and glyph, so equal
// series stay distinguishable), inf a lone point of the same glyph.
func (x rateX) addSeries(c *chart, rep *Report, i int, name string, get func(s *Summary) (float64, bool)) error {
	var fin, inf plotter.XYs
	for j := range rep.Runs {
		s := &rep.Runs[j].Summary
		y, ok := get(s)
		if !ok {
			continue
		}
		pt := plotter.XY{X: x.pos(s.Rate), Y: y}
		if s.Rate.IsInf() {
			inf = append(inf, pt)
		} else {
			fin = append(fin, pt)
		}
	}
	if len(fin)+len(inf) == 0 {
		return nil
	}
	slices.SortFunc(fin, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
	glyph := draw.GlyphStyle{Color: plotutil.Color(i), Shape: seriesGlyphs[i%len(seriesGlyphs)], Radius: vg.Points(3.5 + 1.5*float64(i))}
	var thumbs []plot.Thumbnailer
	if len(fin) > 0 {
		l, err := plotter.NewLine(fin)
		if err != nil {
			return err
		}
		l.Color, l.Width, l.Dashes = plotutil.Color(i), vg.Points(1.5), plotutil.Dashes(i)
		s, err := plotter.NewScatter(fin)
		if err != nil {
			return err
		}
		s.GlyphStyle = glyph
		c.p.Add(l, s)
		thumbs = append(thumbs, l, s)
	}
	if len(inf) > 0 {
		s, err := plotter.NewScatter(inf)
		if err != nil {
			return err
		}
		s.GlyphStyle = glyph
		c.p.Add(s)
		if len(thumbs) == 0 {
			thumbs = append(thumbs, s)
		}
	}
	c.addLegend(name, append(fin, inf...), thumbs...)
	if x.hasInf {
		// Room for the inf points and their tick label.
		c.p.X.Max = max(c.p.X.Max, x.infX+0.06*x.maxFinite)
	}
	return nil
}

// seriesGlyphs are the glyphs of the series of a vs-rate plot, in order:
// a filled circle, then hollow shapes (drawn larger, see addSeries), so a
// later series drawn over an equal earlier one leaves it visible.
var seriesGlyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}}

// cdfPoints returns the empirical CDF of ds in milliseconds (the i-th
// smallest value at (i+1)/n, sampled evenly down to maxCDFPoints points,
// always keeping the largest) and the points of cdfMarks' percentiles
// (Percentile's value, at p/100).
func cdfPoints(ds []time.Duration) (plotter.XYs, plotter.XYs) {
	v := make([]float64, len(ds))
	for i, d := range ds {
		v[i] = ms(d)
	}
	slices.Sort(v)
	n := len(v)
	step := max(1, (n+maxCDFPoints-1)/maxCDFPoints)
	xys := make(plotter.XYs, 0, n/step+2)
	for i := 0; i < n; i += step {
		xys = append(xys, plotter.XY{X: v[i], Y: float64(i+1) / float64(n)})
	}
	if (n-1)%step != 0 {
		xys = append(xys, plotter.XY{X: v[n-1], Y: 1})
	}
	marks := make(plotter.XYs, len(cdfMarks))
	for k, m := range cdfMarks {
		marks[k] = plotter.XY{X: Percentile(v, m.p), Y: m.p / 100}
	}
	return xys, marks
}

// overTimeWindows is the number of windows the replay's time is cut into
// for slo_over_time.png.
const overTimeWindows = 40

// overTimeCharts returns the over-time plots of one run (see WritePlots),
// appending drawing errors to errs.
func overTimeCharts(run *RunResult, slo SLO, errs *[]error) []namedChart {
	var out []namedChart
	c := newChart("Time to first token over the replay", "arrival (s from the start)", "TTFT (ms)")
	c.p.Y.Min = 0
	c.p.Legend.Top, c.p.Legend.Left = true, true
	var pts plotter.XYs
	var last time.Duration
	for i := range run.Records {
		r := &run.Records[i]
		last = max(last, r.Arrival)
		if r.Success {
			pts = append(pts, plotter.XY{X: r.Arrival.Seconds(), Y: ms(r.TTFT)})
		}
	}
	if len(pts) > 0 {
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			*errs = append(*errs, err)
		} else {
			sc.Color, sc.Shape, sc.Radius = plotutil.Color(0), draw.CircleGlyph{}, vg.Points(2)
			c.p.Add(sc)
			c.addLegend("TTFT of a request", pts, sc)
		}
	}
	if slo.TTFT > 0 {
		line := plotter.XYs{{X: 0, Y: ms(slo.TTFT)}, {X: last.Seconds(), Y: ms(slo.TTFT)}}
		l, err := plotter.NewLine(line)
		if err != nil {
			*errs = append(*errs, err)
		} else {
			l.Color, l.Width, l.Dashes = color.Black, vg.Points(1), plotutil.Dashes(1)
			c.p.Add(l)
			c.addLegend("TTFT objective", line, l)
		}
	}
	out = append(out, namedChart{c, "ttft_over_time.png"})
	if !slo.Set() {
		return out
	}
	c = newChart("Requests within the SLO over the replay", "arrival window (s from the start)", "fraction within the SLO")
	c.p.Y.Min, c.p.Y.Max = 0, 1.05
	c.p.Legend.Top, c.p.Legend.Left = false, true
	frac := sloOverTime(run.Records, slo, overTimeWindows)
	if len(frac) > 0 {
		l, err := plotter.NewLine(frac)
		if err != nil {
			*errs = append(*errs, err)
		} else {
			sc, _ := plotter.NewScatter(frac)
			l.Color, l.Width = plotutil.Color(0), vg.Points(1.5)
			sc.Color, sc.Shape, sc.Radius = plotutil.Color(0), draw.CircleGlyph{}, vg.Points(2.5)
			c.p.Add(l, sc)
			c.addLegend("fraction of the window's arrivals", frac, l, sc)
		}
	}
	out = append(out, namedChart{c, "slo_over_time.png"})
	return out
}

// sloOverTime cuts the span of recs' arrivals into n equal windows and
// returns, for each window that has arrivals, the point (its middle in
// seconds, the fraction of its arrivals that met slo).
func sloOverTime(recs []Record, slo SLO, n int) plotter.XYs {
	if len(recs) == 0 || n < 1 {
		return nil
	}
	var last time.Duration
	for i := range recs {
		last = max(last, recs[i].Arrival)
	}
	width := last / time.Duration(n)
	if width <= 0 {
		width, n = max(last, time.Nanosecond), 1
	}
	met, all := make([]int, n), make([]int, n)
	for i := range recs {
		w := min(int(recs[i].Arrival/width), n-1)
		all[w]++
		if slo.Meets(&recs[i]) {
			met[w]++
		}
	}
	var out plotter.XYs
	for w := range n {
		if all[w] > 0 {
			mid := (time.Duration(w)*width + width/2).Seconds()
			out = append(out, plotter.XY{X: mid, Y: float64(met[w]) / float64(all[w])})
		}
	}
	return out
}

package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot sizes.
const (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.5 * vg.Inch
	// maxCDFPoints bounds the points of one CDF line (the quantiles are
	// sampled evenly beyond that).
	maxCDFPoints = 2000
)

// WritePlots writes PNG plots of rep into dir (created if missing) and
// returns their paths:
//
//   - ttft_cdf.png, tpot_cdf.png, itl_cdf.png, e2e_cdf.png: the CDF of
//     each latency of the successful requests, one line per request rate;
//   - with several finite rates, goodput_vs_rate.png (request throughput,
//     and goodput when an SLO is given, against the offered rate) and
//     ttft_p90_vs_rate.png. Rate inf has no place on that axis and is left
//     out of these two.
func WritePlots(dir string, rep *Report) ([]string, error) {
	return writePlots(dir, rep, plotWidth, plotHeight)
}

// writePlots is WritePlots with the size of each plot.
func writePlots(dir string, rep *Report, width, height vg.Length) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name)
		if err := p.Save(width, height, path); err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		paths = append(paths, path)
		return nil
	}
	cdfs := []struct {
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
	var errs []error
	for _, c := range cdfs {
		p := plot.New()
		p.Title.Text = c.title + " (CDF)"
		p.X.Label.Text = "ms"
		p.Y.Label.Text = c.ylabel
		p.Y.Min, p.Y.Max = 0, 1
		p.Add(plotter.NewGrid())
		p.Legend.Top = false
		p.Legend.Left = false
		for i := range rep.Runs {
			var ds []time.Duration
			for j := range rep.Runs[i].Records {
				if r := &rep.Runs[i].Records[j]; r.Success {
					ds = append(ds, c.get(r)...)
				}
			}
			if len(ds) == 0 {
				continue
			}
			l, err := plotter.NewLine(cdfPoints(ds))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("rate %s req/s", rep.Runs[i].Summary.Rate), l)
		}
		if err := save(p, c.file); err != nil {
			errs = append(errs, err)
		}
	}

	var finite []*Summary
	for i := range rep.Runs {
		if s := &rep.Runs[i].Summary; !s.Rate.IsInf() {
			finite = append(finite, s)
		}
	}
	slices.SortFunc(finite, func(a, b *Summary) int {
		switch {
		case a.Rate < b.Rate:
			return -1
		case a.Rate > b.Rate:
			return 1
		}
		return 0
	})
	if len(finite) > 1 {
		p := plot.New()
		p.Title.Text = "Throughput and goodput vs request rate"
		p.X.Label.Text = "offered request rate (req/s)"
		p.Y.Label.Text = "req/s"
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		p.Legend.Left = true
		series := []struct {
			name string
			get  func(s *Summary) (float64, bool)
		}{
			{"request throughput", func(s *Summary) (float64, bool) { return s.RequestThroughput, true }},
			{"goodput", func(s *Summary) (float64, bool) {
				if s.Goodput == nil {
					return 0, false
				}
				return s.Goodput.Rate, true
			}},
		}
		for i, se := range series {
			var xys plotter.XYs
			for _, s := range finite {
				if y, ok := se.get(s); ok {
					xys = append(xys, plotter.XY{X: float64(s.Rate), Y: y})
				}
			}
			if len(xys) == 0 {
				continue
			}
			if err := addLinePoints(p, xys, i, se.name); err != nil {
				errs = append(errs, err)
			}
		}
		if err := save(p, "goodput_vs_rate.png"); err != nil {
			errs = append(errs, err)
		}

		p = plot.New()
		p.Title.Text = "P90 time to first token vs request rate"
		p.X.Label.Text = "offered request rate (req/s)"
		p.Y.Label.Text = "p90 TTFT (ms)"
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		var xys plotter.XYs
		for _, s := range finite {
			if s.TTFT.Count > 0 {
				xys = append(xys, plotter.XY{X: float64(s.Rate), Y: s.TTFT.P90})
			}
		}
		if len(xys) > 0 {
			if err := addLinePoints(p, xys, 0, "p90 TTFT"); err != nil {
				errs = append(errs, err)
			}
		}
		if err := save(p, "ttft_p90_vs_rate.png"); err != nil {
			errs = append(errs, err)
		}
	}
	return paths, errors.Join(errs...)
}

func addLinePoints(p *plot.Plot, xys plotter.XYs, color int, name string) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color, pts.Color = plotutil.Color(color), plotutil.Color(color)
	l.Width = vg.Points(1.5)
	p.Add(l, pts)
	p.Legend.Add(name, l, pts)
	return nil
}

// cdfPoints returns the empirical CDF of ds in milliseconds: the i-th
// smallest value at (i+1)/n, sampled evenly down to maxCDFPoints points
// (always keeping the largest).
func cdfPoints(ds []time.Duration) plotter.XYs {
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
	return xys
}

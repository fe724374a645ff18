// Command compare draws the request-rate sweeps of several `pdserve bench
// --output` files on shared axes — goodput, p90 TTFT and p90 TPOT against
// request rate — and prints them as one Markdown table.
//
//	go run ./tools/perf/compare -out DIR name=result.json [name=result.json ...]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// stat is one latency distribution of a bench summary, in milliseconds.
type stat struct {
	P90 float64 `json:"p90_ms"`
}

// summary is the part of a bench run summary this tool reads.
type summary struct {
	Rate    json.RawMessage `json:"request_rate"` // a number, or "inf"
	TTFT    stat            `json:"ttft"`
	TPOT    stat            `json:"tpot"`
	Goodput *struct {
		ReqPerS  float64 `json:"requests_per_s"`
		Fraction float64 `json:"fraction"`
	} `json:"goodput"`
}

type result struct {
	Config struct {
		SLOTTFT float64 `json:"slo_ttft_ms"`
		SLOTPOT float64 `json:"slo_tpot_ms"`
	} `json:"config"`
	Runs []struct {
		Summary summary `json:"summary"`
	} `json:"runs"`
}

type series struct {
	name string
	res  result
}

func main() {
	out := flag.String("out", ".", "directory for the PNG plots")
	strip := flag.Bool("strip", false, "rewrite each input file without its per-request records (keeps config and summaries)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: compare -out DIR name=result.json ...")
		os.Exit(2)
	}
	var all []series
	for _, arg := range flag.Args() {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "compare: %q: want name=file.json\n", arg)
			os.Exit(2)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			fail(err)
		}
		var r result
		if err := json.Unmarshal(b, &r); err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		all = append(all, series{name, r})
		if *strip {
			if err := stripRequests(path, b); err != nil {
				fail(err)
			}
		}
	}
	plots := []struct {
		file, title, y string
		v              func(summary) float64
	}{
		{"goodput_vs_rate.png", "Goodput (requests/s meeting both SLOs)", "goodput (req/s)", func(s summary) float64 {
			if s.Goodput == nil {
				return 0
			}
			return s.Goodput.ReqPerS
		}},
		{"ttft_p90_vs_rate.png", "p90 time to first token", "p90 TTFT (ms)", func(s summary) float64 { return s.TTFT.P90 }},
		{"tpot_p90_vs_rate.png", "p90 time per output token", "p90 TPOT (ms)", func(s summary) float64 { return s.TPOT.P90 }},
	}
	for _, p := range plots {
		if err := draw(filepath.Join(*out, p.file), p.title, p.y, all, p.v); err != nil {
			fail(err)
		}
	}
	table(all)
}

// stripRequests rewrites a bench result without the "requests" array of
// each run, so that committed results stay small.
func stripRequests(path string, b []byte) error {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	var runs []map[string]json.RawMessage
	if err := json.Unmarshal(doc["runs"], &runs); err != nil {
		return err
	}
	for _, r := range runs {
		delete(r, "requests")
	}
	raw, err := json.Marshal(runs)
	if err != nil {
		return err
	}
	doc["runs"] = raw
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compare:", err)
	os.Exit(1)
}

// rate parses a run's request rate; "inf" runs are left off the axes.
func rate(raw json.RawMessage) (float64, bool) {
	var r float64
	if json.Unmarshal(raw, &r) != nil {
		return 0, false
	}
	return r, true
}

func draw(path, title, ylabel string, all []series, v func(summary) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "request rate (req/s)"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	for i, s := range all {
		var pts plotter.XYs
		for _, run := range s.res.Runs {
			if r, ok := rate(run.Summary.Rate); ok {
				pts = append(pts, plotter.XY{X: r, Y: v(run.Summary)})
			}
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		c := plotutil.Color(i)
		line.Color, points.Color = c, c
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(s.name, line, points)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func table(all []series) {
	fmt.Printf("| rate (req/s) |")
	for _, s := range all {
		fmt.Printf(" %s: goodput (SLO %%) | p90 TTFT ms | p90 TPOT ms |", s.name)
	}
	fmt.Println()
	fmt.Printf("|---|")
	for range all {
		fmt.Printf("---|---|---|")
	}
	fmt.Println()
	for i := range all[0].res.Runs {
		r, _ := rate(all[0].res.Runs[i].Summary.Rate)
		fmt.Printf("| %g |", r)
		for _, s := range all {
			if i >= len(s.res.Runs) {
				fmt.Printf(" | | |")
				continue
			}
			m := s.res.Runs[i].Summary
			g, f := 0.0, 0.0
			if m.Goodput != nil {
				g, f = m.Goodput.ReqPerS, m.Goodput.Fraction
			}
			fmt.Printf(" %.2f (%.0f%%) | %.0f | %.1f |", g, 100*f, m.TTFT.P90, m.TPOT.P90)
		}
		fmt.Println()
	}
}

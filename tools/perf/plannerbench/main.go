// Command plannerbench builds the shifting workload of the planner's
// benchmark and reports it (docs/performance.md, "The planner").
//
//	plannerbench trace -phase 180s:4096:64:18 -phase 180s:256:1024:6 -phase 240s:4096:64:18 > shift.jsonl
//	plannerbench report -phases 180s,180s,240s -split planner=split.csv planner=out.json 2p2d=out2.json ...
//
// trace writes a Mooncake FAST'25 trace (one JSON object per line:
// timestamp in ms, input_length, output_length, hash_ids — one fresh id per
// 512-token block, so no two requests share a prefix) with Poisson arrivals
// at each phase's rate, for `pdserve bench --trace`. report reads `pdserve
// bench --output` files (run with --slo-ttft and --slo-tpot) and prints,
// per configuration, the fraction of requests within both SLOs in each
// phase (by arrival time; a failed request is outside) as a Markdown table,
// and with -plot DIR draws that fraction over time and each -split file's
// prefill and decode workers (CSV lines "seconds,prefill,decode").
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: plannerbench trace|report [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "trace":
		err = traceCmd(os.Args[2:], os.Stdout)
	case "report":
		err = reportCmd(os.Args[2:], os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q (trace, report)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "plannerbench:", err)
		os.Exit(1)
	}
}

// phase is one stretch of the workload.
type phase struct {
	d             time.Duration
	input, output int
	rate          float64
}

type phaseList []phase

func (p *phaseList) String() string { return fmt.Sprint(*p) }
func (p *phaseList) Set(s string) error {
	f := strings.Split(s, ":")
	if len(f) != 4 {
		return fmt.Errorf("phase %q: want DURATION:INPUT:OUTPUT:RATE", s)
	}
	d, err := time.ParseDuration(f[0])
	if err != nil || d <= 0 {
		return fmt.Errorf("phase %q: bad duration", s)
	}
	in, err1 := strconv.Atoi(f[1])
	out, err2 := strconv.Atoi(f[2])
	rate, err3 := strconv.ParseFloat(f[3], 64)
	if err1 != nil || err2 != nil || err3 != nil || in < 1 || out < 1 || rate <= 0 || rate > 1000 {
		return fmt.Errorf("phase %q: want positive lengths and a rate in (0, 1000]", s)
	}
	*p = append(*p, phase{d, in, out, rate})
	return nil
}

const blockSize = 512

func traceCmd(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	var phases phaseList
	fs.Var(&phases, "phase", "DURATION:INPUT:OUTPUT:RATE, repeated in order")
	seed := fs.Uint64("seed", 1, "arrival seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(phases) == 0 {
		return errors.New("no -phase")
	}
	rng := rand.New(rand.NewPCG(*seed, 0x706c616e))
	bw := bufio.NewWriter(w)
	var start time.Duration
	nextID := 0
	for _, p := range phases {
		for t := time.Duration(rng.ExpFloat64() / p.rate * float64(time.Second)); t < p.d; t += time.Duration(rng.ExpFloat64() / p.rate * float64(time.Second)) {
			blocks := (p.input + blockSize - 1) / blockSize
			ids := make([]int, blocks)
			for i := range ids {
				ids[i] = nextID
				nextID++
			}
			b, _ := json.Marshal(map[string]any{"timestamp": (start + t).Milliseconds(), "input_length": p.input,
				"output_length": p.output, "hash_ids": ids})
			bw.Write(append(b, '\n'))
		}
		start += p.d
	}
	return bw.Flush()
}

// request is what report reads of a bench record.
type request struct {
	Arrival  float64 `json:"arrival_s"`
	Success  bool    `json:"success"`
	MeetsSLO *bool   `json:"meets_slo"`
}

type benchFile struct {
	Runs []struct {
		Requests []request `json:"requests"`
	} `json:"runs"`
}

func reportCmd(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	phasesArg := fs.String("phases", "", "comma-separated phase durations, in order (e.g. 180s,180s,240s)")
	plotDir := fs.String("plot", "", "directory for the plots")
	bin := fs.Duration("bin", 15*time.Second, "bin of the attainment plot")
	var splits []string
	fs.Func("split", "NAME=FILE: a configuration's split over time, CSV seconds,prefill,decode", func(s string) error {
		splits = append(splits, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	var bounds []float64
	var end float64
	for _, f := range strings.Split(*phasesArg, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return fmt.Errorf("-phases %q: %v", *phasesArg, f)
		}
		end += d.Seconds()
		bounds = append(bounds, end)
	}
	type config struct {
		name string
		reqs []request
	}
	var configs []config
	for _, a := range fs.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want NAME=FILE", a)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var bf benchFile
		if err := json.Unmarshal(b, &bf); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		var reqs []request
		for _, r := range bf.Runs {
			reqs = append(reqs, r.Requests...)
		}
		for _, r := range reqs {
			if r.MeetsSLO == nil {
				return fmt.Errorf("%s: records without meets_slo: run the bench with --slo-ttft and --slo-tpot", path)
			}
		}
		configs = append(configs, config{name, reqs})
	}
	if len(configs) == 0 {
		return errors.New("no bench files")
	}
	phaseOf := func(t float64) int {
		return sort.SearchFloat64s(bounds, math.Nextafter(t, math.Inf(1)))
	}
	fmt.Fprint(w, "| configuration |")
	for i := range bounds {
		fmt.Fprintf(w, " phase %d |", i+1)
	}
	fmt.Fprintln(w, " whole run | worst phase |")
	fmt.Fprint(w, "|---|")
	for range bounds {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w, "---|---|")
	for _, c := range configs {
		ok, n := make([]int, len(bounds)), make([]int, len(bounds))
		for _, r := range c.reqs {
			p := phaseOf(r.Arrival)
			if p >= len(bounds) {
				continue
			}
			n[p]++
			if r.Success && *r.MeetsSLO {
				ok[p]++
			}
		}
		fmt.Fprintf(w, "| %s |", c.name)
		worst, tok, tn := 1.0, 0, 0
		for i := range bounds {
			f := frac(ok[i], n[i])
			worst = math.Min(worst, f)
			tok += ok[i]
			tn += n[i]
			fmt.Fprintf(w, " %.1f %% (%d) |", 100*f, n[i])
		}
		fmt.Fprintf(w, " %.1f %% | %.1f %% |\n", 100*frac(tok, tn), 100*worst)
	}
	if *plotDir == "" {
		return nil
	}
	if err := os.MkdirAll(*plotDir, 0o755); err != nil {
		return err
	}
	pl := plot.New()
	pl.Title.Text = "requests within both SLOs, by arrival"
	pl.X.Label.Text = "seconds"
	pl.Y.Label.Text = "fraction"
	pl.Y.Min, pl.Y.Max = 0, 1.05
	var lines []any
	for _, c := range configs {
		nb := int(math.Ceil(end / bin.Seconds()))
		ok, n := make([]int, nb), make([]int, nb)
		for _, r := range c.reqs {
			b := int(r.Arrival / bin.Seconds())
			if b < 0 || b >= nb {
				continue
			}
			n[b]++
			if r.Success && *r.MeetsSLO {
				ok[b]++
			}
		}
		var xy plotter.XYs
		for b := range nb {
			if n[b] > 0 {
				xy = append(xy, plotter.XY{X: (float64(b) + 0.5) * bin.Seconds(), Y: frac(ok[b], n[b])})
			}
		}
		lines = append(lines, c.name, xy)
	}
	if err := plotutil.AddLinePoints(pl, lines...); err != nil {
		return err
	}
	addPhaseLines(pl, bounds)
	if err := pl.Save(8*vg.Inch, 4.5*vg.Inch, filepath.Join(*plotDir, "slo_by_phase.png")); err != nil {
		return err
	}
	for _, s := range splits {
		name, path, _ := strings.Cut(s, "=")
		pts, err := readSplit(path)
		if err != nil {
			return err
		}
		sp := plot.New()
		sp.Title.Text = name + ": workers by role"
		sp.X.Label.Text = "seconds"
		sp.Y.Label.Text = "workers"
		sp.Y.Min = 0
		var pre, dec plotter.XYs
		for _, p := range pts {
			pre = append(pre, plotter.XY{X: p[0], Y: p[1]})
			dec = append(dec, plotter.XY{X: p[0], Y: p[2]})
		}
		if err := plotutil.AddLines(sp, "prefill", pre, "decode", dec); err != nil {
			return err
		}
		addPhaseLines(sp, bounds)
		if err := sp.Save(8*vg.Inch, 3*vg.Inch, filepath.Join(*plotDir, "split_"+name+".png")); err != nil {
			return err
		}
	}
	return nil
}

func frac(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

// addPhaseLines draws a grey vertical line at each phase's end but the last.
func addPhaseLines(p *plot.Plot, bounds []float64) {
	for _, x := range bounds[:len(bounds)-1] {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}})
		if err != nil {
			continue
		}
		l.Color = color.Gray{Y: 160}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(l)
	}
}

// readSplit reads "seconds,prefill,decode" lines.
func readSplit(path string) ([][3]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][3]float64
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fs := strings.Split(strings.TrimSpace(sc.Text()), ",")
		if len(fs) != 3 {
			continue
		}
		var v [3]float64
		bad := false
		for i, s := range fs {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil {
				bad = true
				break
			}
			v[i] = x
		}
		if bad {
			return nil, fmt.Errorf("%s:%d: want seconds,prefill,decode", path, line)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}

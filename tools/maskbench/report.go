package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// report is the summary of a run, as -json writes it.
type report struct {
	Env envInfo `json:"env"`
	// Schemas is the number of schema files run.
	Schemas int `json:"schemas"`
	// Classes counts schemas by outcome; BySplit the same per split.
	Classes map[string]int            `json:"classes"`
	BySplit map[string]map[string]int `json:"by_split"`
	// CompileKeywords counts the schemas refused at compile by the
	// grammar.Error Keyword ("" when the error named none).
	CompileKeywords map[string]int `json:"compile_keywords"`
	// Instances counts instances run, ValidOK and InvalidOK those
	// classified as expected, by the failure kinds of instanceFailure.
	Instances   int            `json:"instances"`
	ValidOK     int            `json:"valid_ok"`
	InvalidOK   int            `json:"invalid_ok"`
	FailureKind map[string]int `json:"failure_kinds"`
	// Tokens is the number of masks timed.
	Tokens int `json:"tokens"`
	// Compile is over schemas that compiled (µs); Mask over every
	// FillMask of the run, Step over every FillMask+Accept (µs).
	Compile percentiles `json:"compile_us"`
	Mask    percentiles `json:"mask_us"`
	Step    percentiles `json:"mask_accept_us"`
	// TimingComparable is false when schemas ran in parallel: their
	// masks competed for cores and caches.
	TimingComparable bool `json:"timing_comparable"`
	// Slowest are the schemas with the most masks over SlowMaskUS, most
	// first (at most 20): where the tail of the mask time comes from.
	SlowMaskUS int          `json:"slow_mask_us"`
	Slowest    []slowSchema `json:"slowest,omitempty"`
	// VsLLGuidance compares with llguidance's expected results, when
	// given (-expected).
	VsLLGuidance *comparison `json:"vs_llguidance,omitempty"`
}

// envInfo describes where and how a run ran.
type envInfo struct {
	CPU        string `json:"cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Parallel   int    `json:"parallel"`
	Isolated   bool   `json:"isolated"`
	GoVersion  string `json:"go_version"`
	Commit     string `json:"commit"`
	Data       string `json:"data"`
	Tokenizer  string `json:"tokenizer"`
	VocabSize  int    `json:"vocab_size"`
	Format     string `json:"format"`
	Flexible   bool   `json:"flexible_whitespace"`
	AnyOrder   bool   `json:"any_property_order"`
	BudgetS    int    `json:"budget_s"`
	Started    string `json:"started"`
	WallS      int    `json:"wall_s"`
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute
	// averages when the run started and ended: other work on the
	// machine skews timings.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// percentiles of a sample in µs, taken as MaskBench's scripts take them:
// the sorted sample's element at index ⌊n·p/100⌋.
type percentiles struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

func percentilesOf(ns []int64) percentiles {
	if len(ns) == 0 {
		return percentiles{}
	}
	slices.Sort(ns)
	at := func(p float64) float64 {
		i := min(int(float64(len(ns))*p/100), len(ns)-1)
		return float64(ns[i]) / 1e3
	}
	var sum float64
	for _, v := range ns {
		sum += float64(v)
	}
	return percentiles{N: len(ns), Mean: sum / float64(len(ns)) / 1e3,
		P50: at(50), P90: at(90), P95: at(95), P99: at(99), P999: at(99.9), Max: at(100)}
}

// slowMaskNS is the mask time from which a mask counts as slow.
const slowMaskNS = 1_000_000

// slowSchema is a schema's share of the slow masks.
type slowSchema struct {
	File  string  `json:"file"`
	Slow  int     `json:"slow"`
	Masks int     `json:"masks"`
	MaxUS float64 `json:"max_us"`
	Class string  `json:"class"`
}

// comparison is a run against llguidance's per-schema results.
type comparison struct {
	// Source is the expected-results file.
	Source string `json:"source"`
	// LLGPasses is the number of schemas of the run llguidance passes;
	// BothPass of them we pass too.
	LLGPasses int `json:"llg_passes"`
	BothPass  int `json:"both_pass"`
	// OnlyLLG counts the schemas llguidance passes and we do not, by our
	// class (compile refusals by "compile-refused:<keyword>");
	// OnlyOurs the schemas we pass and llguidance does not.
	OnlyLLG  map[string]int `json:"only_llg"`
	OnlyOurs int            `json:"only_ours"`
}

// aggregator builds a report from results as they come.
type aggregator struct {
	r       report
	compile []int64
	mask    []int64
	step    []int64
	results []schemaResult // without timings, for the summary
	slow    []slowSchema
	llg     map[string]bool
}

func newAggregator(llg map[string]bool, llgSource string) *aggregator {
	a := &aggregator{r: report{
		Classes: map[string]int{}, BySplit: map[string]map[string]int{},
		CompileKeywords: map[string]int{}, FailureKind: map[string]int{},
	}, llg: llg}
	if llg != nil {
		a.r.VsLLGuidance = &comparison{Source: llgSource, OnlyLLG: map[string]int{}}
	}
	return a
}

func (a *aggregator) add(res schemaResult) {
	r := &a.r
	r.Schemas++
	r.Classes[res.Class]++
	if r.BySplit[res.Split] == nil {
		r.BySplit[res.Split] = map[string]int{}
	}
	r.BySplit[res.Split][res.Class]++
	if res.Class == classCompile {
		r.CompileKeywords[res.Keyword]++
	} else if res.CompileNS > 0 && res.Class != classBadFile {
		a.compile = append(a.compile, res.CompileNS)
	}
	r.Instances += res.Instances
	r.ValidOK += res.ValidOK
	r.InvalidOK += res.InvalidOK
	for _, f := range res.Failures {
		r.FailureKind[f.Kind]++
	}
	r.Tokens += len(res.MaskNS)
	if slow, maxNS := countSlow(res.MaskNS); slow > 0 {
		a.slow = append(a.slow, slowSchema{File: filepath.Base(res.File), Slow: slow, Masks: len(res.MaskNS), MaxUS: float64(maxNS) / 1e3, Class: res.Class})
	}
	a.mask = append(a.mask, res.MaskNS...)
	a.step = append(a.step, res.StepNS...)
	if c := r.VsLLGuidance; c != nil {
		base := filepath.Base(res.File)
		llgPass, ours := a.llg[base], res.Class == classPass
		switch {
		case llgPass && ours:
			c.LLGPasses++
			c.BothPass++
		case llgPass:
			c.LLGPasses++
			k := res.Class
			if k == classCompile {
				k += ":" + res.Keyword
			}
			c.OnlyLLG[k]++
		case ours:
			c.OnlyOurs++
		}
	}
	res.MaskNS, res.StepNS = nil, nil
	a.results = append(a.results, res)
}

func (a *aggregator) finish() *report {
	a.r.Compile = percentilesOf(a.compile)
	a.r.Mask = percentilesOf(a.mask)
	a.r.Step = percentilesOf(a.step)
	slices.SortFunc(a.slow, func(x, y slowSchema) int {
		return cmp.Or(cmp.Compare(y.Slow, x.Slow), cmp.Compare(y.MaxUS, x.MaxUS), cmp.Compare(x.File, y.File))
	})
	a.r.SlowMaskUS = slowMaskNS / 1000
	a.r.Slowest = a.slow[:min(len(a.slow), 20)]
	return &a.r
}

// countSlow is the number of masks of ns at or over slowMaskNS, and the
// largest.
func countSlow(ns []int64) (slow int, maxNS int64) {
	for _, v := range ns {
		if v >= slowMaskNS {
			slow++
		}
		maxNS = max(maxNS, v)
	}
	return slow, maxNS
}

// writeText prints r as tables.
func (r *report) writeText(w io.Writer) {
	e := r.Env
	fmt.Fprintf(w, "MaskBench: %d schemas from %s; tokenizer %s (%d tokens); %s instances, flexible whitespace %v, any property order %v\n",
		r.Schemas, e.Data, e.Tokenizer, e.VocabSize, e.Format, e.Flexible, e.AnyOrder)
	fmt.Fprintf(w, "%s, GOMAXPROCS=%d, %d schema(s) at a time, %s, commit %s, %ds wall, load average %s at the start, %s at the end\n\n",
		e.CPU, e.GOMAXPROCS, e.Parallel, e.GoVersion, e.Commit, e.WallS, e.LoadStart, e.LoadEnd)
	splits := slices.Sorted(maps.Keys(r.BySplit))
	fmt.Fprintf(w, "%-16s %7s", "split", "schemas")
	for _, c := range classOrder {
		fmt.Fprintf(w, " %*s", max(7, len(shortClass(c))), shortClass(c))
	}
	fmt.Fprintln(w)
	row := func(name string, m map[string]int) {
		n := 0
		for _, v := range m {
			n += v
		}
		fmt.Fprintf(w, "%-16s %7d", name, n)
		for _, c := range classOrder {
			fmt.Fprintf(w, " %*d", max(7, len(shortClass(c))), m[c])
		}
		fmt.Fprintln(w)
	}
	for _, s := range splits {
		row(s, r.BySplit[s])
	}
	row("TOTAL", r.Classes)
	fmt.Fprintf(w, "\ninstances %d: valid accepted %d, invalid rejected %d; failures by kind %v\n",
		r.Instances, r.ValidOK, r.InvalidOK, r.FailureKind)
	type kv struct {
		k string
		n int
	}
	var kws []kv
	for k, n := range r.CompileKeywords {
		kws = append(kws, kv{k, n})
	}
	sort.Slice(kws, func(i, j int) bool { return kws[i].n > kws[j].n || kws[i].n == kws[j].n && kws[i].k < kws[j].k })
	fmt.Fprintf(w, "compile refusals by keyword:")
	for _, kv := range kws {
		k := kv.k
		if k == "" {
			k = `""`
		}
		fmt.Fprintf(w, " %s %d,", k, kv.n)
	}
	fmt.Fprintln(w)
	p := func(name string, q percentiles) {
		fmt.Fprintf(w, "%-22s n=%-8d mean %8.1f  p50 %8.1f  p90 %8.1f  p95 %8.1f  p99 %8.1f  p99.9 %9.1f  max %10.1f µs\n",
			name, q.N, q.Mean, q.P50, q.P90, q.P95, q.P99, q.P999, q.Max)
	}
	fmt.Fprintln(w)
	p("compile", r.Compile)
	p("mask (FillMask)", r.Mask)
	p("mask+accept", r.Step)
	if !r.TimingComparable {
		fmt.Fprintf(w, "(timings NOT comparable: %d schemas ran at a time on GOMAXPROCS=%d)\n", e.Parallel, e.GOMAXPROCS)
	}
	if len(r.Slowest) > 0 {
		fmt.Fprintf(w, "\nschemas with the most masks over %d µs:", r.SlowMaskUS)
		for _, s := range r.Slowest[:min(len(r.Slowest), 10)] {
			fmt.Fprintf(w, " %s %d/%d (max %.0f µs),", s.File, s.Slow, s.Masks, s.MaxUS)
		}
		fmt.Fprintln(w)
	}
	if c := r.VsLLGuidance; c != nil {
		fmt.Fprintf(w, "\nvs llguidance (%s): it passes %d of these, we pass %d of those; we pass %d it does not; it passes and we do not: %v\n",
			c.Source, c.LLGPasses, c.BothPass, c.OnlyOurs, c.OnlyLLG)
	}
}

func shortClass(c string) string {
	switch c {
	case classCompile:
		return "compile"
	case classValidation:
		return "valid-err"
	case classInvalidation:
		return "invalid-err"
	}
	return c
}

// quoted matches what varies between messages of one kind: quoted text
// and numbers.
var quoted = regexp.MustCompile(`"[^"]*"|'[^']*'|` + "`[^`]*`" + `|#/[^\s:]*|\b\d+\b`)

// writeSummary writes the failure reasons of results, most frequent
// first, with an example each: compile refusals by keyword and message
// pattern, instance failures by class and kind, and panics, timeouts and
// crashes by their first line.
func writeSummary(w io.Writer, results []schemaResult, llg map[string]bool) {
	type group struct {
		key      string
		n, llgOK int
		ex       []string
	}
	groups := map[string]*group{}
	add := func(key, example, file string) {
		g := groups[key]
		if g == nil {
			g = &group{key: key}
			groups[key] = g
		}
		g.n++
		if llg[filepath.Base(file)] {
			g.llgOK++
		}
		if len(g.ex) < 3 {
			g.ex = append(g.ex, example)
		}
	}
	features := map[string]map[string]int{}
	for _, res := range results {
		base := filepath.Base(res.File)
		switch res.Class {
		case classPass:
			continue
		case classCompile:
			msg := quoted.ReplaceAllString(firstLine(res.Msg), "…")
			add(fmt.Sprintf("compile-refused keyword=%q: %s", res.Keyword, msg),
				fmt.Sprintf("%s at %s: %s", base, res.ErrPath, firstLine(res.Msg)), base)
		case classValidation, classInvalidation, classInconsistent:
			for _, f := range res.Failures {
				add(fmt.Sprintf("%s: %s at %s", res.Class, f.Kind, f.Where),
					fmt.Sprintf("%s test #%d (%s) token %d/%d at %s: %q «%s» %q%s", base, f.Index, validity(f.Valid), f.Token, f.Tokens, f.Pointer, clip(f.Before, -80), f.At, clip(f.After, 40), dashed(f.Detail)), base)
			}
			if features[res.Class] == nil {
				features[res.Class] = map[string]int{}
			}
			for _, ft := range res.Features {
				features[res.Class][ft]++
			}
		default:
			msg := quoted.ReplaceAllString(clip(firstLine(res.Msg), 120), "…")
			add(fmt.Sprintf("%s: %s", res.Class, msg), fmt.Sprintf("%s: %s", base, clip(res.Msg, 600)), base)
		}
	}
	gs := slices.Collect(maps.Values(groups))
	slices.SortFunc(gs, func(a, b *group) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.key, b.key))
	})
	for _, g := range gs {
		fmt.Fprintf(w, "%6d  %s", g.n, g.key)
		if llg != nil {
			fmt.Fprintf(w, "  [llguidance passes %d of these schemas]", g.llgOK)
		}
		fmt.Fprintln(w)
		for _, ex := range g.ex {
			fmt.Fprintf(w, "        e.g. %s\n", strings.ReplaceAll(ex, "\n", "\n             "))
		}
	}
	for _, c := range []string{classValidation, classInvalidation, classInconsistent} {
		if len(features[c]) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nschema features (MaskBench's meta.features) of %s schemas:", c)
		fs := slices.Collect(maps.Keys(features[c]))
		slices.SortFunc(fs, func(a, b string) int {
			return cmp.Or(cmp.Compare(features[c][b], features[c][a]), cmp.Compare(a, b))
		})
		for _, f := range fs {
			fmt.Fprintf(w, " %s %d,", f, features[c][f])
		}
		fmt.Fprintln(w)
	}
}

// dashed is " — s", or "" for an empty s.
func dashed(s string) string {
	if s == "" {
		return ""
	}
	return " — " + s
}

func validity(valid bool) string {
	if valid {
		return "valid"
	}
	return "invalid"
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// clip shortens s to n bytes: its start for n > 0, its end for n < 0.
func clip(s string, n int) string {
	if n > 0 && len(s) > n {
		return s[:n] + "…"
	}
	if n < 0 && len(s) > -n {
		return "…" + s[len(s)+n:]
	}
	return s
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "maskbench:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	data, tokenizer                      string
	jsonOut, failures, summary           string
	expected                             string
	schemas                              string
	limit, sample, parallel              int
	compact, flexible, anyOrder, isolate bool
	budget                               time.Duration
	worker                               bool
	progress                             int
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	var c config
	fs := flag.NewFlagSet("maskbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./tools/maskbench -data DIR [flags]  (see go doc ./tools/maskbench)")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.data, "data", "", "MaskBench data directory (jsonschemabench's maskbench/data)")
	fs.StringVar(&c.tokenizer, "tokenizer", "internal/model/tokenizer/testdata/llama3", "tokenizer directory (tokenizer.json or tokenizer.json.gz, tokenizer_config.json)")
	fs.StringVar(&c.jsonOut, "json", "", "write the report as JSON to this file")
	fs.StringVar(&c.failures, "failures", "", "write every schema not passed, one JSON object a line, to this file")
	fs.StringVar(&c.summary, "summary", "", "write the failure reasons, most frequent first, with examples, to this file")
	fs.StringVar(&c.expected, "expected", "", "llguidance's json_stats/expected_maskbench.json, to compare with")
	fs.StringVar(&c.schemas, "schemas", "", "run only the files whose names match this regexp")
	fs.IntVar(&c.limit, "limit", 0, "run only the first N files (by name) after -schemas")
	fs.IntVar(&c.sample, "sample", 0, "run N files spread evenly over the (sorted) list, for a timing run")
	fs.IntVar(&c.parallel, "parallel", 1, "schemas run at a time; mask times are comparable only with 1")
	fs.BoolVar(&c.compact, "compact", false, "serialize instances with no whitespace (llguidance's json_stats) instead of json.dumps's \", \" and \": \"")
	fs.BoolVar(&c.flexible, "flexible", true, "compile schemas with FlexibleWhitespace (MaskBench's instances need it unless -compact)")
	fs.BoolVar(&c.anyOrder, "any-order", false, "compile schemas with AnyPropertyOrder (object members in any order; the default is the schema's order)")
	fs.BoolVar(&c.isolate, "isolate", true, "run schemas in child processes, so that a crash or a hang costs one schema")
	fs.DurationVar(&c.budget, "timeout", time.Minute, "time budget of one schema (compile and all its instances)")
	fs.IntVar(&c.progress, "progress", 500, "report progress on stderr every N schemas (0: never)")
	fs.BoolVar(&c.worker, "worker", false, "internal: serve schemas on stdin/stdout as a child process")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.worker {
		return &c, nil
	}
	if c.data == "" {
		fs.Usage()
		return nil, errors.New("-data is required")
	}
	if c.parallel < 1 {
		return nil, errors.New("-parallel must be at least 1")
	}
	if c.budget <= 0 {
		return nil, errors.New("-timeout must be positive")
	}
	return &c, nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.worker {
		e, err := newGrammarEngine(c.tokenizer)
		if err != nil {
			return err
		}
		return serveWorker(stdin, stdout, e)
	}
	e, err := newGrammarEngine(c.tokenizer)
	if err != nil {
		return err
	}
	var spawn func() *exec.Cmd
	if c.isolate {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		spawn = func() *exec.Cmd { return exec.Command(exe, "-worker", "-tokenizer", c.tokenizer) }
	}
	return bench(c, e, spawn, stdout, stderr)
}

// bench runs the files c selects with e in this process (spawn nil) or in
// child processes that spawn starts, and writes the reports.
func bench(c *config, e engine, spawn func() *exec.Cmd, stdout, stderr io.Writer) error {
	var re *regexp.Regexp
	if c.schemas != "" {
		var err error
		if re, err = regexp.Compile(c.schemas); err != nil {
			return fmt.Errorf("-schemas: %v", err)
		}
	}
	files, err := listFiles(c.data, re)
	if err != nil {
		return err
	}
	if c.sample > 0 && c.sample < len(files) {
		picked := make([]string, c.sample)
		for i := range picked {
			picked[i] = files[i*len(files)/c.sample]
		}
		files = picked
	}
	if c.limit > 0 && c.limit < len(files) {
		files = files[:c.limit]
	}
	if len(files) == 0 {
		return fmt.Errorf("no schema files in %s", c.data)
	}
	var llg map[string]bool
	if c.expected != "" {
		if llg, err = readExpected(c.expected); err != nil {
			return err
		}
	}
	o := runOptions{ser: serializer{compact: c.compact}, compileOptions: compileOptions{flexible: c.flexible, anyOrder: c.anyOrder}, budget: c.budget}
	newWorker := func() worker { return inProcess{e: e, o: o} }
	if spawn != nil {
		newWorker = func() worker { return newProcWorker(spawn, o, 30*time.Second) }
	}
	var failures *bufio.Writer
	if c.failures != "" {
		f, err := os.Create(c.failures)
		if err != nil {
			return err
		}
		defer f.Close()
		failures = bufio.NewWriter(f)
	}

	start, loadStart, rev := time.Now(), loadAvg(), commit()
	agg := newAggregator(llg, c.expected)
	results := make(chan schemaResult)
	go runAll(files, c.parallel, newWorker, results)
	for res := range results {
		agg.add(res)
		if failures != nil && res.Class != classPass {
			res.MaskNS, res.StepNS = nil, nil
			b, _ := json.Marshal(res)
			failures.Write(append(b, '\n'))
		}
		if n := agg.r.Schemas; c.progress > 0 && (n%c.progress == 0 || n == len(files)) {
			fmt.Fprintf(stderr, "maskbench: %d/%d schemas, %v, %s\n", n, len(files), agg.r.Classes, time.Since(start).Round(time.Second))
		}
	}
	r := agg.finish()
	r.TimingComparable = c.parallel == 1
	format := "json.dumps"
	if c.compact {
		format = "compact"
	}
	r.Env = envInfo{CPU: cpuModel(), GOMAXPROCS: runtime.GOMAXPROCS(0), Parallel: c.parallel, Isolated: spawn != nil,
		GoVersion: runtime.Version(), Commit: rev, Data: c.data, Tokenizer: c.tokenizer, VocabSize: e.vocabSize(),
		Format: format, Flexible: c.flexible, AnyOrder: c.anyOrder, BudgetS: int(c.budget.Seconds()),
		Started: start.UTC().Format(time.RFC3339), WallS: int(time.Since(start).Seconds()),
		LoadStart: loadStart, LoadEnd: loadAvg()}
	if failures != nil {
		if err := failures.Flush(); err != nil {
			return err
		}
	}
	r.writeText(stdout)
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if c.summary != "" {
		var b bytes.Buffer
		writeSummary(&b, agg.results, llg)
		if err := os.WriteFile(c.summary, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// readExpected reads llguidance's expected_maskbench.json: file name to
// {} when llguidance passes the schema, else its error.
func readExpected(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	pass := make(map[string]bool, len(m))
	for k, v := range m {
		pass[k] = len(v) == 0
	}
	return pass, nil
}

// cpuModel is the first "model name" of /proc/cpuinfo, else GOARCH.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

// loadAvg is the first three fields of /proc/loadavg, or "".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// commit is the VCS revision the binary was built from, or the working
// tree's HEAD.
func commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

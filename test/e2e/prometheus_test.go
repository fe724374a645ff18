package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	promlabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// The deployment files the tests check, relative to this package.
var (
	promConfig   = filepath.Join("..", "..", "deploy", "prometheus", "prometheus.yml")
	promRules    = filepath.Join("..", "..", "deploy", "prometheus", "rules.yml")
	promRuleTest = filepath.Join("..", "..", "deploy", "prometheus", "rules_test.yml")
	dashboard    = filepath.Join("..", "..", "deploy", "grafana", "pdserve.json")
)

// requirePromtoolEnv, when set (CI sets it after installing Debian's
// prometheus package), turns a missing promtool into a failure instead of
// a skip, so the checks cannot silently stop running.
const requirePromtoolEnv = "PDSERVE_REQUIRE_PROMTOOL"

// promtool returns the path of promtool, or skips the test (fails it if
// PDSERVE_REQUIRE_PROMTOOL is set) when it is not installed.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv(requirePromtoolEnv) != "" {
			t.Fatalf("promtool not on PATH and %s is set: install Debian's prometheus package", requirePromtoolEnv)
		}
		t.Skip("promtool not on PATH: install Debian's prometheus package (apt-get install prometheus; .ci/run does) to run the Prometheus checks")
	}
	return p
}

// runPromtool runs promtool with args (and stdin, if not nil), failing the
// test with its output unless it exits with one of okCodes (default 0).
func runPromtool(t *testing.T, stdin []byte, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("promtool %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// TestPrometheusConfigAndRules: the scrape configuration and the alert
// rules pass promtool's checks, and the rules' unit tests pass (each alert
// fires on the series it guards against and not on the healthy ones).
func TestPrometheusConfigAndRules(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"check", "config", promConfig},
		{"check", "rules", promRules},
		{"test", "rules", promRuleTest},
	} {
		if out, code := runPromtool(t, nil, args...); code != 0 {
			t.Errorf("promtool %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
}

// upWorkerRE matches the lines `pdserve up` prints for its workers:
// "  prefill worker http://127.0.0.1:PORT (KV ...)", "  decode worker  URL".
var upWorkerRE = regexp.MustCompile(`^\s+(prefill|decode|colocated) worker\s+(http://\S+)`)

// TestScrapeOfUp runs `pdserve up --metrics-compat sglang` as a user would,
// reads its workers' URLs from its startup lines, serves a few requests,
// scrapes the router and every worker, and checks the scrapes: every
// metric a dashboard panel, a dashboard variable or an alert rule queries
// is in them, with every label value the query matches on exactly, and
// promtool check metrics finds nothing wrong but the names SGLang chose.
func TestScrapeOfUp(t *testing.T) {
	t.Parallel()
	p := startProc(t, "up", "--port", "0", "--kv-cache-memory", "64MiB", "--sim-layers", "2",
		"--metrics-compat", "sglang")
	router := p.waitLine(t, readyRE, 60*time.Second)
	var workers []string
	for _, l := range p.Lines() {
		if m := upWorkerRE.FindStringSubmatch(l); m != nil {
			workers = append(workers, m[2])
		}
	}
	if len(workers) != 2 {
		t.Fatalf("want a prefill and a decode worker in up's startup lines, got %v in\n%s", workers, strings.Join(p.Lines(), "\n"))
	}
	for i := range 3 {
		status, body := postJSON(t, router+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("scrape me %d", i),
			"max_tokens": 6, "ignore_eos": true})
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, body)
		}
	}
	scrapes := map[string][]byte{"router": scrape(t, router)}
	for _, w := range workers {
		scrapes[w] = scrape(t, w)
	}
	p.stop(t)

	series := map[string][]map[string]string{} // name → label sets
	for target, body := range scrapes {
		for n, ls := range scrapedSeries(t, target, body) {
			series[n] = append(series[n], ls...)
		}
	}
	queried := queriedMetrics(t)
	if len(queried) < 20 {
		t.Fatalf("only %d metrics queried by the dashboard and rules: %v", len(queried), queried)
	}
	var missing []string
	for _, q := range queried {
		if synthetic[q.name] {
			continue
		}
		have, ok := series[q.name]
		if !ok {
			missing = append(missing, fmt.Sprintf("%s (%s)", q.name, q.where))
			continue
		}
		for k, v := range q.equal {
			found := false
			for _, ls := range have {
				found = found || ls[k] == v
			}
			if !found {
				missing = append(missing, fmt.Sprintf("%s{%s=%q} (%s)", q.name, k, v, q.where))
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("queried but not in the scrape of `pdserve up`:\n  %s", strings.Join(missing, "\n  "))
	}

	t.Run("promtool check metrics", func(t *testing.T) {
		for target, body := range scrapes {
			out, code := runPromtool(t, body, "check", "metrics")
			if code != 0 && code != 3 { // 3: lint problems, judged below
				t.Errorf("%s: promtool check metrics exit %d:\n%s", target, code, out)
				continue
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line != "" && !sglangNaming(line) {
					t.Errorf("%s: promtool check metrics: %s", target, line)
				}
			}
		}
	})
}

// synthetic are series Prometheus makes itself when it scrapes, so no
// target exposes them.
var synthetic = map[string]bool{"up": true}

// sglangNaming reports a promtool lint problem that only SGLang's own names
// have (a colon, an abbreviated unit such as _ms or _gb_s): kept as they
// are, since an SGLang dashboard queries exactly those names.
func sglangNaming(line string) bool {
	name, problem, _ := strings.Cut(line, " ")
	return strings.HasPrefix(name, "sglang:") && (problem == "metric names should not contain ':'" ||
		problem == "metric names should not contain abbreviated units")
}

func scrape(t *testing.T, base string) []byte {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", base, resp.StatusCode, err)
	}
	return body
}

// scrapedSeries returns the label sets of each series name a scrape has:
// each family's name, and a histogram's _bucket, _sum and _count.
func scrapedSeries(t *testing.T, target string, body []byte) map[string][]map[string]string {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	out := map[string][]map[string]string{}
	for name, mf := range mfs {
		var sets []map[string]string
		for _, m := range mf.GetMetric() {
			sets = append(sets, labels(m))
		}
		out[name] = sets
		if mf.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = sets
			}
		}
	}
	return out
}

// grafanaVar matches a Grafana variable in a query: $name, ${name} or
// ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{[^}]+\}|\$\w+`)

// promQL makes a dashboard query plain PromQL: interval variables become
// 1m, others (inside label matchers) match anything.
func promQL(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "interval") {
			return "1m"
		}
		return ".*"
	})
}

// labelValuesRE reads the metric of a label_values(metric, label) variable.
var labelValuesRE = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// selection is one series selector of a dashboard or rule query: the
// metric name, the labels it matches with = (target labels that Prometheus
// adds, job and instance, left out), and where it is.
type selection struct {
	name  string
	equal map[string]string
	where string
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = map[string]bool{"job": true, "instance": true}

// queriedMetrics parses every query of the dashboard and the alert rules
// and returns each series selector in them.
func queriedMetrics(t *testing.T) []selection {
	t.Helper()
	var out []selection
	add := func(where, expr string) {
		e, err := parser.NewParser(parser.Options{}).ParseExpr(promQL(expr))
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, expr, err)
			return
		}
		n := 0
		parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			sel := selection{name: vs.Name, equal: map[string]string{}, where: where}
			for _, m := range vs.LabelMatchers {
				switch {
				case m.Name == model.MetricNameLabel:
					if sel.name == "" {
						sel.name = m.Value
					}
				case m.Type == promlabels.MatchEqual && !targetLabels[m.Name]:
					sel.equal[m.Name] = m.Value
				}
			}
			if sel.name != "" {
				out = append(out, sel)
				n++
			}
			return nil
		})
		if n == 0 {
			t.Errorf("%s: %q selects no metric by name", where, expr)
		}
	}

	raw, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	panels := 0
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			panels++
			if len(p.Targets) == 0 {
				t.Errorf("dashboard panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				add(fmt.Sprintf("panel %q", p.Title), tg.Expr)
			}
		}
	}
	walk(dash.Panels)
	if panels == 0 {
		t.Fatalf("%s: no panels", dashboard)
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesRE.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("dashboard variable %q: no label_values(metric, …) in %q", v.Name, v.Definition)
			continue
		}
		out = append(out, selection{name: m[1], where: fmt.Sprintf("variable %q", v.Name)})
	}

	raw, err = os.ReadFile(promRules)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", promRules, err)
	}
	nrules := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			add("alert "+r.Alert, r.Expr)
			nrules++
		}
	}
	if nrules == 0 {
		t.Fatalf("%s: no rules", promRules)
	}
	return out
}

type grafanaPanel struct {
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	Panels  []grafanaPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

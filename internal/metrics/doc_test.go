package metrics

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// exposedFamilies returns every metric family pdserve exposes, name to
// type: those of the golden expositions in testdata/ and the peer
// authentication counter (read at scrape time, so it has no golden file).
func exposedFamilies(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
				out[f[2]] = f[3]
			}
		}
	}
	reg := prometheus.NewRegistry()
	if err := NewPeerAuth(reg, "decode", func() map[string]map[string]uint64 {
		return map[string]map[string]uint64{ChannelKV: {"bad_proof": 1}}
	}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		out[mf.GetName()] = strings.ToLower(mf.GetType().String())
	}
	return out
}

// documentedFamilies returns the families docs/metrics.md lists in its
// tables (a row whose first cell is a metric name in backquotes), name to
// the first word of its type cell.
func documentedFamilies(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 4 || strings.TrimSpace(cells[0]) != "" {
			continue
		}
		name := strings.TrimSpace(cells[1])
		if len(name) < 3 || name[0] != '`' || name[len(name)-1] != '`' {
			continue
		}
		name = strings.Trim(name, "`")
		if !strings.HasPrefix(name, "pdserve_") && !strings.HasPrefix(name, "sglang:") {
			continue
		}
		typ, _, _ := strings.Cut(strings.TrimSpace(cells[2]), ",")
		if _, dup := out[name]; dup {
			t.Errorf("docs/metrics.md lists %s twice", name)
		}
		out[name] = typ
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMetricsDocumented: docs/metrics.md lists every metric family pdserve
// exposes, with its type, and lists none it does not expose, so the page
// cannot go stale as series are added, renamed or dropped.
func TestMetricsDocumented(t *testing.T) {
	exposed, documented := exposedFamilies(t), documentedFamilies(t)
	if len(documented) == 0 {
		t.Fatal("docs/metrics.md has no metric table rows")
	}
	for name, typ := range exposed {
		doc, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("%s (%s) is exposed but not in docs/metrics.md", name, typ)
		case doc != typ:
			t.Errorf("%s is a %s, docs/metrics.md says %q", name, typ, doc)
		}
	}
	for name := range documented {
		if _, ok := exposed[name]; !ok {
			t.Errorf("docs/metrics.md lists %s, which no golden exposition in testdata/ has", name)
		}
	}
}

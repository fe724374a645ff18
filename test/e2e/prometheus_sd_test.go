package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
)

// TestPrometheusFollowsUp: a real Prometheus server, configured once with
// the router's HTTP service discovery (deploy/prometheus/prometheus.yml's
// pdserve-workers job), scrapes every worker of `pdserve up` — whose
// workers take free ports — with its role as the job, and the series keep
// their own role label.
func TestPrometheusFollowsUp(t *testing.T) {
	t.Parallel()
	promtool(t) // skips (or fails in CI) without Debian's prometheus package
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv(requirePromtoolEnv) != "" {
			t.Fatalf("prometheus not found: %v", err)
		}
		t.Skip("prometheus is not installed")
	}
	up := startProc(t, "up", "--port", "0", "--kv-cache-memory", "64MiB", "--sim-layers", "2")
	base := up.waitLine(t, readyRE, 60*time.Second)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: pdserve-workers
    http_sd_configs:
      - url: %s/discovery/prometheus
        refresh_interval: 1s
    relabel_configs:
      - source_labels: [__meta_pdserve_role]
        target_label: job
        replacement: pdserve-$1
      - source_labels: [__meta_pdserve_worker_id]
        target_label: worker
`, base)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testbin.FreePort(t)
	p, err := testbin.Start(t, prom, "prometheus", nil, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("http://127.0.0.1:%d/api/v1/", port)
	hc := &http.Client{Timeout: 5 * time.Second}
	query := func(q string) ([]map[string]string, error) {
		resp, err := hc.Get(api + "query?query=" + q)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var v struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return nil, err
		}
		var out []map[string]string
		for _, r := range v.Data.Result {
			out = append(out, r.Metric)
		}
		return out, nil
	}
	state, ok := testbin.WaitUntil(60*time.Second, func() (bool, string) {
		ms, err := query("up%3D%3D1")
		if err != nil {
			return false, err.Error()
		}
		var jobs []string
		for _, m := range ms {
			jobs = append(jobs, m["job"])
		}
		sort.Strings(jobs)
		got := strings.Join(jobs, " ")
		return got == "pdserve-decode pdserve-prefill", got
	})
	if !ok {
		t.Fatalf("Prometheus's up targets: %q, want the decode and the prefill worker; prometheus stderr:\n%s", state, p.Stderr())
	}
	ms, err := query(`pdserve_kv_pages%7Bstate%3D%22used%22%7D`)
	if err != nil {
		t.Fatal(err)
	}
	roleOK := regexp.MustCompile(`^(prefill|decode)$`)
	if len(ms) != 2 {
		t.Fatalf("pdserve_kv_pages{state=used}: %v", ms)
	}
	for _, m := range ms {
		if !roleOK.MatchString(m["role"]) || "pdserve-"+m["role"] != m["job"] || m["worker"] == "" {
			t.Errorf("series labels %v: want its own role, the job named after it and the worker id", m)
		}
	}
	up.stop(t)
}

package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/testbin"
)

// waitUntil checks cond every 10 ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() (bool, string)) (string, bool) {
	return testbin.WaitUntil(timeout, cond)
}

// getBody GETs url and returns the body of a 200 answer.
func getBody(hc *http.Client, url string) ([]byte, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

// scrape GETs base/metrics and parses the text exposition.
func scrape(hc *http.Client, base string) (map[string]*dto.MetricFamily, error) {
	body, err := getBody(hc, base+"/metrics")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("parse %s/metrics: %w", base, err)
	}
	return mfs, nil
}

// seriesName renders a sample as name{label="value",...}.
func seriesName(name string, m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return name + "{" + strings.Join(ls, ",") + "}"
}

// labelsOf returns a sample's labels by name.
func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// valueOf returns a gauge's, counter's or untyped sample's value.
func valueOf(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// quietSignals scrapes a worker's /metrics and describes every signal that
// is not at rest: a pdserve_requests gauge other than 0, used KV pages, or a
// missing gauge. It returns "" when all is quiet.
func quietSignals(hc *http.Client, base string) string {
	mfs, err := scrape(hc, base)
	if err != nil {
		return err.Error()
	}
	var bad []string
	reqs := mfs["pdserve_requests"]
	if reqs == nil || len(reqs.GetMetric()) == 0 {
		bad = append(bad, "no pdserve_requests gauges")
	}
	for _, m := range reqs.GetMetric() {
		if v := valueOf(m); v != 0 {
			bad = append(bad, fmt.Sprintf("%s = %v", seriesName("pdserve_requests", m), v))
		}
	}
	usedSeen := false
	for _, m := range mfs["pdserve_kv_pages"].GetMetric() {
		if labelsOf(m)["state"] == "used" {
			usedSeen = true
			if v := valueOf(m); v != 0 {
				bad = append(bad, fmt.Sprintf("%s = %v", seriesName("pdserve_kv_pages", m), v))
			}
		}
	}
	if !usedSeen {
		bad = append(bad, `no pdserve_kv_pages{state="used"} gauge`)
	}
	sort.Strings(bad)
	return strings.Join(bad, "; ")
}

// finishedByOutcome reads pdserve_requests_finished_total by outcome.
func finishedByOutcome(mfs map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mfs["pdserve_requests_finished_total"].GetMetric() {
		out[labelsOf(m)["outcome"]] += valueOf(m)
	}
	return out
}

// debugRequests is the answer of a worker's /debug/requests.
type debugRequests struct {
	Role     string                  `json:"role"`
	Requests []lifecycle.RequestInfo `json:"requests"`
}

// liveRequests GETs base/debug/requests.
func liveRequests(hc *http.Client, base string) (debugRequests, error) {
	var d debugRequests
	body, err := getBody(hc, base+"/debug/requests")
	if err != nil {
		return d, err
	}
	err = json.Unmarshal(body, &d)
	return d, err
}

// describeRequests renders live requests, one a line, with their stage,
// age and last event.
func describeRequests(list []lifecycle.RequestInfo) string {
	var b strings.Builder
	for _, r := range list {
		fmt.Fprintf(&b, "    rid %s room %s gen %d stage %s (%.3fs in stage, age %.3fs, deadline left %.3fs) pages %d peer %s last %q\n",
			r.RID, r.Room, r.Gen, r.Stage, r.InStageSecs, r.AgeSeconds, r.DeadlineLeft, r.Pages, r.PeerAddr, r.LastEvent)
		for _, h := range r.History {
			fmt.Fprintf(&b, "      %s %s\n", h.At.Format("15:04:05.000"), h.What)
		}
	}
	return b.String()
}

// queryTimeout bounds the suite's queries to a worker loop (Stats,
// Requests, Request). It is long on purpose: a query that times out leaves
// the loop to write its answer later, while worker.Worker has already
// returned it (a data race in pdserve, see Worker.query); the suite
// measures how long loops take to answer and judges that itself
// (loopAnswerBound).
const queryTimeout = 30 * time.Second

// loopAnswerBound is how long a worker loop may take to answer a query,
// beyond the test process's own scheduling lag (lagProbe).
const loopAnswerBound = 2 * time.Second

// lagProbe measures the test process's scheduling lag: how late a
// goroutine that asked to wake up runs. CPU starvation (other processes on
// the machine, the race detector, GC) delays every goroutine the same way,
// a worker loop's deadline checks included, so the stage bounds allow for
// the lag measured; on a quiet machine it is a few milliseconds.
type lagProbe struct {
	max  atomic.Int64 // nanoseconds
	stop chan struct{}
	wg   sync.WaitGroup
}

// startLagProbe starts measuring, every 10 ms, until stopped.
func startLagProbe() *lagProbe {
	p := &lagProbe{stop: make(chan struct{})}
	p.wg.Go(func() {
		const period = 10 * time.Millisecond
		t := time.NewTimer(period)
		defer t.Stop()
		for {
			asked := time.Now()
			t.Reset(period)
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			if lag := time.Since(asked) - period; lag > time.Duration(p.max.Load()) {
				p.max.Store(int64(lag))
			}
		}
	})
	return p
}

// Max is the longest lag seen so far.
func (p *lagProbe) Max() time.Duration { return time.Duration(p.max.Load()) }

// Stop stops measuring and waits for the probe goroutine.
func (p *lagProbe) Stop() {
	close(p.stop)
	p.wg.Wait()
}

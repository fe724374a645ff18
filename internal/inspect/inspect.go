// Package inspect implements `pdserve inspect`: it asks a router for its
// workers and the requests it serves, asks every worker for its live
// requests, and prints one table,
// flagging each request that has used more than half of its stage's
// deadline — the requests that are about to time out, or that would be
// pinned in a system without deadlines.
package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pdserve/pdserve/internal/router"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// maxBody bounds each answer read (a worker with many live requests sends
// a long list; 64 MiB is far beyond any real one).
const maxBody = 64 << 20

// Row is one live request on one worker.
type Row struct {
	Worker string `json:"worker"`
	Role   string `json:"role"`
	workerapi.RequestInfo
	// Flagged: more than half of the stage's deadline is used.
	Flagged bool `json:"flagged"`
}

// Report is what inspect found.
type Report struct {
	// Summary counts the rows per (role, stage), before any Filter.
	Summary []StageSummary `json:"summary"`
	Rows    []Row          `json:"requests"`
	// Errors lists workers that could not be asked, with why: their
	// requests are missing from Rows.
	Errors []string `json:"errors,omitempty"`
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}

// Collect asks the router at routerURL for its workers and each worker for
// its live requests. A worker that cannot be asked is reported in
// Report.Errors; an unreachable router is an error.
func Collect(ctx context.Context, c *http.Client, routerURL string) (Report, error) {
	routerURL = strings.TrimRight(routerURL, "/")
	var ws struct {
		Workers []router.WorkerStatus `json:"workers"`
	}
	if err := getJSON(ctx, c, routerURL+"/debug/workers", &ws); err != nil {
		return Report{}, fmt.Errorf("router %s: %w", routerURL, err)
	}
	// Every worker is asked at once, so one that does not answer (frozen,
	// partitioned) costs the timeout once and hides no other worker.
	type answer struct {
		rows []Row
		err  string
	}
	// The router's own list comes first: requests whose legs it is
	// sending or retrying, or whose tokens it streams.
	targets := append([]router.WorkerStatus{{URL: routerURL, Role: "router"}}, ws.Workers...)
	answers := make([]answer, len(targets))
	var wg sync.WaitGroup
	for i, w := range targets {
		wg.Go(func() {
			var list workerapi.RequestList
			if err := getJSON(ctx, c, w.URL+workerapi.PathRequests, &list); err != nil {
				what := w.Role + " worker"
				if i == 0 {
					what = "router"
				}
				answers[i].err = fmt.Sprintf("%s %s: %v", what, w.URL, err)
				return
			}
			for _, ri := range list.Requests {
				answers[i].rows = append(answers[i].rows, Row{Worker: w.URL, Role: list.Role, RequestInfo: ri,
					Flagged: ri.StageBudget > 0 && ri.InStageSecs > ri.StageBudget/2})
			}
		})
	}
	wg.Wait()
	rep := Report{Rows: []Row{}, Summary: []StageSummary{}}
	for _, a := range answers {
		rep.Rows = append(rep.Rows, a.rows...)
		if a.err != "" {
			rep.Errors = append(rep.Errors, a.err)
		}
	}
	sort.SliceStable(rep.Rows, func(i, j int) bool { return rep.Rows[i].AgeSeconds > rep.Rows[j].AgeSeconds })
	decodeProgress(rep.Rows)
	rep.Summary = summarize(rep.Rows)
	return rep, nil
}

// decodeProgress shows on each router row still in stage "legs" the
// decode leg's progress: a non-streaming request sends the client nothing
// until the end, while decode generates.
func decodeProgress(rows []Row) {
	decode := map[string]Row{}
	for _, r := range rows {
		if r.Role == "decode" || r.Role == "colocated" {
			decode[r.RID] = r
		}
	}
	for i, r := range rows {
		if r.Role != "router" || r.Stage != "legs" {
			continue
		}
		rid := r.RID
		if r.Gen > 1 {
			rid = fmt.Sprintf("%s-g%d", r.RID, r.Gen)
		}
		if d, ok := decode[rid]; ok {
			rows[i].OutputTokens = d.OutputTokens
			rows[i].LastEvent = fmt.Sprintf("%s; %s: %s, %d tokens so far", r.LastEvent, d.Role, d.Stage, d.OutputTokens)
		}
	}
}

// StageSummary counts the live requests of one stage of one role.
type StageSummary struct {
	Role  string `json:"role"`
	Stage string `json:"stage"`
	Count int    `json:"count"`
	// OldestSeconds is the longest any of them has been in the stage.
	OldestSeconds float64 `json:"oldest_in_stage_s"`
	// Flagged counts those past half their stage's deadline.
	Flagged int `json:"flagged"`
}

func summarize(rows []Row) []StageSummary {
	by := map[[2]string]*StageSummary{}
	var keys [][2]string
	for _, r := range rows {
		k := [2]string{r.Role, r.Stage}
		s, ok := by[k]
		if !ok {
			s = &StageSummary{Role: r.Role, Stage: r.Stage}
			by[k] = s
			keys = append(keys, k)
		}
		s.Count++
		s.OldestSeconds = max(s.OldestSeconds, r.InStageSecs)
		if r.Flagged {
			s.Flagged++
		}
	}
	roleOrder := map[string]int{"router": 0, "prefill": 1, "decode": 2, "colocated": 3}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := roleOrder[keys[i][0]], roleOrder[keys[j][0]]; a != b {
			return a < b
		}
		return keys[i][1] < keys[j][1]
	})
	out := make([]StageSummary, 0, len(keys))
	for _, k := range keys {
		out = append(out, *by[k])
	}
	return out
}

// Filter keeps the rows of a stage (any if ""), in it for at least
// olderThan, at most limit of them (0: all), oldest first. The summary and
// errors are kept whole.
func (rep Report) Filter(stage string, olderThan time.Duration, limit int) Report {
	out := Report{Summary: rep.Summary, Errors: rep.Errors, Rows: []Row{}}
	for _, r := range rep.Rows {
		if stage != "" && r.Stage != stage {
			continue
		}
		if r.InStageSecs < olderThan.Seconds() {
			continue
		}
		if limit > 0 && len(out.Rows) == limit {
			break
		}
		out.Rows = append(out.Rows, r)
	}
	return out
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

// Print writes the report as a table, oldest request first; flagged rows
// start with "!".
func Print(w io.Writer, rep Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tSTAGE\tREQUESTS\tOLDEST IN STAGE\tPAST HALF DEADLINE")
	total := 0
	for _, s := range rep.Summary {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\n", s.Role, s.Stage, s.Count, secs(s.OldestSeconds), s.Flagged)
		total += s.Count
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tWORKER\tROLE\tRID\tSTAGE\tAGE\tIN STAGE\tDEADLINE IN\tPEER\tLAST EVENT")
	flagged := 0
	for _, r := range rep.Rows {
		mark := ""
		if r.Flagged {
			mark = "!"
			flagged++
		}
		peer := r.PeerAddr
		if peer == "" && r.Peer != 0 {
			peer = fmt.Sprintf("conn %d", r.Peer)
		}
		deadline := secs(r.DeadlineLeft)
		if r.DeadlineKind == "lease" {
			// Renewed by the peer: it keeps moving out.
			deadline = "lease " + deadline
		}
		stage := r.Stage
		if r.Migrations > 0 {
			stage = fmt.Sprintf("%s (migrated %d×)", stage, r.Migrations)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, r.Worker, r.Role, r.RID, stage,
			secs(r.AgeSeconds), secs(r.InStageSecs), deadline, peer, r.LastEvent)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// A request is an entry on the router and on each worker serving it:
	// the count is per role, not summed.
	var perRole []string
	byRole := map[string]int{}
	for _, s := range rep.Summary {
		if _, ok := byRole[s.Role]; !ok {
			perRole = append(perRole, s.Role)
		}
		byRole[s.Role] += s.Count
	}
	for i, r := range perRole {
		perRole[i] = fmt.Sprintf("%s %d", r, byRole[r])
	}
	live := "live requests: none"
	if len(perRole) > 0 {
		live = "live requests: " + strings.Join(perRole, ", ")
	}
	// The mark's legend only when a row carries it.
	legend := ""
	if flagged > 0 {
		legend = " (!)"
	}
	if len(rep.Rows) < total {
		fmt.Fprintf(w, "%s; %d of %d entries listed, %d of them past half their stage deadline%s\n", live, len(rep.Rows), total, flagged, legend)
	} else {
		fmt.Fprintf(w, "%s; %d entries past half their stage deadline%s\n", live, flagged, legend)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

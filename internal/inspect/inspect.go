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
	Rows []Row `json:"requests"`
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
	var rep Report
	for _, a := range answers {
		rep.Rows = append(rep.Rows, a.rows...)
		if a.err != "" {
			rep.Errors = append(rep.Errors, a.err)
		}
	}
	sort.SliceStable(rep.Rows, func(i, j int) bool { return rep.Rows[i].AgeSeconds > rep.Rows[j].AgeSeconds })
	return rep, nil
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

// Print writes the report as a table, oldest request first; flagged rows
// start with "!".
func Print(w io.Writer, rep Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, r.Worker, r.Role, r.RID, r.Stage,
			secs(r.AgeSeconds), secs(r.InStageSecs), secs(r.DeadlineLeft), peer, r.LastEvent)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d live requests, %d past half their stage deadline (!)\n", len(rep.Rows), flagged)
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

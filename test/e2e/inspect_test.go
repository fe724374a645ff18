package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/inspect"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// TestInspect: with one request decoding and a second one waiting for decode
// pages (parked on prefill), inspect lists both stages on both workers with
// their peers, and flags the waiting one once it used half its deadline.
func TestInspect(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	mc.QueueTimeout = 4 * time.Second
	mc.KVHoldTimeout = 4 * time.Second
	// Two copies of one prompt: with the prefix cache the second would
	// share the first's prompt pages instead of waiting for its own.
	mc.PrefixCache = false
	pageBytes := int64(testGeometry.BytesPerToken() * mc.PageSize)
	// Decode's pool (800 tokens) admits one 600-token prompt at a time.
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 20 * time.Millisecond}, machine: &mc, memory: 50 * pageBytes, router: noAdmission()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"prompt":"` + strings.Repeat("q", 600) + `","max_tokens":150,"ignore_eos":true}`
	answers := make(chan string, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- fmt.Sprint(resp.StatusCode, " ", string(b))
		}()
	}
	d, p := c.Decode[0].Worker, c.Prefill[0].Worker
	waitFor(t, 5*time.Second, "one decoding, one waiting for pages", func() (bool, string) {
		sd, _ := d.Stats(time.Second)
		sp, _ := p.Stats(time.Second)
		var early []string
		for len(answers) > 0 {
			early = append(early, <-answers)
		}
		return sd.Stages[lifecycle.StageDecoding] == 1 && sd.Stages[lifecycle.StagePrealloc] == 1 &&
				sp.Stages[lifecycle.StageParked] == 1 && sd.OldestInStage[lifecycle.StagePrealloc] > 2100*time.Millisecond,
			fmt.Sprintf("decode %v, prefill %v, answers %q %s", sd.Stages, sp.Stages, early, debugCounters(t, c))
	})
	rep, err := inspect.Collect(context.Background(), http.DefaultClient, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stages, routerStages []string
	flagged, routed := 0, 0
	for _, r := range rep.Rows {
		if r.Role == "router" {
			// A non-streamed answer's leg sends its tokens at most once a
			// second (worker.BufferedFlushInterval): the request decoding
			// for over 2 s has sent some, the one waiting for pages none.
			routed++
			routerStages = append(routerStages, r.Stage)
			if !strings.Contains(r.PeerAddr, "→") {
				t.Errorf("router row %+v, want the pair as peer", r)
			}
			continue
		}
		stages = append(stages, r.Role+"/"+r.Stage)
		if r.PeerAddr == "" {
			t.Errorf("row without peer: %+v", r)
		}
		if r.Flagged {
			flagged++
			if r.Stage != "prealloc" && r.Stage != "parked" {
				t.Errorf("flagged a request in %s", r.Stage)
			}
		}
	}
	got := strings.Join(stages, ",")
	for _, want := range []string{"decode/decoding", "decode/prealloc", "prefill/parked"} {
		if !strings.Contains(got, want) {
			t.Fatalf("rows %s lack %s", got, want)
		}
	}
	if flagged == 0 || len(rep.Errors) != 0 || routed != 2 {
		t.Fatalf("flagged %d, errors %v, router rows %d (want 2)", flagged, rep.Errors, routed)
	}
	if slices.Sort(routerStages); !slices.Equal(routerStages, []string{"legs", "streaming"}) {
		t.Errorf("router stages %v, want the decoding request streaming and the waiting one in legs", routerStages)
	}
	var out strings.Builder
	if err := inspect.Print(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "past half their stage deadline") || !strings.Contains(out.String(), "!") {
		t.Fatalf("table:\n%s", out.String())
	}
	cancel() // both clients go away; the cleanup checks the workers drain
}

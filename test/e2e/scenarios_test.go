package e2e

// Named failure shapes seen in other PD systems (issue: no pinned requests).
// Each test drives one shape end to end and checks that the request ends
// promptly with a clear error and that every worker returns to baseline
// (the cleanup of startPD/startPair checks pages and stage gauges).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/fleet"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/router"
	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/worker"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// failingModel fails every prefill forward while fail is set.
type failingModel struct {
	model.Model
	fail atomic.Bool
}

func (f *failingModel) Forward(ctx context.Context, pool *kvcache.Pool, seqs []model.SeqInput, out []model.SeqOutput) error {
	if f.fail.Load() {
		return errors.New("injected forward failure")
	}
	return f.Model.Forward(ctx, pool, seqs, out)
}

// TestPrefillFailsAfterDecodeStarted (scenario 3): the prefill leg fails in
// the background after decode was started; decode learns it over the KV
// channel and the client gets an error at once, not after a timeout.
func TestPrefillFailsAfterDecodeStarted(t *testing.T) {
	t.Parallel()
	var fm *failingModel
	c := startPair(t, func(o *cluster.WorkerOptions) {
		fm = &failingModel{Model: o.Model}
		fm.fail.Store(true)
		o.Model = fm
	}, nil)
	start := time.Now()
	status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "doomed", "max_tokens": 4})
	e := decodeCompletion(t, body)
	if status != http.StatusInternalServerError || e.Error == nil || !strings.Contains(e.Error.Message, "injected forward failure") {
		t.Fatalf("want prefill's 500 naming the failure, got %d %s", status, body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("answer took %s", d)
	}
	// Decode ended the request because its peer's failure reached it, not
	// by a deadline: over the KV channel (aborted_peer), or, when the
	// router's abort of the decode leg comes first, with the root cause it
	// carries (prefill's failed_internal) — which arrives first is a race.
	// On a loaded machine the router's abort can even reach decode before
	// the decode leg does, which it then cancels unsent: decode keeps a
	// tombstone of the room and never holds the request. The bound is
	// generous for a loaded machine: a deadline would end it with a
	// timeout_* outcome, which none of these counts.
	waitFor(t, 10*time.Second, "decode counted its peer's failure", func() (bool, string) {
		g := workerGatherer{c.Decode[0]}
		peer := counterValue(t, g, "pdserve_requests_finished_total", "outcome", "aborted_peer")
		root := counterValue(t, g, "pdserve_requests_finished_total", "outcome", "failed_internal")
		st, _ := c.Decode[0].Worker.Stats(time.Second)
		return peer+root >= 1 || (st.Tombstones >= 1 && st.Live == 0), fmt.Sprintf("aborted_peer %v, failed_internal %v, stats %+v", peer, root, st)
	})
	fm.fail.Store(false)
	if status, body := postJSON(t, c.URL()+"/v1/completions", map[string]any{"prompt": "fine", "max_tokens": 4}); status != http.StatusOK {
		t.Fatalf("after recovery: %d %s", status, body)
	}
}

// fakeDecode is a decode worker's HTTP API that passes health checks and
// resets every decode leg at the transport level.
func fakeDecode(t *testing.T, fp kvxfer.Fingerprint, info model.Info) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case workerapi.PathInfo:
			_ = json.NewEncoder(w).Encode(workerapi.Info{Role: workerapi.RoleDecode, Model: info.Name, Fingerprint: fp,
				ContextLen: info.ContextLen, VocabSize: info.VocabSize})
		case "/health":
			_, _ = w.Write([]byte(`{"status":"ok"}`))
		case workerapi.PathAbort:
			_, _ = w.Write([]byte(`{"ok":true}`))
		default:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // RST, not FIN
				}
				conn.Close()
			}
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// TestDecodeLegResetWhilePrefillBootstraps (scenario 2): the decode leg
// fails at the transport level while prefill waits in Bootstrap for a
// ROOM_OPEN that will never come. The router aborts the prefill leg, so
// prefill's room is released at once, not after --bootstrap-timeout.
func TestDecodeLegResetWhilePrefillBootstraps(t *testing.T) {
	t.Parallel()
	m, _ := simFactory(sim.Config{})()
	mc := testMachine()
	mc.Role = lifecycle.RolePrefill
	mc.BootstrapTimeout = time.Minute
	p, err := cluster.StartWorker(cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc,
		KVCacheMemory: 64 << 20, KVListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	d := fakeDecode(t, p.Worker.Fingerprint(), m.Info())
	r, err := cluster.StartRouter(cluster.RouterOptions{Addr: "127.0.0.1:0", Prefill: []string{p.URL}, Decode: []string{d.URL},
		Info: m.Info(), Tokenizer: m.Tokenizer(), HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertQuiescent(t, p)
		_ = r.Shutdown(context.Background())
		_ = p.Shutdown(context.Background())
	})
	if err := cluster.WaitReady(context.Background(), r.Router, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	status, body := postJSON(t, r.URL+"/v1/completions", map[string]any{"prompt": "reset", "max_tokens": 4})
	// The client learns which leg failed, not the internal address; the
	// decode worker had the request (it reset the connection after reading
	// it), so it broke off rather than could not be reached.
	if status != http.StatusBadGateway || !strings.Contains(string(body), "the decode worker broke off") ||
		!strings.Contains(string(body), "worker_stream_broken") || strings.Contains(string(body), d.URL) {
		t.Fatalf("want 502 worker_stream_broken naming the decode leg (not its address), got %d %s", status, body)
	}
	waitFor(t, 2*time.Second, "prefill released the room", func() (bool, string) {
		st, _ := p.Worker.Stats(time.Second)
		return st.Live == 0, fmt.Sprintf("live %d %v", st.Live, st.Stages)
	})
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("prefill held the room for %s", d)
	}
}

// TestIdentityMismatch (scenario 9): the two legs of one room disagree on the
// request (here a rewritten rid); both workers detect it and fail the room
// with an identity error, never hang.
func TestIdentityMismatch(t *testing.T) {
	t.Parallel()
	c := startPair(t, nil, nil)
	room := kvxfer.NewRoom().String()
	leg := workerapi.GenerateBody{RID: "original", Room: room, Gen: 1, InputIDs: []int32{104, 105, 106}, MaxTokens: 4,
		PrefillKVAddr: c.Prefill[0].Worker.KVAddr()}
	var wg sync.WaitGroup
	var pStatus int
	var pBody []byte
	wg.Add(1)
	go func() {
		defer wg.Done()
		pStatus, pBody = postWith(t, c.WorkerClient(), c.Prefill[0].URL+workerapi.PathPrefill, leg)
	}()
	dleg := leg
	dleg.RID = "rewritten-by-a-proxy"
	dStatus, dBody := postWith(t, c.WorkerClient(), c.Decode[0].URL+workerapi.PathDecode, dleg)
	wg.Wait()
	if pStatus != http.StatusBadGateway || !strings.Contains(string(pBody), "identity mismatch") {
		t.Fatalf("prefill: %d %s", pStatus, pBody)
	}
	if dStatus != http.StatusBadGateway || !strings.Contains(string(dBody), "identity mismatch") {
		t.Fatalf("decode: %d %s", dStatus, dBody)
	}
}

// TestPrefillNotReady (scenario 6): a prefill worker whose KV channel
// accepts no connection passes its own health checks, but the decode
// worker's check reports its KV path to it unreachable: the router holds it
// out of pairing (not_ready, naming the refused connection) before any
// request tries it, and every request goes to the healthy pair without a
// retry. Alone, its path's breaker is open: a bounded 503 naming the
// broken path.
func TestPrefillNotReady(t *testing.T) {
	t.Parallel()
	m, _ := simFactory(sim.Config{})()
	info := m.Info()
	// A KV port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	mc := testMachine()
	fp := worker.FingerprintOf(info, mc.PageSize)
	var prefillLegs atomic.Int64
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case workerapi.PathInfo:
			_ = json.NewEncoder(w).Encode(workerapi.Info{Role: workerapi.RolePrefill, Model: info.Name, Fingerprint: fp, KVPort: deadPort,
				ContextLen: info.ContextLen, VocabSize: info.VocabSize})
		case "/health", workerapi.PathAbort:
			_, _ = w.Write([]byte(`{"ok":true}`))
		case workerapi.PathPrefill:
			prefillLegs.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}
	}))
	t.Cleanup(notReady.Close)
	c := startPair(t, nil, nil)
	r, err := cluster.StartRouter(cluster.RouterOptions{Addr: "127.0.0.1:0", Prefill: []string{notReady.URL, c.Prefill[0].URL},
		Decode: []string{c.Decode[0].URL}, Info: info, Tokenizer: m.Tokenizer(), HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	held := func(r *cluster.RouterServer) (string, bool) {
		for _, w := range r.Router.Workers() {
			if w.URL == notReady.URL && w.State == fleet.StateNotReady && strings.Contains(w.Held, "connection refused") {
				return "", true
			}
		}
		return fmt.Sprintf("%+v", r.Router.Workers()), false
	}
	if why, ok := testbin.WaitUntil(5*time.Second, func() (bool, string) { w, ok := held(r); return ok, w }); !ok {
		t.Fatalf("the prefill with a dead KV port is not held out of pairing: %s", why)
	}
	for i := range 4 {
		start := time.Now()
		status, body := postJSON(t, r.URL+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("try %d", i), "max_tokens": 3})
		if status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("request %d took %s", i, d)
		}
	}
	if n := prefillLegs.Load(); n != 0 {
		t.Fatalf("the prefill with a dead KV port got %d legs", n)
	}
	if n := counterValue(t, routerGatherer{r}, "pdserve_router_retries_total", "", ""); n != 0 {
		t.Fatalf("%v retries: the broken path was known before any request", n)
	}
	// Alone, the prefill with a dead KV port gives a bounded 503 naming it.
	r2, err := cluster.StartRouter(cluster.RouterOptions{Addr: "127.0.0.1:0", Prefill: []string{notReady.URL},
		Decode: []string{c.Decode[0].URL}, Info: info, Tokenizer: m.Tokenizer(), HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Shutdown(context.Background()) })
	// The last prefill worker is not held (holding it would change nothing
	// but the reason's place); its path's breaker is open.
	if why, ok := testbin.WaitUntil(5*time.Second, func() (bool, string) {
		ps := r2.Router.Pairs()
		return len(ps) == 1 && ps[0].State == router.BreakerOpen, fmt.Sprintf("%+v", ps)
	}); !ok {
		t.Fatalf("alone: the path is not open: %s", why)
	}
	start := time.Now()
	status, body := postJSON(t, r2.URL+"/v1/completions", map[string]any{"prompt": "alone", "max_tokens": 3})
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "connection refused") {
		t.Fatalf("want 503 naming the refused connection, got %d %s", status, body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the bounded failure took %s", d)
	}
}

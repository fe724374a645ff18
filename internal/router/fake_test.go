package router

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// fakeNet is an http.RoundTripper that serves each request with the
// handler of its host, in process: the handler runs on its own goroutine
// and writes the response body into an io.Pipe. Inside a synctest bubble no
// socket and no real time is involved, so the router's timers (grace,
// probes, health checks) run on the bubble's fake clock.
type fakeNet struct {
	mu    sync.Mutex
	hosts map[string]http.Handler
}

func (n *fakeNet) add(host string, h http.Handler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hosts == nil {
		n.hosts = make(map[string]http.Handler)
	}
	n.hosts[host] = h
}

// pipeWriter is the http.ResponseWriter of one fake exchange.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter
	once   sync.Once
	status int
	wrote  chan struct{} // closed once the status is set
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(status int) {
	w.once.Do(func() {
		w.status = status
		close(w.wrote)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

func (w *pipeWriter) Flush() {}

// pipeBody is a fake response body; closing it ends the exchange.
type pipeBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *pipeBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}

func (n *fakeNet) RoundTrip(req *http.Request) (*http.Response, error) {
	n.mu.Lock()
	h := n.hosts[req.URL.Host]
	n.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("dial tcp %s: connection refused", req.URL.Host)
	}
	ctx, cancel := context.WithCancel(req.Context())
	pr, pw := io.Pipe()
	rw := &pipeWriter{header: http.Header{}, pw: pw, wrote: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pw.Close()
		defer rw.WriteHeader(http.StatusOK)
		h.ServeHTTP(rw, req.Clone(ctx))
	}()
	select {
	case <-rw.wrote:
	case <-ctx.Done():
		cancel()
		pr.CloseWithError(ctx.Err())
		<-done
		return nil, ctx.Err()
	}
	go func() {
		select {
		case <-ctx.Done():
			pr.CloseWithError(ctx.Err())
		case <-done:
		}
	}()
	return &http.Response{StatusCode: rw.status, Status: http.StatusText(rw.status), Header: rw.header,
		Body: &pipeBody{PipeReader: pr, cancel: cancel}, Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// legFunc serves one leg on a fake worker; aborted yields the aborts the
// worker receives for the leg's rid.
type legFunc func(ctx context.Context, b workerapi.GenerateBody, aborted <-chan workerapi.AbortBody, w *legWriter)

// legWriter answers a leg.
type legWriter struct {
	rw      http.ResponseWriter
	started bool
}

// fail answers the leg with e: an error answer before the stream started,
// an error line after.
func (w *legWriter) fail(e *workerapi.Error) {
	if !w.started {
		workerapi.WriteError(w.rw, e)
		return
	}
	w.line(workerapi.ErrorLine(workerapi.StreamLine{}, e))
}

// line writes one NDJSON stream line.
func (w *legWriter) line(l workerapi.StreamLine) {
	if !w.started {
		w.rw.Header().Set("Content-Type", "application/x-ndjson")
		w.rw.WriteHeader(http.StatusOK)
		w.started = true
	}
	_ = json.NewEncoder(w.rw).Encode(l)
}

// prefillOK answers a prefill leg with success.
func (w *legWriter) prefillOK(b workerapi.GenerateBody) {
	w.rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w.rw).Encode(workerapi.PrefillResult{RID: b.RID, PromptTokens: len(b.InputIDs), FirstToken: 1})
}

// fakeWorker is a worker's HTTP API, scripted per test: info, /health,
// its leg endpoint and abort; it records what it received.
type fakeWorker struct {
	role workerapi.Role
	host string

	mu       sync.Mutex
	legs     []workerapi.GenerateBody
	aborts   []workerapi.AbortBody
	health   int                                    // /health calls
	abortChs map[string]chan workerapi.AbortBody    // by rid
	legCtxs  map[string]context.Context             // the context of each leg served, by rid
	healthFn func(ctx context.Context) (status int) // nil: 200
	leg      legFunc                                // the leg endpoint
	// report, if set, is the body of /health and /internal/v1/load (the
	// request, for /health's kv_peers); nil: /health answers {} and
	// /internal/v1/load 404.
	report func(r *http.Request) workerapi.Health
	loads  int // /internal/v1/load calls
	// fp, if set, is the KV fingerprint the worker reports (nil:
	// testFingerprint).
	fp *kvxfer.Fingerprint
	// old makes the worker list no features in its info (an older
	// pdserve).
	old bool
	// ctxLen is the context length in its info (0: 8192, the simulated
	// model's, more than any test's prompt and max_tokens).
	ctxLen int
	// instance is the process id in its info ("": none).
	instance string
}

// setInstance makes the worker report a new process: it restarted.
func (f *fakeWorker) setInstance(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instance = id
}

// setContextLen makes the worker serve a context of n tokens.
func (f *fakeWorker) setContextLen(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctxLen = n
}

// setOld makes the worker report no features, as an older pdserve does.
func (f *fakeWorker) setOld() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.old = true
}

// setFingerprint makes the worker report fp as its KV fingerprint.
func (f *fakeWorker) setFingerprint(fp kvxfer.Fingerprint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fp = &fp
}

func (f *fakeWorker) setReport(fn func(r *http.Request) workerapi.Health) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.report = fn
}

// reportLoad makes the worker report l (every other field zero but the
// status ok and a pool of 1000 pages of 16 tokens unless l says).
func (f *fakeWorker) reportLoad(l workerapi.Load) {
	if l.PagesTotal == 0 {
		l.PagesTotal = 1000
	}
	if l.PageSize == 0 {
		l.PageSize = 16
	}
	f.setReport(func(*http.Request) workerapi.Health {
		return workerapi.Health{Status: workerapi.HealthOK, Role: f.role, Load: l}
	})
}

// fakeOf returns the fake worker serving host on cfg's fake network (for a
// test that scripts a worker before the router starts).
func fakeOf(cfg *Config, host string) *fakeWorker {
	n := cfg.Client.Transport.(*fakeNet)
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hosts[host].(*fakeWorker)
}

func (f *fakeWorker) url() string { return "http://" + f.host }

func (f *fakeWorker) setHealth(fn func(ctx context.Context) int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.healthFn = fn
}

func (f *fakeWorker) setLeg(fn legFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leg = fn
}

func (f *fakeWorker) abortCh(rid string) chan workerapi.AbortBody {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.abortChs == nil {
		f.abortChs = make(map[string]chan workerapi.AbortBody)
	}
	ch, ok := f.abortChs[rid]
	if !ok {
		ch = make(chan workerapi.AbortBody, 4)
		f.abortChs[rid] = ch
	}
	return ch
}

// received returns copies of the legs, aborts and health calls so far.
func (f *fakeWorker) received() (legs []workerapi.GenerateBody, aborts []workerapi.AbortBody, health int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]workerapi.GenerateBody(nil), f.legs...), append([]workerapi.AbortBody(nil), f.aborts...), f.health
}

// legsOf returns the legs of request rid (any gen) the worker received.
func (f *fakeWorker) legsOf(rid string) []workerapi.GenerateBody {
	legs, _, _ := f.received()
	return slices.DeleteFunc(legs, func(l workerapi.GenerateBody) bool {
		return l.RID != rid && !strings.HasPrefix(l.RID, rid+"-g")
	})
}

var testFingerprint = kvxfer.Fingerprint{Model: "m", Layers: 1, KVHeads: 1, HeadDim: 8, DType: "f32", PageSize: 16}

func (f *fakeWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == workerapi.PathInfo:
		f.mu.Lock()
		fp := testFingerprint
		if f.fp != nil {
			fp = *f.fp
		}
		old := f.old
		ctxLen := cmp.Or(f.ctxLen, 8192)
		instance := f.instance
		f.mu.Unlock()
		info := workerapi.Info{Role: f.role, Model: "m", Fingerprint: fp, ContextLen: ctxLen, VocabSize: 300, Instance: instance}
		if !old {
			info.Features = workerapi.Features()
		}
		if f.role == workerapi.RolePrefill {
			info.KVPort = 7000
		}
		_ = json.NewEncoder(rw).Encode(info)
	case r.Method == http.MethodGet && r.URL.Path == workerapi.PathHealth:
		f.mu.Lock()
		f.health++
		fn := f.healthFn
		rep := f.report
		f.mu.Unlock()
		status := http.StatusOK
		if fn != nil {
			status = fn(r.Context())
		}
		rw.WriteHeader(status)
		if rep == nil {
			_, _ = io.WriteString(rw, `{}`)
			return
		}
		_ = json.NewEncoder(rw).Encode(rep(r))
	case r.Method == http.MethodGet && r.URL.Path == workerapi.PathLoad:
		f.mu.Lock()
		f.loads++
		rep := f.report
		f.mu.Unlock()
		if rep == nil {
			http.NotFound(rw, r)
			return
		}
		_ = json.NewEncoder(rw).Encode(rep(r))
	case r.Method == http.MethodPost && r.URL.Path == workerapi.PathAbort:
		var b workerapi.AbortBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.aborts = append(f.aborts, b)
		legCtx := f.legCtxs[b.RID]
		f.mu.Unlock()
		// As on a worker, a leg ends once, by what reached the worker
		// first: an abort for a leg the router hung up already is recorded
		// but not handed to the leg, which has ended as its client leaving.
		if legCtx == nil || legCtx.Err() == nil {
			select {
			case f.abortCh(b.RID) <- b:
			default:
			}
		}
		_, _ = io.WriteString(rw, `{"ok":true}`)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/internal/v1/"):
		var b workerapi.GenerateBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.legs = append(f.legs, b)
		fn := f.leg
		if f.legCtxs == nil {
			f.legCtxs = make(map[string]context.Context)
		}
		f.legCtxs[b.RID] = r.Context()
		f.mu.Unlock()
		fn(r.Context(), b, f.abortCh(b.RID), &legWriter{rw: rw})
	default:
		http.NotFound(rw, r)
	}
}

// Leg behaviours.

// okLeg succeeds: prefill answers its result, decode and colocated stream
// tokens 10, 11, 12 and finish with "length".
func okLeg(role workerapi.Role) legFunc {
	return func(_ context.Context, b workerapi.GenerateBody, _ <-chan workerapi.AbortBody, w *legWriter) {
		if role == workerapi.RolePrefill {
			w.prefillOK(b)
			return
		}
		w.line(workerapi.StreamLine{TokenIDs: []int32{10, 11}, Logprobs: []float32{-1, -1}})
		w.line(workerapi.StreamLine{TokenIDs: []int32{12}, Logprobs: []float32{-1}, FinishReason: "length",
			PromptTokens: len(b.InputIDs), OutputTokens: 3})
	}
}

// untilAborted holds the leg until the router aborts it (then answers
// aborted_peer with the cause the abort carried, as a worker does) or
// cancels it.
func untilAborted(ctx context.Context, _ workerapi.GenerateBody, aborted <-chan workerapi.AbortBody, w *legWriter) {
	select {
	case a := <-aborted:
		w.fail(workerapi.OutcomeError(outcome.AbortedPeer, "the other leg failed: "+a.Detail, a.Cause))
	case <-ctx.Done():
	}
}

// abortedFirst waits until the router aborts the leg or hangs it up, and
// reports whether the abort reached the worker first. Both may be ready by
// the time the leg looks (the router hangs up right after the abort's
// answer), and select picks among ready cases at random: a hang-up seen
// with an abort already handed to the leg still ended after the abort (the
// worker hands over no abort for a leg hung up already).
func abortedFirst(ctx context.Context, aborted <-chan workerapi.AbortBody) bool {
	select {
	case <-aborted:
		return true
	case <-ctx.Done():
		select {
		case <-aborted:
			return true
		default:
			return false
		}
	}
}

// hang holds the leg until the router cancels it.
func hang(ctx context.Context, _ workerapi.GenerateBody, _ <-chan workerapi.AbortBody, _ *legWriter) {
	<-ctx.Done()
}

// byGen serves attempt gen with legs[gen-1] (the last one for later gens).
func byGen(legs ...legFunc) legFunc {
	return func(ctx context.Context, b workerapi.GenerateBody, aborted <-chan workerapi.AbortBody, w *legWriter) {
		i := min(int(max(b.Gen, 1))-1, len(legs)-1)
		legs[i](ctx, b, aborted, w)
	}
}

// counter reads a counter series from reg; labels are name=value pairs.
func counter(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return counterValue(series(t, reg, name, labels...))
}

// series finds the series of metric name whose labels include the
// name=value pairs of labels (the first such), or fails the test.
func series(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

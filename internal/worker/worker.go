// Package worker is the shell around a lifecycle machine: the one loop
// goroutine that steps it and executes its effects, the forward goroutine,
// the KV channel, the waiters of HTTP requests, and the worker HTTP API.
//
// # Overview
//
// Everything that happens to a request becomes an event in the worker's
// mailbox: an HTTP arrival or abort, a KV channel message, a finished
// forward, a tick. The loop drains the mailbox, steps the machine with each
// event, executes the effects in order, then steps Schedule so a new forward
// starts if the engine is idle. Effects are small: send a frame, copy KV
// bytes between pages and frames, hand tokens to a waiter, start a forward.
// The forward runs on its own goroutine so that ticks, leases and aborts are
// handled while it runs; the machine never frees a page the forward writes.
//
// # Concurrency
//
// Only the loop goroutine touches the machine, the page allocator and the
// waiter map. HTTP handlers and transport goroutines post to the mailbox and
// wait on per-request waiters. Queries (debug pages, metrics) run as
// functions on the loop.
//
// # Ownership
//
// The machine owns request state and pages. A waiter belongs to its HTTP
// handler; the loop only appends to it and closes it exactly once, at the
// request's Finalize.
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// BackendFactory builds the KV channel transport for a worker; the worker
// passes itself as the handler, its model fingerprint, and the recycling
// of its KV_CHUNK data buffers.
type BackendFactory func(h kvxfer.Handler, fp kvxfer.Fingerprint, bufs DataBuffers) (kvxfer.Backend, error)

// DataBuffers lets a transport share the worker's KV_CHUNK data buffers
// (one chunk is up to lifecycle.Config.MaxChunkPages pages, megabytes), so
// that moving KV allocates nothing in steady state. Both functions are safe
// for concurrent use.
type DataBuffers struct {
	// Alloc returns a buffer of n bytes to read a received chunk into; the
	// worker takes it back once the KV is in its pages.
	Alloc func(n int) []byte
	// Sent takes back a sent chunk's buffer once the transport has written
	// it and holds no reference to it.
	Sent func(b []byte)
}

// Config configures a worker.
type Config struct {
	Model model.Model
	// Machine holds the role, timeouts and scheduling limits; the worker
	// fills in PageBytes, ContextLen, VocabSize, EOS and Fingerprint from
	// the model and pool.
	Machine lifecycle.Config
	// KVCacheMemory is the pool size in bytes.
	KVCacheMemory int64
	// Backend builds the KV transport (prefill and decode roles).
	Backend BackendFactory
	// KVListen is the prefill's KV channel address (host:port, port may be 0).
	KVListen string
	// TickInterval is how often deadlines and leases are checked (default 50 ms).
	TickInterval time.Duration
	// DecodeLogInterval logs one decode batch in this many at Info level
	// (every batch at Debug), like SGLang's --decode-log-interval (default 40).
	DecodeLogInterval int
	// MaxBodyBytes bounds worker API request bodies (default 64 MiB).
	MaxBodyBytes int64
	// AdmissionDelay (decode) holds every arriving leg this long before
	// the machine admits it (and so before its ROOM_OPEN goes out): a decode
	// that is slow to open rooms, for tests and benchmarks
	// (--test-decode-admission-delay). 0: none.
	AdmissionDelay time.Duration
	// MetricsCompat adds another system's metric names next to pdserve's:
	// "" (none) or MetricsCompatSGLang (see internal/metrics, sglang.go).
	MetricsCompat string
	Logger        *slog.Logger
	Registerer    prometheus.Registerer
	// Tracer, if set, traces every leg (tracing.New): a span per leg, a
	// child of the router's attempt (the leg's traceparent), with a child
	// per stage. Nil: no span.
	Tracer trace.TracerProvider
	// Clock is the worker's clock (default: the wall clock): the loop's
	// ticker, the times stepped into the machine and query timeouts run on
	// it.
	Clock clock.WithTicker
}

// MetricsCompatSGLang is the Config.MetricsCompat (--metrics-compat) value
// that adds SGLang's series.
const MetricsCompatSGLang = "sglang"

// Worker is one prefill, decode or colocated worker.
type Worker struct {
	cfg     Config
	role    lifecycle.Role
	log     *slog.Logger
	clock   clock.WithTicker
	tracer  *legTracer // nil: tracing off
	model   model.Model
	info    model.Info
	pool    *kvcache.Pool
	machine *lifecycle.Machine
	backend kvxfer.Backend
	kvAddr  string
	// instance identifies this worker process (workerapi.Info.Instance).
	instance string
	metrics  *metrics.Worker
	crc      *crc32.Table
	// grammars holds the compiled constraints (structured outputs).
	grammars *grammars

	mbox    mailbox
	lanes   [ioLanes]*ioLane
	bufs    sync.Pool // of *[]byte: received KV chunk buffers
	stop    chan struct{}
	stopped chan struct{}
	fwdCtx  context.Context
	fwdStop context.CancelFunc
	// batchCancel cancels the running forward (loop-owned; CancelBatch).
	batchCancel context.CancelFunc
	fwdWG       sync.WaitGroup
	laneWG      sync.WaitGroup

	// paths is a decode worker's KV paths (nil for other roles).
	paths *kvPaths

	// loop-only state
	waiters      map[string]*waiter
	decodeBatchN int
	// promptTokens sums the prompt lengths of the requests with a waiter.
	promptTokens int
	// genRate counts output tokens delivered, inputRate prompt tokens
	// computed (sglang:gen_throughput and the batch log line).
	genRate, inputRate metrics.Rate
	// fwdStarted is when the running forward started (zero: none runs)
	// and fwdPrompt its prompt tokens; forwardBusy and promptComputed
	// sum the forwards that ended (workerapi.Load's ForwardSeconds and
	// PromptTokensComputed).
	fwdStarted     time.Time
	fwdPrompt      int
	forwardBusy    time.Duration
	promptComputed int64

	startOnce sync.Once
	stopOnce  sync.Once
}

// New builds a worker: its KV pool sized from cfg.KVCacheMemory, its
// machine, metrics on cfg.Registerer, and (prefill and decode) its KV
// transport. It returns an error for an invalid configuration or if the
// prefill's KV listener cannot bind.
func New(cfg Config) (*Worker, error) {
	if cfg.Model == nil {
		return nil, errors.New("worker: no model")
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 50 * time.Millisecond
	}
	if cfg.DecodeLogInterval <= 0 {
		cfg.DecodeLogInterval = 40
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	var mopts []metrics.WorkerOption
	switch cfg.MetricsCompat {
	case "":
	case MetricsCompatSGLang:
		mopts = append(mopts, metrics.WithSGLang(cfg.Model.Info().Name))
	default:
		return nil, fmt.Errorf("worker: metrics compatibility %q: want %q or none", cfg.MetricsCompat, MetricsCompatSGLang)
	}
	info := cfg.Model.Info()
	mc := cfg.Machine
	pool, err := kvcache.NewPool(info.Geometry, mc.PageSize, cfg.KVCacheMemory)
	if err != nil {
		return nil, err
	}
	mc.PageBytes = pool.PageBytes()
	// A sequence can be no longer than the pool holds: serve with the
	// smaller of the two context lengths (and say so).
	mc.ContextLen = info.ContextLen
	if capTokens := pool.Total() * mc.PageSize; capTokens < mc.ContextLen {
		cfg.Logger.Warn("KV cache pool is smaller than the model's context; serving with a shorter context",
			"role", mc.Role.String(), "context_len", capTokens, "model_context_len", info.ContextLen,
			"kv_cache_memory", cfg.KVCacheMemory)
		mc.ContextLen = capTokens
		info.ContextLen = capTokens
	}
	mc.VocabSize = info.VocabSize
	mc.EOS = info.EOS
	mc.Fingerprint = FingerprintOf(info, mc.PageSize)
	if mc.MaxChunkPages <= 0 {
		mc.MaxChunkPages = max(1, (16<<20)/pool.PageBytes())
	}
	m, err := lifecycle.New(mc, pool.Allocator)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		cfg: cfg, role: mc.Role, log: cfg.Logger.With("role", mc.Role.String()), clock: cfg.Clock,
		model: cfg.Model, info: info, pool: pool, machine: m,
		crc:      crc32.MakeTable(crc32.Castagnoli),
		instance: newInstance(),
		tracer:   newLegTracer(cfg.Tracer, mc.Role),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
		waiters:  make(map[string]*waiter),
	}
	w.mbox.init()
	if mc.Role == lifecycle.RoleDecode {
		w.paths = newKVPaths()
	}
	for i := range w.lanes {
		w.lanes[i] = &ioLane{notify: make(chan struct{}, 1)}
	}
	w.fwdCtx, w.fwdStop = context.WithCancel(context.Background())
	stages := make([]string, 0, len(mc.Role.Stages()))
	for _, st := range mc.Role.Stages() {
		stages = append(stages, st.String())
	}
	w.metrics, err = metrics.NewWorker(cfg.Registerer, apiRole(mc.Role), stages, w.snapshot, mopts...)
	if err != nil {
		return nil, err
	}
	w.grammars = newGrammars(info, cfg.Model.Tokenizer(), grammarCacheSize, w.metrics.GrammarLookup, cfg.Clock.Now)
	if mc.Role != lifecycle.RoleColocated {
		if cfg.Backend == nil {
			return nil, fmt.Errorf("worker: %s role needs a KV backend", mc.Role)
		}
		w.backend, err = cfg.Backend(w, w.Fingerprint(), DataBuffers{Alloc: w.allocData, Sent: w.recycle})
		if err != nil {
			return nil, err
		}
		if mc.Role == lifecycle.RolePrefill {
			addr, err := w.backend.Listen(cfg.KVListen)
			if err != nil {
				w.backend.Close()
				return nil, fmt.Errorf("KV channel listen on %s: %w", cfg.KVListen, err)
			}
			w.kvAddr = addr
		}
	}
	return w, nil
}

// Fingerprint is what this worker's KV channel compares with its peers.
func (w *Worker) Fingerprint() kvxfer.Fingerprint {
	return FingerprintOf(w.info, w.cfg.Machine.PageSize)
}

// FingerprintOf is the KV fingerprint of a model served with pageSize-token
// pages: what a worker's KV channel compares with its peers'.
func FingerprintOf(info model.Info, pageSize int) kvxfer.Fingerprint {
	g := info.Geometry
	return kvxfer.Fingerprint{Model: info.Name, Digest: info.Digest, Layers: g.Layers, KVHeads: g.KVHeads,
		HeadDim: g.HeadDim, DType: g.DType.String(), PageSize: pageSize}
}

// Role is the worker's role.
func (w *Worker) Role() lifecycle.Role { return w.role }

// ModelInfo describes the served model.
func (w *Worker) ModelInfo() model.Info { return w.info }

// KVAddr is the bound KV channel address of a prefill worker ("" otherwise).
func (w *Worker) KVAddr() string { return w.kvAddr }

// Start starts the loop goroutine and the I/O lanes. It is idempotent.
func (w *Worker) Start() {
	w.startOnce.Do(func() {
		for _, l := range w.lanes {
			w.laneWG.Add(1)
			go func() {
				defer w.laneWG.Done()
				l.run(w.stop)
			}()
		}
		go w.run()
	})
}

// ioLanes is the number of goroutines that copy and checksum KV pages.
const ioLanes = 2

// lane returns the I/O lane of a peer: all of one peer's page I/O runs on
// one lane, in order (a room's KV_DONE after its chunks, its checksum
// after its writes).
func (w *Worker) lane(p kvxfer.PeerID) *ioLane { return w.lanes[uint64(p)%ioLanes] }

// ioLane runs jobs one at a time, in the order posted.
type ioLane struct {
	mu     sync.Mutex
	jobs   []func()
	notify chan struct{}
}

func (l *ioLane) post(job func()) {
	l.mu.Lock()
	l.jobs = append(l.jobs, job)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

func (l *ioLane) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-l.notify:
		}
		for {
			l.mu.Lock()
			if len(l.jobs) == 0 {
				l.mu.Unlock()
				break
			}
			job := l.jobs[0]
			l.jobs[0] = nil
			l.jobs = l.jobs[1:]
			l.mu.Unlock()
			job()
		}
	}
}

// newInstance mints a worker process's instance id: 64 random bits.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Instance is the worker's instance id: random, minted at New, so a restart
// at the same address is seen as a new worker.
func (w *Worker) Instance() string { return w.instance }

// drainPoll is how often Drain checks whether the machine is drained.
const drainPoll = 20 * time.Millisecond

// Drain makes the worker refuse new requests (503, outcome draining, with
// Retry-After; /health answers 503 "draining") and waits until every
// request it admitted has ended, KV parked for a decode included. It returns
// nil once nothing is left, or ctx.Err() if ctx ends first: the caller then
// shuts the worker down, failing what is left. The worker keeps serving
// its admitted requests (and its KV channel) until Shutdown.
func (w *Worker) Drain(ctx context.Context) error {
	w.Start()
	w.post(lifecycle.Drain{})
	t := w.clock.NewTicker(drainPoll)
	defer t.Stop()
	for {
		if drained, ok := queryValue(w, time.Second, w.machine.Drained); ok && drained {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.stopped:
			return errors.New("worker stopped while draining")
		case <-t.C():
		}
	}
}

// ShuttingDown tells the worker that its process is shutting down; call it
// on every worker of a process before shutting the first one down. A KV
// connection lost from then on (to a worker of the same process that stopped
// first) is expected: the transport logs it at debug level, not as a
// warning. Shutdown implies it. It does not block.
func (w *Worker) ShuttingDown() {
	b := w.backend
	for b != nil {
		if n, ok := b.(kvxfer.ShutdownNotifier); ok {
			n.ShuttingDown()
			return
		}
		u, ok := b.(interface{ Unwrap() kvxfer.Backend }) // a wrapper, e.g. fault injection
		if !ok {
			return
		}
		b = u.Unwrap()
	}
}

// Shutdown fails every live request with outcome "shutdown" (their HTTP
// answers carry the error), waits for the running forward, stops the loop
// and closes the KV transport. It returns ctx.Err() if ctx ends first; the
// worker is stopped either way.
func (w *Worker) Shutdown(ctx context.Context) error {
	var err error
	w.ShuttingDown()
	w.stopOnce.Do(func() {
		w.Start()
		done := make(chan struct{})
		w.mbox.post(item{ev: lifecycle.Shutdown{}, fn: func() { close(done) }})
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		close(w.stop)
		<-w.stopped
		w.laneWG.Wait()
		w.fwdStop()
		w.fwdWG.Wait()
		if w.backend != nil {
			w.backend.Close()
		}
		// Nothing touches the pages any more: the loop, the I/O lanes and
		// the forward have stopped.
		_ = w.pool.Close()
	})
	return err
}

// item is one mailbox entry: an event for the machine, an arrival with its
// waiter, or a function to run on the loop.
type item struct {
	ev     lifecycle.Event
	waiter *waiter
	fn     func()
}

// mailbox is an unbounded queue, so transport goroutines never block on a
// busy loop. Its size is bounded by what peers may send, which the pool and
// frame limits bound.
type mailbox struct {
	mu     sync.Mutex
	items  []item
	notify chan struct{}
}

func (m *mailbox) init() { m.notify = make(chan struct{}, 1) }

func (m *mailbox) post(it item) {
	m.mu.Lock()
	m.items = append(m.items, it)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

func (m *mailbox) drain(buf []item) []item {
	m.mu.Lock()
	buf = append(buf[:0], m.items...)
	clear(m.items)
	m.items = m.items[:0]
	m.mu.Unlock()
	return buf
}

func (w *Worker) post(ev lifecycle.Event) { w.mbox.post(item{ev: ev}) }

// query runs fn on the loop and waits for it, up to timeout. It returns
// false if the loop did not run it in time (stopped or stuck).
func (w *Worker) query(timeout time.Duration, fn func()) bool {
	done := make(chan struct{})
	w.mbox.post(item{fn: func() { fn(); close(done) }})
	t := w.clock.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-w.stopped:
		return false
	case <-t.C():
		return false
	}
}

func (w *Worker) run() {
	defer close(w.stopped)
	ticker := w.clock.NewTicker(w.cfg.TickInterval)
	defer ticker.Stop()
	var buf []item
	lastTick := w.clock.Now()
	for {
		select {
		case <-w.stop:
			return
		case <-w.mbox.notify:
		case <-ticker.C():
		}
		// Everything that arrived is applied before deadlines and leases are
		// checked, so a renewal waiting in the mailbox is never missed
		// because this loop was busy.
		buf = w.mbox.drain(buf)
		for _, it := range buf {
			switch {
			case it.waiter != nil:
				w.arrive(it.ev.(lifecycle.Arrive), it.waiter)
			case it.ev != nil:
				w.step(it.ev)
			}
			if it.fn != nil {
				it.fn()
			}
		}
		clear(buf)
		if now := w.clock.Now(); now.Sub(lastTick) >= w.cfg.TickInterval {
			lastTick = now
			w.step(lifecycle.Tick{})
		}
		w.step(lifecycle.Schedule{})
	}
}

func (w *Worker) arrive(a lifecycle.Arrive, wt *waiter) {
	if _, dup := w.waiters[a.Req.RID]; dup {
		wt.finish(lifecycle.Finalize{RID: a.Req.RID, Outcome: outcome.RejectedInvalid,
			Err: fmt.Sprintf("request id %q is already in use on this worker", a.Req.RID)})
		return
	}
	wt.arrived = w.clock.Now()
	wt.promptTokens = len(a.Req.InputIDs)
	w.promptTokens += wt.promptTokens
	w.waiters[a.Req.RID] = wt
	w.step(a)
}

// step steps the machine with ev and executes its effects in order. No
// effect answers within the step: page I/O answers later through the
// mailbox (IODone, KVVerified), a forward through BatchDone.
func (w *Worker) step(ev lifecycle.Event) {
	now := w.clock.Now()
	if _, ok := ev.(lifecycle.BatchDone); ok && !w.fwdStarted.IsZero() {
		w.forwardBusy += now.Sub(w.fwdStarted)
		w.promptComputed += int64(w.fwdPrompt)
		w.fwdStarted = time.Time{}
	}
	w.machine.Step(now, ev)
	for _, e := range w.machine.Ready() {
		w.execute(now, e)
	}
}

func (w *Worker) execute(now time.Time, e lifecycle.Effect) {
	switch x := e.(type) {
	case lifecycle.RunBatch:
		w.runBatch(now, x)
	case lifecycle.CancelBatch:
		// Every request of the running forward ended: stop computing it.
		// Its pages are freed when its BatchDone arrives.
		if w.batchCancel != nil {
			w.batchCancel()
		}
	case lifecycle.Send:
		w.send(x.Peer, x.Msg)
	// Page I/O runs on the lanes, in order per peer, so copying and
	// checksumming KV never stalls this loop; the machine keeps the pages
	// until the lane answers IODone.
	case lifecycle.SendKV:
		w.lane(x.Peer).post(func() {
			pb := w.pool.PageBytes()
			data := w.allocData(len(x.Pages) * pb) // back through DataBuffers.Sent
			for i, p := range x.Pages {
				copy(data[i*pb:], w.pool.Page(p))
			}
			w.metrics.KVBytes(metrics.KVSent, len(data))
			w.send(x.Peer, kvxfer.KVChunk{RoomGen: x.RoomGen, Seq: x.Seq, FirstPage: x.FirstPage,
				NPages: uint32(len(x.Pages)), Data: data})
			w.post(lifecycle.IODone{Job: x.Job})
		})
	case lifecycle.SendKVDone:
		w.lane(x.Peer).post(func() {
			d := x.Done
			d.Checksum = w.checksum(x.Pages)
			w.send(x.Peer, d)
			w.post(lifecycle.IODone{Job: x.Job})
		})
	case lifecycle.WriteKV:
		w.lane(x.Peer).post(func() {
			pb := w.pool.PageBytes()
			for i, p := range x.Pages {
				copy(w.pool.Page(p), x.Data[i*pb:(i+1)*pb])
				w.pool.MarkWritten(p)
			}
			w.metrics.KVBytes(metrics.KVReceived, len(x.Data))
			w.recycle(x.Data)
			w.post(lifecycle.IODone{Job: x.Job})
		})
	case lifecycle.VerifyKV:
		w.lane(x.Peer).post(func() {
			sum := w.checksum(x.Pages)
			w.post(lifecycle.KVVerified{RID: x.RID, Gen: x.Gen, Checksum: sum})
			w.post(lifecycle.IODone{Job: x.Job})
		})
	case lifecycle.Emit:
		w.genRate.Add(now, len(x.Tokens))
		if wt := w.waiters[x.RID]; wt != nil {
			// Time to first token counts the request's first; the
			// inter-token latency follows choice 0 (the choices of an n > 1
			// request decode in the same steps).
			switch {
			case len(x.Tokens) == 0:
			case wt.lastAt.IsZero():
				w.metrics.FirstToken(now.Sub(wt.arrived))
				wt.lastAt = now
			case x.Choice == 0:
				w.metrics.InterToken(now.Sub(wt.lastAt), len(x.Tokens))
				wt.lastAt = now
			}
			wt.push(x)
		}
	case lifecycle.CopyKV:
		// A fork's own copy of its prompt's partial page, before anything
		// can read or write either (the machine emits it before the next
		// forward that could).
		copy(w.pool.Page(x.Dst), w.pool.Page(x.Src))
		w.pool.MarkWritten(x.Dst)
	case lifecycle.Finalize:
		for st, d := range x.StageTime {
			w.metrics.StageTime(st.String(), d)
		}
		w.metrics.Finished(x.Outcome, x.Cause, x.Age)
		if w.role == lifecycle.RolePrefill && x.Outcome == outcome.OK {
			// Only the pages sent: decode held the others in its prefix cache.
			w.metrics.KVTransfer(x.StageTime[lifecycle.StageTransferring], x.SentPages*w.pool.PageBytes())
			// Prefill's first token was sampled when its prefill ended:
			// its time to first token is the stages before.
			w.metrics.FirstToken(x.StageTime[lifecycle.StageBootstrap] + x.StageTime[lifecycle.StageWaiting] +
				x.StageTime[lifecycle.StagePrefilling])
			w.metrics.Ended(x.Age)
		} else if wt := w.waiters[x.RID]; wt != nil && !wt.lastAt.IsZero() {
			w.metrics.Ended(x.Age) // it got its first token: TTFT counted it, so does E2E
		}
		if x.Outcome != outcome.OK && x.Outcome != outcome.AbortedClient {
			w.log.Info("request failed", "rid", x.RID, "room", x.RoomGen.String(), "outcome", x.Outcome.String(), "err", x.Err)
		}
		if wt := w.waiters[x.RID]; wt != nil {
			delete(w.waiters, x.RID)
			w.promptTokens -= wt.promptTokens
			wt.finish(x)
		}
	}
}

// allocData returns a KV chunk buffer: for the transport to read a received
// chunk into (WriteKV recycles it once the bytes are in pages) or for
// SendKV to copy pages into (the transport recycles it once written).
// Buffers of chunks dropped on the way are left to the garbage collector.
func (w *Worker) allocData(n int) []byte {
	if b, ok := w.bufs.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:n]
	}
	return make([]byte, n)
}

func (w *Worker) recycle(b []byte) {
	w.bufs.Put(&b)
}

func (w *Worker) send(p kvxfer.PeerID, m kvxfer.Message) {
	if err := w.backend.Send(p, m); err != nil {
		// The connection is gone; the transport reports PeerLost, which
		// fails the rooms on it.
		w.log.Debug("KV send dropped", "peer", p, "type", m.Type().String(), "err", err)
	}
}

func (w *Worker) checksum(pages []kvcache.PageID) uint32 {
	var c uint32
	for _, p := range pages {
		c = crc32.Update(c, w.crc, w.pool.Page(p))
	}
	return c
}

func (w *Worker) runBatch(now time.Time, b lifecycle.RunBatch) {
	seqs := make([]model.SeqInput, len(b.Seqs))
	for i, s := range b.Seqs {
		seqs[i] = s.Input
	}
	kind := metrics.BatchDecode
	switch {
	case b.PrefillTokens > 0 && b.DecodeSeqs > 0:
		kind = metrics.BatchMixed
	case b.PrefillTokens > 0:
		kind = metrics.BatchPrefill
	}
	w.metrics.Batch(kind)
	w.inputRate.Add(now, b.PrefillTokens)
	w.fwdStarted, w.fwdPrompt = now, b.PrefillTokens
	w.logBatch(now, kind, b)
	ctx, cancel := context.WithCancel(w.fwdCtx)
	w.batchCancel = cancel
	w.fwdWG.Add(1)
	go func() {
		defer w.fwdWG.Done()
		defer cancel()
		out := make([]model.SeqOutput, len(seqs))
		err := w.model.Forward(ctx, w.pool, seqs, out)
		w.post(lifecycle.BatchDone{Out: out, Err: err})
	}()
}

// logBatch logs one forward batch (see batchLine): every batch that
// computes prompts at Info, one decode batch in DecodeLogInterval at Info
// and the others at Debug.
func (w *Worker) logBatch(now time.Time, kind string, b lifecycle.RunBatch) {
	level := slog.LevelDebug
	if kind != metrics.BatchDecode {
		level = slog.LevelInfo
	} else {
		w.decodeBatchN++
		if w.decodeBatchN%w.cfg.DecodeLogInterval == 0 {
			level = slog.LevelInfo
		}
	}
	if !w.log.Enabled(context.Background(), level) {
		return
	}
	used, _, total := w.machine.Pages()
	msg, attrs := batchLine(w.role, kind, b, batchStats{pagesUsed: used, pagesTotal: total,
		pageSize: w.cfg.Machine.PageSize, inputPerSec: w.inputRate.PerSecond(now), genPerSec: w.genRate.PerSecond(now)})
	w.log.Log(context.Background(), level, msg, attrs...)
}

// queryValue runs fn on the loop and returns its result, waiting up to
// timeout. If the loop does not answer in time it returns false; fn may
// still run later, but its result is then dropped (it goes to a buffered
// channel nobody reads), never written under the caller.
func queryValue[T any](w *Worker, timeout time.Duration, fn func() T) (T, bool) {
	ch := make(chan T, 1)
	if !w.query(timeout, func() { ch <- fn() }) {
		var zero T
		return zero, false
	}
	return <-ch, true
}

// snapshot reads the machine's stats and the output token rate on the
// loop, and the transport's dropped frames, for metrics.
func (w *Worker) snapshot() (metrics.WorkerState, bool) {
	type loopState struct {
		stats lifecycle.Stats
		gen   float64
	}
	ls, ok := queryValue(w, 2*time.Second, func() loopState {
		now := w.clock.Now()
		return loopState{w.machine.Stats(now), w.genRate.PerSecond(now)}
	})
	if !ok {
		return metrics.WorkerState{}, false
	}
	st := ls.stats
	ms := metrics.WorkerState{PagesUsed: st.PagesUsed, PagesCached: st.PagesCached, PagesTotal: st.PagesTotal, PendingOpens: st.PendingOpens,
		PrefixQueriedTokens: st.Counters.PrefixQueriedTokens, PrefixHitTokens: st.Counters.PrefixHitTokens,
		PrefixEvictions: st.Counters.PrefixEvictions,
		Tombstones:      st.Tombstones, Preemptions: st.Counters.Preemptions, PeerAbortTombstones: st.Counters.PeerAbortTombstones,
		FramesDropped: make(map[string]uint64), GenThroughput: ls.gen}
	for _, s := range w.role.Stages() {
		ms.Stages = append(ms.Stages, metrics.StageState{Stage: s.String(), Requests: st.Stages[s], Oldest: st.OldestInStage[s],
			Deadline: StageDeadline(w.cfg.Machine, s)})
	}
	for k, v := range st.Counters.FramesDropped {
		ms.FramesDropped[k] += v
	}
	if c, ok := w.backend.(kvxfer.ConnCounter); ok {
		kc := c.ConnCounts()
		ms.KV = metrics.KVConns{Dials: kc.Dials, Reconnects: kc.Reconnects, Live: kc.Live}
	}
	if w.role == lifecycle.RolePrefill {
		ms.Optimistic = make(map[string]uint64)
		for _, o := range lifecycle.OptimisticOutcomes() {
			ms.Optimistic[o.String()] = st.Counters.Optimistic[o]
		}
		pb := int64(w.pool.PageBytes())
		ms.OptimisticKVBytes = map[string]int64{"computing": int64(st.UnboundComputingPages) * pb,
			"parked": int64(st.UnboundParkedPages) * pb}
	}
	if d, ok := w.backend.(kvxfer.DropCounter); ok {
		for k, v := range d.DroppedFrames() {
			ms.FramesDropped[k] += v
		}
	}
	return ms, true
}

// Stats returns the machine's stats, read on the loop. ok is false if the
// loop did not answer within timeout.
func (w *Worker) Stats(timeout time.Duration) (lifecycle.Stats, bool) {
	return queryValue(w, timeout, func() lifecycle.Stats { return w.machine.Stats(w.clock.Now()) })
}

// Requests lists live requests, read on the loop.
func (w *Worker) Requests(timeout time.Duration) ([]lifecycle.RequestInfo, bool) {
	return queryValue(w, timeout, func() []lifecycle.RequestInfo {
		list := w.machine.Requests(w.clock.Now())
		for i := range list {
			w.peerAddr(&list[i])
		}
		return list
	})
}

// Request describes one live request with its recent events.
func (w *Worker) Request(rid string, timeout time.Duration) (lifecycle.RequestInfo, bool, bool) {
	type res struct {
		ri    lifecycle.RequestInfo
		found bool
	}
	r, ok := queryValue(w, timeout, func() res {
		ri, found := w.machine.Request(rid, w.clock.Now())
		w.peerAddr(&ri)
		return res{ri, found}
	})
	return r.ri, r.found, ok
}

// peerAddr fills in the remote address of a prefill request's decode peer.
func (w *Worker) peerAddr(ri *lifecycle.RequestInfo) {
	if ri.PeerAddr == "" && ri.Peer != 0 && w.backend != nil {
		ri.PeerAddr = w.backend.Remote(kvxfer.PeerID(ri.Peer))
	}
}

// ---- kvxfer.Handler ----

// PeerUp implements kvxfer.Handler.
func (w *Worker) PeerUp(p kvxfer.PeerID, remote string) {
	w.log.Debug("KV peer up", "peer", p, "remote", remote)
	if w.paths != nil {
		w.paths.up(remote, w.clock.Now())
	}
	w.post(lifecycle.PeerUp{Peer: p})
}

// HandleMessage implements kvxfer.Handler.
func (w *Worker) HandleMessage(p kvxfer.PeerID, m kvxfer.Message) {
	w.post(lifecycle.PeerMessage{Peer: p, Msg: m})
}

// PeerLost implements kvxfer.Handler.
func (w *Worker) PeerLost(p kvxfer.PeerID, err error) {
	// The transport logs the loss with its remote address (kv peer lost).
	w.log.Debug("KV peer lost", "peer", p, "err", err)
	if w.paths != nil {
		w.paths.lost(w.backend.Remote(p), err, w.clock.Now())
	}
	w.post(lifecycle.PeerLost{Peer: p, Err: err})
}

// Model returns the worker's model.
func (w *Worker) Model() model.Model { return w.model }

// StageDeadline is the longest a request may stay in stage s on a worker
// configured by c (pdserve_stage_deadline_seconds): the stage's own timeout
// where the machine starts one as the request enters it (bootstrap:
// BootstrapTimeout; waiting, prealloc, queued, preempted: QueueTimeout;
// parked: KVHoldTimeout; transferring: TransferTimeout), capped by
// MaxRequestTime, the hard limit of every stage; MaxRequestTime for the
// stages bounded by progress or by the request's limit alone (prefilling,
// decoding, and awaiting_kv, whose transfer deadline runs from the last
// KV chunk or renewal of the room).
func StageDeadline(c lifecycle.Config, s lifecycle.Stage) time.Duration {
	d := c.MaxRequestTime
	switch s {
	case lifecycle.StageBootstrap:
		d = min(d, c.BootstrapTimeout)
	case lifecycle.StageWaiting, lifecycle.StagePrealloc, lifecycle.StageQueued, lifecycle.StagePreempted:
		d = min(d, c.QueueTimeout)
	case lifecycle.StageParked:
		d = min(d, c.KVHoldTimeout)
	case lifecycle.StageTransferring:
		d = min(d, c.TransferTimeout)
	}
	return d
}

package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fp = kvxfer.Fingerprint{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 8, DType: "f32", PageSize: 16}

// fakeWorkers answers probes from a table the test edits.
type fakeWorkers struct {
	mu    sync.Mutex
	info  map[string]Info  // by URL
	fail  map[string]error // by URL
	calls map[string]int
}

func newFakeWorkers() *fakeWorkers {
	return &fakeWorkers{info: map[string]Info{}, fail: map[string]error{}, calls: map[string]int{}}
}

func (f *fakeWorkers) probe(_ context.Context, e registry.Entry) (Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[e.URL]++
	if err := f.fail[e.URL]; err != nil {
		return Info{}, err
	}
	info, ok := f.info[e.URL]
	if !ok {
		return Info{}, errors.New("unknown worker")
	}
	return info, nil
}

func (f *fakeWorkers) checks(url string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[url]
}

func (f *fakeWorkers) set(url string, info Info, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.info[url], f.fail[url] = info, err
}

func decodeInfo(instance string) Info {
	return Info{Role: "decode", Model: "m", Fingerprint: fp, Instance: instance}
}

type transitions struct {
	mu  sync.Mutex
	log []string
}

func (t *transitions) record(w *Worker, from, to State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = append(t.log, fmt.Sprintf("%s %s->%s", w.URL(), from, to))
}

func newSet(t *testing.T, f *fakeWorkers, clk *clocktesting.FakeClock) (*Set, *registry.Static, *transitions) {
	t.Helper()
	st, err := registry.NewStatic(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &transitions{}
	s, err := New(Config{Registry: st, Probe: f.probe, ModelName: "m", Clock: clk, OnChange: tr.record})
	if err != nil {
		t.Fatal(err)
	}
	return s, st, tr
}

func entry(id, role, url string) registry.Entry {
	return registry.Entry{ID: id, Role: role, URL: url, Source: "test"}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func mustGet(t *testing.T, s *Set, id string) *Worker {
	t.Helper()
	w, ok := s.Get(id)
	if !ok {
		t.Fatalf("no worker %s", id)
	}
	return w
}

func TestReadyAfterPassesNotReadyAfterFailures(t *testing.T) {
	f := newFakeWorkers()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s, _, tr := newSet(t, f, clk)
	f.set("http://d1", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}})
	w := mustGet(t, s, "d1")
	ctx := context.Background()
	if w.State() != StatePending || w.Usable() {
		t.Fatalf("new worker %s", w.State())
	}
	s.CheckAll(ctx)
	if w.State() != StatePending {
		t.Fatalf("after one pass: %s, want pending (2 passes needed)", w.State())
	}
	s.CheckAll(ctx)
	if w.State() != StateReady || !w.Usable() {
		t.Fatalf("after two passes: %s", w.State())
	}
	down := w.Down()
	f.set("http://d1", Info{}, context.DeadlineExceeded)
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if w.State() != StateReady || closed(down) {
		t.Fatalf("after two failures: %s, down closed %v (3 needed)", w.State(), closed(down))
	}
	if w.Usable() || w.Weight() != 0 || w.Status().Healthy {
		t.Fatalf("a ready worker that failed its last check is usable (weight %v, status %+v)", w.Weight(), w.Status())
	}
	s.CheckAll(ctx)
	if w.State() != StateNotReady || !closed(down) {
		t.Fatalf("after three failures: %s, down closed %v", w.State(), closed(down))
	}
	if st := w.Status(); st.LastError == "" {
		t.Fatal("no last error shown")
	}
	f.set("http://d1", decodeInfo("a"), nil)
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if w.State() != StateReady || closed(w.Down()) {
		t.Fatalf("after recovery: %s", w.State())
	}
	want := []string{"http://d1 state(0)->pending", "http://d1 pending->ready", "http://d1 ready->not_ready", "http://d1 not_ready->ready"}
	if fmt.Sprint(tr.log) != fmt.Sprint(want) {
		t.Fatalf("transitions %v, want %v", tr.log, want)
	}
}

// TestOneFailedCheckTakesWorkerOutOfPairs: a ready worker that fails one
// health check gets no new request (Usable false) but stays ready, its
// legs in flight going on (Down open); the next passing check makes it
// usable again without a new ramp.
func TestOneFailedCheckTakesWorkerOutOfPairs(t *testing.T) {
	f := newFakeWorkers()
	s, _, tr := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}})
	w := mustGet(t, s, "d1")
	ctx := context.Background()
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if !w.Usable() {
		t.Fatalf("ready worker not usable: %+v", w.Status())
	}
	f.set("http://d1", Info{}, context.DeadlineExceeded)
	s.CheckAll(ctx)
	if st := w.Status(); w.Usable() || st.Healthy || st.State != StateReady || closed(w.Down()) || st.LastError == "" {
		t.Fatalf("after one failed check: usable %v, status %+v, down closed %v; want ready, unusable, legs going on",
			w.Usable(), st, closed(w.Down()))
	}
	f.set("http://d1", decodeInfo("a"), nil)
	s.CheckAll(ctx)
	if !w.Usable() || w.Weight() != 1 {
		t.Fatalf("after the next pass: usable %v weight %v", w.Usable(), w.Weight())
	}
	want := []string{"http://d1 state(0)->pending", "http://d1 pending->ready"}
	if fmt.Sprint(tr.log) != fmt.Sprint(want) {
		t.Fatalf("transitions %v, want %v", tr.log, want)
	}
}

func TestConnectionRefusedIsDefinitive(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}})
	w := mustGet(t, s, "d1")
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	f.set("http://d1", Info{}, refused)
	s.CheckAll(context.Background())
	if w.State() != StateNotReady || !closed(w.Down()) {
		t.Fatalf("after a refused connection: %s", w.State())
	}
}

func TestMisconfiguredWorkerNotReadyWithReason(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	other := decodeInfo("a")
	other.Model = "other-model"
	f.set("http://d1", other, nil)
	f.set("http://p1", Info{Role: "decode", Model: "m"}, nil)
	f.set("http://p2", Info{Role: "prefill", Model: "m", Fingerprint: fp}, nil)
	e3 := entry("p3", "prefill", "http://p3")
	e3.KVAddr = "p3:1"
	bad := fp
	bad.PageSize = 32
	e3.Fingerprint = &bad
	f.set("http://p3", Info{Role: "prefill", Model: "m", Fingerprint: fp}, nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1"),
		entry("p1", "prefill", "http://p1"), entry("p2", "prefill", "http://p2"), e3}})
	s.CheckAll(context.Background())
	for id, want := range map[string]string{
		"d1": `worker serves model "other-model", router serves "m"`,
		"p1": "worker is a decode worker, listed as prefill",
		"p2": "prefill worker reports no KV address",
		"p3": "worker's KV fingerprint differs from its registry entry: page_size 16 vs 32",
	} {
		st := mustGet(t, s, id).Status()
		if st.State != StateNotReady || st.LastError != "misconfigured worker: "+want {
			t.Errorf("%s: %s %q, want not_ready %q", id, st.State, st.LastError, want)
		}
	}
}

func TestRegistryRemovalDrainsLegsThenRemoves(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	f.set("http://d2", decodeInfo("b"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1"), entry("d2", "decode", "http://d2")}})
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	w1, w2 := mustGet(t, s, "d1"), mustGet(t, s, "d2")
	done := w1.AddLeg()
	s.Reconcile(registry.Snapshot{})
	if w1.State() != StateDraining || closed(w1.Down()) {
		t.Fatalf("unlisted worker with a leg: %s (its leg must finish)", w1.State())
	}
	if st := w1.Status(); st.DrainedBy != "registry" || st.SafeToDelete {
		t.Fatalf("status %+v", st)
	}
	if w2.State() != StateRemoved || !closed(w2.Down()) {
		t.Fatalf("unlisted idle worker: %s", w2.State())
	}
	if _, ok := s.Get("d2"); ok {
		t.Fatal("removed worker still in the set")
	}
	done()
	done() // idempotent
	if w1.State() != StateRemoved {
		t.Fatalf("after its last leg: %s", w1.State())
	}
	if n := len(s.Statuses()); n != 0 {
		t.Fatalf("%d statuses left", n)
	}
}

func TestRelistedWorkerComesBack(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	snap := registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}}
	s.Reconcile(snap)
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	w := mustGet(t, s, "d1")
	done := w.AddLeg()
	defer done()
	s.Reconcile(registry.Snapshot{})
	s.Reconcile(snap) // a blip: listed again before its legs ended
	if w.State() != StatePending {
		t.Fatalf("re-listed worker: %s, want pending", w.State())
	}
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	if w.State() != StateReady {
		t.Fatalf("re-listed worker after passes: %s", w.State())
	}
}

func TestRestartedWorkerStartsOver(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}})
	ctx := context.Background()
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	w := mustGet(t, s, "d1")
	// The worker drains (its SIGTERM), exits, and a new process answers.
	draining := decodeInfo("a")
	draining.Draining = true
	f.set("http://d1", draining, nil)
	s.CheckAll(ctx)
	if w.State() != StateDraining || w.Status().DrainedBy != "worker" {
		t.Fatalf("draining worker: %+v", w.Status())
	}
	old := w.Down()
	f.set("http://d1", Info{}, os.NewSyscallError("connect", syscall.ECONNREFUSED))
	s.CheckAll(ctx)
	if w.State() != StateNotReady || !closed(old) {
		t.Fatalf("exited worker: %s", w.State())
	}
	f.set("http://d1", decodeInfo("b"), nil)
	s.CheckAll(ctx)
	if w.State() != StateNotReady {
		t.Fatalf("new instance after one pass: %s, want not_ready until 2 passes", w.State())
	}
	s.CheckAll(ctx)
	if w.State() != StateReady || w.Info().Instance != "b" {
		t.Fatalf("new instance: %s %q", w.State(), w.Info().Instance)
	}
	// A new instance seen without a failure in between also starts over.
	down := w.Down()
	f.set("http://d1", decodeInfo("c"), nil)
	s.CheckAll(ctx)
	if w.State() != StateNotReady || !closed(down) {
		t.Fatalf("instance changed under a ready worker: %s", w.State())
	}
}

func TestAdminDrainResume(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1")}})
	ctx := context.Background()
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	w := mustGet(t, s, "d1")
	if err := s.Drain("d1", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Drain("nope", false); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("Drain of an unknown id: %v", err)
	}
	s.CheckAll(ctx)
	if st := w.Status(); st.State != StateDraining || st.DrainedBy != "admin" || !st.SafeToDelete {
		t.Fatalf("drained: %+v", st)
	}
	done := w.AddLeg()
	if w.Status().SafeToDelete {
		t.Fatal("safe to delete with a leg in flight")
	}
	done()
	if err := s.Resume("d1"); err != nil {
		t.Fatal(err)
	}
	if w.State() != StatePending {
		t.Fatalf("resumed: %s", w.State())
	}
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if w.State() != StateReady {
		t.Fatalf("resumed after passes: %s", w.State())
	}
}

func TestSlowStartWeight(t *testing.T) {
	f := newFakeWorkers()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s, _, _ := newSet(t, f, clk)
	f.set("http://d0", decodeInfo("z"), nil)
	f.set("http://d1", decodeInfo("a"), nil)
	// The fleet the router starts with takes requests at once.
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d0", "decode", "http://d0")}})
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	if w := mustGet(t, s, "d0"); w.Weight() != 1 {
		t.Fatalf("initial worker's weight %v, want 1", w.Weight())
	}
	// A worker that joins later ramps up.
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d0", "decode", "http://d0"), entry("d1", "decode", "http://d1")}})
	w := mustGet(t, s, "d1")
	if w.Weight() != 0 {
		t.Fatalf("pending weight %v", w.Weight())
	}
	s.CheckAll(context.Background())
	s.CheckAll(context.Background())
	for _, c := range []struct {
		after time.Duration
		want  float64
	}{{0, 0.1}, {time.Second, 0.1}, {5 * time.Second, 0.5}, {10 * time.Second, 1}, {time.Minute, 1}} {
		clk.SetTime(time.Unix(1000, 0).Add(c.after))
		if got := w.Weight(); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("weight %s after ready: %v, want %v", c.after, got, c.want)
		}
	}
}

func TestEntryChangesAndInvalidEntries(t *testing.T) {
	f := newFakeWorkers()
	s, _, _ := newSet(t, f, clocktesting.NewFakeClock(time.Unix(1000, 0)))
	f.set("http://d1", decodeInfo("a"), nil)
	f.set("http://d1b", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1"),
		{ID: "junk", Source: "etcd", Invalid: "value is not a worker record"}}})
	old := mustGet(t, s, "d1")
	s.CheckAll(context.Background())
	st := s.Statuses()
	if len(st) != 2 || st[1].ID != "junk" || st[1].Invalid == "" || st[1].State != StateRemoved {
		t.Fatalf("statuses %+v", st)
	}
	// Same identity, new address: the old worker is removed, the new one
	// starts pending.
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d1", "decode", "http://d1b")}})
	if old.State() != StateRemoved || !closed(old.Down()) {
		t.Fatalf("old address: %s", old.State())
	}
	w := mustGet(t, s, "d1")
	if w == old || w.URL() != "http://d1b" || w.State() != StatePending {
		t.Fatalf("new address: %s %s", w.URL(), w.State())
	}
	if len(s.Statuses()) != 1 {
		t.Fatal("invalid entry still listed after a snapshot without it")
	}
}

// TestRunFollowsRegistry runs the loop on synctest's clock: a worker added
// to the registry is checked at once and ready after two health intervals'
// worth of checks; one that is removed leaves.
func TestRunFollowsRegistry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeWorkers()
		f.set("http://d1", decodeInfo("a"), nil)
		st, err := registry.NewStatic(nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Registry: st, Probe: f.probe, ModelName: "m", HealthInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			s.Run(ctx)
			close(done)
		}()
		synctest.Wait()
		if _, err := st.Add("decode", "http://d1"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		w := mustGet(t, s, "d1")
		if w.State() != StatePending || f.checks("http://d1") != 1 {
			t.Fatalf("after joining: %s, %d checks (one at once)", w.State(), f.checks("http://d1"))
		}
		time.Sleep(time.Second) // the bubble's fake clock: one health interval
		synctest.Wait()
		if w.State() != StateReady {
			t.Fatalf("one interval later: %s", w.State())
		}
		st.Remove("d1")
		synctest.Wait()
		if w.State() != StateRemoved {
			t.Fatalf("after removal: %s", w.State())
		}
		cancel()
		<-done
	})
}

// TestHoldKeepsLegsAndRelease: a held worker is not_ready with the reason,
// though it passes its checks, and its legs in flight go on (Down stays
// open); Release makes it ready at once. A held worker that then fails its
// checks on its own fails its legs, and is not ready on release until it
// passes again.
func TestHoldKeepsLegsAndRelease(t *testing.T) {
	f := newFakeWorkers()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s, _, tr := newSet(t, f, clk)
	f.set("http://d0", decodeInfo("a"), nil)
	s.Reconcile(registry.Snapshot{Entries: []registry.Entry{entry("d0", "decode", "http://d0")}})
	ctx := context.Background()
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	w := mustGet(t, s, "d0")
	down := w.Down()
	s.Hold(w, "every KV path is open")
	if w.State() != StateNotReady || w.Usable() || closed(down) {
		t.Fatalf("held: state %s, down closed %v; want not_ready with its legs going on", w.State(), closed(down))
	}
	s.CheckAll(ctx)
	if st := w.Status(); st.State != StateNotReady || st.Held != "every KV path is open" || st.LastError != st.Held {
		t.Fatalf("held worker after a passing check: %+v", st)
	}
	if !s.Release(w) || w.State() != StateReady || closed(w.Down()) {
		t.Fatalf("released: %s", w.State())
	}
	if s.Release(w) {
		t.Fatal("a second Release reported a hold")
	}
	// Held, then failing on its own.
	s.Hold(w, "paths")
	f.set("http://d0", Info{}, errors.New("boom"))
	for range DefaultFailureThreshold {
		s.CheckAll(ctx)
	}
	if !closed(w.Down()) {
		t.Fatal("a held worker failing its checks kept its legs")
	}
	s.Release(w)
	if w.State() != StateNotReady {
		t.Fatalf("released while failing: %s", w.State())
	}
	f.set("http://d0", decodeInfo("a"), nil)
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if w.State() != StateReady {
		t.Fatalf("passing again: %s", w.State())
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	want := []string{"http://d0 state(0)->pending", "http://d0 pending->ready", "http://d0 ready->not_ready", "http://d0 not_ready->ready",
		"http://d0 ready->not_ready", "http://d0 not_ready->ready"}
	if fmt.Sprint(tr.log) != fmt.Sprint(want) {
		t.Fatalf("transitions %v, want %v", tr.log, want)
	}
}

func newGraceSet(t *testing.T, f *fakeWorkers, clk *clocktesting.FakeClock, grace time.Duration) *Set {
	t.Helper()
	s, err := New(Config{Registry: fixedRegistry{}, Probe: f.probe, ModelName: "m", Clock: clk, UnlistedGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func snap(es ...registry.Entry) registry.Snapshot { return registry.Snapshot{Entries: es} }

// TestUnlistedGrace: a registry that stops listing every worker (etcd
// restarted on an empty data directory) does not empty the fleet: ready
// workers stay usable while their checks pass, and go on as before when
// listed again; one that fails a check, answers draining or outlives the
// grace leaves (draining its legs first); a worker not usable when
// unlisted leaves at once.
func TestUnlistedGrace(t *testing.T) {
	f := newFakeWorkers()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := newGraceSet(t, f, clk, 30*time.Second)
	ctx := context.Background()
	var all []registry.Entry
	for i, id := range []string{"d1", "d2", "d3", "d4", "d5"} {
		u := "http://" + id
		f.set(u, decodeInfo(fmt.Sprint("i", i)), nil)
		all = append(all, entry(id, "decode", u))
	}
	s.Reconcile(snap(all...))
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	f.set("http://d5", Info{}, context.DeadlineExceeded)
	s.CheckAll(ctx) // d5: ready, but its last check failed
	s.Reconcile(snap())
	for _, id := range []string{"d1", "d2", "d3", "d4"} {
		w := mustGet(t, s, id)
		if st := w.Status(); !w.Usable() || st.Unlisted == "" || closed(w.Down()) {
			t.Fatalf("%s right after the registry emptied: %+v, want usable and shown unlisted", id, st)
		}
	}
	if _, ok := s.Get("d5"); ok {
		t.Fatal("d5 (not usable when unlisted) kept in the set")
	}

	clk.Step(10 * time.Second)
	s.Reconcile(snap(all[0])) // d1 registered again
	if st := mustGet(t, s, "d1").Status(); st.Unlisted != "" || !st.Healthy {
		t.Fatalf("d1 listed again: %+v", st)
	}
	f.set("http://d2", Info{}, context.DeadlineExceeded)
	info := decodeInfo("i2")
	info.Draining = true
	f.set("http://d3", info, nil)
	d4 := mustGet(t, s, "d4")
	leg := d4.AddLeg()
	s.CheckAll(ctx)
	for _, id := range []string{"d2", "d3"} {
		if w, ok := s.Get(id); ok {
			t.Errorf("%s (a failed check / draining in its grace) still in the set: %+v", id, w.Status())
		}
	}
	if !d4.Usable() {
		t.Fatalf("d4 within its grace: %+v", d4.Status())
	}
	clk.Step(20 * time.Second)
	s.CheckAll(ctx)
	if st := d4.Status(); st.State != StateDraining || st.DrainedBy != "registry" || st.Unlisted != "" || closed(d4.Down()) {
		t.Fatalf("d4 after its grace, with a leg: %+v, want draining its leg", st)
	}
	leg()
	if _, ok := s.Get("d4"); ok {
		t.Fatal("d4 still in the set once its last leg ended")
	}
	if ws := s.Workers(""); len(ws) != 1 || ws[0].ID() != "d1" {
		t.Fatalf("workers %v, want d1 only", ws)
	}
}

// TestDuplicateEntries: two registry entries whose workers answer with one
// instance id: the later is not_ready "duplicate of <first>" and never
// usable while the first is in the set; it takes over once the first
// leaves. With an unlisted grace, the entry a worker is listed under anew
// takes over from its old, unlisted one once it is ready, so the process
// is usable throughout.
func TestDuplicateEntries(t *testing.T) {
	f := newFakeWorkers()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s, _, _ := newSet(t, f, clk)
	ctx := context.Background()
	f.set("http://w", decodeInfo("one-process"), nil)
	k1, k2 := entry("k1", "decode", "http://w"), entry("k2", "decode", "http://w")
	s.Reconcile(snap(k1, k2))
	for range 3 {
		s.CheckAll(ctx)
	}
	w1, w2 := mustGet(t, s, "k1"), mustGet(t, s, "k2")
	if !w1.Usable() {
		t.Fatalf("first entry %+v", w1.Status())
	}
	if st := w2.Status(); w2.Usable() || st.State != StateNotReady || st.Duplicate != "k1" || !strings.HasPrefix(st.LastError, "duplicate of k1") {
		t.Fatalf("second entry %+v, want not_ready, duplicate of k1", st)
	}
	s.Reconcile(snap(k2))
	s.CheckAll(ctx)
	s.CheckAll(ctx)
	if st := w2.Status(); !w2.Usable() || st.Duplicate != "" || st.LastError != "" {
		t.Fatalf("second entry once the first left: %+v", st)
	}

	g := newGraceSet(t, f, clk, 30*time.Second)
	g.Reconcile(snap(k1))
	g.CheckAll(ctx)
	g.CheckAll(ctx)
	g.Reconcile(snap(k2)) // the worker's record is now under another key
	for i := range 3 {
		usable := 0
		for _, w := range g.Workers("") {
			if w.Usable() {
				usable++
			}
		}
		if usable != 1 {
			t.Fatalf("check %d: %d usable entries of one process, want 1: %+v", i, usable, g.Statuses())
		}
		g.CheckAll(ctx)
	}
	if ws := g.Workers(""); len(ws) != 1 || ws[0].ID() != "k2" || !ws[0].Usable() {
		t.Fatalf("after the handover: %+v, want k2 alone, usable", g.Statuses())
	}
}

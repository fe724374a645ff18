package cluster

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/sim"
)

// records keeps every log record as "LEVEL message worker=name", and
// broadcasts each arrival.
type records struct {
	mu      sync.Mutex
	lines   []record
	changed chan struct{} // closed and replaced at every record
}

type record struct {
	level        slog.Level
	msg, worker  string
	attrsPrinted string
}

// recordHandler is a slog.Handler writing into records with the "worker"
// attribute given to With.
type recordHandler struct {
	r      *records
	worker string
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) WithGroup(string) slog.Handler            { return h }
func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		if a.Key == "worker" {
			h.worker = a.Value.String()
		}
	}
	return h
}

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	var attrs string
	r.Attrs(func(a slog.Attr) bool { attrs += " " + a.String(); return true })
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.r.lines = append(h.r.lines, record{r.Level, r.Message, h.worker, attrs})
	close(h.r.changed)
	h.r.changed = make(chan struct{})
	return nil
}

// wait returns once a record of worker with message msg was logged, or
// fails t after a deadline.
func (r *records) wait(t *testing.T, worker, msg string) {
	t.Helper()
	if !r.waitFor(worker, msg, 10*time.Second) {
		t.Fatalf("no %q record from %s after 10s", msg, worker)
	}
}

func (r *records) waitFor(worker, msg string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		ch := r.changed
		for _, l := range r.lines {
			if l.worker == worker && l.msg == msg {
				r.mu.Unlock()
				return true
			}
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			return false
		}
	}
}

// lossSeen is a prefill worker's KV transport whose Close returns once the
// decode worker logged the loss of its KV connection: the decode worker
// sees the connection end before it starts stopping itself, as when the
// prefill worker takes a while to stop.
type lossSeen struct {
	kvxfer.Backend
	log *records
}

func (b lossSeen) Unwrap() kvxfer.Backend { return b.Backend }

func (b lossSeen) Close() error {
	err := b.Backend.Close()
	b.log.waitFor("decode-0", "kv peer lost", 10*time.Second)
	return err
}

// TestShutdownLogsNoWarning: a cluster shut down cleanly logs no warning,
// though its decode worker sees the KV connection end when the prefill
// worker stops before it: the loss is expected, and logged at debug level.
// The router checks the workers every 10 ms, so a check made while they
// stop (and fail it) would show.
func TestShutdownLogsNoWarning(t *testing.T) {
	log := &records{changed: make(chan struct{})}
	newModel := func() (model.Model, error) {
		return sim.New(sim.Config{Geometry: kvcache.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvcache.F32}, ContextLen: 256})
	}
	c, err := Up(context.Background(), Options{PrefillWorkers: 1, DecodeWorkers: 1, NewModel: newModel,
		Worker: WorkerOptions{Machine: lifecycle.DefaultConfig(lifecycle.RolePrefill), KVCacheMemory: 1 << 20},
		WrapBackend: func(role lifecycle.Role, i int, b kvxfer.Backend) kvxfer.Backend {
			if role == lifecycle.RolePrefill {
				return lossSeen{b, log}
			}
			return b
		},
		HealthInterval: 10 * time.Millisecond, Logger: slog.New(recordHandler{r: log})})
	if err != nil {
		t.Fatal(err)
	}
	log.wait(t, "decode-0", "kv peer up")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	log.wait(t, "decode-0", "kv peer lost")
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, l := range log.lines {
		if l.level >= slog.LevelWarn {
			t.Errorf("clean shutdown logged %s %q worker=%s%s", l.level, l.msg, l.worker, l.attrsPrinted)
		}
	}
}

package tcp

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// levels keeps the level of every "kv peer lost" record logged through it.
type levels struct {
	mu   sync.Mutex
	lost []slog.Level
}

func (l *levels) Enabled(context.Context, slog.Level) bool { return true }
func (l *levels) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *levels) WithGroup(string) slog.Handler            { return l }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "kv peer lost" {
		l.mu.Lock()
		l.lost = append(l.lost, r.Level)
		l.mu.Unlock()
	}
	return nil
}

func (l *levels) get() []slog.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Level(nil), l.lost...)
}

// TestPeerLossWhileShuttingDown: a peer that closes its connection is a
// warning, unless the backend was told its process is shutting down (the
// peer may be a worker of that process that stopped first): then it is
// logged at debug level.
func TestPeerLossWhileShuttingDown(t *testing.T) {
	for _, stopping := range []bool{false, true} {
		name := map[bool]string{false: "running", true: "shutting down"}[stopping]
		t.Run(name, func(t *testing.T) {
			prefillLog, decodeLog := &levels{}, &levels{}
			prefill, _ := newBackend(t, func(c *Config) { c.Logger = slog.New(prefillLog) })
			decode, rec := newBackend(t, func(c *Config) { c.Logger = slog.New(decodeLog) })
			peer := decode.Connect(listen(t, prefill))
			rec.waitKind(t, evUp, peer)
			if stopping {
				decode.ShuttingDown()
			}
			prefill.Close()
			rec.waitKind(t, evLost, peer) // logged before PeerLost is called
			want := slog.LevelWarn
			if stopping {
				want = slog.LevelDebug
			}
			if got := decodeLog.get(); len(got) != 1 || got[0] != want {
				t.Errorf("decode logged the loss at %v, want once at %v", got, want)
			}
			if got := prefillLog.get(); len(got) != 1 || got[0] != slog.LevelDebug {
				t.Errorf("prefill, closed, logged the loss at %v, want once at DEBUG", got)
			}
		})
	}
}

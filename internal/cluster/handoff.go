package cluster

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/internal/workerapi"
)

// handoff is a router's state while it hands its port over to a
// replacement: whether it does, and the requests its handler serves.
type handoff struct {
	on       atomic.Bool
	inflight atomic.Int64
}

// wrap counts h's requests and, once the handoff began, answers
// GET /health 503 "draining" and closes every HTTP/1 connection after its
// answer (Connection: close), so that its client's next request opens a
// connection to the replacement.
func (ho *handoff) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ho.inflight.Add(1)
		defer ho.inflight.Add(-1)
		if ho.on.Load() {
			if r.Method == http.MethodGet && r.URL.Path == "/health" {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"status":"` + workerapi.HealthDraining + `"}` + "\n"))
				return
			}
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close")
			}
		}
		h.ServeHTTP(w, r)
	})
}

// handoffPoll is how often Handoff looks at the requests in flight.
const handoffPoll = 20 * time.Millisecond

// Handoff is a router's drain that refuses nothing: /health answers 503
// "draining" at once (a load balancer stops sending), the listener closes
// (the kernel gives new connections to a replacement listening on the same
// port with ReusePort, or refuses them if there is none), and requests on
// connections already open are still served — every one answered with
// Connection: close, so that its client reconnects to the replacement.
// It returns once nothing is in flight and every connection has closed
// (idle ones are closed), or ctx ends (ctx.Err()). Shutdown must follow.
func (s *RouterServer) Handoff(ctx context.Context) error {
	s.handoff.on.Store(true)
	if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	t := time.NewTicker(handoffPoll)
	defer t.Stop()
	for s.handoff.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	// A request that came on an open connection since is served to its
	// end: Shutdown waits for it (the router is not stopping yet).
	return s.srv.Shutdown(ctx)
}

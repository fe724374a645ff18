package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Router-side stages of a request, for /debug/requests: its legs are
// running and no token has reached the client yet, or tokens are flowing.
const (
	stageLegs      = "legs"
	stageStreaming = "streaming"
)

// liveRequest is a request the router serves, as /debug/requests lists it.
type liveRequest struct {
	clock        clock.PassiveClock
	legTimeout   time.Duration // Config.LegTimeout: the deadline /debug/requests shows
	mu           sync.Mutex
	rid, room    string
	gen          uint32
	arrived      time.Time
	stage        string
	stageSince   time.Time
	attemptStart time.Time
	peers        string // the workers of the current attempt
	promptTokens int
	outputTokens int
	migrations   int
	last         string
	// history is the request's last maxHistory events at the router
	// (attempts, failed legs, retries, the first token), oldest first.
	history []workerapi.HistoryEntry
}

// maxHistory bounds the events a request keeps at the router.
const maxHistory = 32

// event records what happened to the request (lr.mu held).
func (lr *liveRequest) eventLocked(what string) {
	lr.last = what
	if len(lr.history) == maxHistory {
		copy(lr.history, lr.history[1:])
		lr.history = lr.history[:maxHistory-1]
	}
	lr.history = append(lr.history, workerapi.HistoryEntry{At: lr.clock.Now(), What: what})
}

// event records what happened to the request.
func (lr *liveRequest) event(what string) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.eventLocked(what)
}

// track registers a request; the returned liveRequest is updated by the
// stream and dropped by untrack.
func (r *Router) track(rid, room string, promptTokens int) *liveRequest {
	now := r.clock.Now()
	lr := &liveRequest{clock: r.clock, legTimeout: r.cfg.LegTimeout, rid: rid, room: room, arrived: now, stage: stageLegs, stageSince: now,
		attemptStart: now, promptTokens: promptTokens}
	r.liveMu.Lock()
	r.live[lr] = struct{}{}
	r.liveMu.Unlock()
	r.inflight.Add(1)
	return lr
}

// untrack drops a request tracked by track; a second call is a no-op.
func (r *Router) untrack(lr *liveRequest) {
	r.liveMu.Lock()
	_, ok := r.live[lr]
	delete(r.live, lr)
	r.liveMu.Unlock()
	if ok {
		r.inflight.Add(-1)
	}
}

// stageNow is the request's router stage.
func (lr *liveRequest) stageNow() string {
	st, _ := lr.stageSinceNow()
	return st
}

// stageSinceNow is the request's router stage and when it entered it.
func (lr *liveRequest) stageSinceNow() (string, time.Time) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.stage, lr.stageSince
}

// attempt records a new attempt of the request on peers.
func (lr *liveRequest) attempt(gen uint32, peers, why string) {
	now := lr.clock.Now()
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.gen, lr.peers = gen, peers
	lr.stage, lr.stageSince, lr.attemptStart = stageLegs, now, now
	lr.eventLocked(fmt.Sprintf("%s (gen %d): %s", why, gen, peers))
}

// migrated records a continuation of the request on new workers peers
// (gen), after k output tokens: its migration m.
func (lr *liveRequest) migrated(gen uint32, peers string, k, m int) {
	lr.mu.Lock()
	lr.migrations = m
	lr.mu.Unlock()
	lr.attempt(gen, peers, fmt.Sprintf("continued on a new pair after %d output tokens (migration %d)", k, m))
}

// tokens records n more tokens sent to the client.
func (lr *liveRequest) tokens(n int) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.outputTokens += n
	if lr.stage != stageStreaming && n > 0 {
		lr.stage, lr.stageSince = stageStreaming, lr.clock.Now()
		if lr.migrations > 0 {
			lr.eventLocked(fmt.Sprintf("first token of migration %d sent", lr.migrations))
		} else {
			lr.eventLocked("first token sent")
		}
	}
}

func (lr *liveRequest) info(now time.Time, history bool) workerapi.RequestInfo {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	ri := workerapi.RequestInfo{RID: lr.rid, Room: lr.room, Gen: lr.gen, Stage: lr.stage,
		AgeSeconds: now.Sub(lr.arrived).Seconds(), InStageSecs: now.Sub(lr.stageSince).Seconds(),
		DeadlineLeft: (lr.legTimeout - now.Sub(lr.attemptStart)).Seconds(), DeadlineKind: "request", PeerAddr: lr.peers,
		PromptTokens: lr.promptTokens, OutputTokens: lr.outputTokens, LastEvent: lr.last, Migrations: lr.migrations}
	if lr.gen > 1 {
		ri.Retries = int(lr.gen) - 1
	}
	if history {
		ri.History = slices.Clone(lr.history)
	}
	return ri
}

// Requests lists the requests the router is serving, oldest first: stage
// "legs" (no token sent yet) or "streaming", the workers of the current
// attempt as PeerAddr, and the leg timeout left as DeadlineLeft.
func (r *Router) Requests() []workerapi.RequestInfo {
	r.liveMu.Lock()
	list := make([]*liveRequest, 0, len(r.live))
	for lr := range r.live {
		list = append(list, lr)
	}
	r.liveMu.Unlock()
	now := r.clock.Now()
	out := make([]workerapi.RequestInfo, len(list))
	for i, lr := range list {
		out[i] = lr.info(now, false)
	}
	slices.SortFunc(out, func(a, b workerapi.RequestInfo) int {
		switch {
		case a.AgeSeconds > b.AgeSeconds:
			return -1
		case a.AgeSeconds < b.AgeSeconds:
			return 1
		}
		return 0
	})
	return out
}

// Request describes one request the router serves, with its events (its
// attempts and their pairs, failed legs, retries, the first token).
func (r *Router) Request(rid string) (workerapi.RequestInfo, bool) {
	r.liveMu.Lock()
	defer r.liveMu.Unlock()
	for lr := range r.live {
		if lr.rid == rid {
			return lr.info(r.clock.Now(), true), true
		}
	}
	return workerapi.RequestInfo{}, false
}

func (r *Router) handleRequest(w http.ResponseWriter, req *http.Request) {
	ri, ok := r.Request(req.PathValue("rid"))
	if !ok {
		openai.WriteError(w, openai.NotFound("no live request %q at the router", req.PathValue("rid")))
		return
	}
	b, _ := json.Marshal(ri)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func (r *Router) handleRequests(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(workerapi.RequestList{Role: "router", Requests: r.Requests()})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

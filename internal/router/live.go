package router

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

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
	last         string
}

// track registers a request; the returned liveRequest is updated by the
// stream and dropped by untrack.
func (r *Router) track(rid, room string, promptTokens int) *liveRequest {
	now := r.clock.Now()
	lr := &liveRequest{clock: r.clock, rid: rid, room: room, arrived: now, stage: stageLegs, stageSince: now,
		attemptStart: now, promptTokens: promptTokens}
	r.liveMu.Lock()
	r.live[lr] = struct{}{}
	r.liveMu.Unlock()
	return lr
}

func (r *Router) untrack(lr *liveRequest) {
	r.liveMu.Lock()
	delete(r.live, lr)
	r.liveMu.Unlock()
}

// attempt records a new attempt of the request on peers.
func (lr *liveRequest) attempt(gen uint32, peers, why string) {
	now := lr.clock.Now()
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.gen, lr.peers, lr.last = gen, peers, why
	lr.stage, lr.stageSince, lr.attemptStart = stageLegs, now, now
}

// tokens records n more tokens sent to the client.
func (lr *liveRequest) tokens(n int) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.outputTokens += n
	if lr.stage != stageStreaming && n > 0 {
		lr.stage, lr.stageSince, lr.last = stageStreaming, lr.clock.Now(), "first token sent"
	}
}

func (lr *liveRequest) info(now time.Time) workerapi.RequestInfo {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return workerapi.RequestInfo{RID: lr.rid, Room: lr.room, Gen: lr.gen, Stage: lr.stage,
		AgeSeconds: now.Sub(lr.arrived).Seconds(), InStageSecs: now.Sub(lr.stageSince).Seconds(),
		DeadlineLeft: (LegTimeout - now.Sub(lr.attemptStart)).Seconds(), PeerAddr: lr.peers,
		PromptTokens: lr.promptTokens, OutputTokens: lr.outputTokens, LastEvent: lr.last}
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
		out[i] = lr.info(now)
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

func (r *Router) handleRequests(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(workerapi.RequestList{Role: "router", Requests: r.Requests()})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

package workerapi

import "time"

// RequestInfo describes one live request on a worker (or at the router),
// for [PathRequests] and `pdserve inspect`. Times are in seconds.
type RequestInfo struct {
	RID  string `json:"rid"`
	Room string `json:"room,omitempty"`
	Gen  uint32 `json:"gen,omitempty"`
	// Stage is the request's lifecycle stage on a worker ("awaiting_kv"),
	// or at the router "legs" (no token sent yet) or "streaming".
	Stage        string  `json:"stage"`
	AgeSeconds   float64 `json:"age_s"`
	InStageSecs  float64 `json:"in_stage_s"`
	DeadlineLeft float64 `json:"deadline_left_s"`
	// DeadlineKind says what DeadlineLeft counts down to: "stage" (the
	// stage's deadline), "lease" (the peer's renewals, which move it out:
	// a small value is normal) or "request" (the request's time limit; at
	// the router, the leg timeout).
	DeadlineKind string `json:"deadline_kind,omitempty"`
	// StageBudget is the stage's whole deadline span (0 when the stage is
	// bounded only by the request's time limit).
	StageBudget float64 `json:"stage_budget_s"`
	// Peer is the worker's KV connection id of the request's peer;
	// PeerAddr its address (at the router: the workers of the attempt).
	Peer         uint64         `json:"peer,omitempty"`
	PeerAddr     string         `json:"peer_addr,omitempty"`
	PromptTokens int            `json:"prompt_tokens"`
	OutputTokens int            `json:"output_tokens"`
	Pages        int            `json:"pages"`
	LastEvent    string         `json:"last_event"`
	History      []HistoryEntry `json:"history,omitempty"`
	// Retries (router) is the number of attempts after the first.
	Retries int `json:"retries,omitempty"`
	// Migrations (router) is how many of those continued the request's
	// output on a new pair after a worker failed under it mid-stream.
	Migrations int `json:"migrations,omitempty"`
}

// HistoryEntry is one lifecycle event of a request, for
// PathRequests+"/{rid}".
type HistoryEntry struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

// RequestList is the answer of [PathRequests]: who answers ("prefill",
// "decode", "colocated" or "router") and its live requests, oldest first.
type RequestList struct {
	Role     string        `json:"role"`
	Requests []RequestInfo `json:"requests"`
	// Pages is a worker's KV pool (absent from the router's list).
	Pages *PageCounts `json:"pages,omitempty"`
}

// PageCounts is a KV pool's pages: used (held by requests), cached (the
// prefix cache's, held by none, evicted as allocations need them) and the
// total; the rest are free.
type PageCounts struct {
	Used   int `json:"used"`
	Cached int `json:"cached"`
	Total  int `json:"total"`
}

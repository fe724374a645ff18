package worker

import (
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
)

// deadlineConfig has a different span for every deadline, so a stage that
// reports another stage's deadline is caught.
func deadlineConfig(role lifecycle.Role) lifecycle.Config {
	c := lifecycle.DefaultConfig(role)
	c.PageSize, c.PageBytes, c.ContextLen, c.VocabSize = 4, 8, 64, 100
	c.MaxPrefillTokens = 64
	c.BootstrapTimeout = 11 * time.Second
	c.QueueTimeout = 22 * time.Second
	c.KVHoldTimeout = 33 * time.Second
	c.TransferTimeout = 44 * time.Second
	c.MaxRequestTime = 555 * time.Second
	return c
}

// TestStageDeadlineIsTheMachines: StageDeadline (the alert threshold of
// pdserve_stage_deadline_seconds) is, for every stage a request is driven
// through, the span of the deadline the machine itself set on entering it
// (RequestInfo.StageBudget), or the request's time limit where the machine
// set none.
func TestStageDeadlineIsTheMachines(t *testing.T) {
	q := lifecycle.Request{RID: "r1", Room: kvxfer.Room{1}, Gen: 1, InputIDs: []int32{1, 2, 3, 4, 5, 6}, MaxTokens: 4,
		Sampling: model.SamplingParams{TopP: 1}, Peer: 7}
	filler := lifecycle.Request{RID: "f", Room: kvxfer.Room{2}, Gen: 1, InputIDs: make([]int32, 56), MaxTokens: 4,
		Sampling: q.Sampling, Peer: 7}
	rg := kvxfer.RoomGen{Room: q.Room, Gen: 1}
	open := kvxfer.RoomOpen{RoomGen: rg, RID: q.RID, NTokens: uint32(len(q.InputIDs)), PromptHash: lifecycle.PromptHash(q.InputIDs)}
	type step struct {
		ev    lifecycle.Event
		stage lifecycle.Stage
	}
	cases := []struct {
		role  lifecycle.Role
		pages int
		steps []step
	}{
		{lifecycle.RolePrefill, 16, []step{
			{lifecycle.Arrive{Req: q}, lifecycle.StageBootstrap},
			{lifecycle.PeerMessage{Peer: 7, Msg: open}, lifecycle.StageWaiting},
			{lifecycle.Schedule{}, lifecycle.StagePrefilling},
			{lifecycle.BatchDone{Out: []model.SeqOutput{{Token: 5}}}, lifecycle.StageParked},
			{lifecycle.PeerMessage{Peer: 7, Msg: kvxfer.RoomReady{RoomGen: rg, NTokens: 6}}, lifecycle.StageTransferring},
		}},
		{lifecycle.RoleDecode, 16, []step{
			{lifecycle.PeerUp{Peer: 7}, lifecycle.StageNone},
			{lifecycle.Arrive{Req: q}, lifecycle.StageAwaitingKV},
		}},
		{lifecycle.RoleDecode, 16, []step{ // an older request holds the pages: it waits for them
			{lifecycle.PeerUp{Peer: 7}, lifecycle.StageNone},
			{lifecycle.Arrive{Req: filler}, lifecycle.StageNone},
			{lifecycle.Arrive{Req: q}, lifecycle.StagePrealloc},
		}},
		{lifecycle.RoleColocated, 16, []step{
			{lifecycle.Arrive{Req: lifecycle.Request{RID: "c1", InputIDs: q.InputIDs, MaxTokens: 4, Sampling: q.Sampling}}, lifecycle.StageWaiting},
			{lifecycle.Schedule{}, lifecycle.StagePrefilling},
			{lifecycle.BatchDone{Out: []model.SeqOutput{{Token: 5}}}, lifecycle.StageDecoding},
		}},
	}
	now := time.Unix(1_000_000, 0)
	for _, tc := range cases {
		cfg := deadlineConfig(tc.role)
		m, err := lifecycle.New(cfg, kvcache.NewAllocator(tc.pages))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range tc.steps {
			m.Step(now, s.ev)
			m.Ready()
			if s.stage == lifecycle.StageNone {
				continue
			}
			live := m.Requests(now)
			i := len(live) - 1 // the request under test arrived last
			if i < 0 || live[i].Stage != s.stage.String() {
				t.Fatalf("%s: after %T want the request in %s, got %+v", tc.role, s.ev, s.stage, live)
			}
			want := cfg.MaxRequestTime
			if b := live[i].StageBudget; b > 0 {
				want = time.Duration(b * float64(time.Second))
			}
			if got := StageDeadline(cfg, s.stage); got != want {
				t.Errorf("%s/%s: StageDeadline %s, the machine's deadline %s", tc.role, s.stage, got, want)
			}
		}
	}
}

// TestStageDeadlineCoversEveryStage: every stage of every role has a
// positive deadline no longer than the request's limit.
func TestStageDeadlineCoversEveryStage(t *testing.T) {
	for _, role := range []lifecycle.Role{lifecycle.RolePrefill, lifecycle.RoleDecode, lifecycle.RoleColocated} {
		cfg := deadlineConfig(role)
		for _, s := range role.Stages() {
			if d := StageDeadline(cfg, s); d <= 0 || d > cfg.MaxRequestTime {
				t.Errorf("%s/%s: deadline %s", role, s, d)
			}
		}
	}
	cfg := deadlineConfig(lifecycle.RolePrefill)
	cfg.MaxRequestTime = 5 * time.Second
	if d := StageDeadline(cfg, lifecycle.StageBootstrap); d != 5*time.Second {
		t.Errorf("bootstrap deadline %s with a 5 s request limit", d)
	}
}

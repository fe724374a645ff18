package worker

import (
	"testing"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
)

func seqs(n int) []lifecycle.BatchSeq { return make([]lifecycle.BatchSeq, n) }

// TestBatchLine: each role's batch line is SGLang's scheduler log line with
// the counts of the stages that mean the same queue.
func TestBatchLine(t *testing.T) {
	st := batchStats{pagesUsed: 64, pagesTotal: 512, pageSize: 16, inputPerSec: 5120, genPerSec: 410.25}
	cases := []struct {
		role lifecycle.Role
		kind string
		b    lifecycle.RunBatch
		want string
	}{
		{lifecycle.RolePrefill, metrics.BatchPrefill, lifecycle.RunBatch{Seqs: seqs(2), PrefillTokens: 1024,
			Queues: map[lifecycle.Stage]int{lifecycle.StageBootstrap: 3, lifecycle.StageWaiting: 1, lifecycle.StagePrefilling: 2,
				lifecycle.StageParked: 1, lifecycle.StageTransferring: 4}},
			"Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, token usage: 0.12, #running-req: 2, #queue-req: 1, " +
				"#prealloc-req: 3, #bootstrap-req: 3, #inflight-req: 5, input throughput (token/s): 5120.00"},
		{lifecycle.RoleDecode, metrics.BatchDecode, lifecycle.RunBatch{Seqs: seqs(8), DecodeSeqs: 8,
			Queues: map[lifecycle.Stage]int{lifecycle.StagePrealloc: 2, lifecycle.StageAwaitingKV: 1, lifecycle.StageQueued: 3,
				lifecycle.StageDecoding: 8, lifecycle.StagePreempted: 1}},
			"Decode batch, #running-req: 8, #token: 1024, token usage: 0.12, #prealloc-req: 2, #transfer-req: 1, " +
				"#retracted-req: 1, gen throughput (token/s): 410.25, #queue-req: 3"},
		// A decode worker recomputing a preempted request's KV still logs its decode line.
		{lifecycle.RoleDecode, metrics.BatchMixed, lifecycle.RunBatch{Seqs: seqs(3), DecodeSeqs: 2, PrefillTokens: 40,
			Queues: map[lifecycle.Stage]int{lifecycle.StageDecoding: 2, lifecycle.StagePrefilling: 1}},
			"Decode batch, #running-req: 3, #token: 1024, token usage: 0.12, #prealloc-req: 0, #transfer-req: 0, " +
				"#retracted-req: 0, gen throughput (token/s): 410.25, #queue-req: 0"},
		{lifecycle.RoleColocated, metrics.BatchMixed, lifecycle.RunBatch{Seqs: seqs(5), DecodeSeqs: 4, PrefillTokens: 100,
			Queues: map[lifecycle.Stage]int{lifecycle.StageWaiting: 2, lifecycle.StagePrefilling: 1, lifecycle.StageDecoding: 4,
				lifecycle.StagePreempted: 1}},
			"Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.12, #running-req: 5, #queue-req: 3, " +
				"input throughput (token/s): 5120.00"},
		{lifecycle.RoleColocated, metrics.BatchDecode, lifecycle.RunBatch{Seqs: seqs(4), DecodeSeqs: 4,
			Queues: map[lifecycle.Stage]int{lifecycle.StageDecoding: 4}},
			"Decode batch, #running-req: 4, #token: 1024, token usage: 0.12, gen throughput (token/s): 410.25, #queue-req: 0"},
	}
	for _, tc := range cases {
		got, attrs := batchLine(tc.role, tc.kind, tc.b, st)
		if got != tc.want {
			t.Errorf("%s %s:\n got %s\nwant %s", tc.role, tc.kind, got, tc.want)
		}
		// The structured attributes keep pdserve's per-stage counts.
		for _, s := range tc.role.Stages() {
			if !hasAttr(attrs, "#"+s.String(), tc.b.Queues[s]) {
				t.Errorf("%s %s: no attribute #%s=%d in %v", tc.role, tc.kind, s, tc.b.Queues[s], attrs)
			}
		}
	}
}

func hasAttr(attrs []any, key string, v int) bool {
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == key && attrs[i+1] == v {
			return true
		}
	}
	return false
}

package worker

import (
	"fmt"
	"strings"

	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
)

// batchStats is what one forward batch's log line reports besides the
// batch itself: the pool when it started and the recent throughputs.
type batchStats struct {
	pagesUsed, pagesTotal, pageSize int
	// inputPerSec and genPerSec are prompt tokens computed and output
	// tokens delivered per second over the last metrics.RateWindow.
	inputPerSec, genPerSec float64
}

// batchLine is the log line of one forward batch: a message in SGLang's
// format, so that searches written for SGLang's scheduler log ("#queue-req:
// 3", "#inflight-req: 1", "token usage: 0.91") match pdserve's, and the same
// figures as structured attributes, with pdserve's own per-stage counts.
//
// A prefill worker, and a colocated one for a batch that computes prompts,
// logs SGLang's prefill line:
//
//	Prefill batch, #new-seq: 2, #new-token: 1024, #cached-token: 0, token usage: 0.03,
//	#running-req: 2, #queue-req: 1, #prealloc-req: 1, #bootstrap-req: 1, #inflight-req: 0,
//	input throughput (token/s): 5120.00
//
// (#prealloc-req and #bootstrap-req are SGLang's older and newer names of
// the bootstrap queue; the three PD fields appear on prefill workers only.)
// A decode worker, and a colocated one for a decode-only batch, logs its
// decode line:
//
//	Decode batch, #running-req: 8, #token: 4096, token usage: 0.12, #prealloc-req: 0,
//	#transfer-req: 1, #retracted-req: 0, gen throughput (token/s): 410.00, #queue-req: 0
//
// (#prealloc-req, #transfer-req and #retracted-req on decode workers only.)
// Each count is the metric of the same name in sglang.go at the batch's
// start: #running-req is sglang:num_running_reqs (prefilling + decoding),
// #queue-req sglang:num_queue_reqs, #prealloc-req/#bootstrap-req stage
// bootstrap on prefill and stage prealloc on decode, #inflight-req parked +
// transferring, #transfer-req awaiting_kv, #retracted-req preempted. token
// usage is pages used / pages, #token the tokens the used pages hold.
// #cached-token is the prompt tokens of the sequences the batch starts
// that the prefix cache supplied (not computed), as SGLang's.
func batchLine(role lifecycle.Role, kind string, b lifecycle.RunBatch, st batchStats) (string, []any) {
	q := func(stages ...lifecycle.Stage) int {
		n := 0
		for _, s := range stages {
			n += b.Queues[s]
		}
		return n
	}
	usage := 0.0
	if st.pagesTotal > 0 {
		usage = float64(st.pagesUsed) / float64(st.pagesTotal)
	}
	running := q(lifecycle.StagePrefilling, lifecycle.StageDecoding)
	queue := q(lifecycle.StageWaiting, lifecycle.StageQueued)
	if role == lifecycle.RoleColocated {
		queue += q(lifecycle.StagePreempted)
	}
	var msg strings.Builder
	if role == lifecycle.RolePrefill || (role == lifecycle.RoleColocated && kind != metrics.BatchDecode) {
		fmt.Fprintf(&msg, "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, #running-req: %d, #queue-req: %d, ",
			len(b.Seqs)-b.DecodeSeqs, b.PrefillTokens, b.CachedTokens, usage, running, queue)
		if role == lifecycle.RolePrefill {
			boot := q(lifecycle.StageBootstrap)
			fmt.Fprintf(&msg, "#prealloc-req: %d, #bootstrap-req: %d, #inflight-req: %d, ",
				boot, boot, q(lifecycle.StageParked, lifecycle.StageTransferring))
		}
		fmt.Fprintf(&msg, "input throughput (token/s): %.2f", st.inputPerSec)
	} else {
		fmt.Fprintf(&msg, "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, ",
			running, st.pagesUsed*st.pageSize, usage)
		if role == lifecycle.RoleDecode {
			fmt.Fprintf(&msg, "#prealloc-req: %d, #transfer-req: %d, #retracted-req: %d, ",
				q(lifecycle.StagePrealloc), q(lifecycle.StageAwaitingKV), q(lifecycle.StagePreempted))
		}
		fmt.Fprintf(&msg, "gen throughput (token/s): %.2f, #queue-req: %d", st.genPerSec, queue)
	}
	attrs := []any{"kind", kind, "seqs", len(b.Seqs), "new_tokens", b.PrefillTokens, "decode_seqs", b.DecodeSeqs,
		"pages_used", st.pagesUsed, "pages_total", st.pagesTotal}
	for _, s := range role.Stages() {
		attrs = append(attrs, "#"+s.String(), b.Queues[s])
	}
	return msg.String(), attrs
}

package lifecycle

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

type batchEntry struct {
	r      *req
	gen    uint32
	tokens int
}

func (m *Machine) schedule() {
	if m.batch != nil || m.shutdown {
		return
	}
	if m.doneInQueue > len(m.queue)/2 {
		m.compactQueue()
	}
	var entries []batchEntry
	var seqs []BatchSeq
	decodeSeqs, prefillTokens, cachedTokens := 0, 0, 0
	add := func(r *req, in model.SeqInput) {
		r.inBatch = true
		entries = append(entries, batchEntry{r: r, gen: r.Gen, tokens: len(in.Tokens)})
		seqs = append(seqs, BatchSeq{RID: r.RID, Choice: r.choice, Input: in})
	}
	waiting := m.waitOrder()
	if m.cfg.Role != RolePrefill {
		running := m.stageCount[StageDecoding]
		for _, r := range waiting {
			if r.stage == StageQueued && running < m.cfg.MaxRunning {
				m.setStage(r, StageDecoding, 0, outcome.None)
				running++
			}
		}
		for _, r := range m.queue {
			if r.stage != StageDecoding || len(entries) >= m.cfg.MaxRunning {
				continue
			}
			if !m.grow(r) {
				continue // preempted, or no page to take this step
			}
			last := r.outputs[len(r.outputs)-1]
			add(r, m.input(r, len(r.InputIDs)+len(r.outputs)-1, []int32{last}, true))
			decodeSeqs++
		}
	}
	budget := m.cfg.MaxPrefillTokens
	// A prefill worker's forward holds at most MaxRunning sequences, as
	// SGLang's --max-running-requests bounds a prefill server's batch
	// (its PrefillAdder stops at max_running_requests minus the running
	// batch, which a prefill server keeps empty). Decode and colocated
	// workers bound their decoding sequences above, as before.
	full := func() bool { return m.cfg.Role == RolePrefill && len(entries) >= m.cfg.MaxRunning }
	chunk := func(r *req) {
		if r.opt.unbound {
			r.opt.attempts++
		}
		toks := r.prefillTokens()
		n := min(len(toks)-r.computed, budget)
		end := r.computed + n
		in := m.input(r, r.computed, toks[r.computed:end], end == len(toks) && len(r.outputs) == 0 && !r.promptOnly())
		if r.scores != nil && len(r.outputs) == 0 {
			// Prompt logprobs: after token j the next prompt token's.
			in.Score, in.ScoreTop = make([]int32, n), r.PromptTop
			for j := range in.Score {
				in.Score[j] = -1
				if next := r.computed + j + 1; next < len(r.InputIDs) {
					in.Score[j] = r.InputIDs[next]
				}
			}
		}
		add(r, in)
		budget -= n
		prefillTokens += n
	}
	// Bound requests first: unbound (optimistic) ones get what is left.
	for _, r := range m.queue {
		if budget > 0 && r.stage == StagePrefilling && !r.opt.unbound && !full() {
			chunk(r)
		}
	}
	// Preempted requests come back first (they were admitted before anything
	// still waiting), then new ones, each in arrival order. On prefill, a
	// request whose decode already has pages (ROOM_READY) goes before one
	// whose decode has none, and may take the pages of a parked request
	// whose decode has none: otherwise prefill and decode, each holding
	// pages for a request the other cannot take yet, would wait on each
	// other until a deadline broke the tie. Any bound request may take the
	// pages of unbound (optimistic) ones, which therefore never stand in a
	// bound request's way (see optimistic.go).
	type pass struct {
		stage Stage
		ready bool // prefill: only requests with (true) or without ROOM_READY
	}
	passes := []pass{{StagePreempted, false}, {StageWaiting, false}}
	if m.cfg.Role == RolePrefill {
		passes = []pass{{StageWaiting, true}, {StageWaiting, false}}
	}
	for _, ps := range passes {
		for _, r := range waiting {
			if budget <= 0 || full() {
				break
			}
			if r.stage != ps.stage || (m.cfg.Role == RolePrefill && r.ready != ps.ready) {
				continue
			}
			need, toks := m.admitPages(r.Request), r.InputIDs
			if ps.stage == StagePreempted {
				need, toks = m.pagesFor(len(r.InputIDs)+len(r.outputs))+m.forksToReserve(r), r.prefillTokens()
			}
			limit := m.computeLimit(len(toks))
			if r.scores != nil && len(r.outputs) == 0 {
				limit = 0 // its prompt's logprobs: every position is computed
			}
			hit, ok := m.admitAlloc(r, need, toks, limit)
			for !ok && m.cfg.Role == RolePrefill {
				v := m.newestUnbound()
				if v != nil {
					m.fallBack(v, "its pages went to a request whose room is bound")
				} else if v = m.newestUnreadyParked(); v != nil && r.ready {
					m.unpark(v)
				} else {
					break
				}
				hit, ok = m.admitAlloc(r, need, toks, limit)
			}
			if !ok {
				break // first come, first served: later requests wait too
			}
			m.startComputing(r, hit)
			cachedTokens += r.computed
			m.setStage(r, StagePrefilling, 0, outcome.None)
			m.record(r, "%d pages allocated%s", len(r.pages), fromCache(hit))
			chunk(r)
		}
	}
	if m.optimisticOn() {
		for _, r := range m.queue {
			if budget > 0 && r.stage == StagePrefilling && r.opt.unbound && !full() {
				chunk(r)
			}
		}
		// New unbound KV only while no bound request waits, and within the
		// cap; first come, first served.
		comp, park := m.unboundPages()
		left := m.optimisticCap() - comp - park
		if m.stageCount[StageWaiting] == 0 {
			for _, r := range m.queue {
				if budget <= 0 || full() {
					break
				}
				if !m.mayStartOptimistic(r) {
					continue
				}
				need := m.admitPages(r.Request)
				if need > left {
					break
				}
				hit, ok := m.admitAlloc(r, need, r.InputIDs, m.computeLimit(len(r.InputIDs)))
				if !ok {
					break
				}
				left -= need
				m.startComputing(r, hit)
				cachedTokens += r.computed
				m.startOptimistic(r)
				chunk(r)
			}
		}
		m.releaseBlockedHolds(left)
	}
	if len(entries) == 0 {
		return
	}
	m.batch = entries
	q := make(map[Stage]int)
	for _, s := range m.cfg.Role.Stages() {
		q[s] = m.stageCount[s]
	}
	m.emit(RunBatch{Seqs: seqs, PrefillTokens: prefillTokens, DecodeSeqs: decodeSeqs, CachedTokens: cachedTokens, Queues: q})
}

// input is the forward input of r computing toks at positions pos…, and
// sampling after the last of them if sample is set: the output token
// len(r.outputs) (sampler step r.sampleStep()), with what the request's sampling needs (its history for
// penalties, its choices on the first step of an n > 1 request, its
// grammar's mask of the tokens allowed next).
func (m *Machine) input(r *req, pos int, toks []int32, sample bool) model.SeqInput {
	in := model.SeqInput{Pages: r.pages, Pos: pos, Tokens: toks, Sample: sample, Sampling: r.Sampling}
	if !sample {
		return in
	}
	step := len(r.outputs)
	in.Step, in.Ban = r.sampleStep(), r.banAt(step)
	if r.matcher != nil {
		r.matcher.FillMask(r.mask)
		in.Mask = r.mask
	}
	if r.Sampling.NeedsHistory() {
		in.Prompt, in.Output = r.samplerHistory()
	}
	if step == 0 && r.group == nil && r.choices() > 1 {
		in.Forks = r.choices()
	}
	return in
}

// forksToReserve is how many pages r must hold for its other choices
// (forkPages) on admission: N − 1 while a decode or colocated request with
// N > 1 has not forked, else 0.
func (m *Machine) forksToReserve(r *req) int {
	if m.cfg.Role == RolePrefill || r.promptOnly() || r.group != nil || len(r.outputs) > 0 {
		return 0
	}
	return r.choices() - 1
}

// promptDone takes colocated request r, whose prompt's KV is complete, to
// its first token out: its prompt logprobs go out first, a prompt-only
// request ends, and one with N > 1 choices forks.
func (m *Machine) promptDone(r *req, out model.SeqOutput) {
	if r.scores != nil {
		m.emit(Emit{RID: r.RID, Prompt: r.scores})
	}
	if r.promptOnly() {
		m.finish(r, outcome.OK, "", "length")
		return
	}
	m.firstTokens(r, out)
}

// firstTokens gives r its first output token (first) and, for a request
// with N > 1, forks its other choices with theirs (first.Forks).
func (m *Machine) firstTokens(r *req, first model.SeqOutput) {
	if r.choices() == 1 {
		m.appendOutput(r, sampled(first))
		return
	}
	m.fork(r, first)
}

// sampled is t without what a forward adds beside the token (forks, prompt
// scores): what a choice's output holds.
func sampled(t model.SeqOutput) model.SeqOutput {
	return model.SeqOutput{Token: t.Token, Logprob: t.Logprob, Top: t.Top}
}

// grow gives a decoding request the page its next token needs, preempting
// the newest holders of pages (never an older request for a newer one)
// until one is free; r itself may be the one preempted. It reports whether
// r can decode this step.
func (m *Machine) grow(r *req) bool {
	need := m.pagesFor(len(r.InputIDs) + len(r.outputs))
	for len(r.pages) < need {
		if ids, ok := m.allocPages(need - len(r.pages)); ok {
			r.pages = append(r.pages, ids...)
			return true
		}
		v := m.newestHolder()
		if v == nil {
			return false // every other holder is busy this step; try the next
		}
		m.preempt(v)
		if v == r {
			return false
		}
	}
	return true
}

// newestHolder is the most recently admitted request whose pages may be
// taken: decoding, queued, or (colocated) prefilling. Requests receiving KV
// from a peer are never preempted.
func (m *Machine) newestHolder() *req {
	var v *req
	for _, r := range m.queue {
		switch r.stage {
		case StageDecoding, StageQueued, StagePrefilling:
			if len(r.pages) > 0 && r.pins == 0 && !r.inBatch && (v == nil || m.preemptsBefore(r, v)) {
				v = r
			}
		}
	}
	return v
}

// preemptsBefore reports whether r loses its pages before v: the newer
// admission first, and with PriorityScheduling the higher Priority value
// (the less urgent) before that.
func (m *Machine) preemptsBefore(r, v *req) bool {
	if m.cfg.PriorityScheduling && r.Priority != v.Priority {
		return r.Priority > v.Priority
	}
	return r.admitted > v.admitted
}

// waitOrder is the order in which requests waiting to start are taken: the
// queue's (arrival), or with PriorityScheduling by Priority, lower first,
// then by arrival (a stable sort of a copy).
func (m *Machine) waitOrder() []*req {
	if !m.cfg.PriorityScheduling {
		return m.queue
	}
	out := slices.Clone(m.queue)
	slices.SortStableFunc(out, func(a, b *req) int { return cmp.Compare(a.Priority, b.Priority) })
	return out
}

// newestUnreadyParked is the most recently admitted prefill request parked
// with its KV for a decode that has no pages for it yet.
func (m *Machine) newestUnreadyParked() *req {
	var v *req
	for _, r := range m.queue {
		if r.stage == StageParked && !r.ready && !r.opt.unbound && r.pins == 0 && !r.inBatch && (v == nil || r.admitted > v.admitted) {
			v = r
		}
	}
	return v
}

// unpark drops the KV of a parked prefill request (nothing of it was sent:
// its decode never said ROOM_READY) and sends it back to wait; it will be
// computed again.
func (m *Machine) unpark(r *req) {
	m.free(r.pages)
	r.pages = nil
	r.computed = 0
	r.first = model.SeqOutput{}
	r.preemptions++
	m.counters.Preemptions++
	m.resolveOptimistic(r, OptimisticFellBack)
	m.record(r, "KV dropped (%d): its pages went to a request whose decode is ready", r.preemptions)
	m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
}

// preempt frees r's pages (no forward runs: schedule only runs between
// batches) and sends it back to wait for pages; it will recompute its KV.
func (m *Machine) preempt(r *req) {
	if r.inBatch || r.pins > 0 {
		panic("lifecycle: preempting a request whose pages are in use")
	}
	m.free(r.pages)
	r.pages = nil
	if len(r.forkPages) > 0 {
		m.free(r.forkPages)
		r.forkPages = nil
	}
	r.computed = 0
	r.preemptions++
	m.counters.Preemptions++
	m.record(r, "preempted (%d): its pages went to older requests", r.preemptions)
	m.setStage(r, StagePreempted, m.cfg.QueueTimeout, outcome.TimeoutQueue)
}

func (m *Machine) batchDone(e BatchDone) {
	entries := m.batch
	m.batch, m.batchCancelled = nil, false
	for _, b := range entries {
		b.r.inBatch = false
		m.release(b.r)
	}
	if entries == nil {
		return
	}
	for i, b := range entries {
		r := b.r
		if r.stage == StageDone || r.Gen != b.gen {
			continue
		}
		if e.Err != nil || len(e.Out) != len(entries) {
			err := e.Err
			if err == nil {
				err = fmt.Errorf("forward returned %d results for %d sequences", len(e.Out), len(entries))
			}
			m.finish(r, outcome.FailedInternal, fmt.Sprintf("forward failed: %v", err), "")
			continue
		}
		out := e.Out[i]
		switch r.stage {
		case StagePrefilling:
			before := r.computed
			if r.scores != nil && len(r.outputs) == 0 {
				for j, sc := range out.Scores {
					if next := before + j + 1; next < len(r.scores) {
						r.scores[next] = sc
					}
				}
			}
			out.Scores = nil
			r.computed += b.tokens
			done := r.computed == len(r.prefillTokens())
			if m.cfg.Role == RolePrefill {
				m.hashComputed(r, before)
				m.publishPrefill(r, before/m.cfg.PageSize, r.computed/m.cfg.PageSize)
			} else {
				m.publish(r, r.prefillTokens(), before/m.cfg.PageSize, r.computed/m.cfg.PageSize)
			}
			if m.cfg.Role == RolePrefill && r.opt.unbound {
				m.optimisticDone(r, done, out)
				continue
			}
			if m.cfg.Role != RolePrefill {
				if done {
					m.setStage(r, StageDecoding, 0, outcome.None)
					if len(r.outputs) == 0 {
						m.promptDone(r, out)
					}
				}
				continue
			}
			if done && r.promptOnly() {
				m.finish(r, outcome.OK, "", "length")
				continue
			}
			if r.ready {
				m.sendComputed(r)
			}
			if done {
				r.first = out
				if r.ready {
					m.startTransfer(r)
				} else {
					m.setStage(r, StageParked, m.cfg.KVHoldTimeout, outcome.TimeoutKVHold)
				}
			}
		case StageDecoding:
			m.appendOutput(r, out)
		}
	}
}

// hashComputed records the hash of each page of prefill request r that
// the forward just completed (r.computed went from before to its value):
// the full pages, and the last page once the whole prompt is computed.
// Each page's hash chains on the hash recorded with the page before it.
func (m *Machine) hashComputed(r *req, before int) {
	ps := m.cfg.PageSize
	from, to := before/ps, r.computed/ps
	if r.computed == len(r.InputIDs) {
		to = m.promptPages(r)
	}
	for i := from; i < to; i++ {
		parent := m.seed
		if i > 0 {
			parent = m.pageHash[r.pages[i-1]]
		}
		m.pageHash[r.pages[i]] = kvxfer.ChainPage(parent, r.InputIDs[i*ps:min((i+1)*ps, len(r.InputIDs))])
	}
}

// maybeCancelBatch emits CancelBatch once every sequence of the running
// forward has ended.
func (m *Machine) maybeCancelBatch() {
	if m.batch == nil || m.batchCancelled {
		return
	}
	for _, b := range m.batch {
		if b.r.stage != StageDone && b.r.Gen == b.gen {
			return
		}
	}
	m.batchCancelled = true
	m.emit(CancelBatch{})
}

package lifecycle

import (
	"fmt"
	"slices"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// ---- prefill ----

func (m *Machine) prefillMessage(p kvxfer.PeerID, msg kvxfer.Message) {
	switch x := msg.(type) {
	case kvxfer.RoomOpen:
		m.prefillRoomOpen(p, x)
	case kvxfer.RoomReady:
		r, ok := m.rooms[x.Room]
		if !ok || r.Gen != x.Gen {
			if po, ok := m.pending[x.Room]; ok && po.peer == p && po.open.Gen == x.Gen {
				po.ready, po.readyNT = true, x.NTokens
				return
			}
			m.refuse(p, x.RoomGen)
			return
		}
		if r = m.liveFor(p, x.RoomGen); r == nil {
			return
		}
		if !r.opened {
			m.drop("wrong_state")
			return
		}
		m.roomReady(r, x.NTokens)
	case kvxfer.KVAck:
		r := m.liveFor(p, x.RoomGen)
		if r == nil {
			return
		}
		if r.stage != StageTransferring {
			m.drop("wrong_state")
			return
		}
		m.record(r, "KV_ACK")
		m.finish(r, outcome.OK, "", "length")
	default:
		m.drop("wrong_role")
	}
}

// refuse answers a room message for a room this side does not hold with an
// ABORT, so the peer fails at once instead of waiting for a deadline.
func (m *Machine) refuse(p kvxfer.PeerID, rg kvxfer.RoomGen) {
	cause := outcome.Cause{Detail: fmt.Sprintf("unknown_room: worker holds no room %s", rg)}
	if t, ok := m.tombFor("", rg.Room, rg.Gen); ok {
		m.counters.TombstoneHits++
		cause = t.cause
	} else if r, ok := m.rooms[rg.Room]; ok {
		m.drop("stale_gen")
		cause.Detail = fmt.Sprintf("stale generation %d: room %s is at gen %d", rg.Gen, rg.Room, r.Gen)
	} else {
		m.drop("unknown_room")
	}
	m.emit(Send{Peer: p, Msg: kvxfer.Abort{RoomGen: rg, Cause: cause}})
}

func (m *Machine) prefillRoomOpen(p kvxfer.PeerID, x kvxfer.RoomOpen) {
	if r, ok := m.rooms[x.Room]; ok && r.Gen == x.Gen {
		if r.opened {
			m.drop("duplicate")
			return
		}
		m.roomOpened(r, p, x)
		return
	}
	if _, ok := m.rooms[x.Room]; ok {
		m.refuse(p, x.RoomGen)
		return
	}
	if _, ok := m.tombFor(x.RID, x.Room, x.Gen); ok {
		m.refuse(p, x.RoomGen)
		return
	}
	if po, ok := m.pending[x.Room]; ok {
		if po.peer == p && po.open.Gen == x.Gen {
			m.drop("duplicate")
			return
		}
		m.refuse(p, x.RoomGen)
		return
	}
	if m.shutdown || len(m.pending) >= m.cfg.MaxPendingOpens {
		m.emit(Send{Peer: p, Msg: kvxfer.Abort{RoomGen: x.RoomGen, Cause: outcome.Cause{
			Detail: fmt.Sprintf("prefill cannot hold room %s: %d rooms already wait for their request", x.Room, len(m.pending))}}})
		return
	}
	m.pending[x.Room] = &pendingOpen{open: x, peer: p, at: m.now}
}

func (m *Machine) roomOpened(r *req, p kvxfer.PeerID, x kvxfer.RoomOpen) {
	r.Peer, r.opened, r.lastRenew = p, true, m.now
	m.record(r, "ROOM_OPEN from peer %d", p)
	if x.RID != r.RID || int(x.NTokens) != len(r.InputIDs) || x.PromptHash != PromptHash(r.InputIDs) {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
			"request identity mismatch for room %s: decode has rid %q with %d prompt tokens (hash %016x), prefill has rid %q with %d (hash %016x)",
			r.Room, x.RID, x.NTokens, x.PromptHash, r.RID, len(r.InputIDs), PromptHash(r.InputIDs)), "")
		return
	}
	m.setStage(r, StageWaiting, m.cfg.QueueTimeout, outcome.TimeoutQueue)
}

func (m *Machine) roomReady(r *req, nt uint32) {
	if int(nt) != len(r.InputIDs) {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf("ROOM_READY is for %d tokens but the prompt has %d", nt, len(r.InputIDs)), "")
		return
	}
	if r.ready {
		m.drop("duplicate")
		return
	}
	r.ready = true
	m.record(r, "ROOM_READY")
	switch r.stage {
	case StagePrefilling:
		m.sendComputed(r)
	case StageParked:
		m.startTransfer(r)
	}
}

// sendComputed sends the pages whose KV is complete and not yet sent: full
// pages while prefilling (a partial page is still being written), every
// page once the prompt is done.
func (m *Machine) sendComputed(r *req) {
	upto := r.computed / m.cfg.PageSize
	if r.computed == len(r.InputIDs) {
		upto = m.promptPages(r)
	}
	for r.sentPages < upto {
		k := min(m.cfg.MaxChunkPages, upto-r.sentPages)
		m.emit(SendKV{Job: m.pin(r), Peer: r.Peer, RoomGen: r.roomGen(), Seq: r.chunks, FirstPage: uint32(r.sentPages),
			Pages: r.pages[r.sentPages : r.sentPages+k]})
		r.chunks++
		r.sentPages += k
	}
}

func (m *Machine) startTransfer(r *req) {
	m.sendComputed(r)
	np := m.promptPages(r)
	m.emit(SendKVDone{Job: m.pin(r), Peer: r.Peer, Pages: r.pages[:np], Done: kvxfer.KVDone{RoomGen: r.roomGen(),
		NChunks: r.chunks, NPages: uint32(np), NTokens: uint32(len(r.InputIDs)),
		FirstToken: r.first.Token, FirstLogprob: r.first.Logprob}})
	m.record(r, "KV sent: %d pages in %d chunks", np, r.chunks)
	m.setStage(r, StageTransferring, m.cfg.TransferTimeout, outcome.TimeoutTransfer)
}

// ---- decode ----

// admit gives pages to decode requests waiting in Prealloc, in arrival order.
func (m *Machine) admit() {
	if m.cfg.Role != RoleDecode {
		return
	}
	for _, r := range m.queue {
		if r.stage != StagePrealloc {
			continue
		}
		if !m.admitAlloc(r, m.admitPages(r.Request)) {
			return
		}
		ids := r.pages
		r.recv = make([]bool, m.promptPages(r))
		m.emit(Send{Peer: r.Peer, Msg: kvxfer.RoomReady{RoomGen: r.roomGen(), NTokens: uint32(len(r.InputIDs))}})
		m.setStage(r, StageAwaitingKV, 0, outcome.None)
		m.record(r, "%d pages allocated, ROOM_READY sent", len(ids))
	}
}

func (m *Machine) decodeMessage(p kvxfer.PeerID, msg kvxfer.Message) {
	switch x := msg.(type) {
	case kvxfer.KVChunk:
		r := m.liveFor(p, x.RoomGen)
		if r == nil {
			return
		}
		if r.stage != StageAwaitingKV || r.verifying {
			m.drop("wrong_state")
			return
		}
		np := m.promptPages(r)
		first, n := int(x.FirstPage), int(x.NPages)
		if n == 0 || first+n > np || len(x.Data) != n*m.cfg.PageBytes {
			m.drop("malformed")
			m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
				"malformed KV chunk %d: pages %d+%d of %d, %d bytes (want %d per page)",
				x.Seq, first, n, np, len(x.Data), m.cfg.PageBytes), "")
			return
		}
		m.emit(WriteKV{Job: m.pin(r), Peer: p, Pages: r.pages[first : first+n], Data: x.Data})
		for i := first; i < first+n; i++ {
			if !r.recv[i] {
				r.recv[i] = true
				r.recvCount++
			}
		}
		if !r.xferStarted {
			r.xferStarted = true
			r.deadline, r.cause = m.now.Add(m.cfg.TransferTimeout), outcome.TimeoutTransfer
			m.record(r, "first KV chunk")
		}
	case kvxfer.KVDone:
		r := m.liveFor(p, x.RoomGen)
		if r == nil {
			return
		}
		if r.stage != StageAwaitingKV || r.verifying {
			m.drop("wrong_state")
			return
		}
		np := m.promptPages(r)
		if int(x.NPages) != np || int(x.NTokens) != len(r.InputIDs) || r.recvCount != np {
			m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
				"incomplete KV: received %d of %d pages; KV_DONE says %d pages for %d tokens (prompt has %d)",
				r.recvCount, np, x.NPages, x.NTokens, len(r.InputIDs)), "")
			return
		}
		r.verifying, r.done = true, x
		m.emit(VerifyKV{Job: m.pin(r), Peer: p, RID: r.RID, Gen: r.Gen, Pages: r.pages[:np]})
	default:
		m.drop("wrong_role")
	}
}

func (m *Machine) kvVerified(e KVVerified) {
	r, ok := m.reqs[e.RID]
	if !ok || r.Gen != e.Gen || !r.verifying {
		return
	}
	r.verifying = false
	if e.Checksum != r.done.Checksum {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf("KV checksum mismatch: pages hold crc32c %08x, prefill sent %08x",
			e.Checksum, r.done.Checksum), "")
		return
	}
	if t := r.done.FirstToken; t < 0 || int(t) >= m.cfg.VocabSize {
		m.finish(r, outcome.FailedTransfer, fmt.Sprintf("first token %d from prefill is outside the vocabulary", t), "")
		return
	}
	m.emit(Send{Peer: r.Peer, Msg: kvxfer.KVAck{RoomGen: r.roomGen()}})
	r.ackSent = true
	m.record(r, "KV verified, KV_ACK sent")
	m.setStage(r, StageQueued, m.cfg.QueueTimeout, outcome.TimeoutQueue)
	m.appendOutput(r, model.SeqOutput{Token: r.done.FirstToken, Logprob: r.done.FirstLogprob})
}

// appendOutput adds a generated token, emits it, and ends the request if it
// hit a stop token, max_tokens or the context length.
func (m *Machine) appendOutput(r *req, t model.SeqOutput) {
	r.outputs = append(r.outputs, t.Token)
	m.emit(Emit{RID: r.RID, Tokens: []model.SeqOutput{t}})
	switch {
	case (!r.IgnoreEOS && slices.Contains(m.cfg.EOS, t.Token)) || slices.Contains(r.StopTokenIDs, t.Token):
		m.finish(r, outcome.OK, "", "stop")
	case len(r.outputs) >= r.MaxTokens || len(r.InputIDs)+len(r.outputs) >= m.cfg.ContextLen:
		m.finish(r, outcome.OK, "", "length")
	}
}

// ---- scheduling (all roles) ----

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
	decodeSeqs, prefillTokens := 0, 0
	add := func(r *req, in model.SeqInput) {
		r.inBatch = true
		entries = append(entries, batchEntry{r: r, gen: r.Gen, tokens: len(in.Tokens)})
		seqs = append(seqs, BatchSeq{RID: r.RID, Input: in})
	}
	if m.cfg.Role != RolePrefill {
		running := m.stageCount[StageDecoding]
		for _, r := range m.queue {
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
			add(r, model.SeqInput{Pages: r.pages, Pos: len(r.InputIDs) + len(r.outputs) - 1,
				Tokens: []int32{last}, Sample: true, Sampling: r.Sampling, Step: len(r.outputs)})
			decodeSeqs++
		}
	}
	budget := m.cfg.MaxPrefillTokens
	chunk := func(r *req) {
		toks := r.prefillTokens()
		n := min(len(toks)-r.computed, budget)
		end := r.computed + n
		add(r, model.SeqInput{Pages: r.pages, Pos: r.computed, Tokens: toks[r.computed:end],
			Sample: end == len(toks) && len(r.outputs) == 0, Sampling: r.Sampling, Step: 0})
		budget -= n
		prefillTokens += n
	}
	for _, r := range m.queue {
		if budget > 0 && r.stage == StagePrefilling {
			chunk(r)
		}
	}
	// Preempted requests come back first (they were admitted before anything
	// still waiting), then new ones, each in arrival order. On prefill, a
	// request whose decode already has pages (ROOM_READY) goes before one
	// whose decode has none, and may take the pages of a parked request
	// whose decode has none: otherwise prefill and decode, each holding
	// pages for a request the other cannot take yet, would wait on each
	// other until a deadline broke the tie.
	type pass struct {
		stage Stage
		ready bool // prefill: only requests with (true) or without ROOM_READY
	}
	passes := []pass{{StagePreempted, false}, {StageWaiting, false}}
	if m.cfg.Role == RolePrefill {
		passes = []pass{{StageWaiting, true}, {StageWaiting, false}}
	}
	for _, ps := range passes {
		for _, r := range m.queue {
			if budget <= 0 {
				break
			}
			if r.stage != ps.stage || (m.cfg.Role == RolePrefill && r.ready != ps.ready) {
				continue
			}
			need := m.admitPages(r.Request)
			if ps.stage == StagePreempted {
				need = m.pagesFor(len(r.InputIDs) + len(r.outputs))
			}
			ok := m.admitAlloc(r, need)
			for !ok && m.cfg.Role == RolePrefill && r.ready {
				v := m.newestUnreadyParked()
				if v == nil {
					break
				}
				m.unpark(v)
				ok = m.admitAlloc(r, need)
			}
			if !ok {
				break // first come, first served: later requests wait too
			}
			m.setStage(r, StagePrefilling, 0, outcome.None)
			m.record(r, "%d pages allocated", len(r.pages))
			chunk(r)
		}
	}
	if len(entries) == 0 {
		return
	}
	m.batch = entries
	q := make(map[Stage]int)
	for _, s := range m.cfg.Role.Stages() {
		q[s] = m.stageCount[s]
	}
	m.emit(RunBatch{Seqs: seqs, PrefillTokens: prefillTokens, DecodeSeqs: decodeSeqs, Queues: q})
}

// prefillTokens is what a prefill forward computes the KV of: the prompt,
// and after a preemption also every output token but the last (which the
// next decode step writes).
func (r *req) prefillTokens() []int32 {
	if len(r.outputs) <= 1 {
		return r.InputIDs
	}
	out := make([]int32, 0, len(r.InputIDs)+len(r.outputs)-1)
	out = append(out, r.InputIDs...)
	return append(out, r.outputs[:len(r.outputs)-1]...)
}

// grow gives a decoding request the page its next token needs, preempting
// the newest holders of pages (never an older request for a newer one)
// until one is free; r itself may be the one preempted. It reports whether
// r can decode this step.
func (m *Machine) grow(r *req) bool {
	need := m.pagesFor(len(r.InputIDs) + len(r.outputs))
	for len(r.pages) < need {
		if ids, ok := m.alloc.Alloc(need - len(r.pages)); ok {
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
			if len(r.pages) > 0 && r.pins == 0 && !r.inBatch && (v == nil || r.admitted > v.admitted) {
				v = r
			}
		}
	}
	return v
}

// newestUnreadyParked is the most recently admitted prefill request parked
// with its KV for a decode that has no pages for it yet.
func (m *Machine) newestUnreadyParked() *req {
	var v *req
	for _, r := range m.queue {
		if r.stage == StageParked && !r.ready && r.pins == 0 && !r.inBatch && (v == nil || r.admitted > v.admitted) {
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
			r.computed += b.tokens
			done := r.computed == len(r.prefillTokens())
			if m.cfg.Role != RolePrefill {
				if done {
					m.setStage(r, StageDecoding, 0, outcome.None)
					if len(r.outputs) == 0 {
						m.appendOutput(r, out)
					}
				}
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

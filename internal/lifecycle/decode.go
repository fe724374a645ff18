package lifecycle

import (
	"fmt"
	"slices"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// admit gives pages to decode requests waiting in Prealloc, in arrival order.
func (m *Machine) admit() {
	if m.cfg.Role != RoleDecode {
		return
	}
	for _, r := range m.queue {
		if r.stage != StagePrealloc {
			continue
		}
		// Every full prompt page may come from the cache: decode computes
		// nothing of the prompt, and its first write is the first output
		// token's KV, past the prompt's full pages.
		hit, ok := m.admitAlloc(r, m.admitPages(r.Request), r.InputIDs, len(r.InputIDs)/m.cfg.PageSize)
		if !ok {
			return
		}
		r.recv = make([]bool, m.promptPages(r))
		r.cachedPages = hit
		m.emit(Send{Peer: r.Peer, Msg: kvxfer.RoomReady{RoomGen: r.roomGen(), NTokens: uint32(len(r.InputIDs)),
			CachedPages: uint32(hit)}})
		m.setStage(r, StageAwaitingKV, 0, outcome.None)
		m.record(r, "%d pages allocated%s, ROOM_READY sent", len(r.pages), fromCache(hit))
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
		if first < r.cachedPages {
			// Those pages are shared from the cache: never written.
			m.drop("malformed")
			m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
				"KV chunk %d is for pages %d+%d, but decode holds the first %d from its cache (ROOM_READY)",
				x.Seq, first, n, r.cachedPages), "")
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
			m.record(r, "first KV chunk")
		}
		m.transferProgress(r)
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
		if int(x.NPages) != np || int(x.NTokens) != len(r.InputIDs) || r.recvCount+r.cachedPages != np {
			m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
				"incomplete KV: received %d and cached %d of %d pages; KV_DONE says %d pages for %d tokens (prompt has %d)",
				r.recvCount, r.cachedPages, np, x.NPages, x.NTokens, len(r.InputIDs)), "")
			return
		}
		if want := m.binding(r); x.Binding != want {
			// KV for another request (another room or gen, another prompt,
			// another model, or pages that hold another request's KV):
			// never decoded.
			m.drop("wrong_binding")
			m.finish(r, outcome.FailedTransfer, fmt.Sprintf(
				"KV is not this request's: KV_DONE carries binding %s, room %s with this prompt and model has %s",
				x.Binding, r.roomGen(), want), "")
			return
		}
		r.verifying, r.done = true, x
		m.emit(VerifyKV{Job: m.pin(r), Peer: p, RID: r.RID, Gen: r.Gen, Pages: r.pages[:np]})
	default:
		m.drop("wrong_role")
	}
}

// transferProgress re-arms decode request r's transfer deadline: a KV
// chunk came for it, or (once the transfer has started) prefill renewed its
// room. The transfer fails with timeout_transfer only after TransferTimeout
// with neither, so the time prefill spends computing the prompt's later
// chunks (in batches with other prompts, on a slow model) is not charged to
// the transfer while prefill shows it still holds the room; the request's
// own deadline (hardDeadline) still bounds the whole wait, and prefill's
// transferring deadline bounds its send from KV_DONE to KV_ACK.
func (m *Machine) transferProgress(r *req) {
	r.deadline, r.cause = m.now.Add(m.cfg.TransferTimeout), outcome.TimeoutTransfer
	r.budget = m.cfg.TransferTimeout
}

// binding is what KV_DONE must carry for decode request r: its room and
// gen, and the page hashes of its prompt under this worker's model
// (kvxfer.BindKV).
func (m *Machine) binding(r *req) kvxfer.Binding {
	hashes := kvxfer.AppendPromptChain(make([]kvxfer.PageHash, 0, m.promptPages(r)), m.seed, r.InputIDs, m.cfg.PageSize)
	return kvxfer.BindKV(r.roomGen(), uint32(len(r.InputIDs)), hashes)
}

func (m *Machine) kvVerified(e KVVerified) {
	r, ok := m.reqs[e.RID]
	if !ok || r.Gen != e.Gen || !r.verifying {
		return
	}
	r.verifying = false
	if e.Checksum != r.done.Checksum {
		// The pages decode took from its cache may be what is wrong (they
		// are not prefill's bytes): no one matches them again, so the
		// retry receives every page.
		for _, p := range r.pages[:r.cachedPages] {
			m.cache.Forget(p)
		}
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
	// Verified and acknowledged: the received full prompt pages may be
	// shared from now on.
	m.publish(r, r.InputIDs, r.cachedPages, len(r.InputIDs)/m.cfg.PageSize)
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

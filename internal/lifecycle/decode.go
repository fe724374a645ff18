package lifecycle

import (
	"fmt"
	"slices"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// admit gives pages to decode requests waiting in Prealloc, in arrival order.
func (m *Machine) admit() {
	if m.cfg.Role != RoleDecode {
		return
	}
	for _, r := range m.waitOrder() {
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
// gen, the page hashes of its prompt under this worker's model and its
// constraint's digest (kvxfer.BindKVConstrained).
func (m *Machine) binding(r *req) kvxfer.Binding {
	hashes := kvxfer.AppendPromptChain(make([]kvxfer.PageHash, 0, m.promptPages(r)), m.seed, r.InputIDs, m.cfg.PageSize)
	return kvxfer.BindKVConstrained(r.roomGen(), uint32(len(r.InputIDs)), hashes, r.ConstraintDigest)
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
	if why := m.checkFirst(r); why != "" {
		m.finish(r, outcome.FailedTransfer, why, "")
		return
	}
	m.emit(Send{Peer: r.Peer, Msg: kvxfer.KVAck{RoomGen: r.roomGen()}})
	r.ackSent = true
	m.record(r, "KV verified, KV_ACK sent")
	// Verified and acknowledged: the received full prompt pages may be
	// shared from now on.
	m.publish(r, r.InputIDs, r.cachedPages, len(r.InputIDs)/m.cfg.PageSize)
	m.setStage(r, StageQueued, m.cfg.QueueTimeout, outcome.TimeoutQueue)
	first := model.SeqOutput{Token: r.done.FirstToken, Logprob: r.done.FirstLogprob}
	for i, f := range r.done.First {
		t := model.SeqOutput{Token: f.Token, Logprob: f.Logprob, Top: f.Top}
		if i == 0 {
			first.Top = f.Top
			continue
		}
		first.Forks = append(first.Forks, t)
	}
	m.firstTokens(r, first)
}

// checkFirst reports what is wrong with the first tokens KV_DONE carries for
// decode request r: one per choice, each in the vocabulary, with its top
// logprobs when the request asks for them.
func (m *Machine) checkFirst(r *req) string {
	d := &r.done
	n := r.choices()
	if n > 1 && len(d.First) != n {
		return fmt.Sprintf("KV_DONE carries %d first tokens for a request of %d choices", len(d.First), n)
	}
	if d.FirstToken < 0 || int(d.FirstToken) >= m.cfg.VocabSize {
		return fmt.Sprintf("first token %d from prefill is outside the vocabulary", d.FirstToken)
	}
	for i, f := range d.First {
		if f.Token < 0 || int(f.Token) >= m.cfg.VocabSize {
			return fmt.Sprintf("first token %d of choice %d from prefill is outside the vocabulary", f.Token, i)
		}
		if len(f.Top) != r.Sampling.TopLogprobs {
			return fmt.Sprintf("choice %d's first token carries %d top logprobs, the request asks for %d", i, len(f.Top), r.Sampling.TopLogprobs)
		}
	}
	if r.Sampling.TopLogprobs > 0 && len(d.First) == 0 {
		return "KV_DONE carries no top logprobs for the first token, which the request asks for"
	}
	if r.matcher != nil {
		// Prefill drew them under this grammar (the binding says so): a
		// token it refuses is not this request's. (A constraint that
		// outgrew its bounds fails the request when the token is taken.)
		if !r.matcher.Clone().Accept(d.FirstToken) && r.matcher.Err() == nil {
			return fmt.Sprintf("first token %d from prefill is outside the request's grammar", d.FirstToken)
		}
		for i, f := range d.First {
			if !r.matcher.Clone().Accept(f.Token) && r.matcher.Err() == nil {
				return fmt.Sprintf("first token %d of choice %d from prefill is outside the request's grammar", f.Token, i)
			}
		}
	}
	return ""
}

// fork starts choices 1…N−1 of request r (decode: its KV verified and
// acknowledged; colocated: its prompt just computed), and then gives every
// choice its first token: first's for r, first.Forks[i−1] for choice i.
// A fork shares r's full prompt pages (one more reference each, never
// written), takes one page reserved at admission (forkPages) into which
// the shell copies r's last, partial prompt page (CopyKV) before any
// forward can write it, and goes on as r does (same stage, deadline and
// prompt), drawing with model.ForkSeed(seed, i).
func (m *Machine) fork(r *req, first model.SeqOutput) {
	n := r.choices()
	if len(first.Forks) != n-1 || len(r.forkPages) != n-1 {
		m.finish(r, outcome.FailedInternal, fmt.Sprintf("cannot fork %d choices: %d first tokens, %d pages reserved",
			n, 1+len(first.Forks), len(r.forkPages)), "")
		return
	}
	full := len(r.InputIDs) / m.cfg.PageSize
	partial := len(r.InputIDs)%m.cfg.PageSize != 0
	g := &group{members: []*req{r}, live: n}
	r.group = g
	for i := 1; i < n; i++ {
		f := &req{Request: r.Request, ban: r.ban, arrived: r.arrived, hardDeadline: r.hardDeadline, choice: i, group: g}
		f.Sampling.Seed = model.ForkSeed(r.Sampling.Seed, i)
		if r.matcher != nil {
			// Every choice drew its first token from r's mask; each goes
			// on from there with its own matcher.
			f.matcher = r.matcher.Clone()
			f.mask = make([]uint64, len(r.mask))
		}
		if err := m.cache.Share(r.pages[:full]); err != nil {
			panic(fmt.Sprintf("lifecycle: %v", err)) // r holds them: the bookkeeping makes it impossible
		}
		own := r.forkPages[i-1]
		f.pages = append(append(make([]kvcache.PageID, 0, full+1), r.pages[:full]...), own)
		if partial && m.endsWith(f, first.Forks[i-1].Token, 1) == "" {
			// (A choice that ends with its first token never reads it.)
			m.emit(CopyKV{Src: r.pages[full], Dst: own})
		}
		f.chain = append([]kvxfer.PageHash(nil), r.chain[:min(len(r.chain), full)]...)
		f.link = r.link
		f.decodeSide = r.decodeSide
		if r.recv != nil {
			f.recv = append([]bool(nil), r.recv...)
		}
		m.admitSeq++
		f.admitted = m.admitSeq
		f.stageSince = m.now
		m.setStage(f, r.stage, r.budget, r.cause)
		m.record(f, "choice %d forked: %d prompt pages shared%s", i, full, copied(partial))
		m.queue = append(m.queue, f)
		g.members = append(g.members, f)
	}
	r.forkPages = nil
	m.record(r, "forked %d choices", n)
	for i, c := range g.members {
		t := first
		if i > 0 {
			t = first.Forks[i-1]
		}
		if c.stage != StageDone {
			m.appendOutput(c, sampled(t))
		}
	}
}

func copied(partial bool) string {
	if partial {
		return ", the partial one copied"
	}
	return ""
}

// appendOutput adds a generated token, emits it, and ends the request if it
// hit a stop token, max_tokens or the context length.
func (m *Machine) appendOutput(r *req, t model.SeqOutput) {
	if r.matcher != nil {
		ok := r.matcher.Accept(t.Token)
		if err := r.matcher.Err(); err != nil {
			// The constraint outgrew the engine's bounds: the mask this
			// token was drawn from is not to be trusted.
			m.finish(r, outcome.RejectedInvalid, err.Error(), "")
			return
		}
		if !ok {
			// The sampler draws only what the mask allows: a bug, never
			// text outside the grammar.
			m.finish(r, outcome.FailedInternal, fmt.Sprintf("output token %d (step %d) is outside the request's grammar",
				t.Token, r.sampleStep()), "")
			return
		}
	}
	r.outputs = append(r.outputs, t.Token)
	if r.contOut != nil {
		r.contOut = append(r.contOut, t.Token)
	}
	m.emit(Emit{RID: r.RID, Choice: r.choice, Tokens: []model.SeqOutput{t}})
	if why := m.endsWith(r, t.Token, len(r.outputs)); why != "" {
		m.finish(r, outcome.OK, "", why)
	}
}

// endsWith is the finish reason of r if its n-th output token is tok: "stop"
// for EOS (unless ignored; with a constraint, always: the grammar allows it
// only where its text ends) or a stop token, "length" at max_tokens or the
// context length, "" if it goes on.
func (m *Machine) endsWith(r *req, tok int32, n int) string {
	eosEnds := !r.IgnoreEOS || r.Constraint != nil
	switch {
	case (eosEnds && slices.Contains(m.cfg.EOS, tok)) || slices.Contains(r.StopTokenIDs, tok):
		return "stop"
	case n >= r.MaxTokens || len(r.InputIDs)+n >= m.cfg.ContextLen:
		return "length"
	}
	return ""
}

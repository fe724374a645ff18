package lifecycle

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/outcome"
)

// checkLegal verifies that every live request is in one of the legal
// combinations of state the req doc comment lists for its role and stage,
// that the machine's indexes agree with its requests, and its accounting:
// pages used equal pages held by live requests and by ended ones whose
// pages wait for the forward or page I/O, used + free == total, and each
// stage count equals the true count. The harnesses call it after every
// step.
func checkLegal(m *Machine) error {
	var errs []error
	live, pins, batched := 0, 0, 0
	refs := make(map[kvcache.PageID]int) // references live and draining requests hold
	var stages [numStages]int
	// The queue holds every live request (and ended ones until compacted);
	// walking it rather than the maps keeps this cheap enough to run after
	// every step of the randomized test.
	// A request with n > 1 is live while one of its choices is: its head
	// (choice 0) stays indexed even after its own choice ended.
	heads := make(map[*req]bool)
	groupPages := make(map[kvcache.PageID]bool) // pages the choices of one request may share
	for _, r := range m.queue {
		if r.stage == StageDone {
			continue
		}
		head := r
		if g := r.group; g != nil {
			head = g.members[0]
			if g.live == 0 || g.members[r.choice] != r {
				errs = append(errs, fmt.Errorf("%s %s choice %d: live in a group that ended or does not list it", m.cfg.Role, r.RID, r.choice))
			}
			for _, p := range r.pages {
				groupPages[p] = true
			}
		} else if r.choice != 0 {
			errs = append(errs, fmt.Errorf("%s %s: choice %d without a group", m.cfg.Role, r.RID, r.choice))
		}
		heads[head] = true
		for _, p := range r.pages {
			refs[p]++
		}
		for _, p := range r.forkPages {
			refs[p]++
		}
		if len(r.forkPages) > 0 && (r.group != nil || len(r.forkPages) != r.choices()-1) {
			errs = append(errs, fmt.Errorf("%s %s: %d fork pages reserved (n %d, forked %v)", m.cfg.Role, r.RID, len(r.forkPages), r.choices(), r.group != nil))
		}
		stages[r.stage]++
		if err := m.legal(r); err != nil {
			errs = append(errs, fmt.Errorf("%s %s in %s: %w", m.cfg.Role, r.RID, r.stage, err))
		}
		if m.reqs[r.RID] != head {
			errs = append(errs, fmt.Errorf("%s %s: live but not indexed by its id", m.cfg.Role, r.RID))
		}
		if m.cfg.Role != RoleColocated && !r.Room.IsZero() && m.rooms[r.Room] != head {
			errs = append(errs, fmt.Errorf("%s %s: live but not indexed by its room", m.cfg.Role, r.RID))
		}
		pins += r.pins
		if r.inBatch {
			batched++
		}
	}
	live = len(heads)
	if live != len(m.reqs) {
		errs = append(errs, fmt.Errorf("%s: %d live requests in the queue, %d indexed", m.cfg.Role, live, len(m.reqs)))
	}
	roomed := 0
	for h := range heads {
		if !h.Room.IsZero() {
			roomed++
		}
	}
	if m.cfg.Role != RoleColocated && roomed != len(m.rooms) {
		errs = append(errs, fmt.Errorf("%s: %d live requests with a room, %d rooms", m.cfg.Role, roomed, len(m.rooms)))
	}
	for r := range m.draining {
		if r.stage != StageDone || (!r.inBatch && r.pins == 0) {
			errs = append(errs, fmt.Errorf("%s %s draining in %s with inBatch=%v pins=%d", m.cfg.Role, r.RID, r.stage, r.inBatch, r.pins))
		}
		for _, p := range r.pages {
			refs[p]++
		}
		for _, p := range r.forkPages {
			refs[p]++
		}
		pins += r.pins
		if r.inBatch {
			batched++
		}
	}
	if err := m.checkCache(refs, groupPages); err != nil {
		errs = append(errs, err)
	}
	if stages != m.stageCount {
		errs = append(errs, fmt.Errorf("%s: stage gauges %v, true counts %v", m.cfg.Role, m.stageCount, stages))
	}
	// pins counts a request's jobs in flight and inBatch its place in the
	// running forward: live and draining requests account for all of them.
	if pins != len(m.jobs) {
		errs = append(errs, fmt.Errorf("%s: requests hold %d pins, %d jobs in flight", m.cfg.Role, pins, len(m.jobs)))
	}
	for _, b := range m.batch {
		if !b.r.inBatch {
			errs = append(errs, fmt.Errorf("%s: %s is in the running batch without inBatch", m.cfg.Role, b.r.RID))
		}
	}
	if batched != len(m.batch) {
		errs = append(errs, fmt.Errorf("%s: %d requests marked inBatch, %d in the running batch", m.cfg.Role, batched, len(m.batch)))
	}
	if comp, park := m.unboundPages(); comp+park > 0 && (!m.optimisticOn() || comp+park > m.optimisticCap()) {
		errs = append(errs, fmt.Errorf("%s: optimistic KV holds %d+%d pages, cap %d", m.cfg.Role, comp, park, m.optimisticCap()))
	}
	if err := m.checkPageHashes(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkCache verifies the page accounting against refs, the references
// the live and draining requests hold: every page's reference count is the
// number of its holders (so a request's end, exactly once, drops exactly
// its references), used = the pages held, used + free + cached = total,
// nothing is shared or cached without the prefix cache, and every indexed
// page a live request holds is filed under the chained hash of that
// request's own tokens up to the page's end (prefill: the prompt; decode
// and colocated: prompt then output), so a request that matched it reads
// the KV of its own prefix. An unbound (optimistic) request publishes
// nothing: its indexed pages are the ones it matched.
//
// The choices of one request (grouped) share their prompt's full pages
// whether or not the prefix cache is on.
func (m *Machine) checkCache(refs map[kvcache.PageID]int, grouped map[kvcache.PageID]bool) error {
	var errs []error
	c := m.cache
	for p := range kvcache.PageID(c.Total()) {
		if c.Refs(p) != refs[p] {
			errs = append(errs, fmt.Errorf("%s: page %d has %d references, %d holders", m.cfg.Role, p, c.Refs(p), refs[p]))
		}
		if !c.Enabled() && refs[p] > 1 && !grouped[p] {
			errs = append(errs, fmt.Errorf("%s: page %d shared by %d requests without the prefix cache", m.cfg.Role, p, refs[p]))
		}
	}
	if c.Used() != len(refs) || c.Used()+c.FreeCount() != c.Total() || (!c.Enabled() && c.Cached() != 0) {
		errs = append(errs, fmt.Errorf("%s: pages used %d, held %d, cached %d, free+cached %d, total %d",
			m.cfg.Role, c.Used(), len(refs), c.Cached(), c.FreeCount(), c.Total()))
	}
	if !c.Enabled() {
		return errors.Join(errs...)
	}
	ps := m.cfg.PageSize
	for _, r := range m.queue {
		if r.stage == StageDone || len(r.pages) == 0 {
			continue
		}
		toks := r.seqTokens()
		var chain []kvxfer.PageHash
		for i, p := range r.pages {
			k, idx := c.Indexed(p)
			if !idx {
				continue
			}
			for len(chain) <= i && (len(chain)+1)*ps <= len(toks) {
				parent := m.seed
				if len(chain) > 0 {
					parent = chain[len(chain)-1]
				}
				chain = append(chain, kvxfer.ChainPage(parent, toks[len(chain)*ps:(len(chain)+1)*ps]))
			}
			if i >= len(chain) || k != kvcache.Key(chain[i]) {
				errs = append(errs, fmt.Errorf("%s %s: page %d (index %d) is indexed under a key that is not its tokens' hash", m.cfg.Role, r.RID, p, i))
			}
			if r.opt.unbound && i >= r.cachedTokens/ps {
				errs = append(errs, fmt.Errorf("prefill %s: unbound KV published (page %d, index %d)", r.RID, p, i))
			}
		}
	}
	return errors.Join(errs...)
}

// checkPageHashes verifies prefill's record of what each page holds: a
// live request's computed pages carry the hash of its prompt up to their
// end (its full pages, and every page once the prompt is computed), its
// other pages none, and so does every free page; a cached page keeps the
// hash it is indexed under.
func (m *Machine) checkPageHashes() error {
	if m.cfg.Role != RolePrefill {
		if m.pageHash != nil {
			return fmt.Errorf("%s: page hashes are kept on prefill only", m.cfg.Role)
		}
		return nil
	}
	var errs []error
	var zero kvxfer.PageHash
	held := make(map[kvcache.PageID]bool)
	for r := range m.draining {
		for _, p := range r.pages {
			held[p] = true
		}
	}
	for _, r := range m.queue {
		if r.stage == StageDone || len(r.pages) == 0 {
			continue
		}
		hashed := r.computed / m.cfg.PageSize
		if r.computed == len(r.InputIDs) {
			hashed = m.promptPages(r)
		}
		chain := kvxfer.AppendPromptChain(nil, m.seed, r.InputIDs, m.cfg.PageSize)
		for i, p := range r.pages {
			held[p] = true
			want := zero
			if i < hashed {
				want = chain[i]
			}
			if got := m.pageHash[p]; got != want {
				errs = append(errs, fmt.Errorf("prefill %s: page %d (index %d of %d computed tokens) has hash %s, want %s",
					r.RID, p, i, r.computed, got, want))
			}
		}
	}
	for p, h := range m.pageHash {
		k, idx := m.cache.Indexed(kvcache.PageID(p))
		if idx && kvcache.Key(h) != k {
			errs = append(errs, fmt.Errorf("prefill: page %d indexed under %x has hash %s", p, k, h))
		}
		if h != zero && !held[kvcache.PageID(p)] && !idx {
			errs = append(errs, fmt.Errorf("prefill: free page %d keeps hash %s", p, h))
		}
	}
	return errors.Join(errs...)
}

// legal checks one live request against the table in the req doc comment.
func (m *Machine) legal(r *req) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	jobs := r.pins
	P, T := m.promptPages(r), len(r.InputIDs)
	K := T + max(0, len(r.outputs)-1) // len(r.prefillTokens()), without the copy
	pages, out := len(r.pages), len(r.outputs)
	// lastRenew is left out: a ROOM_RENEW may touch it before it matters
	// (see leased).
	zeroLink := !r.opened && !r.peerUp && !r.peerEnded && r.peerCause == (outcome.Cause{})
	zeroPrefill := reflect.DeepEqual(r.prefillSide, prefillSide{})
	zeroDecode := r.recv == nil && r.recvCount == 0 && r.cachedPages == 0 && !r.xferStarted && !r.verifying && !r.ackSent && reflect.DeepEqual(r.done, kvxfer.KVDone{})

	// Every stage.
	if !(r.stage != StageNone && r.stage != StageDone) {
		bad("a live request in stage %s", r.stage)
	}
	if !(r.deadline.IsZero() == (r.cause == outcome.None)) || r.deadline.IsZero() != (r.budget == 0) {
		bad("deadline %v with cause %s and budget %s", r.deadline, r.cause, r.budget)
	}
	if !(!r.inBatch || r.stage == StagePrefilling || r.stage == StageDecoding) {
		bad("in the batch while %s", r.stage)
	}
	if !(!r.peerEnded && !r.peerCause.Known() && r.peerCause == (outcome.Cause{})) {
		bad("live with the peer's end recorded")
	}
	if !(pages <= m.maxPages(r.Request)) {
		bad("%d pages, at most %d", pages, m.maxPages(r.Request))
	}
	if !(r.hardDeadline.Sub(r.arrived) > 0 && r.hardDeadline.Sub(r.arrived) <= m.cfg.MaxRequestTime) {
		bad("hard deadline %s after arrival", r.hardDeadline.Sub(r.arrived))
	}

	// colocated is the table's colocated rows: a colocated worker's
	// requests, and a decode worker's local ones (no room).
	colocated := func() {
		if !(zeroLink && zeroPrefill && zeroDecode) {
			bad("KV channel state on a request without a room")
		}
		if !(jobs == 0) {
			bad("page I/O on a request without a room")
		}
		switch r.stage {
		case StageWaiting:
			if !(pages == 0 && r.computed == 0 && out == 0) {
				bad("waiting: pages=%d computed=%d outputs=%d", pages, r.computed, out)
			}
		case StagePrefilling:
			if !(pages > 0 && r.computed < K) {
				bad("prefilling: pages=%d computed=%d/%d", pages, r.computed, K)
			}
		case StageDecoding:
			if !(pages > 0 && out >= 1) {
				bad("decoding: pages=%d outputs=%d", pages, out)
			}
		case StagePreempted:
			if !(pages == 0 && r.computed == 0) {
				bad("preempted: pages=%d computed=%d outputs=%d", pages, r.computed, out)
			}
		default:
			if !(false) {
				bad("not a stage of a request without a room")
			}
		}
	}

	switch m.cfg.Role {
	case RolePrefill:
		if !(zeroDecode && out == 0) {
			bad("decode state on prefill")
		}
		if !(!r.peerUp) {
			bad("peerUp on prefill")
		}
		o := r.opt
		if !(o.attempts <= m.cfg.OptimisticAttempts && (!o.unbound || o.pending) && (!o.over || !o.pending)) {
			bad("optimistic state %+v with %d attempts allowed", o, m.cfg.OptimisticAttempts)
		}
		if !(r.bootDeadline == r.arrived.Add(m.cfg.BootstrapTimeout)) {
			bad("bootstrap deadline %s after arrival", r.bootDeadline.Sub(r.arrived))
		}
		unboundOK := func() bool { // ⁶: an unbound request is not opened, ready or sending, and vice versa
			return o.unbound == !r.opened && (!o.unbound || (!r.ready && r.sentPages == 0 && r.chunks == 0 && jobs == 0 &&
				!r.deadline.IsZero() && !r.deadline.After(r.bootDeadline)))
		}
		rest := r.prefillSide
		rest.opt = optState{}
		if r.Room.IsZero() {
			// The prompt alone (max_tokens 0): no room, no peer, no KV sent.
			promptOnly := zeroLink && reflect.DeepEqual(rest, prefillSide{}) && !o.unbound && !o.pending && r.promptOnly() && jobs == 0
			switch {
			case !promptOnly:
				bad("a request without a room that is not prompt-only, or holds peer state: %+v", r.prefillSide)
			case r.stage == StageWaiting && (pages != 0 || r.computed != 0):
				bad("waiting with %d pages, %d computed", pages, r.computed)
			case r.stage == StagePrefilling && (pages != P || r.computed >= T):
				bad("prefilling: pages %d/%d computed %d/%d", pages, P, r.computed, T)
			case r.stage != StageWaiting && r.stage != StagePrefilling:
				bad("a prompt-only request in %s", r.stage)
			}
			break
		}
		switch r.stage {
		case StageBootstrap:
			if !(zeroLink && reflect.DeepEqual(rest, prefillSide{}) && !o.unbound && !o.pending && pages == 0 && r.computed == 0 && jobs == 0) {
				bad("bootstrap holds state: opened=%v %+v pages=%d", r.opened, r.prefillSide, pages)
			}
		case StageWaiting:
			if !(r.opened && !o.unbound && !o.pending && pages == 0 && r.computed == 0 && r.sentPages == 0 && r.chunks == 0 && jobs == 0) {
				bad("waiting: opened=%v %+v pages=%d computed=%d sent=%d pins=%d", r.opened, o, pages, r.computed, r.sentPages, jobs)
			}
		case StagePrefilling:
			if !(unboundOK() && pages == P && r.computed < T) {
				bad("prefilling: opened=%v %+v pages=%d/%d computed=%d/%d", r.opened, o, pages, P, r.computed, T)
			}
			if !(r.sentPages*m.cfg.PageSize <= r.computed) {
				bad("sent %d pages of %d computed tokens", r.sentPages, r.computed)
			}
			if !(r.ready || (r.sentPages == 0 && jobs == 0)) {
				bad("KV sent before ROOM_READY")
			}
		case StageParked:
			if !(unboundOK() && !r.ready && pages == P && r.computed == T && r.sentPages == 0 && jobs == 0 && !r.inBatch) {
				bad("parked: opened=%v %+v ready=%v pages=%d/%d computed=%d/%d sent=%d pins=%d", r.opened, o, r.ready, pages, P, r.computed, T, r.sentPages, jobs)
			}
		case StageTransferring:
			if !(r.opened && r.ready && !o.unbound && !o.pending && pages == P && r.computed == T && r.sentPages == P && !r.inBatch) {
				bad("transferring: opened=%v ready=%v %+v pages=%d/%d computed=%d/%d sent=%d", r.opened, r.ready, o, pages, P, r.computed, T, r.sentPages)
			}
		default:
			if !(false) {
				bad("not a prefill stage")
			}
		}
	case RoleDecode:
		if r.Room.IsZero() {
			colocated() // a local request
			break
		}
		if !(zeroPrefill) {
			bad("prefill state on decode")
		}
		if !(r.opened) {
			bad("ROOM_OPEN not sent")
		}
		if !(r.xferStarted == (r.recvCount > 0)) {
			bad("xferStarted %v with %d pages received", r.xferStarted, r.recvCount)
		}
		if !(r.recvCount <= len(r.recv)) {
			bad("received %d of %d pages", r.recvCount, len(r.recv))
		}
		if r.stage != StagePrealloc {
			if !(len(r.recv) == P) {
				bad("recv covers %d pages, prompt %d", len(r.recv), P)
			}
		}
		after := r.stage == StageQueued || r.stage == StageDecoding || r.stage == StagePreempted || r.stage == StagePrefilling
		if after {
			if !(r.ackSent && !r.verifying && r.recvCount+r.cachedPages == P && out >= 1) {
				bad("after the hand-over: ackSent=%v verifying=%v received=%d+%d cached/%d outputs=%d",
					r.ackSent, r.verifying, r.recvCount, r.cachedPages, P, out)
			}
		}
		switch r.stage {
		case StagePrealloc:
			if !(pages == 0 && r.recv == nil && !r.ackSent && !r.verifying && out == 0 && jobs == 0) {
				bad("prealloc holds state")
			}
		case StageAwaitingKV:
			if !(pages >= P && r.computed == 0 && !r.ackSent && out == 0 && !r.inBatch) {
				bad("awaiting_kv: pages=%d/%d ackSent=%v outputs=%d", pages, P, r.ackSent, out)
			}
			if !(!r.verifying || r.recvCount+r.cachedPages == P) {
				bad("verifying with %d+%d cached of %d pages", r.recvCount, r.cachedPages, P)
			}
			if !(r.cachedPages <= T/m.cfg.PageSize) {
				bad("%d cached pages of a %d-token prompt", r.cachedPages, T)
			}
			for i := r.cachedPages; i < P && i < pages; i++ {
				if _, idx := m.cache.Indexed(r.pages[i]); idx || m.cache.Refs(r.pages[i]) != 1 {
					bad("page %d (index %d) receives KV but is shared or indexed before KV_DONE is verified", r.pages[i], i)
				}
			}
		case StageQueued:
			if !(pages >= P && r.computed == 0 && !r.inBatch) {
				bad("queued: pages=%d/%d computed=%d", pages, P, r.computed)
			}
		case StageDecoding:
			if !(pages >= P) {
				bad("decoding with %d of %d prompt pages", pages, P)
			}
		case StagePreempted:
			if !(pages == 0 && r.computed == 0 && jobs == 0) {
				bad("preempted: pages=%d computed=%d pins=%d", pages, r.computed, jobs)
			}
		case StagePrefilling:
			if !(pages >= P && r.computed < K && jobs == 0) {
				bad("prefilling: pages=%d computed=%d/%d pins=%d", pages, r.computed, K, jobs)
			}
		default:
			if !(false) {
				bad("not a decode stage")
			}
		}
	case RoleColocated:
		colocated()
	}
	return errors.Join(errs...)
}

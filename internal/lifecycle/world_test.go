package lifecycle

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// A world is the shell of a prefill and a decode worker (or of a colocated
// one) around their machines: a fake model whose next token depends on the
// page bytes actually present, page I/O that runs when told, one KV
// connection whose frames stay in flight until delivered, and a fake
// clock. The randomized pair test and the transcript tests
// (testdata/*.txt, see transcript_test.go) drive machines through the same
// world: every action is one transcript command, so a seeded run records
// itself as a transcript that replays from a file.
type world struct {
	t          testing.TB
	start, now time.Time
	nodes      []*node
	// epoch counts KV connections: decode knows the prefill worker as peer
	// 100+epoch and prefill knows decode as 200+epoch, so a reconnect gets
	// new ids as in the TCP backend.
	epoch     int
	connected bool
	// rooms names each room for printing.
	rooms    map[kvxfer.Room]string
	replacer *strings.Replacer // room hex → name in printed text; nil when stale

	// out receives what the current command prints; nil prints nothing
	// (the randomized test when it does not record).
	out *strings.Builder
	// rec records every command and its output as a transcript.
	rec *recorder

	// Hooks of the randomized test: the delay of each page I/O job, and a
	// router that hears every Finalize.
	ioDelay func() time.Duration
	onFinal func(n *node, f Finalize)
	// onFrame sees each frame delivered to a node, onBatch each forward a
	// node starts (tests that follow the protocol).
	onFrame func(to *node, msg kvxfer.Message)
	onBatch func(n *node, b RunBatch)
	// fail, if set, receives a failed check instead of the test (the model
	// checker turns it into a counterexample).
	fail func(msg string)
}

// node is one machine and its simulated shell.
type node struct {
	name  string
	role  Role
	m     *Machine
	alloc *kvcache.Allocator
	data  map[kvcache.PageID][]byte
	batch *RunBatch
	// batchAt is when the running forward finishes (randomized test).
	batchAt time.Time
	emitted map[string][]int32
	finals  map[string]Finalize
	// io holds page I/O jobs in flight, run in order (like the worker's I/O
	// lanes); inbox the frames in flight to this node, in order (TCP).
	io    []ioJob
	inbox []frame
	// shown is the stage of each live request as last printed.
	shown map[string]Stage
	// owned (model checker): m, data, emitted and finals are this copy's
	// own, not shared with the state it was copied from.
	owned bool
	// kvSeen holds the KV frames (KV_CHUNK, KV_DONE) delivered to this
	// node, by room and gen, for replays; nil keeps none.
	kvSeen map[kvxfer.RoomGen][]kvxfer.Message
}

type ioJob struct {
	due time.Time
	e   Effect
}

// frame is a room message in flight. at is when the randomized test lets
// it arrive; fresh marks a frame its network faults have not seen yet.
type frame struct {
	msg   kvxfer.Message
	at    time.Time
	fresh bool
}

func newWorld(t testing.TB) *world {
	start := time.Unix(1_000_000, 0)
	return &world{t: t, start: start, now: start, rooms: map[kvxfer.Room]string{}}
}

// printing reports whether commands print (transcripts, recording).
func (w *world) printing() bool { return w.out != nil }

// say prints one line of node n (or of the world when n is nil).
func (w *world) say(n *node, format string, args ...any) {
	if w.out == nil {
		return
	}
	if n != nil {
		w.out.WriteString(n.name)
		w.out.WriteString(": ")
	}
	fmt.Fprintf(w.out, format, args...)
	w.out.WriteByte('\n')
}

func (w *world) fatalf(format string, args ...any) {
	if w.fail != nil {
		w.fail(fmt.Sprintf(format, args...))
		return
	}
	w.t.Fatalf(format, args...)
}

func (w *world) node(name string) *node {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	w.fatalf("no node %q", name)
	return nil
}

func (w *world) byRole(r Role) *node {
	for _, n := range w.nodes {
		if n.role == r {
			return n
		}
	}
	return nil
}

// addNode starts a machine of cfg.Role with a pool of pages, named for its
// role.
//
// force > 0 sets the optimistic test hook of a prefill node to
// ForceFraction(force), which the recorder writes as
// force-optimistic-fraction (a hook, unlike a number, cannot be printed).
func (w *world) addNode(cfg Config, pages int, force float64) *node {
	if w.rec != nil {
		args, ok := configArgs(cfg)
		if !ok {
			w.fatalf("the recorder cannot write config %+v", cfg)
		}
		if force > 0 {
			args += fmt.Sprintf(" force-optimistic-fraction=%s", strconv.FormatFloat(force, 'g', -1, 64))
		}
		w.rec.begin(w, "node %s pages=%d%s", cfg.Role, pages, args)
		defer w.rec.end(w)
	}
	if force > 0 {
		cfg.ForceOptimistic = ForceFraction(force)
	}
	if w.byRole(cfg.Role) != nil {
		w.fatalf("a %s node exists already", cfg.Role)
	}
	a := kvcache.NewAllocator(pages)
	m, err := New(cfg, a)
	if err != nil {
		w.fatalf("node %s: %v", cfg.Role, err)
	}
	n := &node{name: cfg.Role.String(), role: cfg.Role, m: m, alloc: a, data: map[kvcache.PageID][]byte{},
		emitted: map[string][]int32{}, finals: map[string]Finalize{}, shown: map[string]Stage{},
		kvSeen: map[kvxfer.RoomGen][]kvxfer.Message{}}
	w.nodes = append(w.nodes, n)
	w.say(n, "%d pages of %d tokens; timeouts: bootstrap %s, queue %s, kv-hold %s, transfer %s; lease %s; tombstones %s",
		pages, cfg.PageSize, cfg.BootstrapTimeout, cfg.QueueTimeout, cfg.KVHoldTimeout, cfg.TransferTimeout,
		cfg.Lease(), cfg.TombstoneTTL)
	return n
}

// peerOf is the id node n knows its KV peer by on the current connection.
func (w *world) peerOf(n *node) kvxfer.PeerID {
	if n.role == RoleDecode {
		return kvxfer.PeerID(100 + w.epoch)
	}
	return kvxfer.PeerID(200 + w.epoch)
}

// other is the node at the far end of n's KV connection.
func (w *world) other(n *node) *node {
	switch n.role {
	case RolePrefill:
		return w.byRole(RoleDecode)
	case RoleDecode:
		return w.byRole(RolePrefill)
	}
	return nil
}

// connect opens the KV connection: both sides hear PeerUp, decode first
// (it dials).
func (w *world) connect() {
	if w.rec != nil {
		w.rec.begin(w, "connect")
		defer w.rec.end(w)
	}
	d, p := w.byRole(RoleDecode), w.byRole(RolePrefill)
	if d == nil || p == nil || w.connected {
		w.fatalf("connect needs a prefill and a decode node and no connection")
	}
	w.connected = true
	w.say(nil, "connection %d: decode knows prefill as peer %d, prefill knows decode as peer %d", w.epoch, w.peerOf(d), w.peerOf(p))
	w.step(d, PeerUp{Peer: w.peerOf(d)})
	w.step(p, PeerUp{Peer: w.peerOf(p)})
}

// disconnect kills the KV connection: frames in flight are lost and both
// sides hear PeerLost, prefill first.
func (w *world) disconnect(reason string) {
	if w.rec != nil {
		w.rec.begin(w, "disconnect err=%s", reason)
		defer w.rec.end(w)
	}
	if !w.connected {
		w.fatalf("no connection to lose")
	}
	p, d := w.byRole(RolePrefill), w.byRole(RoleDecode)
	lost := len(p.inbox) + len(d.inbox)
	p.inbox, d.inbox = nil, nil
	w.connected = false
	w.say(nil, "connection %d lost with %d frames in flight", w.epoch, lost)
	pp, dp := w.peerOf(p), w.peerOf(d)
	w.epoch++
	err := fmt.Errorf("%s", reason)
	w.step(p, PeerLost{Peer: pp, Err: err})
	w.step(d, PeerLost{Peer: dp, Err: err})
}

// arrive delivers a request to n. A decode request's Peer, when zero, is
// the current connection.
func (w *world) arrive(n *node, q Request) {
	if n.role == RoleDecode && q.Peer == 0 {
		q.Peer = w.peerOf(n)
	}
	if n.role == RoleDecode && q.PeerAddr == "" {
		q.PeerAddr = "prefill"
	}
	if !q.Room.IsZero() {
		w.nameRoom(q.Room, q.RID)
	}
	if w.rec != nil {
		w.rec.begin(w, "arrive %s%s", n.name, w.requestArgs(n, q))
		defer w.rec.end(w)
	}
	w.step(n, Arrive{Req: q})
}

// abort steps the abort API of n.
func (w *world) abort(n *node, a AbortRequest) {
	if w.rec != nil {
		if !a.Room.IsZero() || a.Gen != 0 || a.Detail != "" || a.Cause.Known() {
			w.fatalf("the recorder writes aborts by rid and reason only")
		}
		w.rec.begin(w, "abort %s rid=%s reason=%s", n.name, a.RID, abortReasons[a.Reason])
		defer w.rec.end(w)
	}
	w.step(n, a)
}

// tick steps Tick into the nodes (all of them, in order, if none is named).
func (w *world) tick(ns ...*node) {
	if w.rec != nil {
		if len(ns) != 0 {
			w.fatalf("the recorder writes ticks of every node only")
		}
		w.rec.begin(w, "tick")
		defer w.rec.end(w)
	}
	if len(ns) == 0 {
		ns = w.nodes
	}
	for _, n := range ns {
		w.step(n, Tick{})
	}
}

// schedule steps Schedule into n.
func (w *world) schedule(n *node) {
	if w.rec != nil {
		w.rec.begin(w, "schedule %s", n.name)
		defer w.rec.end(w)
	}
	w.step(n, Schedule{})
}

// batchDone finishes n's running forward with the fake model, or fails it
// with err.
func (w *world) batchDone(n *node, err error) {
	if w.rec != nil {
		if err != nil {
			w.fatalf("the recorder writes successful forwards only")
		}
		w.rec.begin(w, "batch-done %s", n.name)
		defer w.rec.end(w)
	}
	if n.batch == nil {
		w.fatalf("%s: no forward is running", n.name)
	}
	b := n.batch
	n.batch = nil
	if err != nil {
		w.say(n, "forward failed: %v", err)
		w.step(n, BatchDone{Err: err})
		return
	}
	w.step(n, BatchDone{Out: w.forward(n, b)})
}

// shutdown steps Shutdown into n.
func (w *world) shutdown(n *node) {
	if w.rec != nil {
		w.rec.begin(w, "shutdown %s", n.name)
		defer w.rec.end(w)
	}
	w.step(n, Shutdown{})
}

// runIO runs the k oldest page I/O jobs of n, each followed by its IODone.
func (w *world) runIO(n *node, k int) {
	if w.rec != nil {
		w.rec.begin(w, "io %s n=%d", n.name, k)
		defer w.rec.end(w)
	}
	if k > len(n.io) {
		w.fatalf("%s: %d page I/O jobs in flight, not %d", n.name, len(n.io), k)
	}
	for range k {
		j := n.io[0]
		n.io = n.io[1:]
		switch x := j.e.(type) {
		case SendKV:
			data := make([]byte, 0, len(x.Pages)*testPageBytes)
			for _, p := range x.Pages {
				data = append(data, n.page(p)...)
			}
			w.send(n, x.Peer, kvxfer.KVChunk{RoomGen: x.RoomGen, Seq: x.Seq, FirstPage: x.FirstPage,
				NPages: uint32(len(x.Pages)), Data: data})
		case SendKVDone:
			d := x.Done
			d.Checksum = n.crc(x.Pages)
			w.send(n, x.Peer, d)
		case WriteKV:
			// Invariant 3: the pages still belong to the job's request
			// (live, or ended and waiting for this write to drain).
			owner := n.m.jobs[x.Job]
			for i, p := range x.Pages {
				if o := n.owner(p); o != nil && o != owner {
					w.fatalf("%s: KV written into page %d, which now belongs to %s", n.name, p, o.RID)
				}
				w.checkPrivate(n, p, owner, "a KV write")
				n.data[p] = slices.Clone(x.Data[i*testPageBytes : (i+1)*testPageBytes])
			}
			w.say(n, "job %d: wrote pages %v", x.Job, x.Pages)
		case VerifyKV:
			sum := n.crc(x.Pages)
			w.say(n, "job %d: pages %v hold crc %08x", x.Job, x.Pages, sum)
			w.step(n, KVVerified{RID: x.RID, Gen: x.Gen, Checksum: sum})
		}
		w.step(n, IODone{Job: jobOf(j.e)})
	}
}

// deliver hands the k oldest frames in flight to n, in order.
func (w *world) deliver(n *node, k int) {
	if w.rec != nil {
		w.rec.begin(w, "deliver %s n=%d", n.name, k)
		defer w.rec.end(w)
	}
	if k > len(n.inbox) {
		w.fatalf("%s: %d frames in flight, not %d", n.name, len(n.inbox), k)
	}
	for range k {
		f := n.inbox[0]
		n.inbox = n.inbox[1:]
		if w.printing() {
			w.out.WriteString(n.name + " << " + w.fmtMsg(f.msg) + "\n")
		}
		if w.onFrame != nil {
			w.onFrame(n, f.msg)
		}
		switch x := f.msg.(type) {
		case kvxfer.KVChunk:
			if n.kvSeen != nil {
				n.kvSeen[x.RoomGen] = append(n.kvSeen[x.RoomGen], x)
			}
		case kvxfer.KVDone:
			if n.kvSeen != nil {
				n.kvSeen[x.RoomGen] = append(n.kvSeen[x.RoomGen], x)
			}
		}
		w.step(n, PeerMessage{Peer: w.peerOf(n), Msg: f.msg})
	}
}

// replay puts in flight to n, relabelled with to's room and gen, the KV
// frames of from that n received so far, in place of to's own KV frames in
// flight: what a relay rewriting frame headers, or a prefill sending
// another request's stream, delivers.
func (w *world) replay(n *node, from, to kvxfer.RoomGen) {
	if w.rec != nil {
		w.fatalf("the recorder does not write replays")
	}
	seen := n.kvSeen[from]
	if len(seen) == 0 {
		w.fatalf("%s received no KV of %s", n.name, w.rg(from))
	}
	kept := n.inbox[:0]
	replaced := 0
	for _, f := range n.inbox {
		switch x := f.msg.(type) {
		case kvxfer.KVChunk:
			if x.RoomGen == to {
				replaced++
				continue
			}
		case kvxfer.KVDone:
			if x.RoomGen == to {
				replaced++
				continue
			}
		}
		kept = append(kept, f)
	}
	n.inbox = kept
	for _, m := range seen {
		switch x := m.(type) {
		case kvxfer.KVChunk:
			x.RoomGen = to
			m = x
		case kvxfer.KVDone:
			x.RoomGen = to
			m = x
		}
		n.inbox = append(n.inbox, frame{msg: m})
	}
	w.say(nil, "%d KV frames of %s in flight to %s as %s, in place of %d of its own", len(seen), w.rg(from), n.name, w.rg(to), replaced)
}

// drop loses the i-th frame in flight to n.
func (w *world) drop(n *node, i int) {
	if w.rec != nil {
		w.rec.begin(w, "drop %s i=%d", n.name, i)
		defer w.rec.end(w)
	}
	if i >= len(n.inbox) {
		w.fatalf("%s: no frame %d in flight", n.name, i)
	}
	if w.printing() {
		w.say(nil, "lost in flight to %s: %s", n.name, w.fmtMsg(n.inbox[i].msg))
	}
	n.inbox = slices.Delete(n.inbox, i, i+1)
}

// dup duplicates the i-th frame in flight to n; the copy follows it.
func (w *world) dup(n *node, i int) {
	if w.rec != nil {
		w.rec.begin(w, "dup %s i=%d", n.name, i)
		defer w.rec.end(w)
	}
	if i >= len(n.inbox) {
		w.fatalf("%s: no frame %d in flight", n.name, i)
	}
	if w.printing() {
		w.say(nil, "duplicated in flight to %s: %s", n.name, w.fmtMsg(n.inbox[i].msg))
	}
	f := n.inbox[i]
	f.fresh = false
	n.inbox = slices.Insert(n.inbox, i+1, f)
}

// reorder swaps the i-th and (i+1)-th frames in flight to n.
func (w *world) reorder(n *node, i int) {
	if w.rec != nil {
		w.rec.begin(w, "reorder %s i=%d", n.name, i)
		defer w.rec.end(w)
	}
	if i+1 >= len(n.inbox) {
		w.fatalf("%s: no frames %d and %d in flight", n.name, i, i+1)
		return
	}
	if w.printing() {
		w.say(nil, "reordered in flight to %s: %s after %s", n.name, w.fmtMsg(n.inbox[i].msg), w.fmtMsg(n.inbox[i+1].msg))
	}
	n.inbox[i], n.inbox[i+1] = n.inbox[i+1], n.inbox[i]
}

// drain steps Drain into n.
func (w *world) drain(n *node) {
	if w.rec != nil {
		w.rec.begin(w, "drain %s", n.name)
		defer w.rec.end(w)
	}
	w.step(n, Drain{})
}

// send puts msg from n to the peer it names on the wire, if that is the
// live connection.
func (w *world) send(n *node, peer kvxfer.PeerID, msg kvxfer.Message) {
	to := w.other(n)
	live := w.connected && to != nil && peer == w.peerOf(n)
	if w.printing() {
		line := n.name + " >> " + w.fmtMsg(msg)
		if !live {
			line += fmt.Sprintf(" (lost: peer %d is gone)", peer)
		}
		w.out.WriteString(line + "\n")
	}
	if live {
		to.inbox = append(to.inbox, frame{msg: msg, fresh: true})
	}
}

// step applies ev to n at the world's time, carries out the effects that
// stay on the node, and checks the machine's invariants.
func (w *world) step(n *node, ev Event) {
	n.m.Step(w.now, ev)
	for _, e := range n.m.Ready() {
		if w.printing() {
			w.printEffect(n, e)
		}
		switch x := e.(type) {
		case RunBatch:
			if n.batch != nil {
				w.fatalf("%s: a second RunBatch while one runs", n.name)
			}
			b := x
			n.batch = &b
			n.batchAt = time.Time{}
			if w.onBatch != nil {
				w.onBatch(n, x)
			}
		case Send:
			w.send(n, x.Peer, x.Msg)
		case CopyKV:
			w.checkPrivate(n, x.Dst, n.owner(x.Dst), "a fork's copy")
			n.data[x.Dst] = append([]byte(nil), n.page(x.Src)...)
		case SendKV, SendKVDone, WriteKV, VerifyKV:
			var due time.Time // due at once
			if w.ioDelay != nil {
				due = w.now.Add(w.ioDelay())
			}
			n.io = append(n.io, ioJob{due: due, e: e})
		case Emit:
			if _, done := n.finals[x.RID]; done {
				w.fatalf("%s: tokens emitted for %s after it ended", n.name, x.RID)
			}
			key := choiceKey(x.RID, x.Choice)
			for _, tok := range x.Tokens {
				n.emitted[key] = append(n.emitted[key], tok.Token)
			}
		case Finalize:
			if _, dup := n.finals[x.RID]; dup {
				w.fatalf("%s: %s finalized twice", n.name, x.RID)
			}
			n.finals[x.RID] = x
			delete(n.shown, x.RID)
			if w.onFinal != nil {
				w.onFinal(n, x)
			}
		}
	}
	if err := checkLegal(n.m); err != nil {
		w.fatalf("%s after %T: %v", n.name, ev, err)
	}
	if w.printing() {
		for _, r := range n.m.sortedLive() {
			if was, ok := n.shown[r.RID]; !ok || was != r.stage {
				if ok {
					w.say(n, "%s %s -> %s", r.RID, was, r.stage)
				} else {
					w.say(n, "%s -> %s", r.RID, r.stage)
				}
				n.shown[r.RID] = r.stage
			}
		}
	}
}

// ---- the fake model and page bytes ----

func (n *node) page(p kvcache.PageID) []byte {
	if d := n.data[p]; d != nil {
		return d
	}
	return make([]byte, testPageBytes)
}

func (n *node) crc(pages []kvcache.PageID) uint32 {
	c := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, p := range pages {
		c.Write(n.page(p))
	}
	return c.Sum32()
}

// checkPrivate fails the test unless page p, about to be written for
// request r, is r's alone: no other request holds it (reading it as a
// cached page) and it is not in the prefix cache's index, from which
// another request could match it.
func (w *world) checkPrivate(n *node, p kvcache.PageID, r *req, what string) {
	if _, idx := n.m.cache.Indexed(p); idx {
		w.fatalf("%s: %s of %s writes page %d, which is in the prefix cache", n.name, what, r.RID, p)
	}
	for _, o := range n.m.queue {
		if o != r && o.stage != StageDone && slices.Contains(o.pages, p) {
			w.fatalf("%s: %s of %s writes page %d, which %s reads as a cached page", n.name, what, r.RID, p, o.RID)
		}
	}
	if refs := n.m.cache.Refs(p); refs != 1 {
		w.fatalf("%s: %s of %s writes page %d, which has %d references", n.name, what, r.RID, p, refs)
	}
}

// owner is the live request that holds page p, or nil.
func (n *node) owner(p kvcache.PageID) *req {
	for _, r := range n.m.queue {
		if r.stage != StageDone && slices.Contains(r.pages, p) {
			return r
		}
	}
	return nil
}

func pageHash(old []byte, tok int32, pos int) []byte {
	h := fnv.New64a()
	h.Write(old)
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:], uint32(tok))
	binary.LittleEndian.PutUint32(b[4:], uint32(pos))
	h.Write(b[:])
	return h.Sum(nil)
}

// forward writes each token's "KV" into its page, chaining on the bytes
// already there, and samples from a hash of every page the sequence reads,
// like the simulated model: a lost, misplaced or stale page changes the
// answer. Invariant 3: it fails the test if a page it writes now belongs to
// another request.
func (w *world) forward(n *node, b *RunBatch) []model.SeqOutput {
	ps := n.m.cfg.PageSize
	owners := make(map[kvcache.PageID]*req)
	for _, r := range n.m.queue {
		if r.stage != StageDone {
			for _, p := range r.pages {
				owners[p] = r
			}
		}
	}
	out := make([]model.SeqOutput, len(b.Seqs))
	for i, s := range b.Seqs {
		in := s.Input
		var r *req
		for _, q := range n.m.queue {
			if q.RID == s.RID && q.choice == s.Choice && (q.stage != StageDone || q.inBatch) {
				r = q
			}
		}
		for d := range n.m.draining {
			if d.RID == s.RID && d.choice == s.Choice {
				r = d
			}
		}
		if r == nil {
			w.fatalf("%s: forward of %s, which holds no pages", n.name, s.RID)
		}
		for _, p := range in.Pages {
			if !slices.Contains(r.pages, p) {
				o := owners[p]
				w.fatalf("%s: forward of %s reads page %d, which now belongs to %v", n.name, s.RID, p, o)
			}
		}
		if len(in.Tokens) > 0 {
			for _, p := range in.Pages[in.Pos/ps : (in.Pos+len(in.Tokens)-1)/ps+1] {
				if o := owners[p]; o != nil && o.RID != s.RID {
					w.fatalf("%s: forward of %s writes page %d, which now belongs to %s", n.name, s.RID, p, o.RID)
				}
				w.checkPrivate(n, p, r, "the forward")
			}
		}
		for k, tok := range in.Tokens {
			pos := in.Pos + k
			pg := in.Pages[pos/ps]
			var old []byte
			if pos%ps != 0 {
				old = n.data[pg]
			}
			n.data[pg] = pageHash(old, tok, pos)
		}
		if in.Sample {
			total := in.Pos + len(in.Tokens)
			h := fnv.New64a()
			for p := 0; p < (total+ps-1)/ps; p++ {
				h.Write(n.data[in.Pages[p]])
			}
			draw := func(seed uint64) model.SeqOutput {
				h := fnv.New64a()
				for p := 0; p < (total+ps-1)/ps; p++ {
					h.Write(n.data[in.Pages[p]])
				}
				fmt.Fprintf(h, "/%d", in.Step)
				if seed != 0 {
					fmt.Fprintf(h, "/%d", seed) // the choices of an n > 1 request draw apart
				}
				t := model.SeqOutput{Token: int32(1 + h.Sum64()%99), Logprob: -0.5}
				if in.Mask != nil {
					// A grammar's mask: one of the tokens it allows.
					ids := maskIDs(in.Mask)
					t.Token = ids[h.Sum64()%uint64(len(ids))]
				}
				for k := range in.Sampling.TopLogprobs {
					t.Top = append(t.Top, model.TokenLogprob{ID: int32(k), Logprob: -float32(k)})
				}
				return t
			}
			out[i] = draw(in.Sampling.Seed)
			for f := 1; f < in.Forks; f++ {
				out[i].Forks = append(out[i].Forks, draw(model.ForkSeed(in.Sampling.Seed, f)))
			}
		}
		if in.Score != nil {
			out[i].Scores = make([]model.PositionLogprobs, len(in.Score))
			for j, target := range in.Score {
				if target >= 0 {
					out[i].Scores[j] = model.PositionLogprobs{Token: model.TokenLogprob{ID: target, Logprob: -float32(in.Pos + j)}, Rank: 1}
				}
			}
		}
	}
	return out
}

// ---- rooms ----

// roomNamed is the room a transcript names: 32 hex digits, or a name (see
// nameBytes).
func roomNamed(s string) (kvxfer.Room, error) {
	if len(s) == 32 {
		if r, err := kvxfer.ParseRoom(s); err == nil {
			return r, nil
		}
	}
	if r, ok := nameBytes(s); ok {
		return r, nil
	}
	return kvxfer.Room{}, fmt.Errorf("room %q: want a name of 1 to 16 printable bytes or 32 hex digits", s)
}

// nameBytes is the room whose bytes are name (1 to 16 printable ASCII
// bytes, no '/'), zero-padded.
func nameBytes(name string) (kvxfer.Room, bool) {
	var r kvxfer.Room
	if name == "" || len(name) > len(r) {
		return r, false
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c > '~' || c == '/' {
			return r, false
		}
	}
	copy(r[:], name)
	return r, true
}

// nameRoom gives room a printed name, once: the name it is made of, or
// for a random room the rid that first carried it.
func (w *world) nameRoom(room kvxfer.Room, rid string) {
	if _, ok := w.rooms[room]; ok {
		return
	}
	name := strings.TrimRight(string(room[:]), "\x00")
	if r, ok := nameBytes(name); !ok || r != room {
		name = rid
	}
	w.rooms[room] = name
	w.replacer = nil
}

func (w *world) roomName(r kvxfer.Room) string {
	if r.IsZero() {
		return "-"
	}
	if n, ok := w.rooms[r]; ok {
		return n
	}
	return r.String()
}

func (w *world) rg(rg kvxfer.RoomGen) string {
	return fmt.Sprintf("%s/%d", w.roomName(rg.Room), rg.Gen)
}

// clean replaces room hex in text the machine wrote with the rooms' names.
func (w *world) clean(s string) string {
	if w.replacer == nil {
		var pairs []string
		for r, name := range w.rooms {
			pairs = append(pairs, r.String(), name)
		}
		w.replacer = strings.NewReplacer(pairs...)
	}
	return w.replacer.Replace(s)
}

// ---- printing ----

func (w *world) fmtMsg(msg kvxfer.Message) string {
	switch x := msg.(type) {
	case kvxfer.RoomOpen:
		return fmt.Sprintf("ROOM_OPEN %s rid=%s tokens=%d", w.rg(x.RoomGen), x.RID, x.NTokens)
	case kvxfer.RoomReady:
		if x.CachedPages > 0 {
			return fmt.Sprintf("ROOM_READY %s tokens=%d cached-pages=%d", w.rg(x.RoomGen), x.NTokens, x.CachedPages)
		}
		return fmt.Sprintf("ROOM_READY %s tokens=%d", w.rg(x.RoomGen), x.NTokens)
	case kvxfer.RoomRenew:
		rooms := make([]string, len(x.Rooms))
		for i, rg := range x.Rooms {
			rooms[i] = w.rg(rg)
		}
		return "ROOM_RENEW " + strings.Join(rooms, " ")
	case kvxfer.KVChunk:
		return fmt.Sprintf("KV_CHUNK %s seq=%d pages=%d+%d", w.rg(x.RoomGen), x.Seq, x.FirstPage, x.NPages)
	case kvxfer.KVDone:
		cached := ""
		if x.CachedTokens > 0 {
			cached = fmt.Sprintf(" cached-tokens=%d", x.CachedTokens)
		}
		return fmt.Sprintf("KV_DONE %s chunks=%d pages=%d tokens=%d binding=%s crc=%08x first=%d%s", w.rg(x.RoomGen),
			x.NChunks, x.NPages, x.NTokens, x.Binding.String()[:8], x.Checksum, x.FirstToken, cached)
	case kvxfer.KVAck:
		return "KV_ACK " + w.rg(x.RoomGen)
	case kvxfer.Abort:
		return fmt.Sprintf("ABORT %s %s", w.rg(x.RoomGen), w.clean(x.Reason()))
	case kvxfer.AbortAck:
		return "ABORT_ACK " + w.rg(x.RoomGen)
	}
	return fmt.Sprintf("%T %+v", msg, msg)
}

func (w *world) printEffect(n *node, e Effect) {
	switch x := e.(type) {
	case RunBatch:
		var qs []string
		for _, s := range n.role.Stages() {
			if c := x.Queues[s]; c > 0 {
				qs = append(qs, fmt.Sprintf("%s=%d", s, c))
			}
		}
		w.say(n, "run batch: %d prefill tokens, %d decode seqs; queues %s", x.PrefillTokens, x.DecodeSeqs, strings.Join(qs, " "))
		for _, s := range x.Seqs {
			in := s.Input
			sample := ""
			if in.Sample {
				sample = " sample"
			}
			if in.Forks > 1 {
				sample += fmt.Sprintf(" forks=%d", in.Forks)
			}
			if in.Mask != nil {
				sample += fmt.Sprintf(" mask=%v", maskIDs(in.Mask))
			}
			rid := choiceKey(s.RID, s.Choice)
			if in.Step > 0 {
				w.say(n, "  %s decode pos=%d step=%d pages=%v%s", rid, in.Pos, in.Step, in.Pages, strings.TrimPrefix(sample, " sample"))
			} else {
				w.say(n, "  %s prefill [%d,%d) pages=%v%s", rid, in.Pos, in.Pos+len(in.Tokens), in.Pages, sample)
			}
		}
	case CancelBatch:
		w.say(n, "cancel batch")
	case Send:
		// printed by send
	case SendKV:
		w.say(n, "job %d: send-kv %s seq=%d pages=%d+%d %v", x.Job, w.rg(x.RoomGen), x.Seq, x.FirstPage, len(x.Pages), x.Pages)
	case SendKVDone:
		first := fmt.Sprint(x.Done.FirstToken)
		if len(x.Done.First) > 1 {
			ids := make([]int32, len(x.Done.First))
			for i, f := range x.Done.First {
				ids[i] = f.Token
			}
			first = "(" + joinInts(ids) + ")"
		}
		w.say(n, "job %d: send-kv-done %s chunks=%d pages=%v first=%s", x.Job, w.rg(x.Done.RoomGen), x.Done.NChunks, x.Pages, first)
	case CopyKV:
		w.say(n, "copy-kv page %d -> %d", x.Src, x.Dst)
	case WriteKV:
		w.say(n, "job %d: write-kv pages=%v bytes=%d", x.Job, x.Pages, len(x.Data))
	case VerifyKV:
		w.say(n, "job %d: verify-kv %s/%d pages=%v", x.Job, x.RID, x.Gen, x.Pages)
	case Emit:
		toks := make([]string, len(x.Tokens))
		for i, t := range x.Tokens {
			toks[i] = fmt.Sprint(t.Token)
		}
		line := "emit " + choiceKey(x.RID, x.Choice)
		if len(toks) > 0 {
			line += " " + strings.Join(toks, " ")
		}
		if x.Finish != "" {
			line += " (choice " + x.Finish + ")"
		}
		w.say(n, "%s", line)
	case Finalize:
		var st []string
		for s := StageNone; s < numStages; s++ {
			if d, ok := x.StageTime[s]; ok {
				st = append(st, fmt.Sprintf("%s %s", s, d))
			}
		}
		times := ""
		if len(st) > 0 {
			times = " (" + strings.Join(st, ", ") + ")"
		}
		what := x.Outcome.String()
		if x.FinishReason != "" {
			what += " " + x.FinishReason
		}
		first := ""
		if n.role == RolePrefill && !reflect.DeepEqual(x.FirstToken, model.SeqOutput{}) {
			first = fmt.Sprintf(" first=%d", x.FirstToken.Token)
		}
		room := ""
		if !x.RoomGen.Room.IsZero() && (w.roomName(x.RoomGen.Room) != x.RID || x.RoomGen.Gen != 1) {
			room = " room=" + w.rg(x.RoomGen)
		}
		if x.CachedTokens > 0 {
			first += fmt.Sprintf(" cached=%d", x.CachedTokens)
		}
		w.say(n, "finalize %s %s%s prompt=%d output=%d%s age=%s%s", x.RID, what, room,
			x.PromptTokens, x.OutputTokens, first, x.Age, times)
		if x.Err != "" {
			w.say(n, "  err: %s", w.clean(x.Err))
		}
		if c := x.Cause; c != (outcome.Cause{}) {
			s := c
			if c.Detail == x.Err {
				s.Detail = ""
			}
			w.say(n, "  cause: %s", w.clean(s.String()))
		}
	default:
		w.say(n, "%T %+v", e, e)
	}
}

// ---- recording ----

// recorder writes the commands a world runs, with what each printed, as a
// transcript in the format of testdata/*.txt.
type recorder struct {
	b    strings.Builder
	last time.Time // the clock at the last recorded command
	cmd  string
}

func newRecorder(w *world, header string) *recorder {
	r := &recorder{last: w.start}
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		r.b.WriteString("# " + l + "\n")
	}
	r.b.WriteByte('\n')
	w.rec = r
	w.out = &strings.Builder{}
	return r
}

func (r *recorder) begin(w *world, format string, args ...any) {
	r.cmd = fmt.Sprintf(format, args...)
	if w.now != r.last {
		r.cmd += " at=" + w.now.Sub(w.start).String()
	}
	w.out.Reset()
}

// end writes the command and its output. A schedule that printed nothing
// is left out: it changed nothing but the order of the machine's internal
// queue, so the transcript replays the same without it.
func (r *recorder) end(w *world) {
	out := w.out.String()
	w.out.Reset()
	if out == "" && strings.HasPrefix(r.cmd, "schedule ") {
		return
	}
	r.last = w.now
	r.b.WriteString(r.cmd + "\n----\n" + out + "\n")
}

func (r *recorder) String() string { return r.b.String() }

var abortReasons = map[AbortReason]string{AbortClient: "client", AbortStop: "stop", AbortPeerLeg: "peer-leg"}

// requestArgs writes q as the arguments of an arrive command.
func (w *world) requestArgs(n *node, q Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, " rid=%s", q.RID)
	if !q.Room.IsZero() {
		if r, ok := nameBytes(w.rooms[q.Room]); !ok || r != q.Room {
			fmt.Fprintf(&b, " room=%s", q.Room) // a random room, named for its first rid
		} else if w.rooms[q.Room] != q.RID {
			fmt.Fprintf(&b, " room=%s", w.rooms[q.Room])
		}
	}
	if q.Gen != 1 {
		fmt.Fprintf(&b, " gen=%d", q.Gen)
	}
	if slices.Equal(q.InputIDs, tokens(len(q.InputIDs))) {
		fmt.Fprintf(&b, " prompt=%d", len(q.InputIDs))
	} else {
		fmt.Fprintf(&b, " tokens=(%s)", joinInts(q.InputIDs))
	}
	fmt.Fprintf(&b, " max_tokens=%d", q.MaxTokens)
	if q.IgnoreEOS {
		b.WriteString(" ignore_eos")
	}
	if len(q.StopTokenIDs) > 0 {
		fmt.Fprintf(&b, " stop=(%s)", joinInts(q.StopTokenIDs))
	}
	if q.Timeout > 0 {
		fmt.Fprintf(&b, " timeout=%s", q.Timeout)
	}
	if q.N > 1 {
		fmt.Fprintf(&b, " n=%d", q.N)
	}
	if q.Sampling.TopLogprobs > 0 {
		fmt.Fprintf(&b, " top_logprobs=%d", q.Sampling.TopLogprobs)
	}
	if n.role == RoleDecode && q.Peer != w.peerOf(n) || n.role != RoleDecode && q.Peer != 0 {
		fmt.Fprintf(&b, " peer=%d", q.Peer)
	}
	if !reflect.DeepEqual(q.Sampling, model.SamplingParams{TopP: 1, TopLogprobs: q.Sampling.TopLogprobs}) || q.N == 1 || (n.role == RoleDecode && q.PeerAddr != "prefill") ||
		(n.role != RoleDecode && q.PeerAddr != "") {
		w.fatalf("the recorder cannot write request %+v", q)
	}
	return b.String()
}

func joinInts[T int32 | int](ids []T) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ",")
}

// configKeys are the Config fields a transcript's node command may set.
var configKeys = []struct {
	key  string
	num  func(*Config) *int
	dur  func(*Config) *time.Duration
	frac func(*Config) *float64
	flag func(*Config) *bool
}{
	{key: "prefix-cache", flag: func(c *Config) *bool { return &c.PrefixCache }},
	{key: "page-size", num: func(c *Config) *int { return &c.PageSize }},
	{key: "context", num: func(c *Config) *int { return &c.ContextLen }},
	{key: "max-prefill-tokens", num: func(c *Config) *int { return &c.MaxPrefillTokens }},
	{key: "max-running", num: func(c *Config) *int { return &c.MaxRunning }},
	{key: "max-queued", num: func(c *Config) *int { return &c.MaxQueued }},
	{key: "chunk-pages", num: func(c *Config) *int { return &c.MaxChunkPages }},
	{key: "lease-misses", num: func(c *Config) *int { return &c.LeaseMisses }},
	{key: "max-tombstones", num: func(c *Config) *int { return &c.MaxTombstones }},
	{key: "max-pending-opens", num: func(c *Config) *int { return &c.MaxPendingOpens }},
	{key: "bootstrap", dur: func(c *Config) *time.Duration { return &c.BootstrapTimeout }},
	{key: "queue", dur: func(c *Config) *time.Duration { return &c.QueueTimeout }},
	{key: "kv-hold", dur: func(c *Config) *time.Duration { return &c.KVHoldTimeout }},
	{key: "transfer", dur: func(c *Config) *time.Duration { return &c.TransferTimeout }},
	{key: "max-request", dur: func(c *Config) *time.Duration { return &c.MaxRequestTime }},
	{key: "heartbeat", dur: func(c *Config) *time.Duration { return &c.HeartbeatInterval }},
	{key: "tombstone-ttl", dur: func(c *Config) *time.Duration { return &c.TombstoneTTL }},
	{key: "history", num: func(c *Config) *int { return &c.History }},
	{key: "optimistic-attempts", num: func(c *Config) *int { return &c.OptimisticAttempts }},
	{key: "optimistic-max-parked", frac: func(c *Config) *float64 { return &c.OptimisticMaxParked }},
}

// configArgs writes the fields where cfg differs from testConfig as node
// command arguments. It returns ok false if cfg differs elsewhere too.
func configArgs(cfg Config) (string, bool) {
	base := testConfig(cfg.Role)
	var b strings.Builder
	for _, k := range configKeys {
		switch {
		case k.num != nil && *k.num(&cfg) != *k.num(&base):
			fmt.Fprintf(&b, " %s=%d", k.key, *k.num(&cfg))
			*k.num(&base) = *k.num(&cfg)
		case k.dur != nil && *k.dur(&cfg) != *k.dur(&base):
			fmt.Fprintf(&b, " %s=%s", k.key, *k.dur(&cfg))
			*k.dur(&base) = *k.dur(&cfg)
		case k.flag != nil && *k.flag(&cfg) != *k.flag(&base):
			fmt.Fprintf(&b, " %s=%v", k.key, *k.flag(&cfg))
			*k.flag(&base) = *k.flag(&cfg)
		case k.frac != nil && *k.frac(&cfg) != *k.frac(&base):
			fmt.Fprintf(&b, " %s=%s", k.key, strconv.FormatFloat(*k.frac(&cfg), 'g', -1, 64))
			*k.frac(&base) = *k.frac(&cfg)
		}
	}
	return b.String(), reflect.DeepEqual(base, cfg)
}

// choiceKey names choice c of request rid in node.emitted: the rid for
// choice 0, rid#c for the others.
func choiceKey(rid string, c int) string {
	if c == 0 {
		return rid
	}
	return fmt.Sprintf("%s#%d", rid, c)
}

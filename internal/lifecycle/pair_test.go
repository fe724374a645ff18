package lifecycle

import (
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

var pairSeeds = flag.Int("pair-seeds", 200, "seeded runs of TestPairRandomized")

// node is one machine with a fake model whose next token depends on the
// page bytes actually present, like the simulated model.
type node struct {
	name    string
	m       *Machine
	alloc   *kvcache.Allocator
	data    map[kvcache.PageID][]byte
	batch   *RunBatch
	batchAt time.Time
	emitted map[string][]int32
	finals  map[string]Finalize
	sends   []Send
	// io holds page I/O effects in flight, run in order when due (like the
	// worker's I/O lanes); ioDelay picks each one's delay.
	io      []ioJob
	ioDelay func() time.Duration
}

func newNode(t testing.TB, name string, cfg Config, pages int) *node {
	a := kvcache.NewAllocator(pages)
	m, err := New(cfg, a)
	if err != nil {
		t.Fatal(err)
	}
	return &node{name: name, m: m, alloc: a, data: map[kvcache.PageID][]byte{},
		emitted: map[string][]int32{}, finals: map[string]Finalize{}}
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

// owner returns the live request that owns page p, or "" if the page is
// free or waits to be freed after the running batch.
func (n *node) owner(p kvcache.PageID) string {
	for rid, r := range n.m.reqs {
		if slices.Contains(r.pages, p) {
			return rid
		}
	}
	return ""
}

// forward writes each token's "KV" into its page, chaining on the bytes
// already there, and samples from a hash of every page the sequence reads.
// Invariant 3: it fails the test if a page it writes now belongs to another
// request.
func (n *node) forward(t testing.TB, b *RunBatch) []model.SeqOutput {
	ps := n.m.cfg.PageSize
	out := make([]model.SeqOutput, len(b.Seqs))
	for i, s := range b.Seqs {
		in := s.Input
		for _, p := range in.Pages {
			if o := n.owner(p); o != "" && o != s.RID {
				t.Fatalf("%s: forward of %s writes page %d, which now belongs to %s", n.name, s.RID, p, o)
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
			fmt.Fprintf(h, "/%d", in.Step)
			out[i] = model.SeqOutput{Token: int32(1 + h.Sum64()%99), Logprob: -0.5}
		}
	}
	return out
}

func (n *node) crc(pages []kvcache.PageID) uint32 {
	c := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, p := range pages {
		d := n.data[p]
		if d == nil {
			d = make([]byte, testPageBytes)
		}
		c.Write(d)
	}
	return c.Sum32()
}

// step applies ev and executes the effects that stay on this node; sends
// are collected for the network.
func (n *node) step(t testing.TB, now time.Time, ev Event) {
	t.Helper()
	queue := []Event{ev}
	for len(queue) > 0 {
		ev := queue[0]
		queue = queue[1:]
		n.m.Step(now, ev)
		for _, e := range n.m.Ready() {
			switch x := e.(type) {
			case RunBatch:
				if n.batch != nil {
					t.Fatalf("%s: second batch", n.name)
				}
				b := x
				n.batch = &b
			case Send:
				n.sends = append(n.sends, x)
			case SendKV, SendKVDone, WriteKV, VerifyKV:
				var d time.Duration
				if n.ioDelay != nil {
					d = n.ioDelay()
				}
				n.io = append(n.io, ioJob{due: now.Add(d), e: e})
			case Emit:
				if _, done := n.finals[x.RID]; done {
					t.Fatalf("%s: tokens emitted for %s after it ended", n.name, x.RID)
				}
				for _, tok := range x.Tokens {
					n.emitted[x.RID] = append(n.emitted[x.RID], tok.Token)
				}
			case Finalize:
				if _, dup := n.finals[x.RID]; dup {
					t.Fatalf("%s: %s finalized twice", n.name, x.RID)
				}
				n.finals[x.RID] = x
			}
		}
		checkMachine(t, n.m, n.alloc)
	}
}

// checkMachine asserts the accounting invariants: pages used equal pages
// held by live requests (plus those freed after the running batch), used +
// free == total, and each stage count equals the true count.
func checkMachine(t testing.TB, m *Machine, alloc *kvcache.Allocator) {
	t.Helper()
	held := 0
	var counts [numStages]int
	for _, r := range m.reqs {
		held += len(r.pages)
		counts[r.stage]++
	}
	for r := range m.draining {
		held += len(r.pages)
	}
	if alloc.Used() != held || alloc.Used()+alloc.FreeCount() != alloc.Total() {
		t.Fatalf("%s: pages used %d, held %d, free %d, total %d", m.cfg.Role, alloc.Used(), held, alloc.FreeCount(), alloc.Total())
	}
	for s := StageNone; s < numStages; s++ {
		if counts[s] != m.stageCount[s] {
			t.Fatalf("%s: stage %s gauge %d, true %d", m.cfg.Role, s, m.stageCount[s], counts[s])
		}
	}
	if err := checkLegal(m); err != nil {
		t.Fatal(err)
	}
}

type ioJob struct {
	due time.Time
	e   Effect
}

// runIO executes the page I/O effects that are due, in order, each
// followed by its IODone.
func (n *node) runIO(t testing.TB, now time.Time) {
	t.Helper()
	for len(n.io) > 0 && !now.Before(n.io[0].due) {
		j := n.io[0]
		n.io = n.io[1:]
		var next []Event
		switch x := j.e.(type) {
		case SendKV:
			data := make([]byte, 0, len(x.Pages)*testPageBytes)
			for _, p := range x.Pages {
				d := n.data[p]
				if d == nil {
					d = make([]byte, testPageBytes)
				}
				data = append(data, d...)
			}
			n.sends = append(n.sends, Send{Peer: x.Peer, Msg: kvxfer.KVChunk{RoomGen: x.RoomGen, Seq: x.Seq,
				FirstPage: x.FirstPage, NPages: uint32(len(x.Pages)), Data: data}})
		case SendKVDone:
			d := x.Done
			d.Checksum = n.crc(x.Pages)
			n.sends = append(n.sends, Send{Peer: x.Peer, Msg: d})
		case WriteKV:
			// Invariant 3: the pages still belong to the job's request
			// (live, or ended and waiting for this write to drain).
			want := n.m.jobs[x.Job]
			for i, p := range x.Pages {
				if o := n.owner(p); o != "" && (want == nil || o != want.RID) {
					t.Fatalf("%s: KV written into page %d, which now belongs to %s", n.name, p, o)
				}
				n.data[p] = slices.Clone(x.Data[i*testPageBytes : (i+1)*testPageBytes])
			}
		case VerifyKV:
			next = append(next, KVVerified{RID: x.RID, Gen: x.Gen, Checksum: n.crc(x.Pages)})
		}
		for _, ev := range next {
			n.step(t, now, ev)
		}
		n.step(t, now, IODone{Job: jobOf(j.e)})
	}
}

type wireMsg struct {
	at    time.Time
	epoch int
	msg   kvxfer.Message
}

type httpEv struct {
	at  time.Time
	toP bool
	ev  Event
}

type faults struct {
	drop, dup, lose, abort, slowBatch float64
}

// reference runs requests one at a time on a colocated machine.
func reference(t testing.TB, reqs []Request) map[string][]int32 {
	c := newNode(t, "colocated", testConfig(RoleColocated), 64)
	now := time.Unix(0, 0)
	for _, q := range reqs {
		q.Room, q.Peer = kvxfer.Room{}, 0
		c.step(t, now, Arrive{Req: q})
		for {
			if _, ok := c.finals[q.RID]; ok {
				break
			}
			c.step(t, now, Schedule{})
			if c.batch == nil {
				t.Fatalf("reference: %s stuck", q.RID)
			}
			b := c.batch
			c.batch = nil
			c.step(t, now, BatchDone{Out: c.forward(t, b)})
		}
		if f := c.finals[q.RID]; f.Outcome != outcome.OK {
			t.Fatalf("reference: %s ended %s: %s", q.RID, f.Outcome, f.Err)
		}
	}
	return c.emitted
}

func TestPairRandomized(t *testing.T) {
	var preemptions uint64
	defer func() {
		if !t.Failed() && *pairSeeds >= 20 && preemptions == 0 {
			t.Errorf("no seed preempted a request: the recompute path went untested")
		}
	}()
	for seed := 1; seed <= *pairSeeds; seed++ {
		f := faults{}
		if seed%4 != 0 { // every fourth seed runs clean and must finish every request
			f = faults{drop: 0.02, dup: 0.03, lose: 0.002, abort: 0.01, slowBatch: 0.2}
		}
		preemptions += runPair(t, uint64(seed), f)
		if t.Failed() {
			t.Fatalf("failing seed %d (rerun: go test ./internal/lifecycle -run TestPairRandomized -pair-seeds %d)", seed, seed)
		}
	}
}

// runPair runs one seeded pair and returns how many requests decode preempted.
func runPair(t *testing.T, seed uint64, f faults) uint64 {
	rng := rand.New(rand.NewPCG(seed, 99))
	cfgP, cfgD := testConfig(RolePrefill), testConfig(RoleDecode)
	P := newNode(t, "prefill", cfgP, 24)
	D := newNode(t, "decode", cfgD, 48)
	now := time.Unix(1_000_000, 0)
	epoch := 0
	decodePeer := func() kvxfer.PeerID { return kvxfer.PeerID(100 + epoch) }  // decode's id for prefill
	prefillPeer := func() kvxfer.PeerID { return kvxfer.PeerID(200 + epoch) } // prefill's id for decode
	D.step(t, now, PeerUp{Peer: decodePeer()})
	if f != (faults{}) {
		// Slow page I/O, so requests end while their KV is being copied.
		P.ioDelay = func() time.Duration { return time.Duration(rng.IntN(40)) * time.Millisecond }
		D.ioDelay = P.ioDelay
	}

	nReq := 20 + rng.IntN(20)
	var reqs []Request
	for i := range nReq {
		q := Request{RID: fmt.Sprintf("s%d-r%d", seed, i), Room: kvxfer.NewRoom(), Gen: 1,
			InputIDs: tokens(1 + rng.IntN(30)), MaxTokens: 1 + rng.IntN(12),
			Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: rng.IntN(2) == 0}
		for k := range q.InputIDs {
			q.InputIDs[k] = int32(1 + rng.IntN(98))
		}
		reqs = append(reqs, q)
	}
	want := reference(t, reqs)

	var toP, toD []wireMsg
	var http []httpEv
	arrivals := 0
	routerAborted := map[string]bool{}
	deliver := func(q *[]wireMsg, n *node, peer kvxfer.PeerID) {
		var keep []wireMsg
		for i, w := range *q {
			if w.epoch != epoch {
				continue // died with its connection
			}
			if now.Before(w.at) || (i > 0 && len(keep) > 0) {
				keep = append(keep, w) // in order, like TCP
				continue
			}
			n.step(t, now, PeerMessage{Peer: peer, Msg: w.msg})
		}
		*q = keep
	}
	flush := func(from *node, q *[]wireMsg, faulty bool) {
		for _, s := range from.sends {
			if faulty && rng.Float64() < f.drop {
				continue
			}
			w := wireMsg{at: now.Add(time.Duration(rng.IntN(20)) * time.Millisecond), epoch: epoch, msg: s.Msg}
			if int(s.Peer)%100 != epoch {
				continue // sent on a dead connection
			}
			*q = append(*q, w)
			if faulty && rng.Float64() < f.dup {
				*q = append(*q, w)
			}
		}
		from.sends = nil
	}
	routerWatch := func() {
		for rid, fin := range P.finals {
			if fin.Outcome != outcome.OK && !routerAborted[rid] {
				routerAborted[rid] = true
				http = append(http, httpEv{at: now.Add(5 * time.Millisecond), toP: false, ev: AbortRequest{RID: rid, Reason: AbortPeerLeg}})
			}
		}
		for rid, fin := range D.finals {
			if fin.Outcome != outcome.OK && !routerAborted[rid] {
				routerAborted[rid] = true
				http = append(http, httpEv{at: now.Add(5 * time.Millisecond), toP: true, ev: AbortRequest{RID: rid, Reason: AbortPeerLeg}})
			}
		}
	}
	const tick = 10 * time.Millisecond
	lastTick := now
	runBatches := func(faulty bool) {
		for _, n := range []*node{P, D} {
			if n.batch == nil {
				n.step(t, now, Schedule{})
				if n.batch != nil {
					d := time.Millisecond
					if faulty && rng.Float64() < f.slowBatch {
						d = time.Duration(rng.IntN(300)) * time.Millisecond
					}
					n.batchAt = now.Add(d)
				}
			} else if !now.Before(n.batchAt) {
				b := n.batch
				n.batch = nil
				n.step(t, now, BatchDone{Out: n.forward(t, b)})
			}
		}
	}
	for steps := 0; steps < 100000; steps++ {
		faulty := arrivals < nReq
		now = now.Add(tick)
		if arrivals < nReq && rng.IntN(3) == 0 {
			q := reqs[arrivals]
			arrivals++
			qd := q
			qd.Peer, qd.PeerAddr = decodePeer(), "prefill:1"
			http = append(http,
				httpEv{at: now.Add(time.Duration(rng.IntN(30)) * time.Millisecond), toP: true, ev: Arrive{Req: q}},
				httpEv{at: now.Add(time.Duration(rng.IntN(30)) * time.Millisecond), toP: false, ev: Arrive{Req: qd}})
			if rng.Float64() < f.abort*10 {
				// The client gives up at a random phase; the router aborts both legs.
				at := now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
				http = append(http, httpEv{at: at, toP: true, ev: AbortRequest{RID: q.RID, Reason: AbortClient}},
					httpEv{at: at, toP: false, ev: AbortRequest{RID: q.RID, Reason: AbortClient}})
			}
		}
		var later []httpEv
		for _, h := range http {
			if now.Before(h.at) {
				later = append(later, h)
				continue
			}
			if h.toP {
				P.step(t, now, h.ev)
			} else {
				D.step(t, now, h.ev)
			}
		}
		http = later
		if faulty && rng.Float64() < f.lose {
			// The connection dies: both sides hear it; in-flight frames are lost.
			P.step(t, now, PeerLost{Peer: prefillPeer(), Err: fmt.Errorf("reset")})
			D.step(t, now, PeerLost{Peer: decodePeer(), Err: fmt.Errorf("reset")})
			epoch++
			toP, toD = nil, nil
			D.step(t, now, PeerUp{Peer: decodePeer()})
		}
		flush(P, &toD, faulty)
		flush(D, &toP, faulty)
		deliver(&toP, P, prefillPeer())
		deliver(&toD, D, decodePeer())
		P.runIO(t, now)
		D.runIO(t, now)
		runBatches(faulty)
		if now.Sub(lastTick) >= 100*time.Millisecond {
			lastTick = now
			P.step(t, now, Tick{})
			D.step(t, now, Tick{})
		}
		routerWatch()
		if t.Failed() {
			return 0
		}
		if arrivals == nReq && len(P.finals) == nReq && len(D.finals) == nReq && P.batch == nil && D.batch == nil &&
			len(http) == 0 && len(P.io) == 0 && len(D.io) == 0 {
			break
		}
	}
	// Invariant 1 and 2: everything ended, nothing is held.
	for _, n := range []*node{P, D} {
		if len(n.finals) != nReq {
			t.Fatalf("seed %d: %s finalized %d of %d requests; live: %v", seed, n.name, len(n.finals), nReq, n.m.Requests(now))
		}
		st := n.m.Stats(now)
		if st.PagesUsed != 0 || st.Live != 0 || st.PendingOpens != 0 {
			t.Fatalf("seed %d: %s holds pages=%d live=%d pending=%d", seed, n.name, st.PagesUsed, st.Live, st.PendingOpens)
		}
		for s, c := range st.Stages {
			if c != 0 {
				t.Fatalf("seed %d: %s stage %s gauge %d", seed, n.name, s, c)
			}
		}
		for rid, fin := range n.finals {
			if fin.Age > n.m.cfg.MaxRequestTime {
				t.Fatalf("seed %d: %s %s took %s", seed, n.name, rid, fin.Age)
			}
		}
		// Each stage ended within its own deadline (plus one tick).
		c := n.m.cfg
		bound := map[Stage]time.Duration{StageBootstrap: c.BootstrapTimeout, StageWaiting: c.QueueTimeout,
			StageParked: c.KVHoldTimeout, StageTransferring: c.TransferTimeout, StagePrealloc: c.QueueTimeout,
			StageQueued: c.QueueTimeout, StagePrefilling: c.MaxRequestTime, StageAwaitingKV: c.MaxRequestTime,
			StageDecoding: c.MaxRequestTime, StagePreempted: c.QueueTimeout}
		for s, d := range st.MaxInStage {
			if d > bound[s]+100*time.Millisecond {
				t.Fatalf("seed %d: %s spent %s in %s, bound %s", seed, n.name, d, s, bound[s])
			}
		}
	}
	// Invariant 5: whatever decode completed equals the colocated answer.
	okCount := 0
	for rid, fin := range D.finals {
		if fin.Outcome != outcome.OK {
			continue
		}
		okCount++
		if !slices.Equal(D.emitted[rid], want[rid]) {
			t.Fatalf("seed %d: %s decoded %v, colocated %v", seed, rid, D.emitted[rid], want[rid])
		}
	}
	if f == (faults{}) && okCount != nReq {
		for rid, fin := range D.finals {
			if fin.Outcome != outcome.OK {
				t.Errorf("clean run: %s ended %s: %s (prefill: %+v)", rid, fin.Outcome, fin.Err, P.finals[rid])
			}
		}
		t.Fatalf("seed %d: clean run completed %d of %d", seed, okCount, nReq)
	}
	// Tombstones drain after their TTL.
	now = now.Add(cfgP.TombstoneTTL + time.Second)
	P.step(t, now, Tick{})
	D.step(t, now, Tick{})
	if a, b := P.m.Stats(now).Tombstones, D.m.Stats(now).Tombstones; a+b != 0 {
		t.Fatalf("seed %d: tombstones left: prefill %d decode %d", seed, a, b)
	}
	return D.m.Stats(now).Counters.Preemptions
}

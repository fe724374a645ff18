package lifecycle

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

var (
	pairSeeds = flag.Int("pair-seeds", 0, "seeded runs of TestPairRandomized (0: 200, or 50 under the race detector)")
	pairSeed  = flag.Int("pair-seed", 0, "run only this seed of TestPairRandomized and write its transcript to a file")
)

type faults struct {
	drop, dup, lose, abort, slowBatch float64
}

// seedFaults: every fourth seed runs clean and must finish every request.
func seedFaults(seed uint64) faults {
	if seed%4 == 0 {
		return faults{}
	}
	return faults{drop: 0.02, dup: 0.03, lose: 0.002, abort: 0.01, slowBatch: 0.2}
}

// reference runs requests one at a time on a colocated machine.
func reference(t testing.TB, reqs []Request) map[string][]int32 {
	return referenceOn(t, testConfig(RoleColocated), 64, reqs)
}

// referenceOn is reference on a colocated machine of config cfg with a
// pool of pages.
func referenceOn(t testing.TB, cfg Config, pages int, reqs []Request) map[string][]int32 {
	w := newWorld(t)
	c := w.addNode(cfg, pages, 0)
	for _, q := range reqs {
		q.Room, q.Peer, q.PeerAddr = kvxfer.Room{}, 0, ""
		w.arrive(c, q)
		for {
			if _, ok := c.finals[q.RID]; ok {
				break
			}
			w.schedule(c)
			if c.batch == nil {
				t.Fatalf("reference: %s stuck", q.RID)
			}
			w.batchDone(c, nil)
		}
		if f := c.finals[q.RID]; f.Outcome != outcome.OK {
			t.Fatalf("reference: %s ended %s: %s", q.RID, f.Outcome, f.Err)
		}
	}
	return c.emitted
}

// randomRoom mints a room from the run's seeded generator (the router uses
// crypto/rand), so a seed replays exactly.
func randomRoom(rng *rand.Rand) kvxfer.Room {
	var r kvxfer.Room
	binary.LittleEndian.PutUint64(r[:8], rng.Uint64())
	binary.LittleEndian.PutUint64(r[8:], rng.Uint64())
	if r.IsZero() {
		r[0] = 1
	}
	return r
}

// TestPairRandomized runs a prefill and a decode machine together over many
// seeded interleavings: requests arriving on either side first, frames
// delayed, dropped and duplicated, the connection lost, clients aborting at
// random phases, slow forwards and slow page I/O. After every step the
// machines' invariants hold (checkLegal, no write into another request's
// pages); at the end every request ended on both sides within its stage
// deadlines, nothing is held, and what decode completed equals colocated
// decoding. A failing seed is replayed with a recorder and its transcript
// written out, ready for testdata/.
func TestPairRandomized(t *testing.T) {
	if *pairSeed > 0 {
		seed := uint64(*pairSeed)
		var tr string
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runPair(t, seed, seedFaults(seed), &tr) })
		t.Logf("transcript of seed %d: %s", seed, writeTranscript(t, seed, tr))
		return
	}
	seeds := *pairSeeds
	if seeds == 0 {
		// The race detector slows every step about tenfold; CI runs the
		// 200 seeds without it too (.ci/run).
		seeds = 200
		if raceEnabled {
			seeds = 25
		}
	}
	var preemptions, prefillHits, decodeHits uint64
	var opt [numOptimisticOutcomes]uint64
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		f := seedFaults(seed)
		if t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := runPair(t, seed, f, nil)
			preemptions += c.Preemptions
			prefillHits += c.prefillHits
			decodeHits += c.PrefixHitTokens
			for i, v := range c.Optimistic {
				opt[i] += v
			}
		}) {
			continue
		}
		var tr string
		replayed := t.Run(fmt.Sprintf("seed=%d-recorded", seed), func(t *testing.T) { runPair(t, seed, f, &tr) })
		if replayed {
			t.Errorf("seed %d failed, but not when replayed with a recorder: the run is not deterministic", seed)
		}
		path := writeTranscript(t, seed, tr)
		fmt.Printf("---- transcript of seed %d (%s) ----\n%s---- end of transcript ----\n", seed, path, tr)
		t.Fatalf("failing seed %d (rerun: go test ./internal/lifecycle -run TestPairRandomized -pair-seed=%d); "+
			"its transcript is in %s: copy it into internal/lifecycle/testdata/ and it replays with go test -run TestTranscripts",
			seed, seed, path)
	}
	if seeds >= 20 && preemptions == 0 {
		t.Errorf("no seed preempted a request: the recompute path went untested")
	}
	if seeds >= 20 && (prefillHits == 0 || decodeHits == 0) {
		t.Errorf("prefix cache hits over every seed: prefill %d tokens, decode %d: a side went untested", prefillHits, decodeHits)
	}
	t.Logf("prefix cache hits over %d seeds: prefill %d tokens, decode %d", seeds, prefillHits, decodeHits)
	t.Logf("optimistic prefill over %d seeds: %v", seeds, opt)
	if seeds >= 20 {
		for _, o := range []OptimisticOutcome{OptimisticStarted, OptimisticParked, OptimisticSent, OptimisticFellBack} {
			if opt[o] == 0 {
				t.Errorf("no seed counted an optimistic prefill %s: that path went untested (%v)", o, opt)
			}
		}
	}
}

// pairCache: every other seed runs both sides with the prefix cache, and
// its prompts share prefixes: a few common starts, and later turns of
// earlier requests (their prompt and colocated answer, then more).
func pairCache(seed uint64) bool { return seed%2 == 1 }

// pairStats is what runPair reports: decode's counters, and prefill's
// prefix cache hits.
type pairStats struct {
	Counters
	prefillHits uint64
}

// pairOptimistic: every third seed prefills optimistically (1 to 3
// attempts, a quarter of prefill's pool), and decode is slower to open
// its rooms, so prefill often computes before ROOM_OPEN; in half of those
// the test hook also holds back the ROOM_OPEN of half the requests.
func pairOptimistic(seed uint64) (attempts int, on bool) {
	return 1 + int(seed/3)%3, seed%3 == 2
}

func writeTranscript(t *testing.T, seed uint64, tr string) string {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("lifecycle-pair-seed-%d.txt", seed))
	if err := os.WriteFile(path, []byte(tr), 0o644); err != nil {
		t.Errorf("writing the transcript: %v", err)
	}
	return path
}

// runPair runs one seeded pair and returns decode's preemptions and
// prefill's optimistic prefill counters. If transcript is not nil, the run
// is recorded into it, up to the command that failed if one did.
func runPair(t *testing.T, seed uint64, f faults, transcript *string) pairStats {
	rng := rand.New(rand.NewPCG(seed, 99))
	w := newWorld(t)
	if transcript != nil {
		rec := newRecorder(w, fmt.Sprintf("TestPairRandomized, seed %d, faults %+v.\nRegenerate with: go test ./internal/lifecycle -run TestPairRandomized -pair-seed=%d", seed, f, seed))
		defer func() { *transcript = rec.String() }() // also when the run fails
	}
	cfgP, cfgD := testConfig(RolePrefill), testConfig(RoleDecode)
	cache := pairCache(seed)
	cfgP.PrefixCache, cfgD.PrefixCache = cache, cache
	attempts, optimistic := pairOptimistic(seed)
	openDelay := 30 // ms: the most a leg's HTTP arrival is delayed
	if optimistic {
		cfgP.OptimisticAttempts = attempts
		openDelay = 150
	}
	force := 0.0
	if optimistic && seed%2 == 1 {
		force = 0.5 // the test hook holds half the ROOM_OPENs back
	}
	P := w.addNode(cfgP, 24, force)
	D := w.addNode(cfgD, 48, 0)
	w.connect()
	if f != (faults{}) {
		// Slow page I/O, so requests end while their KV is being copied.
		w.ioDelay = func() time.Duration { return time.Duration(rng.IntN(40)) * time.Millisecond }
	}

	nReq := 20 + rng.IntN(20)
	var reqs []Request
	for i := range nReq {
		q := Request{RID: fmt.Sprintf("s%d-r%d", seed, i), Room: randomRoom(rng), Gen: 1,
			InputIDs: tokens(1 + rng.IntN(30)), MaxTokens: 1 + rng.IntN(12),
			Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: rng.IntN(2) == 0}
		for k := range q.InputIDs {
			q.InputIDs[k] = int32(1 + rng.IntN(98))
		}
		// A quarter have several choices, a fifth top logprobs: forks on
		// decode, first tokens in KV_DONE's tail.
		if rng.IntN(4) == 0 {
			q.N = 2 + rng.IntN(3)
		}
		if rng.IntN(5) == 0 {
			q.Sampling.TopLogprobs = 1 + rng.IntN(3)
		}
		reqs = append(reqs, q)
	}
	var want map[string][]int32
	if cache {
		want = sharePrefixes(t, rng, reqs, 40)
	} else {
		want = reference(t, reqs)
	}

	// The router: each leg arrives over HTTP after its own delay; a failed
	// leg makes it abort the other one.
	type httpEv struct {
		at time.Time
		to *node
		ev Event
	}
	var http []httpEv
	arrivals := 0
	routerAborted := map[string]bool{}
	w.onFinal = func(n *node, fin Finalize) {
		if fin.Outcome != outcome.OK && !routerAborted[fin.RID] {
			routerAborted[fin.RID] = true
			http = append(http, httpEv{at: w.now.Add(5 * time.Millisecond), to: w.other(n),
				ev: AbortRequest{RID: fin.RID, Reason: AbortPeerLeg}})
		}
	}
	// The network: frames a node sent since the last look are dropped,
	// duplicated and delayed; each arrives in order (TCP) once due.
	network := func(to *node, faulty bool) {
		for i := 0; i < len(to.inbox); i++ {
			if !to.inbox[i].fresh {
				continue
			}
			if faulty && rng.Float64() < f.drop {
				w.drop(to, i)
				i--
				continue
			}
			to.inbox[i].fresh = false
			to.inbox[i].at = w.now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
			if faulty && rng.Float64() < f.dup {
				w.dup(to, i)
				i++
			}
		}
	}
	deliver := func(n *node) {
		k := 0
		for k < len(n.inbox) && !n.inbox[k].fresh && !w.now.Before(n.inbox[k].at) {
			k++
		}
		if k > 0 {
			w.deliver(n, k)
		}
	}
	runIO := func(n *node) {
		k := 0
		for k < len(n.io) && !w.now.Before(n.io[k].due) {
			k++
		}
		if k > 0 {
			w.runIO(n, k)
		}
	}
	runBatches := func(faulty bool) {
		for _, n := range []*node{P, D} {
			if n.batch == nil {
				w.schedule(n)
				if n.batch != nil {
					d := time.Millisecond
					if faulty && rng.Float64() < f.slowBatch {
						d = time.Duration(rng.IntN(300)) * time.Millisecond
					}
					n.batchAt = w.now.Add(d)
				}
			} else if !w.now.Before(n.batchAt) {
				w.batchDone(n, nil)
			}
		}
	}
	const tick = 10 * time.Millisecond
	lastTick := w.now
	for steps := 0; steps < 100000; steps++ {
		faulty := arrivals < nReq
		w.now = w.now.Add(tick)
		if arrivals < nReq && rng.IntN(3) == 0 {
			q := reqs[arrivals]
			arrivals++
			qd := q
			qd.Peer, qd.PeerAddr = w.peerOf(D), "prefill"
			http = append(http,
				httpEv{at: w.now.Add(time.Duration(rng.IntN(30)) * time.Millisecond), to: P, ev: Arrive{Req: q}},
				httpEv{at: w.now.Add(time.Duration(rng.IntN(openDelay)) * time.Millisecond), to: D, ev: Arrive{Req: qd}})
			if rng.Float64() < f.abort*10 {
				// The client gives up at a random phase; the router aborts both legs.
				at := w.now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
				http = append(http, httpEv{at: at, to: P, ev: AbortRequest{RID: q.RID, Reason: AbortClient}},
					httpEv{at: at, to: D, ev: AbortRequest{RID: q.RID, Reason: AbortClient}})
			}
		}
		var later []httpEv
		for len(http) > 0 {
			h := http[0]
			http = http[1:]
			if w.now.Before(h.at) {
				later = append(later, h)
				continue
			}
			switch ev := h.ev.(type) {
			case Arrive:
				w.arrive(h.to, ev.Req)
			case AbortRequest:
				w.abort(h.to, ev)
			}
		}
		http = append(later, http...)
		if faulty && rng.Float64() < f.lose {
			// The connection dies: both sides hear it, frames in flight
			// are lost, and decode reconnects.
			w.disconnect("reset")
			w.connect()
		}
		network(D, faulty)
		network(P, faulty)
		deliver(P)
		deliver(D)
		runIO(P)
		runIO(D)
		runBatches(faulty)
		if w.now.Sub(lastTick) >= 100*time.Millisecond {
			lastTick = w.now
			w.tick()
		}
		if arrivals == nReq && len(P.finals) == nReq && len(D.finals) == nReq && P.batch == nil && D.batch == nil &&
			len(http) == 0 && len(P.io) == 0 && len(D.io) == 0 {
			break
		}
	}
	now := w.now
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
	for _, q := range reqs {
		fin := D.finals[q.RID]
		if fin.Outcome != outcome.OK {
			continue
		}
		okCount++
		for c := range q.choices() {
			k := choiceKey(q.RID, c)
			if !slices.Equal(D.emitted[k], want[k]) {
				t.Fatalf("seed %d: %s choice %d decoded %v, colocated %v", seed, q.RID, c, D.emitted[k], want[k])
			}
			if len(want[k]) == 0 {
				t.Fatalf("seed %d: %s choice %d: colocated emitted nothing", seed, q.RID, c)
			}
		}
	}
	if f == (faults{}) && okCount != nReq {
		for _, q := range reqs {
			if fin := D.finals[q.RID]; fin.Outcome != outcome.OK {
				t.Errorf("clean run: %s ended %s: %s (prefill: %+v)", q.RID, fin.Outcome, fin.Err, P.finals[q.RID])
			}
		}
		t.Fatalf("seed %d: clean run completed %d of %d", seed, okCount, nReq)
	}
	// Tombstones drain after their TTL.
	w.now = w.now.Add(cfgP.TombstoneTTL + time.Second)
	w.tick()
	if a, b := P.m.Stats(w.now).Tombstones, D.m.Stats(w.now).Tombstones; a+b != 0 {
		t.Fatalf("seed %d: tombstones left: prefill %d decode %d", seed, a, b)
	}
	// Every optimistic prefill that started ended one way.
	c := P.m.Stats(w.now).Counters.Optimistic
	if ended := c[OptimisticSent] + c[OptimisticExpired] + c[OptimisticAborted] + c[OptimisticFellBack]; ended != c[OptimisticStarted] {
		t.Fatalf("seed %d: %d optimistic prefills started, %d ended (%v)", seed, c[OptimisticStarted], ended, c)
	}
	if !optimistic && c[OptimisticStarted] != 0 {
		t.Fatalf("seed %d: optimistic prefill is off but %d started", seed, c[OptimisticStarted])
	}
	dc := D.m.Stats(w.now).Counters
	return pairStats{Counters: Counters{Preemptions: dc.Preemptions, Optimistic: c, PrefixHitTokens: dc.PrefixHitTokens},
		prefillHits: P.m.Stats(w.now).Counters.PrefixHitTokens}
}

// sharePrefixes rewrites the prompts of reqs so that they share prefixes,
// as traffic that a prefix cache serves does, and returns the colocated
// answers (without a cache) of the rewritten requests. Half start with one
// of three common prefixes; a third of the later ones are the next turn of
// an earlier request: its prompt, its answer, then a few new tokens.
// Prompts stay under maxPrompt tokens.
func sharePrefixes(t testing.TB, rng *rand.Rand, reqs []Request, maxPrompt int) map[string][]int32 {
	randToks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1 + rng.IntN(98))
		}
		return out
	}
	common := [][]int32{randToks(9), randToks(16), randToks(21)}
	for i := range reqs {
		if rng.IntN(2) == 0 {
			p := common[rng.IntN(len(common))]
			suffix := reqs[i].InputIDs[:rng.IntN(min(len(reqs[i].InputIDs), 8)+1)]
			reqs[i].InputIDs = append(slices.Clone(p), suffix...)
		}
	}
	want := reference(t, reqs)
	for i := range reqs {
		if i == 0 || rng.IntN(3) != 0 {
			continue
		}
		prev := reqs[rng.IntN(i)]
		turn := slices.Concat(prev.InputIDs, want[prev.RID], randToks(1+rng.IntN(4)))
		if len(turn) < maxPrompt {
			reqs[i].InputIDs = turn
		}
	}
	return reference(t, reqs)
}

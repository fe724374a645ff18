package lifecycle

import (
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
)

// harness drives a Machine with a fake clock and records every effect.
type harness struct {
	t     testing.TB
	m     *Machine
	alloc *kvcache.Allocator
	now   time.Time
	// effects of the last step(s) since the last take.
	got []Effect
	// finals counts Finalize effects per rid over the whole run.
	finals map[string]int
	// outcome of each finalized rid.
	outcomes map[string]Finalize
	// pending batch, answered by done().
	batch *RunBatch
	// pageData simulates page bytes so checksums can be verified.
	pageData map[kvcache.PageID][]byte
}

const testPageBytes = 8

func testConfig(role Role) Config {
	c := DefaultConfig(role)
	c.PageSize = 4
	c.PageBytes = testPageBytes
	c.ContextLen = 64
	c.VocabSize = 100
	c.EOS = []int32{99}
	c.MaxPrefillTokens = 16
	c.MaxRunning = 4
	c.MaxChunkPages = 2
	c.BootstrapTimeout = 10 * time.Second
	c.QueueTimeout = 60 * time.Second
	c.KVHoldTimeout = 30 * time.Second
	c.TransferTimeout = 30 * time.Second
	c.MaxRequestTime = 600 * time.Second
	c.HeartbeatInterval = time.Second
	c.LeaseMisses = 3
	c.TombstoneTTL = 120 * time.Second
	return c
}

func newHarness(t testing.TB, cfg Config, pages int) *harness {
	t.Helper()
	a := kvcache.NewAllocator(pages)
	m, err := New(cfg, a)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, m: m, alloc: a, now: time.Unix(1_000_000, 0),
		finals: map[string]int{}, outcomes: map[string]Finalize{}, pageData: map[kvcache.PageID][]byte{}}
}

func (h *harness) step(ev Event) []Effect {
	h.t.Helper()
	h.m.Step(h.now, ev)
	effs := h.m.Ready()
	// Page I/O completes at once here; pair_test delays it.
	defer func() {
		for _, e := range effs {
			if j := jobOf(e); j != 0 {
				h.m.Step(h.now, IODone{Job: j})
				h.got = append(h.got, h.m.Ready()...)
				h.check()
			}
		}
	}()
	for _, e := range effs {
		switch x := e.(type) {
		case Finalize:
			h.finals[x.RID]++
			if h.finals[x.RID] > 1 {
				h.t.Fatalf("rid %s finalized %d times", x.RID, h.finals[x.RID])
			}
			h.outcomes[x.RID] = x
		case RunBatch:
			if h.batch != nil {
				h.t.Fatalf("second RunBatch while one is running")
			}
			b := x
			h.batch = &b
		case WriteKV:
			for i, p := range x.Pages {
				h.pageData[p] = append([]byte(nil), x.Data[i*testPageBytes:(i+1)*testPageBytes]...)
			}
		}
	}
	h.got = append(h.got, effs...)
	h.check()
	return effs
}

// check asserts the accounting invariants after every step.
func (h *harness) check() {
	h.t.Helper()
	m := h.m
	held := map[kvcache.PageID]bool{}
	var counts [numStages]int
	for _, r := range m.reqs {
		if r.stage == StageDone && (r.group == nil || r.group.live == 0) {
			h.t.Fatalf("terminal request %s still live", r.RID)
		}
	}
	for _, r := range m.sortedLive() {
		for _, p := range r.pages {
			held[p] = true
		}
		for _, p := range r.forkPages {
			held[p] = true
		}
		counts[r.stage]++
	}
	for r := range m.draining {
		for _, p := range r.pages {
			held[p] = true
		}
		for _, p := range r.forkPages {
			held[p] = true
		}
	}
	if used := m.cache.Used(); used != len(held) {
		h.t.Fatalf("pages used %d, held by requests %d", used, len(held))
	}
	// The allocator counts cached pages as taken: they are the cache's.
	if h.alloc.Used() != m.cache.Used()+m.cache.Cached() || h.alloc.Used()+h.alloc.FreeCount() != h.alloc.Total() {
		h.t.Fatalf("allocator used %d (cache: used %d, cached %d) + free %d != total %d",
			h.alloc.Used(), m.cache.Used(), m.cache.Cached(), h.alloc.FreeCount(), h.alloc.Total())
	}
	for s := StageNone; s < numStages; s++ {
		if counts[s] != m.stageCount[s] {
			h.t.Fatalf("stage %s count %d, true count %d", s, m.stageCount[s], counts[s])
		}
	}
	if err := checkLegal(m); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) advance(d time.Duration) []Effect {
	h.now = h.now.Add(d)
	return h.step(Tick{})
}

// done answers the running batch: every sampled token is next(rid).
func (h *harness) done(next func(rid string) int32) []Effect {
	h.t.Helper()
	if h.batch == nil {
		h.t.Fatalf("no batch to finish")
	}
	b := h.batch
	h.batch = nil
	out := make([]model.SeqOutput, len(b.Seqs))
	for i, s := range b.Seqs {
		if s.Input.Sample {
			out[i] = model.SeqOutput{Token: next(s.RID), Logprob: -1}
		}
		for _, p := range s.Input.Pages {
			if _, ok := h.pageData[p]; !ok {
				h.pageData[p] = []byte(fmt.Sprintf("%s%05d", s.RID, p))[:testPageBytes]
			}
		}
	}
	return h.step(BatchDone{Out: out})
}

func (h *harness) take() []Effect {
	g := h.got
	h.got = nil
	return g
}

func (h *harness) finalOf(rid string) (Finalize, bool) {
	f, ok := h.outcomes[rid]
	return f, ok
}

func (h *harness) checksum(pages []kvcache.PageID) uint32 {
	c := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, p := range pages {
		d := h.pageData[p]
		if d == nil {
			d = make([]byte, testPageBytes)
		}
		c.Write(d)
	}
	return c.Sum32()
}

// binding is the KV binding of request q under the harness machine's
// model: what an honest prefill's KV_DONE carries for it.
func (h *harness) binding(q Request) kvxfer.Binding {
	cfg := h.m.Config()
	rg := kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}
	return kvxfer.BindKVConstrained(rg, uint32(len(q.InputIDs)),
		kvxfer.AppendPromptChain(nil, kvxfer.ChainSeed(cfg.Fingerprint), q.InputIDs, cfg.PageSize), q.ConstraintDigest)
}

func room(i int) kvxfer.Room {
	var r kvxfer.Room
	r[0], r[15] = byte(i), byte(i>>8)|1
	return r
}

func tokens(n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(1 + i%90)
	}
	return ids
}

func request(i, n, maxTokens int) Request {
	return Request{RID: fmt.Sprintf("r%d", i), Room: room(i), Gen: 1, InputIDs: tokens(n), MaxTokens: maxTokens,
		Sampling: model.SamplingParams{TopP: 1}, Peer: 7, PeerAddr: "p:1"}
}

func roomOpen(q Request) kvxfer.RoomOpen {
	return kvxfer.RoomOpen{RoomGen: kvxfer.RoomGen{Room: q.Room, Gen: q.Gen}, RID: q.RID,
		NTokens: uint32(len(q.InputIDs)), PromptHash: PromptHash(q.InputIDs)}
}

// jobOf returns the job id of a page I/O effect (0 for others).
func jobOf(e Effect) uint64 {
	switch x := e.(type) {
	case SendKV:
		return x.Job
	case SendKVDone:
		return x.Job
	case WriteKV:
		return x.Job
	case VerifyKV:
		return x.Job
	}
	return 0
}

// describe renders effects one per line, for failure messages.
func describe(effs []Effect) string {
	var b strings.Builder
	for _, e := range effs {
		fmt.Fprintf(&b, "%T %+v\n", e, e)
	}
	return b.String()
}

func sends[T kvxfer.Message](effs []Effect) []T {
	var out []T
	for _, e := range effs {
		if s, ok := e.(Send); ok {
			if m, ok := s.Msg.(T); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

func effectsOf[T Effect](effs []Effect) []T {
	var out []T
	for _, e := range effs {
		if x, ok := e.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

package lifecycle

import (
	"fmt"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

// BenchmarkStepDecode measures the machine's cost per event in steady-state
// decoding: b.N steps of a batch of 64 running requests, each step two
// events (Schedule, BatchDone). Requests generate 512 + 8·i tokens, so they
// finish at different steps; each one that finishes is replaced by a new
// 32-token request, whose prefill joins a later step. Reported per event and
// per generated token.
func BenchmarkStepDecode(b *testing.B) {
	cfg := DefaultConfig(RoleColocated)
	cfg.PageBytes, cfg.VocabSize = 1, 1000
	cfg.MaxRunning = 64
	m, err := New(cfg, kvcache.NewAllocator(1<<16))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	next := 0
	arrive := func() {
		m.Step(now, Arrive{Req: Request{RID: fmt.Sprint(next), InputIDs: make([]int32, 32), MaxTokens: 512 + 8*(next%64),
			IgnoreEOS: true, Sampling: model.SamplingParams{TopP: 1}}})
		next++
	}
	for range 64 {
		arrive()
	}
	out := make([]model.SeqOutput, 64)
	// Prefill everything, then time decode steps.
	for m.stageCount[StageDecoding] < 64 {
		m.Step(now, Schedule{})
		m.Ready()
		m.Step(now, BatchDone{Out: out[:len(m.batch)]})
		m.Ready()
	}
	tokens := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		m.Step(now, Schedule{})
		m.Ready()
		tokens += len(m.batch)
		m.Step(now, BatchDone{Out: out[:len(m.batch)]})
		m.Ready()
		for m.Live() < 64 {
			arrive()
		}
	}
	b.StopTimer()
	if tokens < 63*b.N {
		b.Fatalf("%d tokens in %d steps: the batch was not kept full", tokens, b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/event")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(tokens), "ns/token")
}

// BenchmarkStepRequest measures a colocated request's whole life (arrive,
// prefill, 4 decode steps, finish) through the machine.
func BenchmarkStepRequest(b *testing.B) {
	cfg := DefaultConfig(RoleColocated)
	cfg.PageBytes, cfg.VocabSize = 1, 1000
	m, err := New(cfg, kvcache.NewAllocator(1<<12))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	out := []model.SeqOutput{{Token: 1}}
	prompt := make([]int32, 32)
	b.ReportAllocs()
	events := 0
	for i := range b.N {
		m.Step(now, Arrive{Req: Request{RID: fmt.Sprint(i), InputIDs: prompt, MaxTokens: 5, IgnoreEOS: true,
			Sampling: model.SamplingParams{TopP: 1}}})
		events++
		for m.Live() > 0 {
			m.Step(now, Schedule{})
			m.Ready()
			m.Step(now, BatchDone{Out: out})
			m.Ready()
			events += 2
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

// BenchmarkStepRequestPrefixCache is BenchmarkStepRequest with a 512-token
// prompt (32 pages) and 4 output tokens, without the prefix cache, with it
// and every prompt new (0% hits: the cost of hashing, looking up and
// publishing pages), and with it and every prompt the same (all but the
// last page cached).
func BenchmarkStepRequestPrefixCache(b *testing.B) {
	for _, tc := range []struct {
		name   string
		cache  bool
		unique bool
	}{{"cache=off", false, true}, {"cache=on/hit=0", true, true}, {"cache=on/hit=all", true, false}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := DefaultConfig(RoleColocated)
			cfg.PageBytes, cfg.VocabSize = 1, 1000
			cfg.PrefixCache = tc.cache
			m, err := New(cfg, kvcache.NewAllocator(1<<12))
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(0, 0)
			out := []model.SeqOutput{{Token: 1}}
			events := 0
			for i := 0; b.Loop(); i++ {
				prompt := make([]int32, 512)
				if tc.unique {
					prompt[0], prompt[1] = int32(i%1000), int32(i/1000%1000)
				}
				m.Step(now, Arrive{Req: Request{RID: fmt.Sprint(i), InputIDs: prompt, MaxTokens: 5, IgnoreEOS: true,
					Sampling: model.SamplingParams{TopP: 1}}})
				events++
				for m.Live() > 0 {
					m.Step(now, Schedule{})
					m.Ready()
					m.Step(now, BatchDone{Out: out})
					m.Ready()
					events += 2
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
		})
	}
}

package llama_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/openai"
)

// BenchmarkChoices measures what n > 1 costs on the SmolLM2-135M-shaped
// model (random bf16 weights, F32 KV; $PDSERVE_SMOLLM2_DIR if set, else a
// checkpoint written once) behind a router with one prefill and one decode
// worker in process: one request at a time of a 128-token prompt and 64
// output tokens (temperature 0.8, ignore_eos), n = 1 and n = 8 in turn.
// Per request it reports the time to its first token (ttft-ms), its output
// tokens per second of wall time from arrival to end, over every choice
// (tok/s), and the KV bytes prefill sent (kv-bytes).
//
//	go test -run '^$' -bench Choices -benchtime 8x ./test/llama/
func BenchmarkChoices(b *testing.B) {
	dir := os.Getenv("PDSERVE_SMOLLM2_DIR")
	if dir == "" {
		dir = llamatest.SmolLM2135M().WriteT(b)
	}
	base, err := llama.Load(dir, llama.Options{Name: "smollm2-shaped"})
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	made := []*llama.Model{base}
	defer func() {
		for _, m := range made {
			m.Close()
		}
	}()
	newModel := func() (model.Model, error) {
		m, err := base.Clone()
		mu.Lock()
		made = append(made, m)
		mu.Unlock()
		return m, err
	}
	mc := lifecycle.DefaultConfig(lifecycle.RoleColocated)
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1, NewModel: newModel,
		Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 256 << 20}, HealthInterval: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
	}()
	rng := rand.New(rand.NewPCG(8, 8))
	vocab := base.Info().VocabSize
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var ttfts []time.Duration
			var tokens int
			var wall time.Duration
			kv0 := kvSent(b, c)
			for i := range b.N {
				prompt := make([]int32, 128)
				for k := range prompt {
					prompt[k] = int32(1 + rng.IntN(vocab-1))
				}
				g := openai.GenerateRequest{RID: fmt.Sprintf("b%d-%d", n, i), InputIDs: prompt, MaxTokens: 64, N: n, IgnoreEOS: true,
					Sampling: model.SamplingParams{Temperature: 0.8, TopP: 1, Seed: rng.Uint64()}}
				start := time.Now()
				st, err := c.Router.Router.Generate(context.Background(), &g)
				if err != nil {
					b.Fatal(err)
				}
				first := time.Duration(0)
				for {
					ch, err := st.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					if len(ch.Tokens) > 0 && first == 0 {
						first = time.Since(start)
					}
					tokens += len(ch.Tokens)
					if ch.Done || (n == 1 && ch.FinishReason != "") {
						break
					}
				}
				wall += time.Since(start)
				st.Close()
				ttfts = append(ttfts, first)
			}
			slices.Sort(ttfts)
			b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds())/1000, "ttft-ms")
			b.ReportMetric(float64(tokens)/wall.Seconds(), "tok/s")
			b.ReportMetric((kvSent(b, c)-kv0)/float64(b.N), "kv-bytes")
		})
	}
}

// kvSent is the KV bytes c's prefill workers have sent.
func kvSent(b *testing.B, c *cluster.Cluster) float64 {
	var sum float64
	for _, w := range c.Prefill {
		mfs, err := w.Registry.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "pdserve_kv_transfer_bytes_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "direction" && l.GetValue() == "sent" {
						sum += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return sum
}

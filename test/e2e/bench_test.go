package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/tracing"
)

// BenchmarkUp measures requests/s through router + 1P1D (what `pdserve up`
// runs) with the zero-latency simulated model: 32-token prompts, 16 output
// tokens, 64 concurrent clients. Run:
//
//	go test ./test/e2e -run '^$' -bench BenchmarkUp -benchtime 3000x
func BenchmarkUp(b *testing.B) {
	for _, g := range []struct {
		name string
		geo  kvcache.Geometry
	}{
		{"kv=256B/token", testGeometry},
		{"kv=128KiB/token(llama3-8b)", sim.DefaultGeometry()},
	} {
		b.Run(g.name, func(b *testing.B) {
			mc := testMachine()
			c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
				NewModel: simFactory(sim.Config{Geometry: g.geo}),
				Worker:   cluster.WorkerOptions{Machine: mc, KVCacheMemory: 2 << 30}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Shutdown(context.Background())
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			body := `{"prompt":"` + strings.Repeat("x", 32) + `","max_tokens":16,"ignore_eos":true,"temperature":0}`
			b.SetParallelism(32) // × GOMAXPROCS goroutines
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(c.URL()+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					out, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Error(fmt.Sprint("status ", resp.StatusCode, " ", string(out)))
						return
					}
				}
			})
			b.StopTimer() // ns/op and req/s cover the requests, not the deferred shutdown
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			client.CloseIdleConnections()
		})
	}
}

// BenchmarkRouterOverhead measures the latency PD adds over a colocated
// worker for the same request, one request at a time (no queueing): each
// iteration sends one request through `up` (router + 1P1D) and one straight
// to a `serve` worker, alternating, and reports both medians and their
// difference. Zero-latency simulated model, small KV geometry. Run:
//
//	go test ./test/e2e -run '^$' -bench BenchmarkRouterOverhead -benchtime 2000x
func BenchmarkRouterOverhead(b *testing.B) {
	mc := testMachine()
	c, err := cluster.Up(context.Background(), cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1,
		NewModel: simFactory(sim.Config{}), Worker: cluster.WorkerOptions{Machine: mc, KVCacheMemory: 64 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	m, _ := simFactory(sim.Config{})()
	mc.Role = lifecycle.RoleColocated
	co, err := cluster.StartWorker(cluster.WorkerOptions{Addr: "127.0.0.1:0", Model: m, Machine: mc, KVCacheMemory: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer co.Shutdown(context.Background())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := `{"prompt":"` + strings.Repeat("x", 32) + `","max_tokens":16,"ignore_eos":true,"temperature":0}`
	send := func(url string) time.Duration {
		start := time.Now()
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	for range 50 { // warm both paths' connections
		send(c.URL())
		send(co.URL)
	}
	var up, direct []time.Duration
	b.ResetTimer()
	for range b.N {
		up = append(up, send(c.URL()))
		direct = append(direct, send(co.URL))
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	mu, md := med(up), med(direct)
	b.ReportMetric(mu, "p50-up-ms")
	b.ReportMetric(md, "p50-serve-ms")
	b.ReportMetric(mu-md, "added-p50-ms")
	client.CloseIdleConnections()
}

// BenchmarkTracingCost measures what tracing every request costs `up`
// (router + 1P1D, the zero-latency simulated model, 32-token prompts, 16
// output tokens, 16 clients): the CPU time of this process per request
// (router, workers and the clients, whose share is the same either way)
// and requests/s, with tracing off and on at 100 % sampling, the spans
// exported over OTLP/HTTP to a receiver in this process that discards
// them (its share counts against "on"). Run the two alternately:
//
//	go test ./test/e2e -run '^$' -bench BenchmarkTracingCost -benchtime 4000x -count 4
func BenchmarkTracingCost(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			var providers []tracing.Provider
			o := cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1, NewModel: simFactory(sim.Config{}),
				Worker: cluster.WorkerOptions{Machine: testMachine(), KVCacheMemory: 256 << 20}}
			if on {
				o.TracerFor = func(service string) trace.TracerProvider {
					p, err := tracing.New(context.Background(), tracing.Config{Endpoint: sink.URL, Service: service,
						Getenv: func(string) string { return "" }})
					if err != nil {
						b.Fatal(err)
					}
					providers = append(providers, p)
					return p
				}
			}
			c, err := cluster.Up(context.Background(), o)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Shutdown(context.Background())
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			body := `{"prompt":"` + strings.Repeat("x", 32) + `","max_tokens":16,"ignore_eos":true,"temperature":0}`
			post := func() error {
				resp, err := client.Post(c.URL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			}
			for range 200 { // warm the connections and the pools
				if err := post(); err != nil {
					b.Fatal(err)
				}
			}
			cpu := func() time.Duration {
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			b.SetParallelism(8) // × GOMAXPROCS clients
			c0, start := cpu(), time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := post(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			for _, p := range providers {
				_ = p.Shutdown(context.Background()) // the last spans' export is part of the cost
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			b.ReportMetric(float64((cpu()-c0).Microseconds())/float64(b.N), "cpu-us/req")
		})
	}
}

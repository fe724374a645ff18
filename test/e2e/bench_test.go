package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/testbin"
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

// tracingCluster starts `up` in process (router + 1P1D, the zero-latency
// simulated model) with tracing off, or on at 100 % sampling exporting
// over OTLP/HTTP to sink; it returns the cluster and its providers (for a
// final flush).
func tracingCluster(b *testing.B, on bool, sink string) (*cluster.Cluster, []tracing.Provider) {
	var providers []tracing.Provider
	o := cluster.Options{PrefillWorkers: 1, DecodeWorkers: 1, NewModel: simFactory(sim.Config{}),
		Worker: cluster.WorkerOptions{Machine: testMachine(), KVCacheMemory: 256 << 20}}
	if on {
		o.TracerFor = func(service string) trace.TracerProvider {
			p, err := tracing.New(context.Background(), tracing.Config{Endpoint: sink, Service: service,
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
	return c, providers
}

// discardingSink is an OTLP/HTTP receiver that discards what it is sent.
func discardingSink() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
}

// tracingPost sends the tracing benchmarks' request (32-token prompt, 16
// output tokens) to base.
func tracingPost(client *http.Client, base string) error {
	const body = `{"prompt":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","max_tokens":16,"ignore_eos":true,"temperature":0}`
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
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

// processCPU is the CPU time (user + system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
//
// BenchmarkTracingAB measures the same with far less of the host's drift.
func BenchmarkTracingCost(b *testing.B) {
	sink := discardingSink()
	defer sink.Close()
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			c, providers := tracingCluster(b, on, sink.URL)
			defer c.Shutdown(context.Background())
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			for range 200 { // warm the connections and the pools
				if err := tracingPost(client, c.URL()); err != nil {
					b.Fatal(err)
				}
			}
			b.SetParallelism(8) // × GOMAXPROCS clients
			c0, start := processCPU(), time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := tracingPost(client, c.URL()); err != nil {
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
			b.ReportMetric(float64((processCPU()-c0).Microseconds())/float64(b.N), "cpu-us/req")
		})
	}
}

// tracingAA makes BenchmarkTracingAB's "on" cluster trace nothing either:
// an A/A run, whose ratios are the method's own bias.
var tracingAA = flag.Bool("tracing-aa", false, "BenchmarkTracingAB: both clusters with tracing off (an A/A run)")

// BenchmarkTracingAB measures what tracing every request costs `up`, as
// BenchmarkTracingCost does, with two clusters in this one process, one
// with tracing off and one on, sent alternate rounds of tracingABRound
// requests (64 clients): each round's CPU per request and requests/s is
// summed with the other rounds of its cluster, the two clusters' rounds
// interleaved, so that the host's drift (tens of percent over minutes on a
// shared machine) weighs on both alike. The spans go over OTLP/HTTP to tools/perf/otlpsink in
// a process of its own, as they would to a collector elsewhere: what is
// measured is `up`'s own cost. It reports each cluster's CPU per request
// and the on/off ratios of CPU per request and of requests/s, and, from
// alternate single requests (c=1), the p50 latency of each cluster and
// the difference. b.N is the number of rounds of each cluster:
//
//	go test ./test/e2e -run '^$' -bench BenchmarkTracingAB -benchtime 60x
func BenchmarkTracingAB(b *testing.B) {
	const tracingABRound, clients = 1000, 64
	port := testbin.FreePort(b)
	sinkURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	sink, err := testbin.Start(b, testbin.New("github.com/pdserve/pdserve/tools/perf/otlpsink").Path(b), "otlpsink", nil,
		"-addr", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Kill()
	if state, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		resp, err := http.Get(sinkURL + "/stats")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	}); !ok {
		b.Fatalf("otlpsink did not answer: %s\n%s", state, sink.Stderr())
	}
	// Each cluster's goroutines (and those they start: each connection's)
	// carry the profiler label cluster=off or cluster=on, so that a CPU
	// profile of the run (-cpuprofile, then pprof -tagfocus cluster=on)
	// splits their work.
	var off, on *cluster.Cluster
	var providers []tracing.Provider
	pprof.Do(context.Background(), pprof.Labels("cluster", "off"), func(context.Context) { off, _ = tracingCluster(b, false, "") })
	defer off.Shutdown(context.Background())
	pprof.Do(context.Background(), pprof.Labels("cluster", "on"), func(context.Context) { on, providers = tracingCluster(b, !*tracingAA, sinkURL) })
	defer on.Shutdown(context.Background())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	round := func(base string) (cpu, elapsed time.Duration) {
		var next atomic.Int64
		var wg sync.WaitGroup
		c0, t0 := processCPU(), time.Now()
		for range clients {
			wg.Go(func() {
				for next.Add(1) <= tracingABRound {
					if err := tracingPost(client, base); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return processCPU() - c0, time.Since(t0)
	}
	for range 2 { // warm both: connections, pools, the exporter's buffers
		round(off.URL())
		round(on.URL())
	}
	// Each cluster's CPU time and time taken, summed over its rounds.
	var cpuOff, cpuOn, timeOff, timeOn time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Alternate which goes first, so that neither always follows the
		// other (the collector's debt of one round is paid in the next).
		if i%2 == 0 {
			c, e := round(off.URL())
			cpuOff, timeOff = cpuOff+c, timeOff+e
		}
		c, e := round(on.URL())
		cpuOn, timeOn = cpuOn+c, timeOn+e
		if i%2 == 1 {
			c, e := round(off.URL())
			cpuOff, timeOff = cpuOff+c, timeOff+e
		}
	}
	b.StopTimer()
	// c=1: alternate single requests, latency each.
	var latOff, latOn []float64
	for range 2000 {
		for _, u := range []struct {
			base string
			to   *[]float64
		}{{off.URL(), &latOff}, {on.URL(), &latOn}} {
			t0 := time.Now()
			if err := tracingPost(client, u.base); err != nil {
				b.Fatal(err)
			}
			*u.to = append(*u.to, float64(time.Since(t0).Microseconds())/1000)
		}
	}
	for _, p := range providers {
		_ = p.Shutdown(context.Background())
	}
	med := func(x []float64) float64 {
		x = slices.Clone(x)
		slices.Sort(x)
		if n := len(x); n%2 == 0 {
			return (x[n/2-1] + x[n/2]) / 2
		}
		return x[len(x)/2]
	}
	n := float64(b.N * tracingABRound)
	b.ReportMetric(float64(cpuOff.Microseconds())/n, "off-cpu-us/req")
	b.ReportMetric(float64(cpuOn.Microseconds())/n, "on-cpu-us/req")
	b.ReportMetric(cpuOn.Seconds()/cpuOff.Seconds(), "on/off-cpu")
	b.ReportMetric(timeOff.Seconds()/timeOn.Seconds(), "on/off-req/s")
	b.ReportMetric(med(latOff), "off-p50-ms")
	b.ReportMetric(med(latOn), "on-p50-ms")
	b.ReportMetric(med(latOn)-med(latOff), "added-p50-ms")
}

// Command llamacpp-bench compares pdserve's CPU model runner with llama.cpp
// on the same GGUF files, in the same run: a synthetic BF16 checkpoint of
// llamatest — SmolLM2-135M-shaped (llama.cpp's llama architecture, the
// default) or, with -arch qwen3, gemma2, gemma3, phi3, qwen3moe or mixtral,
// Qwen3-, Gemma-2-, Gemma-3-, Phi-3-, Qwen3-MoE- or Mixtral-shaped
// (llamatest.Qwen3Shaped, Gemma2Shaped, Gemma3Shaped, Phi3Shaped,
// Qwen3MoEShaped, MixtralShaped; llama.cpp's architectures of those names,
// Mixtral as llama with experts; the Gemmas with a sliding window of
// -window positions) — written by llama.WriteGGUF as F32, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K_M, Q5_K_M, Q3_K_M and Q2_K files, each loaded by both. See
// docs/performance.md ("The real model on CPU") for the method and results.
//
// From the repository root:
//
//	go run ./tools/llamacpp-bench [-arch llama|qwen3|gemma2|gemma3|phi3|qwen3moe|mixtral] [-window 16] [-longrope 0] [-partial-rotary 0] [-rounds 3] [-threads 2] [-types f32,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q4_k_m,q5_k_m,q3_k_m,q2_k,iq4_xs] [-kv f32|bf16|f16] [-work DIR]
//
// It installs node-llama-cpp@3.21.1 and @node-llama-cpp/linux-x64@3.21.1
// (npm, --omit=optional; prebuilt binaries, no build, no download at run
// time) into the work directory, writes the checkpoint and the GGUF files
// there (once), checks that llama.cpp and pdserve compute the same model
// on each file (next-token probabilities and greedy tokens after a fixed
// prompt, KV cache of -kv's dtype on both, F32 unless given; the exit status is 1 if a file's top-5
// probabilities differ by more than 1e-4 or its 8 greedy tokens differ),
// then runs pdserve's BenchmarkSmolLM2 -model FILE
// (A) and bench.mjs (B) interleaved A B A B … and prints the medians and
// the ratios pdserve/llama.cpp, of tokens per second and of CPU time per
// token. With -score it instead compares pdserve's
// prompt logprobs with llama.cpp's (score.go). With -stories-refs DIR it
// instead writes the llama.cpp references of the stories260K quantized
// test (refs.go).
package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
)

//go:embed bench.mjs
var benchMJS []byte

//go:embed package.json
var packageJSON []byte

const npmPackages = "node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1"

func main() {
	rounds := flag.Int("rounds", 3, "interleaved rounds (A B per round)")
	threads := flag.Int("threads", 2, "threads for both (pdserve GOMAXPROCS, llama.cpp threads)")
	work := flag.String("work", filepath.Join(os.TempDir(), "pdserve-llamacpp-bench"), "work directory (npm packages, checkpoint, GGUF files)")
	decode := flag.Int("decode", 64, "decode steps timed per run")
	prefillRuns := flag.Int("prefill-runs", 3, "512-token prefills timed per run")
	skipVerify := flag.Bool("skip-verify", false, "skip the numerical comparison")
	types := flag.String("types", "f32,bf16,q8_0,q4_0,q4_k_m", "GGUF file types to compare (comma-separated; see llama.FileTypes)")
	score := flag.Bool("score", false, "instead of benchmarking, compare pdserve's prompt logprobs with llama.cpp's on each file (exit status 1 if any differs by more than 1e-4)")
	scoreChunk := flag.Int("score-chunk", 64, "with -score, the prefill chunk (tokens per forward) on both sides")
	storiesRefs := flag.String("stories-refs", "", "instead of benchmarking, write llama.cpp's references for stories260K quantized to Q8_0, Q4_0 and Q5_0 into this directory (internal/model/llama/testdata/stories260K/gguf)")
	kv := flag.String("kv", "f32", "KV cache element type on both sides, for the numerical check and the timing (f32, bf16, f16; -score and -stories-refs use f32)")
	arch := flag.String("arch", "llama", "synthetic checkpoint: llama (SmolLM2-135M-shaped), qwen3 (llamatest.Qwen3Shaped: Qwen3-0.6B's layers, 8 of them, 32768-token vocabulary), gemma2 (llamatest.Gemma2Shaped: gemma-2-2b's layers, 2 of them, 16384-token vocabulary), gemma3 (llamatest.Gemma3Shaped: gemma-3-1b's layers, 6 of them, 16384-token vocabulary), phi3 (llamatest.Phi3Shaped: Phi-3-mini's layers, 2 of them, 8192-token vocabulary), qwen3moe (llamatest.Qwen3MoEShaped: Qwen3-30B-A3B's attention at half width, 4 layers of 16 experts, 2 per token) or mixtral (llamatest.MixtralShaped: 4 layers of 8 experts, 2 per token, llama.cpp's llama architecture with experts)")
	partialRotary := flag.Float64("partial-rotary", 0, "phi3: partial_rotary_factor, RoPE on the first head_dim·f dimensions of each head (Phi-4-mini's 0.75; 0: all)")
	longRope := flag.Int("longrope", 0, "phi3: write LongRoPE factors (llamatest's LongRopeFactors) with this original_max_position_embeddings (0: none; 128 makes every context both sides use, 256 to 4096 positions, take the long factors)")
	window := flag.Int("window", 16, "gemma2 and gemma3: the sliding window written into the checkpoint, so that the check's 24-token prompt and 8 greedy tokens cross it (0: the shape's own, 4096 and 512)")
	flag.Parse()
	log.SetFlags(0)

	kvdt, err := kvcache.ParseDType(*kv)
	if err != nil {
		log.Fatalf("-kv: %v", err)
	}
	kvName := strings.ToUpper(kvdt.String()) // ggml's name: F32, BF16, F16
	must(os.MkdirAll(*work, 0o755))
	root := moduleRoot()
	setup(*work)
	if *storiesRefs != "" {
		writeStoriesRefs(root, *work, *storiesRefs, *threads)
		return
	}
	specs := map[string]struct {
		name string
		spec llamatest.Spec
	}{
		"llama":    {"smollm2-135m-synthetic", llamatest.SmolLM2135M()},
		"qwen3":    {"qwen3-shaped-synthetic", llamatest.Qwen3Shaped()},
		"gemma2":   {"gemma2-shaped-synthetic", llamatest.Gemma2Shaped()},
		"gemma3":   {"gemma3-shaped-synthetic", llamatest.Gemma3Shaped()},
		"phi3":     {"phi3-shaped-synthetic", llamatest.Phi3Shaped()},
		"qwen3moe": {"qwen3moe-shaped-synthetic", llamatest.Qwen3MoEShaped()},
		"mixtral":  {"mixtral-shaped-synthetic", llamatest.MixtralShaped()},
	}
	sp, ok := specs[*arch]
	if !ok {
		log.Fatalf("-arch: %q is not llama, qwen3, gemma2, gemma3, phi3, qwen3moe or mixtral", *arch)
	}
	if (*arch == "gemma2" || *arch == "gemma3") && *window > 0 {
		sp.spec.SlidingWindow = *window
		sp.name += fmt.Sprintf("-w%d", *window)
	}
	if *arch == "phi3" && *partialRotary > 0 {
		sp.spec.PartialRotary = *partialRotary
		sp.name += fmt.Sprintf("-partial%g", *partialRotary)
	}
	if *arch == "phi3" && *longRope > 0 {
		sp.spec.LongRopeOrig = *longRope
		sp.name += fmt.Sprintf("-longrope%d", *longRope)
	}
	ckpt := filepath.Join(*work, sp.name)
	if _, err := os.Stat(filepath.Join(ckpt, "model.safetensors")); err != nil {
		log.Printf("writing the synthetic checkpoint to %s", ckpt)
		must(sp.spec.Write(ckpt))
	}
	var files []llama.FileType
	for _, t := range strings.Split(*types, ",") {
		ft := llama.FileType(strings.ToUpper(strings.TrimSpace(t)))
		if !slices.Contains(llama.FileTypes, ft) {
			log.Fatalf("-types: %q is not one of %v", t, llama.FileTypes)
		}
		files = append(files, ft)
	}
	ggufs := map[llama.FileType]string{}
	for _, ft := range files {
		p := filepath.Join(*work, sp.name+"-"+strings.ToLower(string(ft))+".gguf")
		if _, err := os.Stat(p); err != nil {
			log.Printf("writing %s", p)
			_, err := llama.WriteGGUF(ckpt, p, ft)
			must(err)
		}
		ggufs[ft] = p
	}
	if *score {
		if !runScore(*work, *threads, *scoreChunk, files, ggufs) {
			os.Exit(1)
		}
		return
	}

	if !*skipVerify {
		failed := false
		for _, ft := range files {
			ref := reference(ggufs[ft], *threads, kvdt)
			refPath := filepath.Join(*work, "ref.json")
			must(os.WriteFile(refPath, mustJSON(ref), 0o644))
			out := node(*work, *threads, "verify", "--model", ggufs[ft], "--ref", refPath, "--kv", kvName)
			fmt.Printf("%s: pdserve (%s KV) after a %d-token prompt: top %v, greedy %v\n", ft, kvName, len(ref.Prompt), ref.Top, ref.Greedy)
			fmt.Printf("%s: llama.cpp (%s KV) on the same file: %s\n", ft, kvName, strings.TrimSpace(out))
			if msg := judge(ref, lastLine(out)); msg != "" {
				fmt.Printf("%s: MISMATCH: %s\n", ft, msg)
				failed = true
			} else {
				fmt.Printf("%s: agree (top-5 probabilities within %g, %d greedy tokens identical)\n", ft, verifyTol, len(ref.Greedy))
			}
		}
		if failed {
			os.Exit(1)
		}
	}

	// Build the Go benchmark once.
	testBin := filepath.Join(*work, "llama.test")
	run(root, nil, "go", "test", "-c", "-o", testBin, "./internal/model/llama")

	type metric struct{ name, goBench, benchtime, jsKey string }
	metrics := []metric{
		{"decode, batch 1 (tok/s)", "SmolLM2/^decode-batch1$", fmt.Sprintf("%dx", *decode), "decode1_tok_s"},
		{"decode, 16 sequences (tok/s)", "SmolLM2/^decode-batch16$", fmt.Sprintf("%dx", *decode), "decode16_tok_s"},
		{"prefill, 512-token prompt (tok/s)", "SmolLM2/^prefill-512$", fmt.Sprintf("%dx", *prefillRuns), "prefill_tok_s"},
	}
	type series struct {
		a, b       [][]float64
		ca, cb     [][]float64 // CPU ms per token (all threads), pdserve and llama.cpp
		rssA, rssB []float64   // peak RSS (bytes): pdserve's batch-1 decode process, llama.cpp's perf process
	}
	res := map[llama.FileType]*series{}
	for _, ft := range files {
		n := len(metrics)
		res[ft] = &series{a: make([][]float64, n), b: make([][]float64, n), ca: make([][]float64, n), cb: make([][]float64, n)}
	}
	tokS := regexp.MustCompile(`([0-9.]+) tok/s`)
	cpuMS := regexp.MustCompile(`([0-9.]+) cpu-ms/tok`)
	for r := range *rounds {
		log.Printf("round %d: load average %s", r+1, loadAvg())
		for _, ft := range files {
			sr := res[ft]
			for i, m := range metrics {
				out, rss := runRSS(*work, []string{"GOMAXPROCS=" + strconv.Itoa(*threads)},
					testBin, "-test.run", "^$", "-test.bench", m.goBench, "-test.benchtime", m.benchtime, "-model", ggufs[ft], "-kv-dtype", kvdt.String())
				if i == 0 {
					sr.rssA = append(sr.rssA, float64(rss))
				}
				mm := tokS.FindStringSubmatch(out)
				if mm == nil {
					log.Fatalf("no tok/s in:\n%s", out)
				}
				v, _ := strconv.ParseFloat(mm[1], 64)
				sr.a[i] = append(sr.a[i], v)
				var c float64
				if mc := cpuMS.FindStringSubmatch(out); mc != nil {
					c, _ = strconv.ParseFloat(mc[1], 64)
				}
				sr.ca[i] = append(sr.ca[i], c)
				log.Printf("round %d %-6s A pdserve   %-34s %8.1f  (%.3f cpu-ms/tok)", r+1, ft, m.name, v, c)
			}
			out, rss := nodeRSS(*work, *threads, "perf", "--model", ggufs[ft], "--decode", strconv.Itoa(*decode),
				"--prefill-runs", strconv.Itoa(*prefillRuns), "--kv", kvName)
			sr.rssB = append(sr.rssB, float64(rss))
			var js map[string]float64
			must(json.Unmarshal([]byte(lastLine(out)), &js))
			for i, m := range metrics {
				sr.b[i] = append(sr.b[i], js[m.jsKey])
				c := js[strings.TrimSuffix(m.jsKey, "_tok_s")+"_cpu_ms_tok"]
				sr.cb[i] = append(sr.cb[i], c)
				log.Printf("round %d %-6s B llama.cpp %-34s %8.1f  (%.3f cpu-ms/tok)", r+1, ft, m.name, js[m.jsKey], c)
			}
		}
	}

	if *rounds == 0 {
		return
	}
	fmt.Printf("\n%d rounds interleaved, %d threads, medians; both load the same GGUF file, both with an %s KV cache\n\n", *rounds, *threads, kvName)
	fmt.Println("| weights | file | measure | pdserve | llama.cpp | pdserve/llama.cpp | pdserve runs | llama.cpp runs |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, ft := range files {
		fi, err := os.Stat(ggufs[ft])
		must(err)
		for i, m := range metrics {
			ma, mb := median(res[ft].a[i]), median(res[ft].b[i])
			fmt.Printf("| %s | %d MB | %s | %.1f | %.1f | %.2f× | %s | %s |\n", ft, fi.Size()>>20, m.name, ma, mb, ma/mb, list(res[ft].a[i]), list(res[ft].b[i]))
		}
	}
	// CPU time per token: on a loaded machine, where wall time depends on
	// what else runs. llama.cpp's includes its threads spinning at barriers
	// while another thread is descheduled; with -threads 1 neither side
	// waits for another thread.
	fmt.Printf("\nCPU milliseconds per token (user + system, all threads), medians; llama.cpp/pdserve above 1 means pdserve uses less CPU per token\n\n")
	fmt.Println("| weights | measure | pdserve | llama.cpp | llama.cpp/pdserve | pdserve runs | llama.cpp runs |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, ft := range files {
		for i, m := range metrics {
			ma, mb := median(res[ft].ca[i]), median(res[ft].cb[i])
			fmt.Printf("| %s | %s | %.3f | %.3f | %.2f× | %s | %s |\n", ft, strings.TrimSuffix(m.name, " (tok/s)"), ma, mb, mb/ma, list3(res[ft].ca[i]), list3(res[ft].cb[i]))
		}
	}
	// Resident memory: BenchmarkSmolLM2's batch-1 decode pool holds 640
	// tokens (kvcache.NewPool sizes it up front).
	fmt.Printf("\npeak RSS (MB, median of %d): pdserve's batch-1 decode process against the file + its KV pool (640 tokens, %s) + 10%%; llama.cpp's perf process (node, all three measures)\n\n", *rounds, kvName)
	fmt.Println("| weights | file | KV pool | file + pool + 10% | pdserve peak RSS | llama.cpp peak RSS | pdserve runs | llama.cpp runs |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, ft := range files {
		fi, err := os.Stat(ggufs[ft])
		must(err)
		m, err := llama.Load(ggufs[ft], llama.Options{KVDType: kvdt})
		must(err)
		pool := float64(640 * m.Info().Geometry.BytesPerToken())
		must(m.Close())
		const mb = 1 << 20
		fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.0f | %s | %s |\n", ft, fi.Size()>>20, pool/mb, (float64(fi.Size())+pool)*1.1/mb,
			median(res[ft].rssA)/mb, median(res[ft].rssB)/mb, list(scale(res[ft].rssA, 1.0/mb)), list(scale(res[ft].rssB, 1.0/mb)))
	}
}

// verifyTol bounds |Δp| between pdserve's and llama.cpp's probabilities of
// pdserve's five most likely next tokens: the bound of the stories260K
// GGUF test's tight sequences and of -score.
const verifyTol = 1e-4

// judge compares pdserve's answer with bench.mjs verify's JSON line and
// says how they disagree ("" when they agree): a top-5 probability off by
// more than verifyTol, or a greedy token that differs.
func judge(r ref, line string) string {
	var v struct {
		MaxProbDiff float64 `json:"maxProbDiff"`
		Greedy      []int32 `json:"greedy"`
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil {
		return fmt.Sprintf("bench.mjs verify printed %q: %v", line, err)
	}
	var msgs []string
	if !(v.MaxProbDiff <= verifyTol) {
		msgs = append(msgs, fmt.Sprintf("largest |Δp| of the top 5 is %.3g, want ≤ %g", v.MaxProbDiff, verifyTol))
	}
	if !slices.Equal(v.Greedy, r.Greedy) {
		msgs = append(msgs, fmt.Sprintf("greedy tokens %v, pdserve's %v", v.Greedy, r.Greedy))
	}
	return strings.Join(msgs, "; ")
}

// loadAvg is the system's 1, 5 and 15 minute load averages (Linux), or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// scale returns v multiplied by f.
func scale(v []float64, f float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = x * f
	}
	return out
}

// ref is pdserve's answer for the numerical comparison.
type ref struct {
	Prompt []int32     `json:"prompt"`
	Top    [][2]any    `json:"top"` // [id, probability]
	Greedy []int32     `json:"greedy"`
	Probs  [][]float64 `json:"-"`
}

// reference runs pdserve on a fixed prompt with a KV cache of dtype kvdt:
// the five most likely next tokens with their probabilities, and 8 greedy
// tokens.
func reference(path string, threads int, kvdt kvcache.DType) ref {
	m, err := llama.Load(path, llama.Options{Threads: threads, KVDType: kvdt})
	must(err)
	defer m.Close()
	geo := m.Info().Geometry
	pool, err := kvcache.NewPool(geo, 16, int64(256*geo.BytesPerToken()))
	must(err)
	pages, ok := pool.Alloc(4)
	if !ok {
		log.Fatal("KV pool exhausted")
	}
	prompt := make([]int32, 24)
	x := uint32(12345)
	for i := range prompt {
		x = x*1664525 + 1013904223
		prompt[i] = int32(259 + x>>8%uint32(m.Info().VocabSize-259))
	}
	ctx := context.Background()
	lg, err := m.ForwardLogits(ctx, pool, []model.SeqInput{{Pages: pages, Tokens: prompt}})
	must(err)
	V := m.Info().VocabSize
	last := lg[0][(len(prompt)-1)*V:]
	mx := slices.Max(last)
	var z float64
	for _, l := range last {
		z += math.Exp(float64(l - mx))
	}
	ids := make([]int, V)
	for i := range ids {
		ids[i] = i
	}
	slices.SortFunc(ids, func(a, b int) int {
		if last[a] != last[b] {
			if last[a] > last[b] {
				return -1
			}
			return 1
		}
		return a - b
	})
	r := ref{Prompt: prompt}
	for _, id := range ids[:5] {
		r.Top = append(r.Top, [2]any{id, math.Exp(float64(last[id]-mx)) / z})
	}
	// Greedy continuation (the prompt again, on fresh pages, through Forward).
	pages2, ok := pool.Alloc(4)
	if !ok {
		log.Fatal("KV pool exhausted")
	}
	out := make([]model.SeqOutput, 1)
	in := []model.SeqInput{{Pages: pages2, Tokens: prompt, Sample: true, Sampling: model.SamplingParams{TopP: 1}}}
	for len(r.Greedy) < 8 {
		must(m.Forward(ctx, pool, in, out))
		r.Greedy = append(r.Greedy, out[0].Token)
		in[0].Pos += len(in[0].Tokens)
		in[0].Tokens = []int32{out[0].Token}
	}
	return r
}

// setup installs the npm packages and bench.mjs into work.
func setup(work string) {
	must(os.WriteFile(filepath.Join(work, "bench.mjs"), benchMJS, 0o644))
	if _, err := os.Stat(filepath.Join(work, "node_modules", "node-llama-cpp", "package.json")); err == nil {
		return
	}
	must(os.WriteFile(filepath.Join(work, "package.json"), packageJSON, 0o644))
	log.Printf("npm i -E %s --omit=optional (in %s)", npmPackages, work)
	run(work, nil, "npm", append([]string{"i", "-E", "--omit=optional", "--no-audit", "--no-fund"}, strings.Fields(npmPackages)...)...)
}

// node runs bench.mjs with UV_THREADPOOL_SIZE=1 (libuv's pool would
// otherwise compete with llama.cpp's threads on a 2-core machine).
func node(work string, threads int, args ...string) string {
	out, _ := nodeRSS(work, threads, args...)
	return out
}

// nodeRSS is node, also returning the process's peak RSS (bytes).
func nodeRSS(work string, threads int, args ...string) (string, int64) {
	return runRSS(work, []string{"UV_THREADPOOL_SIZE=1"}, "node", append([]string{"bench.mjs", args[0], "--threads", strconv.Itoa(threads)}, args[1:]...)...)
}

func run(dir string, env []string, name string, args ...string) string {
	out, _ := runRSS(dir, env, name, args...)
	return out
}

// runRSS runs a command like run and also returns its peak resident set
// size in bytes (0 where unknown): the largest VmHWM read from
// /proc/PID/status every 20 ms while it runs. (The child's ru_maxrss is no
// use here: Go starts children with vfork, and Linux counts the parent's
// peak into a vforked child's ru_maxrss, so every child would report at
// least this process's own peak.)
func runRSS(dir string, env []string, name string, args ...string) (string, int64) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	done := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var hwm int64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			hwm = max(hwm, vmHWM(cmd.Process.Pid))
			select {
			case <-done:
				peak <- hwm
				return
			case <-tick.C:
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	hwm := <-peak
	if err != nil {
		log.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), hwm
}

// vmHWM is the peak resident set size of process pid in bytes, from
// /proc/PID/status (Linux; 0 if unreadable, e.g. once it has exited).
func vmHWM(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	must(err)
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		log.Fatal("run from inside the pdserve module")
	}
	return filepath.Dir(gomod)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func list(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.1f", x))
	}
	return strings.Join(parts, ", ")
}

func list3(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.3f", x))
	}
	return strings.Join(parts, ", ")
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	must(err)
	return b
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

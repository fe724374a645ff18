package llama_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/model/llama/llamatest"
	"github.com/pdserve/pdserve/internal/testbin"
)

// runServer starts bin with args, waits for the stdout line matching re and
// returns its first submatch (the URL). At cleanup it sends SIGINT and waits
// for a clean exit.
func runServer(t *testing.T, bin string, re *regexp.Regexp, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PDSERVE_LOG_LEVEL=warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testbin.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody is reading any more
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s exited with %v; stderr:\n%s", args[0], err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s did not stop on SIGINT", args[0])
		}
	})
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("%s exited before printing %q; stderr:\n%s", args[0], re, stderr.String())
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m[1]
			}
		case <-timeout.C:
			t.Fatalf("%s printed no line matching %q", args[0], re)
		}
	}
}

// serverCommands are the two ways a user serves a model: one colocated
// worker (`serve`), and a router with a prefill and a decode worker (`up`);
// re matches the line that gives the URL once it is ready.
var serverCommands = []struct {
	name string
	re   *regexp.Regexp
	args []string
}{
	{"serve", regexp.MustCompile(`OpenAI API (http://\S+)/v1`), []string{"serve", "--port", "0"}},
	{"up", regexp.MustCompile(`ready: accepting requests at (http://\S+)/v1`), []string{"up", "--port", "0"}},
}

// TestStories260KProcess runs the binary as a user would: `pdserve convert
// llama2c`, then `pdserve serve --model DIR` and `pdserve up --model DIR`,
// and checks the greedy continuations of the reference sequences over HTTP.
func TestStories260KProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	refs := llamatest.References(t)
	tmp := t.TempDir()
	bin := pdserve.Path(t)
	out := filepath.Join(tmp, "stories260K")
	conv, err := exec.Command(bin, "convert", "llama2c", filepath.Join(llamatest.FixtureDir(t), "stories260K.bin"), out).CombinedOutput()
	if err != nil {
		t.Fatalf("convert: %v\n%s", err, conv)
	}
	if !strings.Contains(string(conv), "dim 64, hidden 172, 5 layers, 8 heads (4 KV), vocab 512 (tied classifier)") {
		t.Errorf("convert printed %q", conv)
	}
	for _, c := range serverCommands {
		t.Run(c.name, func(t *testing.T) {
			args := append(slices.Clone(c.args), "--model", out, "--chunked-prefill-size", "64")
			url := runServer(t, bin, c.re, args...)
			checkGreedy(t, refs, completeAll(t, url, storiesRequests(refs)))
		})
	}
	// A bad checkpoint fails at startup with the loader's message.
	bad := filepath.Join(tmp, "bad")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	msg, err := exec.Command(bin, "serve", "--port", "0", "--model", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "neither model.safetensors nor model.safetensors.index.json") {
		t.Errorf("serve with a checkpoint without weights: %v, output %q", err, msg)
	}
	msg, err = exec.Command(bin, "serve", "--model", filepath.Join(tmp, "missing")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("serve --model missing-dir: %v (want exit status 2), output %q", err, msg)
	}
}

// TestGGUFProcess runs the binary on a file of each architecture beyond
// llama as a user would: `pdserve convert gguf --type q4_k_m` of a
// checkpoint in Hugging Face's layout — Qwen3-shaped (qwen3Narrow),
// Qwen3-MoE-shaped (qwen3MoENarrow: mlp.gate and
// mlp.experts.E.{gate,up,down}_proj), Mixtral-shaped (mixtralNarrow:
// block_sparse_moe.gate and block_sparse_moe.experts.E.w1/w2/w3, written as
// llama.cpp's llama with experts), Gemma-3- and Phi-3-shaped (those of
// TestSyntheticGemma3PD and TestSyntheticPhi3PD) — then `pdserve serve
// --model FILE.gguf` and `pdserve up --model FILE.gguf` (a prefill and a
// decode worker), and checks over HTTP that the disaggregated answers to 20
// greedy and seeded sampled requests equal the colocated ones token for
// token.
func TestGGUFProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := pdserve.Path(t)
	for _, c := range []struct {
		name string
		spec llamatest.Spec
	}{{"qwen3", qwen3Narrow()}, {"qwen3moe", qwen3MoENarrow()}, {"mixtral", mixtralNarrow()}, {"gemma3", gemma3Narrow()}, {"phi3", phi3Narrow()}} {
		t.Run(c.name, func(t *testing.T) {
			if raceEnabled && c.name != "qwen3" {
				// The processes are the same code on every architecture;
				// CI runs them all without the race detector (.ci/run).
				t.Skip("one architecture under the race detector")
			}
			t.Parallel()
			convertServeCompare(t, bin, c.name, c.spec)
		})
	}
}

// convertServeCompare converts spec's checkpoint to a Q4_K_M GGUF file with
// the binary bin, serves it colocated (serve) and disaggregated (up), and
// compares their answers to mixedRequests token for token.
func convertServeCompare(t *testing.T, bin, name string, spec llamatest.Spec) {
	t.Helper()
	tmp := t.TempDir()
	ckpt := filepath.Join(tmp, name+"-shaped")
	if err := spec.Write(ckpt); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, name+"-shaped-q4_k_m.gguf")
	if conv, err := exec.Command(bin, "convert", "gguf", ckpt, file, "--type", "q4_k_m").CombinedOutput(); err != nil {
		t.Fatalf("convert: %v\n%s", err, conv)
	}
	const maxTokens = 8
	reqs := mixedRequests(spec.Vocab, maxTokens)
	answers := map[string][][]int32{}
	for _, c := range serverCommands {
		t.Run(c.name, func(t *testing.T) {
			args := append(slices.Clone(c.args), "--model", file, "--chunked-prefill-size", "32")
			answers[c.name] = completeAll(t, runServer(t, bin, c.re, args...), reqs)
		})
	}
	if len(answers) == 2 {
		comparePD(t, reqs, answers["serve"], answers["up"], maxTokens)
	}
}

// Package readme runs the shell blocks of the repository's README.md, in
// order, in one shell, as someone pasting them into a fresh terminal would,
// against a freshly built pdserve, and checks the outputs the README says
// they print: the README cannot drift from what pdserve does.
//
// The README marks what the test reads:
//
//   - every ```sh block runs, except one right after a line
//     <!-- readme-test: skip (reason) --> (a block that needs what a test
//     machine lacks, a downloaded model, or that runs the test suite);
//   - a line "# expect: TEXT" in a block asserts that TEXT is in what the
//     block printed since the previous expect (or the block's start);
//   - `go build -o pdserve ./cmd/pdserve` is the test's own build: the shell
//     runs in a fresh directory where ./pdserve is the built binary (and
//     the stories260K checkpoint is at its repository path);
//   - the ports the README names (8000, 8080, 8998, 30000, 30001) become
//     free ports (8000, the default --port, through PDSERVE_PORT too), and
//     /tmp/ the test's directory, so that the run collides with nothing on
//     the machine.
//
// Every block must stop the servers it starts: once the shell has exited,
// no process of its group may be left (then the test kills them all).
package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/testbin"
)

var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

func TestMain(m *testing.M) { goleak.VerifyTestMain(pdserve.RemovingAfter(m)) }

// block is one fenced ```sh block of the README.
type block struct {
	line int    // the line of its opening fence (1-based)
	text string // its lines, without the fences
	skip string // the reason of a readme-test: skip mark; "" runs it
}

var skipMark = regexp.MustCompile(`^<!-- readme-test: skip \((.+)\) -->$`)

// parseBlocks returns the ```sh blocks of a Markdown text, in order.
func parseBlocks(md string) ([]block, error) {
	var blocks []block
	var cur *block
	prev := ""
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case cur != nil && strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		case l == "```sh":
			cur = &block{line: n}
			if m := skipMark.FindStringSubmatch(prev); m != nil {
				cur.skip = m[1]
			}
		}
		prev = l
	}
	if cur != nil {
		return nil, fmt.Errorf("the block of line %d is not closed", cur.line)
	}
	return blocks, sc.Err()
}

const (
	buildLine = "go build -o pdserve ./cmd/pdserve"
	markBlock = "@@readme-block@@"
	markCheck = "@@readme-expect@@"
)

var (
	readmePorts = regexp.MustCompile(`\b(8000|8080|8998|30000|30001)\b`)
	expectLine  = regexp.MustCompile(`^\s*# expect: (.+)$`)
)

// expectation is one "# expect:" line: TEXT, its line, its block and the
// segment of that block's output it checks (consecutive expect lines check
// the same one).
type expectation struct {
	block, seg, line int
	text             string
}

// script turns the blocks into one shell script for dir: a marker echoed
// before each block and at each expect line, ports and /tmp/ replaced. It
// returns the script, the expectations in order and the blocks run.
func script(t *testing.T, blocks []block, dir string) (string, []expectation, []block) {
	// 8000 is also the default --port of up, router and serve: the shell
	// gets it as PDSERVE_PORT.
	ports := map[string]string{"8000": strconv.Itoa(testbin.FreePort(t))}
	var sb strings.Builder
	fmt.Fprintf(&sb, "export PDSERVE_PORT=%s\n", ports["8000"])
	var exps []expectation
	var run []block
	for _, b := range blocks {
		if b.skip != "" {
			t.Logf("README line %d: skipped (%s)", b.line, b.skip)
			continue
		}
		run = append(run, b)
		fmt.Fprintf(&sb, "echo %s\n", markBlock)
		seg, expecting := 0, false
		for i, l := range strings.Split(strings.TrimSuffix(b.text, "\n"), "\n") {
			if m := expectLine.FindStringSubmatch(l); m != nil {
				if !expecting {
					fmt.Fprintf(&sb, "echo %s\n", markCheck)
					seg++
				}
				exps = append(exps, expectation{block: len(run) - 1, seg: seg - 1, line: b.line + 1 + i, text: m[1]})
				expecting = true
				continue
			}
			expecting = false
			if strings.TrimSpace(l) == buildLine {
				sb.WriteString(": the test built ./pdserve\n")
				continue
			}
			if strings.HasPrefix(strings.TrimSpace(l), "go ") {
				t.Fatalf("README line %d runs %q: a block the test runs may build pdserve only with %q (or mark it readme-test: skip)",
					b.line+1+i, l, buildLine)
			}
			l = readmePorts.ReplaceAllStringFunc(l, func(p string) string {
				if ports[p] == "" {
					ports[p] = strconv.Itoa(testbin.FreePort(t))
				}
				return ports[p]
			})
			sb.WriteString(strings.ReplaceAll(l, "/tmp/", dir+"/") + "\n")
		}
	}
	fmt.Fprintf(&sb, "echo %s\n", markBlock)
	return sb.String(), exps, run
}

// TestREADME runs the README's shell blocks in order and checks every
// expect line.
func TestREADME(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the README's blocks need %s: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseBlocks(string(md))
	if err != nil {
		t.Fatal(err)
	}
	bin := pdserve.Path(t)
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "pdserve")); err != nil {
		t.Fatal(err)
	}
	const stories = "internal/model/llama/testdata/stories260K"
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, stories)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, stories), filepath.Join(dir, stories)); err != nil {
		t.Fatal(err)
	}
	sh, exps, run := script(t, blocks, dir)
	if len(run) < 5 || len(exps) < 5 {
		t.Fatalf("the README has %d blocks to run and %d expect lines; want at least 5 of each", len(run), len(exps))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", sh)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PDSERVE_LOG_LEVEL=warn")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The shell's group holds every server it starts: killing it stops
	// them all, whatever the script did.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	runErr := cmd.Wait()
	out := stdout.String()
	// Which block was running: the number of block markers printed.
	outs := strings.Split(out, markBlock+"\n")
	if runErr != nil {
		i := max(len(outs)-2, 0)
		t.Fatalf("README block of line %d failed: %v (context: %v)\nits output:\n%s\nstderr:\n%s",
			run[min(i, len(run)-1)].line, runErr, ctx.Err(), outs[len(outs)-1], lastLines(stderr.String(), 40))
	}
	if len(outs) != len(run)+2 {
		t.Fatalf("%d block markers, want %d; output:\n%s", len(outs)-1, len(run)+1, out)
	}
	if err := syscall.Kill(-pgid, 0); err != syscall.ESRCH {
		t.Errorf("processes of the README's shell still run after it exited (kill(-pgid, 0): %v): a block left a server running", err)
	}
	// Each block's output, split at its expect markers.
	for _, e := range exps {
		segs := strings.Split(outs[e.block+1], markCheck+"\n")
		if !strings.Contains(segs[e.seg], e.text) {
			t.Errorf("README line %d expects %q; the commands before it printed:\n%s", e.line, e.text, segs[e.seg])
		}
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", lastLines(stderr.String(), 40))
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(len(ls)-n, 0):], "\n")
}

// TestParseBlocks checks the reading of a README: sh blocks only, skip
// marks on the line before a fence.
func TestParseBlocks(t *testing.T) {
	md := "text\n```sh\na\nb\n```\n```json\n{}\n```\n<!-- readme-test: skip (needs etcd) -->\n```sh\nc\n```\n"
	got, err := parseBlocks(md)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{line: 2, text: "a\nb\n"}, {line: 10, text: "c\n", skip: "needs etcd"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseBlocks = %+v, want %+v", got, want)
	}
	if _, err := parseBlocks("```sh\na\n"); err == nil {
		t.Error("an unclosed block was accepted")
	}
}

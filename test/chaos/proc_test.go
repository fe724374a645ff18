package chaos

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
)

// pdserve is the binary under test, built on first use and removed by
// TestMain.
var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

// pdserveBinary returns the path of the built pdserve binary.
func pdserveBinary(t *testing.T) string { return pdserve.Path(t) }

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int { return testbin.FreePort(t) }

// proc is a running pdserve process.
type proc struct{ *testbin.Proc }

// startProc starts the pdserve binary with args.
func startProc(bin, name string, args ...string) (*proc, error) {
	p, err := testbin.Start(nil, bin, name, nil, args...)
	if err != nil {
		return nil, err
	}
	return &proc{p}, nil
}

// waitLine waits until a stdout line matches re and returns its first
// submatch (or the whole match).
func (p *proc) waitLine(re *regexp.Regexp, timeout time.Duration) (string, error) {
	return p.WaitLine(re, timeout)
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *proc) kill() { p.Kill() }

var readyLine = regexp.MustCompile(`^ready$`)

// simFlags are the model flags of every chaos process: the small KV shape
// of the in-process test; decodeMS is the decode step time.
func simFlags(decodeMS float64) []string {
	return []string{"--sim-layers", strconv.Itoa(simGeometry.Layers), "--sim-kv-heads", strconv.Itoa(simGeometry.KVHeads),
		"--sim-head-dim", strconv.Itoa(simGeometry.HeadDim), "--sim-dtype", simGeometry.DType.String(),
		"--sim-context-len", strconv.Itoa(simContext),
		"--sim-prefill-ms-per-token", "0.02", "--sim-decode-ms-per-step", strconv.FormatFloat(decodeMS, 'f', -1, 64)}
}

// procWorker is one worker (or router, or reference) process position:
// fixed ports and arguments, a new process on every restart.
type procWorker struct {
	name   string
	role   string // prefill, decode, router, serve
	port   int
	kvPort int
	args   []string
	life   int
	p      *proc
}

// url is the process's HTTP base URL.
func (w *procWorker) url() string { return fmt.Sprintf("http://127.0.0.1:%d", w.port) }

// procSet owns the processes of a test and kills them all at cleanup.
type procSet struct {
	t   *testing.T
	bin string

	mu    sync.Mutex
	procs []*proc
}

// newProcSet builds the pdserve binary (once) and returns an empty set
// whose processes are killed at t's cleanup.
func newProcSet(t *testing.T) *procSet {
	ps := &procSet{t: t, bin: pdserveBinary(t)}
	t.Cleanup(func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, p := range ps.procs {
			p.kill()
		}
	})
	return ps
}

// worker declares a process position of role with its arguments (the
// host, ports and role are added here).
func (ps *procSet) worker(name, role string, args ...string) *procWorker {
	w := &procWorker{name: name, role: role, port: freePort(ps.t)}
	w.args = append([]string{role, "--host", "127.0.0.1", "--port", strconv.Itoa(w.port)}, args...)
	if role == "prefill" {
		w.kvPort = freePort(ps.t)
		w.args = append(w.args, "--kv-port", strconv.Itoa(w.kvPort))
	}
	return w
}

// start starts w's process and waits for its "ready" line.
func (ps *procSet) start(w *procWorker) error {
	p, err := startProc(ps.bin, fmt.Sprintf("%s#%d", w.name, w.life), w.args...)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	ps.procs = append(ps.procs, p)
	ps.mu.Unlock()
	w.p = p
	if _, err := p.waitLine(readyLine, 30*time.Second); err != nil {
		p.kill()
		return err
	}
	return nil
}

// restart starts w again on the same ports; a port of the killed process
// may take a moment to be free again, so it retries for a few seconds.
func (ps *procSet) restart(w *procWorker) error {
	w.life++
	var err error
	if _, ok := waitUntil(5*time.Second, func() (bool, string) {
		err = ps.start(w)
		return err == nil, fmt.Sprint(err)
	}); !ok {
		return err
	}
	return nil
}

// mustStart starts w or fails the test.
func (ps *procSet) mustStart(w *procWorker) {
	ps.t.Helper()
	if err := ps.start(w); err != nil {
		ps.t.Fatal(err)
	}
}

// describeProc is a process's stderr tail, for failure messages.
func describeProc(w *procWorker) string {
	if w.p == nil {
		return ""
	}
	s := w.p.Stderr()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return fmt.Sprintf("  %s stderr:\n%s", w.p.Name, strings.TrimRight(s, "\n"))
}

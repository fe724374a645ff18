// Package testbin builds a command of this module once per test binary (and
// links it once per build cache), for tests that run it as processes, and runs those processes: their output
// kept, stopped by signal, waited for with a deadline. A test binary built
// with the race detector builds the command with it too (see RaceEnabled).
package testbin

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary is a command built on first use.
type Binary struct {
	pkg  string
	once sync.Once
	dir  string
	path string
	err  error
}

// New returns a Binary for the main package pkg (an import path); nothing is
// built until Path.
func New(pkg string) *Binary { return &Binary{pkg: pkg} }

// Path builds the command (once), with -race when the test binary has the
// race detector, and returns the executable's path. The executable is the
// one `go run` keeps in the build cache (Go 1.24 and later cache what it
// links), so the test packages of one `go test ./...` link it once between
// them instead of once each (a race-instrumented pdserve takes seconds of
// CPU to link); without a usable build cache it is built with `go build -o`
// into a temporary directory. A failed build fails t, with the compiler's
// output.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		if b.path = cachedExecutable(b.pkg); b.path != "" {
			return
		}
		b.dir, b.err = os.MkdirTemp("", "pdserve-test-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, filepath.Base(b.pkg))
		args := []string{"build", "-o", b.path}
		if RaceEnabled {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, b.pkg)...).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// cachedExecutable returns the path of pkg's executable in the build cache,
// or "" when there is none to be had (a build error is left for `go build`
// to report). `go run -exec echo` prints the path it would run instead of
// running it: a freshly linked executable is printed from a temporary
// directory that is gone once `go run` exits (and is in the cache from
// then on), so a second call prints the cached one.
func cachedExecutable(pkg string) string {
	args := []string{"run"}
	if RaceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "-exec", "echo", pkg)
	for range 2 {
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			return ""
		}
		path := strings.TrimSpace(string(out))
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && filepath.IsAbs(path) {
			return path
		}
	}
	return ""
}

// TestingM is the one method of testing.M that goleak.VerifyTestMain calls.
type TestingM interface{ Run() int }

// RemovingAfter wraps m so that Run, once every test has run, deletes the
// built executable: goleak.VerifyTestMain(bin.RemovingAfter(m)) in TestMain.
func (b *Binary) RemovingAfter(m TestingM) TestingM { return removingAfter{b, m} }

type removingAfter struct {
	b *Binary
	m TestingM
}

func (r removingAfter) Run() int {
	defer r.b.Remove()
	return r.m.Run()
}

// Remove deletes the built executable, if any; call it once every test that
// runs it has ended (from TestMain).
func (b *Binary) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// DefaultParallel sets -test.parallel to n unless the command line set it:
// for a package whose tests wait on processes and timers far more than they
// compute, so that more of them overlap than GOMAXPROCS allows. Call it from
// TestMain after flag.Parse.
func DefaultParallel(n int) error {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if set {
		return nil
	}
	return flag.Set("test.parallel", strconv.Itoa(n))
}

// Proc is a running process of a built command: its stdout lines are kept
// (for WaitLine), the tail of its stderr too (for failure messages).
type Proc struct {
	// Name names the process in messages (e.g. "prefill#2").
	Name   string
	cmd    *exec.Cmd
	stderr *tail
	exited chan struct{} // closed once the process was waited for
	err    error         // Wait's result, set before exited closes

	mu    sync.Mutex
	lines []string
}

// Start runs bin with args and PDSERVE_LOG_LEVEL=warn added to the
// environment (and env, KEY=VALUE entries, after it). The caller must Stop
// or Kill it; Cleanup does, if t is given.
func Start(t testing.TB, bin, name string, env []string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PDSERVE_LOG_LEVEL=warn")
	if RaceEnabled {
		// A data race ends the process (exit status 66, the report on
		// stderr) instead of a line nobody reads: the test fails.
		cmd.Env = append(cmd.Env, "GORACE=halt_on_error=1")
	}
	cmd.Env = append(cmd.Env, env...)
	p := &Proc{Name: name, cmd: cmd, stderr: &tail{max: 64 << 10}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if t != nil {
		t.Cleanup(func() {
			p.Kill()
			if p.stderr.sawRace() {
				t.Errorf("%s: the race detector reported a data race; stderr:\n%s", p.Name, p.Stderr())
			}
		})
	}
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and was reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error (nil for exit status 0); valid once
// Exited is closed.
func (p *Proc) Err() error {
	<-p.exited
	return p.err
}

// Stderr returns the last 64 KiB the process wrote to stderr.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Lines returns the stdout lines so far.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// WaitLine waits until a stdout line matches re and returns its last
// submatch (the whole match if re has no group). It fails if the process
// exits first or timeout passes, with the stderr tail in the error.
func (p *Proc) WaitLine(re *regexp.Regexp, timeout time.Duration) (string, error) {
	var found string
	matched := false
	state, _ := WaitUntil(timeout, func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				found, matched = m[len(m)-1], true
				return true, ""
			}
		}
		select {
		case <-p.exited:
			return true, "process exited"
		default:
		}
		return false, fmt.Sprintf("%d lines so far", len(p.lines))
	})
	if !matched {
		return "", fmt.Errorf("%s: no line matching %q within %s (%s); stderr:\n%s", p.Name, re, timeout, state, p.Stderr())
	}
	return found, nil
}

// Signal sends sig to the process (a no-op once it exited).
func (p *Proc) Signal(sig os.Signal) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends sig (SIGINT or SIGTERM) and waits up to timeout for the
// process to exit; it returns the exit error, or an error if it did not
// exit in time (it is then killed).
func (p *Proc) Stop(sig os.Signal, timeout time.Duration) error {
	if err := p.Signal(sig); err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		if p.err != nil {
			return fmt.Errorf("%s exited with %v after %v; stderr:\n%s", p.Name, p.err, sig, p.Stderr())
		}
		return nil
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not exit within %s of %v; stderr:\n%s", p.Name, timeout, sig, p.Stderr())
	}
}

// Kill sends SIGKILL and waits for the process to be reaped. It is
// idempotent.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Buffer collects what is written to it (a process's output, a logger's
// lines), safe for concurrent writers and readers. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// tail keeps the last max bytes written to it, and whether a race
// detector's report went through it.
type tail struct {
	mu   sync.Mutex
	max  int
	b    []byte
	race bool
}

// raceWarning starts every report of the race detector.
const raceWarning = "WARNING: DATA RACE"

// Write keeps the end of b; it never fails.
func (w *tail) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, b...)
	if !w.race {
		// The kept tail, not b alone: a report may arrive in pieces.
		from := max(0, len(w.b)-len(b)-len(raceWarning))
		w.race = bytes.Contains(w.b[from:], []byte(raceWarning))
	}
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(b), nil
}

func (w *tail) sawRace() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.race
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// WaitUntil checks cond every 10 ms until it holds or timeout passes, and
// returns the last state cond described and whether it held.
func WaitUntil(timeout time.Duration, cond func() (bool, string)) (string, bool) {
	deadline := time.Now().Add(timeout)
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	for {
		ok, state := cond()
		if ok {
			return state, true
		}
		if time.Now().After(deadline) {
			return state, false
		}
		<-tk.C
	}
}

// FreePort returns a loopback port that was free a moment ago, for a
// process to bind — and bind again after a restart.
//
// The port is drawn at random from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, 32768–60999 by default): a port
// from inside it could be handed, between this check and the process's
// bind, to any outgoing connection on the machine (another test's client,
// say) as its local port, and the process would fail with "address already
// in use". Ports below the range are never handed out by the kernel, so
// only another caller choosing the same port at random can collide. Where
// no such port can be found, it falls back to a port the kernel picks.
func FreePort(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	const floor = 10000 // above well-known and most registered services
	for range 64 {
		if lo <= floor+1000 {
			break
		}
		port := floor + rand.IntN(lo-floor)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return port
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// ephemeralLow is the first port of the kernel's ephemeral range, or
// Linux's default (32768) where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= 0 {
		return 32768
	}
	return lo
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

// TestVersion: --version and the version command print one line naming
// the binary's version and Go toolchain.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := runArgs(t, nil, args...)
		want := regexp.MustCompile(`^pdserve \S+ \(commit [^)]+\) ` + regexp.QuoteMeta(runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) + "\n$")
		if code != 0 || !want.MatchString(out) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want a line matching %s", args, code, out, errOut, want)
		}
	}
}

func TestFormatVersion(t *testing.T) {
	stamped := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/pdserve/pdserve", Version: "v0.0.0-20261206152649-f12913e4c344+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "f12913e4c344d6bbd0e095adb1281e7083d538f3"},
			{Key: "vcs.time", Value: "2026-12-06T15:26:49Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	cases := []struct {
		name     string
		override string
		bi       *debug.BuildInfo
		want     string
	}{
		{"go build in a checkout", "", stamped,
			"pdserve v0.0.0-20261206152649-f12913e4c344+dirty (commit f12913e4c344d6bbd0e095adb1281e7083d538f3, 2026-12-06T15:26:49Z, modified) go1.26.0 linux/amd64"},
		{"set at link time", "v1.2.3", stamped,
			"pdserve v1.2.3 (commit f12913e4c344d6bbd0e095adb1281e7083d538f3, 2026-12-06T15:26:49Z, modified) go1.26.0 linux/amd64"},
		{"set at link time, no version control (docker build)", "142f728", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"pdserve 142f728 go1.26.0 linux/amd64"},
		{"no version control", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"pdserve (devel) (commit unknown: built without version control information) go1.26.0 linux/amd64"},
		{"no build information", "", nil,
			"pdserve (devel) (commit unknown: built without version control information) go1.26.0 linux/amd64"},
	}
	for _, tc := range cases {
		if got := formatVersion(tc.override, tc.bi, "go1.26.0", "linux/amd64"); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestUpRefusesTakenPort: a port of `up` that is already taken fails it
// before any worker starts, naming the port.
func TestUpRefusesTakenPort(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	cases := []struct {
		name string
		args []string
		what string
	}{
		{"router port", []string{"up", "--port", strconv.Itoa(taken)}, "the router's --port"},
		// Worker 1, the decode worker, takes base+1.
		{"worker port", []string{"up", "--port", "0", "--worker-port-base", strconv.Itoa(taken - 1)}, "decode worker 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "worker port" && taken > 65535-65 {
				t.Skipf("port %d leaves no room for the worker ports above it", taken)
			}
			args := append(tc.args, "--kv-cache-memory", "64MiB", "--sim-layers", "2")
			code, out, errOut := runArgs(t, nil, args...)
			want := fmt.Sprintf("port %d (%s", taken, tc.what)
			if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(errOut, "already in use") {
				t.Fatalf("exit %d, stderr %q; want exit 1 and %q ... already in use", code, errOut, want)
			}
			// Nothing started: no worker logged, nothing printed.
			if out != "" || strings.Contains(errOut, "level=") {
				t.Errorf("something started before the port was checked: stdout %q, stderr %q", out, errOut)
			}
		})
	}
	code, _, errOut := runArgs(t, nil, "up", "--port", "30001", "--worker-port-base", "30000")
	if code != 2 || !strings.Contains(errOut, "port 30001 is both the router's --port and decode worker 0") {
		t.Errorf("router port on a worker's port: exit %d, stderr %q; want exit 2 naming both", code, errOut)
	}
}

// lines is an io.Writer safe for concurrent use that reports the first
// line containing a given text.
type lines struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	match string
	found chan string // receives the first line containing match
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.found != nil {
		for _, line := range strings.Split(l.buf.String(), "\n") {
			if strings.Contains(line, l.match) {
				l.found <- line
				l.found = nil
				break
			}
		}
	}
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestUpCleanShutdownLogsNoWarning: `up` that serves a request and is then
// stopped (the first Ctrl-C: drain, then shut down) logs no warning: its
// workers stop in turn, and the KV connection one of them closes is no loss
// to the other.
func TestUpCleanShutdownLogsNoWarning(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ready := make(chan string, 1)
	stdout := &lines{match: "ready: accepting requests at ", found: ready}
	var stderr lines
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"up", "--port", "0", "--kv-cache-memory", "64MiB", "--sim-layers", "2"}, env(nil), stdout, &stderr)
	}()
	select {
	case line := <-ready:
		base := strings.TrimSuffix(strings.TrimPrefix(line, "ready: accepting requests at "), "/v1")
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt": "Hello, disaggregated world", "max_tokens": 8, "ignore_eos": true}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s %s", resp.Status, body)
		}
	case code := <-done:
		t.Fatalf("up exited %d before ready: stdout %q, stderr %q", code, stdout.String(), stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("up not ready after a minute: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after a clean shutdown: stderr %q", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("up still running a minute after its context ended")
	}
	logs := stderr.String()
	if !strings.Contains(logs, `msg="kv peer up"`) || !strings.Contains(logs, "msg=drained") {
		t.Fatalf("the log lacks the KV connection or the drain:\n%s", logs)
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("clean shutdown logged: %s", l)
		}
	}
}

// TestFlagUsagesStateOneDefault: a flag's help names its default once, so a
// usage text says "default" only for a flag whose default pflag does not
// print (an empty or false one).
func TestFlagUsagesStateOneDefault(t *testing.T) {
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			checked++
			one := pflag.NewFlagSet("", pflag.ContinueOnError)
			one.AddFlag(f)
			printed := fmt.Sprintf(" (default %s)", f.DefValue)
			if f.Value.Type() == "string" {
				printed = fmt.Sprintf(" (default %q)", f.DefValue)
			}
			line := strings.TrimRight(one.FlagUsages(), "\n ")
			if strings.HasSuffix(line, printed) && strings.Contains(strings.ToLower(f.Usage), "default") {
				t.Errorf("%s --%s names its default twice:\n%s", c.CommandPath(), f.Name, line)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(context.Background(), env(nil), io.Discard, io.Discard))
	if checked < 100 {
		t.Fatalf("checked %d flags: the walk missed commands", checked)
	}
}

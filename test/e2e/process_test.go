package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
)

// pdserve is the binary under test, built on first use and removed by
// TestMain.
var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

// pdserveBinary returns the path of the built pdserve binary.
func pdserveBinary(t *testing.T) string { return pdserve.Path(t) }

// proc is a pdserve process of a test.
type proc struct{ *testbin.Proc }

// startProc starts pdserve with args; the test's cleanup kills it if it
// is still running.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p, err := testbin.Start(t, pdserveBinary(t), args[0], nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return &proc{p}
}

// waitLine returns the first submatch of the first stdout line matching re.
func (p *proc) waitLine(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	s, err := p.WaitLine(re, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stop sends SIGINT and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.Stop(syscall.SIGINT, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

var readyRE = regexp.MustCompile(`^ready: accepting requests at (http://\S+)/v1$`)

// TestProcessUp builds the binary, runs `pdserve up` on a free port, sends a
// request the way curl would, and stops it with SIGINT.
func TestProcessUp(t *testing.T) {
	t.Parallel()
	p := startProc(t, "up", "--port", "0", "--kv-cache-memory", "128MiB", "--sim-layers", "4")
	base := p.waitLine(t, readyRE, 60*time.Second)
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"pdserve-sim","prompt":"Hello from curl","max_tokens":12,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c := decodeCompletion(t, body)
	if resp.StatusCode != http.StatusOK || len(c.Choices) != 1 || c.Usage.PromptTokens != len("Hello from curl") {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	p.stop(t)
}

// TestProcessRoles runs prefill, decode and router as separate processes,
// wired by URL as a user would, and serves one chat request through them.
func TestProcessRoles(t *testing.T) {
	t.Parallel()
	common := []string{"--port", "0", "--kv-cache-memory", "64MiB", "--sim-layers", "2"}
	workerRE := regexp.MustCompile(`worker API (http://[0-9.:]+)`)
	pre := startProc(t, append([]string{"prefill", "--kv-port", "0"}, common...)...)
	preURL := pre.waitLine(t, workerRE, 60*time.Second)
	dec := startProc(t, append([]string{"decode"}, common...)...)
	decURL := dec.waitLine(t, workerRE, 60*time.Second)
	rt := startProc(t, "router", "--port", "0", "--sim-layers", "2", "--prefill", preURL, "--decode", decURL)
	routerURL := rt.waitLine(t, regexp.MustCompile(`router: (http://[0-9.:]+)/v1`), 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var status int
	var body []byte
	waitFor(t, 20*time.Second, "router serving", func() (bool, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, routerURL+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
		return status == http.StatusOK, fmt.Sprintf("%d %s", status, body)
	})
	for _, p := range []*proc{rt, dec, pre} {
		p.stop(t)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}

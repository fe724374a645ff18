// Package security runs pdserve as processes with its authentication on and
// attacks it the way a stranger on the network would: no key, a wrong key,
// a KV client without the secret or the certificate, forged worker API
// calls; and drives the TLS front door with the official openai-go client,
// through a certificate reload.
package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/internal/testbin"
)

var pdserve = testbin.New("github.com/pdserve/pdserve/cmd/pdserve")

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests mostly wait on servers, certificate reloads and deadlines:
	// four run at a time instead of GOMAXPROCS (unless -parallel says
	// otherwise).
	if err := testbin.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(cleanupM{m})
}

type cleanupM struct{ m *testing.M }

func (c cleanupM) Run() int {
	// The tests' plain clients keep idle keep-alive connections.
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	return pdserve.RemovingAfter(c.m).Run()
}

// small keeps the simulated model's KV small, so processes start fast.
var small = []string{"--sim-layers", "2", "--kv-cache-memory", "64MiB"}

// start runs pdserve with args (and small); the test's cleanup stops it.
func start(t *testing.T, name string, args ...string) *testbin.Proc {
	t.Helper()
	extra := small
	if args[0] == "router" {
		extra = small[:2] // the router holds no KV
	}
	p, err := testbin.Start(t, pdserve.Path(t), name, nil, append(args, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitLine(t *testing.T, p *testbin.Proc, re *regexp.Regexp) string {
	t.Helper()
	s, err := p.WaitLine(re, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stop(t *testing.T, p *testbin.Proc) {
	t.Helper()
	if err := p.Stop(syscall.SIGINT, 30*time.Second); err != nil {
		t.Errorf("%s: %v", p.Name, err)
	}
}

var (
	readyRE  = regexp.MustCompile(`^ready: accepting requests at (https?://\S+)/v1$`)
	workerRE = regexp.MustCompile(`worker API (https?://[^\s,]+)`)
	kvRE     = regexp.MustCompile(`KV channel (\S+)`)
)

// tlsClient is an HTTP client that trusts pool (nil: the system's) and
// presents certs, if any.
func tlsClient(t *testing.T, pool *x509.CertPool, certs ...tls.Certificate) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// do sends a request with an optional bearer key and returns status, WWW-Authenticate and body.
func do(t *testing.T, c *http.Client, method, url, key, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// metric returns the value of the series named by the exposition line
// prefix (name{labels sorted}) on base/metrics, or -1 if absent.
func metric(t *testing.T, c *http.Client, base, series string) float64 {
	t.Helper()
	_, _, body := do(t, c, "GET", base+"/metrics", "", "")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// waitMetric waits until series reaches want.
func waitMetric(t *testing.T, c *http.Client, base, series string, want float64) {
	t.Helper()
	if last, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		v := metric(t, c, base, series)
		return v >= want, fmt.Sprint(v)
	}); !ok {
		t.Fatalf("%s on %s is %s, want %v", series, base, last, want)
	}
}

const completion = `{"prompt": "locked doors", "max_tokens": 8, "temperature": 0}`

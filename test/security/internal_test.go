package security

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/auth"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/tcp"
	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/tlsconf"
	"github.com/pdserve/pdserve/internal/tlsconf/tlstest"
)

var routerRE = regexp.MustCompile(`^pdserve router: (https?://\S+)/v1 `)

// fleet is a router with one prefill and one decode worker, as processes.
type fleet struct {
	router, prefill, decode string // base URLs
	kv                      string // prefill's KV address
	procs                   []*testbin.Proc
}

// startFleet starts prefill, decode and a router with the same extra
// flags (workerArgs on the workers, routerArgs on the router).
func startFleet(t *testing.T, workerArgs, routerArgs []string) *fleet {
	t.Helper()
	f := &fleet{}
	pre := start(t, "prefill", append([]string{"prefill", "--port", "0", "--kv-port", "0", "--sim-decode-ms-per-step", "5"}, workerArgs...)...)
	f.prefill = waitLine(t, pre, workerRE)
	f.kv = waitLine(t, pre, kvRE)
	dec := start(t, "decode", append([]string{"decode", "--port", "0", "--sim-decode-ms-per-step", "5"}, workerArgs...)...)
	f.decode = waitLine(t, dec, workerRE)
	r := start(t, "router", append([]string{"router", "--port", "0", "--prefill", f.prefill, "--decode", f.decode}, routerArgs...)...)
	f.router = waitLine(t, r, routerRE)
	waitLine(t, r, regexp.MustCompile(`^ready$`))
	f.procs = []*testbin.Proc{r, dec, pre}
	return f
}

func (f *fleet) stop(t *testing.T) {
	for _, p := range f.procs {
		stop(t, p)
	}
}

// kvHandler records the fate of a KV client's connection.
type kvHandler struct {
	mu   sync.Mutex
	up   bool
	lost chan error
}

func (h *kvHandler) PeerUp(kvxfer.PeerID, string) { h.mu.Lock(); h.up = true; h.mu.Unlock() }

func (h *kvHandler) HandleMessage(kvxfer.PeerID, kvxfer.Message) {}

func (h *kvHandler) PeerLost(_ kvxfer.PeerID, err error) { h.lost <- err }

// kvAttempt connects a KV client configured by cfg to addr and returns why
// its connection ended (it is closed right away if it came up).
func kvAttempt(t *testing.T, addr string, cfg tcp.Config) (bool, error) {
	t.Helper()
	h := &kvHandler{lost: make(chan error, 1)}
	cfg.Handler = h
	cfg.HandshakeTimeout = 5 * time.Second
	b := tcp.New(cfg)
	defer b.Close()
	b.Connect(addr)
	select {
	case err := <-h.lost:
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.up, err
	case <-time.After(10 * time.Second):
		// The refusal is bounded by HandshakeTimeout; this is the test's own bound.
		t.Fatal("the KV connection neither failed nor was refused within 10s")
	}
	return false, nil
}

const fleetSecret = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-test-fleet-secret"

// TestInternalSecret: with --internal-secret on every process, requests
// flow; a KV client without the secret, with a wrong one, or speaking
// garbage is refused, counted by reason, and the prefill worker goes on
// serving; a forged abort, or a forged leg, on the worker API is refused
// (401) and counted, and does not touch the request it names.
func TestInternalSecret(t *testing.T) {
	t.Parallel()
	s := []string{"--internal-secret", fleetSecret}
	f := startFleet(t, s, s)
	defer f.stop(t)
	c := http.DefaultClient
	if status, _, body := do(t, c, "POST", f.router+"/v1/completions", "", completion); status != 200 {
		t.Fatalf("through the router: %d %s", status, body)
	}

	// KV: strangers.
	up, err := kvAttempt(t, f.kv, tcp.Config{})
	if up || !errors.Is(err, kvxfer.ErrRefused) || !strings.Contains(err.Error(), "requires the internal secret") {
		t.Errorf("KV client without the secret: up %v, err %v", up, err)
	}
	up, err = kvAttempt(t, f.kv, tcp.Config{Secret: auth.DeriveKey([]byte("a wrong secret, long enough"), auth.PurposeKV)})
	if up || !errors.Is(err, kvxfer.ErrRefused) || !strings.Contains(err.Error(), "failed to prove") {
		t.Errorf("KV client with a wrong secret: up %v, err %v", up, err)
	}
	nc, err := net.Dial("tcp", f.kv)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_, _ = io.Copy(io.Discard, nc) // prefill answers HELLO_ERR and closes
	nc.Close()
	for reason, n := range map[string]float64{"auth_mode": 1, "bad_proof": 1, "malformed": 1} {
		waitMetric(t, c, f.prefill, `pdserve_peer_auth_failures_total{channel="kv",reason="`+reason+`",role="prefill"}`, n)
	}

	// The worker API: a forged abort of a live request.
	stream := make(chan string, 1)
	go func() {
		_, _, body := do(t, c, "POST", f.router+"/v1/completions", "",
			`{"prompt": "a long answer", "max_tokens": 300, "ignore_eos": true, "temperature": 0, "stream": true}`)
		stream <- body
	}()
	var rid string
	if last, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		_, _, body := do(t, c, "GET", f.decode+"/debug/requests", "", "")
		var l struct{ Requests []struct{ RID string } }
		_ = json.Unmarshal([]byte(body), &l)
		if len(l.Requests) > 0 {
			rid = l.Requests[0].RID
			return true, ""
		}
		return false, body
	}); !ok {
		t.Fatalf("no live request on decode: %s", last)
	}
	abort := `{"rid":"` + rid + `","reason":"client"}`
	status, wa, body := do(t, c, "POST", f.decode+"/internal/v1/abort", "", abort)
	if status != http.StatusUnauthorized || wa != auth.SchemeHMAC || !strings.Contains(body, "unauthenticated_peer") {
		t.Errorf("unsigned abort: %d %q %s", status, wa, body)
	}
	forger := &http.Client{Transport: auth.NewSigner([]byte("a wrong secret, long enough"), nil, nil)}
	if resp, err := forger.Post(f.decode+"/internal/v1/abort", "application/json", strings.NewReader(abort)); err == nil {
		resp.Body.Close()
		t.Errorf("abort signed with a wrong secret was answered with a proof: %d", resp.StatusCode)
	}
	if status, _, _ := do(t, c, "POST", f.prefill+"/internal/v1/prefill", "",
		`{"rid":"forged","room":"0123456789abcdef0123456789abcdef","gen":1,"input_ids":[1,2,3],"max_tokens":1}`); status != http.StatusUnauthorized {
		t.Errorf("forged prefill leg: %d, want 401", status)
	}
	waitMetric(t, c, f.decode, `pdserve_peer_auth_failures_total{channel="worker_api",reason="missing",role="decode"}`, 1)
	waitMetric(t, c, f.decode, `pdserve_peer_auth_failures_total{channel="worker_api",reason="bad_signature",role="decode"}`, 1)
	waitMetric(t, c, f.prefill, `pdserve_peer_auth_failures_total{channel="worker_api",reason="missing",role="prefill"}`, 1)

	// The request the forged abort named ran to its end.
	got := <-stream
	if !strings.Contains(got, `"finish_reason":"length"`) || !strings.HasSuffix(strings.TrimSpace(got), "data: [DONE]") {
		t.Errorf("the stream the forged abort named did not finish: %.300s", got)
	}
	// Still serving, and healthy.
	if status, _, body := do(t, c, "POST", f.router+"/v1/completions", "", completion); status != 200 {
		t.Fatalf("after the attacks: %d %s", status, body)
	}
	for _, w := range []string{f.prefill, f.decode} {
		if status, _, _ := do(t, c, "GET", w+"/health", "", ""); status != 200 {
			t.Errorf("%s/health: %d", w, status)
		}
	}
}

// TestInternalMutualTLS: with --internal-tls-* on every process the fleet
// serves over mutual TLS; a KV client without a certificate or with one of
// another CA, and a worker API caller without one or with another CA's,
// are refused and counted; the fleet goes on serving.
func TestInternalMutualTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "fleet")
	other := tlstest.NewCA(t, "other")
	args := func(name string) []string {
		fs := ca.Issue(t, name)
		return []string{"--internal-tls-cert", fs.Cert, "--internal-tls-key", fs.Key, "--internal-tls-ca", fs.CA}
	}
	f := &fleet{}
	pre := start(t, "prefill", append([]string{"prefill", "--port", "0", "--kv-port", "0"}, args("prefill")...)...)
	f.prefill, f.kv = waitLine(t, pre, workerRE), waitLine(t, pre, kvRE)
	dec := start(t, "decode", append([]string{"decode", "--port", "0"}, args("decode")...)...)
	f.decode = waitLine(t, dec, workerRE)
	if !strings.HasPrefix(f.prefill, "https://") || !strings.HasPrefix(f.decode, "https://") {
		t.Fatalf("workers serve %s and %s, want https", f.prefill, f.decode)
	}
	// The router may name the workers http://: with internal TLS it calls HTTPS.
	r := start(t, "router", append([]string{"router", "--port", "0", "--prefill", f.prefill,
		"--decode", strings.Replace(f.decode, "https://", "http://", 1)}, args("router")...)...)
	f.router = waitLine(t, r, routerRE)
	waitLine(t, r, regexp.MustCompile(`^ready$`))
	f.procs = []*testbin.Proc{r, dec, pre}
	defer f.stop(t)
	c := http.DefaultClient
	if status, _, body := do(t, c, "POST", f.router+"/v1/completions", "", completion); status != 200 {
		t.Fatalf("through the router: %d %s", status, body)
	}

	load := func(fs tlsconf.Files) *tlsconf.Source {
		s, err := tlsconf.Load(fs, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	strangerFiles := other.Issue(t, "stranger")
	stranger := load(tlsconf.Files{Cert: strangerFiles.Cert, Key: strangerFiles.Key, CA: ca.File})
	// KV: no certificate, another CA's, no TLS at all.
	for name, cfg := range map[string]tcp.Config{
		"no certificate": {TLSClient: &tls.Config{InsecureSkipVerify: true}},
		"another CA":     {TLSClient: stranger.ClientConfig(nil)},
		"plain TCP":      {},
	} {
		if up, _ := kvAttempt(t, f.kv, cfg); up {
			t.Errorf("KV client with %s came up", name)
		}
	}
	// /metrics and /health are open to anyone over TLS, the worker API is not.
	anyone := tlsClient(t, ca.Pool())
	waitMetric(t, anyone, f.prefill, `pdserve_peer_auth_failures_total{channel="kv",reason="tls",role="prefill"}`, 3)

	if status, _, _ := do(t, anyone, "GET", f.decode+"/health", "", ""); status != 200 {
		t.Errorf("/health over TLS without a certificate: %d", status)
	}
	status, _, body := do(t, anyone, "POST", f.decode+"/internal/v1/abort", "", `{"rid":"x","reason":"client"}`)
	if status != http.StatusUnauthorized || !strings.Contains(body, "client certificate") {
		t.Errorf("abort without a client certificate: %d %s", status, body)
	}
	sc, err := tls.LoadX509KeyPair(strangerFiles.Cert, strangerFiles.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tlsClient(t, ca.Pool(), sc).Post(f.decode+"/internal/v1/abort", "application/json",
		strings.NewReader(`{"rid":"x","reason":"client"}`)); err == nil {
		t.Error("a client certificate of another CA was accepted")
	}
	waitMetric(t, anyone, f.decode, `pdserve_peer_auth_failures_total{channel="worker_api",reason="no_client_cert",role="decode"}`, 1)
	waitMetric(t, anyone, f.decode, `pdserve_peer_auth_failures_total{channel="worker_api",reason="bad_certificate",role="decode"}`, 1)

	if status, _, body := do(t, c, "POST", f.router+"/v1/completions", "", completion); status != 200 {
		t.Fatalf("after the attacks: %d %s", status, body)
	}
}

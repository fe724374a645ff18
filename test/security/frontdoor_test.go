package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/tlsconf/tlstest"
)

// serial is the serial number of the certificate base (host:port) presents.
func serial(t *testing.T, addr string, pool *x509.CertPool) *big.Int {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestTLSFrontDoorOpenAIClient: `pdserve up` with --ssl-certfile and
// --api-key, driven by the official openai-go client trusting the test
// CA: completion, chat and a stream. A client that does not trust the CA,
// and plain HTTP, get nothing.
func TestTLSFrontDoorOpenAIClient(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "front")
	fs := ca.Issue(t, "router")
	up := start(t, "up", "up", "--port", "0", "--ssl-certfile", fs.Cert, "--ssl-keyfile", fs.Key, "--api-key", "sk-tls")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("up serves %s, want https", base)
	}
	cl := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-tls"), option.WithMaxRetries(0),
		option.WithHTTPClient(tlsClient(t, ca.Pool())))
	ctx := context.Background()
	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(sim.DefaultName),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("over TLS")}, MaxTokens: openai.Int(12),
		Temperature: openai.Float(0), Seed: openai.Int(1),
	})
	if err != nil || len(comp.Choices) != 1 || comp.Usage.CompletionTokens != 12 {
		t.Fatalf("completion: %v %+v", err, comp)
	}
	chat, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     sim.DefaultName,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello over TLS")},
		MaxTokens: openai.Int(8),
	})
	if err != nil || len(chat.Choices) != 1 {
		t.Fatalf("chat: %v %+v", err, chat)
	}
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(sim.DefaultName),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("over TLS")}, MaxTokens: openai.Int(12),
		Temperature: openai.Float(0), Seed: openai.Int(1),
	})
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := stream.Err(); err != nil || text.String() != comp.Choices[0].Text {
		t.Fatalf("stream: %v, %q, want %q", err, text.String(), comp.Choices[0].Text)
	}
	// A wrong key over TLS: the client's 401.
	bad := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-wrong"), option.WithMaxRetries(0),
		option.WithHTTPClient(tlsClient(t, ca.Pool())))
	_, err = bad.Models.List(ctx)
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
		t.Errorf("wrong key: %v", err)
	}
	// Not trusting the CA: no connection. Plain HTTP: no answer.
	if _, err := tlsClient(t, x509.NewCertPool()).Get(base + "/health"); err == nil {
		t.Error("a client that does not trust the CA connected")
	}
	if resp, err := http.Get(strings.Replace(base, "https://", "http://", 1) + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP was served on the TLS port")
		}
	}
}

// TestCertReloadDuringStream: a certificate replaced behind a symlink the
// watch does not see is picked up on SIGHUP, one replaced in its watched
// directory without a signal; a request streaming across both reloads
// gets every token, and new connections get the new certificate.
func TestCertReloadDuringStream(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "front")
	live, store := t.TempDir(), t.TempDir()
	first := ca.IssueAt(t, store, "first", time.Now().Add(time.Hour))
	cert, key := filepath.Join(live, "cert.pem"), filepath.Join(live, "key.pem")
	if err := os.Symlink(first.Cert, cert); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(first.Key, key); err != nil {
		t.Fatal(err)
	}
	up := start(t, "up", "up", "--port", "0", "--ssl-certfile", cert, "--ssl-keyfile", key, "--sim-decode-ms-per-step", "6")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	addr := strings.TrimPrefix(base, "https://")
	pool := ca.Pool()
	s0 := serial(t, addr, pool)

	cl := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(tlsClient(t, pool)))
	stream := cl.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(sim.DefaultName),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("a stream across two reloads")}, MaxTokens: openai.Int(600),
		Temperature: openai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	got, finish := 0, ""
	next := func() bool {
		if !stream.Next() {
			return false
		}
		for _, ch := range stream.Current().Choices {
			got += len(ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		return true
	}
	for got == 0 && next() {
	}

	// 1. The file behind the symlink changes: invisible to the watch, so
	// still the old certificate until SIGHUP.
	ca.IssueAt(t, store, "first", time.Now().Add(2*time.Hour))
	if s := serial(t, addr, pool); s.Cmp(s0) != 0 {
		t.Fatal("the certificate changed before SIGHUP")
	}
	if err := up.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var s1 *big.Int
	if _, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		s1 = serial(t, addr, pool)
		return s1.Cmp(s0) != 0, ""
	}); !ok {
		t.Fatal("SIGHUP did not reload the certificate within 10s")
	}
	// 2. New files renamed into the watched directory: reloaded on its own.
	second := ca.IssueAt(t, store, "second", time.Now().Add(3*time.Hour))
	for _, mv := range [][2]string{{second.Key, key}, {second.Cert, cert}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		return serial(t, addr, pool).Cmp(s1) != 0, ""
	}); !ok {
		t.Fatal("replacing the files did not reload the certificate within 10s")
	}
	if finish != "" {
		t.Fatal("the stream ended before the reloads: it proves nothing")
	}
	for next() {
	}
	if err := stream.Err(); err != nil || finish != "length" || got == 0 {
		t.Fatalf("the stream across the reloads: err %v, finish %q, %d bytes", err, finish, got)
	}
}

func asAPIError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if !ok {
		return false
	}
	*target = e
	return true
}

// TestBenchOverTLS: `pdserve bench` measures a TLS front door behind a key
// (the CA from SSL_CERT_FILE, the key from --api-key): the command of the
// TLS cost figure in docs/performance.md.
func TestBenchOverTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "front")
	fs := ca.Issue(t, "router")
	up := start(t, "up", "up", "--port", "0", "--ssl-certfile", fs.Cert, "--ssl-keyfile", fs.Key, "--api-key", "sk-bench")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	b, err := testbin.Start(t, pdserve.Path(t), "bench", []string{"SSL_CERT_FILE=" + ca.File},
		"bench", "--base-url", base, "--api-key", "sk-bench", "--num-prompts", "8", "--random-input-len", "32",
		"--random-output-len", "8", "--progress=false")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Exited():
	case <-time.After(60 * time.Second):
		t.Fatal("bench did not finish within 60s")
	}
	if err := b.Err(); err != nil {
		t.Fatalf("bench: %v\n%s", err, b.Stderr())
	}
	if out := strings.Join(b.Lines(), "\n"); !regexp.MustCompile(`Successful requests:\s+8\n`).MatchString(out) {
		t.Fatalf("bench output:\n%s", out)
	}
}

package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// connCounter counts the connections a test server accepted.
type connCounter struct{ n atomic.Int64 }

func (c *connCounter) hook(_ net.Conn, s http.ConnState) {
	if s == http.StateNew {
		c.n.Add(1)
	}
}

func newCountingServer(t *testing.T, h http.Handler) (*httptest.Server, *connCounter) {
	t.Helper()
	var cc connCounter
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = cc.hook
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &cc
}

func post(t *testing.T, c *http.Client, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestTransportStreamsLinesAndReusesConnection: a chunked answer's lines
// are readable as each is flushed (the second is sent only once the first
// was read), the request's method, path, headers and body arrive intact,
// and the requests that follow, each read to its end, share one connection.
func TestTransportStreamsLinesAndReusesConnection(t *testing.T) {
	next := make(chan struct{})
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.RequestURI() != "/x?a=1" || r.Header.Get("Content-Type") != "application/json" ||
			r.ContentLength != int64(len(b)) || r.ProtoMajor != 1 || r.ProtoMinor != 1 {
			http.Error(rw, fmt.Sprintf("bad request %s %s %v %d", r.Method, r.URL, r.Header, r.ContentLength), 400)
			return
		}
		fmt.Fprintf(rw, "first %s\n", b)
		rw.(http.Flusher).Flush()
		<-next
		fmt.Fprintf(rw, "second\n")
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for i := range 3 {
		resp := post(t, c, context.Background(), srv.URL+"/x?a=1", fmt.Sprintf(`{"i":%d}`, i))
		if resp.StatusCode != 200 || resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("answer %d %v %d: %s", resp.StatusCode, resp.TransferEncoding, resp.ContentLength, b)
		}
		br := bufio.NewReader(resp.Body)
		l, err := br.ReadString('\n')
		if want := fmt.Sprintf("first {\"i\":%d}\n", i); err != nil || l != want {
			t.Fatalf("first line %q, %v; want %q", l, err, want)
		}
		next <- struct{}{}
		if l, err = br.ReadString('\n'); err != nil || l != "second\n" {
			t.Fatalf("second line %q, %v", l, err)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after the last line: %v, want EOF", err)
		}
		resp.Body.Close()
	}
	if n := cc.n.Load(); n != 1 {
		t.Fatalf("%d connections for 3 requests read to their end, want 1", n)
	}
}

// TestTransportContentLengthAndErrors: an answer with a Content-Length (an
// error answer, as a worker's JSON) is read to its length; a GET carries
// no body; a body closed before its end costs its connection.
func TestTransportContentLengthAndErrors(t *testing.T) {
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/get":
			if r.Method != http.MethodGet || r.ContentLength != 0 {
				http.Error(rw, "want a GET without a body", 400)
				return
			}
			rw.Header().Set("X-Check", "yes")
			_, _ = io.WriteString(rw, "ok")
		case "/big":
			_, _ = rw.Write(bytes.Repeat([]byte("x"), 100000))
		default:
			rw.Header().Set("Retry-After", "1")
			http.Error(rw, `{"error":{"code":"overloaded"}}`, http.StatusTooManyRequests)
		}
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	resp := post(t, c, context.Background(), srv.URL+"/generate", "{}")
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), "overloaded") ||
		resp.ContentLength != int64(len(b)) {
		t.Fatalf("429 answer: %d %v %q %v", resp.StatusCode, resp.Header, b, err)
	}
	resp.Body.Close()
	resp, err = c.Get(srv.URL + "/get")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "ok" || resp.Header.Get("X-Check") != "yes" {
		t.Fatalf("GET: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp.Body.Close()
	if n := cc.n.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	resp, err = c.Get(srv.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // before its end: the connection goes
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
	resp, err = c.Get(srv.URL + "/get")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n := cc.n.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (a body closed early closes its connection)", n)
	}
}

// TestTransportCancelEndsBlockedRead: cancelling a request's context ends a
// read blocked on a worker that sends nothing more, at once, with the
// context's error, and the worker sees its request's context end.
func TestTransportCancelEndsBlockedRead(t *testing.T) {
	gone := make(chan struct{})
	srv, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(rw, "line\n")
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, &http.Client{Transport: tr}, ctx, srv.URL, "{}")
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := br.ReadString('\n')
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("blocked read ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling the context did not end the blocked read")
	}
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's request context did not end")
	}
}

// TestTransportCancelBeforeAnswer: a context that ends while the answer's
// head is awaited ends RoundTrip with its error; one already ended sends
// nothing.
func TestTransportCancelBeforeAnswer(t *testing.T) {
	var arrived atomic.Int64
	block := make(chan struct{})
	defer close(block)
	srv, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RoundTrip past its deadline: %v, want context.DeadlineExceeded", err)
	}
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	req, _ = http.NewRequestWithContext(done, http.MethodPost, srv.URL, strings.NewReader("{}"))
	if _, err := c.Do(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip with an ended context: %v", err)
	}
	if n := arrived.Load(); n != 1 {
		t.Fatalf("%d requests reached the worker, want 1", n)
	}
}

// TestTransportResendsOnStaleConnection: a pooled connection the worker
// closed while it was idle is found dead on the next request, which is
// sent again on a new connection, once; a body that cannot be sent again
// gets the error instead.
func TestTransportResendsOnStaleConnection(t *testing.T) {
	var got atomic.Int64
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Add(1)
		_, _ = rw.Write(b)
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for i, body := range []string{"one", "two"} {
		resp := post(t, c, context.Background(), srv.URL, body)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != body {
			t.Fatalf("request %d: %q %v", i, b, err)
		}
		srv.CloseClientConnections() // the pooled connection dies idle
	}
	if n, g := cc.n.Load(), got.Load(); n != 2 || g != 2 {
		t.Fatalf("%d connections, %d requests served; want 2 and 2", n, g)
	}
	// The second connection, pooled, died idle too: a body without
	// GetBody cannot be sent again, so its request fails.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader("x")))
	req.ContentLength = 1
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("a request on a dead connection without GetBody succeeded")
	}
	if g := got.Load(); g != 2 {
		t.Fatalf("%d requests served, want 2", g)
	}
}

// TestTransportResendsOnNewConnection: when the worker closed every pooled
// connection while they were idle (it restarted), the resend of a request
// found one of them dead goes on a newly dialed connection, not on another
// dead one from the pool: every request succeeds.
func TestTransportResendsOnNewConnection(t *testing.T) {
	const pooled = 3
	var arrived sync.WaitGroup
	arrived.Add(pooled)
	var first atomic.Int64
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if first.Add(1) <= pooled {
			arrived.Done()
			arrived.Wait() // hold the first requests until all are in: one connection each
		}
		_, _ = io.WriteString(rw, "ok")
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	errs := make(chan error, pooled)
	for range pooled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := cc.n.Load(); n != pooled {
		t.Fatalf("%d connections, want %d", n, pooled)
	}
	srv.CloseClientConnections() // every pooled connection dies idle
	for i := range pooled {
		resp := post(t, c, context.Background(), srv.URL, "{}")
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "ok" {
			t.Fatalf("request %d after the restart: %q %v", i, b, err)
		}
	}
}

// TestTransportEndedWithoutRead: a worker whose last line and the chunked
// terminator arrive together: after the last line the body reports Ended
// without another read, and the connection is back in the pool.
func TestTransportEndedWithoutRead(t *testing.T) {
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(rw, "a\n")
		rw.(http.Flusher).Flush()
		_, _ = io.WriteString(rw, "b\n") // written with the terminator when the handler returns
	}))
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for range 2 {
		resp := post(t, c, context.Background(), srv.URL, "{}")
		br := bufio.NewReader(resp.Body)
		var lines []string
		for len(lines) < 2 {
			l, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
		e, ok := resp.Body.(interface{ Ended() bool })
		if !ok {
			t.Fatal("the body has no Ended")
		}
		// The terminator may trail in its own packet: wait for it to be
		// read, as a caller that drains would.
		deadline := time.Now().Add(10 * time.Second)
		for !e.Ended() {
			if br.Buffered() > 0 {
				t.Fatalf("data after the last line: %d bytes", br.Buffered())
			}
			if time.Now().After(deadline) {
				t.Fatal("the body never ended")
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("after the last line: %v", err)
			}
		}
		resp.Body.Close()
	}
	if n := cc.n.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// TestTransportIdleTimeout: a connection idle longer than IdleConnTimeout
// is closed, not used.
func TestTransportIdleTimeout(t *testing.T) {
	srv, cc := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {}))
	clk := testingclock.NewFakePassiveClock(time.Unix(1000, 0))
	tr := &Transport{IdleConnTimeout: time.Minute, Clock: clk}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func() {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get()
	clk.SetTime(clk.Now().Add(59 * time.Second))
	get()
	if n := cc.n.Load(); n != 1 {
		t.Fatalf("%d connections after 59 s idle, want 1", n)
	}
	clk.SetTime(clk.Now().Add(61 * time.Second))
	get()
	if n := cc.n.Load(); n != 2 {
		t.Fatalf("%d connections after 61 s idle, want 2", n)
	}
}

// TestTransportSweepsWorkersNoLongerCalled: the idle connections of a
// worker the router no longer calls (gone from the fleet) are closed once
// idle longer than IdleConnTimeout, when any other worker is called, and
// the worker is forgotten.
func TestTransportSweepsWorkersNoLongerCalled(t *testing.T) {
	gone, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {}))
	stays, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {}))
	clk := testingclock.NewFakePassiveClock(time.Unix(1000, 0))
	tr := &Transport{IdleConnTimeout: time.Minute, Clock: clk}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(url string) {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get(gone.URL)
	tr.mu.Lock()
	pooled := append([]*pconn(nil), tr.idle[gone.URL]...)
	tr.mu.Unlock()
	if len(pooled) != 1 {
		t.Fatalf("%d idle connections to the first worker, want 1", len(pooled))
	}
	advance := func(d time.Duration) { clk.SetTime(clk.Now().Add(d)) }
	advance(59 * time.Second)
	get(stays.URL) // not idle long enough: kept
	if _, err := pooled[0].conn.Write(nil); err != nil {
		t.Fatalf("a connection idle 59 s of 60 was closed: %v", err)
	}
	advance(2 * time.Second)
	get(stays.URL)
	if _, err := pooled[0].conn.Write(nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a connection idle 61 s to a worker no longer called: write %v, want net.ErrClosed", err)
	}
	tr.mu.Lock()
	_, kept := tr.idle[gone.URL]
	n := len(tr.idle)
	tr.mu.Unlock()
	if kept || n != 1 {
		t.Fatalf("pool keeps %d workers (the one no longer called: %v), want 1", n, kept)
	}
}

// TestTransportTLS: https URLs are served over TLS with the configured
// roots, as HTTP/1.1.
func TestTransportTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "%s %v", r.Proto, r.TLS != nil)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	tr := &Transport{TLSClientConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "HTTP/1.1 true" {
		t.Fatalf("answer %q, want HTTP/1.1 over TLS", b)
	}
	bad := &Transport{TLSClientConfig: &tls.Config{}} // no roots for the test CA
	defer bad.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: bad}).Get(srv.URL); err == nil {
		resp.Body.Close()
		t.Fatal("a server with an unknown certificate was trusted")
	}
}

// rawServer answers every connection with the bytes answer gives it.
func rawServer(t *testing.T, answer func(n int) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func(c net.Conn, n int) {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.WriteString(c, answer(n))
			}(c, n)
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestTransportMalformedAnswers: every malformed answer is an error (of
// RoundTrip or of the body's Read) naming what is wrong, never a panic,
// a hang or an allocation the size of a claim.
func TestTransportMalformedAnswers(t *testing.T) {
	big := strings.Repeat("a", MaxResponseHeaderBytes+10)
	for _, tc := range []struct {
		name, answer, wantErr string
		body                  bool // the error comes from reading the body
	}{
		{"status line", "HTCPCP/1.0 418 teapot\r\n\r\n", "malformed HTTP status line", false},
		{"status code", "HTTP/1.1 2x0 OK\r\n\r\n", "malformed HTTP status code", false},
		{"header line", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed HTTP header line", false},
		{"folded header", "HTTP/1.1 200 OK\r\nA: b\r\n  folded\r\n\r\n", "malformed HTTP header line", false},
		{"header size", "HTTP/1.1 200 OK\r\nX: " + big + "\r\n\r\n", "size limit", false},
		{"content length", "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "malformed Content-Length", false},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", "conflicting Content-Length", false},
		{"transfer encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer encoding", false},
		{"head cut", "HTTP/1.1 200 OK\r\nContent-Type: x", "unexpected EOF", false},
		{"chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size", true},
		{"huge chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", "chunk size", true},
		{"chunk cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", "unexpected EOF", true},
		{"no crlf after chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY\r\n0\r\n\r\n", "no CRLF", true},
		{"no last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "unexpected EOF", true},
		{"length cut", "HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\nabc", "unexpected EOF", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := rawServer(t, func(int) string { return tc.answer })
			tr := &Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get(url)
			if !tc.body {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("RoundTrip took a malformed answer (%d)", resp.StatusCode)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %q, want it to say %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("body read error %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}

// TestTransportGoodRawAnswers: answers net/http's server does not send but
// a worker behind something else could: chunk extensions and trailers, a
// body ended by the connection's close, a 1xx before the answer, and
// Connection: close (the connection is then not pooled).
func TestTransportGoodRawAnswers(t *testing.T) {
	for _, tc := range []struct{ name, answer, want string }{
		{"extensions and trailers", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: v\r\n\r\n", "abcde"},
		{"to close", "HTTP/1.1 200 OK\r\n\r\nuntil the end", "until the end"},
		{"interim", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok"},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "ok"},
		{"http/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := rawServer(t, func(int) string { return tc.answer })
			tr := &Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			for range 2 { // the second on a new connection: the server closes each
				resp, err := c.Get(url)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != tc.want || resp.StatusCode != 200 {
					t.Fatalf("%d %q %v, want %q", resp.StatusCode, b, err, tc.want)
				}
			}
		})
	}
}

// BenchmarkLegTransport: one streaming leg as the router sends it (a
// small JSON POST answered with 17 NDJSON lines, the last with the chunked
// terminator) over loopback, through net/http's Transport and through
// Transport, in the same run. Its ns/op include the test server's work.
//
//	go test -run '^$' -bench BenchmarkLegTransport -benchmem -count 6 ./internal/router/
func BenchmarkLegTransport(b *testing.B) {
	line := []byte(`{"token_ids":[1234],"logprobs":[-0.5]}` + "\n")
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "application/x-ndjson")
		f := rw.(http.Flusher)
		for i := range 17 {
			_, _ = rw.Write(line)
			if i < 16 {
				f.Flush()
			}
		}
	}))
	defer srv.Close()
	payload := []byte(`{"rid":"r","input_ids":[1,2,3,4,5,6,7,8],"max_tokens":16,"sampling_params":{"temperature":0}}`)
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"nethttp", &http.Transport{MaxIdleConnsPerHost: 1024}},
		{"router", NewTransport()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := &http.Client{Transport: tc.rt}
			defer c.CloseIdleConnections()
			br := bufio.NewReaderSize(nil, 4096)
			for b.Loop() {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/internal/v1/generate", bytes.NewReader(payload))
				req.Header.Set("Content-Type", "application/json")
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				br.Reset(resp.Body)
				n := 0
				for {
					if _, err := br.ReadSlice('\n'); err != nil {
						break
					}
					n++
				}
				resp.Body.Close()
				if n != 17 {
					b.Fatalf("%d lines", n)
				}
			}
		})
	}
}

// FuzzTransportAnswer: any bytes a worker could answer with are parsed to
// an answer and a body, or to an error, without a panic, a hang or an
// allocation the size of a claimed length.
func FuzzTransportAnswer(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n",
		"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nRetry-After: 1\r\n\r\n{}",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nto the end",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		tr := &Transport{}
		defer tr.CloseIdleConnections()
		pc := &pconn{key: "k", conn: a, br: bufio.NewReaderSize(bytes.NewReader(data), 16<<10)}
		req, _ := http.NewRequest(http.MethodGet, "http://w/", nil)
		resp, _, err := readFinalHead(pc.br, req)
		if err != nil {
			return
		}
		body := tr.newBody(context.Background(), pc, func() bool { return true }, req, resp)
		n, _ := io.Copy(io.Discard, body)
		if n > int64(len(data)) {
			t.Fatalf("a body of %d bytes from %d bytes of answer", n, len(data))
		}
		body.Close()
	})
}

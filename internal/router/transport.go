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
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

// Transport is the router's HTTP/1.1 client transport for its calls to
// workers (legs, aborts, health and load checks). A request is written and
// its answer read on the caller's goroutine, over a pooled keep-alive
// connection: no goroutine runs per connection and nothing is handed
// between goroutines. net/http's Transport keeps a read loop and a write
// loop goroutine on every connection and passes each request and answer
// through them over channels; on the router's path (one leg per request,
// answered with a stream of short lines) those hand-overs and the wake-ups
// they cost were a large part of the router's own CPU time per request
// (docs/performance.md, "Router overhead").
//
// It speaks what a worker speaks: HTTP/1.1 over TCP, or TLS for https URLs
// (TLSClientConfig; HTTP/2 is not offered), request bodies with a
// Content-Length, answers with a Content-Length, chunked or ended by the
// connection's close. No proxies, redirects (http.Client's job),
// compression or cookies. Limits: status line and headers
// MaxResponseHeaderBytes in all, chunk-size lines and trailers 4 KiB.
//
// A request's context cancels it at any point: its deadline or
// cancellation ends a blocked dial, write or read at once (the
// connection's deadline is moved into the past) and the connection is
// closed. A connection goes back to the pool only when its answer was read
// to its end. A request that finds a pooled connection closed by the
// worker before any byte of the answer arrived is sent again once on a new
// connection (as net/http does), if its body can be sent again (GetBody).
//
// A Transport is safe for concurrent use. The zero value is usable.
type Transport struct {
	// TLSClientConfig is used for https URLs (nil: the defaults).
	TLSClientConfig *tls.Config
	// DialTimeout bounds a connection's dial and TLS handshake (default 5 s).
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period of the connections (default
	// 30 s).
	KeepAlive time.Duration
	// IdleConnTimeout is how long an idle connection is kept (default 90 s);
	// older ones are closed when the pool of their worker is next used, or
	// by the sweep of every worker's pool (at most once a second, on any
	// call) for a worker no longer called, such as one gone from the fleet.
	// The sweep also closes the idle connections their worker closed (it
	// stopped or restarted), whatever their age.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle connections kept per worker
	// (default 1024).
	MaxIdleConnsPerHost int
	// Clock times the idle connections (nil: the wall clock).
	Clock clock.PassiveClock

	mu    sync.Mutex
	idle  map[string][]*pconn // by scheme://host:port; oldest first
	swept time.Time           // the last sweep of every worker's pool
}

// sweepInterval is how often, at most, every worker's idle connections
// are pruned (not only those of the worker being called).
const sweepInterval = time.Second

func (t *Transport) now() time.Time {
	if t.Clock != nil {
		return t.Clock.Now()
	}
	return time.Now()
}

// MaxResponseHeaderBytes bounds an answer's status line and headers.
const MaxResponseHeaderBytes = 64 << 10

const (
	maxResponseHeaders = 128
	maxChunkLineBytes  = 4 << 10
	maxInterimAnswers  = 8 // 1xx answers skipped before the final one
)

// ErrNoAnswer wraps the error of a request that was sent whole but got no
// answer (the connection closed, reset or sent garbage before or within
// the answer's head): the worker had the request, unlike a dial or write
// failure, which is returned as it is.
var ErrNoAnswer = errors.New("the worker took the request but did not answer it")

var (
	errHeaderTooLong = errors.New("answer headers over the size limit")
	errBodyClosed    = errors.New("read on a closed answer body")
	aLongTimeAgo     = time.Unix(1, 0)
)

// pconn is one connection of the pool.
type pconn struct {
	key    string
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time
	reused bool
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleConnTimeout > 0 {
		return t.IdleConnTimeout
	}
	return 90 * time.Second
}

// get takes the newest idle connection to key, closing those idle too long.
func (t *Transport) get(key string, now time.Time) *pconn {
	t.mu.Lock()
	n := t.sweep(now)
	list := t.idle[key]
	n = append(n, t.prune(key, list, now)...)
	list = t.idle[key]
	var pc *pconn
	if len(list) > 0 {
		pc = list[len(list)-1]
		list[len(list)-1] = nil
		t.idle[key] = list[:len(list)-1]
	}
	t.mu.Unlock()
	closeAll(n)
	return pc
}

// prune drops the connections of list idle longer than the timeout (the
// oldest come first) and returns them to be closed outside the lock.
func (t *Transport) prune(key string, list []*pconn, now time.Time) []*pconn {
	cut := now.Add(-t.idleTimeout())
	i := 0
	for i < len(list) && list[i].idleAt.Before(cut) {
		i++
	}
	if i == 0 {
		return nil
	}
	old := append([]*pconn(nil), list[:i]...)
	t.idle[key] = append(list[:0], list[i:]...)
	return old
}

// sweep prunes the idle connections of every worker, at most once every
// sweepInterval: those idle too long and those the worker closed (a worker
// that stopped or restarted; kept, each would sit in CLOSE-WAIT until its
// idle timeout). It forgets the workers left without any: a worker no
// longer called (gone from the fleet) would otherwise keep its
// connections, and their descriptors, for good. It returns those to close
// outside the lock. t.mu is held.
func (t *Transport) sweep(now time.Time) []*pconn {
	if now.Sub(t.swept) < sweepInterval {
		return nil
	}
	t.swept = now
	var old []*pconn
	for key, list := range t.idle {
		old = append(old, t.prune(key, list, now)...)
		list = t.idle[key]
		kept := list[:0]
		for _, pc := range list {
			if closedByPeer(pc.conn) {
				old = append(old, pc)
			} else {
				kept = append(kept, pc)
			}
		}
		clear(list[len(kept):])
		t.idle[key] = kept
		if len(t.idle[key]) == 0 {
			delete(t.idle, key)
		}
	}
	return old
}

// put returns a connection whose answer was read to its end to the pool.
func (t *Transport) put(pc *pconn) {
	max := t.MaxIdleConnsPerHost
	if max <= 0 {
		max = 1024
	}
	now := t.now()
	pc.idleAt, pc.reused = now, true
	t.mu.Lock()
	if t.idle == nil {
		t.idle = make(map[string][]*pconn)
	}
	old := t.sweep(now)
	list := t.idle[pc.key]
	old = append(old, t.prune(pc.key, list, now)...)
	list = t.idle[pc.key]
	if len(list) >= max {
		t.mu.Unlock()
		closeAll(old)
		pc.conn.Close()
		return
	}
	t.idle[pc.key] = append(list, pc)
	t.mu.Unlock()
	closeAll(old)
}

func closeAll(pcs []*pconn) {
	for _, pc := range pcs {
		pc.conn.Close()
	}
}

// CloseIdleConnections closes every idle connection.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, list := range idle {
		closeAll(list)
	}
}

// CloseIdleConnectionsTo closes the idle connections to the worker at
// rawURL (http or https; both are closed, as under internal TLS a worker's
// http URL is called over HTTPS). The router calls it when the worker
// leaves the fleet.
func (t *Transport) CloseIdleConnectionsTo(rawURL string) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return
	}
	var old []*pconn
	t.mu.Lock()
	for _, scheme := range []string{"http", "https"} {
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[scheme]
		}
		key := scheme + "://" + net.JoinHostPort(u.Hostname(), port)
		old = append(old, t.idle[key]...)
		delete(t.idle, key)
	}
	t.mu.Unlock()
	closeAll(old)
}

// dial opens a connection to host (host:port) under ctx.
func (t *Transport) dial(ctx context.Context, scheme, host, key string) (*pconn, error) {
	timeout, keepAlive := t.DialTimeout, t.KeepAlive
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if keepAlive == 0 {
		keepAlive = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := &net.Dialer{KeepAlive: keepAlive}
	var (
		c   net.Conn
		err error
	)
	if scheme == "https" {
		cfg := &tls.Config{}
		if t.TLSClientConfig != nil {
			cfg = t.TLSClientConfig.Clone()
		}
		cfg.NextProtos = []string{"http/1.1"}
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(host)
		}
		c, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", host)
	} else {
		c, err = d.DialContext(ctx, "tcp", host)
	}
	if err != nil {
		return nil, err
	}
	return &pconn{key: key, conn: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

// RoundTrip implements http.RoundTripper. The answer's Body must be read
// to its end (the connection is then pooled) or closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.roundTrip(req)
	if err != nil && req.Body != nil {
		req.Body.Close()
	}
	return resp, err
}

func (t *Transport) roundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		return nil, errors.New("http: nil Request.URL")
	}
	scheme := req.URL.Scheme
	if scheme != "http" && scheme != "https" {
		return nil, fmt.Errorf("unsupported protocol scheme %q", scheme)
	}
	host := req.URL.Host
	if host == "" {
		return nil, errors.New("http: no Host in request URL")
	}
	if req.URL.Port() == "" {
		port := "80"
		if scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(req.URL.Hostname(), port)
	}
	key := scheme + "://" + host
	ctx := req.Context()
	body := req.Body
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// A resend dials: the pool's other connections to this worker
		// are likely as dead as the one just found so (the worker
		// restarted), and a second stale one would fail the request.
		var pc *pconn
		if attempt == 0 {
			pc = t.get(key, t.now())
		}
		if pc == nil {
			var err error
			if pc, err = t.dial(ctx, scheme, host, key); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, err
			}
		}
		resp, err := t.exchange(ctx, pc, req, body)
		if err == nil {
			return resp, nil
		}
		pc.conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var stale staleConnError
		if attempt > 0 || !errors.As(err, &stale) {
			return nil, err
		}
		if body != nil && body != http.NoBody {
			if req.GetBody == nil {
				return nil, stale.err
			}
			if body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// staleConnError is a pooled connection found closed by the worker before
// any byte of the answer arrived: the request may go again on a new one.
type staleConnError struct{ err error }

func (e staleConnError) Error() string { return e.err.Error() }
func (e staleConnError) Unwrap() error { return e.err }

// exchange writes req on pc and reads the answer's head.
func (t *Transport) exchange(ctx context.Context, pc *pconn, req *http.Request, body io.Reader) (*http.Response, error) {
	stop := func() bool { return true }
	if ctx.Done() != nil {
		conn := pc.conn
		stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	}
	if err := writeRequest(pc.bw, req, body); err != nil {
		stop()
		if pc.reused && isStale(err) {
			return nil, staleConnError{err}
		}
		return nil, err
	}
	resp, got, err := readFinalHead(pc.br, req)
	if err != nil {
		stop()
		if pc.reused && !got && isStale(err) {
			return nil, staleConnError{err}
		}
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", ErrNoAnswer, err)
		}
		return nil, err
	}
	resp.Body = t.newBody(ctx, pc, stop, req, resp)
	return resp, nil
}

// readFinalHead reads the head of the final answer to req from br,
// skipping up to maxInterimAnswers 1xx answers; got says whether any byte
// of an answer arrived.
func readFinalHead(br *bufio.Reader, req *http.Request) (resp *http.Response, got bool, err error) {
	for i := 0; ; i++ {
		var some bool
		resp, some, err = readResponseHead(br, req)
		got = got || some
		if err != nil {
			return nil, got, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, got, nil
		}
		if i >= maxInterimAnswers {
			return nil, got, errors.New("too many 1xx answers")
		}
	}
}

// newBody returns the body of resp, read from pc, delimited as its head
// says; a body that is empty is ended (its connection pooled) at once.
func (t *Transport) newBody(ctx context.Context, pc *pconn, stop func() bool, req *http.Request, resp *http.Response) *answerBody {
	b := &answerBody{t: t, pc: pc, ctx: ctx, stop: stop, reusable: !resp.Close && !req.Close}
	switch {
	case req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified:
		resp.ContentLength = 0
		b.kind = bodyNone
	case len(resp.TransferEncoding) > 0:
		b.kind = bodyChunked
	case resp.ContentLength >= 0:
		b.kind, b.rem = bodyLength, resp.ContentLength
	default:
		b.kind, b.reusable = bodyToEOF, false
	}
	if b.kind == bodyNone || b.kind == bodyLength && b.rem == 0 {
		b.finish()
	}
	return b
}

// isStale reports whether err is a connection the peer closed or reset.
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// writeRequest writes req's head and body (from body) to bw and flushes it.
func writeRequest(bw *bufio.Writer, req *http.Request, body io.Reader) error {
	var payload []byte
	n := req.ContentLength
	if body == http.NoBody {
		body = nil
	}
	if body != nil && n < 0 {
		b, err := io.ReadAll(body)
		if err != nil {
			return err
		}
		payload, n, body = b, int64(len(b)), nil
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	for k, vs := range req.Header {
		if !validHeaderField(k) {
			return fmt.Errorf("invalid header name %q", k)
		}
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		for _, v := range vs {
			if !validHeaderField(v) {
				return fmt.Errorf("invalid header value for %q", k)
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if req.Close {
		bw.WriteString("Connection: close\r\n")
	}
	if body != nil || payload != nil || method == http.MethodPost || method == http.MethodPut {
		bw.WriteString("Content-Length: ")
		var num [20]byte
		bw.Write(strconv.AppendInt(num[:0], max(n, 0), 10))
		bw.WriteString("\r\n")
	}
	bw.WriteString("\r\n")
	switch {
	case payload != nil:
		bw.Write(payload)
	case body != nil && n > 0:
		m, err := io.Copy(bw, io.LimitReader(body, n))
		if err != nil {
			return err
		}
		if m != n {
			return fmt.Errorf("request body: %d of its %d bytes", m, n)
		}
	}
	return bw.Flush()
}

// validHeaderField reports whether s holds no CR, LF or NUL.
func validHeaderField(s string) bool {
	return !strings.ContainsAny(s, "\r\n\x00")
}

// readResponseHead reads an answer's status line and headers from br; got
// says whether any byte of it arrived.
func readResponseHead(br *bufio.Reader, req *http.Request) (resp *http.Response, got bool, err error) {
	total := 0
	line := func() ([]byte, error) {
		l, err := br.ReadSlice('\n')
		total += len(l)
		switch {
		case err == bufio.ErrBufferFull || total > MaxResponseHeaderBytes:
			return nil, errHeaderTooLong
		case err != nil:
			if err == io.EOF && total > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		return bytes.TrimRight(l, "\r\n"), nil
	}
	status, err := line()
	if err != nil {
		return nil, total > 0, err
	}
	resp = &http.Response{Request: req, Header: make(http.Header, 6), ContentLength: -1}
	proto, rest, ok := bytes.Cut(status, []byte{' '})
	if !ok || !bytes.HasPrefix(proto, []byte("HTTP/1.")) || len(proto) != 8 || proto[7] < '0' || proto[7] > '9' {
		return nil, true, fmt.Errorf("malformed HTTP status line %q", truncate(status))
	}
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = string(proto), 1, int(proto[7]-'0')
	code, _, _ := bytes.Cut(rest, []byte{' '})
	if len(code) != 3 || code[0] < '1' || code[0] > '5' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' {
		return nil, true, fmt.Errorf("malformed HTTP status code %q", truncate(code))
	}
	resp.StatusCode = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	resp.Status = string(rest)
	for n := 0; ; n++ {
		l, err := line()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, true, err
		}
		if len(l) == 0 {
			break
		}
		if n >= maxResponseHeaders {
			return nil, true, errHeaderTooLong
		}
		k, v, ok := bytes.Cut(l, []byte{':'})
		if !ok || len(k) == 0 || l[0] == ' ' || l[0] == '\t' || bytes.ContainsAny(k, " \t") {
			return nil, true, fmt.Errorf("malformed HTTP header line %q", truncate(l))
		}
		key := textproto.CanonicalMIMEHeaderKey(string(k))
		resp.Header[key] = append(resp.Header[key], string(bytes.TrimSpace(v)))
	}
	if err := frame(resp); err != nil {
		return nil, true, err
	}
	return resp, true, nil
}

// frame sets how resp's body is delimited and whether its connection
// closes after it, from its headers (RFC 9112, section 6).
func frame(resp *http.Response) error {
	h := resp.Header
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				resp.Close = true
			}
		}
	}
	if resp.ProtoMinor == 0 {
		resp.Close = true // HTTP/1.0: no keep-alive assumed
	}
	if te := h["Transfer-Encoding"]; len(te) > 0 {
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
			return fmt.Errorf("unsupported transfer encoding %q", te)
		}
		resp.TransferEncoding = []string{"chunked"}
		delete(h, "Content-Length") // chunked wins (RFC 9112, 6.3)
		return nil
	}
	if cl := h["Content-Length"]; len(cl) > 0 {
		for _, v := range cl[1:] {
			if v != cl[0] {
				return fmt.Errorf("conflicting Content-Length %q", cl)
			}
		}
		n, err := strconv.ParseInt(cl[0], 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("malformed Content-Length %q", truncate([]byte(cl[0])))
		}
		resp.ContentLength = n
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

// Body kinds.
const (
	bodyNone = iota
	bodyLength
	bodyChunked
	bodyToEOF
)

// Body states.
const (
	bodyReading = iota
	bodyEnded   // read to its end: the connection is pooled or closed
	bodyClosed  // closed or failed before its end: the connection is closed
)

// answerBody is an answer's body, read from its connection on the caller's
// goroutine.
type answerBody struct {
	t        *Transport
	pc       *pconn
	ctx      context.Context
	stop     func() bool // unregisters the context's cancellation
	kind     int
	rem      int64 // bytes left of the body (bodyLength) or of this chunk
	inChunk  bool  // a chunk's data is being read: its CRLF follows
	reusable bool
	state    atomic.Int32
	err      error // the read error, once failed
}

// finish ends the body: its connection goes back to the pool, unless the
// context fired (the connection's deadline is then in the past) or the
// answer closes it.
func (b *answerBody) finish() {
	if !b.state.CompareAndSwap(bodyReading, bodyEnded) {
		return
	}
	if b.stop() && b.reusable {
		b.t.put(b.pc)
		return
	}
	b.pc.conn.Close()
}

// fail ends the body with err, closing its connection.
func (b *answerBody) fail(err error) error {
	if b.ctx.Err() != nil {
		err = b.ctx.Err()
	} else if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	b.err = err
	if b.state.CompareAndSwap(bodyReading, bodyClosed) {
		b.stop()
		b.pc.conn.Close()
	}
	return err
}

// Read implements io.Reader.
func (b *answerBody) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEnded:
		return 0, io.EOF
	case bodyClosed:
		if b.err != nil {
			return 0, b.err
		}
		return 0, errBodyClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	br := b.pc.br
	switch b.kind {
	case bodyToEOF:
		n, err := br.Read(p)
		if err == io.EOF {
			b.finish()
			return n, io.EOF
		}
		if err != nil {
			return n, b.fail(err)
		}
		return n, nil
	case bodyLength:
		if int64(len(p)) > b.rem {
			p = p[:b.rem]
		}
		n, err := br.Read(p)
		b.rem -= int64(n)
		if b.rem == 0 {
			b.finish()
			return n, io.EOF
		}
		if err != nil {
			return n, b.fail(err)
		}
		return n, nil
	}
	// Chunked: read the next chunk's size line when this one is done.
	for b.rem == 0 {
		if err := b.nextChunk(); err != nil {
			return 0, err
		}
		if b.state.Load() == bodyEnded {
			return 0, io.EOF
		}
	}
	if int64(len(p)) > b.rem {
		p = p[:b.rem]
	}
	n, err := br.Read(p)
	b.rem -= int64(n)
	if err != nil {
		return n, b.fail(err)
	}
	if b.rem == 0 && br.Buffered() > 0 {
		// End the body now if its end is already read, so that a caller
		// that stops at the last byte of data finds the connection pooled.
		b.tryEnd()
	}
	return n, nil
}

// nextChunk reads the CRLF ending the chunk just read, then the next size
// line; at the last chunk (size 0) it reads the trailers and ends the body.
func (b *answerBody) nextChunk() error {
	br := b.pc.br
	if b.inChunk {
		crlf, err := readLine(br)
		if err != nil {
			return b.fail(err)
		}
		if len(crlf) != 0 {
			return b.fail(errors.New("malformed chunked encoding: no CRLF after chunk data"))
		}
		b.inChunk = false
	}
	l, err := readLine(br)
	if err != nil {
		return b.fail(err)
	}
	size, err := chunkSize(l)
	if err != nil {
		return b.fail(err)
	}
	if size > 0 {
		b.rem, b.inChunk = size, true
		return nil
	}
	for total := 0; ; { // trailers, discarded
		t, err := readLine(br)
		if err != nil {
			return b.fail(err)
		}
		if len(t) == 0 {
			break
		}
		if total += len(t); total > maxChunkLineBytes {
			return b.fail(errors.New("answer trailers over the size limit"))
		}
	}
	b.finish()
	return nil
}

// tryEnd ends a chunked body whose current chunk is read when the rest
// of the body (the chunk's CRLF, the last chunk and no trailers) is
// already buffered, without blocking. It reports whether the body ended.
func (b *answerBody) tryEnd() bool {
	if b.kind != bodyChunked || b.rem != 0 || b.state.Load() != bodyReading {
		return b.state.Load() == bodyEnded
	}
	br := b.pc.br
	buf, _ := br.Peek(br.Buffered())
	rest := buf
	if b.inChunk {
		if !bytes.HasPrefix(rest, []byte("\r\n")) {
			return false
		}
		rest = rest[2:]
	}
	i := 0
	for i < len(rest) && rest[i] == '0' {
		i++
	}
	if i == 0 || !bytes.HasPrefix(rest[i:], []byte("\r\n\r\n")) {
		return false
	}
	_, _ = br.Discard(len(buf) - len(rest) + i + 4)
	b.inChunk = false
	b.finish()
	return true
}

// Ended reports, without blocking, whether the body has been read to its
// end (the rest of it, if any, was already buffered). The router asks so
// before its last write to the client: a leg that has ended needs no
// further read, so the client's last bytes need no flush of their own.
func (b *answerBody) Ended() bool { return b.tryEnd() }

// readLine reads a line of at most maxChunkLineBytes, without its CRLF.
func readLine(br *bufio.Reader) ([]byte, error) {
	l, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(l) > maxChunkLineBytes {
		return nil, errors.New("malformed chunked encoding: line over the size limit")
	}
	if err != nil {
		return nil, err
	}
	return bytes.TrimRight(l, "\r\n"), nil
}

// chunkSize parses a chunk-size line (hex digits, then any extensions).
func chunkSize(l []byte) (int64, error) {
	if i := bytes.IndexByte(l, ';'); i >= 0 {
		l = l[:i]
	}
	l = bytes.TrimSpace(l)
	if len(l) == 0 || len(l) > 15 {
		return 0, fmt.Errorf("malformed chunked encoding: chunk size %q", truncate(l))
	}
	var n int64
	for _, c := range l {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("malformed chunked encoding: chunk size %q", truncate(l))
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

// Close implements io.Closer: a body not read to its end closes its
// connection. It may be called while a Read blocks, which then fails.
func (b *answerBody) Close() error {
	if b.state.CompareAndSwap(bodyReading, bodyClosed) {
		b.stop()
		b.pc.conn.Close()
	}
	return nil
}

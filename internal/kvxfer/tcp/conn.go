package tcp

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

const (
	// readBufferBytes is the size of a connection's read buffer. Frame
	// data larger than it is read straight into its destination.
	readBufferBytes = 64 << 10
	// maxWriteBytes bounds one system write call; WriteTimeout applies to
	// each, so a slow but progressing peer is not mistaken for a dead one.
	maxWriteBytes = 4 << 20
)

// outFrame is one queued frame: hdr is the encoded frame except a
// KVChunk's Data, which follows it on the wire.
type outFrame struct {
	t    kvxfer.Type
	hdr  []byte
	data []byte
}

func (f outFrame) size() int { return len(f.hdr) + len(f.data) }

// conn is one connection. Its reader goroutine (run) owns the handshake,
// the reads and all Handler calls; its writer goroutine (writeLoop) owns the
// writes after the handshake.
type conn struct {
	b      *Backend
	id     kvxfer.PeerID
	remote string
	dialed bool

	done       chan struct{} // closed by fail
	writerDone chan struct{} // closed when writeLoop returns
	notify     chan struct{} // capacity 1: the queues may be non-empty

	mu     sync.Mutex
	nc     net.Conn           // set once: at accept, or by dial under mu
	rw     net.Conn           // what frames are read and written on: nc, or TLS over it (set before the writer starts)
	cancel context.CancelFunc // cancels the dial in progress
	err    error              // why the connection closed; nil while open
	ctrl   []outFrame         // PONGs, written before queue
	queue  []outFrame         // room messages from Send
}

// failed returns the reason the connection closed, or nil if it is open.
func (c *conn) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail closes the connection with err unless it is already closed, and
// reports whether it did. Its goroutines notice through done and the closed
// socket.
func (c *conn) fail(err error) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.err = err
	clear(c.ctrl)
	clear(c.queue)
	c.ctrl, c.queue = nil, nil
	nc, cancel := c.nc, c.cancel
	close(c.done)
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if nc != nil {
		nc.Close()
	}
	return true
}

// enqueue appends f to the control or data queue and wakes the writer.
func (c *conn) enqueue(f outFrame, ctrl bool) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("kv send to peer %d: %w: %w", c.id, ErrConnClosed, err)
	}
	if ctrl {
		c.ctrl = append(c.ctrl, f)
	} else {
		c.queue = append(c.queue, f)
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil
}

// takeBudget bounds the data frames taken into one batch, in bytes, so that
// a control frame queued behind a large transfer waits for at most this
// much data on the wire, not for every queued KV chunk.
const takeBudget = 4 << 20

// take moves every queued control frame, then data frames in order up to
// takeBudget bytes (at least one), to the end of batch. It reports whether
// data frames remain queued.
func (c *conn) take(batch []outFrame) ([]outFrame, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	batch = append(batch, c.ctrl...)
	clear(c.ctrl)
	c.ctrl = c.ctrl[:0]
	n, bytes := 0, 0
	for n < len(c.queue) && (n == 0 || bytes+c.queue[n].size() <= takeBudget) {
		bytes += c.queue[n].size()
		n++
	}
	batch = append(batch, c.queue[:n]...)
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	return batch, rest > 0
}

// run is the connection's reader goroutine: dial (if dialed), handshake,
// start the writer, read until failure, then report PeerLost.
func (c *conn) run() {
	b := c.b
	writer := false
	fr, err := c.handshake()
	if err == nil {
		b.mu.Lock()
		b.goLocked(c.writeLoop)
		b.mu.Unlock()
		writer = true
		err = c.readLoop(fr)
	}
	if c.fail(err) {
		if _, _, ok := kvxfer.RefusalOf(err); ok {
			b.stats.refused.Add(1)
		}
	}
	if writer {
		<-c.writerDone
		b.stats.live.Add(-1)
	}
	err = c.failed()
	b.stats.lost.Add(1)
	// A loss is a warning unless this process is stopping: Close, or
	// ShuttingDown before it (the peer may be a worker of this process
	// that stopped first).
	level := slog.LevelWarn
	if errors.Is(err, ErrClosed) || b.stopping.Load() {
		level = slog.LevelDebug
	}
	b.log.Log(context.Background(), level, "kv peer lost", "peer", c.id, "remote", c.remote, "err", err)
	b.cfg.Handler.PeerLost(c.id, err)
	b.forget(c)
}

// handshake dials (if needed), runs TLS (if configured), exchanges HELLO
// (and the secret's challenge–response) and calls PeerUp. It returns the
// reader of the connection's frames, which fails once nothing was received
// for the silence bound.
func (c *conn) handshake() (*kvxfer.FrameReader, error) {
	b := c.b
	nc := c.nc // set before run started for an accepted connection
	if c.dialed {
		var err error
		if nc, err = c.dial(); err != nil {
			return nil, err
		}
	}
	if err := nc.SetDeadline(time.Now().Add(b.cfg.HandshakeTimeout)); err != nil {
		return nil, fmt.Errorf("kv handshake with %s: %w", c.remote, err)
	}
	rw := nc
	if cfg := b.tlsConfig(c.dialed); cfg != nil {
		var tc *tls.Conn
		if c.dialed {
			tc = tls.Client(nc, cfg)
		} else {
			tc = tls.Server(nc, cfg)
		}
		if err := tc.Handshake(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				b.stats.handshakeFailed(FailTimeout)
				return nil, fmt.Errorf("kv TLS handshake with %s: peer %w for %v: %w", c.remote, ErrSilent, b.cfg.HandshakeTimeout, err)
			}
			b.stats.handshakeFailed(FailTLS)
			b.log.Warn("kv TLS handshake failed", "peer", c.id, "remote", c.remote, "err", err)
			return nil, fmt.Errorf("kv TLS handshake with %s %w: %w", c.remote, ErrRefused, err)
		}
		rw = tc
	}
	c.mu.Lock()
	c.rw = rw
	c.mu.Unlock()
	dr := &deadlineReader{nc: rw}
	fr := kvxfer.NewFrameReader(bufio.NewReaderSize(dr, readBufferBytes))
	fr.AllocData = b.cfg.AllocData
	var err error
	if c.dialed {
		err = c.helloDialed(rw, fr)
	} else {
		err = c.helloAccepted(rw, fr)
	}
	if err != nil {
		return nil, err
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("kv peer %s: %w", c.remote, err)
	}
	dr.timeout = b.cfg.silence()
	b.stats.up.Add(1)
	b.stats.live.Add(1)
	b.log.Info("kv peer up", "peer", c.id, "remote", c.remote, "dialed", c.dialed)
	b.cfg.Handler.PeerUp(c.id, c.remote)
	return fr, nil
}

// tlsConfig is the TLS configuration of a dialed or accepted connection
// (nil: plain TCP).
func (b *Backend) tlsConfig(dialed bool) *tls.Config {
	if dialed {
		return b.cfg.TLSClient
	}
	return b.cfg.TLSServer
}

// dial opens the TCP connection of a connection started by Connect.
func (c *conn) dial() (net.Conn, error) {
	b := c.b
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
	defer cancel()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.cancel = cancel
	c.mu.Unlock()
	nc, err := b.cfg.DialContext(ctx, "tcp", c.remote)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel = nil
	if c.err != nil { // closed while dialing
		if nc != nil {
			nc.Close()
		}
		return nil, c.err
	}
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err // "dial tcp <addr>:" would repeat the address
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no connection within %v: %w", b.cfg.DialTimeout, err)
		}
		return nil, fmt.Errorf("kv connect %s: %w", c.remote, err)
	}
	c.nc = nc
	return nc, nil
}

func nonce() [kvxfer.NonceBytes]byte {
	var n [kvxfer.NonceBytes]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never returns an error
	return n
}

// refused counts a handshake failure with reason and returns the error
// (wrapping ErrRefused) of the connection.
func (c *conn) refused(reason, format string, args ...any) error {
	c.b.stats.handshakeFailed(reason)
	dir := "with"
	if !c.dialed {
		dir = "from"
	}
	why := fmt.Sprintf(format, args...)
	return &kvxfer.RefusedError{Reason: refusalReason(reason, why), Detail: why,
		Msg: fmt.Sprintf("kv handshake %s %s %v: %s", dir, c.remote, ErrRefused, why)}
}

// readHandshake reads the next handshake frame, counting a failure.
func (c *conn) readHandshake(fr *kvxfer.FrameReader, want string) (kvxfer.Message, error) {
	m, n, err := fr.ReadFrame(kvxfer.MaxHandshakeFrameBytes)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "remote error" {
			// TLS 1.3: the server's refusal of this side's certificate
			// arrives as an alert at the first read.
			c.b.stats.handshakeFailed(FailTLS)
			return nil, fmt.Errorf("TLS %w by the peer: %w", ErrRefused, err)
		}
		err = c.handshakeReadError(err, want)
		switch {
		case errors.Is(err, ErrSilent):
			c.b.stats.handshakeFailed(FailTimeout)
		case isCodecError(err):
			c.b.stats.handshakeFailed(FailMalformed)
		}
		return nil, err
	}
	c.b.stats.received(m.Type(), n)
	return m, nil
}

// helloDialed sends HELLO, answers a challenge, and waits for HELLO_OK
// (checking prefill's proof when this side has a secret) or HELLO_ERR.
func (c *conn) helloDialed(nc net.Conn, fr *kvxfer.FrameReader) error {
	b := c.b
	hello := kvxfer.Hello{Version: kvxfer.ProtocolVersion, Fingerprint: b.cfg.Fingerprint, Nonce: nonce()}
	if b.cfg.Secret != nil {
		hello.Auth = kvxfer.AuthSecret
	}
	if err := c.writeHandshake(nc, hello); err != nil {
		return fmt.Errorf("kv handshake with %s: %w", c.remote, err)
	}
	m, err := c.readHandshake(fr, "HELLO_OK")
	if err != nil {
		return fmt.Errorf("kv handshake with %s: %w", c.remote, err)
	}
	var ch kvxfer.HelloChallenge
	switch v := m.(type) {
	case kvxfer.HelloErr:
		return c.refused(FailPeerRefused, "%s", v.Reason)
	case kvxfer.HelloOK:
		if b.cfg.Secret != nil {
			return c.refused(FailAuthMode, "prefill did not ask for the internal secret: it has none, so it cannot prove it is one of the fleet")
		}
		return nil
	case kvxfer.HelloChallenge:
		if b.cfg.Secret == nil {
			return c.refused(FailAuthMode, "prefill asks for an internal secret and this worker has none (--internal-secret)")
		}
		ch = v
	default:
		b.stats.malformed.Add(1)
		return c.refused(FailMalformed, "got %s, want HELLO_OK, HELLO_CHALLENGE or HELLO_ERR", m.Type())
	}
	mine, err := kvxfer.HandshakeProof(b.cfg.Secret, kvxfer.ProofDecode, hello, ch)
	if err != nil {
		return err
	}
	if err := c.writeHandshake(nc, kvxfer.HelloProof{MAC: mine}); err != nil {
		return fmt.Errorf("kv handshake with %s: %w", c.remote, err)
	}
	if m, err = c.readHandshake(fr, "HELLO_OK"); err != nil {
		return fmt.Errorf("kv handshake with %s: %w", c.remote, err)
	}
	switch v := m.(type) {
	case kvxfer.HelloErr:
		return c.refused(FailPeerRefused, "%s", v.Reason)
	case kvxfer.HelloOK:
		want, _ := kvxfer.HandshakeProof(b.cfg.Secret, kvxfer.ProofPrefill, hello, ch)
		if !hmac.Equal(v.Proof, want[:]) {
			b.log.Warn("kv handshake refused: prefill failed to prove the internal secret", "peer", c.id, "remote", c.remote)
			return c.refused(FailBadProof, "prefill failed to prove the internal secret")
		}
		return nil
	}
	b.stats.malformed.Add(1)
	return c.refused(FailMalformed, "got %s, want HELLO_OK or HELLO_ERR", m.Type())
}

// helloAccepted reads HELLO, checks it (with a secret: challenges the peer
// and checks its proof before anything else), and answers HELLO_OK (with
// this side's proof) or HELLO_ERR.
func (c *conn) helloAccepted(nc net.Conn, fr *kvxfer.FrameReader) error {
	b := c.b
	m, err := c.readHandshake(fr, "HELLO")
	if err != nil {
		if !isCodecError(err) {
			return fmt.Errorf("kv handshake from %s: %w", c.remote, err)
		}
		return c.refuse(nc, "", err.Error())
	}
	h, ok := m.(kvxfer.Hello)
	if !ok {
		b.stats.malformed.Add(1)
		return c.refuse(nc, FailMalformed, fmt.Sprintf("first frame is %s, want HELLO", m.Type()))
	}
	if reason, why := b.checkHello(h); reason != "" {
		return c.refuse(nc, reason, why)
	}
	var ok2 kvxfer.HelloOK
	if b.cfg.Secret != nil {
		ch := kvxfer.HelloChallenge{Nonce: nonce()}
		if err := c.writeHandshake(nc, ch); err != nil {
			return fmt.Errorf("kv handshake from %s: %w", c.remote, err)
		}
		m, err := c.readHandshake(fr, "HELLO_PROOF")
		if err != nil {
			if !isCodecError(err) {
				return fmt.Errorf("kv handshake from %s: %w", c.remote, err)
			}
			return c.refuse(nc, "", err.Error())
		}
		p, ok := m.(kvxfer.HelloProof)
		if !ok {
			b.stats.malformed.Add(1)
			return c.refuse(nc, FailMalformed, fmt.Sprintf("got %s, want HELLO_PROOF", m.Type()))
		}
		want, err := kvxfer.HandshakeProof(b.cfg.Secret, kvxfer.ProofDecode, h, ch)
		if err != nil || !hmac.Equal(p.MAC[:], want[:]) {
			return c.refuse(nc, FailBadProof, "decode failed to prove the internal secret")
		}
		proof, _ := kvxfer.HandshakeProof(b.cfg.Secret, kvxfer.ProofPrefill, h, ch)
		ok2.Proof = proof[:]
	}
	// Only a peer that proved itself (or any, without a secret) learns
	// how its model differs.
	if d := h.Fingerprint.Mismatch(b.cfg.Fingerprint); d != "" {
		return c.refuse(nc, FailFingerprint, "incompatible KV peer (decode vs prefill): "+d)
	}
	if err := c.writeHandshake(nc, ok2); err != nil {
		return fmt.Errorf("kv handshake from %s: %w", c.remote, err)
	}
	return nil
}

// refuse answers HELLO_ERR with why (best effort: the peer learns why,
// then the connection closes), counts reason (unless "": already counted)
// and returns the connection's error.
func (c *conn) refuse(nc net.Conn, reason, why string) error {
	_ = c.writeHandshake(nc, kvxfer.HelloErr{Reason: why})
	c.b.log.Warn("kv handshake refused", "peer", c.id, "remote", c.remote, "reason", why)
	if reason != "" {
		c.b.stats.handshakeFailed(reason)
	}
	return &kvxfer.RefusedError{Reason: refusalReason(reason, why), Detail: why,
		Msg: fmt.Sprintf("kv handshake from %s %v: %s", c.remote, ErrRefused, why)}
}

// refusalReason is the kvxfer.RefusalReason of a handshake failure (one of
// the Fail constants, "" for a codec error) with text why; a refusal by
// the peer is classified by its HELLO_ERR text.
func refusalReason(fail, why string) kvxfer.RefusalReason {
	switch fail {
	case FailVersion:
		return kvxfer.RefusedVersion
	case FailFingerprint:
		return kvxfer.RefusedFingerprint
	case FailAuthMode, FailBadProof, FailTLS:
		return kvxfer.RefusedAuth
	case FailPeerRefused:
		return kvxfer.ClassifyRefusal(why)
	}
	return kvxfer.RefusedProtocol
}

// checkHello returns the reason (one of the Fail constants) and why a
// HELLO is refused before any proof, or "", "".
func (b *Backend) checkHello(h kvxfer.Hello) (string, string) {
	if h.Version != kvxfer.ProtocolVersion {
		return FailVersion, fmt.Sprintf("protocol version %d vs %d (decode vs prefill)", h.Version, kvxfer.ProtocolVersion)
	}
	switch {
	case h.Auth == kvxfer.AuthSecret && b.cfg.Secret == nil:
		return FailAuthMode, "decode has an internal secret and this prefill has none (--internal-secret must be set on both)"
	case h.Auth != kvxfer.AuthSecret && b.cfg.Secret != nil:
		return FailAuthMode, "this prefill requires the internal secret and decode has none (--internal-secret)"
	}
	return "", ""
}

// writeHandshake writes one handshake frame (under the handshake deadline).
func (c *conn) writeHandshake(nc net.Conn, m kvxfer.Message) error {
	frame, err := kvxfer.AppendFrame(nil, m)
	if err != nil {
		return err
	}
	if _, err := nc.Write(frame); err != nil {
		return fmt.Errorf("write %s: %w", m.Type(), err)
	}
	c.b.stats.sent(m.Type(), len(frame))
	return nil
}

func (c *conn) handshakeReadError(err error, want string) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("peer %w for %v (no %s): %w", ErrSilent, c.b.cfg.HandshakeTimeout, want, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("connection closed before %s: %w", want, err)
	case isCodecError(err):
		c.b.stats.malformed.Add(1)
	}
	return err
}

func isCodecError(err error) bool {
	return errors.Is(err, kvxfer.ErrMalformed) || errors.Is(err, kvxfer.ErrUnknownType) ||
		errors.Is(err, kvxfer.ErrFrameTooLarge)
}

// readLoop reads frames until an error, answering PINGs and handing room
// messages to the Handler.
func (c *conn) readLoop(fr *kvxfer.FrameReader) error {
	b := c.b
	for {
		m, n, err := fr.ReadFrame(b.cfg.MaxFrameBytes)
		if err != nil {
			return c.readError(err)
		}
		t := m.Type()
		b.stats.received(t, n)
		switch m := m.(type) {
		case kvxfer.Ping:
			pong, err := kvxfer.AppendFrame(nil, kvxfer.Pong(m))
			if err != nil {
				return err // cannot happen: a PONG always encodes
			}
			if err := c.enqueue(outFrame{t: kvxfer.TypePong, hdr: pong}, true); err != nil {
				return err
			}
		case kvxfer.Pong:
		case kvxfer.Hello, kvxfer.HelloOK, kvxfer.HelloErr, kvxfer.HelloChallenge, kvxfer.HelloProof:
			b.stats.malformed.Add(1)
			return fmt.Errorf("kv peer %s: %w: %s after the handshake", c.remote, ErrProtocol, t)
		default:
			b.cfg.Handler.HandleMessage(c.id, m)
		}
	}
}

func (c *conn) readError(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		cfg := c.b.cfg
		return fmt.Errorf("kv peer %s %w for %v (%d missed heartbeats)",
			c.remote, ErrSilent, cfg.silence(), cfg.HeartbeatMisses)
	case err == io.EOF:
		return fmt.Errorf("kv peer %s closed the connection: %w", c.remote, err)
	case isCodecError(err):
		c.b.stats.malformed.Add(1)
		return fmt.Errorf("kv peer %s sent a bad frame: %w", c.remote, err)
	}
	return fmt.Errorf("kv peer %s: read: %w", c.remote, err)
}

// writeLoop is the connection's writer goroutine: it writes queued frames
// in order and a PING every HeartbeatInterval.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	b := c.b
	tick := time.NewTicker(b.cfg.HeartbeatInterval)
	defer tick.Stop()
	var (
		nonce uint64
		batch []outFrame
		w     = batchWriter{nc: c.rw, timeout: b.cfg.WriteTimeout}
	)
	for {
		select {
		case <-c.done:
			return
		case <-c.notify:
		case <-tick.C:
			nonce++
			ping, err := kvxfer.AppendFrame(nil, kvxfer.Ping{Nonce: nonce})
			if err != nil {
				c.fail(err) // cannot happen: a PING always encodes
				return
			}
			batch = append(batch, outFrame{t: kvxfer.TypePing, hdr: ping})
		}
		var more bool
		batch, more = c.take(batch)
		if more {
			// Come back at once for the rest, after any control frame
			// queued meanwhile.
			select {
			case c.notify <- struct{}{}:
			default:
			}
		}
		if len(batch) == 0 {
			continue
		}
		if err := w.write(batch); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("kv peer %s %w: accepted no data for %v: %w", c.remote, ErrSilent, b.cfg.WriteTimeout, err)
			} else {
				err = fmt.Errorf("kv peer %s: write: %w", c.remote, err)
			}
			c.fail(err)
			return
		}
		for _, f := range batch {
			b.stats.sent(f.t, f.size())
			if f.data != nil && b.cfg.SentData != nil {
				b.cfg.SentData(f.data)
			}
		}
		clear(batch)
		batch = batch[:0]
	}
}

// batchWriter writes frames with writev, at most maxWriteBytes per call,
// each call under its own write deadline. Data is never copied.
type batchWriter struct {
	nc      net.Conn
	timeout time.Duration
	iov     [][]byte // every buffer of the batch
	piece   [][]byte // the buffers of one write call
}

func (w *batchWriter) write(batch []outFrame) error {
	w.iov = w.iov[:0]
	for _, f := range batch {
		w.iov = append(w.iov, f.hdr)
		if len(f.data) > 0 {
			w.iov = append(w.iov, f.data)
		}
	}
	defer clear(w.iov)
	rest := w.iov
	for len(rest) > 0 {
		w.piece = w.piece[:0]
		n := 0
		for len(rest) > 0 && n < maxWriteBytes {
			p := rest[0]
			if room := maxWriteBytes - n; len(p) > room {
				w.piece = append(w.piece, p[:room])
				rest[0] = p[room:]
				n = maxWriteBytes
				break
			}
			w.piece = append(w.piece, p)
			n += len(p)
			rest = rest[1:]
		}
		if err := w.nc.SetWriteDeadline(time.Now().Add(w.timeout)); err != nil {
			return err
		}
		bufs := net.Buffers(w.piece)
		if _, err := bufs.WriteTo(w.nc); err != nil {
			clear(w.piece)
			return err
		}
	}
	clear(w.piece)
	return nil
}

// deadlineReader reads from a connection, pushing the read deadline
// timeout into the future before every read once the handshake is done, so
// that a connection fails after timeout without a received byte.
type deadlineReader struct {
	nc      net.Conn
	timeout time.Duration // 0 during the handshake (a fixed deadline applies)
}

func (r *deadlineReader) Read(p []byte) (int, error) {
	if r.timeout > 0 {
		if err := r.nc.SetReadDeadline(time.Now().Add(r.timeout)); err != nil {
			return 0, err
		}
	}
	return r.nc.Read(p)
}

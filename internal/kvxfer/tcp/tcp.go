package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// Defaults for zero Config fields.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatMisses   = 3
	// DefaultMaxFrameBytes lets a KV_CHUNK carry 64 MiB of Data.
	DefaultMaxFrameBytes    = 64<<20 + kvxfer.KVChunkHeaderBytes
	DefaultDialTimeout      = 5 * time.Second
	DefaultHandshakeTimeout = 5 * time.Second
)

// Errors. The errors passed to Handler.PeerLost and returned by Send wrap
// these where they apply (errors.Is); a lost connection's error also wraps
// the underlying network or codec error (kvxfer.ErrMalformed, …).
var (
	// ErrClosed: the Backend was closed.
	ErrClosed = errors.New("kv backend closed")
	// ErrUnknownPeer: Send to a PeerID this Backend never had or whose
	// PeerLost has returned.
	ErrUnknownPeer = errors.New("unknown peer")
	// ErrConnClosed: Send to a connection that has closed (its PeerLost is
	// due or under way); the error also wraps the reason it closed.
	ErrConnClosed = errors.New("connection closed")
	// ErrRefused: a handshake refused by either side (version, auth or
	// fingerprint mismatch, or a first frame that is not HELLO), e.g.
	// "kv handshake with 10.0.0.5:8998 refused: incompatible KV peer
	// (decode vs prefill): page_size 16 vs 32". It is kvxfer.ErrRefused,
	// the error every Backend wraps for a refused handshake.
	ErrRefused = kvxfer.ErrRefused
	// ErrSilent: the peer sent nothing for HeartbeatInterval ×
	// HeartbeatMisses, did not answer the handshake in HandshakeTimeout, or
	// accepted no bytes for WriteTimeout, e.g. "kv peer 10.0.0.5:8998
	// silent for 3s (3 missed heartbeats)".
	ErrSilent = errors.New("silent")
	// ErrProtocol: a frame that is valid but not allowed where it came (a
	// HELLO after the handshake), or Send of a message that is not a room
	// message.
	ErrProtocol = errors.New("protocol violation")
)

// Config configures a Backend. Zero fields take the defaults above.
type Config struct {
	// Fingerprint is this worker's model fingerprint. The listening side
	// refuses a connecting peer whose fingerprint differs in any field.
	Fingerprint kvxfer.Fingerprint
	// Secret, if set, is the key both sides of every connection prove
	// they hold, by challenge–response (see package kvxfer, Handshake): a
	// key derived from the fleet's shared secret (auth.DeriveKey with
	// auth.PurposeKV). A peer that cannot prove it, or that proves a
	// secret this side does not have, is refused, in both directions; the
	// secret never travels.
	Secret []byte
	// TLSServer, if set, wraps every accepted connection in TLS (the
	// prefill side; a configuration that requires client certificates
	// makes the channel mutually authenticated); TLSClient every dialed
	// one (decode). The TLS handshake runs before HELLO, within
	// HandshakeTimeout.
	TLSServer, TLSClient *tls.Config
	// Handler receives peers and messages. Nil discards them.
	Handler kvxfer.Handler
	// HeartbeatInterval is the time between PINGs on each connection.
	HeartbeatInterval time.Duration
	// HeartbeatMisses is how many intervals without a received byte make a
	// connection dead.
	HeartbeatMisses int
	// MaxFrameBytes is the largest frame received or sent, in bytes,
	// counting the type byte and the payload (not the 4-byte length).
	// A received larger frame closes the connection; Send of one fails.
	MaxFrameBytes int
	// DialTimeout bounds establishing a TCP connection.
	DialTimeout time.Duration
	// HandshakeTimeout bounds the HELLO exchange, on both sides.
	HandshakeTimeout time.Duration
	// DialContext opens the connections of Connect; nil uses a net.Dialer.
	// The context carries DialTimeout and is cancelled by Close. Tests and
	// fault injection use it to wrap or delay connections.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// WriteTimeout bounds each system write call of at most 4 MiB; default
	// HeartbeatInterval × HeartbeatMisses.
	WriteTimeout time.Duration
	// AllocData, if set, returns the buffer (of len n bytes) that a received
	// KVChunk's Data is read into, so a receiver can recycle buffers once it
	// has copied the KV into its pages; the Handler owns the buffer from
	// HandleMessage on. It must be safe for concurrent use. Nil allocates a
	// fresh buffer per frame.
	AllocData func(n int) []byte
	// SentData, if set, is called with a KVChunk's Data once its frame has
	// been written to the connection: the Backend holds no reference to it
	// after that, so the sender may reuse the buffer (each Send must then
	// pass a buffer of its own). Data of frames dropped with a failed
	// connection is not reported; it is left to the garbage collector. It
	// is called from the connection's writer goroutine and must not block.
	SentData func(data []byte)
	// Logger receives connection events. Nil discards them.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HeartbeatMisses <= 0 {
		c.HeartbeatMisses = DefaultHeartbeatMisses
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = c.silence()
	}
	if c.DialContext == nil {
		var d net.Dialer
		c.DialContext = d.DialContext
	}
	if c.Handler == nil {
		c.Handler = discardHandler{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// silence is how long a connection may receive nothing before it is dead.
func (c Config) silence() time.Duration {
	return c.HeartbeatInterval * time.Duration(c.HeartbeatMisses)
}

type discardHandler struct{}

func (discardHandler) PeerUp(kvxfer.PeerID, string)                {}
func (discardHandler) HandleMessage(kvxfer.PeerID, kvxfer.Message) {}
func (discardHandler) PeerLost(kvxfer.PeerID, error)               {}

// Backend is the TCP implementation of kvxfer.Backend.
type Backend struct {
	cfg   Config
	log   *slog.Logger
	stats counters

	closing chan struct{} // closed by Close
	// stopping is set by ShuttingDown: a connection lost from then on is
	// expected, and logged at debug level.
	stopping atomic.Bool

	mu     sync.Mutex
	idle   sync.Cond // broadcast when active drops to zero
	active int       // goroutines started and not yet returned
	closed bool
	nextID kvxfer.PeerID
	conns  map[kvxfer.PeerID]*conn
	byAddr map[string]*conn // connections started by Connect, by address
	dialed map[string]bool  // every address Connect dialed (for Reconnects)
	lns    []net.Listener
}

var _ kvxfer.Backend = (*Backend)(nil)

// New returns a Backend that neither listens nor connects yet.
func New(cfg Config) *Backend {
	cfg = cfg.withDefaults()
	b := &Backend{
		cfg:     cfg,
		log:     cfg.Logger,
		closing: make(chan struct{}),
		conns:   make(map[kvxfer.PeerID]*conn),
		byAddr:  make(map[string]*conn),
		dialed:  make(map[string]bool),
	}
	b.idle.L = &b.mu
	return b
}

// goLocked runs f in a goroutine that Close waits for. b.mu must be held.
func (b *Backend) goLocked(f func()) {
	b.active++
	go func() {
		defer func() {
			b.mu.Lock()
			b.active--
			if b.active == 0 {
				b.idle.Broadcast()
			}
			b.mu.Unlock()
		}()
		f()
	}()
}

// Listen accepts connections on addr (host:port; port 0 picks one) until
// Close, and returns the address bound. Each accepted connection must send
// HELLO within HandshakeTimeout. It returns the listen error, or ErrClosed
// after Close.
func (b *Backend) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("kv listen %s: %w", addr, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		ln.Close()
		return "", ErrClosed
	}
	b.lns = append(b.lns, ln)
	b.goLocked(func() { b.acceptLoop(ln) })
	b.log.Info("kv listening", "addr", ln.Addr().String())
	return ln.Addr().String(), nil
}

func (b *Backend) acceptLoop(ln net.Listener) {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-b.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// E.g. out of file descriptors: back off and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			b.log.Warn("kv accept failed", "addr", ln.Addr().String(), "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-b.closing:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			nc.Close()
			return
		}
		c := b.newConnLocked(nc.RemoteAddr().String(), nc)
		b.stats.accepts.Add(1)
		b.goLocked(c.run)
		b.mu.Unlock()
	}
}

// Connect returns the connection to addr that is live or still connecting,
// or starts a new one with a new PeerID. It never blocks: the dial and
// handshake run in the background, Send queues until they complete, and a
// failure is reported through Handler.PeerLost. After Close it returns a new
// PeerID whose PeerLost(ErrClosed) is called at once from a new goroutine (a
// second Close waits for it).
func (b *Backend) Connect(addr string) kvxfer.PeerID {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.byAddr[addr]; c != nil && c.failed() == nil {
		return c.id
	}
	c := b.newConnLocked(addr, nil)
	b.stats.dials.Add(1)
	if b.dialed[addr] {
		b.stats.reconnects.Add(1)
	}
	b.dialed[addr] = true
	if b.closed {
		c.fail(ErrClosed)
	} else {
		b.byAddr[addr] = c
	}
	b.goLocked(c.run)
	return c.id
}

// Send queues m on the connection and returns without blocking. m must be a
// room message (ROOM_OPEN … ABORT_ACK) passed by value. It returns an error
// wrapping ErrUnknownPeer or ErrConnClosed if the connection is unknown or
// closed, ErrProtocol for another message type, kvxfer.ErrFrameTooLarge for a
// frame above MaxFrameBytes, or an encoding error (kvxfer.ErrFieldTooLong);
// the message is then dropped. Success means queued, not delivered.
func (b *Backend) Send(peer kvxfer.PeerID, m kvxfer.Message) error {
	hdr, err := kvxfer.AppendFrameHeader(nil, m)
	if err != nil {
		return fmt.Errorf("kv send to peer %d: %w", peer, err)
	}
	t := kvxfer.Type(hdr[kvxfer.LengthBytes])
	if t < kvxfer.TypeRoomOpen || t > kvxfer.TypeAbortAck {
		return fmt.Errorf("kv send to peer %d: %w: %s is not a room message", peer, ErrProtocol, t)
	}
	f := outFrame{t: t, hdr: hdr}
	if c, ok := m.(kvxfer.KVChunk); ok && len(c.Data) > 0 {
		f.data = c.Data
	}
	if n := len(hdr) - kvxfer.LengthBytes + len(f.data); n > b.cfg.MaxFrameBytes {
		return fmt.Errorf("kv send to peer %d: %w: %s frame of %d bytes exceeds the maximum of %d",
			peer, kvxfer.ErrFrameTooLarge, t, n, b.cfg.MaxFrameBytes)
	}
	b.mu.Lock()
	c := b.conns[peer]
	b.mu.Unlock()
	if c == nil {
		return fmt.Errorf("kv send to peer %d: %w", peer, ErrUnknownPeer)
	}
	// Room control messages overtake queued KV data: a renewal or an abort
	// must not wait behind megabytes of another room's chunks. KV_DONE
	// stays in the data queue, behind its room's chunks.
	return c.enqueue(f, t != kvxfer.TypeKVChunk && t != kvxfer.TypeKVDone)
}

// Remote returns the address of a connection: the address given to Connect,
// or the remote address of an accepted connection. It returns "" for an
// unknown PeerID or once the connection's PeerLost has returned.
func (b *Backend) Remote(peer kvxfer.PeerID) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.conns[peer]; c != nil {
		return c.remote
	}
	return ""
}

var _ kvxfer.ShutdownNotifier = (*Backend)(nil)

// ShuttingDown implements kvxfer.ShutdownNotifier: from now on a lost
// connection (a peer that closed, as a worker of the same process does when
// it stops first) is logged at debug level, as after Close. Nothing else
// changes: connections stay open until Close.
func (b *Backend) ShuttingDown() { b.stopping.Store(true) }

var _ kvxfer.PeerCloser = (*Backend)(nil)

// ClosePeer implements kvxfer.PeerCloser: it closes the connection as if it
// had failed with err, which Handler.PeerLost then receives (once, like any
// failure; a nil err is replaced by one wrapping ErrConnClosed). A
// connection still dialing or in its handshake is abandoned the same way.
// Later Sends to peer fail with ErrConnClosed or ErrUnknownPeer, and a
// Connect to the same address opens a new connection. An unknown peer, or
// one already closed, is a no-op. ClosePeer does not block and may be
// called from a Handler method.
func (b *Backend) ClosePeer(peer kvxfer.PeerID, err error) {
	b.mu.Lock()
	c := b.conns[peer]
	b.mu.Unlock()
	if c == nil {
		return
	}
	if err == nil {
		err = fmt.Errorf("kv peer %s: %w by ClosePeer", c.remote, ErrConnClosed)
	}
	if c.fail(err) {
		b.log.Debug("kv peer closed on demand", "peer", c.id, "remote", c.remote, "err", err)
	}
}

// Close closes every listener and connection (each connection's PeerLost gets
// an error wrapping ErrClosed unless it had already failed) and waits for all
// goroutines of the Backend to return. It must not be called from a Handler
// method. It returns nil; a second call only waits again.
func (b *Backend) Close() error {
	b.mu.Lock()
	var lns []net.Listener
	var conns []*conn
	if !b.closed {
		b.closed = true
		close(b.closing)
		lns, b.lns = b.lns, nil
		for _, c := range b.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.fail(ErrClosed)
	}
	b.mu.Lock()
	for b.active > 0 {
		b.idle.Wait()
	}
	b.mu.Unlock()
	return nil
}

// newConnLocked registers a connection with a fresh PeerID: an accepted
// one (nc set) or one to dial (nc nil). b.mu must be held.
func (b *Backend) newConnLocked(remote string, nc net.Conn) *conn {
	b.nextID++
	c := &conn{
		b:          b,
		id:         b.nextID,
		remote:     remote,
		dialed:     nc == nil,
		nc:         nc,
		done:       make(chan struct{}),
		writerDone: make(chan struct{}),
		notify:     make(chan struct{}, 1),
	}
	b.conns[c.id] = c
	return c
}

// forget removes a connection after its PeerLost.
func (b *Backend) forget(c *conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c.id)
	if b.byAddr[c.remote] == c {
		delete(b.byAddr, c.remote)
	}
}

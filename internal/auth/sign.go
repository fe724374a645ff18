package auth

// Request signing of the worker API with the shared internal secret.
//
// The router (Signer) signs every request:
//
//	Authorization: PDSERVE-HMAC-SHA256 ts=<unix ms>,nonce=<32 hex>,sig=<64 hex>
//	X-Pdserve-Content-Sha256: <64 hex: SHA-256 of the body>
//
//	sig = HMAC-SHA256(K, "PDSERVE-HMAC-SHA256\n" ts "\n" nonce "\n" METHOD "\n"
//	                     path?query "\n" hex(SHA-256(body)))
//
// with K = DeriveKey(secret, PurposeWorkerAPI). The worker (PeerAuth)
// checks the signature over the headers first (a caller without the secret
// gets 401 before a byte of its body is read), then that ts is within
// ±Window of its clock, that it has not seen the nonce within the window,
// and, reading the body (bounded), that its digest is the signed one. So a
// request cannot be forged, altered or replayed to the same worker. The
// worker then proves it holds the secret too, on every answer to a signed
// request:
//
//	X-Pdserve-Proof: hex(HMAC-SHA256(K, "PDSERVE-HMAC-SHA256-ANSWER\n" nonce "\n" status))
//
// and the Signer refuses an answer without a valid proof, so the router
// never takes tokens from an impostor at a worker's address. Neither
// direction carries the secret. Without TLS the bodies are readable on the
// wire and an answer's body is not covered by the proof: against an
// attacker who can modify traffic in flight, use mutual TLS.

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// Header names and the signature scheme.
const (
	SchemeHMAC      = "PDSERVE-HMAC-SHA256"
	HeaderDigest    = "X-Pdserve-Content-Sha256"
	HeaderProof     = "X-Pdserve-Proof"
	answerLabel     = "PDSERVE-HMAC-SHA256-ANSWER"
	nonceBytes      = 16
	maxAuthzBytes   = 256
	DefaultWindow   = 30 * time.Second
	DefaultMaxNonce = 1 << 18
)

// Reasons a worker refuses a caller (PeerAuth.Failures; the KV channel
// has its own).
const (
	ReasonMissing      = "missing"        // no signature
	ReasonMalformed    = "malformed"      // a signature header that does not parse
	ReasonBadSignature = "bad_signature"  // the signature does not match
	ReasonStale        = "stale"          // ts outside the window
	ReasonReplayed     = "replayed"       // a nonce seen within the window
	ReasonBadDigest    = "bad_digest"     // the body is not the one signed
	ReasonTooLarge     = "too_large"      // a body over the limit (413)
	ReasonNonceCache   = "nonce_cache"    // too many nonces in the window (503)
	ReasonNoClientCert = "no_client_cert" // no certificate of the fleet's CA
	// ReasonBadCertificate: a TLS handshake refused for a client
	// certificate that does not verify (counted with Count from the TLS
	// configuration's OnReject).
	ReasonBadCertificate = "bad_certificate"
)

// PeerReasons lists every reason of PeerAuth.Failures.
var PeerReasons = []string{ReasonMissing, ReasonMalformed, ReasonBadSignature, ReasonStale, ReasonReplayed,
	ReasonBadDigest, ReasonTooLarge, ReasonNonceCache, ReasonNoClientCert, ReasonBadCertificate}

func canonical(ts, nonce, method, target, digest string) []byte {
	var b bytes.Buffer
	for i, s := range []string{SchemeHMAC, ts, nonce, method, target, digest} {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(s)
	}
	return b.Bytes()
}

func mac(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}

func answerProof(key []byte, nonce string, status int) string {
	return hex.EncodeToString(mac(key, []byte(answerLabel+"\n"+nonce+"\n"+strconv.Itoa(status))))
}

// target is the signed request target: the escaped path and the query.
func target(r *http.Request) string {
	t := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		t += "?" + r.URL.RawQuery
	}
	return t
}

// ErrUnprovenAnswer is wrapped by the error of a Signer's RoundTrip whose
// answer does not carry the worker's proof: the answering server does not
// hold the secret (or is no pdserve worker).
var ErrUnprovenAnswer = errors.New("the worker's answer carries no valid proof of the internal secret")

// Signer is an http.RoundTripper that signs each request with the internal
// secret and checks the worker's proof on its answer. It is safe for
// concurrent use.
type Signer struct {
	key   []byte
	base  http.RoundTripper
	clock clock.PassiveClock
}

// NewSigner returns a Signer with secret sending through base (nil:
// http.DefaultTransport) on clk (nil: the wall clock).
func NewSigner(secret []byte, base http.RoundTripper, clk clock.PassiveClock) *Signer {
	if base == nil {
		base = http.DefaultTransport
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Signer{key: DeriveKey(secret, PurposeWorkerAPI), base: base, clock: clk}
}

// Base is the transport the Signer sends through.
func (s *Signer) Base() http.RoundTripper { return s.base }

// CloseIdleConnections closes the base transport's idle connections.
func (s *Signer) CloseIdleConnections() {
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper. It reads the body (through
// GetBody when the request has one) to digest it, and returns an error
// wrapping ErrUnprovenAnswer for an answer without the worker's proof.
func (s *Signer) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	var nb [nonceBytes]byte
	_, _ = rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	ts := strconv.FormatInt(s.clock.Now().UnixMilli(), 10)
	sig := hex.EncodeToString(mac(s.key, canonical(ts, nonce, req.Method, target(req), digest)))
	r2 := req.Clone(req.Context())
	r2.Header.Set("Authorization", SchemeHMAC+" ts="+ts+",nonce="+nonce+",sig="+sig)
	r2.Header.Set(HeaderDigest, digest)
	if req.Body != nil && req.Body != http.NoBody {
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		r2.ContentLength = int64(len(body))
	}
	resp, err := s.base.RoundTrip(r2)
	if err != nil {
		return nil, err
	}
	want := answerProof(s.key, nonce, resp.StatusCode)
	if !hmac.Equal([]byte(resp.Header.Get(HeaderProof)), []byte(want)) {
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %w (is --internal-secret the same on the router and the worker?)",
			req.Method, req.URL.Redacted(), ErrUnprovenAnswer)
	}
	return resp, nil
}

func requestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	rc := req.Body
	if req.GetBody != nil {
		var err error
		if rc, err = req.GetBody(); err != nil {
			return nil, err
		}
		defer req.Body.Close()
	}
	defer rc.Close()
	return workerapi.ReadSized(rc, req.ContentLength)
}

// PeerAuth guards a worker's API: RequireCert demands a client
// certificate of the fleet's CA (verified by the TLS layer, see package
// tlsconf), a Verifier a request signed with the internal secret; with
// both, both. It counts every refusal by reason.
type PeerAuth struct {
	RequireCert bool
	Verifier    *Verifier
	failures    sync.Map // reason -> *atomic.Uint64
}

// Enabled reports whether PeerAuth checks anything.
func (p *PeerAuth) Enabled() bool { return p != nil && (p.RequireCert || p.Verifier != nil) }

// Failures returns the refusals so far by reason (every reason of
// PeerReasons, zeros included).
func (p *PeerAuth) Failures() map[string]uint64 {
	out := make(map[string]uint64, len(PeerReasons))
	for _, r := range PeerReasons {
		out[r] = 0
	}
	p.failures.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// Count counts a refusal the PeerAuth did not see itself (a TLS handshake
// refused for its certificate: ReasonBadCertificate).
func (p *PeerAuth) Count(reason string) { p.count(reason) }

func (p *PeerAuth) count(reason string) {
	v, _ := p.failures.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// Protected reports the paths of a worker that only the fleet may call:
// the worker API (/internal/*: legs, aborts, info). /health, /livez,
// /metrics and /debug/* (read-only views of the worker's state, for
// probes, Prometheus and `pdserve inspect`) stay open.
func Protected(path string) bool {
	return strings.HasPrefix(path, "/internal/")
}

// Wrap returns next behind the checks for the paths protect selects (nil:
// Protected). A request with a signature on another path is verified too
// (and proven), so a router with the secret is always answered with a
// proof. Refusals are OpenAI errors: 401 (code unauthenticated_peer), or
// 503 when the nonce cache is full. bodyLimit bounds the body read to
// check its digest (413 beyond).
func (p *PeerAuth) Wrap(next http.Handler, protect func(path string) bool, bodyLimit int64) http.Handler {
	if !p.Enabled() {
		return next
	}
	if protect == nil {
		protect = Protected
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guarded := protect(r.URL.Path)
		// A bearer key (the front door's, on `serve`'s shared port) is no
		// signature: it is not checked here.
		signed := strings.HasPrefix(r.Header.Get("Authorization"), SchemeHMAC+" ") && p.Verifier != nil
		if !guarded && !signed {
			next.ServeHTTP(w, r)
			return
		}
		if guarded && p.RequireCert && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0) {
			p.refuse(w, ReasonNoClientCert, "this worker API needs a client certificate of the fleet's CA (--internal-tls-cert)")
			return
		}
		if p.Verifier == nil {
			next.ServeHTTP(w, r)
			return
		}
		nonce, reason, msg := p.Verifier.verify(r, bodyLimit)
		if reason != "" {
			if reason == ReasonTooLarge {
				p.count(reason)
				openai.WriteError(w, openai.TooLarge(bodyLimit))
				return
			}
			p.refuse(w, reason, msg)
			return
		}
		next.ServeHTTP(&provingWriter{ResponseWriter: w, key: p.Verifier.key, nonce: nonce}, r)
	})
}

// CodeUnauthenticatedPeer is the error code of a worker API request the
// worker did not accept as the fleet's.
const CodeUnauthenticatedPeer = "unauthenticated_peer"

func (p *PeerAuth) refuse(w http.ResponseWriter, reason, msg string) {
	p.count(reason)
	status := http.StatusUnauthorized
	if reason == ReasonNonceCache {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("WWW-Authenticate", SchemeHMAC)
	openai.WriteError(w, &openai.Error{Status: status, Type: openai.TypeInvalidRequest, Code: CodeUnauthenticatedPeer,
		Message: msg})
}

// provingWriter adds the worker's proof to the answer's header.
type provingWriter struct {
	http.ResponseWriter
	key    []byte
	nonce  string
	proved bool
}

func (pw *provingWriter) WriteHeader(status int) {
	if !pw.proved {
		pw.proved = true
		pw.Header().Set(HeaderProof, answerProof(pw.key, pw.nonce, status))
	}
	pw.ResponseWriter.WriteHeader(status)
}

func (pw *provingWriter) Write(b []byte) (int, error) {
	if !pw.proved {
		pw.WriteHeader(http.StatusOK)
	}
	return pw.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (pw *provingWriter) Flush() {
	if !pw.proved {
		pw.WriteHeader(http.StatusOK)
	}
	if f, ok := pw.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (pw *provingWriter) Unwrap() http.ResponseWriter { return pw.ResponseWriter }

// Verifier checks signed requests: the signature, the time window and the
// nonce cache. It is safe for concurrent use.
type Verifier struct {
	key    []byte
	clock  clock.PassiveClock
	window time.Duration
	max    int

	mu sync.Mutex
	// Two generations of nonces, rotated every 2 × window: a nonce is
	// remembered for at least 2 × window, longer than a timestamp within
	// ±window of the clock can stay acceptable.
	cur, prev map[string]struct{}
	rotated   time.Time
}

// NewVerifier returns a Verifier for secret on clk (nil: the wall clock)
// accepting timestamps within ±window (0: DefaultWindow) and remembering at
// most maxNonces nonces (0: DefaultMaxNonce); more in a window are refused
// (503) rather than forgotten.
func NewVerifier(secret []byte, clk clock.PassiveClock, window time.Duration, maxNonces int) *Verifier {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if maxNonces <= 0 {
		maxNonces = DefaultMaxNonce
	}
	return &Verifier{key: DeriveKey(secret, PurposeWorkerAPI), clock: clk, window: window, max: maxNonces,
		cur: map[string]struct{}{}, prev: map[string]struct{}{}, rotated: clk.Now()}
}

// parseAuthorization splits "PDSERVE-HMAC-SHA256 ts=…,nonce=…,sig=…".
func parseAuthorization(h string) (ts, nonce, sig string, ok bool) {
	if len(h) > maxAuthzBytes {
		return "", "", "", false
	}
	scheme, rest, found := strings.Cut(h, " ")
	if !found || scheme != SchemeHMAC {
		return "", "", "", false
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "ts":
			ts = v
		case "nonce":
			nonce = v
		case "sig":
			sig = v
		}
	}
	if _, err := strconv.ParseInt(ts, 10, 64); err != nil || len(nonce) != 2*nonceBytes || len(sig) != 2*sha256.Size {
		return "", "", "", false
	}
	if _, err := hex.DecodeString(nonce); err != nil {
		return "", "", "", false
	}
	return ts, nonce, sig, true
}

// verify checks r and, on success, replaces its body with the bytes read
// and returns its nonce. On failure it returns the reason and a message
// for the caller (which never says which part of a signature was wrong
// beyond the reason).
func (v *Verifier) verify(r *http.Request, bodyLimit int64) (nonce, reason, msg string) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", ReasonMissing, "this worker API needs requests signed with --internal-secret (" + SchemeHMAC + ")"
	}
	ts, nonce, sig, ok := parseAuthorization(h)
	digest := r.Header.Get(HeaderDigest)
	if !ok || len(digest) != 2*sha256.Size {
		return "", ReasonMalformed, "malformed " + SchemeHMAC + " signature"
	}
	want := mac(v.key, canonical(ts, nonce, r.Method, target(r), digest))
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, want) {
		return "", ReasonBadSignature, "the request's signature does not match (is --internal-secret the same on the router and the worker?)"
	}
	ms, _ := strconv.ParseInt(ts, 10, 64)
	now := v.clock.Now()
	if d := now.Sub(time.UnixMilli(ms)); d > v.window || d < -v.window {
		return "", ReasonStale, fmt.Sprintf("the request was signed %v away from this worker's clock (window ±%v)", d.Round(time.Millisecond), v.window)
	}
	if reason := v.remember(nonce, now); reason != "" {
		if reason == ReasonReplayed {
			return "", reason, "the request's nonce was already used (a replay)"
		}
		return "", reason, "too many signed requests in the replay window; try again"
	}
	// Only now, from a caller that holds the secret, read the body.
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, bodyLimit+1))
		r.Body.Close()
		if err != nil {
			return "", ReasonBadDigest, "reading the body: " + err.Error()
		}
		if int64(len(body)) > bodyLimit {
			return "", ReasonTooLarge, ""
		}
	}
	sum := sha256.Sum256(body)
	if !hmac.Equal([]byte(hex.EncodeToString(sum[:])), []byte(digest)) {
		return "", ReasonBadDigest, "the body is not the one signed"
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return nonce, "", ""
}

// remember records nonce, or returns ReasonReplayed if it was seen, or
// ReasonNonceCache if the cache is full.
func (v *Verifier) remember(nonce string, now time.Time) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if el := now.Sub(v.rotated); el >= 2*v.window {
		// Every nonce of cur came in before rotated + 2 × window (or it
		// would have rotated then): after 4 × window none is needed.
		v.prev = v.cur
		if el >= 4*v.window {
			v.prev = make(map[string]struct{})
		}
		v.cur, v.rotated = make(map[string]struct{}), now
	}
	if _, ok := v.cur[nonce]; ok {
		return ReasonReplayed
	}
	if _, ok := v.prev[nonce]; ok {
		return ReasonReplayed
	}
	if len(v.cur)+len(v.prev) >= v.max {
		return ReasonNonceCache
	}
	v.cur[nonce] = struct{}{}
	return ""
}

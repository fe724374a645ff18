package auth

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/openai"
)

func TestKeysMatch(t *testing.T) {
	k := NewKeys("sk-one", "", "sk-two")
	if k.Len() != 2 {
		t.Fatalf("Len = %d, want 2 (empty keys are dropped)", k.Len())
	}
	for tok, want := range map[string]bool{"sk-one": true, "sk-two": true, "sk-on": false, "sk-one ": false, "": false, "SK-ONE": false} {
		if got := k.Match(tok); got != want {
			t.Errorf("Match(%q) = %v, want %v", tok, got, want)
		}
	}
	var none *Keys
	if none.Match("") || NewKeys().Match("") {
		t.Error("an empty set matched")
	}
}

// errBody decodes an OpenAI error answer.
func errBody(t *testing.T, rec *httptest.ResponseRecorder) openai.ErrorObject {
	t.Helper()
	var b openai.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return b.Error
}

// TestFrontDoorRefusalSentences: a refusal's message is written in
// sentences, each starting with a capital letter (not "... API key. the API
// needs one").
func TestFrontDoorRefusalSentences(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, tc := range []struct {
		p          FrontDoor
		path, key  string
		status     int
		wantPrefix string
	}{
		{FrontDoor{APIKeys: NewKeys("sk-api")}, "/v1/completions", "", 401,
			"You didn't provide an API key. The API needs one in an Authorization header: Authorization: Bearer YOUR_KEY."},
		{FrontDoor{APIKeys: NewKeys("sk-api")}, "/workers", "", 401,
			"You didn't provide an API key. The admin API needs an admin key (--admin-api-key) in an Authorization header"},
		{FrontDoor{APIKeys: NewKeys("sk-api"), AdminKeys: NewKeys("sk-admin")}, "/internal/v1/generate", "", 401,
			"You didn't provide an API key. The worker API needs one in an Authorization header"},
		{FrontDoor{APIKeys: NewKeys("sk-api")}, "/workers", "sk-api", 403,
			"The admin API needs an admin key: this server has no --admin-api-key"},
		{FrontDoor{APIKeys: NewKeys("sk-api"), AdminKeys: NewKeys("sk-admin")}, "/debug/requests", "", 401,
			"You didn't provide an API key. /debug needs one in an Authorization header"},
	} {
		hr := httptest.NewRequest("GET", tc.path, nil)
		if tc.key != "" {
			hr.Header.Set("Authorization", "Bearer "+tc.key)
		}
		rec := httptest.NewRecorder()
		tc.p.Wrap(ok).ServeHTTP(rec, hr)
		if rec.Code != tc.status {
			t.Errorf("%s key %q: status %d, want %d", tc.path, tc.key, rec.Code, tc.status)
			continue
		}
		if msg := errBody(t, rec).Message; !strings.HasPrefix(msg, tc.wantPrefix) {
			t.Errorf("%s key %q: message %q, want it to start %q", tc.path, tc.key, msg, tc.wantPrefix)
		}
	}
}

// TestFrontDoorPolicy: every path class, with and without each key, gets
// the documented answer; refusals are OpenAI errors with
// WWW-Authenticate and are reported.
func TestFrontDoorPolicy(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	api, admin := NewKeys("sk-api"), NewKeys("sk-admin")
	type req struct {
		method, path, key string
		want              int
	}
	for _, tc := range []struct {
		name string
		p    FrontDoor
		reqs []req
	}{
		{"nothing set", FrontDoor{}, []req{
			{"POST", "/v1/completions", "", 200}, {"DELETE", "/workers/x", "", 200}, {"GET", "/metrics", "", 200},
		}},
		{"api key", FrontDoor{APIKeys: api}, []req{
			{"POST", "/v1/completions", "", 401}, {"POST", "/v1/completions", "sk-wrong", 401},
			{"POST", "/v1/chat/completions", "sk-api", 200}, {"GET", "/v1/models", "sk-api", 200},
			{"GET", "/health", "", 200}, {"GET", "/livez", "", 200}, {"GET", "/metrics", "", 200},
			{"GET", "/discovery/prometheus", "", 200}, {"GET", "/nowhere", "", 401},
			// An API key reaches the OpenAI API only: no admin API, no
			// /debug (every client's requests), no worker API (aborts).
			{"GET", "/workers", "", 401}, {"GET", "/workers", "sk-api", 403}, {"GET", "/debug/requests", "sk-api", 403},
			{"GET", "/debug/requests", "", 401}, {"POST", "/workers", "sk-api", 403}, {"DELETE", "/workers/p-0", "sk-api", 403},
			{"POST", "/internal/v1/generate", "", 401}, {"POST", "/internal/v1/generate", "sk-api", 403},
			{"POST", "/internal/v1/abort", "sk-api", 403},
			// However the path is spelled.
			{"GET", "/x/../debug/requests", "sk-api", 403}, {"GET", "//debug/requests", "sk-api", 403},
			{"GET", "/debug", "sk-api", 403}, {"POST", "/health/../internal/v1/abort", "sk-api", 403},
		}},
		{"api and admin keys", FrontDoor{APIKeys: api, AdminKeys: admin}, []req{
			{"POST", "/v1/completions", "sk-admin", 401}, {"POST", "/v1/completions", "sk-api", 200},
			{"GET", "/workers", "sk-api", 401}, {"GET", "/workers", "sk-admin", 200},
			{"POST", "/workers/p-0/drain", "sk-admin", 200}, {"DELETE", "/workers/p-0", "", 401},
			{"GET", "/debug/requests", "sk-api", 401}, {"GET", "/debug/requests", "sk-admin", 200},
			{"GET", "/planner", "sk-api", 401}, {"GET", "/planner", "", 401}, {"GET", "/planner", "sk-admin", 200},
			{"POST", "/internal/v1/abort", "sk-api", 401}, {"POST", "/internal/v1/abort", "sk-admin", 200},
		}},
		{"admin key only", FrontDoor{AdminKeys: admin}, []req{
			{"POST", "/v1/completions", "", 200}, {"POST", "/workers", "", 401}, {"POST", "/workers", "sk-admin", 200},
		}},
		{"metrics need a key", FrontDoor{APIKeys: api, AdminKeys: admin, MetricsRequireKey: true}, []req{
			{"GET", "/metrics", "", 401}, {"GET", "/metrics", "sk-api", 200}, {"GET", "/metrics", "sk-admin", 200},
			{"GET", "/discovery/prometheus", "", 401}, {"GET", "/health", "", 200},
		}},
		{"internal guarded elsewhere", FrontDoor{APIKeys: api, InternalGuarded: true}, []req{
			{"POST", "/internal/v1/generate", "", 200}, {"POST", "/v1/completions", "", 401},
			{"GET", "/debug/requests", "sk-api", 403},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rejected []string
			p := tc.p
			p.OnReject = func(path string, status int, code string) { rejected = append(rejected, code) }
			h := p.Wrap(ok)
			refusals := 0
			for _, r := range tc.reqs {
				hr := httptest.NewRequest(r.method, r.path, nil)
				if r.key != "" {
					hr.Header.Set("Authorization", "Bearer "+r.key)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, hr)
				if rec.Code != r.want {
					t.Errorf("%s %s key %q: %d, want %d (%s)", r.method, r.path, r.key, rec.Code, r.want, rec.Body)
					continue
				}
				switch r.want {
				case 401:
					refusals++
					e := errBody(t, rec)
					if e.Code == nil || *e.Code != CodeInvalidAPIKey || e.Type != openai.TypeInvalidRequest {
						t.Errorf("%s %s: error %+v, want code %s", r.method, r.path, e, CodeInvalidAPIKey)
					}
					wa := rec.Header().Get("WWW-Authenticate")
					if !strings.HasPrefix(wa, "Bearer") || (r.key != "") != strings.Contains(wa, "invalid_token") {
						t.Errorf("%s %s key %q: WWW-Authenticate %q", r.method, r.path, r.key, wa)
					}
					if strings.Contains(rec.Body.String(), r.key) && r.key != "" {
						t.Errorf("the refusal echoes the key: %s", rec.Body)
					}
				case 403:
					refusals++
					if e := errBody(t, rec); e.Code == nil || *e.Code != CodeAdminAPIKeyRequired {
						t.Errorf("%s %s: error %+v, want code %s", r.method, r.path, e, CodeAdminAPIKeyRequired)
					}
				}
			}
			if len(rejected) != refusals {
				t.Errorf("OnReject called %d times, want %d", len(rejected), refusals)
			}
		})
	}
}

// TestFrontDoorAdmin: Admin (the router's /health detail) holds for an
// admin key, or on a front door with no key at all; never for an API key.
func TestFrontDoorAdmin(t *testing.T) {
	api, admin := NewKeys("sk-api"), NewKeys("sk-admin")
	for _, tc := range []struct {
		p    *FrontDoor
		key  string
		want bool
	}{
		{nil, "", true}, {&FrontDoor{}, "", true},
		{&FrontDoor{APIKeys: api}, "", false}, {&FrontDoor{APIKeys: api}, "sk-api", false},
		{&FrontDoor{APIKeys: api, AdminKeys: admin}, "sk-api", false},
		{&FrontDoor{APIKeys: api, AdminKeys: admin}, "sk-admin", true},
		{&FrontDoor{AdminKeys: admin}, "", false}, {&FrontDoor{AdminKeys: admin}, "sk-admin", true},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		if tc.key != "" {
			r.Header.Set("Authorization", "Bearer "+tc.key)
		}
		if got := tc.p.Admin(r); got != tc.want {
			t.Errorf("%+v key %q: Admin = %v, want %v", tc.p, tc.key, got, tc.want)
		}
	}
}

// handlerTransport serves requests with h in process.
type handlerTransport struct {
	h    http.Handler
	mu   sync.Mutex
	sent []*http.Request // what reached the server, bodies read into sentBody
	body [][]byte
	tls  *tls.ConnectionState
}

func (ht *handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
	}
	ht.mu.Lock()
	ht.sent = append(ht.sent, r.Clone(r.Context()))
	ht.body = append(ht.body, b)
	ht.mu.Unlock()
	return ht.replay(r, b), nil
}

// replay sends r with body b to the server again, as an attacker would.
func (ht *handlerTransport) replay(r *http.Request, b []byte) *http.Response {
	sr := httptest.NewRequest(r.Method, r.URL.String(), bytes.NewReader(b))
	sr.Header = r.Header.Clone()
	sr.TLS = ht.tls
	rec := httptest.NewRecorder()
	ht.h.ServeHTTP(rec, sr)
	return rec.Result()
}

var secret = []byte("0123456789abcdef0123456789abcdef")

// TestSignedRequests: a signed request passes and its answer is proven;
// a replay, a changed body, path or method, another secret, a stale or
// missing signature are refused with 401 before the handler runs, each
// counted by its reason; unsigned /health stays open.
func TestSignedRequests(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	var handled []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		handled = append(handled, r.Method+" "+r.URL.Path+" "+string(b))
		_, _ = io.WriteString(w, "done")
	})
	pa := &PeerAuth{Verifier: NewVerifier(secret, clk, 10*time.Second, 0)}
	ht := &handlerTransport{h: pa.Wrap(h, nil, 1<<10)}
	client := &http.Client{Transport: NewSigner(secret, ht, clk)}

	post := func(c *http.Client, path, body string) (*http.Response, error) {
		return c.Post("http://worker"+path, "application/json", strings.NewReader(body))
	}
	resp, err := post(client, "/internal/v1/abort", `{"rid":"a"}`)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "done" {
		t.Fatalf("signed request: %d %q", resp.StatusCode, b)
	}
	if len(handled) != 1 || handled[0] != `POST /internal/v1/abort {"rid":"a"}` {
		t.Fatalf("handled %q", handled)
	}
	orig, origBody := ht.sent[0], ht.body[0]

	refused := func(name, reason string, r *http.Request, body []byte) {
		t.Helper()
		before := pa.Failures()[reason]
		n := len(handled)
		resp := ht.replay(r, body)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
		if resp.Header.Get(HeaderProof) != "" {
			t.Errorf("%s: a refusal carries a proof", name)
		}
		if got := pa.Failures()[reason]; got != before+1 {
			t.Errorf("%s: failures[%s] = %d, want %d (%v)", name, reason, got, before+1, pa.Failures())
		}
		if len(handled) != n {
			t.Errorf("%s: the handler ran: %q", name, handled[n:])
		}
	}
	refused("replay", ReasonReplayed, orig, origBody)
	// A signed request caught on its way, delivered with another body.
	capt := &captureTransport{}
	if _, err := post(&http.Client{Transport: NewSigner(secret, capt, clk)}, "/internal/v1/abort", `{"rid":"a"}`); err == nil {
		t.Fatal("capture transport answered")
	}
	refused("another body", ReasonBadDigest, capt.req, []byte(`{"rid":"b"}`))
	moved := orig.Clone(orig.Context())
	moved.URL.Path = "/internal/v1/prefill"
	refused("another path", ReasonBadSignature, moved, origBody)
	bare := orig.Clone(orig.Context())
	bare.Header.Del("Authorization")
	refused("unsigned", ReasonMissing, bare, origBody)
	refused("garbage", ReasonMalformed, withHeader(orig, "Authorization", SchemeHMAC+" ts=1,nonce=zz,sig=00"), origBody)

	// Another secret: refused; the client sees its own error.
	other := &http.Client{Transport: NewSigner([]byte("another secret, as long as it is"), ht, clk)}
	if resp, err := post(other, "/internal/v1/abort", `{}`); err == nil {
		t.Errorf("a request with another secret got %d, want an unproven answer", resp.StatusCode)
	}
	if got := pa.Failures()[ReasonBadSignature]; got != 2 {
		t.Errorf("bad_signature = %d, want 2", got)
	}

	// Stale: a request signed 11 s ago (window 10 s).
	oldClient := &http.Client{Transport: NewSigner(secret, ht, clocktesting.NewFakeClock(clk.Now().Add(-11*time.Second)))}
	if _, err := post(oldClient, "/internal/v1/abort", `{}`); err == nil {
		t.Error("a stale request was answered with a proof")
	}
	if got := pa.Failures()[ReasonStale]; got != 1 {
		t.Errorf("stale = %d, want 1", got)
	}

	// /health unsigned: open, no proof. Signed: proven.
	resp = ht.replay(httptest.NewRequest("GET", "/health", nil), nil)
	if resp.StatusCode != 200 {
		t.Errorf("unsigned /health: %d", resp.StatusCode)
	}
	if resp, err := client.Get("http://worker/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("signed /health: %v", err)
	}
}

// captureTransport keeps the request it is given and answers nothing.
type captureTransport struct{ req *http.Request }

func (c *captureTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.req = r.Clone(r.Context())
	return nil, errors.New("captured")
}

func withHeader(r *http.Request, k, v string) *http.Request {
	c := r.Clone(r.Context())
	c.Header.Set(k, v)
	return c
}

// TestImpostorWorker: an answer without the worker's proof (a server at
// the worker's address that does not hold the secret) is an error for the
// router, never an answer.
func TestImpostorWorker(t *testing.T) {
	impostor := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"token_ids":[1,2,3]}`)
	})}
	c := &http.Client{Transport: NewSigner(secret, impostor, nil)}
	_, err := c.Get("http://worker/internal/v1/info")
	if !errors.Is(err, ErrUnprovenAnswer) {
		t.Fatalf("err %v, want ErrUnprovenAnswer", err)
	}
}

// TestNonceCacheBounded: the cache never holds more than its maximum (more
// signed requests in a window get 503) and forgets nonces once their
// timestamps are out of the window, which then refuses them as stale.
func TestNonceCacheBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	pa := &PeerAuth{Verifier: NewVerifier(secret, clk, time.Second, 3)}
	ht := &handlerTransport{h: pa.Wrap(http.NotFoundHandler(), nil, 1<<10)}
	c := &http.Client{Transport: NewSigner(secret, ht, clk)}
	for i := range 4 {
		resp, err := c.Get("http://worker/internal/v1/info")
		if i == 3 {
			// Refused with 503 (an answer without a proof).
			if err == nil || pa.Failures()[ReasonNonceCache] != 1 {
				t.Fatalf("request over the cache's bound: %v, failures %v", err, pa.Failures())
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("request %d: %d, want 404", i, resp.StatusCode)
		}
	}
	first, firstBody := ht.sent[0], ht.body[0]
	clk.Step(5 * time.Second)
	if resp, err := c.Get("http://worker/internal/v1/info"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("after the window: %v", err)
	}
	v := pa.Verifier
	v.mu.Lock()
	n := len(v.cur) + len(v.prev)
	v.mu.Unlock()
	if n != 1 {
		t.Errorf("cache holds %d nonces after 5 windows, want 1", n)
	}
	if resp := ht.replay(first, firstBody); resp.StatusCode != http.StatusUnauthorized || pa.Failures()[ReasonStale] != 1 {
		t.Errorf("replay of a forgotten nonce: %d, failures %v", resp.StatusCode, pa.Failures())
	}
}

// TestRequireCert: with RequireCert, the worker API needs a peer
// certificate; /health does not.
func TestRequireCert(t *testing.T) {
	pa := &PeerAuth{RequireCert: true}
	h := pa.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), nil, 0)
	for _, tc := range []struct {
		path string
		tls  *tls.ConnectionState
		want int
	}{
		{"/internal/v1/abort", nil, 401},
		{"/internal/v1/abort", &tls.ConnectionState{}, 401},
		{"/internal/v1/abort", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{}}}, 200},
		{"/debug/requests", nil, 200},
		{"/health", nil, 200},
		{"/metrics", nil, 200},
	} {
		r := httptest.NewRequest("POST", tc.path, nil)
		r.TLS = tc.tls
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != tc.want {
			t.Errorf("%s tls %v: %d, want %d", tc.path, tc.tls != nil, rec.Code, tc.want)
		}
	}
	if pa.Failures()[ReasonNoClientCert] != 2 {
		t.Errorf("no_client_cert = %d, want 2", pa.Failures()[ReasonNoClientCert])
	}
}

// TestDocumented: docs/api.md names the error codes of this package.
func TestDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{CodeInvalidAPIKey, CodeAdminAPIKeyRequired, CodeUnauthenticatedPeer} {
		if !strings.Contains(string(b), "`"+c+"`") {
			t.Errorf("docs/api.md does not document the code %s", c)
		}
	}
}

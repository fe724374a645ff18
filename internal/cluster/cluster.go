// Package cluster assembles pdserve processes: a worker or a router with its
// HTTP server, and `pdserve up` — a router with N prefill and M decode
// workers in one process on loopback. The commands and the end-to-end tests
// use it, so both run exactly the same wiring.
//
// # Ownership
//
// Every server a Start function returns is owned by the caller, who must
// Shutdown it; Shutdown closes everything the server started.
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/auth"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/kvxfer/tcp"
	"github.com/pdserve/pdserve/internal/lifecycle"
	"github.com/pdserve/pdserve/internal/metrics"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/registry"
	etcdreg "github.com/pdserve/pdserve/internal/registry/etcd"
	"github.com/pdserve/pdserve/internal/router"
	"github.com/pdserve/pdserve/internal/tlsconf"
	"github.com/pdserve/pdserve/internal/tracing"
	"github.com/pdserve/pdserve/internal/worker"
)

// ModelFactory returns a new model instance. Each worker gets its own: a
// model runs one forward at a time.
type ModelFactory func() (model.Model, error)

// WorkerOptions configures one worker process (or one worker of `up`).
type WorkerOptions struct {
	// Addr is the HTTP listen address, host:port (port 0 picks one).
	Addr    string
	Model   model.Model
	Machine lifecycle.Config
	// KVCacheMemory is the KV pool size in bytes.
	KVCacheMemory int64
	// KVListen is a prefill worker's KV channel address, host:port.
	KVListen string
	// Secret is the fleet's shared internal secret (--internal-secret):
	// the KV channel's challenge–response and the signatures of every
	// worker API request (empty: none).
	Secret string
	// KVAuth is a shared secret for the KV channel only (the deprecated
	// --kv-auth; Secret covers both channels). Empty: Secret's.
	KVAuth string
	// InternalTLS, if set, is the fleet's certificate and CA
	// (--internal-tls-*): the worker API is served over TLS and demands a
	// client certificate of the CA on /internal/*, and the KV channel runs
	// over mutual TLS.
	InternalTLS *tlsconf.Source
	// FrontDoor and FrontTLS guard a colocated worker's OpenAI API (serve:
	// --api-key…, --ssl-*); FrontTLS and InternalTLS exclude each other (one
	// port).
	FrontDoor *auth.FrontDoor
	FrontTLS  *tlsconf.Source
	// API are a colocated worker's OpenAI API options (serve:
	// --max-logprobs, --logprobs-mode).
	API openai.APIOptions
	// WrapBackend, if set, wraps the KV transport (fault injection in tests).
	WrapBackend func(kvxfer.Backend) kvxfer.Backend
	// KVDial, if set, opens a decode worker's KV connections (fault
	// injection at the network level); nil dials TCP.
	KVDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Etcd, if set, registers the worker in an etcd registry once it
	// serves, and deletes the registration when it drains or stops.
	Etcd *EtcdRegistration
	// Tracer traces the worker's legs (tracing.New; nil: off).
	Tracer trace.TracerProvider
	Logger *slog.Logger

	// MetricsCompat adds another system's metric names ("" or "sglang",
	// --metrics-compat); see worker.Config.
	MetricsCompat string
	// AdmissionDelay (decode workers) delays admitting every leg, so rooms
	// open late; see worker.Config.
	AdmissionDelay time.Duration
}

// EtcdRegistration says how a worker registers itself in etcd.
type EtcdRegistration struct {
	Config etcdreg.Config
	// TTL is the lease of the registration (--registry-ttl).
	TTL time.Duration
	// AdvertiseURL is the worker API's URL as routers reach it (default:
	// the URL it serves on); a prefill worker's KV address is advertised
	// on the same host, unless AdvertiseKVAddr says otherwise.
	AdvertiseURL string
	// AdvertiseKVAddr is a prefill worker's KV channel address (host:port)
	// as decode workers reach it (--advertise-kv-addr; default:
	// AdvertiseURL's host and the KV listener's port).
	AdvertiseKVAddr string
}

// WorkerServer is a running worker with its HTTP server.
type WorkerServer struct {
	Worker   *worker.Worker
	Registry *prometheus.Registry
	// URL is the worker API's base URL, http://host:port.
	URL string
	// Registration is the worker's etcd registration (nil without one).
	Registration *etcdreg.Registration
	etcd         *clientv3.Client
	srv          *http.Server
	done         chan error
	once         sync.Once
	err          error
	log          *slog.Logger
}

// serve serves h on addr, over TLS with tlsCfg when it is set; it returns
// the server's base URL (http:// or https://).
func serve(addr string, h http.Handler, tlsCfg *tls.Config, log *slog.Logger) (*http.Server, string, chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", nil, err
	}
	srv, url, done := serveOn(ln, h, tlsCfg, log)
	return srv, url, done, nil
}

// serveOn serves h on ln; done gets Serve's error once it returns (nil
// after Shutdown, or after ln was closed on purpose).
func serveOn(ln net.Listener, h http.Handler, tlsCfg *tls.Config, log *slog.Logger) (*http.Server, string, chan error) {
	// No ReadTimeout or WriteTimeout: responses stream for as long as a
	// request runs; handlers bound their own body reads and writes.
	srv := &http.Server{Handler: hygiene(h), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: MaxHeaderBytes}
	scheme := "http://"
	if tlsCfg != nil {
		srv.TLSConfig = tlsCfg
		scheme = "https://"
		if log != nil {
			// Refused handshakes (a client of another CA, a scanner) are
			// the client's problem: logged at debug level.
			srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
		}
	}
	done := make(chan error, 1)
	go func() {
		var err error
		if tlsCfg != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
			err = nil
		}
		done <- err
	}()
	return srv, scheme + ln.Addr().String(), done
}

// kvSecret is the KV channel's key of a worker (nil: none).
func (o *WorkerOptions) kvSecret() []byte {
	s := o.KVAuth
	if s == "" {
		s = o.Secret
	}
	if s == "" {
		return nil
	}
	return auth.DeriveKey([]byte(s), auth.PurposeKV)
}

// StartWorker builds a worker, starts its loop and serves its API on o.Addr.
func StartWorker(o WorkerOptions) (*WorkerServer, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.FrontTLS != nil && o.InternalTLS != nil {
		return nil, errors.New("a colocated worker serves its OpenAI API and its worker API on one port: give the front door's TLS (--ssl-*) or the internal one (--internal-tls-*), not both")
	}
	mc := o.Machine
	var kvb *tcp.Backend
	factory := func(h kvxfer.Handler, fp kvxfer.Fingerprint, bufs worker.DataBuffers) (kvxfer.Backend, error) {
		tc := tcp.Config{Fingerprint: fp, Secret: o.kvSecret(), Handler: h,
			AllocData: bufs.Alloc, SentData: bufs.Sent,
			DialContext:       o.KVDial,
			HeartbeatInterval: mc.HeartbeatInterval, HeartbeatMisses: mc.LeaseMisses,
			Logger: o.Logger.With("role", mc.Role.String(), "component", "kv")}
		if o.InternalTLS != nil {
			tc.TLSServer = o.InternalTLS.ServerConfig(tlsconf.RequiredClientCerts, nil)
			tc.TLSClient = o.InternalTLS.ClientConfig(nil)
		}
		kvb = tcp.New(tc)
		var b kvxfer.Backend = kvb
		if o.WrapBackend != nil {
			b = o.WrapBackend(b)
		}
		return b, nil
	}
	w, err := worker.New(worker.Config{Model: o.Model, Machine: mc, KVCacheMemory: o.KVCacheMemory,
		Backend: factory, KVListen: o.KVListen, MetricsCompat: o.MetricsCompat, AdmissionDelay: o.AdmissionDelay,
		Logger: o.Logger, Registerer: reg, Tracer: o.Tracer})
	if err != nil {
		return nil, err
	}
	w.Start()
	peer := &auth.PeerAuth{RequireCert: o.InternalTLS != nil}
	if o.Secret != "" {
		peer.Verifier = auth.NewVerifier([]byte(o.Secret), nil, 0, 0)
	}
	if err := metrics.NewPeerAuth(reg, mc.Role.String(), func() map[string]map[string]uint64 {
		out := map[string]map[string]uint64{metrics.ChannelWorkerAPI: peer.Failures()}
		if kvb != nil {
			out[metrics.ChannelKV] = kvb.Stats().HandshakeFailures
		}
		return out
	}); err != nil {
		_ = w.Shutdown(context.Background())
		return nil, err
	}
	var h http.Handler = peer.Wrap(w.Handler(reg), nil, workerMaxBody)
	if mc.Role == lifecycle.RoleColocated {
		if h, err = colocatedHandler(w, reg, peer, o.FrontDoor, o.API, o.Logger); err != nil {
			_ = w.Shutdown(context.Background())
			return nil, err
		}
	}
	var tlsCfg *tls.Config
	switch {
	case o.InternalTLS != nil:
		tlsCfg = o.InternalTLS.ServerConfig(tlsconf.OptionalClientCerts, peer.Count)
	case o.FrontTLS != nil:
		tlsCfg = o.FrontTLS.ServerConfig(frontClientCerts(o.FrontTLS), nil)
	}
	srv, url, done, err := serve(o.Addr, h, tlsCfg, o.Logger)
	if err != nil {
		_ = w.Shutdown(context.Background())
		return nil, err
	}
	ws := &WorkerServer{Worker: w, Registry: reg, URL: url, srv: srv, done: done, log: o.Logger}
	if o.Etcd != nil {
		if err := ws.register(o); err != nil {
			_ = ws.Shutdown(context.Background())
			return nil, err
		}
	}
	return ws, nil
}

// register starts the worker's etcd registration.
func (s *WorkerServer) register(o WorkerOptions) error {
	adv := o.Etcd.AdvertiseURL
	if adv == "" {
		adv = s.URL
	}
	adv, err := registry.ParseURL(adv)
	if err != nil {
		return fmt.Errorf("--advertise-url: %w", err)
	}
	if u, _ := url.Parse(adv); u != nil {
		if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("the worker binds %s, which routers on other hosts cannot dial: give --advertise-url with an address they reach", u.Host)
		}
	}
	cli, cfg, err := etcdreg.Client(o.Etcd.Config)
	if err != nil {
		return err
	}
	role := s.Worker.Role().String()
	rec := etcdreg.Record{ID: etcdreg.NewID(role), Role: role, URL: adv, Model: s.Worker.ModelInfo().Name}
	fp := s.Worker.Fingerprint()
	rec.Fingerprint = &fp
	if kv := s.Worker.KVAddr(); kv != "" {
		u, _ := url.Parse(adv)
		_, port, _ := net.SplitHostPort(kv)
		rec.KVAddr = net.JoinHostPort(u.Hostname(), port)
		if o.Etcd.AdvertiseKVAddr != "" {
			rec.KVAddr = o.Etcd.AdvertiseKVAddr
		}
	} else if o.Etcd.AdvertiseKVAddr != "" {
		return errors.New("--advertise-kv-addr is for prefill workers (they serve the KV channel)")
	}
	g, err := etcdreg.Register(cli, cfg, rec, o.Etcd.TTL)
	if err != nil {
		cli.Close()
		return err
	}
	s.Registration, s.etcd = g, cli
	s.log.Info("registering in etcd", "key", g.Key(), "advertise_url", adv, "ttl", o.Etcd.TTL)
	return nil
}

// deregister deletes the worker's etcd registration (bounded by 5 s).
func (s *WorkerServer) deregister() {
	if s.Registration == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Registration.Deregister(ctx); err != nil {
		s.log.Warn("etcd deregistration failed; the lease expires on its own", "err", err)
	}
}

// Drain takes the worker out of its registry, refuses new legs (503
// draining) and waits until every request it admitted has ended, or ctx
// ends (it returns ctx.Err()). Shutdown must follow.
func (s *WorkerServer) Drain(ctx context.Context) error {
	// Deregistering may wait for an unreachable etcd; the drain (503s to
	// new legs, /health draining) starts at once beside it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.deregister()
	}()
	err := s.Worker.Drain(ctx)
	<-done
	return err
}

// workerMaxBody bounds a worker API request body read to check its
// signature (the worker's own limit, worker.Config.MaxBodyBytes).
const workerMaxBody = 64 << 20

// frontClientCerts: a front door with a CA asks for client certificates
// and verifies the ones given.
func frontClientCerts(s *tlsconf.Source) tlsconf.ClientCerts {
	if s.HasCA() {
		return tlsconf.OptionalClientCerts
	}
	return tlsconf.NoClientCerts
}

// guardFrontDoor puts the front door's key policy before h, counting its
// refusals with answer (the front end's answer counter).
func guardFrontDoor(h http.Handler, fd *auth.FrontDoor, answer func(endpoint string, status int, code string)) http.Handler {
	if !fd.Enabled() {
		return h
	}
	p := *fd
	p.OnReject = func(path string, status int, code string) { answer(openai.EndpointOf(path), status, code) }
	return p.Wrap(h)
}

// colocatedHandler serves the OpenAI API (on the worker itself) next to the
// worker API, for `pdserve serve`, behind the front door's keys.
func colocatedHandler(w *worker.Worker, reg *prometheus.Registry, peer *auth.PeerAuth, fd *auth.FrontDoor, api openai.APIOptions, log *slog.Logger) (http.Handler, error) {
	info := w.ModelInfo()
	fe, err := metrics.NewFrontend(reg, "colocated")
	if err != nil {
		return nil, err
	}
	oa := openai.NewHandler(openai.Config{ModelName: info.Name, Tokenizer: w.Model().Tokenizer(), VocabSize: info.VocabSize,
		ContextLen: info.ContextLen, EOS: info.EOS, Engine: w, Logger: log.With("role", "colocated"), OnAnswer: fe.Answer, APIOptions: api})
	if w.Traced() {
		oa = tracing.Extracting(oa)
	}
	h := openai.Routes(oa, peer.Wrap(w.Handler(reg), nil, workerMaxBody))
	if fd != nil {
		p := *fd
		p.InternalGuarded = peer.Enabled()
		fd = &p
	}
	return guardFrontDoor(h, fd, fe.Answer), nil
}

// Shutdown fails the worker's live requests with an error, waits for their
// answers to be written, and stops the worker and its server.
// It is idempotent.
func (s *WorkerServer) Shutdown(ctx context.Context) error {
	s.once.Do(func() {
		s.deregister()
		err := s.Worker.Shutdown(ctx)
		err = errors.Join(err, s.srv.Shutdown(ctx))
		if err != nil {
			_ = s.srv.Close()
		}
		s.err = errors.Join(err, <-s.done)
		if s.etcd != nil {
			_ = s.etcd.Close()
		}
	})
	return s.err
}

// RouterOptions configures a router process.
type RouterOptions struct {
	Addr            string
	Prefill, Decode []string
	// Colocated lists colocated workers (the router's plain mode) instead.
	Colocated []string
	// Info and Tokenizer describe the served model.
	Info      model.Info
	Tokenizer model.Tokenizer
	// Registry, if set, is where the router learns its workers instead of
	// the lists above (etcd, Kubernetes); it is closed at Shutdown if it
	// is an io.Closer.
	Registry registry.Registry
	// HealthInterval, CheckTimeout, SuccessThreshold, FailureThreshold,
	// SlowStart and UnlistedGrace tune the health checks (router.Config; 0
	// = default).
	UnlistedGrace    time.Duration
	HealthInterval   time.Duration
	CheckTimeout     time.Duration
	SuccessThreshold int
	FailureThreshold int
	SlowStart        time.Duration
	RouterTuning
	// Secret signs every request to the workers (--internal-secret);
	// InternalTLS makes every worker call HTTPS with the fleet's client
	// certificate, whatever the scheme of the worker's URL
	// (--internal-tls-*).
	Secret      string
	InternalTLS *tlsconf.Source
	// FrontDoor is the key policy of the OpenAI API and the admin API
	// (--api-key, --admin-api-key, --metrics-require-key); FrontTLS serves
	// them over HTTPS (--ssl-*).
	FrontDoor *auth.FrontDoor
	FrontTLS  *tlsconf.Source
	// API are the OpenAI API's options (--max-logprobs, --logprobs-mode).
	API openai.APIOptions
	// Planner, if set, runs a planner in the router (--planner): its
	// SLOs, timing and actuator; the Recorder, Fleet, Clock, Logger and
	// Registerer are the router's. GET /planner shows it.
	Planner *planner.Config
	// Tracer traces the router's requests (tracing.New; nil: off).
	Tracer trace.TracerProvider
	Logger *slog.Logger
	// ReusePort listens with SO_REUSEPORT (Linux): a replacement router
	// may listen on the same port at once, and this one hands the port
	// over on Handoff (pdserve router).
	ReusePort bool
	// TakeOver (with ReusePort) makes this router the replacement of the
	// one listening on Addr: from its first connection it gets every new
	// connection to the port, the old one keeps only those it has.
	TakeOver bool
	// BeforeListen, if set, runs once the router has started, before it
	// listens; an error closes the router and is StartRouter's. pdserve
	// router, replacing another router on its port, waits there until it
	// can serve, so that no connection the kernel gives it is refused.
	BeforeListen func(*router.Router) error
}

// RouterTuning is how a router pairs and sheds load (router.Config; zero
// fields take its defaults).
type RouterTuning struct {
	// PrefillPolicy and DecodePolicy name each role's pair policy.
	PrefillPolicy, DecodePolicy string
	// CacheAware tunes the cache_aware policy (zero fields: its defaults).
	CacheAware router.CacheAwareConfig
	// LoadInterval is how often worker loads are polled; LoadStaleness how
	// old a report may be before it is ignored.
	LoadInterval, LoadStaleness time.Duration
	// Admission are the load-shedding thresholds (nil: the defaults).
	Admission *router.Admission
	// BreakerFailures and BreakerCooldown tune the KV path breakers.
	BreakerFailures int
	BreakerCooldown time.Duration
	// LegTimeout bounds a leg's exchange with a worker (0: the default).
	LegTimeout time.Duration
	// MaxMigrations bounds the continuations of one request on a new pair
	// (router.Config.MaxMigrations: 0 the default, negative none).
	MaxMigrations int
	// MigrationWait bounds a continuation's wait for a ready worker
	// (router.Config.MigrationWait: 0 the default, negative none).
	MigrationWait time.Duration
	// DisaggMinPromptTokens turns on per-request disaggregation
	// (router.Config.DisaggMinPromptTokens; 0: always disaggregate).
	DisaggMinPromptTokens int
}

// WorkerClient returns the HTTP client a router with secret and
// internalTLS (either may be unset) calls its workers with: the router's
// pooled transport, HTTPS with the fleet's certificate under internalTLS,
// every request signed and every answer's proof checked with secret.
func WorkerClient(secret string, internalTLS *tlsconf.Source) *http.Client {
	tr := router.NewTransport()
	var rt http.RoundTripper = tr
	if internalTLS != nil {
		tr.TLSClientConfig = internalTLS.ClientConfig(nil)
		rt = httpsOnly{tr}
	}
	if secret != "" {
		rt = auth.NewSigner([]byte(secret), rt, nil)
	}
	return &http.Client{Transport: rt}
}

// httpsOnly sends every request over HTTPS: with internal TLS a worker
// serves nothing else, whatever its registered URL says.
type httpsOnly struct{ *router.Transport }

func (h httpsOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "http" {
		r = r.Clone(r.Context())
		r.URL.Scheme = "https"
	}
	return h.Transport.RoundTrip(r)
}

// RouterServer is a running router with its HTTP server.
type RouterServer struct {
	Router   *router.Router
	Registry *prometheus.Registry
	URL      string
	srv      *http.Server
	ln       net.Listener
	done     chan error
	once     sync.Once
	err      error
	closer   io.Closer // the registry's resources (an etcd client)
	handoff  handoff
	// planner runs until stopPlanner; plannerDone closes when it returned
	// (and a change under way with it).
	planner     *planner.Planner
	stopPlanner context.CancelFunc
	plannerDone chan struct{}
}

// Planner is the router's planner, or nil.
func (s *RouterServer) Planner() *planner.Planner { return s.planner }

// StartRouter builds a router, checks its workers once, and serves.
func StartRouter(o RouterOptions) (*RouterServer, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var client *http.Client
	if o.Secret != "" || o.InternalTLS != nil {
		client = WorkerClient(o.Secret, o.InternalTLS)
	}
	var rec *planner.Recorder
	var pl *planner.Planner
	var plHandler http.Handler
	var rs *RouterServer
	if o.Planner != nil {
		pc := *o.Planner
		pc.Recorder, pc.Registerer, pc.Logger = nil, reg, o.Logger
		pc.Fleet = func() []planner.WorkerLoad { return rs.Router.PlannerFleet() } // run once rs is set
		var err error
		if pl, err = planner.New(pc); err != nil {
			return nil, err
		}
		rec, plHandler = pl.Recorder(), pl
	}
	r, err := router.New(router.Config{Registry: o.Registry, Recorder: rec, Planner: plHandler, Prefill: o.Prefill, Decode: o.Decode, Colocated: o.Colocated, Client: client,
		ModelName: o.Info.Name, Tokenizer: o.Tokenizer, ContextLen: o.Info.ContextLen, VocabSize: o.Info.VocabSize, EOS: o.Info.EOS, API: o.API,
		HealthInterval: o.HealthInterval, CheckTimeout: o.CheckTimeout, SuccessThreshold: o.SuccessThreshold,
		FailureThreshold: o.FailureThreshold, SlowStart: o.SlowStart, UnlistedGrace: o.UnlistedGrace, PrefillPolicy: o.PrefillPolicy, DecodePolicy: o.DecodePolicy,
		CacheAware: o.CacheAware, LoadInterval: o.LoadInterval, LoadStaleness: o.LoadStaleness, Admission: o.Admission,
		BreakerFailures: o.BreakerFailures, BreakerCooldown: o.BreakerCooldown, LegTimeout: o.LegTimeout, MaxMigrations: o.MaxMigrations, MigrationWait: o.MigrationWait,
		DisaggMinPromptTokens: o.DisaggMinPromptTokens,
		Logger:                o.Logger, Registerer: reg, Gatherer: reg, Tracer: o.Tracer,
		Guard: func(h http.Handler, answer func(string, int, string)) http.Handler {
			return guardFrontDoor(h, o.FrontDoor, answer)
		},
		HealthDetail: o.FrontDoor.Admin})
	if err != nil {
		return nil, err
	}
	r.Start()
	var tlsCfg *tls.Config
	if o.FrontTLS != nil {
		tlsCfg = o.FrontTLS.ServerConfig(frontClientCerts(o.FrontTLS), nil)
	}
	if o.BeforeListen != nil {
		if err := o.BeforeListen(r); err != nil {
			r.Close()
			return nil, err
		}
	}
	var ln net.Listener
	if o.ReusePort {
		ln, err = listenReusePort(o.Addr, o.TakeOver)
		if ln != nil && err != nil {
			if o.Logger != nil {
				o.Logger.Warn("the port is shared with the router it replaces until that one stops listening", "err", err)
			}
			err = nil
		}
	} else {
		ln, err = net.Listen("tcp", o.Addr)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	rs = &RouterServer{Router: r, Registry: reg, ln: ln}
	rs.srv, rs.URL, rs.done = serveOn(ln, rs.handoff.wrap(r.Handler()), tlsCfg, o.Logger)
	if pl != nil {
		ctx, cancel := context.WithCancel(context.Background())
		rs.planner, rs.stopPlanner = pl, cancel
		rs.plannerDone = make(chan struct{})
		go func() {
			defer close(rs.plannerDone)
			pl.Run(ctx)
		}()
	}
	if c, ok := o.Registry.(io.Closer); ok {
		rs.closer = c
	}
	return rs, nil
}

// Drain makes the router refuse new requests (503 with Retry-After) and
// waits until every request in flight has been answered, or ctx ends (it
// returns ctx.Err()). Shutdown must follow.
func (s *RouterServer) Drain(ctx context.Context) error {
	if s.stopPlanner != nil {
		// A draining fleet makes no more changes; a flip under way stops
		// before it removes or starts a worker.
		s.stopPlanner()
	}
	return s.Router.Drain(ctx)
}

// Shutdown answers every request in flight with a 503 (aborting its legs),
// stops accepting requests, and stops the router's background work.
// It is idempotent.
func (s *RouterServer) Shutdown(ctx context.Context) error {
	s.once.Do(func() {
		if s.stopPlanner != nil {
			// No change starts or goes on while the fleet shuts down.
			s.stopPlanner()
			<-s.plannerDone
		}
		s.Router.BeginShutdown()
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		s.Router.Close()
		if s.closer != nil {
			err = errors.Join(err, s.closer.Close())
		}
		s.err = errors.Join(err, <-s.done)
	})
	return s.err
}

// Options configures `pdserve up`.
type Options struct {
	// Host is the loopback (or other) address every server binds.
	Host string
	// RouterPort is the router's port (0 picks one).
	RouterPort int
	// WorkerPortBase, if positive, gives the workers fixed ports: worker k
	// (prefill first, then decode, then colocated) serves on
	// WorkerPortBase+k, prefill worker i's KV channel on WorkerPortBase+64+i.
	// 0 picks free ports.
	WorkerPortBase int
	// PrefillWorkers and DecodeWorkers count the workers (each ≥ 1), unless
	// ColocatedWorkers > 0: then the router spreads whole requests over
	// that many colocated workers instead (plain mode, no disaggregation).
	PrefillWorkers, DecodeWorkers int
	ColocatedWorkers              int
	NewModel                      ModelFactory
	// Worker is the template for every worker; Role, Addr and KVListen are
	// set per worker.
	Worker WorkerOptions
	// WrapBackend, if set, wraps the KV transport of worker i of a role
	// (fault injection).
	WrapBackend func(role lifecycle.Role, i int, b kvxfer.Backend) kvxfer.Backend
	// Router is the template of the router's options (its front door:
	// FrontDoor, FrontTLS; how it pairs and sheds load: RouterTuning); Addr, the workers, the model and the internal
	// secret are set by Up.
	Router RouterOptions
	// ReadyTimeout bounds waiting for the router to see every worker (default 30 s).
	ReadyTimeout   time.Duration
	HealthInterval time.Duration
	Logger         *slog.Logger
	// Planner, if set, runs the router's planner with FlipRoles as its
	// actuator (`pdserve up --planner`): the split of the workers follows
	// the load. FlipDrainTimeout bounds a flipped worker's drain (0: one
	// minute).
	Planner          *planner.Config
	FlipDrainTimeout time.Duration
	// TracerFor, if set, gives each component its tracer provider by
	// service name ("pdserve-router", "pdserve-prefill-0", …); nil: no
	// tracing.
	TracerFor func(service string) trace.TracerProvider
}

// Cluster is a running `pdserve up`.
type Cluster struct {
	Router    *RouterServer
	Prefill   []*WorkerServer
	Decode    []*WorkerServer
	Colocated []*WorkerServer

	secret      string
	internalTLS *tlsconf.Source

	// mu guards Prefill, Decode and Colocated while a role flip changes
	// them (FlipRoles); start starts one more worker of a role, next
	// counts each role's workers ever started (their log names).
	mu         sync.Mutex
	start      func(role lifecycle.Role, i int) (*WorkerServer, error)
	next       map[lifecycle.Role]int
	fixedPorts bool
	log        *slog.Logger
	// flipping holds the workers a flip under way took.
	flipping map[*WorkerServer]bool
	// startMu serializes the flips' calls of start.
	startMu sync.Mutex
}

// NewSecret returns a fresh internal secret: 32 random bytes as 64 hex
// digits.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	return hex.EncodeToString(b[:])
}

// WorkerClient is an HTTP client that calls the cluster's workers as its
// router does (signed with the cluster's secret).
func (c *Cluster) WorkerClient() *http.Client { return WorkerClient(c.secret, c.internalTLS) }

// URL is the router's base URL.
func (c *Cluster) URL() string { return c.Router.URL }

// Workers lists every worker.
func (c *Cluster) Workers() []*WorkerServer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(append(append([]*WorkerServer{}, c.Prefill...), c.Decode...), c.Colocated...)
}

// Up starts the workers and the router and waits until the router sees every
// worker healthy. On error everything started is shut down.
func Up(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.ColocatedWorkers == 0 && (o.PrefillWorkers < 1 || o.DecodeWorkers < 1) {
		return nil, fmt.Errorf("need at least one prefill and one decode worker, got %d and %d", o.PrefillWorkers, o.DecodeWorkers)
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Worker.Secret == "" && o.Worker.InternalTLS == nil {
		// The fleet's own loopback channels are authenticated too: with a
		// secret that lives as long as the process.
		o.Worker.Secret = NewSecret()
	}
	c = &Cluster{secret: o.Worker.Secret, internalTLS: o.Worker.InternalTLS}
	defer func() {
		if err != nil {
			shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Shutdown(shutCtx)
			c = nil
		}
	}()
	any0 := net.JoinHostPort(o.Host, "0")
	// With WorkerPortBase, worker k (prefill first, then decode, then
	// colocated) serves on base+k and prefill worker i's KV channel on
	// base+64+i, so a scrape config can name them.
	next := 0
	addr := func(k int) string {
		if o.WorkerPortBase == 0 {
			return any0
		}
		return net.JoinHostPort(o.Host, strconv.Itoa(o.WorkerPortBase+k))
	}
	start := func(role lifecycle.Role, i int) (*WorkerServer, error) {
		m, err := o.NewModel()
		if err != nil {
			return nil, err
		}
		wo := o.Worker
		wo.Model = m
		wo.Addr = addr(next)
		next++
		wo.Machine.Role = role
		wo.Logger = o.Logger.With("worker", fmt.Sprintf("%s-%d", role, i))
		if role == lifecycle.RolePrefill {
			wo.KVListen = addr(64 + i)
		}
		if o.WrapBackend != nil {
			wo.WrapBackend = func(b kvxfer.Backend) kvxfer.Backend { return o.WrapBackend(role, i, b) }
		}
		if o.TracerFor != nil {
			wo.Tracer = o.TracerFor(fmt.Sprintf("pdserve-%s-%d", role, i))
		}
		return StartWorker(wo)
	}
	type group struct {
		role lifecycle.Role
		n    int
		dst  *[]*WorkerServer
	}
	groups := []group{{lifecycle.RolePrefill, o.PrefillWorkers, &c.Prefill}, {lifecycle.RoleDecode, o.DecodeWorkers, &c.Decode}}
	if o.ColocatedWorkers > 0 {
		groups = []group{{lifecycle.RoleColocated, o.ColocatedWorkers, &c.Colocated}}
	}
	for _, g := range groups {
		for i := range g.n {
			s, err := start(g.role, i)
			if err != nil {
				return c, fmt.Errorf("%s worker %d: %w", g.role, i, err)
			}
			*g.dst = append(*g.dst, s)
		}
	}
	c.start, c.fixedPorts, c.log = start, o.WorkerPortBase > 0, o.Logger
	c.next = map[lifecycle.Role]int{lifecycle.RolePrefill: o.PrefillWorkers, lifecycle.RoleDecode: o.DecodeWorkers}
	m, err := o.NewModel()
	if err != nil {
		return c, err
	}
	ro := o.Router
	ro.Addr, ro.Info, ro.Tokenizer = net.JoinHostPort(o.Host, strconv.Itoa(o.RouterPort)), m.Info(), m.Tokenizer()
	ro.HealthInterval, ro.Logger = o.HealthInterval, o.Logger
	ro.Secret, ro.InternalTLS = o.Worker.Secret, o.Worker.InternalTLS
	ro.Prefill, ro.Decode, ro.Colocated = nil, nil, nil
	if o.TracerFor != nil {
		ro.Tracer = o.TracerFor("pdserve-router")
	}
	for _, w := range c.Prefill {
		ro.Prefill = append(ro.Prefill, w.URL)
	}
	for _, w := range c.Decode {
		ro.Decode = append(ro.Decode, w.URL)
	}
	for _, w := range c.Colocated {
		ro.Colocated = append(ro.Colocated, w.URL)
	}
	if o.Planner != nil {
		if o.ColocatedWorkers > 0 {
			return c, errors.New("the planner splits prefill and decode workers; colocated workers have no split")
		}
		pc := *o.Planner
		pc.Actuator = &FlipRoles{C: c, DrainTimeout: o.FlipDrainTimeout}
		ro.Planner = &pc
	}
	c.Router, err = StartRouter(ro)
	if err != nil {
		return c, fmt.Errorf("router: %w", err)
	}
	if err := WaitReady(ctx, c.Router.Router, o.ReadyTimeout); err != nil {
		return c, err
	}
	return c, nil
}

// WaitReady waits until the router sees every worker healthy, checking
// every 50 ms, up to timeout.
func WaitReady(ctx context.Context, r *router.Router, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ok, why := r.AllHealthy()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("workers not ready after %s: %s", timeout, why)
		case <-t.C:
			r.CheckNow()
		}
	}
}

// Shutdown fails in-flight requests with an error (workers first, so every
// client gets an answer), then stops the router and the workers.
// Drain stops taking requests and waits until every request in flight has
// been answered and every worker holds nothing, or ctx ends (ctx.Err()).
// Shutdown must follow.
func (c *Cluster) Drain(ctx context.Context) error {
	var errs []error
	if c.Router != nil {
		errs = append(errs, c.Router.Drain(ctx))
	}
	for _, w := range c.Workers() {
		errs = append(errs, w.Drain(ctx))
	}
	return joinDistinct(errs)
}

// joinDistinct joins errs (nil ones dropped) as errors.Join does, once per
// message: a drain cut short ends every process's wait with the same
// context error, said once.
func joinDistinct(errs []error) error {
	seen := map[string]bool{}
	var out []error
	for _, err := range errs {
		if err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

// Shutdown stops every worker (what is still live gets an error answer),
// then the router, then the workers' HTTP servers. Losing the KV connections
// between the workers is expected then, and logged as such.
func (c *Cluster) Shutdown(ctx context.Context) error {
	var errs []error
	// The workers stop in turn: each one's peers in this process expect
	// the loss of its KV connections.
	for _, w := range c.Workers() {
		w.Worker.ShuttingDown()
	}
	for _, w := range c.Workers() {
		errs = append(errs, w.Worker.Shutdown(ctx))
	}
	if c.Router != nil {
		errs = append(errs, c.Router.Shutdown(ctx))
	}
	for _, w := range c.Workers() {
		errs = append(errs, w.Shutdown(ctx))
	}
	return joinDistinct(errs)
}

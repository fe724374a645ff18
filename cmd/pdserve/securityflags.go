package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/auth"
	"github.com/pdserve/pdserve/internal/tlsconf"
)

// frontDoorFlags guard an OpenAI front door (router, serve, up): TLS with
// SGLang's and vLLM's flag names, API keys, the admin keys.
type frontDoorFlags struct {
	certFile, keyFile, caCerts string
	apiKeys, adminKeys         []string
	metricsRequireKey          bool
}

func (f *frontDoorFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.certFile, "ssl-certfile", "", "serve the OpenAI API over HTTPS with this PEM certificate chain (with --ssl-keyfile; reloaded on SIGHUP and when the file changes)")
	fs.StringVar(&f.keyFile, "ssl-keyfile", "", "the PEM private key of --ssl-certfile")
	fs.StringVar(&f.caCerts, "ssl-ca-certs", "", "PEM CA bundle: ask HTTPS clients for a certificate and verify the ones given against it (optional for clients)")
	fs.StringSliceVar(&f.apiKeys, "api-key", nil, "API keys (comma-separated; PDSERVE_API_KEY): every /v1 request needs Authorization: Bearer <key>, else 401; they reach the OpenAI API only")
	fs.BoolVar(&f.metricsRequireKey, "metrics-require-key", false, "/metrics (and the router's /discovery/prometheus) need an API or admin key too")
	fs.StringSliceVar(&f.adminKeys, "admin-api-key", nil, "admin keys (comma-separated): the only keys of the admin API (/workers), /debug/* and, without --internal-secret or --internal-tls-*, serve's /internal/*. Without one, these are closed to every --api-key")
}

// options validates the flags into the front door's TLS source and key
// policy (either nil when unset).
func (f *frontDoorFlags) options(log *slog.Logger) (*tlsconf.Source, *auth.FrontDoor, error) {
	var src *tlsconf.Source
	switch {
	case f.certFile == "" && f.keyFile == "" && f.caCerts == "":
	case f.certFile == "" || f.keyFile == "":
		return nil, nil, usagef("--ssl-certfile and --ssl-keyfile go together (and --ssl-ca-certs needs them)")
	default:
		var err error
		if src, err = tlsconf.Load(tlsconf.Files{Cert: f.certFile, Key: f.keyFile, CA: f.caCerts}, log.With("tls", "front door")); err != nil {
			return nil, nil, usagef("--ssl-*: %v", err)
		}
	}
	api, admin := auth.NewKeys(splitURLs(f.apiKeys)...), auth.NewKeys(splitURLs(f.adminKeys)...)
	if f.metricsRequireKey && api.Len()+admin.Len() == 0 {
		return nil, nil, usagef("--metrics-require-key needs --api-key or --admin-api-key")
	}
	var fd *auth.FrontDoor
	if api.Len()+admin.Len() > 0 {
		fd = &auth.FrontDoor{APIKeys: api, AdminKeys: admin, MetricsRequireKey: f.metricsRequireKey}
	}
	return src, fd, nil
}

// internalFlags authenticate the fleet's own channels: the worker API and
// the KV channel.
type internalFlags struct {
	secret        string
	cert, key, ca string
	tls           bool // the command takes --internal-tls-*
}

func (f *internalFlags) add(fs *pflag.FlagSet, withTLS bool, secretUsage string) {
	f.tls = withTLS
	fs.StringVar(&f.secret, "internal-secret", "", secretUsage)
	if withTLS {
		fs.StringVar(&f.cert, "internal-tls-cert", "", "the fleet's mutual TLS: this process's PEM certificate (for both server and client authentication), with --internal-tls-key and --internal-tls-ca")
		fs.StringVar(&f.key, "internal-tls-key", "", "the PEM private key of --internal-tls-cert")
		fs.StringVar(&f.ca, "internal-tls-ca", "", "the fleet's PEM CA: worker API and KV peers must present a certificate it signed (host names are not checked)")
	}
}

// secretUsage is --internal-secret's help on a worker or router.
const secretUsage = "the fleet's shared secret (at least 16 bytes; e.g. from openssl rand -hex 32; same on the router and every worker): the router signs every worker API request with it and workers prove it to each other on the KV channel; it never travels"

// options validates the flags: the secret (checked for length) and the
// internal TLS source (nil without --internal-tls-*).
func (f *internalFlags) options(log *slog.Logger) (string, *tlsconf.Source, error) {
	if f.secret != "" && len(f.secret) < auth.MinSecretBytes {
		return "", nil, usagef("--internal-secret must be at least %d bytes (32 random bytes are best: openssl rand -hex 32)", auth.MinSecretBytes)
	}
	if f.cert == "" && f.key == "" && f.ca == "" {
		return f.secret, nil, nil
	}
	if f.cert == "" || f.key == "" || f.ca == "" {
		return "", nil, usagef("--internal-tls-cert, --internal-tls-key and --internal-tls-ca go together")
	}
	src, err := tlsconf.Load(tlsconf.Files{Cert: f.cert, Key: f.key, CA: f.ca}, log.With("tls", "internal"))
	if err != nil {
		return "", nil, usagef("--internal-tls-*: %v", err)
	}
	return f.secret, src, nil
}

// reloaders runs the reloads of every TLS source of the process on SIGHUP
// (main forwards the signal); one lives in the command's context.
type reloaders struct {
	mu  sync.Mutex
	fns []func()
}

type reloadersKey struct{}

// withReloaders attaches r to ctx.
func withReloaders(ctx context.Context, r *reloaders) context.Context {
	return context.WithValue(ctx, reloadersKey{}, r)
}

// reload runs every registered reload.
func (r *reloaders) reload() {
	r.mu.Lock()
	fns := append([]func(){}, r.fns...)
	r.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

// watchTLS makes every source reload on SIGHUP (when ctx carries the
// process's reloaders) and when its files change, until ctx ends.
func watchTLS(ctx context.Context, log *slog.Logger, srcs ...*tlsconf.Source) {
	r, _ := ctx.Value(reloadersKey{}).(*reloaders)
	for _, s := range srcs {
		if s == nil {
			continue
		}
		if r != nil {
			r.mu.Lock()
			r.fns = append(r.fns, func() { _ = s.Reload() })
			r.mu.Unlock()
		}
		go func() {
			if err := s.Watch(ctx, nil); err != nil && !errors.Is(err, context.Canceled) {
				log.Warn("not watching the TLS files for changes (SIGHUP still reloads them)", "err", err)
			}
		}()
	}
}

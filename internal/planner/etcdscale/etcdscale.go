// Package etcdscale is the planner's actuator for fleets registered in etcd
// without Kubernetes (`pdserve router --discovery etcd --planner
// --planner-scaler etcd`): it writes the counts the planner decided to one
// key, <prefix>planner/desired, where an operator's own tooling watches
// them (`etcdctl watch --prefix <prefix>planner/`) and starts or stops
// workers to match.
//
// The value is one JSON object (Desired):
//
//	{"prefill": 2, "decode": 3, "at": "2026-12-07T04:30:00Z",
//	 "reason": "scale 1P:3D → 2P:3D for a need of …", "router": "host:8000"}
//
// The key has no lease: the last decision stays readable while the router
// is down. Apply returns once etcd has the value; it does not wait for the
// fleet to follow (the planner holds while workers join and leave, and asks
// again if the fleet does not follow).
package etcdscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pdserve/pdserve/internal/planner"
)

// KeySuffix is the key's name under the fleet's prefix (--etcd-prefix).
const KeySuffix = "planner/desired"

// DefaultTimeout bounds one write to etcd.
const DefaultTimeout = 5 * time.Second

// MaxValueBytes bounds the value Read accepts (a reason is a line of
// text; the whole value is well under a kilobyte).
const MaxValueBytes = 16 << 10

// Key returns the key under prefix (which ends in "/").
func Key(prefix string) string { return prefix + KeySuffix }

// Desired is the value written: the planner's counts and why.
type Desired struct {
	// Prefill and Decode are the workers of each role the fleet should
	// have (at least 1 each).
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	// At is when the planner decided, RFC 3339 in UTC.
	At string `json:"at"`
	// Reason is the planner's explanation (its log line's reason).
	Reason string `json:"reason"`
	// Router identifies the router whose planner decided (host:port).
	Router string `json:"router"`
}

// Config configures a Scaler.
type Config struct {
	// Client is the etcd client (the router's registry's); required.
	Client *clientv3.Client
	// Prefix is the fleet's key prefix (--etcd-prefix); it must end in "/".
	Prefix string
	// Router is this router's identity, written with every value.
	Router string
	// Timeout bounds one write (0: DefaultTimeout).
	Timeout time.Duration
}

// Scaler is the actuator: a planner.Actuator.
type Scaler struct {
	cfg Config
	key string
}

// New returns a Scaler; it errors without a client or with a prefix that
// does not end in "/".
func New(cfg Config) (*Scaler, error) {
	if cfg.Client == nil {
		return nil, errors.New("the etcd scaler needs an etcd client (--discovery etcd with --etcd-endpoints)")
	}
	if cfg.Prefix == "" || cfg.Prefix[len(cfg.Prefix)-1] != '/' {
		return nil, fmt.Errorf("etcd scaler: prefix %q must end in /", cfg.Prefix)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Scaler{cfg: cfg, key: Key(cfg.Prefix)}, nil
}

// Name implements planner.Actuator.
func (s *Scaler) Name() string { return "etcd" }

// Flips implements planner.Actuator: it asks for each role's count.
func (s *Scaler) Flips() bool { return false }

// Key returns the key the Scaler writes.
func (s *Scaler) Key() string { return s.key }

// Apply implements planner.Actuator: it writes d's counts (at least 1 each)
// with its time and reason. It returns etcd's error, naming the key, if
// the write failed or took longer than Timeout.
func (s *Scaler) Apply(ctx context.Context, d planner.Decision) error {
	v, err := json.Marshal(Desired{Prefill: max(1, d.DesiredPrefill), Decode: max(1, d.DesiredDecode),
		At: d.At.UTC().Format(time.RFC3339), Reason: d.Reason, Router: s.cfg.Router})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.cfg.Client.Put(ctx, s.key, string(v)); err != nil {
		return fmt.Errorf("etcd scaler: put %s: %w", s.key, err)
	}
	return nil
}

// Read returns the counts last written under prefix; ok is false if none
// were. It errors if etcd does not answer or the value is not a Desired
// (larger than MaxValueBytes, not JSON, or a count below 1).
func Read(ctx context.Context, cli *clientv3.Client, prefix string) (d Desired, ok bool, err error) {
	key := Key(prefix)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return d, false, fmt.Errorf("etcd: get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return d, false, nil
	}
	v := resp.Kvs[0].Value
	if len(v) > MaxValueBytes {
		return d, false, fmt.Errorf("%s: value of %d bytes, more than %d", key, len(v), MaxValueBytes)
	}
	if err := json.Unmarshal(v, &d); err != nil {
		return d, false, fmt.Errorf("%s: %w", key, err)
	}
	if d.Prefill < 1 || d.Decode < 1 {
		return d, false, fmt.Errorf("%s: counts %d prefill, %d decode: want at least 1 each", key, d.Prefill, d.Decode)
	}
	return d, true, nil
}

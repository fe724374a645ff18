// Package registry is where a router learns its fleet: the prefill, decode
// and colocated workers it may send requests to. One interface, [Registry],
// has three backends: [Static] (worker URLs given on the command line or
// added through the router's admin API), etcd (package registry/etcd:
// workers register themselves under a lease) and Kubernetes (package
// registry/kube: pods found by label, counted once Running and Ready).
//
// # Overview
//
// A backend is level-triggered, after Kubernetes controllers: each time
// what it knows changes, it hands the router the whole desired fleet as a
// [Snapshot], never a delta, so a lost event is harmless: the next snapshot
// brings the same answer. The router's reconciler compares the snapshot with
// its worker set and fixes the difference. A backend that cannot reach its
// source (etcd down, the API server unreachable) sends nothing: the router
// keeps serving its last snapshot, so a control-plane blip does not empty
// the fleet.
//
// Identity is the entry's ID, never its address: a worker that restarts, or
// a new process on the same address, is a new ID (a pod's UID, an etcd
// registration's instance id), and a changed address is a removal and an
// addition.
//
// # Concurrency
//
// Run is called once per backend; it calls its callback from one goroutine
// at a time. Static's Add and Remove are safe for concurrent use.
package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/netaddr"
)

// Worker roles as registries spell them.
const (
	RolePrefill   = "prefill"
	RoleDecode    = "decode"
	RoleColocated = "colocated"
)

// Entry is one worker as a registry lists it: what the router should have.
type Entry struct {
	// ID is the worker's identity in the registry (a static worker's
	// host:port, an etcd registration's id, a pod's namespace/name/uid).
	// Two entries with the same ID and address are the same worker.
	ID string `json:"id"`
	// Role is "prefill", "decode" or "colocated".
	Role string `json:"role"`
	// URL is the worker API's base URL, http://host:port.
	URL string `json:"url"`
	// KVAddr is a prefill worker's KV channel address, host:port ("" if
	// the registry does not know it: the router then asks the worker).
	KVAddr string `json:"kv_addr,omitempty"`
	// Model is the served model's name ("" if the registry does not know).
	Model string `json:"model,omitempty"`
	// Fingerprint is the worker's KV fingerprint, if the registry carries
	// it; the router checks it against what the worker itself reports.
	Fingerprint *kvxfer.Fingerprint `json:"fingerprint,omitempty"`
	// Source names the backend: "static", "etcd" or "kubernetes".
	Source string `json:"source"`
	// Invalid, when not empty, says why the entry cannot be used (garbage
	// in the registry, an unknown role, a bad URL). Invalid entries are
	// listed so operators see them, and never paired.
	Invalid string `json:"invalid,omitempty"`
}

// Validate reports why e cannot be used, or nil.
func (e Entry) Validate() error {
	var errs []error
	if e.ID == "" {
		errs = append(errs, errors.New("id is empty"))
	}
	switch e.Role {
	case RolePrefill, RoleDecode, RoleColocated:
	default:
		errs = append(errs, fmt.Errorf("role %q: want prefill, decode or colocated", e.Role))
	}
	if _, err := ParseURL(e.URL); err != nil {
		errs = append(errs, err)
	}
	if e.KVAddr != "" {
		if host, port, err := net.SplitHostPort(e.KVAddr); err != nil {
			errs = append(errs, fmt.Errorf("kv_addr %q: %v", e.KVAddr, err))
		} else if host == "" || !validPort(port) {
			errs = append(errs, fmt.Errorf("kv_addr %q: want host:port with a port from 1 to 65535", e.KVAddr))
		}
	}
	return errors.Join(errs...)
}

// ParseURL checks a worker URL (http or https, a host, a port from 1 to
// 65535 if any, no path beyond "/") and returns it without a trailing
// slash.
func ParseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if p, ok := netaddr.NonNumericPort(raw); err != nil && ok {
		return "", fmt.Errorf("worker URL %q: port %q is not a number", raw, p)
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Path != "" ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("worker URL %q: want http://host:port", raw)
	}
	if p := u.Port(); p != "" && !validPort(p) || strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("worker URL %q: the port must be from 1 to 65535", raw)
	}
	return u.String(), nil
}

// validPort reports whether p is a decimal TCP port from 1 to 65535.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == p
}

// Snapshot is the whole desired fleet at one moment, entries sorted by ID.
type Snapshot struct {
	Entries []Entry
}

// Sorted returns s with its entries sorted by ID (a copy).
func (s Snapshot) Sorted() Snapshot {
	e := slices.Clone(s.Entries)
	slices.SortFunc(e, func(a, b Entry) int { return strings.Compare(a.ID, b.ID) })
	return Snapshot{Entries: e}
}

// Registry is a source of the fleet.
type Registry interface {
	// Name is the backend's name: "static", "etcd" or "kubernetes".
	Name() string
	// Run calls update with a complete snapshot whenever the fleet
	// changes, the first time as soon as it knows one, until ctx ends;
	// then it returns ctx.Err(). It returns another error only if it
	// cannot start at all (a bad configuration). While its source cannot
	// be reached it keeps retrying and calls nothing.
	Run(ctx context.Context, update func(Snapshot)) error
}

// ErrorReporter is implemented by a backend that can say why it last
// failed to reach its source (etcd unreachable), for the router's GET
// /workers.
type ErrorReporter interface {
	// LastError returns the backend's last error and when it happened
	// ("" and the zero time if none yet).
	LastError() (string, time.Time)
}

// Health is what a backend that checks its source knows of it.
type Health struct {
	// Up: the source answered the backend's last call (false before its
	// first answer).
	Up bool
	// LastOK is when the source last answered (the zero time if never).
	LastOK time.Time
}

// HealthReporter is implemented by a backend that checks its source
// actively (etcd: a read every VerifyInterval, bounded by a timeout), so
// the router says within seconds that the source is gone, frozen or not,
// while it serves the fleet it last saw.
type HealthReporter interface {
	// Health returns the backend's view of its source now.
	Health() Health
}

// Static is the registry of worker URLs given at startup, changed through
// the router's admin API (Add, Remove).
type Static struct {
	mu      sync.Mutex
	entries map[string]Entry
	changed chan struct{}
}

// NewStatic returns a static registry of the given workers' URLs.
func NewStatic(prefill, decode, colocated []string) (*Static, error) {
	s := &Static{entries: make(map[string]Entry), changed: make(chan struct{}, 1)}
	for _, l := range []struct {
		role string
		urls []string
	}{{RolePrefill, prefill}, {RoleDecode, decode}, {RoleColocated, colocated}} {
		for _, u := range l.urls {
			if _, err := s.Add(l.role, u); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Name implements Registry.
func (s *Static) Name() string { return "static" }

// Add lists a worker; its ID is its URL's host:port. It returns the entry,
// or an error for a bad role or URL, or an address already listed.
func (s *Static) Add(role, rawURL string) (Entry, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return Entry{}, err
	}
	pu, _ := url.Parse(u)
	e := Entry{ID: pu.Host, Role: role, URL: u, Source: "static"}
	if err := e.Validate(); err != nil {
		return Entry{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.entries[e.ID]; dup {
		return Entry{}, fmt.Errorf("worker %s is already listed", e.ID)
	}
	s.entries[e.ID] = e
	s.notify()
	return e, nil
}

// Remove unlists a worker by ID; it reports whether it was listed.
func (s *Static) Remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[id]; !ok {
		return false
	}
	delete(s.entries, id)
	s.notify()
	return true
}

func (s *Static) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Snapshot returns the listed workers.
func (s *Static) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Snapshot{Entries: make([]Entry, 0, len(s.entries))}
	for _, e := range s.entries {
		out.Entries = append(out.Entries, e)
	}
	return out.Sorted()
}

// Run implements Registry: one snapshot at once, then one after each Add or
// Remove.
func (s *Static) Run(ctx context.Context, update func(Snapshot)) error {
	update(s.Snapshot())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.changed:
			update(s.Snapshot())
		}
	}
}

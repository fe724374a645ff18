// Package kube is the Kubernetes backend of the fleet registry: worker pods
// found by namespace and label selector with a client-go informer.
//
// # Which pods count
//
// A pod is a worker when it matches the selector, is Running, its Ready
// condition is True, it has a pod IP, and it is not being deleted. Its role
// comes from the label pdserve.io/role (prefill, decode or colocated; the
// label llm-d.ai/role is accepted too, with "both" meaning colocated), its
// worker API port from the annotation pdserve.io/port and a prefill worker's
// KV port from pdserve.io/kv-port (without it, the router asks the worker).
// A pod that counts but whose labels or annotations are wrong is listed with
// the reason (Entry.Invalid) and never paired. Deletion, NotReady, a
// selector mismatch or an IP change removes a worker (an IP change adds it
// again under its new address).
//
// # Convergence
//
// Level-triggered: every informer event only says "look again"; the
// snapshot is rebuilt from the informer's cache. A periodic full re-list
// (a List straight from the API server) catches a delete the watch missed:
// when it disagrees with the cache, its answer is used and the informer is
// started again. While the API server cannot be reached the cache, and so
// the router's fleet, stays as it was.
//
// # Concurrency
//
// Run runs on the caller's goroutine; the informer's goroutines stop when
// Run returns.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pdserve/pdserve/internal/registry"
)

// Labels and annotations read from worker pods.
const (
	LabelRole      = "pdserve.io/role"
	LabelRoleLLMD  = "llm-d.ai/role"
	AnnotationPort = "pdserve.io/port"
	AnnotationKV   = "pdserve.io/kv-port"
)

// Config configures the backend.
type Config struct {
	// Client is the pods API (a clientset's CoreV1()); nil builds one from
	// Kubeconfig or, if that is empty, the in-cluster configuration. Only
	// the core/v1 client is built: the clientset of every API group would
	// add a third of pdserve's packages for nothing it uses.
	Client     corev1client.PodsGetter
	Kubeconfig string
	// Namespace is where worker pods live ("" = every namespace).
	Namespace string
	// Selector is a label selector of worker pods, e.g. "app=pdserve"
	// (default: pods with the pdserve.io/role label).
	Selector string
	// Resync is the informer's resync period (default 1 min); Relist the
	// period of the full re-list that catches missed deletes (default 5 min).
	Resync time.Duration
	Relist time.Duration
	Logger *slog.Logger
}

// Registry is the Kubernetes backend: a registry.Registry.
type Registry struct {
	cfg Config
	sel labels.Selector
	log *slog.Logger
}

// New checks the configuration and builds the API client if none is given.
// It returns an error for a bad selector or a configuration it cannot load.
func New(cfg Config) (*Registry, error) {
	if cfg.Selector == "" {
		cfg.Selector = LabelRole
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("--k8s-selector %q: %w", cfg.Selector, err)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Relist <= 0 {
		cfg.Relist = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil {
		var rc *rest.Config
		if cfg.Kubeconfig != "" {
			rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		} else {
			rc, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes client configuration: %w", err)
		}
		cfg.Client, err = corev1client.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
	}
	return &Registry{cfg: cfg, sel: sel, log: cfg.Logger.With("component", "registry", "registry", "kubernetes")}, nil
}

// Name implements registry.Registry.
func (r *Registry) Name() string { return "kubernetes" }

// Run implements registry.Registry.
func (r *Registry) Run(ctx context.Context, update func(registry.Snapshot)) error {
	var last *registry.Snapshot
	send := func(s registry.Snapshot) {
		if last != nil && slices.Equal(last.Entries, s.Entries) {
			return
		}
		last = &s
		update(s)
	}
	for ctx.Err() == nil {
		if err := r.runInformer(ctx, send); err != nil {
			r.log.Info("restarting the pod informer", "reason", err)
		}
	}
	return ctx.Err()
}

// errDiverged says the informer's cache disagreed with a fresh list.
var errDiverged = errors.New("the informer's cache disagrees with a fresh list of pods")

// runInformer runs one informer until ctx ends (nil) or a re-list shows its
// cache diverged (errDiverged).
func (r *Registry) runInformer(ctx context.Context, send func(registry.Snapshot)) error {
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	api := r.cfg.Client.Pods(r.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = r.sel.String()
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = r.sel.String()
			return api.Watch(ctx, o)
		},
	}
	// As client-go's generated informers do: a client that says it cannot
	// stream the initial list as watch events (a fake) gets list + watch.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, r.cfg.Client), &corev1.Pod{}, r.cfg.Resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return err
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		inf.RunWithContext(ictx)
	}()
	defer func() {
		cancel()
		<-stopped
	}()
	if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	lister := corelisters.NewPodLister(inf.GetIndexer())
	fromCache := func() registry.Snapshot {
		list, _ := lister.List(r.sel) // the cache's List never fails
		return r.Snapshot(list)
	}
	send(fromCache())
	relist := time.NewTicker(r.cfg.Relist)
	defer relist.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			send(fromCache())
		case <-relist.C:
			lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
			list, err := api.List(lctx, metav1.ListOptions{LabelSelector: r.sel.String()})
			lcancel()
			if err != nil {
				r.log.Warn("full re-list of worker pods failed; keeping the informer's view", "err", err)
				continue
			}
			items := make([]*corev1.Pod, len(list.Items))
			for i := range list.Items {
				items[i] = &list.Items[i]
			}
			fresh := r.Snapshot(items)
			if !slices.Equal(fresh.Entries, fromCache().Entries) {
				r.log.Warn("pod informer missed a change; using a fresh list")
				send(fresh)
				return errDiverged
			}
		}
	}
}

// Snapshot turns pods into the fleet: the pods that count as workers (see
// the package doc), sorted by ID.
func (r *Registry) Snapshot(pods []*corev1.Pod) registry.Snapshot {
	var s registry.Snapshot
	for _, p := range pods {
		if e, ok := r.entry(p); ok {
			s.Entries = append(s.Entries, e)
		}
	}
	return s.Sorted()
}

// entry is the worker a pod is, and whether it counts at all.
func (r *Registry) entry(p *corev1.Pod) (registry.Entry, bool) {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" ||
		!ready(p) || !r.sel.Matches(labels.Set(p.Labels)) {
		return registry.Entry{}, false
	}
	e := registry.Entry{ID: p.Namespace + "/" + p.Name + "/" + string(p.UID), Source: "kubernetes"}
	e.Role = p.Labels[LabelRole]
	if e.Role == "" {
		switch v := p.Labels[LabelRoleLLMD]; v {
		case "both":
			e.Role = registry.RoleColocated
		default:
			e.Role = v
		}
	}
	port, err := portOf(p, AnnotationPort)
	if err != nil {
		e.Invalid = err.Error()
		return e, true
	}
	if port == 0 {
		e.Invalid = "no " + AnnotationPort + " annotation"
		return e, true
	}
	e.URL = "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))
	if e.Role == registry.RolePrefill {
		kv, err := portOf(p, AnnotationKV)
		if err != nil {
			e.Invalid = err.Error()
			return e, true
		}
		if kv != 0 {
			e.KVAddr = net.JoinHostPort(p.Status.PodIP, strconv.Itoa(kv))
		}
	}
	if err := e.Validate(); err != nil {
		e.Invalid = err.Error()
	}
	return e, true
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// portOf reads a port annotation: 0 when absent, an error when not a port.
func portOf(p *corev1.Pod, key string) (int, error) {
	v, ok := p.Annotations[key]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("annotation %s=%q is not a port", key, v)
	}
	return n, nil
}

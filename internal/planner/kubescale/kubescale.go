// Package kubescale is the planner's Kubernetes actuator: it sets the
// replica counts of the prefill and the decode Deployment through their
// scale subresource (`pdserve router --planner --planner-scaler
// kubernetes`).
//
// # What Apply does
//
// For each role whose count changes (the one that grows first, so that
// capacity is added before any is taken away) it reads the Deployment's
// scale (GET deployments/scale) and writes the new spec.replicas with the
// resourceVersion it read (PUT deployments/scale). A write that lost a race
// with another writer (409 Conflict: an operator's kubectl scale, a
// rollout) is tried again on a fresh read, up to MaxConflictRetries times.
// It then waits, up to ReadyTimeout, until each Deployment it changed shows
// the count: observedGeneration caught up, status.replicas equal to the
// count and that many pods ready (GET deployments). Only then does Apply
// return, so the planner decides again on a fleet that has followed.
//
// It writes exactly what the planner decided, never fewer than one pod per
// role and never more than decided. A missing Deployment or a verb the
// router's service account is not allowed names the Deployment and the
// verb in the error; the planner logs it and counts it
// (pdserve_planner_actions_total{result="failed"}).
//
// Only the apps/v1 client is built, not the clientset of every API group.
package kubescale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/pdserve/pdserve/internal/planner"
)

// Defaults of Config.
const (
	// DefaultMaxConflictRetries bounds the writes of one Deployment's scale
	// that lose a race with another writer before Apply gives up.
	DefaultMaxConflictRetries = 5
	// DefaultReadyTimeout bounds the wait for the Deployments to show the
	// counts written (pods scheduled, started and ready).
	DefaultReadyTimeout = 10 * time.Minute
	// DefaultPollInterval is the time between two reads of a Deployment's
	// status while Apply waits for it.
	DefaultPollInterval = 2 * time.Second
	// CallTimeout bounds one call to the API server of a client New
	// builds.
	CallTimeout = 30 * time.Second
)

// serviceAccountNamespace is where a pod finds its own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Config configures a Scaler.
type Config struct {
	// Client is the apps/v1 API (a clientset's AppsV1()); nil builds one
	// from Kubeconfig or, if that is empty, the in-cluster configuration.
	Client     appsv1client.DeploymentsGetter
	Kubeconfig string
	// Namespace holds both Deployments ("": the kubeconfig context's
	// namespace, or in a pod the pod's own).
	Namespace string
	// PrefillDeployment and DecodeDeployment name the Deployments of each
	// role (--planner-prefill-deployment, --planner-decode-deployment).
	PrefillDeployment, DecodeDeployment string
	// MaxConflictRetries, ReadyTimeout and PollInterval: zero takes the
	// Default* values above.
	MaxConflictRetries int
	ReadyTimeout       time.Duration
	PollInterval       time.Duration
	Clock              clock.Clock
	Logger             *slog.Logger
}

// Scaler is the actuator: a planner.Actuator.
type Scaler struct {
	cfg Config
	api appsv1client.DeploymentInterface
	log *slog.Logger
}

// New checks cfg and builds the API client if none is given. It returns an
// error naming the flag for a missing Deployment name, and the client
// configuration's error if it cannot be loaded.
func New(cfg Config) (*Scaler, error) {
	if cfg.PrefillDeployment == "" || cfg.DecodeDeployment == "" {
		return nil, errors.New("the kubernetes scaler needs --planner-prefill-deployment and --planner-decode-deployment")
	}
	if cfg.PrefillDeployment == cfg.DecodeDeployment {
		return nil, fmt.Errorf("--planner-prefill-deployment and --planner-decode-deployment are both %q: each role needs its own Deployment", cfg.PrefillDeployment)
	}
	if cfg.MaxConflictRetries <= 0 {
		cfg.MaxConflictRetries = DefaultMaxConflictRetries
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil || cfg.Namespace == "" {
		rc, ns, err := restConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		if cfg.Namespace == "" {
			cfg.Namespace = ns
		}
		if cfg.Client == nil {
			// One call to an API server that stopped answering must not
			// hold the planner's change under way for ever.
			rc.Timeout = CallTimeout
			if cfg.Client, err = appsv1client.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("kubernetes client: %w", err)
			}
		}
	}
	if cfg.Namespace == "" {
		return nil, errors.New("the kubernetes scaler does not know the Deployments' namespace: give --k8s-namespace")
	}
	return &Scaler{cfg: cfg, api: cfg.Client.Deployments(cfg.Namespace),
		log: cfg.Logger.With("component", "planner", "actuator", "kubernetes")}, nil
}

// restConfig loads the client configuration from kubeconfig ("": in
// cluster) and the namespace it implies (the context's, or the pod's own;
// "" if neither says).
func restConfig(kubeconfig string) (*rest.Config, string, error) {
	if kubeconfig != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		rc, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes client configuration: %w", err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes client configuration: %w", err)
		}
		return rc, ns, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client configuration: %w", err)
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return rc, "", nil
	}
	return rc, strings.TrimSpace(string(b)), nil
}

// Name implements planner.Actuator.
func (s *Scaler) Name() string { return "kubernetes" }

// Flips implements planner.Actuator: it scales each role.
func (s *Scaler) Flips() bool { return false }

// target is one Deployment and the count it should have.
type target struct {
	role, name string
	replicas   int32
}

// Apply implements planner.Actuator: it scales both Deployments to d's
// counts (at least 1 each) and waits until those it changed have that
// many pods ready.
// It returns the first error: a Deployment missing, a verb forbidden, a
// conflict that outlasted MaxConflictRetries, the wait's timeout, or
// ctx's.
func (s *Scaler) Apply(ctx context.Context, d planner.Decision) error {
	ts := []target{
		{role: "prefill", name: s.cfg.PrefillDeployment, replicas: int32(max(1, d.DesiredPrefill))},
		{role: "decode", name: s.cfg.DecodeDeployment, replicas: int32(max(1, d.DesiredDecode))},
	}
	// The role that grows goes first: capacity comes before any goes.
	if d.DesiredDecode > d.Decode && d.DesiredPrefill <= d.Prefill {
		ts[0], ts[1] = ts[1], ts[0]
	}
	var changed []target
	for _, t := range ts {
		moved, err := s.scale(ctx, t)
		if err != nil {
			return err
		}
		if moved {
			changed = append(changed, t)
		}
	}
	return s.waitReady(ctx, changed)
}

// scale sets t's Deployment to t.replicas through the scale subresource,
// reading it again after each conflict. It reports whether it wrote (false:
// the Deployment had the count already).
func (s *Scaler) scale(ctx context.Context, t target) (bool, error) {
	for attempt := 1; ; attempt++ {
		sc, err := s.api.GetScale(ctx, t.name, metav1.GetOptions{})
		if err != nil {
			return false, s.apiError(err, "get", "deployments/scale", t.name)
		}
		if sc.Spec.Replicas == t.replicas {
			return false, nil
		}
		from := sc.Spec.Replicas
		// sc carries the resourceVersion it was read at: a write by anyone
		// since makes this one a 409.
		sc.Spec.Replicas = t.replicas
		_, err = s.api.UpdateScale(ctx, t.name, sc, metav1.UpdateOptions{})
		switch {
		case err == nil:
			s.log.Info("planner: Deployment scaled", "role", t.role, "deployment", s.cfg.Namespace+"/"+t.name,
				"from", from, "to", t.replicas)
			return true, nil
		case apierrors.IsConflict(err) && attempt < s.cfg.MaxConflictRetries && ctx.Err() == nil:
			s.log.Info("planner: the Deployment's scale changed under the write; reading it again",
				"deployment", s.cfg.Namespace+"/"+t.name, "attempt", attempt)
		case apierrors.IsConflict(err):
			return false, fmt.Errorf("kubernetes scaler: update deployments/scale %s/%s: %d conflicting writes in a row: %w",
				s.cfg.Namespace, t.name, attempt, err)
		default:
			return false, s.apiError(err, "update", "deployments/scale", t.name)
		}
	}
}

// apiError says which verb on which resource of which Deployment failed,
// and for a refusal what the router's Role needs.
func (s *Scaler) apiError(err error, verb, resource, name string) error {
	what := fmt.Sprintf("%s %s %s/%s", verb, resource, s.cfg.Namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("kubernetes scaler: %s: the Deployment %q does not exist in namespace %q (--planner-%s): %w",
			what, name, s.cfg.Namespace, s.flagOf(name), err)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("kubernetes scaler: %s: forbidden; the router's service account needs get, update and patch on deployments/scale and get on deployments in %q (the Helm chart grants them with planner.scaler=kubernetes): %w",
			what, s.cfg.Namespace, err)
	}
	return fmt.Errorf("kubernetes scaler: %s: %w", what, err)
}

// flagOf names the flag that gave the Deployment name.
func (s *Scaler) flagOf(name string) string {
	if name == s.cfg.PrefillDeployment {
		return "prefill-deployment"
	}
	return "decode-deployment"
}

// waitReady polls the Deployments until each shows its count ready, or
// ReadyTimeout passes.
func (s *Scaler) waitReady(ctx context.Context, ts []target) error {
	deadline := s.cfg.Clock.Now().Add(s.cfg.ReadyTimeout)
	for {
		var waiting []string
		for _, t := range ts {
			dep, err := s.api.Get(ctx, t.name, metav1.GetOptions{})
			if err != nil {
				return s.apiError(err, "get", "deployments", t.name)
			}
			if why := notReady(dep, t.replicas); why != "" {
				waiting = append(waiting, fmt.Sprintf("%s: %s", t.name, why))
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if !s.cfg.Clock.Now().Before(deadline) {
			return fmt.Errorf("kubernetes scaler: the Deployments did not reach their counts within %s: %s",
				s.cfg.ReadyTimeout, strings.Join(waiting, "; "))
		}
		tm := s.cfg.Clock.NewTimer(s.cfg.PollInterval)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C():
		}
	}
}

// notReady says why dep does not show want pods ready yet ("" if it does).
func notReady(dep *appsv1.Deployment, want int32) string {
	st := dep.Status
	switch {
	case st.ObservedGeneration < dep.Generation:
		return "the controller has not seen the new count yet"
	case st.Replicas != want:
		return fmt.Sprintf("%d pods, want %d", st.Replicas, want)
	case st.ReadyReplicas < want:
		return fmt.Sprintf("%d of %d pods ready", st.ReadyReplicas, want)
	}
	return ""
}

package kubescale

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	appsfake "k8s.io/client-go/kubernetes/typed/apps/v1/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/planner"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ns = "llm"

var deployments = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// fakeAPI is client-go's fake apps/v1 API over an object tracker, with the
// scale subresource the tracker lacks played as the API server plays it:
// a read gives spec.replicas at the Deployment's resourceVersion, a write
// at another resourceVersion is a 409 Conflict, and one that passes sets
// spec.replicas and moves the resourceVersion and the generation on. With
// instant set, the Deployment controller follows at once (its status shows
// every pod ready).
type fakeAPI struct {
	*appsfake.FakeAppsV1
	tracker k8stesting.ObjectTracker

	mu      sync.Mutex
	rv      int
	instant bool
}

func newFakeAPI(t *testing.T, instant bool, deps ...*appsv1.Deployment) *fakeAPI {
	t.Helper()
	a := &fakeAPI{tracker: k8stesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder()), instant: instant}
	for _, d := range deps {
		a.rv++
		d.ResourceVersion = strconv.Itoa(a.rv)
		if err := a.tracker.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	f := &k8stesting.Fake{}
	f.AddReactor("get", "deployments", a.getScale)
	f.AddReactor("update", "deployments", a.updateScale)
	f.AddReactor("*", "*", k8stesting.ObjectReaction(a.tracker))
	a.FakeAppsV1 = &appsfake.FakeAppsV1{Fake: f}
	return a
}

func deployment(name string, replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Generation: 1},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: replicas, ReadyReplicas: replicas,
			UpdatedReplicas: replicas, AvailableReplicas: replicas}}
}

func (a *fakeAPI) get(name string) (*appsv1.Deployment, error) {
	o, err := a.tracker.Get(deployments, ns, name)
	if err != nil {
		return nil, err
	}
	return o.(*appsv1.Deployment), nil
}

// write stores d as the next resourceVersion (another writer, when a test
// calls it: kubectl scale, a rollout).
func (a *fakeAPI) write(d *appsv1.Deployment) error {
	a.rv++
	d.ResourceVersion = strconv.Itoa(a.rv)
	d.Generation++
	if a.instant {
		r := *d.Spec.Replicas
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: r, ReadyReplicas: r,
			UpdatedReplicas: r, AvailableReplicas: r}
	}
	return a.tracker.Update(deployments, d, ns)
}

// setReplicas is another writer changing name's replicas.
func (a *fakeAPI) setReplicas(t *testing.T, name string, n int32) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	d, err := a.get(name)
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = &n
	if err := a.write(d); err != nil {
		t.Fatal(err)
	}
}

// settle is the Deployment controller catching up: every pod of name ready.
func (a *fakeAPI) settle(t *testing.T, name string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	d, err := a.get(name)
	if err != nil {
		t.Fatal(err)
	}
	r := *d.Spec.Replicas
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: r, ReadyReplicas: r}
	if err := a.tracker.Update(deployments, d, ns); err != nil {
		t.Fatal(err)
	}
}

func (a *fakeAPI) getScale(act k8stesting.Action) (bool, runtime.Object, error) {
	if act.GetSubresource() != "scale" {
		return false, nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	d, err := a.get(act.(k8stesting.GetAction).GetName())
	if err != nil {
		return true, nil, err
	}
	return true, &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, ResourceVersion: d.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: *d.Spec.Replicas},
		Status:     autoscalingv1.ScaleStatus{Replicas: d.Status.Replicas}}, nil
}

func (a *fakeAPI) updateScale(act k8stesting.Action) (bool, runtime.Object, error) {
	if act.GetSubresource() != "scale" {
		return false, nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	sc := act.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
	d, err := a.get(sc.Name)
	if err != nil {
		return true, nil, err
	}
	if sc.ResourceVersion != d.ResourceVersion {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "apps", Resource: "deployments"}, sc.Name,
			errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	r := sc.Spec.Replicas
	d.Spec.Replicas = &r
	if err := a.write(d); err != nil {
		return true, nil, err
	}
	out := sc.DeepCopy()
	out.ResourceVersion = d.ResourceVersion
	return true, out, nil
}

// replicas returns name's spec.replicas.
func (a *fakeAPI) replicas(t *testing.T, name string) int32 {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	d, err := a.get(name)
	if err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas
}

// statusReads counts the reads of a Deployment (not its scale).
func (a *fakeAPI) statusReads() int {
	n := 0
	for _, act := range a.Actions() {
		if act.GetVerb() == "get" && act.GetSubresource() == "" {
			n++
		}
	}
	return n
}

// scaleWrites lists the scale updates made, as "name=replicas".
func (a *fakeAPI) scaleWrites() []string {
	var out []string
	for _, act := range a.Actions() {
		if act.GetVerb() == "update" && act.GetSubresource() == "scale" {
			sc := act.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
			out = append(out, sc.Name+"="+strconv.Itoa(int(sc.Spec.Replicas)))
		}
	}
	return out
}

func newScaler(t *testing.T, api *fakeAPI, clk *clocktesting.FakeClock) *Scaler {
	t.Helper()
	s, err := New(Config{Client: api, Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "pd-decode",
		Clock: clk, ReadyTimeout: time.Minute, PollInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func decision(p, d, wantP, wantD int) planner.Decision {
	return planner.Decision{Action: planner.ActionScale, Prefill: p, Decode: d, DesiredPrefill: wantP, DesiredDecode: wantD}
}

func TestScaleUp(t *testing.T) {
	api := newFakeAPI(t, true, deployment("pd-prefill", 1), deployment("pd-decode", 1))
	s := newScaler(t, api, clocktesting.NewFakeClock(time.Unix(0, 0)))
	if s.Flips() || s.Name() != "kubernetes" {
		t.Fatalf("Flips %v, Name %q", s.Flips(), s.Name())
	}
	if err := s.Apply(context.Background(), decision(1, 1, 3, 2)); err != nil {
		t.Fatal(err)
	}
	if p, d := api.replicas(t, "pd-prefill"), api.replicas(t, "pd-decode"); p != 3 || d != 2 {
		t.Fatalf("replicas %d prefill, %d decode; want 3, 2", p, d)
	}
	// Only the scale subresource is written; the Deployments are read.
	for _, act := range api.Actions() {
		if act.GetVerb() != "get" && act.GetSubresource() != "scale" {
			t.Errorf("%s %s/%s: only the scale subresource may be written", act.GetVerb(), act.GetResource().Resource, act.GetSubresource())
		}
	}
	// Asked again for what they have: nothing is written.
	n := len(api.scaleWrites())
	if err := s.Apply(context.Background(), decision(3, 2, 3, 2)); err != nil {
		t.Fatal(err)
	}
	if w := api.scaleWrites(); len(w) != n {
		t.Fatalf("writes %v for counts already there", w[n:])
	}
}

func TestScaleDown(t *testing.T) {
	api := newFakeAPI(t, true, deployment("pd-prefill", 4), deployment("pd-decode", 2))
	s := newScaler(t, api, clocktesting.NewFakeClock(time.Unix(0, 0)))
	// Decode grows and prefill shrinks: decode first, so that capacity is
	// added before any goes. A count below 1 is raised to 1.
	if err := s.Apply(context.Background(), decision(4, 2, 0, 3)); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(api.scaleWrites(), " "), "pd-decode=3 pd-prefill=1"; got != want {
		t.Fatalf("writes %q, want %q", got, want)
	}
	if err := s.Apply(context.Background(), decision(1, 3, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if p, d := api.replicas(t, "pd-prefill"), api.replicas(t, "pd-decode"); p != 1 || d != 1 {
		t.Fatalf("replicas %d prefill, %d decode; want 1, 1", p, d)
	}
}

// TestConflictRetried: another writer scales the Deployment between the
// scaler's read and its write; the write is a 409, the scaler reads the
// scale again and writes the planner's count over the fresh version.
func TestConflictRetried(t *testing.T) {
	api := newFakeAPI(t, true, deployment("pd-prefill", 1), deployment("pd-decode", 1))
	raced := 0
	api.PrependReactor("get", "deployments", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() == "scale" && act.(k8stesting.GetAction).GetName() == "pd-prefill" && raced == 0 {
			raced++
			res, obj, err := api.getScale(act)  // the scaler reads…
			api.setReplicas(t, "pd-prefill", 5) // …and kubectl scale writes before it does
			return res, obj, err
		}
		return false, nil, nil
	})
	s := newScaler(t, api, clocktesting.NewFakeClock(time.Unix(0, 0)))
	if err := s.Apply(context.Background(), decision(1, 1, 2, 1)); err != nil {
		t.Fatal(err)
	}
	if got := api.replicas(t, "pd-prefill"); got != 2 {
		t.Fatalf("prefill replicas %d, want the planner's 2", got)
	}
	if got, want := strings.Join(api.scaleWrites(), " "), "pd-prefill=2 pd-prefill=2"; got != want {
		t.Fatalf("writes %q, want %q (one refused, one after a fresh read)", got, want)
	}

	// A write that always loses gives up after MaxConflictRetries, saying so.
	api.PrependReactor("update", "deployments", func(act k8stesting.Action) (bool, runtime.Object, error) {
		return act.GetSubresource() == "scale", nil, apierrors.NewConflict(deployments.GroupResource(), "pd-prefill", errors.New("modified"))
	})
	before := len(api.scaleWrites())
	err := s.Apply(context.Background(), decision(2, 1, 3, 1))
	if err == nil || !strings.Contains(err.Error(), "5 conflicting writes in a row") || !strings.Contains(err.Error(), "llm/pd-prefill") {
		t.Fatalf("err %v", err)
	}
	if n := len(api.scaleWrites()) - before; n != DefaultMaxConflictRetries {
		t.Fatalf("%d writes, want %d", n, DefaultMaxConflictRetries)
	}
}

func TestMissingDeployment(t *testing.T) {
	api := newFakeAPI(t, true, deployment("pd-prefill", 1))
	s := newScaler(t, api, clocktesting.NewFakeClock(time.Unix(0, 0)))
	err := s.Apply(context.Background(), decision(1, 1, 1, 2))
	if err == nil {
		t.Fatal("no error for a missing Deployment")
	}
	for _, want := range []string{"get deployments/scale llm/pd-decode", `Deployment "pd-decode" does not exist`, "--planner-decode-deployment"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if !apierrors.IsNotFound(err) {
		t.Errorf("error %v does not wrap the API's NotFound", err)
	}
}

func TestForbidden(t *testing.T) {
	api := newFakeAPI(t, true, deployment("pd-prefill", 1), deployment("pd-decode", 1))
	api.PrependReactor("update", "deployments", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() != "scale" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments/scale"}, "pd-prefill",
			errors.New(`User "system:serviceaccount:llm:pd-router" cannot update resource "deployments/scale"`))
	})
	s := newScaler(t, api, clocktesting.NewFakeClock(time.Unix(0, 0)))
	err := s.Apply(context.Background(), decision(1, 1, 2, 1))
	if err == nil {
		t.Fatal("no error when forbidden")
	}
	for _, want := range []string{"update deployments/scale llm/pd-prefill: forbidden", "update and patch on deployments/scale"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := api.replicas(t, "pd-prefill"); got != 1 {
		t.Errorf("prefill replicas %d after a refused write", got)
	}
}

// waitFor yields to Apply's goroutine until cond holds, failing t after
// 10 s (cond reads the fake API's counters and the fake clock's waiters,
// which have no notification to wait on).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		goruntime.Gosched()
	}
}

// TestWaitsUntilReady: Apply returns once the Deployment shows its pods
// ready, not when the count is written; and fails, naming what is
// missing, when they are not ready within ReadyTimeout.
func TestWaitsUntilReady(t *testing.T) {
	api := newFakeAPI(t, false, deployment("pd-prefill", 1), deployment("pd-decode", 1))
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	s := newScaler(t, api, clk)
	done := make(chan error, 1)
	go func() { done <- s.Apply(context.Background(), decision(1, 1, 2, 1)) }()
	waitFor(t, "Apply to read the Deployment", func() bool { return api.statusReads() == 1 && clk.HasWaiters() })
	clk.Step(time.Second)
	waitFor(t, "Apply to read it again", func() bool { return api.statusReads() == 2 })
	select {
	case err := <-done:
		t.Fatalf("Apply returned %v before the pods were ready", err)
	default:
	}
	api.settle(t, "pd-prefill")
	clk.Step(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	go func() { done <- s.Apply(context.Background(), decision(2, 1, 2, 3)) }()
	for i := 0; i < 60; i++ {
		waitFor(t, "Apply to poll", clk.HasWaiters)
		clk.Step(time.Second)
	}
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "within 1m0s") || !strings.Contains(err.Error(), "pd-decode: the controller has not seen the new count yet") {
		t.Fatalf("err %v", err)
	}

	// ctx ends the wait.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- s.Apply(ctx, decision(2, 1, 2, 4)) }()
	waitFor(t, "Apply to poll", clk.HasWaiters)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

func TestConfigErrors(t *testing.T) {
	api := newFakeAPI(t, true)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Client: api, Namespace: ns, PrefillDeployment: "p"}, "--planner-decode-deployment"},
		{Config{Client: api, Namespace: ns, PrefillDeployment: "x", DecodeDeployment: "x"}, "each role needs its own Deployment"},
		{Config{PrefillDeployment: "p", DecodeDeployment: "d", Kubeconfig: "/nonexistent/kubeconfig"}, "kubernetes client configuration"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestNamespaceFromKubeconfig: without --k8s-namespace the Deployments are
// looked for in the kubeconfig context's namespace.
func TestNamespaceFromKubeconfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: inference}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Kubeconfig: kc, PrefillDeployment: "p", DecodeDeployment: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Namespace != "inference" {
		t.Fatalf("namespace %q, want the context's", s.cfg.Namespace)
	}
	s, err = New(Config{Kubeconfig: kc, Namespace: "other", PrefillDeployment: "p", DecodeDeployment: "d"})
	if err != nil || s.cfg.Namespace != "other" {
		t.Fatalf("namespace %q (%v), want the one given", s.cfg.Namespace, err)
	}
}

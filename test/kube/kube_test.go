// Package kube checks the planner's Kubernetes actuator against a real
// kube-apiserver (built from tools/kube-apiserver, PDSERVE_KUBE_APISERVER)
// over a real etcd: the scale subresource, optimistic concurrency (409),
// RBAC as the Helm chart grants it, and a missing Deployment. No
// controller manager runs: the test plays the Deployment controller's
// part (a Deployment's status follows its spec at once).
package kube

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/pdserve/pdserve/internal/planner"
	"github.com/pdserve/pdserve/internal/planner/kubescale"
	"github.com/pdserve/pdserve/internal/registry/etcd/etcdtest"
	"github.com/pdserve/pdserve/internal/testbin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ns           = "llm"
	release      = "pd"
	adminToken   = "admin-token"
	routerToken  = "router-token"
	buildCommand = "cd tools/kube-apiserver && go build -o /tmp/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
)

// apiserverBinary is PDSERVE_KUBE_APISERVER; the test is skipped without
// it unless PDSERVE_REQUIRE_KUBE_APISERVER is set.
func apiserverBinary(t *testing.T) string {
	bin := os.Getenv("PDSERVE_KUBE_APISERVER")
	if bin == "" {
		if os.Getenv("PDSERVE_REQUIRE_KUBE_APISERVER") != "" {
			t.Fatal("PDSERVE_REQUIRE_KUBE_APISERVER is set but PDSERVE_KUBE_APISERVER names no kube-apiserver (build it: " + buildCommand + ")")
		}
		t.Skip("PDSERVE_KUBE_APISERVER is not set (build a kube-apiserver: " + buildCommand + ")")
	}
	return bin
}

// cluster is a kube-apiserver on loopback with two static tokens: the
// admin (system:masters) and the router's service account of the chart
// (system:serviceaccount:llm:pd-router), which RBAC governs.
type cluster struct {
	url string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	bin := apiserverBinary(t)
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"sa.key": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(adminToken + ",admin,admin,system:masters\n" +
			routerToken + ",system:serviceaccount:" + ns + ":" + release + "-router,router\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := testbin.FreePort(t)
	p, err := testbin.Start(t, bin, "kube-apiserver", nil,
		"--etcd-servers="+etcd.Endpoint(), "--etcd-prefix=/registry-"+strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--cert-dir="+filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"), "--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{url: "https://127.0.0.1:" + strconv.Itoa(port)}
	// The server's certificate is self-signed into --cert-dir; the test
	// talks to it on loopback only.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest("GET", c.url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-p.Exited():
			t.Fatalf("kube-apiserver exited: %v\n%s", p.Err(), p.Stderr())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready within 90 s (last: %v)\n%s", err, p.Stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	hc.CloseIdleConnections()
	return c
}

// config is a client configuration with token.
func (c *cluster) config(token string) *rest.Config {
	return &rest.Config{Host: c.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

// chartRBAC renders the Helm chart's RBAC with the planner scaling, as a
// release named pd in namespace llm installs it.
func chartRBAC(t *testing.T) (*rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	ch, err := loader.Load("../../deploy/helm/pdserve")
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, map[string]any{"planner": map[string]any{"enabled": true}},
		chartutil.ReleaseOptions{Name: release, Namespace: ns, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, doc := range strings.Split(out["pdserve/templates/rbac.yaml"], "\n---") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "Role":
			role = &rbacv1.Role{}
			err = yaml.UnmarshalStrict([]byte(doc), role)
		case "RoleBinding":
			binding = &rbacv1.RoleBinding{}
			err = yaml.UnmarshalStrict([]byte(doc), binding)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if role == nil || binding == nil {
		t.Fatalf("the chart's rbac.yaml has no Role or RoleBinding:\n%s", out["pdserve/templates/rbac.yaml"])
	}
	role.Namespace, binding.Namespace = ns, ns
	return role, binding
}

func deployment(name, role string) *appsv1.Deployment {
	one := int32(1)
	labels := map[string]string{"app": "pdserve", "pdserve.io/role": role}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: role, Image: "pdserve:test", Args: []string{role}}}}}}}
}

// playController makes every Deployment's status follow its spec (all
// pods ready) until ctx ends, as the Deployment controller and the kubelets
// would.
func playController(ctx context.Context, apps appsv1client.DeploymentInterface) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list, err := apps.List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, d := range list.Items {
					r := *d.Spec.Replicas
					if d.Status.ObservedGeneration == d.Generation && d.Status.Replicas == r && d.Status.ReadyReplicas == r {
						continue
					}
					d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: r, ReadyReplicas: r,
						UpdatedReplicas: r, AvailableReplicas: r}
					// A conflict is the next round's business.
					_, _ = apps.UpdateStatus(ctx, &d, metav1.UpdateOptions{})
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return done
}

func TestScalerOnARealAPIServer(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := c.config(adminToken)
	core, err := corev1client.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	adminApps, err := appsv1client.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	rbac, err := rbacv1client.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deps := adminApps.Deployments(ns)
	for _, role := range []string{"prefill", "decode"} {
		if _, err := deps.Create(ctx, deployment(release+"-"+role, role), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctrlCtx, stopCtrl := context.WithCancel(ctx)
	ctrlDone := playController(ctrlCtx, deps)
	defer func() { stopCtrl(); <-ctrlDone }()

	// The router's client; the first PUT of a scale can be preceded by
	// another writer's (kubectl scale) to make it lose the race.
	var puts atomic.Int32
	var raceOnce atomic.Bool
	routerCfg := c.config(routerToken)
	routerCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/scale") {
				puts.Add(1)
				if raceOnce.CompareAndSwap(true, false) {
					sc, err := deps.GetScale(r.Context(), release+"-prefill", metav1.GetOptions{})
					if err == nil {
						sc.Spec.Replicas = 7
						_, err = deps.UpdateScale(r.Context(), release+"-prefill", sc, metav1.UpdateOptions{})
					}
					if err != nil {
						return nil, fmt.Errorf("the other writer: %w", err)
					}
				}
			}
			return rt.RoundTrip(r)
		})
	}
	routerApps, err := appsv1client.NewForConfig(routerCfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kubescale.New(kubescale.Config{Client: routerApps, Namespace: ns, PrefillDeployment: release + "-prefill",
		DecodeDeployment: release + "-decode", ReadyTimeout: 30 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	replicas := func() string {
		t.Helper()
		var out []string
		for _, role := range []string{"prefill", "decode"} {
			d, err := deps.Get(ctx, release+"-"+role, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s=%d", role, *d.Spec.Replicas))
		}
		return strings.Join(out, " ")
	}
	apply := func(p, d, wantP, wantD int) error {
		return s.Apply(ctx, planner.Decision{Action: planner.ActionScale, Prefill: p, Decode: d, DesiredPrefill: wantP, DesiredDecode: wantD})
	}

	// Without the chart's Role: RBAC refuses, and the error says what the
	// Role needs.
	err = apply(1, 1, 2, 1)
	if err == nil || !strings.Contains(err.Error(), "get deployments/scale llm/pd-prefill: forbidden") ||
		!strings.Contains(err.Error(), `cannot get resource "deployments/scale"`) {
		t.Fatalf("without RBAC: %v", err)
	}

	role, binding := chartRBAC(t)
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC's cache takes the new Role within moments: until then, forbidden.
	deadline := time.Now().Add(30 * time.Second)
	for err = apply(1, 1, 3, 2); err != nil && strings.Contains(err.Error(), "forbidden"); err = apply(1, 1, 3, 2) {
		if time.Now().After(deadline) {
			t.Fatalf("still forbidden with the chart's Role: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("scale up: %v", err)
	}
	if got := replicas(); got != "prefill=3 decode=2" {
		t.Fatalf("after scaling up: %s", got)
	}

	// Another writer between the scaler's read and its write: a real 409,
	// read again, written again.
	raceOnce.Store(true)
	before := puts.Load()
	if err := apply(3, 2, 4, 2); err != nil {
		t.Fatalf("scale with a conflict: %v", err)
	}
	if got := replicas(); got != "prefill=4 decode=2" {
		t.Fatalf("after the conflict: %s", got)
	}
	if n := puts.Load() - before; n != 2 {
		t.Fatalf("%d scale writes, want 2 (one refused with 409, one after a fresh read)", n)
	}

	if err := apply(4, 2, 1, 1); err != nil {
		t.Fatalf("scale down: %v", err)
	}
	if got := replicas(); got != "prefill=1 decode=1" {
		t.Fatalf("after scaling down: %s", got)
	}

	// The chart's Role names the two Deployments: another is refused even
	// to an admin-made one...
	other, err := kubescale.New(kubescale.Config{Client: routerApps, Namespace: ns, PrefillDeployment: release + "-prefill",
		DecodeDeployment: "someone-else", ReadyTimeout: 30 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Create(ctx, deployment("someone-else", "decode"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = other.Apply(ctx, planner.Decision{Prefill: 1, Decode: 1, DesiredPrefill: 1, DesiredDecode: 2})
	if err == nil || !strings.Contains(err.Error(), "llm/someone-else: forbidden") {
		t.Fatalf("a Deployment the Role does not name: %v", err)
	}
	// ...and one of them deleted is missing, by name.
	if err := deps.Delete(ctx, release+"-decode", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = apply(1, 1, 1, 2)
	if err == nil || !strings.Contains(err.Error(), `get deployments/scale llm/pd-decode: the Deployment "pd-decode" does not exist`) {
		t.Fatalf("a missing Deployment: %v", err)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

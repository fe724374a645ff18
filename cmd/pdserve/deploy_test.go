package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/pdserve/pdserve/internal/registry/kube"
	"github.com/spf13/pflag"
)

// manifests holds decoded Kubernetes objects, by kind.
type manifests struct {
	deployments []appsv1.Deployment
	services    []corev1.Service
	accounts    []corev1.ServiceAccount
	roles       []rbacv1.Role
	bindings    []rbacv1.RoleBinding
	pdbs        []policyv1.PodDisruptionBudget
}

// decode splits a YAML stream into documents and decodes each strictly
// (an unknown field is an error) into its k8s.io/api type.
func (m *manifests) decode(t *testing.T, name string, data []byte) {
	t.Helper()
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		var err error
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			var d appsv1.Deployment
			err = yaml.UnmarshalStrict(doc, &d)
			m.deployments = append(m.deployments, d)
		case "v1 Service":
			var s corev1.Service
			err = yaml.UnmarshalStrict(doc, &s)
			m.services = append(m.services, s)
		case "v1 ServiceAccount":
			var s corev1.ServiceAccount
			err = yaml.UnmarshalStrict(doc, &s)
			m.accounts = append(m.accounts, s)
		case "rbac.authorization.k8s.io/v1 Role":
			var r rbacv1.Role
			err = yaml.UnmarshalStrict(doc, &r)
			m.roles = append(m.roles, r)
		case "policy/v1 PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			err = yaml.UnmarshalStrict(doc, &p)
			m.pdbs = append(m.pdbs, p)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			var r rbacv1.RoleBinding
			err = yaml.UnmarshalStrict(doc, &r)
			m.bindings = append(m.bindings, r)
		default:
			t.Fatalf("%s document %d: unexpected %s %s", name, i, head.APIVersion, head.Kind)
		}
		if err != nil {
			t.Fatalf("%s document %d (%s): %v", name, i, head.Kind, err)
		}
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// flagsOf parses a container's args with the pdserve subcommand they name,
// as the binary would, and returns the command and its flags' values.
func flagsOf(t *testing.T, what string, args []string) (string, map[string]string) {
	t.Helper()
	if len(args) == 0 {
		t.Fatalf("%s: no args", what)
	}
	root := newRoot(context.Background(), func(string) (string, bool) { return "", false }, io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == root {
		t.Fatalf("%s: %q is no pdserve command: %v", what, args[0], err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%s: pdserve %s refuses its args: %v", what, cmd.Name(), err)
	}
	if extra := cmd.Flags().Args(); len(extra) > 0 {
		t.Fatalf("%s: stray args %q", what, extra)
	}
	// Every flag's value as the command would run with it (defaults too).
	got := map[string]string{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) { got[f.Name] = f.Value.String() })
	return cmd.Name(), got
}

// check verifies the objects against each other and the binary's flags:
// every container's args parse; the HTTP (and KV) container ports are the
// ones the flags bind; probes hit /health (readiness) and /livez
// (liveness) on the http port; worker pods carry the role label and port
// annotations the router's pod watch reads, and the router's selector
// matches them; the grace period covers preStop, --drain-timeout and the
// shutdown after a drain cut short (shutdownTimeout); the
// router's service account may list and watch pods.
func (m *manifests) check(t *testing.T) {
	t.Helper()
	var workerLabels []labels.Set
	var routerSelector, routerAccount string
	roles := map[string]bool{}
	for _, d := range m.deployments {
		what := "Deployment " + d.Name
		sel := labels.SelectorFromSet(d.Spec.Selector.MatchLabels)
		pod := d.Spec.Template
		if !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("%s: selector %s does not match its pods' labels %v", what, sel, pod.Labels)
		}
		if len(pod.Spec.Containers) != 1 {
			t.Fatalf("%s: %d containers, want 1", what, len(pod.Spec.Containers))
		}
		c := pod.Spec.Containers[0]
		role, flags := flagsOf(t, what, c.Args)
		roles[role] = true
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		if strconv.Itoa(int(ports["http"])) != flags["port"] {
			t.Errorf("%s: container port http %d, --port %q", what, ports["http"], flags["port"])
		}
		if flags["host"] != "0.0.0.0" {
			t.Errorf("%s: --host %q, want 0.0.0.0 (reachable from other pods)", what, flags["host"])
		}
		for _, p := range []struct {
			name string
			pr   *corev1.Probe
			path string
		}{{"readiness", c.ReadinessProbe, "/health"}, {"liveness", c.LivenessProbe, "/livez"}} {
			if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.String() != "http" {
				t.Errorf("%s: %s probe %+v, want GET %s on port http", what, p.name, p.pr, p.path)
			}
		}
		drain, err := time.ParseDuration(flags["drain-timeout"])
		if err != nil {
			t.Errorf("%s: --drain-timeout %q: %v", what, flags["drain-timeout"], err)
		}
		var preStop int64
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			preStop = c.Lifecycle.PreStop.Sleep.Seconds
		}
		if g := pod.Spec.TerminationGracePeriodSeconds; g == nil ||
			time.Duration(*g)*time.Second < time.Duration(preStop)*time.Second+drain+shutdownTimeout {
			t.Errorf("%s: terminationGracePeriodSeconds %v does not cover preStop %ds + --drain-timeout %s + the shutdown after it %s",
				what, g, preStop, drain, shutdownTimeout)
		}
		switch role {
		case "prefill", "decode":
			if pod.Labels[kube.LabelRole] != role {
				t.Errorf("%s: pod label %s=%q, want %q", what, kube.LabelRole, pod.Labels[kube.LabelRole], role)
			}
			if pod.Annotations[kube.AnnotationPort] != flags["port"] {
				t.Errorf("%s: annotation %s=%q, --port %q", what, kube.AnnotationPort, pod.Annotations[kube.AnnotationPort], flags["port"])
			}
			if role == "prefill" {
				if pod.Annotations[kube.AnnotationKV] != flags["kv-port"] || strconv.Itoa(int(ports["kv"])) != flags["kv-port"] {
					t.Errorf("%s: annotation %s=%q, container port kv %d, --kv-port %q", what, kube.AnnotationKV,
						pod.Annotations[kube.AnnotationKV], ports["kv"], flags["kv-port"])
				}
			}
			workerLabels = append(workerLabels, labels.Set(pod.Labels))
		case "router":
			if flags["discovery"] != "kubernetes" {
				t.Errorf("%s: --discovery %q, want kubernetes", what, flags["discovery"])
			}
			routerSelector, routerAccount = flags["k8s-selector"], pod.Spec.ServiceAccountName
		default:
			t.Errorf("%s: runs pdserve %s", what, role)
		}
	}
	for _, want := range []string{"router", "prefill", "decode"} {
		if !roles[want] {
			t.Errorf("no %s Deployment", want)
		}
	}
	sel, err := labels.Parse(routerSelector)
	if err != nil {
		t.Fatalf("router --k8s-selector %q: %v", routerSelector, err)
	}
	for _, l := range workerLabels {
		if !sel.Matches(l) {
			t.Errorf("router selector %q does not match worker pods labelled %v", routerSelector, l)
		}
	}
	canWatch := false
	for _, r := range m.roles {
		for _, rule := range r.Rules {
			if contains(rule.Resources, "pods") && contains(rule.Verbs, "list") && contains(rule.Verbs, "watch") && contains(rule.Verbs, "get") {
				for _, b := range m.bindings {
					for _, s := range b.Subjects {
						if b.RoleRef.Name == r.Name && s.Kind == "ServiceAccount" && s.Name == routerAccount {
							canWatch = true
						}
					}
				}
			}
		}
	}
	if !canWatch {
		t.Errorf("the router's service account %q cannot get, list and watch pods", routerAccount)
	}
	if len(m.services) == 0 {
		t.Error("no Service in front of the router")
	}
	for _, s := range m.services {
		if len(s.Spec.Ports) == 0 || s.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("Service %s: ports %+v, want the router's http port", s.Name, s.Spec.Ports)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestKubernetesManifests decodes deploy/kubernetes strictly into
// k8s.io/api types and checks them against the binary's flags.
func TestKubernetesManifests(t *testing.T) {
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var m manifests
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m.decode(t, filepath.Base(f), b)
	}
	m.check(t)
}

// TestHelmChart renders deploy/helm/pdserve with its default values (and
// with more replicas and extra flags) through Helm's own template engine,
// then checks the result as the plain manifests are checked.
func TestHelmChart(t *testing.T) {
	ch, err := loader.Load("../../deploy/helm/pdserve")
	if err != nil {
		t.Fatal(err)
	}
	for _, vals := range []map[string]any{
		nil,
		{"prefill": map[string]any{"replicas": 3}, "decode": map[string]any{"replicas": 2},
			"modelArgs": []any{"--sim-profile=h100-llama3-8b"}, "workerArgs": []any{"--kv-cache-memory=1GiB"},
			"router": map[string]any{"args": []any{"--slow-start=5s"}}, "drainTimeout": "120s"},
		{"tracing": map[string]any{"otlpEndpoint": "grpc://otel-collector:4317"}},
		{"tracing": map[string]any{"jaeger": map[string]any{"enabled": true}}},
		{"planner": map[string]any{"enabled": true, "ttftSLO": "1500ms", "itlSLO": "40ms", "args": []any{"--planner-max-decode=8"}},
			"prefill": map[string]any{"replicas": 3}, "pdb": map[string]any{"maxUnavailable": 2}},
		{"planner": map[string]any{"enabled": true, "scaler": "none"}, "pdb": map[string]any{"enabled": false}},
	} {
		rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "pd", Namespace: "llm", IsInstall: true},
			chartutil.DefaultCapabilities)
		if err != nil {
			t.Fatal(err)
		}
		out, err := engine.Render(ch, rv)
		if err != nil {
			t.Fatalf("render with %v: %v", vals, err)
		}
		names := make([]string, 0, len(out))
		for n := range out {
			names = append(names, n)
		}
		sort.Strings(names)
		var m manifests
		for _, n := range names {
			if !strings.HasSuffix(n, ".yaml") {
				continue
			}
			m.decode(t, n, []byte(out[n]))
		}
		jaeger := m.takeComponent("jaeger")
		if got := fmt.Sprint(len(m.deployments)); got != "3" {
			t.Fatalf("values %v: %s Deployments", vals, got)
		}
		m.check(t)
		m.checkPlanner(t, vals)
		m.checkPDBs(t, vals)
		// Tracing: every pdserve pod exports to the endpoint asked for, or
		// to the chart's Jaeger, which is there only when enabled.
		endpoint := ""
		if tr, ok := vals["tracing"].(map[string]any); ok {
			endpoint, _ = tr["otlpEndpoint"].(string)
			if _, ok := tr["jaeger"]; ok {
				endpoint = "grpc://pd-jaeger:4317"
				if len(jaeger.deployments) != 1 || len(jaeger.services) != 1 || jaeger.services[0].Name != "pd-jaeger" {
					t.Fatalf("jaeger enabled: %d Deployments, %d Services", len(jaeger.deployments), len(jaeger.services))
				}
			}
		}
		if endpoint == "" && len(jaeger.deployments)+len(jaeger.services) > 0 {
			t.Fatalf("values %v: a Jaeger without tracing.jaeger.enabled", vals)
		}
		for _, d := range m.deployments {
			_, flags := flagsOf(t, d.Name, d.Spec.Template.Spec.Containers[0].Args)
			if flags["otlp-traces-endpoint"] != endpoint {
				t.Errorf("values %v: %s --otlp-traces-endpoint %q, want %q", vals, d.Name, flags["otlp-traces-endpoint"], endpoint)
			}
		}
	}
}

// TestHelmChartRefusesAnUnknownScaler: the chart's router runs on
// Kubernetes, so planner.scaler is kubernetes or none; anything else fails
// the render with a message naming the value.
func TestHelmChartRefusesAnUnknownScaler(t *testing.T) {
	ch, err := loader.Load("../../deploy/helm/pdserve")
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, map[string]any{"planner": map[string]any{"enabled": true, "scaler": "etcd"}},
		chartutil.ReleaseOptions{Name: "pd", Namespace: "llm", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Render(ch, rv); err == nil || !strings.Contains(err.Error(), `planner.scaler "etcd": want kubernetes or none`) {
		t.Fatalf("render: %v", err)
	}
}

// value returns vals[section][key], or def if it is not set.
func value(vals map[string]any, section, key string, def any) any {
	if sec, ok := vals[section].(map[string]any); ok {
		if v, ok := sec[key]; ok {
			return v
		}
	}
	return def
}

// byRole returns the worker Deployments by their pods' role label, and the
// router's flags and service account.
func (m *manifests) byRole(t *testing.T) (workers map[string]appsv1.Deployment, router map[string]string, account string) {
	t.Helper()
	workers = map[string]appsv1.Deployment{}
	for _, d := range m.deployments {
		cmd, flags := flagsOf(t, d.Name, d.Spec.Template.Spec.Containers[0].Args)
		if cmd == "router" {
			router, account = flags, d.Spec.Template.Spec.ServiceAccountName
		} else {
			workers[d.Spec.Template.Labels[kube.LabelRole]] = d
		}
	}
	return workers, router, account
}

// grants reports whether a Role bound to the service account allows verb
// on resource (of apiGroup) named name.
func (m *manifests) grants(account, apiGroup, resource, name, verb string) bool {
	for _, r := range m.roles {
		bound := false
		for _, b := range m.bindings {
			for _, s := range b.Subjects {
				bound = bound || (b.RoleRef.Kind == "Role" && b.RoleRef.Name == r.Name && s.Kind == "ServiceAccount" && s.Name == account)
			}
		}
		if !bound {
			continue
		}
		for _, rule := range r.Rules {
			if contains(rule.APIGroups, apiGroup) && contains(rule.Resources, resource) && contains(rule.Verbs, verb) &&
				(len(rule.ResourceNames) == 0 || contains(rule.ResourceNames, name)) {
				return true
			}
		}
	}
	return false
}

// checkPlanner checks the router's planner flags against the values, and
// that the router's service account may scale the worker Deployments
// exactly when the planner scales them (and their replica counts are then
// left to it).
func (m *manifests) checkPlanner(t *testing.T, vals map[string]any) {
	t.Helper()
	workers, router, account := m.byRole(t)
	on := value(vals, "planner", "enabled", false).(bool)
	scaler := value(vals, "planner", "scaler", "kubernetes").(string)
	scales := on && scaler == "kubernetes"
	want := map[string]string{"planner": "false", "planner-scaler": "none", "planner-prefill-deployment": "", "planner-decode-deployment": ""}
	if on {
		want = map[string]string{"planner": "true", "ttft-slo": value(vals, "planner", "ttftSLO", "2s").(string),
			"itl-slo": value(vals, "planner", "itlSLO", "50ms").(string), "planner-scaler": scaler,
			"planner-prefill-deployment": "", "planner-decode-deployment": ""}
		if scales {
			want["planner-prefill-deployment"], want["planner-decode-deployment"] = workers["prefill"].Name, workers["decode"].Name
		}
	}
	for k, v := range want {
		if k == "ttft-slo" || k == "itl-slo" {
			got, err1 := time.ParseDuration(router[k])
			w, err2 := time.ParseDuration(v)
			if err1 != nil || err2 != nil || got != w {
				t.Errorf("values %v: router --%s %q, want %s", vals, k, router[k], v)
			}
			continue
		}
		if router[k] != v {
			t.Errorf("values %v: router --%s %q, want %q", vals, k, router[k], v)
		}
	}
	for _, role := range []string{"prefill", "decode"} {
		d := workers[role]
		for _, verb := range []string{"get", "update", "patch"} {
			if got := m.grants(account, "apps", "deployments/scale", d.Name, verb); got != scales {
				t.Errorf("values %v: the router may %s deployments/scale %s: %v, want %v", vals, verb, d.Name, got, scales)
			}
		}
		if got := m.grants(account, "apps", "deployments", d.Name, "get"); got != scales {
			t.Errorf("values %v: the router may get deployments %s: %v, want %v", vals, d.Name, got, scales)
		}
		if m.grants(account, "apps", "deployments", d.Name, "update") || m.grants(account, "apps", "deployments/scale", "other", "update") {
			t.Errorf("values %v: the router may update more than the workers' scale", vals)
		}
		switch {
		case scales && d.Spec.Replicas != nil:
			t.Errorf("values %v: %s sets replicas %d, which the planner owns", vals, d.Name, *d.Spec.Replicas)
		case !scales && (d.Spec.Replicas == nil || fmt.Sprint(*d.Spec.Replicas) != fmt.Sprint(value(vals, role, "replicas", 1))):
			t.Errorf("values %v: %s replicas %v", vals, d.Name, d.Spec.Replicas)
		}
	}
}

// checkPDBs checks one PodDisruptionBudget per worker role, selecting that
// role's pods only, with the values' maxUnavailable (none when disabled).
func (m *manifests) checkPDBs(t *testing.T, vals map[string]any) {
	t.Helper()
	workers, _, _ := m.byRole(t)
	if !value(vals, "pdb", "enabled", true).(bool) {
		if len(m.pdbs) > 0 {
			t.Errorf("values %v: %d PodDisruptionBudgets with pdb.enabled false", vals, len(m.pdbs))
		}
		return
	}
	if len(m.pdbs) != 2 {
		t.Fatalf("values %v: %d PodDisruptionBudgets, want one per worker role", vals, len(m.pdbs))
	}
	maxUnavailable := fmt.Sprint(value(vals, "pdb", "maxUnavailable", 1))
	for role, d := range workers {
		var match []string
		for _, p := range m.pdbs {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil {
				t.Fatalf("PodDisruptionBudget %s: %v", p.Name, err)
			}
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				match = append(match, p.Name)
				if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.String() != maxUnavailable || p.Spec.MinAvailable != nil {
					t.Errorf("values %v: PodDisruptionBudget %s: maxUnavailable %v, minAvailable %v; want maxUnavailable %s only",
						vals, p.Name, p.Spec.MaxUnavailable, p.Spec.MinAvailable, maxUnavailable)
				}
			}
		}
		if len(match) != 1 {
			t.Errorf("values %v: %s pods are selected by PodDisruptionBudgets %v, want one", vals, role, match)
		}
	}
}

// takeComponent removes the Deployments and Services labelled
// app.kubernetes.io/component=c from m and returns them.
func (m *manifests) takeComponent(c string) manifests {
	var out manifests
	keepD := m.deployments[:0]
	for _, d := range m.deployments {
		if d.Labels["app.kubernetes.io/component"] == c {
			out.deployments = append(out.deployments, d)
		} else {
			keepD = append(keepD, d)
		}
	}
	m.deployments = keepD
	keepS := m.services[:0]
	for _, sv := range m.services {
		if sv.Labels["app.kubernetes.io/component"] == c {
			out.services = append(out.services, sv)
		} else {
			keepS = append(keepS, sv)
		}
	}
	m.services = keepS
	return out
}

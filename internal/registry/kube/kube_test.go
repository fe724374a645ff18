package kube

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	corefake "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/testbin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeAPI is client-go's fake core/v1 API over an object tracker holding
// objs: what the fake clientset of every API group does, for the one group
// the registry reads.
type fakeAPI struct {
	*corefake.FakeCoreV1
	tracker k8stesting.ObjectTracker
}

func newFakeAPI(t *testing.T, objs ...runtime.Object) *fakeAPI {
	t.Helper()
	tracker := k8stesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())
	for _, o := range objs {
		if err := tracker.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	f := &k8stesting.Fake{}
	f.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))
	f.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := tracker.Watch(a.GetResource(), a.GetNamespace())
		return true, w, err
	})
	return &fakeAPI{FakeCoreV1: &corefake.FakeCoreV1{Fake: f}, tracker: tracker}
}

// IsWatchListSemanticsUnSupported tells the informer, as client-go's fake
// clientset does, that the fake cannot stream a list as watch events.
func (*fakeAPI) IsWatchListSemanticsUnSupported() bool { return true }

func pod(name, role, ip string, ready bool, ann map[string]string) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	if ann == nil {
		ann = map[string]string{AnnotationPort: "30000", AnnotationKV: "8998"}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", UID: types.UID("uid-" + name),
			Labels: map[string]string{"app": "pdserve", LabelRole: role}, Annotations: ann},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

type run struct {
	mu   sync.Mutex
	last registry.Snapshot
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, cs *fakeAPI, relist time.Duration) *run {
	t.Helper()
	r, err := New(Config{Client: cs, Namespace: "llm", Selector: "app=pdserve", Relist: relist})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &run{stop: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- r.Run(ctx, func(s registry.Snapshot) {
			w.mu.Lock()
			w.last = s
			w.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != context.Canceled {
			t.Errorf("Run returned %v", err)
		}
	})
	return w
}

func describe(s registry.Snapshot) string {
	var out []string
	for _, e := range s.Entries {
		d := e.ID + " " + e.Role + " " + e.URL
		if e.KVAddr != "" {
			d += " kv=" + e.KVAddr
		}
		if e.Invalid != "" {
			d = e.ID + " invalid: " + e.Invalid
		}
		out = append(out, d)
	}
	return strings.Join(out, "; ")
}

func (w *run) waitFor(t *testing.T, want string) {
	t.Helper()
	state, ok := testbin.WaitUntil(10*time.Second, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		got := describe(w.last)
		return got == want, got
	})
	if !ok {
		t.Fatalf("fleet %q\nwant  %q", state, want)
	}
}

func updateStatus(t *testing.T, cs *fakeAPI, p *corev1.Pod) {
	t.Helper()
	if _, err := cs.Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestPodsConverge: Ready pods join; NotReady, deletion, a selector
// mismatch and an IP change each converge.
func TestPodsConverge(t *testing.T) {
	p1 := pod("prefill-0", "prefill", "10.0.0.1", true, nil)
	d1 := pod("decode-0", "decode", "10.0.0.2", true, map[string]string{AnnotationPort: "30001"})
	other := pod("other", "decode", "10.0.0.9", true, nil)
	other.Labels["app"] = "something-else"
	pending := pod("decode-1", "decode", "10.0.0.3", false, nil)
	cs := newFakeAPI(t, p1, d1, other, pending)
	w := start(t, cs, time.Hour)
	w.waitFor(t, "llm/decode-0/uid-decode-0 decode http://10.0.0.2:30001; llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")

	// decode-1 becomes Ready: it joins.
	pending.Status.Conditions[0].Status = corev1.ConditionTrue
	updateStatus(t, cs, pending)
	w.waitFor(t, "llm/decode-0/uid-decode-0 decode http://10.0.0.2:30001; llm/decode-1/uid-decode-1 decode http://10.0.0.3:30000; llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")

	// decode-0 goes NotReady: it leaves.
	d1.Status.Conditions[0].Status = corev1.ConditionFalse
	updateStatus(t, cs, d1)
	w.waitFor(t, "llm/decode-1/uid-decode-1 decode http://10.0.0.3:30000; llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")

	// decode-1 changes IP: same identity, new address.
	pending.Status.PodIP = "10.0.0.4"
	updateStatus(t, cs, pending)
	w.waitFor(t, "llm/decode-1/uid-decode-1 decode http://10.0.0.4:30000; llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")

	// decode-1's labels stop matching the selector: it leaves.
	pending.Labels["app"] = "retired"
	if _, err := cs.Pods("llm").Update(context.Background(), pending, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")

	// prefill-0 is being deleted (terminating), then deleted.
	now := metav1.Now()
	p1.DeletionTimestamp = &now
	if _, err := cs.Pods("llm").Update(context.Background(), p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "")
	if err := cs.Pods("llm").Delete(context.Background(), "prefill-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "")
}

// TestMissedDeleteCaughtByRelist: a delete the watch never delivered is
// caught by the periodic full re-list.
func TestMissedDeleteCaughtByRelist(t *testing.T) {
	p1 := pod("prefill-0", "prefill", "10.0.0.1", true, nil)
	d1 := pod("decode-0", "decode", "10.0.0.2", true, nil)
	cs := newFakeAPI(t, p1, d1)
	var dropping sync.Mutex
	drop := false
	cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		gvr, ns := a.GetResource(), a.GetNamespace()
		wi, err := cs.tracker.Watch(gvr, ns)
		if err != nil {
			return false, nil, err
		}
		// Pass events on, except deletes while dropping is on.
		return true, watch.Filter(wi, func(ev watch.Event) (watch.Event, bool) {
			dropping.Lock()
			defer dropping.Unlock()
			return ev, !(drop && ev.Type == watch.Deleted)
		}), nil
	})
	w := start(t, cs, 300*time.Millisecond)
	w.waitFor(t, "llm/decode-0/uid-decode-0 decode http://10.0.0.2:30000; llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")
	dropping.Lock()
	drop = true
	dropping.Unlock()
	if err := cs.Pods("llm").Delete(context.Background(), "decode-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "llm/prefill-0/uid-prefill-0 prefill http://10.0.0.1:30000 kv=10.0.0.1:8998")
}

// TestBadPodsListedInvalid: pods that count but cannot be used say why.
func TestBadPodsListedInvalid(t *testing.T) {
	r, err := New(Config{Client: newFakeAPI(t), Selector: "app=pdserve"})
	if err != nil {
		t.Fatal(err)
	}
	llmd := pod("both-0", "", "10.0.0.5", true, map[string]string{AnnotationPort: "8080"})
	delete(llmd.Labels, LabelRole)
	llmd.Labels[LabelRoleLLMD] = "both"
	got := describe(r.Snapshot([]*corev1.Pod{
		pod("noport", "decode", "10.0.0.1", true, map[string]string{}),
		pod("badport", "decode", "10.0.0.2", true, map[string]string{AnnotationPort: "http"}),
		pod("badkv", "prefill", "10.0.0.3", true, map[string]string{AnnotationPort: "1", AnnotationKV: "99999"}),
		pod("badrole", "router", "10.0.0.4", true, nil),
		llmd,
	}))
	want := `llm/badkv/uid-badkv invalid: annotation pdserve.io/kv-port="99999" is not a port; ` +
		`llm/badport/uid-badport invalid: annotation pdserve.io/port="http" is not a port; ` +
		`llm/badrole/uid-badrole invalid: role "router": want prefill, decode or colocated; ` +
		`llm/both-0/uid-both-0 colocated http://10.0.0.5:8080; ` +
		`llm/noport/uid-noport invalid: no pdserve.io/port annotation`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if _, err := New(Config{Client: newFakeAPI(t), Selector: "a in ("}); err == nil {
		t.Fatal("a bad selector was accepted")
	}
}

var _ runtime.Object = (*corev1.Pod)(nil)

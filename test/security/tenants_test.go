package security

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/testbin"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// liveStream starts a long streamed completion with key on base and
// returns once its first chunk arrived; the test's cleanup ends it. done
// receives how it ended: "[DONE]", the code of its error event, or "" (cut
// off).
func liveStream(t *testing.T, base, key string) (done <-chan string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions",
		strings.NewReader(`{"prompt": "a tenant's secret", "max_tokens": 4000, "temperature": 0, "stream": true, "ignore_eos": true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		resp.Body.Close()
		t.Fatalf("stream with %s: %d", key, resp.StatusCode)
	}
	ended := make(chan string, 1)
	first := make(chan struct{})
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		how, started := "", false
		for sc.Scan() {
			if !started {
				started = true
				close(first)
			}
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var e struct {
				Error *struct{ Code string } `json:"error"`
			}
			switch {
			case data == "[DONE]":
				if how == "" {
					how = data
				}
			case json.Unmarshal([]byte(data), &e) == nil && e.Error != nil:
				how = e.Error.Code
			}
		}
		if !started {
			close(first)
		}
		ended <- how
	}()
	t.Cleanup(func() {
		cancel()
		<-first
	})
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no first chunk in 30 s")
	}
	return ended
}

// TestTenantsKeepToTheirRequests: on `pdserve serve --api-key K1,K2` an
// API key reaches the OpenAI API only. K2 can neither list K1's live
// request (/debug/requests) nor end it (the worker API's abort, on the
// same port): 403 with a key, 401 without; K1's stream goes on to its end.
// With --admin-api-key, the admin key lists and aborts it, and the API
// keys still cannot, also when the worker API is guarded by the internal
// secret (a bearer key is then no signature).
func TestTenantsKeepToTheirRequests(t *testing.T) {
	t.Parallel()
	startServe := func(t *testing.T, args ...string) string {
		p := start(t, "serve", append([]string{"serve", "--port", "0", "--sim-decode-ms-per-step", "20", "--api-key", "sk-one,sk-two"}, args...)...)
		base := waitLine(t, p, workerRE)
		waitLine(t, p, regexp.MustCompile(`^ready$`))
		t.Cleanup(func() { stop(t, p) })
		return base
	}
	c := http.DefaultClient
	intruders := []struct {
		key  string
		want int
	}{{"sk-two", http.StatusForbidden}, {"sk-one", http.StatusForbidden}, {"", http.StatusUnauthorized}}

	t.Run("api keys only", func(t *testing.T) {
		base := startServe(t)
		ended := liveStream(t, base, "sk-one")
		for _, in := range intruders {
			status, _, body := do(t, c, "GET", base+workerapi.PathRequests, in.key, "")
			if status != in.want || strings.Contains(body, `"rid"`) {
				t.Errorf("GET /debug/requests with %q: %d %s, want %d and no request listed", in.key, status, body, in.want)
			}
			// The request's id is not needed to end it by guessing: the
			// abort is refused before its body is read.
			status, _, body = do(t, c, "POST", base+workerapi.PathAbort, in.key, `{"rid": "cmpl-anything", "reason": "client"}`)
			if status != in.want {
				t.Errorf("POST /internal/v1/abort with %q: %d %s, want %d", in.key, status, body, in.want)
			}
		}
		select {
		case how := <-ended:
			t.Fatalf("sk-one's stream ended while sk-two probed: %s", how)
		default:
		}
		// And the keys still serve the API.
		if status, _, body := do(t, c, "POST", base+"/v1/completions", "sk-two", completion); status != http.StatusOK {
			t.Errorf("sk-two's completion: %d %s", status, body)
		}
	})

	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"admin key", []string{"--admin-api-key", "adm-key"}},
		{"admin key and internal secret", []string{"--admin-api-key", "adm-key", "--internal-secret", "0123456789abcdef0123456789abcdef"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startServe(t, tc.extra...)
			ended := liveStream(t, base, "sk-one")
			for _, in := range intruders {
				want := in.want
				if in.key != "" {
					want = http.StatusUnauthorized // a key, but not the admin's
				}
				if status, _, body := do(t, c, "GET", base+workerapi.PathRequests, in.key, ""); status != want || strings.Contains(body, `"rid"`) {
					t.Errorf("GET /debug/requests with %q: %d %s, want %d", in.key, status, body, want)
				}
			}
			status, _, body := do(t, c, "GET", base+workerapi.PathRequests, "adm-key", "")
			var list workerapi.RequestList
			if err := json.Unmarshal([]byte(body), &list); status != http.StatusOK || err != nil || len(list.Requests) != 1 {
				t.Fatalf("GET /debug/requests with the admin key: %d %s", status, body)
			}
			rid := list.Requests[0].RID
			abort := fmt.Sprintf(`{"rid": %q, "reason": "client"}`, rid)
			for _, key := range []string{"sk-two", "sk-one"} {
				if status, _, body := do(t, c, "POST", base+workerapi.PathAbort, key, abort); status < 400 {
					t.Errorf("POST /internal/v1/abort of %s with %q: %d %s, want a refusal", rid, key, status, body)
				}
			}
			select {
			case how := <-ended:
				t.Fatalf("sk-one's stream ended while the API keys probed: %s", how)
			default:
			}
			if len(tc.extra) > 2 {
				return // the worker API takes the router's signatures only
			}
			if status, _, body := do(t, c, "POST", base+workerapi.PathAbort, "adm-key", abort); status != http.StatusOK {
				t.Fatalf("abort with the admin key: %d %s", status, body)
			}
			select {
			case how := <-ended:
				if how != "aborted_client" {
					t.Errorf("sk-one's stream, aborted by the admin: ended with %q, want aborted_client", how)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the admin's abort did not end the stream in 30 s")
			}
		})
	}
}

// TestHealthHidesWorkers: the router's open /health says how many workers
// it holds out and in which state, but names their internal URLs and dial
// errors to the admin key only (and /debug/workers, which names them, is
// the admin's).
func TestHealthHidesWorkers(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close() // nothing answers there: the worker is not ready
	r := start(t, "router", "router", "--port", "0", "--colocated", dead, "--health-interval", "100ms",
		"--api-key", "sk-one", "--admin-api-key", "adm-key")
	base := waitLine(t, r, routerRE)
	defer stop(t, r)
	c := http.DefaultClient
	host := strings.TrimPrefix(dead, "http://")

	type health struct {
		Status   string              `json:"status"`
		Reason   string              `json:"reason"`
		NotReady []map[string]string `json:"not_ready"`
	}
	var h health
	body := ""
	if last, ok := testbin.WaitUntil(30*time.Second, func() (bool, string) {
		var status int
		status, _, body = do(t, c, "GET", base+"/health", "adm-key", "")
		h = health{}
		_ = json.Unmarshal([]byte(body), &h)
		return status == http.StatusServiceUnavailable && len(h.NotReady) == 1, body
	}); !ok {
		t.Fatalf("/health with the admin key never listed the dead worker: %s", last)
	}
	if h.NotReady[0]["url"] != dead || h.NotReady[0]["reason"] == "" || !strings.Contains(body, host) {
		t.Errorf("/health with the admin key: %s, want the worker's URL and error", body)
	}
	for _, key := range []string{"", "sk-one", "sk-wrong"} {
		status, _, body := do(t, c, "GET", base+"/health", key, "")
		h = health{}
		if err := json.Unmarshal([]byte(body), &h); err != nil || status != http.StatusServiceUnavailable {
			t.Fatalf("/health with %q: %d %s", key, status, body)
		}
		if strings.Contains(body, host) || strings.Contains(body, "refused") || strings.Contains(body, "dial") {
			t.Errorf("/health with %q names the worker or its error: %s", key, body)
		}
		if len(h.NotReady) != 1 || h.NotReady[0]["state"] != "not_ready" || h.NotReady[0]["role"] != "colocated" || h.Status != "unavailable" {
			t.Errorf("/health with %q: %s, want one not_ready colocated worker, by state", key, body)
		}
		if status, _, body := do(t, c, "GET", base+"/debug/workers", key, ""); status != http.StatusUnauthorized {
			t.Errorf("/debug/workers with %q: %d %s, want 401", key, status, body)
		}
	}
}

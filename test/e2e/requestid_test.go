package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
)

// TestRequestIDEndToEnd: a client's X-Request-Id is the request's id at the
// router (/debug/requests/{id}) and on both workers, the answer's id is
// "cmpl-<id>" and its X-Request-Id header the same id; the answer's
// Server-Timing gives the router's share.
func TestRequestIDEndToEnd(t *testing.T) {
	t.Parallel()
	c := startPD(t, pdOptions{sim: sim.Config{DecodePerStep: 10 * time.Millisecond}})
	const id = "client-trace-7"
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, c.URL()+"/v1/completions",
			strings.NewReader(`{"prompt":"hello there","max_tokens":100,"ignore_eos":true}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(openai.HeaderRequestID, id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{resp: resp, body: string(b), err: err}
	}()
	waitFor(t, 5*time.Second, "the request live at the router and on decode under its id", func() (bool, string) {
		_, atRouter := c.Router.Router.Request(id)
		_, onDecode, _ := c.Decode[0].Worker.Request(id, time.Second)
		return atRouter && onDecode, fmt.Sprintf("router %v, decode %v", atRouter, onDecode)
	})
	resp, err := http.Get(c.URL() + "/debug/requests/" + id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"rid":"`+id+`"`) {
		t.Fatalf("/debug/requests/%s: %d %s", id, resp.StatusCode, b)
	}
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.resp.StatusCode != 200 || a.resp.Header.Get(openai.HeaderRequestID) != id || !strings.Contains(a.body, `"id":"cmpl-`+id+`"`) {
		t.Fatalf("%d %q: %s", a.resp.StatusCode, a.resp.Header.Get(openai.HeaderRequestID), a.body)
	}
	if st := a.resp.Header.Get("Server-Timing"); !strings.Contains(st, "pick;dur=") || !strings.Contains(st, "legs;dur=") {
		t.Fatalf("Server-Timing %q", st)
	}
}

package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model/sim"
)

// TestPriorityHonouredOrRefused: a request's priority is served by
// workers that schedule by it, and never silently ignored: a colocated
// worker that schedules first come, first served refuses it (400 naming
// it, as vLLM does), and a router whose workers all do answers 503
// no_worker saying which flag they lack; priority 0 is everyone's.
func TestPriorityHonouredOrRefused(t *testing.T) {
	t.Parallel()
	req := map[string]any{"prompt": "priority", "max_tokens": 2, "priority": 5}
	co := startServe(t, sim.Config{})
	status, body := postJSON(t, co.URL+"/v1/completions", req)
	if e := decodeCompletion(t, body).Error; status != http.StatusBadRequest || e == nil || !strings.Contains(string(body), `"param":"priority"`) ||
		e.Code != "unsupported_parameter" || !strings.Contains(e.Message, "--scheduling-policy priority") {
		t.Fatalf("colocated, fcfs: %d %s", status, body)
	}
	pd := startPD(t, pdOptions{})
	status, body = postJSON(t, pd.URL()+"/v1/completions", req)
	if e := decodeCompletion(t, body).Error; status != http.StatusServiceUnavailable || e == nil || e.Code != "no_worker" ||
		!strings.Contains(e.Message, "--scheduling-policy priority") {
		t.Fatalf("PD, fcfs: %d %s", status, body)
	}
	req["priority"] = 0
	if status, body := postJSON(t, pd.URL()+"/v1/completions", req); status != http.StatusOK {
		t.Fatalf("PD, priority 0: %d %s", status, body)
	}
	mc := testMachine()
	mc.PriorityScheduling = true
	prio := startPD(t, pdOptions{machine: &mc})
	req["priority"] = -7
	if status, body := postJSON(t, prio.URL()+"/v1/completions", req); status != http.StatusOK {
		t.Fatalf("PD, --scheduling-policy priority: %d %s", status, body)
	}
}

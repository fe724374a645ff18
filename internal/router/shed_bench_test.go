package router

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/workerapi"
)

// BenchmarkRefusal is the router's cost of a refusal through its whole
// front door (Handler, a recorded answer): a 429 shed because every decode
// worker is saturated, against a 400 for a body that does not parse, and
// a 429 for a well-formed request (the body is not read either way).
//
//	go test -run '^$' -bench BenchmarkRefusal -benchmem ./internal/router/
func BenchmarkRefusal(b *testing.B) {
	good := `{"prompt": [1, 2, 3], "max_tokens": 16, "stream": true}`
	for _, c := range []struct {
		name, body string
		saturated  bool
		status     int
	}{
		{"bad_body_400", `{"prompt": [1, 2,`, false, http.StatusBadRequest},
		{"shed_bad_body_429", `{"prompt": [1, 2,`, true, http.StatusTooManyRequests},
		{"shed_429", good, true, http.StatusTooManyRequests},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr := newTestRouter(b, 1, 1, 0, func(cfg *Config) {
				cfg.HealthInterval, cfg.LoadInterval, cfg.LoadStaleness = time.Hour, time.Hour, time.Hour
			})
			defer tr.r.Close()
			if c.saturated {
				d := tr.r.Fleet().Workers(workerapi.RoleDecode.String())[0]
				tr.r.state(d).observeLoad(workerapi.Load{Queued: 4}, tr.r.state(d).ownNow(), tr.r.clock.Now())
			}
			h := tr.r.Handler()
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(c.body)))
				if rec.Code != c.status {
					b.Fatalf("%d %s, want %d", rec.Code, rec.Body, c.status)
				}
			}
		})
	}
}

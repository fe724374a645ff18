package metrics

import (
	"strconv"

	"github.com/pdserve/pdserve/internal/outcome"
	"github.com/prometheus/client_golang/prometheus"
)

// Frontend counts the answers of an OpenAI front end (the router's, or a
// colocated worker's under `pdserve serve`), rejections included:
//
//   - pdserve_api_answers_total{role,endpoint,status_class,code} (counter):
//     answered requests by endpoint (completions, chat.completions, models,
//     other), status class (2xx, 4xx, 5xx; 499 when the client went away)
//     and error code ("none" on success; the OpenAI error code otherwise,
//     e.g. invalid_request, unsupported_parameter, context_length_exceeded,
//     or the outcome of a failed request; aborted_client for a client that
//     went away before its answer). A stream that failed after its
//     200 counts as 2xx with the code of its error event.
type Frontend struct {
	role    string
	answers *prometheus.CounterVec
}

// Codes whose series exist from the start, next to "none".
var frontendCodes = []string{"invalid_request", "unsupported_parameter", "context_length_exceeded",
	"model_not_found", "request_too_large", "unsupported_media_type", "not_found", "method_not_allowed"}

// NewFrontend registers a front end's collectors on reg; role is "router"
// or "colocated". It returns an error if one is already registered.
func NewFrontend(reg prometheus.Registerer, role string) (*Frontend, error) {
	f := &Frontend{role: role, answers: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_api_answers_total",
		Help: "Requests the OpenAI API answered, by endpoint, status class and error code (none on success).",
	}, []string{"role", "endpoint", "status_class", "code"})}
	for _, ep := range []string{"completions", "chat.completions"} {
		f.answers.WithLabelValues(role, ep, "2xx", "none")
		for _, c := range frontendCodes {
			f.answers.WithLabelValues(role, ep, "4xx", c)
		}
	}
	if err := reg.Register(f.answers); err != nil {
		return nil, err
	}
	return f, nil
}

// Answer counts one answer: it has the shape of openai.Config.OnAnswer.
func (f *Frontend) Answer(endpoint string, status int, code string) {
	switch {
	case code == "" && status == outcome.StatusClientClosedRequest:
		code = outcome.AbortedClient.String()
	case code == "":
		code = "none"
	}
	f.answers.WithLabelValues(f.role, endpoint, statusClass(status), code).Inc()
}

// statusClass is "2xx", "4xx", "5xx" (or "1xx", "3xx") for an HTTP status.
func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

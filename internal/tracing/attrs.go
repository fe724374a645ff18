package tracing

import "go.opentelemetry.io/otel/attribute"

// Span attributes the router's and the workers' spans share, so one
// request's spans across processes name the same thing the same way
// (docs/observability.md lists them). The GenAI semantic conventions'
// gen_ai.* names are used where one fits.
const (
	AttrRID       = attribute.Key("pdserve.rid")              // the request id (the client's X-Request-Id, or minted)
	AttrRoom      = attribute.Key("pdserve.room")             // the PD room, 32 hex digits
	AttrGen       = attribute.Key("pdserve.gen")              // the attempt's generation within its room
	AttrOutcome   = attribute.Key("pdserve.outcome")          // how the request or leg ended (internal/outcome)
	AttrContinued = attribute.Key("pdserve.continued_tokens") // output tokens an earlier attempt produced

	// The first failure behind a failed request: its outcome, the side
	// ("prefill", "decode", "colocated", "router") and the stage there.
	AttrCauseOutcome = attribute.Key("pdserve.cause.outcome")
	AttrCauseRole    = attribute.Key("pdserve.cause.role")
	AttrCauseStage   = attribute.Key("pdserve.cause.stage")

	AttrModel        = attribute.Key("gen_ai.request.model")
	AttrInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
)

// Package npmclient drives a PD pair (router, prefill and decode workers,
// in-process) with the official openai npm client under Node.js: client.mjs
// sends completions and chat requests with n, logprobs, top_logprobs and
// echo, streamed and not; tools.mjs makes a tool round trip (a required
// call, streamed too, a named strict function read by parse, and the
// answer to the call's result); structured.mjs uses the structured-output
// helpers (zodResponseFormat with chat.completions.parse and .stream, and
// a schema the server refuses); the tests judge what the client parsed.
//
// It needs node on PATH and the client and zod installed next to this file
// (npm install --no-save --prefix test/npmclient); without them it skips,
// unless PDSERVE_REQUIRE_NPM is set (.ci/run sets it after installing).
package npmclient

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

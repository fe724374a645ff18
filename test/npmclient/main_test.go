// Package npmclient drives a PD pair (router, prefill and decode workers,
// in-process) with the official openai npm client under Node.js: client.mjs
// sends completions and chat requests with n, logprobs, top_logprobs and
// echo, streamed and not, and the test judges what the client parsed.
//
// It needs node on PATH and the client installed next to this file
// (npm install --no-save --prefix test/npmclient); without them it skips,
// unless PDSERVE_REQUIRE_NPM is set (.ci/run sets it after installing).
package npmclient

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

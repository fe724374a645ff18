package workerapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
	"github.com/pdserve/pdserve/internal/outcome"
)

// failures lists every outcome a leg can fail with.
func failures() []outcome.Outcome {
	var out []outcome.Outcome
	for _, o := range outcome.All() {
		if o != outcome.OK {
			out = append(out, o)
		}
	}
	return out
}

// TestErrorAnswerRoundTrip: for every outcome, the worker's error answer
// keeps OpenAI's shape with code = the outcome's name, carries the outcome
// and the cause as values, and decodes back to the same error.
func TestErrorAnswerRoundTrip(t *testing.T) {
	for _, o := range failures() {
		t.Run(o.String(), func(t *testing.T) {
			cause := outcome.Cause{Outcome: o, Role: "decode", Stage: "awaiting_kv", Detail: "why"}
			if o.PeerCaused() {
				cause = outcome.Cause{Outcome: outcome.FailedTransfer, Role: "decode", Stage: "awaiting_kv", Detail: "checksum"}
			}
			want := OutcomeError(o, "why", cause)
			if want.Status != o.Status() || want.Code != o.String() || want.Message != o.String()+": why" {
				t.Fatalf("OutcomeError: %+v", want)
			}
			if o.ClientError() != (want.Type == openai.TypeInvalidRequest) {
				t.Fatalf("type %s for status %d", want.Type, want.Status)
			}
			rec := httptest.NewRecorder()
			WriteError(rec, fmt.Errorf("wrapped: %w", want))
			if rec.Code != o.Status() {
				t.Fatalf("status %d, want %d", rec.Code, o.Status())
			}
			// A busy or leaving worker says when to come back.
			wantRA := ""
			switch o {
			case outcome.Draining, outcome.Overloaded:
				wantRA = "1"
			}
			if ra := rec.Header().Get("Retry-After"); ra != wantRA {
				t.Errorf("Retry-After %q, want %q", ra, wantRA)
			}
			var shape struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &shape); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"message", "type", "param", "code", "outcome", "cause"} {
				if _, ok := shape.Error[k]; !ok {
					t.Errorf("body has no error.%s: %s", k, rec.Body)
				}
			}
			if shape.Error["code"] != o.String() || shape.Error["outcome"] != o.String() || shape.Error["param"] != nil {
				t.Errorf("body %s", rec.Body)
			}
			got := DecodeError(rec.Code, rec.Body.Bytes())
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
			// The front end answers a client with the OpenAI part as is.
			oe := openai.ToError(got)
			if oe.Status != want.Status || oe.Code != want.Code || oe.Message != want.Message || oe.Type != want.Type {
				t.Errorf("openai.ToError: %+v", oe)
			}
		})
	}
}

// TestStreamLineDecode: the one decoder turns token lines into chunks, the
// finish line into the finish reason, and an error line (for every
// outcome, with the tokens that came before it) into the typed error.
// roundTrip encodes l as a worker writes it and reads it back as a router
// does.
func roundTrip(t *testing.T, l StreamLine) StreamLine {
	t.Helper()
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseStreamLine(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStreamLineDecode(t *testing.T) {
	tokens := StreamLine{TokenIDs: []int32{7, 8}, Logprobs: []float32{-0.5, -1}}
	wantToks := []openai.Token{{ID: 7, Logprob: -0.5}, {ID: 8, Logprob: -1}}
	l := roundTrip(t, tokens)
	c, e := l.Decode()
	if e != nil || c.FinishReason != "" || !cmp.Equal(c.Tokens, wantToks) {
		t.Fatalf("token line: %+v %v", c, e)
	}
	fin := tokens
	fin.FinishReason, fin.PromptTokens, fin.OutputTokens = "length", 3, 2
	l = roundTrip(t, fin)
	if c, e = l.Decode(); e != nil || c.FinishReason != "length" || !cmp.Equal(c.Tokens, wantToks) {
		t.Fatalf("finish line: %+v %v", c, e)
	}
	short := StreamLine{TokenIDs: []int32{1, 2}, Logprobs: []float32{-2}}
	if c, _ = short.Decode(); !cmp.Equal(c.Tokens[1], openai.Token{ID: 2}) {
		t.Fatalf("a missing logprob: %+v", c.Tokens)
	}
	for _, o := range failures() {
		want := OutcomeError(o, "why", outcome.Cause{Outcome: o, Role: "prefill", Detail: "why"})
		l := roundTrip(t, ErrorLine(tokens, want))
		c, got := l.Decode()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: decoded (-want +got):\n%s", o, diff)
		}
		if c.FinishReason != "" || !cmp.Equal(c.Tokens, wantToks) {
			t.Errorf("%s: the tokens before the error: %+v", o, c)
		}
	}
}

// TestAnswerWithoutOutcome: an answer that is no worker error (the worker's
// 400 for a malformed body, a proxy's HTML page, an outcome this version
// does not know) keeps what it says and gets an outcome by its status.
func TestAnswerWithoutOutcome(t *testing.T) {
	cases := []struct {
		name   string
		status int
		body   string
		want   *Error
	}{
		{"openai 400", 400, `{"error":{"message":"invalid JSON body","type":"invalid_request_error","param":null,"code":null}}`,
			&Error{Status: 400, Type: openai.TypeInvalidRequest, Message: "invalid JSON body", Outcome: outcome.RejectedInvalid}},
		{"not json", 502, `<html>bad gateway</html>`,
			&Error{Status: 502, Type: openai.TypeServer, Message: "<html>bad gateway</html>", Outcome: outcome.FailedInternal}},
		{"unknown outcome", 502, `{"error":{"message":"m","type":"server_error","code":"brand_new","outcome":"brand_new"}}`,
			&Error{Status: 502, Type: openai.TypeServer, Message: "m", Code: "brand_new", Outcome: outcome.FailedInternal}},
	}
	for _, c := range cases {
		if diff := cmp.Diff(c.want, DecodeError(c.status, []byte(c.body))); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
	bad := StreamLine{Error: &ErrorObject{ErrorObject: openai.ErrorObject{Message: "boom"}}}
	if _, e := bad.Decode(); e.Status != 500 || e.Outcome != outcome.FailedInternal || e.Type != openai.TypeServer {
		t.Errorf("an error line without status or outcome: %+v", e)
	}
}

// TestRoot: an aborted_peer echo with a known cause answers with the root
// cause's status, code and message; without one it answers as itself.
func TestRoot(t *testing.T) {
	cause := outcome.Cause{Outcome: outcome.RejectedInvalid, Role: "prefill", Stage: "waiting", Detail: "prompt too long"}
	echo := OutcomeError(outcome.AbortedPeer, "peer aborted: "+cause.String(), cause)
	root := echo.Root()
	want := OutcomeError(outcome.RejectedInvalid, "prompt too long", cause)
	if diff := cmp.Diff(want, root); diff != "" {
		t.Fatalf("root (-want +got):\n%s", diff)
	}
	if root.Status != http.StatusBadRequest {
		t.Fatalf("status %d", root.Status)
	}
	unknown := OutcomeError(outcome.AbortedPeer, "peer aborted", outcome.Cause{Outcome: outcome.AbortedPeer})
	if unknown.Root() != unknown {
		t.Fatal("an echo without a known cause is its own root")
	}
	if c := unknown.FirstCause(RoleDecode); c.Known() {
		t.Fatalf("FirstCause of an unknown echo: %+v", c)
	}
	lost := NewError(outcome.PeerLost, "conn reset", outcome.Cause{})
	if c := lost.FirstCause(RoleDecode); c != (outcome.Cause{Outcome: outcome.PeerLost, Role: "decode", Detail: "conn reset"}) {
		t.Fatalf("FirstCause of a bare failure: %+v", c)
	}
	if c := echo.FirstCause(RoleDecode); c != cause {
		t.Fatalf("FirstCause of a known echo: %+v", c)
	}
}

// TestGenerateBodyWire: the sampling parameters travel whole under their
// OpenAI names, and an absent or zero top_p means 1 once decoded.
func TestGenerateBodyWire(t *testing.T) {
	b := GenerateBody{RID: "r", Room: strings.Repeat("ab", 16), Gen: 2, InputIDs: []int32{1, 2}, MaxTokens: 3,
		SamplingParams: model.SamplingParams{Temperature: 0.7, TopP: 0.9, TopK: 5, Seed: 11},
		StopTokenIDs:   []int32{9}, IgnoreEOS: true, PrefillKVAddr: "h:1", Buffered: true}
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"rid", "room", "gen", "input_ids", "max_tokens", "temperature", "top_p", "top_k", "seed",
		"stop_token_ids", "ignore_eos", "prefill_kv_addr", "buffered"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("no %q in %s", k, raw)
		}
	}
	var got GenerateBody
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(b, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	for _, body := range []string{`{"rid":"r","input_ids":[1],"max_tokens":1}`, `{"rid":"r","input_ids":[1],"max_tokens":1,"top_p":0}`} {
		var g GenerateBody
		if err := json.Unmarshal([]byte(body), &g); err != nil || g.TopP != 1 {
			t.Errorf("%s: top_p %v, err %v", body, g.TopP, err)
		}
	}
	if err := json.Unmarshal([]byte(`{"rid":5}`), &got); err == nil {
		t.Error("a bad body decoded")
	}
}

// TestAbortBody: the reason crosses as its name ("" is client), an unknown
// one is refused, and the cause rides along.
func TestAbortBody(t *testing.T) {
	for _, r := range []AbortReason{AbortClient, AbortStop, AbortPeer} {
		b := AbortBody{RID: "x", Reason: r, Cause: outcome.Cause{Outcome: outcome.PeerLost, Role: "prefill"}}
		raw, _ := json.Marshal(b)
		var got AbortBody
		if err := json.Unmarshal(raw, &got); err != nil || got != b {
			t.Errorf("%s: %s -> %+v %v", r, raw, got, err)
		}
	}
	var got AbortBody
	if err := json.Unmarshal([]byte(`{"rid":"x"}`), &got); err != nil || got.Reason != AbortClient {
		t.Errorf("absent reason: %+v %v", got, err)
	}
	err := json.Unmarshal([]byte(`{"rid":"x","reason":"bored"}`), &got)
	if err == nil || !strings.Contains(err.Error(), "reason must be client, stop or peer") {
		t.Errorf("unknown reason: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"rid":"x","reason":"peer","cause":{"outcome":"nonsense"}}`), &got); err == nil {
		t.Error("an unknown cause outcome decoded")
	}
	long := strings.Repeat("x", MaxDetailBytes+1)
	for _, b := range []AbortBody{{RID: strings.Repeat("r", MaxRIDBytes+1)}, {RID: "r", Detail: long},
		{RID: "r", Cause: outcome.Cause{Detail: long}}} {
		if b.Check() == nil {
			t.Errorf("Check passed %d/%d/%d bytes", len(b.RID), len(b.Detail), len(b.Cause.Detail))
		}
	}
	if (&AbortBody{RID: "r", Detail: "ok"}).Check() != nil {
		t.Error("Check refused a small body")
	}
}

// TestRoleText: roles cross the wire by name; an unknown name is an error.
func TestRoleText(t *testing.T) {
	for _, r := range Roles() {
		b, err := r.MarshalText()
		var got Role
		if err != nil || got.UnmarshalText(b) != nil || got != r {
			t.Errorf("%s: %s %v -> %s", r, b, err, got)
		}
	}
	var got Role
	if err := json.Unmarshal([]byte(`{"role":"router"}`), &struct{ Role *Role }{&got}); err == nil {
		t.Error("unknown role decoded")
	}
	if _, err := RoleNone.MarshalText(); err == nil {
		t.Error("RoleNone marshalled")
	}
}

// FuzzParseStreamLine: the fast reader of token lines gives exactly what
// json.Unmarshal gives, error or not, for any line.
func FuzzParseStreamLine(f *testing.F) {
	for _, s := range []string{`{"token_ids":[10,11],"logprobs":[-1.5,-0.25]}`, `{"token_ids":[1],"logprobs":[0]}`,
		`{"token_ids":[01],"logprobs":[1]}`, `{"token_ids":[1],"logprobs":[+1]}`, `{"token_ids":[1],"logprobs":[1e39]}`,
		`{"token_ids":[1],"logprobs":[0x1p-2]}`, `{"token_ids":[3000000000],"logprobs":[1]}`, `{"token_ids":[1,2],"logprobs":[1]}`,
		`{"token_ids":[1],"logprobs":[-1.2e-3]}`, `{"token_ids":[12],"logprobs":[-0.1],"finish_reason":"length"}`,
		`{"token_ids":[1.0],"logprobs":[1]}`, `{"token_ids":[98,117],"logprobs":[-1.8,-2.04],"finish_reason":"length","prompt_tokens":3,"completion_tokens":4}`,
		`{"token_ids":[98],"logprobs":[-1.8],"prompt_tokens":3}`,
		`{"token_ids":[98],"logprobs":[-1.8],"finish_reason":"stop","prompt_tokens":40,"completion_tokens":1,"cached_tokens":32}`,
		`{"token_ids":[98],"logprobs":[-1.8],"cached_tokens":-1}`, `{"token_ids":[98],"logprobs":[-1.8],"finish_reason":"le\u006egth"}`,
		`{"token_ids":[98],"logprobs":[-1.8],"completion_tokens":-0}`, `{"token_ids":[98],"logprobs":[-1.8],"completion_tokens":99999999999999999999}`, `{"token_ids":[],"logprobs":[]}`, `{"token_ids":[1],"logprobs":[NaN]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := ParseStreamLine(b)
		var want StreamLine
		werr := json.Unmarshal(b, &want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", b, gerr, werr)
		}
		if werr == nil && !cmp.Equal(got, want) {
			t.Fatalf("%q: %+v, json.Unmarshal gives %+v", b, got, want)
		}
	})
}

// TestChoiceLines: lines of a request with n > 1 decode to chunks of their
// choice; a choice's end with More set does not end the stream, the line
// without it does; top logprobs and prompt logprobs come through.
func TestChoiceLines(t *testing.T) {
	top := [][]model.TokenLogprob{{{ID: 4, Logprob: -0.5}, {ID: 9, Logprob: -2}}}
	prompt := []model.PositionLogprobs{{}, {Token: model.TokenLogprob{ID: 3, Logprob: -1}, Rank: 2}}
	for _, tc := range []struct {
		line      StreamLine
		index     int
		finish    string
		done      bool
		wantTop   bool
		wantScore bool
	}{
		{StreamLine{TokenIDs: []int32{4}, Logprobs: []float32{-0.5}, Index: 2, TopLogprobs: top}, 2, "", false, true, false},
		{StreamLine{Index: 1, FinishReason: "stop", More: true}, 1, "stop", false, false, false},
		{StreamLine{Index: 1, FinishReason: "length", OutputTokens: 9}, 1, "length", true, false, false},
		{StreamLine{PromptLogprobs: prompt}, 0, "", false, false, true},
	} {
		l := roundTrip(t, tc.line)
		c, e := l.Decode()
		if e != nil || c.Index != tc.index || c.FinishReason != tc.finish || c.Done != tc.done {
			t.Fatalf("%+v decodes to %+v (%v)", tc.line, c, e)
		}
		if tc.wantTop && !cmp.Equal(c.Tokens[0].Top, top[0]) {
			t.Fatalf("top logprobs %+v", c.Tokens)
		}
		if tc.wantScore && !cmp.Equal(c.PromptLogprobs, prompt) {
			t.Fatalf("prompt logprobs %+v", c.PromptLogprobs)
		}
	}
	// An error line of a choice ends the stream with the error only.
	bad := ErrorLine(StreamLine{Index: 1, FinishReason: "stop", More: true}, NewError(outcome.PeerLost, "gone", outcome.Cause{}))
	bl := roundTrip(t, bad)
	if c, e := bl.Decode(); e == nil || c.Done || c.FinishReason != "" {
		t.Fatalf("error line decodes to %+v, %v", c, e)
	}
}

package npmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// requireZod fails or skips the test, as nodeAndClient does, when zod (the
// peer dependency of the openai client's helpers/zod) is not installed at
// the version package.json pins.
func requireZod(t *testing.T) {
	t.Helper()
	const fix = "run `npm install --no-save --prefix test/npmclient`"
	if !installedAsPinned(t, "zod", "npm install --no-save --prefix test/npmclient") {
		if os.Getenv(requireNPMEnv) != "" {
			t.Fatalf("test/npmclient/node_modules/zod not installed and %s is set: %s", requireNPMEnv, fix)
		}
		t.Skipf("test/npmclient/node_modules/zod not installed: %s (.ci/run does) to run the zod helpers' test", fix)
	}
}

// event is the zod type structured.mjs declares, as Go reads it; unknown
// fields are an error when decoding (the schema forbids them). Numbers are
// float64, as JavaScript reads them: 7.0 is the integer 7 there (and in
// JSON Schema from draft 6 on), and zod's int() in the script judges it.
type event struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Day    float64  `json:"day"`
	Hours  float64  `json:"hours"`
	Remote bool     `json:"remote"`
	Tags   []string `json:"tags"`
}

// structuredOutput is what structured.mjs prints.
type structuredOutput struct {
	Model  string          `json:"model"`
	Schema json.RawMessage `json:"schema"`
	Parse  struct {
		FinishReason string          `json:"finish_reason"`
		Content      string          `json:"content"`
		Parsed       json.RawMessage `json:"parsed"`
		ParsedType   string          `json:"parsed_type"`
		Refusal      *string         `json:"refusal"`
		ZodError     *string         `json:"zod_error"`
	} `json:"parse"`
	Stream struct {
		Deltas   int `json:"deltas"`
		Partials int `json:"partials"`
		Done     *struct {
			Content string          `json:"content"`
			Parsed  json.RawMessage `json:"parsed"`
		} `json:"done"`
		FinishReason string          `json:"finish_reason"`
		Content      string          `json:"content"`
		Parsed       json.RawMessage `json:"parsed"`
		ZodError     *string         `json:"zod_error"`
	} `json:"stream"`
	RefusedSchema json.RawMessage `json:"refused_schema"`
	Refusal       *struct {
		Class        string `json:"class"`
		IsBadRequest bool   `json:"is_bad_request"`
		Status       int    `json:"status"`
		Param        string `json:"param"`
		Code         string `json:"code"`
		Message      string `json:"message"`
	} `json:"refusal"`
}

// strictEvent decodes raw into an event, refusing unknown fields and
// trailing data.
func strictEvent(raw []byte) (event, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	var e event
	if err := d.Decode(&e); err != nil {
		return e, err
	}
	if d.More() {
		return e, errors.New("data after the object")
	}
	return e, nil
}

// TestOpenAINPMStructured runs structured.mjs (the openai npm client's
// zodResponseFormat with chat.completions.parse and chat.completions.stream)
// against a PD pair of the simulated model and checks that the answer
// finished (stop), that its content validates against the schema the
// client sent (judged by a JSON Schema validator here, and by zod in the
// script), that message.parsed is that content as an object, that the
// streamed parse gives the same answer (same seed) with partial parses on
// the way, and that a schema the engine cannot apply makes the client raise
// BadRequestError (400) naming the field and the feature.
func TestOpenAINPMStructured(t *testing.T) {
	node := nodeAndClient(t)
	requireZod(t)
	c := startPD(t)

	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "structured.mjs", c.URL()+"/v1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node structured.mjs %s: %v after %s (deadline %s)\nstderr:\n%s\nstdout:\n%s", c.URL()+"/v1", err,
			time.Since(start).Round(time.Millisecond), clientDeadline, stderr.String(), stdout.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("node stderr:\n%s", s)
	}
	var out structuredOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("structured.mjs output is not the expected JSON: %v\n%s", err, stdout.String())
	}

	var doc any
	if err := json.Unmarshal(out.Schema, &doc); err != nil {
		t.Fatalf("schema: %v", err)
	}
	comp := jsonschema.NewCompiler()
	comp.AssertFormat()
	if err := comp.AddResource("mem://event.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("mem://event.json")
	if err != nil {
		t.Fatalf("the schema zodResponseFormat sent does not compile: %v\n%s", err, out.Schema)
	}
	validate := func(where, content string) {
		t.Helper()
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(content))
		if err != nil {
			t.Errorf("%s: content %q is not JSON: %v", where, content, err)
			return
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s: content %q is not valid against the schema: %v", where, content, err)
		}
		if _, err := strictEvent([]byte(content)); err != nil {
			t.Errorf("%s: content %q does not decode as the event type: %v", where, content, err)
		}
	}
	// parsedIs checks that parsed is the object content spells.
	parsedIs := func(where string, parsed json.RawMessage, content string) {
		t.Helper()
		got, err := strictEvent(parsed)
		if err != nil {
			t.Errorf("%s: parsed %s is not the event type: %v", where, parsed, err)
			return
		}
		want, err := strictEvent([]byte(content))
		if err != nil {
			return // reported by validate
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: parsed differs from the content (-content +parsed):\n%s", where, d)
		}
	}

	t.Run("parse", func(t *testing.T) {
		p := out.Parse
		if p.FinishReason != "stop" {
			t.Errorf("finish_reason %q, want stop (the schema bounds every field)", p.FinishReason)
		}
		validate("parse", p.Content)
		if p.ParsedType != "object" {
			t.Errorf("message.parsed is a %s, want an object", p.ParsedType)
		}
		parsedIs("parse", p.Parsed, p.Content)
		if p.ZodError != nil {
			t.Errorf("zod rejects message.parsed: %s", *p.ZodError)
		}
		if p.Refusal != nil {
			t.Errorf("message.refusal %q, want null", *p.Refusal)
		}
	})
	t.Run("stream", func(t *testing.T) {
		s := out.Stream
		if s.FinishReason != "stop" {
			t.Errorf("finish_reason %q, want stop", s.FinishReason)
		}
		validate("stream", s.Content)
		parsedIs("stream", s.Parsed, s.Content)
		if s.ZodError != nil {
			t.Errorf("zod rejects the streamed message.parsed: %s", *s.ZodError)
		}
		if s.Content != out.Parse.Content {
			t.Errorf("streamed content %q, non-streamed %q (same seed)", s.Content, out.Parse.Content)
		}
		if s.Done == nil {
			t.Errorf("no content.done event")
		} else {
			if s.Done.Content != s.Content {
				t.Errorf("content.done has %q, the final message %q", s.Done.Content, s.Content)
			}
			parsedIs("content.done", s.Done.Parsed, s.Content)
		}
		// Every content.delta carries a partial parse: the object begins
		// at the first byte.
		if s.Deltas < 1 || s.Partials != s.Deltas {
			t.Errorf("%d content.delta events, %d with a partial parse, for %d bytes of content", s.Deltas, s.Partials, len(s.Content))
		}
	})
	t.Run("refusal", func(t *testing.T) {
		r := out.Refusal
		if r == nil {
			t.Fatalf("the schema %s was not refused", out.RefusedSchema)
		}
		if r.Class != "BadRequestError" || !r.IsBadRequest || r.Status != 400 {
			t.Errorf("the client raised %s (BadRequestError: %v), status %d; want BadRequestError, 400", r.Class, r.IsBadRequest, r.Status)
		}
		if r.Param != "response_format.json_schema.schema" || r.Code != "unsupported_parameter" {
			t.Errorf("param %q code %q, want response_format.json_schema.schema and unsupported_parameter", r.Param, r.Code)
		}
		for _, want := range []string{"pattern", "#/properties/code/pattern", "lookbehind"} {
			if !strings.Contains(r.Message, want) {
				t.Errorf("message %q does not name %q", r.Message, want)
			}
		}
	})
}

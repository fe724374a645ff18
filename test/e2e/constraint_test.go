package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pdserve/pdserve/internal/cluster"
	"github.com/pdserve/pdserve/internal/model/sim"
	"github.com/pdserve/pdserve/internal/openai"
)

// This file drives structured outputs (issue 26) over HTTP on the
// simulated model: choice, regex, JSON Schema and JSON object constraints
// in the dialects a client brings (response_format, structured_outputs,
// guided_*), through a router in front of a prefill/decode pair and
// through a colocated worker. The two answer the same bytes, and every
// choice that finished with "stop" is valid: one of the choices, a match
// of the regex, JSON its schema accepts (checked by a JSON Schema
// validator, santhosh-tekuri/jsonschema).

// constraintCase is one constraint and how to state it and check it.
type constraintCase struct {
	kind string
	// field and value state it in a request (value may depend on the
	// endpoint: chat takes response_format json_schema).
	state func(chat bool, body map[string]any)
	// valid checks a finished output.
	valid func(text string) error
}

var choiceWords = []string{"red", "green", "blue", "dark olive green", "x"}

// regexes are in the common subset of the ECMA-262 pattern dialect and Go's
// RE2, so the test checks them with regexp.
var regexes = []string{
	`[a-z]{2,8}@[a-z]{2,6}\.(com|org|net)`,
	`(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?`,
	`[A-Z][a-z]+( [A-Z][a-z]+){0,2}`,
	`(yes|no|maybe), [a-z ]{0,12}\.`,
}

// schemas are JSON Schemas the simulated model finishes (bounded strings
// and lists, properties closed): objects, enums, formats, anyOf, a
// recursive $ref.
var schemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},"ok":{"type":"boolean"}},"required":["name","age","ok"],"additionalProperties":false}`,
	`{"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,"maxItems":4}`,
	`{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]{1,6}$"},"maxItems":3}},"required":["id"],"additionalProperties":false}`,
	`{"anyOf":[{"type":"integer","minimum":-50,"maximum":50},{"type":"null"},{"const":"none"}]}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"when":{"type":"string","format":"date"},"score":{"type":"number"},"note":{"type":["string","null"],"maxLength":8}},"required":["when","score","note"],"additionalProperties":false}`,
}

// constraintCases are the cases of a kind ("choice", "regex", "json_schema",
// "json_object").
func constraintCases(t *testing.T, kind string) []constraintCase {
	t.Helper()
	var out []constraintCase
	switch kind {
	case "choice":
		for i := range 2 {
			words := slices.Clone(choiceWords[i:])
			out = append(out, constraintCase{kind: kind,
				state: func(chat bool, b map[string]any) {
					if chat {
						b["structured_outputs"] = map[string]any{"choice": words}
					} else {
						b["guided_choice"] = words
					}
				},
				valid: func(s string) error {
					if !slices.Contains(words, s) {
						return fmt.Errorf("%q is not one of %q", s, words)
					}
					return nil
				}})
		}
	case "regex":
		for _, re := range regexes {
			anchored := regexp.MustCompile(`^(?:` + re + `)$`)
			out = append(out, constraintCase{kind: kind,
				state: func(chat bool, b map[string]any) {
					if chat {
						b["guided_regex"] = re
					} else {
						b["structured_outputs"] = map[string]any{"regex": re}
					}
				},
				valid: func(s string) error {
					if !anchored.MatchString(s) {
						return fmt.Errorf("%q does not match %s", s, re)
					}
					return nil
				}})
		}
	case "json_schema":
		for i, src := range schemas {
			var doc any
			if err := json.Unmarshal([]byte(src), &doc); err != nil {
				t.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			c.AssertFormat()
			url := fmt.Sprintf("mem://schema%d.json", i)
			if err := c.AddResource(url, doc); err != nil {
				t.Fatal(err)
			}
			sch, err := c.Compile(url)
			if err != nil {
				t.Fatalf("schema %d: %v", i, err)
			}
			out = append(out, constraintCase{kind: kind,
				state: func(chat bool, b map[string]any) {
					if chat {
						b["response_format"] = map[string]any{"type": "json_schema",
							"json_schema": map[string]any{"name": fmt.Sprintf("s%d", i), "schema": doc, "strict": true}}
					} else {
						b["structured_outputs"] = map[string]any{"json": doc}
					}
				},
				valid: func(s string) error {
					v, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
					if err != nil {
						return fmt.Errorf("%q is not JSON: %v", s, err)
					}
					if err := sch.Validate(v); err != nil {
						return fmt.Errorf("%q is not valid against schema %d: %v", s, i, err)
					}
					return nil
				}})
		}
	case "json_object":
		out = append(out, constraintCase{kind: kind,
			state: func(_ bool, b map[string]any) { b["response_format"] = map[string]any{"type": "json_object"} },
			valid: func(s string) error {
				// Numbers as written: JSON has no bound on them (1E400 is
				// valid), float64 has.
				d := json.NewDecoder(strings.NewReader(s))
				d.UseNumber()
				var v map[string]any
				if err := d.Decode(&v); err != nil || d.More() {
					return fmt.Errorf("%q is not a JSON object: %v", s, err)
				}
				return nil
			}})
	default:
		t.Fatalf("no kind %q", kind)
	}
	return out
}

// randomConstrained is a request on either endpoint under c, streamed or
// not, greedy or seeded, n 1…3, sometimes with min_tokens beyond what the
// grammar may need or ignore_eos (the grammar's end still ends it).
func randomConstrained(rng *rand.Rand, c constraintCase) samplingReq {
	chat := rng.IntN(2) == 0
	body := map[string]any{"max_tokens": 400, "return_token_ids": true}
	prompt := randText(rng, 5+rng.IntN(60))
	if chat {
		body["messages"] = []map[string]any{{"role": "user", "content": prompt}}
	} else {
		body["prompt"] = prompt
	}
	if rng.IntN(3) == 0 {
		body["stream"] = true
	}
	if rng.IntN(4) != 0 {
		body["temperature"] = []float64{0.7, 1, 1.3}[rng.IntN(3)]
		body["seed"] = rng.IntN(1000)
		if rng.IntN(2) == 0 {
			body["n"] = 2 + rng.IntN(2)
		}
	} else {
		body["temperature"] = 0
	}
	switch rng.IntN(6) {
	case 0:
		body["min_tokens"] = 1 + rng.IntN(30)
	case 1:
		body["ignore_eos"] = true
	}
	c.state(chat, body)
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	return samplingReq{path, body}
}

// answerOf is the choices of an answer, streamed or not.
func answerOf(t *testing.T, r samplingReq, body []byte) answerSum {
	t.Helper()
	if r.stream() {
		return summarizeStream(t, body)
	}
	return summarizeResponse(t, body)
}

// TestConstrainedPDEqualsColocated: constrained requests of every kind get
// the same answer byte for byte from a router over a prefill/decode pair
// (prefill draws the first token under the grammar, decode the rest) as
// from a colocated worker, with the prefix cache on (cold and warm) and
// off; every choice that ends with "stop" is valid, and most do.
func TestConstrainedPDEqualsColocated(t *testing.T) {
	t.Parallel()
	for _, cache := range []bool{true, false} {
		name := "cache"
		if !cache {
			name = "nocache"
		}
		t.Run(name, func(t *testing.T) {
			mc := testMachine()
			mc.PrefixCache = cache
			pd := startPD(t, pdOptions{machine: &mc})
			co := startServeWith(t, sim.Config{}, func(o *cluster.WorkerOptions) { o.Machine.PrefixCache = cache })
			for ki, kind := range []string{"choice", "regex", "json_schema", "json_object"} {
				t.Run(kind, func(t *testing.T) { checkConstrained(t, pd.URL(), co.URL, kind, ki, cache) })
			}
		})
	}
}

// TestConstrainedAnyOrderPDEqualsColocated: with --json-any-property-order
// on both, the JSON constraints (their Spec's AnyPropertyOrder travels in
// both legs) give PD the colocated worker's answers, all valid.
func TestConstrainedAnyOrderPDEqualsColocated(t *testing.T) {
	t.Parallel()
	mc := testMachine()
	pd := startPD(t, pdOptions{machine: &mc, api: openai.APIOptions{AnyPropertyOrder: true}})
	co := startServeWith(t, sim.Config{}, func(o *cluster.WorkerOptions) { o.API.AnyPropertyOrder = true })
	for ki, kind := range []string{"json_schema", "json_object"} {
		t.Run(kind, func(t *testing.T) { checkConstrained(t, pd.URL(), co.URL, kind, ki, true) })
	}
}

// checkConstrained sends random requests under kind's constraints to PD and
// to the colocated server: the answers must be equal (exchange checks) and
// every finished one valid; with the cache, some requests go twice and the
// warm answer must equal the cold one.
func checkConstrained(t *testing.T, pdURL, coURL, kind string, ki int, cache bool) {
	rng := rand.New(rand.NewPCG(26, uint64(ki)))
	cases := constraintCases(t, kind)
	stops, total := 0, 0
	for i := range max(12, 3*len(cases)) {
		c := cases[i%len(cases)]
		r := randomConstrained(rng, c)
		what := fmt.Sprintf("%s request %d", kind, i)
		body := exchange(t, what, pdURL, coURL, r)
		if cache && i%3 == 0 {
			again := exchange(t, what+" again", pdURL, coURL, r)
			if !r.stream() && !bytes.Equal(normalize(body), normalize(again)) {
				t.Fatalf("%s %v: the warm answer differs\ncold: %s\nwarm: %s", what, r.body, body, again)
			}
		}
		for ci, ch := range answerOf(t, r, body).Choices {
			total++
			switch ch.Finish {
			case "stop":
				stops++
				if err := c.valid(ch.Text); err != nil {
					t.Fatalf("%s %v choice %d: %v", what, r.body, ci, err)
				}
				if testing.Verbose() && i < 4 {
					t.Logf("%s choice %d: %s", what, ci, ch.Text)
				}
			case "length":
			default:
				t.Fatalf("%s choice %d: finish reason %q", what, ci, ch.Finish)
			}
		}
	}
	if stops*10 < total*7 {
		t.Fatalf("%d of %d choices stopped; want most (the rest ran into max_tokens)", stops, total)
	}
	t.Logf("%d of %d choices stopped, all valid", stops, total)
}

// TestConstrainedPreempted: concurrent constrained requests of every kind
// in a decode pool small enough that decode preempts (and recomputes) some
// of them give the colocated worker's answers; the matcher survives the
// preemption (it follows the tokens, not the KV).
func TestConstrainedPreempted(t *testing.T) {
	t.Parallel()
	pageBytes := int64(testGeometry.BytesPerToken() * 16)
	pd := startPD(t, pdOptions{memory: 56 * pageBytes, router: noAdmission()})
	co := startServe(t, sim.Config{})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	rng := rand.New(rand.NewPCG(26, 99))
	var cases []constraintCase
	for _, kind := range []string{"choice", "regex", "json_schema", "json_object"} {
		cases = append(cases, constraintCases(t, kind)...)
	}
	const n = 24
	reqs := make([]samplingReq, n)
	of := make([]constraintCase, n)
	for i := range reqs {
		c := cases[rng.IntN(len(cases))]
		r := randomConstrained(rng, c)
		r.body["max_tokens"] = 60 + rng.IntN(60)
		reqs[i], of[i] = r, c
	}
	for i, res := range sendBoth(t, pd.URL(), co.URL, reqs) {
		r := res.r
		a, b := answerOf(t, r, res.bp), answerOf(t, r, res.bc)
		if d := cmp.Diff(b, a, sumsEqual); d != "" {
			t.Fatalf("request %d %s %v: PD differs from colocated (-colocated +PD):\n%s", i, r.path, r.body, d)
		}
		for ci, ch := range a.Choices {
			if ch.Finish == "stop" {
				if err := of[i].valid(ch.Text); err != nil {
					t.Fatalf("request %d %v choice %d: %v", i, r.body, ci, err)
				}
			}
		}
	}
	p := counterValue(t, workerGatherer{pd.Decode[0]}, "pdserve_preemptions_total", "", "")
	if p == 0 {
		t.Fatal("decode preempted nothing: the pool is not small enough to test preemption")
	}
	t.Logf("decode preempted %v times", p)
}

// TestConstrainedSimValid: on the simulated model every finished output
// of hundreds of seeded JSON Schema requests (four choices each) is valid
// against its schema, and nearly all finish.
func TestConstrainedSimValid(t *testing.T) {
	t.Parallel()
	co := startServe(t, sim.Config{})
	cases := constraintCases(t, "json_schema")
	stops, total := 0, 0
	for i := range 60 {
		c := cases[i%len(cases)]
		body := map[string]any{"max_tokens": 600, "n": 4, "seed": i, "temperature": 1,
			"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("answer %d", i)}}}
		c.state(true, body)
		s, b := postJSON(t, co.URL+"/v1/chat/completions", body)
		if s != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, s, b)
		}
		for ci, ch := range summarizeResponse(t, b).Choices {
			total++
			if ch.Finish != "stop" {
				continue
			}
			stops++
			if err := c.valid(ch.Text); err != nil {
				t.Fatalf("request %d choice %d: %v", i, ci, err)
			}
		}
	}
	if stops*20 < total*19 {
		t.Fatalf("%d of %d outputs finished; want 95 %%", stops, total)
	}
	t.Logf("%d of %d outputs finished, all valid", stops, total)
}

// TestConstraintRefusedOnWorkers: a constraint that does not compile, or
// that no text satisfies, is refused with a 400 naming the field before
// any worker computes anything (the router checks it), and the workers'
// compiled-constraint caches count one miss per distinct constraint on
// each worker, then hits.
func TestConstraintRefusedOnWorkers(t *testing.T) {
	t.Parallel()
	pd := startPD(t, pdOptions{})
	for _, tc := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"prompt": "x", "guided_regex": "(unclosed"}, "guided_regex"},
		{map[string]any{"prompt": "x", "guided_choice": []string{}}, "guided_choice"},
		{map[string]any{"prompt": "x", "guided_regex": `[^\s\S]`}, "guided_regex"},
		{map[string]any{"prompt": "x", "guided_grammar": `root ::= root "a"`}, "guided_grammar"},
		{map[string]any{"prompt": "x", "guided_json": map[string]any{"type": "number", "minimum": 5, "maximum": 1}}, "guided_json"},
	} {
		s, b := postJSON(t, pd.URL()+"/v1/completions", tc.body)
		var e struct{ Error struct{ Param string } }
		if err := json.Unmarshal(b, &e); s != http.StatusBadRequest || err != nil || e.Error.Param != tc.param {
			t.Fatalf("%v: %d %s, want a 400 naming %s", tc.body, s, b, tc.param)
		}
	}
	for i := range 3 {
		s, b := postJSON(t, pd.URL()+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("colour %d:", i),
			"guided_choice": []string{"red", "green"}, "max_tokens": 10})
		if s != http.StatusOK || !(bytes.Contains(b, []byte(`"text":"red"`)) || bytes.Contains(b, []byte(`"text":"green"`))) {
			t.Fatalf("%d %s", s, b)
		}
	}
	for _, w := range []gatherer{workerGatherer{pd.Prefill[0]}, workerGatherer{pd.Decode[0]}} {
		miss := counterValue(t, w, "pdserve_grammar_cache_requests_total", "result", "miss")
		hit := counterValue(t, w, "pdserve_grammar_cache_requests_total", "result", "hit")
		if miss != 1 || hit != 2 {
			t.Fatalf("grammar cache: %v misses, %v hits; want 1 and 2", miss, hit)
		}
	}
}

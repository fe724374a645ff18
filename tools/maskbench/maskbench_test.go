package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
)

// TestMain serves as a worker process with the fake engine when the
// process tests start this binary as one.
func TestMain(m *testing.M) {
	if os.Getenv("MASKBENCH_FAKE_WORKER") == "1" {
		if err := serveWorker(os.Stdin, os.Stdout, fakeEngine{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeEngine has one token per byte (ids 0-255) and EOS 256. Its "schemas"
// say what the matcher does:
//
//	{"accept": [texts]}  the output must be one of texts
//	{"refuse": keyword}  compile fails with a *grammar.Error naming keyword
//	{"panic": true}      FillMask panics
//	{"lie": true}        FillMask allows every token, Accept none
//	{"exit": true}       compile ends the process (a crash)
//	{"hang": true}       compile does not return
type fakeEngine struct{}

const fakeEOS = 256

func (fakeEngine) vocabSize() int             { return 257 }
func (fakeEngine) eos() []int32               { return []int32{fakeEOS} }
func (fakeEngine) tokenBytes(id int32) []byte { return []byte{byte(id)} }
func (fakeEngine) encode(text string) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := range len(text) {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

func (fakeEngine) compile(schema []byte, o compileOptions) (func() matcher, error) {
	var s struct {
		Accept     []string
		Refuse     string
		Panic, Lie bool
		Exit, Hang bool
	}
	if err := json.Unmarshal(schema, &s); err != nil {
		return nil, err
	}
	switch {
	case s.Refuse != "":
		return nil, &grammar.Error{Keyword: s.Refuse, Path: "/" + s.Refuse, Msg: "not supported"}
	case s.Exit:
		os.Exit(3)
	case s.Hang:
		time.Sleep(time.Hour) // stands for a call that never returns
	}
	return func() matcher { return &fakeMatcher{accept: s.Accept, panics: s.Panic, lies: s.Lie} }, nil
}

type fakeMatcher struct {
	accept       []string
	panics, lies bool
	out          []byte
}

func (m *fakeMatcher) FillMask(mask []uint64) {
	if m.panics {
		panic("fake engine panic")
	}
	clear(mask)
	for b := range 256 {
		if m.lies || m.allows(append(m.out, byte(b))) {
			mask[b/64] |= 1 << (b % 64)
		}
	}
	if m.CanEnd() {
		mask[fakeEOS/64] |= 1 << (fakeEOS % 64)
	}
}

func (m *fakeMatcher) allows(prefix []byte) bool {
	for _, a := range m.accept {
		if strings.HasPrefix(a, string(prefix)) {
			return true
		}
	}
	return false
}

func (m *fakeMatcher) Accept(tok int32) bool {
	if m.lies || tok >= 256 || !m.allows(append(m.out, byte(tok))) {
		return false
	}
	m.out = append(m.out, byte(tok))
	return true
}

func (m *fakeMatcher) CanEnd() bool {
	for _, a := range m.accept {
		if a == string(m.out) {
			return true
		}
	}
	return false
}

type fakeTest struct {
	Valid bool `json:"valid"`
	Data  any  `json:"data"`
}

// writeCase writes a MaskBench file as the data set has them.
func writeCase(t *testing.T, dir, name string, schema any, tests ...fakeTest) {
	t.Helper()
	type test struct {
		Description string `json:"description"`
		Valid       bool   `json:"valid"`
		Data        any    `json:"data"`
	}
	f := struct {
		Description string         `json:"description"`
		Meta        map[string]any `json:"meta"`
		Schema      any            `json:"schema"`
		Tests       []test         `json:"tests"`
	}{Description: name, Meta: map[string]any{"features": []string{"feature-of-" + name}}, Schema: schema, Tests: []test{}}
	for i, tc := range tests {
		f.Tests = append(f.Tests, test{fmt.Sprintf("test %d", i), tc.Valid, tc.Data})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func accept(texts ...string) map[string]any { return map[string]any{"accept": texts} }

// obj is {"a": v} in file order.
func obj(v any) any { return map[string]any{"a": v} }

func testRunOptions() runOptions {
	return runOptions{budget: time.Minute, compileOptions: compileOptions{flexible: true}}
}

func TestRunFileClassifies(t *testing.T) {
	dir := t.TempDir()
	valid := func(d any) fakeTest { return fakeTest{true, d} }
	invalid := func(d any) fakeTest { return fakeTest{false, d} }
	writeCase(t, dir, "pass.json", accept(`{"a": 1}`), valid(obj(1)), invalid(obj(2)))
	writeCase(t, dir, "invalidation.json", accept(`{"a": 1}`, `{"a": 2}`), valid(obj(1)), invalid(obj(2)))
	writeCase(t, dir, "refused.json", accept(`{"a": 1}`), valid(map[string]any{"b": 1}))
	writeCase(t, dir, "notatend.json", accept(`12`), valid(1))
	writeCase(t, dir, "prefix-rejected.json", accept(`12`), valid(12), invalid(1))
	writeCase(t, dir, "worst.json", accept(`{"a": 2}`), valid(obj(1)), invalid(obj(2)))
	writeCase(t, dir, "notests.json", accept(`1`))
	writeCase(t, dir, "refuse.json", map[string]any{"refuse": "not"}, valid(1))
	writeCase(t, dir, "panic.json", map[string]any{"panic": true}, valid(1))
	writeCase(t, dir, "lie.json", map[string]any{"lie": true}, valid(1))
	if err := os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"schema": `), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		file, class string
		// kind, token, before and at of the one failure, if any
		kind, where   string
		token         int
		before, at    string
		valid, failed bool
	}{
		{file: "pass.json", class: classPass},
		{file: "invalidation.json", class: classInvalidation, failed: true, kind: "accepted", token: 8, before: `{"a": 2}`, where: "end of text"},
		{file: "refused.json", class: classValidation, failed: true, valid: true, kind: "refused", token: 2, before: `{"`, at: "b", where: "object key"},
		{file: "notatend.json", class: classValidation, failed: true, valid: true, kind: "not-at-end", token: 1, before: "1", where: "end of text"},
		{file: "prefix-rejected.json", class: classPass},
		{file: "notests.json", class: classPass},
		{file: "refuse.json", class: classCompile},
		{file: "panic.json", class: classPanic},
		{file: "lie.json", class: classInconsistent, failed: true, valid: true, kind: "mask-accept", token: 0, at: "1", where: "number"},
		{file: "bad.json", class: classBadFile},
	} {
		t.Run(tc.file, func(t *testing.T) {
			res := runFile(fakeEngine{}, filepath.Join(dir, tc.file), testRunOptions())
			if res.Class != tc.class {
				t.Fatalf("class %q, want %q (%+v)", res.Class, tc.class, res)
			}
			if !tc.failed {
				if len(res.Failures) != 0 {
					t.Errorf("failures %+v, want none", res.Failures)
				}
				return
			}
			if len(res.Failures) != 1 {
				t.Fatalf("failures %+v, want one", res.Failures)
			}
			f := res.Failures[0]
			if f.Kind != tc.kind || f.Token != tc.token || f.Before != tc.before || f.At != tc.at || f.Valid != tc.valid || f.Where != tc.where {
				t.Errorf("failure %+v, want kind %q token %d before %q at %q valid %v where %q", f, tc.kind, tc.token, tc.before, tc.at, tc.valid, tc.where)
			}
		})
	}

	t.Run("details", func(t *testing.T) {
		res := runFile(fakeEngine{}, filepath.Join(dir, "refuse.json"), testRunOptions())
		if res.Keyword != "not" || res.ErrPath != "/not" || res.Msg != "not supported" {
			t.Errorf("compile error %q %q %q, want the *grammar.Error's fields", res.Keyword, res.ErrPath, res.Msg)
		}
		res = runFile(fakeEngine{}, filepath.Join(dir, "lie.json"), testRunOptions())
		if d := res.Failures[0].Detail; d != "FillMask allows the token, Accept refuses it" {
			t.Errorf("inconsistency detail %q", d)
		}
		if c := classify([]instanceFailure{{Kind: "refused"}, {Kind: "mask-accept"}, {Kind: "not-at-end"}}); c != classInconsistent {
			t.Errorf("a refused valid instance and an inconsistency: %q, want %q", c, classInconsistent)
		}
		if c := classify([]instanceFailure{{Kind: "mask-canend"}, {Kind: "accepted"}}); c != classInvalidation {
			t.Errorf("an inconsistency and an accepted invalid instance: %q, want %q", c, classInvalidation)
		}
		res = runFile(fakeEngine{}, filepath.Join(dir, "worst.json"), testRunOptions())
		if res.Class != classInvalidation || len(res.Failures) != 2 {
			t.Errorf("a refused valid and an accepted invalid instance: %q with %d failures, want %q with 2", res.Class, len(res.Failures), classInvalidation)
		}
		res = runFile(fakeEngine{}, filepath.Join(dir, "pass.json"), testRunOptions())
		// {"a": 1} is 8 tokens, {"a": 2} is refused at its 7th.
		if len(res.MaskNS) != 8+7 || len(res.StepNS) != len(res.MaskNS) || res.ValidOK != 1 || res.InvalidOK != 1 {
			t.Errorf("%d masks timed, %d steps, %d valid and %d invalid ok; want 15, 15, 1, 1", len(res.MaskNS), len(res.StepNS), res.ValidOK, res.InvalidOK)
		}
		if !strings.Contains(runFile(fakeEngine{}, filepath.Join(dir, "panic.json"), testRunOptions()).Msg, "fake engine panic") {
			t.Error("a panic's result does not carry its message")
		}
		o := testRunOptions()
		o.budget = time.Nanosecond
		if res := runFile(fakeEngine{}, filepath.Join(dir, "pass.json"), o); res.Class != classTimeout {
			t.Errorf("over its budget: class %q, want %q", res.Class, classTimeout)
		}
		o = testRunOptions()
		o.flexible = false
		o.ser.compact = true
		if res := runFile(fakeEngine{}, filepath.Join(dir, "pass.json"), o); res.Class != classValidation {
			t.Errorf("compact instances against a grammar of spaced text: class %q, want %q", res.Class, classValidation)
		}
	})
}

func TestBenchReports(t *testing.T) {
	dir := t.TempDir()
	writeCase(t, dir, "Github_easy---o1.json", accept(`1`), fakeTest{true, 1}, fakeTest{false, 2})
	writeCase(t, dir, "Github_easy---o2.json", map[string]any{"refuse": "not"}, fakeTest{true, 1})
	writeCase(t, dir, "Github_easy---o3.json", map[string]any{"refuse": "not"})
	writeCase(t, dir, "BFCL_simple_1.json", accept(`1`, `2`), fakeTest{true, 1}, fakeTest{false, 2})
	writeCase(t, dir, "JME_1.json", accept(`[1, 2]`), fakeTest{true, []int{1, 2}})
	out := t.TempDir()
	c := &config{data: dir, parallel: 2, flexible: true, budget: time.Minute,
		jsonOut: filepath.Join(out, "r.json"), failures: filepath.Join(out, "f.jsonl"), summary: filepath.Join(out, "s.txt")}
	var stdout, stderr bytes.Buffer
	if err := bench(c, fakeEngine{}, nil, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var r report
	b, err := os.ReadFile(c.jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]int{
		"Github_easy": {classPass: 1, classCompile: 2},
		"BFCL":        {classInvalidation: 1},
		"JME":         {classPass: 1},
	}
	if fmt.Sprint(r.BySplit) != fmt.Sprint(want) {
		t.Errorf("by split %v, want %v", r.BySplit, want)
	}
	if r.Schemas != 5 || r.Classes[classPass] != 2 || r.CompileKeywords["not"] != 2 || r.TimingComparable {
		t.Errorf("report %+v: want 5 schemas, 2 passed, 2 refused at \"not\", timing not comparable at -parallel 2", r)
	}
	// o1: 1 + 1 tokens, BFCL: 1 + 1, JME: 6.
	if r.Tokens != 10 || r.Mask.N != 10 || r.Compile.N != 3 {
		t.Errorf("tokens %d, masks %d, compiles %d; want 10, 10, 3", r.Tokens, r.Mask.N, r.Compile.N)
	}
	if !strings.Contains(stdout.String(), "NOT comparable") {
		t.Errorf("the table does not say the timings are not comparable:\n%s", stdout.String())
	}

	f, err := os.Open(c.failures)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var failed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var res schemaResult
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			t.Fatal(err)
		}
		if res.MaskNS != nil {
			t.Error("the failures file carries timings")
		}
		failed = append(failed, filepath.Base(res.File)+":"+res.Class)
	}
	if len(failed) != 3 {
		t.Errorf("failures file lists %v, want the 3 schemas not passed", failed)
	}
	s, err := os.ReadFile(c.summary)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`     2  compile-refused keyword="not": not supported`, `     1  invalidation-error: accepted at end of text`, `BFCL_simple_1.json test #1 (invalid) token 1/1 at : "2" «» ""`} {
		if !strings.Contains(string(s), w) {
			t.Errorf("summary lacks %q:\n%s", w, s)
		}
	}
}

// TestWorkerProcesses runs schemas in child processes: a child that dies
// or hangs costs its schema, and the next schema runs in a new child.
func TestWorkerProcesses(t *testing.T) {
	dir := t.TempDir()
	writeCase(t, dir, "a.json", accept(`1`), fakeTest{true, 1}, fakeTest{false, 2})
	writeCase(t, dir, "b.json", map[string]any{"exit": true}, fakeTest{true, 1})
	writeCase(t, dir, "c.json", accept(`1`, `2`), fakeTest{true, 1}, fakeTest{false, 2})
	writeCase(t, dir, "d.json", map[string]any{"hang": true}, fakeTest{true, 1})
	writeCase(t, dir, "e.json", map[string]any{"refuse": "not"})
	spawn := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "MASKBENCH_FAKE_WORKER=1")
		return cmd
	}
	o := testRunOptions()
	o.budget = time.Second
	w := newProcWorker(spawn, o, time.Second)
	defer w.close()
	for _, tc := range []struct{ file, class, msg string }{
		{"a.json", classPass, ""},
		{"b.json", classCrash, "the worker died"},
		{"c.json", classInvalidation, ""},
		{"d.json", classTimeout, "killed after 2s"},
		{"e.json", classCompile, ""},
	} {
		res := w.run(filepath.Join(dir, tc.file))
		if res.Class != tc.class || !strings.Contains(res.Msg, tc.msg) {
			t.Errorf("%s: class %q msg %q, want %q with %q", tc.file, res.Class, res.Msg, tc.class, tc.msg)
		}
		if tc.class == classPass && len(res.MaskNS) != 2 {
			t.Errorf("%s: %d mask times came back, want 2", tc.file, len(res.MaskNS))
		}
	}
}

func TestJSONPosition(t *testing.T) {
	text := `{"a": [1, {"b/c": "x y"}, true], "d": -2.5}`
	for _, tc := range []struct {
		at            string // the first occurrence of at in text
		pointer, what string
	}{
		{`{"a"`, "", "'{'"},
		{`"a"`, "/a", "object key"},
		{`: [`, "/a", "':'"},
		{`[1`, "/a", "'['"},
		{`1,`, "/a/0", "number"},
		{`, {`, "/a/0", "',' (next item)"},
		{`"b/c"`, "/a/1/b~1c", "object key"},
		{`y"`, "/a/1/b~1c", "string"},
		{`}, true`, "/a/1", "'}' (end of object)"},
		{`rue`, "/a/2", "literal"},
		{`], "d"`, "/a", "']' (end of array)"},
		{`"d"`, "/d", "object key"},
		{`2.5`, "/d", "number"},
	} {
		off := strings.Index(text, tc.at)
		if p, w := jsonPosition(text, off); p != tc.pointer || w != tc.what {
			t.Errorf("at %q (%d): %q %q, want %q %q", tc.at, off, p, w, tc.pointer, tc.what)
		}
	}
	if _, w := jsonPosition(text, len(text)); w != "end of text" {
		t.Errorf("at the end: %q", w)
	}
}

func TestSlowSchemas(t *testing.T) {
	a := newAggregator(nil, "")
	a.add(schemaResult{File: "d/x.json", Class: classPass, MaskNS: []int64{5, slowMaskNS, 3 * slowMaskNS}})
	a.add(schemaResult{File: "d/y.json", Class: classPass, MaskNS: []int64{5, 6}})
	a.add(schemaResult{File: "d/z.json", Class: classValidation, MaskNS: []int64{2 * slowMaskNS, slowMaskNS, slowMaskNS}})
	r := a.finish()
	want := []slowSchema{{"z.json", 3, 3, 2000, classValidation}, {"x.json", 2, 3, 3000, classPass}}
	if fmt.Sprint(r.Slowest) != fmt.Sprint(want) {
		t.Errorf("slowest %v, want %v", r.Slowest, want)
	}
	if r.Mask.N != 8 || r.Mask.Max != 3000 || r.Mask.P50 != 1000 {
		t.Errorf("mask percentiles %+v: want n 8, max 3000 µs, p50 (element 4 of 8) 1000 µs", r.Mask)
	}
}

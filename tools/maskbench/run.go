package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/grammar"
)

// engine is what a run needs of a tokenizer and a grammar engine; the real
// one is grammarEngine.
type engine interface {
	// vocabSize is the number of token ids (the mask's bits).
	vocabSize() int
	// eos are the ids that end the output.
	eos() []int32
	// encode tokenizes text without BOS.
	encode(text string) ([]int32, error)
	// tokenBytes is id's text, for failure reports.
	tokenBytes(id int32) []byte
	// compile compiles and binds a schema; the function it returns
	// starts a matcher at the start of the output.
	compile(schema []byte, o compileOptions) (func() matcher, error)
}

// matcher is the part of *grammar.Matcher a run drives.
type matcher interface {
	FillMask(mask []uint64)
	Accept(tok int32) bool
	CanEnd() bool
}

// Schema outcomes, in the order reports list them.
const (
	classPass         = "pass"
	classCompile      = "compile-refused"
	classValidation   = "validation-error"
	classInvalidation = "invalidation-error"
	classInconsistent = "inconsistent"
	classPanic        = "panic"
	classTimeout      = "timeout"
	classCrash        = "crash"
	classBadFile      = "bad-file"
)

var classOrder = []string{classPass, classCompile, classValidation, classInvalidation,
	classInconsistent, classPanic, classTimeout, classCrash, classBadFile}

// schemaResult is the outcome of one schema file.
type schemaResult struct {
	File  string `json:"file"`
	Split string `json:"split"`
	Class string `json:"class"`
	// Keyword, ErrPath and Msg describe a refusal at compile time
	// (grammar.Error's fields), a panic or a crash.
	Keyword  string   `json:"keyword,omitempty"`
	ErrPath  string   `json:"err_path,omitempty"`
	Msg      string   `json:"msg,omitempty"`
	Features []string `json:"features,omitempty"`
	// CompileNS is grammar.Compile plus grammar.NewConstraint, in ns.
	CompileNS int64 `json:"compile_ns,omitempty"`
	// MaskNS are the FillMask times, StepNS the FillMask+Accept times,
	// one per token fed (ns).
	MaskNS []int64 `json:"mask_ns,omitempty"`
	StepNS []int64 `json:"step_ns,omitempty"`
	// Instances counts the instances run; ValidOK and InvalidOK those
	// classified as expected.
	Instances int `json:"instances"`
	ValidOK   int `json:"valid_ok"`
	InvalidOK int `json:"invalid_ok"`
	// Failures are the instances classified wrongly.
	Failures []instanceFailure `json:"failures,omitempty"`
}

// instanceFailure is one instance the matcher got wrong.
type instanceFailure struct {
	Index int  `json:"index"`
	Valid bool `json:"valid"`
	// Kind: "refused" (a token of a valid instance was masked out),
	// "not-at-end" (a valid instance was fed whole but EOS is not
	// allowed), "accepted" (an invalid instance was fed whole and EOS is
	// allowed), "mask-accept" (FillMask and Accept disagree on a token),
	// "mask-canend" (the EOS bit and CanEnd disagree).
	Kind string `json:"kind"`
	// Token is the position of the token at fault (Tokens: at the end),
	// Tokens the instance's length in tokens.
	Token  int `json:"token"`
	Tokens int `json:"tokens"`
	// Before, At and After are the text before the token, the token and
	// the text after it.
	Before string `json:"before"`
	At     string `json:"at"`
	After  string `json:"after"`
	// Where is what the token's first byte is part of in the instance
	// (see jsonPosition), Pointer the JSON pointer of the value there.
	Where   string `json:"where"`
	Pointer string `json:"pointer"`
	// Detail says which way an inconsistency goes.
	Detail string `json:"detail,omitempty"`
}

// runOptions are a run's settings.
// compileOptions are the grammar.Spec options schemas are compiled with.
type compileOptions struct {
	// flexible: grammar.Spec.FlexibleWhitespace; anyOrder:
	// grammar.Spec.AnyPropertyOrder.
	flexible, anyOrder bool
}

type runOptions struct {
	ser serializer
	compileOptions
	// budget bounds a schema's run (compile and every instance); a run
	// over it stops at the next token and is a timeout.
	budget time.Duration
}

// runFile runs every instance of the schema file path through e. It never
// panics: a panic of the engine is a result of class panic.
func runFile(e engine, path string, o runOptions) (res schemaResult) {
	res = schemaResult{File: path, Split: splitOf(path)}
	defer func() {
		if p := recover(); p != nil {
			res.Class = classPanic
			res.Msg = fmt.Sprintf("%v\n%s", p, trimStack(debug.Stack()))
		}
	}()
	f, err := readTestFile(path)
	if err != nil {
		res.Class, res.Msg = classBadFile, err.Error()
		return res
	}
	res.Features = f.Meta.Features
	start := time.Now()
	deadline := start.Add(o.budget)
	newMatcher, err := e.compile(f.Schema, o.compileOptions)
	res.CompileNS = time.Since(start).Nanoseconds()
	if err != nil {
		res.Class = classCompile
		var ge *grammar.Error
		if errors.As(err, &ge) {
			res.Keyword, res.ErrPath, res.Msg = ge.Keyword, ge.Path, ge.Msg
		} else {
			res.Msg = err.Error()
		}
		return res
	}
	mask := make([]uint64, (e.vocabSize()+63)/64)
	eos := e.eos()
	timedOut := false
	for i, tc := range f.Tests {
		if time.Now().After(deadline) {
			timedOut = true
			break
		}
		text, err := o.ser.serialize(tc.Data)
		if err != nil {
			res.Class, res.Msg = classBadFile, fmt.Sprintf("test #%d: %v", i, err)
			return res
		}
		toks, err := e.encode(text)
		if err != nil {
			res.Class, res.Msg = classBadFile, fmt.Sprintf("test #%d: tokenize: %v", i, err)
			return res
		}
		res.Instances++
		fail, stopped := runInstance(e, newMatcher(), toks, tc.Valid, mask, eos, deadline, &res)
		if stopped {
			timedOut = true
			break
		}
		if fail != nil {
			fail.Index, fail.Valid, fail.Tokens = i, tc.Valid, len(toks)
			fail.Before, fail.At, fail.After = context(e, toks, fail.Token)
			fail.Pointer, fail.Where = jsonPosition(text, offsetBefore(e, toks, fail.Token))
			res.Failures = append(res.Failures, *fail)
			continue
		}
		if tc.Valid {
			res.ValidOK++
		} else {
			res.InvalidOK++
		}
	}
	res.Class = classify(res.Failures)
	if timedOut {
		res.Class = classTimeout
		res.Msg = fmt.Sprintf("over the budget of %v after %d of %d instances", o.budget, res.Instances, len(f.Tests))
	}
	return res
}

// classify is a schema's class from its failed instances: an invalid
// instance accepted outweighs an engine inconsistency, which outweighs a
// valid instance refused.
func classify(fails []instanceFailure) string {
	class := classPass
	rank := map[string]int{classPass: 0, classValidation: 1, classInconsistent: 2, classInvalidation: 3}
	for _, f := range fails {
		c := classInconsistent
		switch f.Kind {
		case "refused", "not-at-end":
			c = classValidation
		case "accepted":
			c = classInvalidation
		}
		if rank[c] > rank[class] {
			class = c
		}
	}
	return class
}

// runInstance feeds toks to m: for each token FillMask (timed), the
// token's bit, Accept (timed with it); at the end CanEnd and the EOS bits
// of a last mask. It returns the failure, if the outcome is not the
// expected one, and whether the deadline stopped it.
func runInstance(e engine, m matcher, toks []int32, valid bool, mask []uint64, eos []int32, deadline time.Time, res *schemaResult) (*instanceFailure, bool) {
	for i, tok := range toks {
		if i%16 == 15 && time.Now().After(deadline) {
			return nil, true
		}
		t0 := time.Now()
		m.FillMask(mask)
		t1 := time.Now()
		allowed := bitSet(mask, tok)
		accepted := allowed && m.Accept(tok)
		t2 := time.Now()
		res.MaskNS = append(res.MaskNS, t1.Sub(t0).Nanoseconds())
		res.StepNS = append(res.StepNS, t2.Sub(t0).Nanoseconds())
		if allowed != accepted {
			return &instanceFailure{Kind: "mask-accept", Token: i, Detail: "FillMask allows the token, Accept refuses it"}, false
		}
		if !allowed {
			// A masked-out token must be refused by Accept too.
			if m.Accept(tok) {
				return &instanceFailure{Kind: "mask-accept", Token: i, Detail: "FillMask masks the token out, Accept takes it"}, false
			}
			if valid {
				return &instanceFailure{Kind: "refused", Token: i}, false
			}
			return nil, false
		}
	}
	end := m.CanEnd()
	m.FillMask(mask)
	for _, id := range eos {
		if bitSet(mask, id) != end {
			return &instanceFailure{Kind: "mask-canend", Token: len(toks), Detail: fmt.Sprintf("EOS %d in the mask: %v, CanEnd: %v", id, !end, end)}, false
		}
	}
	switch {
	case valid && !end:
		return &instanceFailure{Kind: "not-at-end", Token: len(toks)}, false
	case !valid && end:
		return &instanceFailure{Kind: "accepted", Token: len(toks)}, false
	}
	return nil, false
}

// offsetBefore is the byte length of toks[:n] (0 for n <= 0).
func offsetBefore(e engine, toks []int32, n int) int {
	off := 0
	for _, t := range toks[:max(0, min(n, len(toks)))] {
		off += len(e.tokenBytes(t))
	}
	return off
}

func bitSet(mask []uint64, id int32) bool {
	return id >= 0 && int(id)/64 < len(mask) && mask[id/64]&(1<<(uint(id)%64)) != 0
}

// context is the text of up to 24 tokens before toks[at], that token, and
// up to 8 after it.
func context(e engine, toks []int32, at int) (before, tok, after string) {
	var b strings.Builder
	for _, t := range toks[max(0, at-24):min(at, len(toks))] {
		b.Write(e.tokenBytes(t))
	}
	before = b.String()
	if at < len(toks) {
		tok = string(e.tokenBytes(toks[at]))
		b.Reset()
		for _, t := range toks[at+1 : min(at+9, len(toks))] {
			b.Write(e.tokenBytes(t))
		}
		after = b.String()
	}
	return before, tok, after
}

// trimStack keeps the first lines of a stack trace after the runtime's
// own frames.
func trimStack(s []byte) string {
	lines := strings.Split(string(s), "\n")
	if len(lines) > 24 {
		lines = lines[:24]
	}
	return strings.Join(lines, "\n")
}
